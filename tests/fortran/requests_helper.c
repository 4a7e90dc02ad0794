/* For requests.f90: streamcoll's own requests handed to Fortran. The Fortran bindings of
 * the collectives go to pmpi only, so the requests are made here, in C: MPI_Iallreduce
 * (MPI_INT32_T, MPI_SUM) on fake device memory (the fake CUDA driver of tests/fake),
 * on a duplicate of MPI_COMM_WORLD routed to NCCL (the fake NCCL) with
 * streamcoll_comm_set_route. A classic NCCL request completes only when streamcoll
 * polls its event, so a Fortran wait that never reaches streamcoll hangs: sc_req_watch
 * arms an alarm that fails the program instead. */
#include <dlfcn.h>
#include <mpi.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "fake_api.h"
#include "streamcoll/streamcoll.h"

enum { kCount = 1000, kSlots = 4 };

static fake_cuda_malloc_fn dev_malloc;
static fake_cuda_free_fn dev_free;
static fake_cuda_host_access_fn host_access;
static fake_cuda_runtime_init_fn runtime_init;
static fake_cuda_runtime_fini_fn runtime_fini;
static int (*get_stats)(const char *, const char *, const char *, streamcoll_stat_t *);
static MPI_Comm g_comm = MPI_COMM_NULL;
static int g_rank, g_size;

static struct {
  int32_t *send, *recv;
  int salt;
} g_slots[kSlots];

static void on_alarm(int sig) {
  static const char msg[] = "fortran_requests: HANG: a wait did not finish in time\n";
  ssize_t w = write(2, msg, sizeof msg - 1);
  (void)sig;
  (void)w;
  _exit(3);
}

static int32_t value(int rank, int i, int salt) { return rank * 1000 + i * 3 + salt; }

/* Arms (seconds > 0) or disarms (0) the watchdog. */
void sc_req_watch(const MPI_Fint *seconds) { alarm((unsigned)*seconds); }

/* *ok = 1 when the fakes and streamcoll are there and route nccl is set up on a duplicate
 * of MPI_COMM_WORLD (one blocking MPI_Allreduce on it, as the route needs); *fcomm: it. */
void sc_req_setup(MPI_Fint *fcomm, MPI_Fint *ok) {
  void *cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  int (*set_route)(MPI_Comm, const char *) =
      (int (*)(MPI_Comm, const char *))dlsym(RTLD_DEFAULT, "streamcoll_comm_set_route");
  get_stats = (int (*)(const char *, const char *, const char *, streamcoll_stat_t *))dlsym(
      RTLD_DEFAULT, "streamcoll_get_stats");
  *ok = 0;
  *fcomm = MPI_Comm_c2f(MPI_COMM_WORLD);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  if (!cu || !set_route || !get_stats) {
    fprintf(stderr, "fortran_requests: the fake CUDA driver or streamcoll is not loaded\n");
    return;
  }
  dev_malloc = (fake_cuda_malloc_fn)dlsym(cu, "fake_cuda_malloc");
  dev_free = (fake_cuda_free_fn)dlsym(cu, "fake_cuda_free");
  host_access = (fake_cuda_host_access_fn)dlsym(cu, "fake_cuda_host_access");
  runtime_init = (fake_cuda_runtime_init_fn)dlsym(cu, "fake_cuda_runtime_init");
  runtime_fini = (fake_cuda_runtime_fini_fn)dlsym(cu, "fake_cuda_runtime_fini");
  if (!dev_malloc || !dev_free || !host_access || !runtime_init || !runtime_fini ||
      runtime_init() != 0) {
    fprintf(stderr, "fortran_requests: libcuda.so.1 is not the fake CUDA driver\n");
    return;
  }
  signal(SIGALRM, on_alarm);
  MPI_Comm_dup(MPI_COMM_WORLD, &g_comm);
  if (set_route(g_comm, "allreduce:nccl") != MPI_SUCCESS) return;
  int32_t *send = (int32_t *)dev_malloc(kCount * sizeof(int32_t));
  int32_t *recv = (int32_t *)dev_malloc(kCount * sizeof(int32_t));
  for (int i = 0; i < kCount; ++i) send[i] = value(g_rank, i, 0);
  alarm(20);
  int rc = MPI_Allreduce(send, recv, kCount, MPI_INT32_T, MPI_SUM, g_comm);
  alarm(0);
  int good = rc == MPI_SUCCESS && host_access(recv, kCount * sizeof(int32_t), 0) == 0;
  for (int i = 0; good && i < kCount; ++i) {
    int64_t want = 0;
    for (int r = 0; r < g_size; ++r) want += value(r, i, 0);
    good = recv[i] == (int32_t)want;
  }
  dev_free(send);
  dev_free(recv);
  *fcomm = MPI_Comm_c2f(g_comm);
  *ok = good;
}

/* Starts MPI_Iallreduce on device memory in slot *slot; *freq: the request, for Fortran. */
void sc_req_start(const MPI_Fint *slot, const MPI_Fint *salt, MPI_Fint *freq, MPI_Fint *ierr) {
  const size_t bytes = kCount * sizeof(int32_t);
  g_slots[*slot].send = (int32_t *)dev_malloc(bytes);
  g_slots[*slot].recv = (int32_t *)dev_malloc(bytes);
  g_slots[*slot].salt = *salt;
  for (int i = 0; i < kCount; ++i) g_slots[*slot].send[i] = value(g_rank, i, *salt);
  memset(g_slots[*slot].recv, 0xA5, bytes);
  MPI_Request req = MPI_REQUEST_NULL;
  *ierr = MPI_Iallreduce(g_slots[*slot].send, g_slots[*slot].recv, kCount, MPI_INT32_T, MPI_SUM,
                         g_comm, &req);
  *freq = MPI_Request_c2f(req);
}

/* *ok = 1 if slot *slot holds the right sum and the host has seen it complete; frees it. */
void sc_req_check(const MPI_Fint *slot, MPI_Fint *ok) {
  int32_t *recv = g_slots[*slot].recv;
  int good = host_access(recv, kCount * sizeof(int32_t), 0) == 0;
  for (int i = 0; good && i < kCount; ++i) {
    int64_t want = 0;
    for (int r = 0; r < g_size; ++r) want += value(r, i, g_slots[*slot].salt);
    good = recv[i] == (int32_t)want;
  }
  dev_free(g_slots[*slot].send);
  dev_free(recv);
  *ok = good;
}

/* For a Fortran MPI_IALLREDUCE: slot *slot's buffers in fake device memory, the input
 * filled as sc_req_start fills it (MPI_INTEGER is int32_t here); check with sc_req_check. */
void sc_req_buffers(const MPI_Fint *slot, const MPI_Fint *salt, void **send, void **recv) {
  const size_t bytes = kCount * sizeof(int32_t);
  g_slots[*slot].send = (int32_t *)dev_malloc(bytes);
  g_slots[*slot].recv = (int32_t *)dev_malloc(bytes);
  g_slots[*slot].salt = *salt;
  for (int i = 0; i < kCount; ++i) g_slots[*slot].send[i] = value(g_rank, i, *salt);
  memset(g_slots[*slot].recv, 0xA5, bytes);
  *send = g_slots[*slot].send;
  *recv = g_slots[*slot].recv;
}

/* MPI_Iallreduce calls streamcoll sent to route nccl, on device memory. */
void sc_req_routed(MPI_Fint *calls) {
  streamcoll_stat_t s;
  *calls = get_stats && get_stats("iallreduce", "nccl", "device", &s) == 0 ? (MPI_Fint)s.calls : -1;
}

void sc_req_finish(void) {
  if (g_comm != MPI_COMM_NULL) MPI_Comm_free(&g_comm);
  if (runtime_fini) runtime_fini();
}

/* *defect = 1 when this MPI's Fortran MPI_WAITANY and MPI_TESTANY return MPI_UNDEFINED + 1,
 * not MPI_UNDEFINED, once every request is null: MPICH before 4.1.1 adds 1 to the C index
 * unconditionally (pmodels/mpich#6402), with or without streamcoll, whose wrappers pass
 * the MPI's answer on unchanged. Says so on stderr (rank 0). */
void sc_req_undefined_defect(MPI_Fint *defect) {
  char lib[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0, major = 0, minor = 0, patch = 0;
  MPI_Get_library_version(lib, &len);
  const char *v = strstr(lib, "MPICH Version:");
  int n = v ? sscanf(v + strlen("MPICH Version:"), " %d.%d.%d", &major, &minor, &patch) : 0;
  *defect = n >= 2 && (major < 4 || (major == 4 && (minor == 0 || (minor == 1 && patch < 1))));
  if (*defect && g_rank == 0)
    fprintf(stderr, "fortran_requests: note: MPI_WAITANY/MPI_TESTANY answer MPI_UNDEFINED + 1 once "
                    "all requests are null (MPICH before 4.1.1: pmodels/mpich#6402); taken as "
                    "MPI_UNDEFINED\n");
}
