/* For mixed.f90: the odd ranks' calls, made through the C bindings with the Fortran
 * datatype MPI_REAL (the same datatype the even ranks pass from Fortran), and a watchdog
 * that fails a hang. */
#include <mpi.h>
#include <signal.h>
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

/* what: 1 allreduce, 2 reduce, 3 bcast, 4 allgather (MPI_SUM, MPI_COMM_WORLD). */
void sc_mixed_call(const int *what, const int *n, const int *root, float *send, float *recv,
                   int *ierr) {
  switch (*what) {
    case 1: *ierr = MPI_Allreduce(send, recv, *n, MPI_REAL, MPI_SUM, MPI_COMM_WORLD); break;
    case 2: *ierr = MPI_Reduce(send, recv, *n, MPI_REAL, MPI_SUM, *root, MPI_COMM_WORLD); break;
    case 3: *ierr = MPI_Bcast(recv, *n, MPI_REAL, *root, MPI_COMM_WORLD); break;
    default:
      *ierr = MPI_Allgather(send, *n, MPI_REAL, recv, *n, MPI_REAL, MPI_COMM_WORLD);
      break;
  }
}
