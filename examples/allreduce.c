/* An ordinary MPI program (no streamcoll in it): an allreduce of every rank's number on
 * host memory, checked. `meson install` puts it in share/streamcoll/examples; run it
 * under streamcoll with the module loaded:
 *   mpicc allreduce.c -o allreduce && mpirun -np 4 streamcoll-exec ./allreduce
 * With STREAMCOLL_STATS=1 streamcoll prints its statistics table at MPI_Finalize. */
#include <mpi.h>
#include <stdio.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  long mine = rank + 1, sum = 0;
  MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  const long want = (long)size * (size + 1) / 2;
  if (rank == 0) printf("allreduce over %d ranks: %ld (%s)\n", size, sum, sum == want ? "right" : "WRONG");
  MPI_Finalize();
  return sum == want ? 0 : 1;
}
