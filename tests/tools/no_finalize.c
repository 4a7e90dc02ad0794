/* Five MPI_Allreduce calls, then exit() without MPI_Finalize: streamcoll's timeline is
 * then written by each rank at exit, to STREAMCOLL_TIMELINE.rank<N> (tests/fake/trace.sh). */
#include <mpi.h>
#include <stdlib.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int x = 1, y = 0;
  for (int i = 0; i < 5; ++i) MPI_Allreduce(&x, &y, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  exit(y == 0);
}
