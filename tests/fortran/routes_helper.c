/* For the Fortran routing test (routes.F90): how many calls of one collective in this
 * process took the route STREAMCOLL_ROUTE forces for it ("allreduce:ht,bcast:ht", "*:ht";
 * a non-blocking collective, "iallreduce", follows its blocking one's entry), or route
 * pmpi where it forces none or the route cannot carry the call; through streamcoll's
 * statistics, found at run time so that it works preloaded or linked. -1 when streamcoll
 * is not loaded. And the test's buffers: under STREAMCOLL_TEST_DEVICE=1 in fake device
 * memory (the fake CUDA driver of tests/fake, libcuda.so.1 on LD_LIBRARY_PATH); under
 * STREAMCOLL_TEST_DEVICE=managed in managed memory from the CUDA driver API
 * (cuMemAllocManaged, as CUDA Fortran's `managed` arrays and OpenACC's unified memory
 * get it), a real GPU's or the fake's: without a GPU the program skips (exit 77). */
#include <dlfcn.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_api.h"
#include "streamcoll/streamcoll.h"

/* The route STREAMCOLL_ROUTE forces for `coll` (a blocking collective's name) into
 * route[len], or "pmpi". */
static void forced_route(const char *coll, char *route, size_t len) {
  const char *spec = getenv("STREAMCOLL_ROUTE");
  strncpy(route, "pmpi", len);
  route[len - 1] = 0;
  while (spec && *spec) {
    const char *end = strchr(spec, ',');
    size_t n = end ? (size_t)(end - spec) : strlen(spec);
    const char *colon = memchr(spec, ':', n);
    if (colon) {
      size_t cn = (size_t)(colon - spec);
      if ((cn == strlen(coll) && strncmp(spec, coll, cn) == 0) || (cn == 1 && spec[0] == '*')) {
        const char *r = colon + 1;
        size_t rn = n - cn - 1;
        const char *more = memchr(r, ':', rn);
        if (more) rn = (size_t)(more - r);
        if (rn >= len) rn = len - 1;
        memcpy(route, r, rn);
        route[rn] = 0;
        return;
      }
    }
    spec = end ? end + 1 : NULL;
  }
}

/* `reducible`: 0 when the call is a reduction on a datatype NCCL cannot reduce exactly
 * (complex, LOGICAL, 16-bit integers): a forced nccl declines it and it goes to pmpi. */
long long sc_route_calls(const char *collective, int reducible) {
  int (*get)(const char *, const char *, const char *, streamcoll_stat_t *) =
      (int (*)(const char *, const char *, const char *, streamcoll_stat_t *))dlsym(
          RTLD_DEFAULT, "streamcoll_get_stats");
  if (!get) return -1;
  const char *blocking = collective;
  if (collective[0] == 'i') blocking = collective + 1; /* no blocking one begins with i */
  char route[32];
  forced_route(blocking, route, sizeof route);
  if (!reducible && (strcmp(route, "nccl") == 0 || strcmp(route, "ccube") == 0 ||
                     strcmp(route, "nvgroup") == 0))
    strcpy(route, "pmpi");
  streamcoll_stat_t s;
  if (get(collective, route, 0, &s) != 0) return 0;
  return (long long)s.calls;
}

static fake_cuda_malloc_fn dev_malloc;
static fake_cuda_free_fn dev_free;
/* The driver API, for managed memory (CUdeviceptr is a 64-bit integer; 0: CUDA_SUCCESS;
 * the _v2 names are the ones cuda.h binds). */
static int (*cu_mem_alloc_managed)(unsigned long long *, size_t, unsigned);
static int (*cu_mem_free)(unsigned long long);

/* Managed memory on this rank's GPU (rank modulo the GPUs), or a skip without one. */
static void managed_or_skip(void) {
  void *cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  int (*init)(unsigned) = cu ? (int (*)(unsigned))dlsym(cu, "cuInit") : NULL;
  int (*count)(int *) = cu ? (int (*)(int *))dlsym(cu, "cuDeviceGetCount") : NULL;
  int (*get)(int *, int) = cu ? (int (*)(int *, int))dlsym(cu, "cuDeviceGet") : NULL;
  int (*retain)(void **, int) = cu ? (int (*)(void **, int))dlsym(cu, "cuDevicePrimaryCtxRetain") : NULL;
  int (*set)(void *) = cu ? (int (*)(void *))dlsym(cu, "cuCtxPushCurrent_v2") : NULL;
  cu_mem_alloc_managed = cu ? (int (*)(unsigned long long *, size_t, unsigned))dlsym(cu, "cuMemAllocManaged") : NULL;
  cu_mem_free = cu ? (int (*)(unsigned long long))dlsym(cu, "cuMemFree_v2") : NULL;
  int n = 0, dev = 0, rank = 0;
  void *ctx = NULL;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (!init || !count || !get || !retain || !set || !cu_mem_alloc_managed || !cu_mem_free ||
      init(0) != 0 || count(&n) != 0 || n < 1 || get(&dev, rank % n) != 0 || retain(&ctx, dev) != 0 ||
      set(ctx) != 0) {
    if (rank == 0) printf("SKIP: no CUDA driver or GPU for managed memory\n");
    MPI_Finalize();
    exit(77);
  }
}

/* 1: the buffers go in device memory (STREAMCOLL_TEST_DEVICE=1, fake; =managed, managed),
 * 0: host memory. Exits when device memory was asked for and cannot be had. */
int sc_device_mode(void) {
  static int mode = -1;
  if (mode >= 0) return mode;
  const char *want = getenv("STREAMCOLL_TEST_DEVICE");
  mode = 0;
  if (!want) return mode;
  if (strcmp(want, "managed") == 0) {
    managed_or_skip();
    return mode = 1;
  }
  if (strcmp(want, "1") != 0) return mode;
  void *cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  fake_cuda_runtime_init_fn init =
      cu ? (fake_cuda_runtime_init_fn)dlsym(cu, "fake_cuda_runtime_init") : NULL;
  dev_malloc = cu ? (fake_cuda_malloc_fn)dlsym(cu, "fake_cuda_malloc") : NULL;
  dev_free = cu ? (fake_cuda_free_fn)dlsym(cu, "fake_cuda_free") : NULL;
  if (!init || !dev_malloc || !dev_free || init() != 0) {
    fprintf(stderr, "routes: STREAMCOLL_TEST_DEVICE=1 but libcuda.so.1 is not the fake driver\n");
    exit(2);
  }
  return mode = 1;
}

void *sc_dev_alloc(size_t bytes) {
  if (dev_malloc) return dev_malloc(bytes ? bytes : 1);
  unsigned long long p = 0;
  if (cu_mem_alloc_managed(&p, bytes ? bytes : 1, 1 /* CU_MEM_ATTACH_GLOBAL */) != 0) {
    fprintf(stderr, "routes: cuMemAllocManaged failed\n");
    exit(2);
  }
  return (void *)(uintptr_t)p;
}

void sc_dev_free(void *p) {
  if (dev_free)
    dev_free(p);
  else
    cu_mem_free((unsigned long long)(uintptr_t)p);
}
