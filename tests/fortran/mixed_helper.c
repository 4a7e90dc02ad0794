/* For mixed.f90: the odd ranks' calls, made through the C bindings with the Fortran
 * datatype MPI_REAL (the same datatype the even ranks pass from Fortran), some on GPU memory
 * on GPU memory, and a watchdog that fails a hang. */
#include <dlfcn.h>
#include <mpi.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

static void on_alarm(int sig) {
  static const char msg[] = "fortran_mixed: HANG: a collective did not finish in time\n";
  ssize_t w = write(2, msg, sizeof msg - 1);
  (void)sig;
  (void)w;
  _exit(3);
}

void sc_mixed_watch(const int *seconds) {
  signal(SIGALRM, on_alarm);
  alarm((unsigned)*seconds);
}

/* Two calls in five of this rank pass (fake) GPU memory: the send and receive arrays
 * copied into memory that the fake driver reports as device memory, the result copied
 * back. So the ranks' memory kinds differ now and then, and streamcoll (its MPI not
 * CUDA-aware) stages them, carrying the staging outcomes where the ranks' agreed facts
 * know of GPU memory and none where they say host memory everywhere. */
static void *device_alloc(size_t bytes) {
  static void *(*alloc)(size_t) = NULL;
  if (!alloc) {
    void *cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    alloc = cu ? (void *(*)(size_t))dlsym(cu, "fake_cuda_malloc") : NULL;
    if (!alloc) {
      static const char msg[] = "fortran_mixed: the fake libcuda.so.1 is not loadable\n";
      ssize_t w = write(2, msg, sizeof msg - 1);
      (void)w;
      _exit(4);
    }
  }
  return alloc(bytes);
}

/* what: 1 allreduce, 2 reduce, 3 bcast, 4 allgather (MPI_SUM, MPI_COMM_WORLD). */
void sc_mixed_call(const int *what, const int *n, const int *root, float *send, float *recv,
                   int *ierr) {
  static int calls = 0;
  static float *dsend = NULL, *drecv = NULL;
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const size_t in = (size_t)*n * sizeof(float);
  const size_t out = *what == 4 ? in * (size_t)size : in;
  float *s = send, *r = recv;
  if (++calls % 5 < 2) {  /* (a pattern that shifts from one pass of mixed.f90 to the next) */
    if (!dsend) {  /* room for the largest call of mixed.f90 (4096 x 8 ranks) */
      dsend = device_alloc(4096 * sizeof(float));
      drecv = device_alloc(4096 * 8 * sizeof(float));
    }
    memcpy(dsend, send, in);
    memcpy(drecv, recv, out);
    s = dsend;
    r = drecv;
  }
  switch (*what) {
    case 1: *ierr = MPI_Allreduce(s, r, *n, MPI_REAL, MPI_SUM, MPI_COMM_WORLD); break;
    case 2: *ierr = MPI_Reduce(s, r, *n, MPI_REAL, MPI_SUM, *root, MPI_COMM_WORLD); break;
    case 3: *ierr = MPI_Bcast(r, *n, MPI_REAL, *root, MPI_COMM_WORLD); break;
    default:
      *ierr = MPI_Allgather(s, *n, MPI_REAL, r, *n, MPI_REAL, MPI_COMM_WORLD);
      break;
  }
  if (r != recv) memcpy(recv, r, out);
}
