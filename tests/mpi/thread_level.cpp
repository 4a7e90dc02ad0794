// The thread level streamcoll asks the MPI for (STREAMCOLL_THREAD_MULTIPLE=auto: only
// where a route with a progress thread can be used). Plain MPI_Init: the application is
// told MPI_THREAD_SINGLE; the MPI's own level (PMPI_Query_thread, which streamcoll does not
// intercept) must be THREAD_EXPECT: "single" (below MPI_THREAD_MULTIPLE) or "multiple".
//   THREAD_EXPECT=single|multiple thread_level
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, told = -1, real = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Query_thread(&told);
  PMPI_Query_thread(&real);
  const char* want = std::getenv("THREAD_EXPECT");
  const bool multiple = want && std::strcmp(want, "multiple") == 0;
  int ok = told == MPI_THREAD_SINGLE && (multiple ? real == MPI_THREAD_MULTIPLE : real < MPI_THREAD_MULTIPLE);
  if (!ok)
    std::fprintf(stderr, "[rank %d] FAIL: told %d (want %d), the MPI runs at %d (want %s)\n", rank,
                 told, MPI_THREAD_SINGLE, real, multiple ? "MPI_THREAD_MULTIPLE" : "below it");
  int all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Finalize();
  if (rank == 0) std::printf("thread_level (%s): %s\n", want ? want : "?", all ? "1 passed, 0 failed" : "0 passed, 1 failed");
  return all ? 0 : 1;
}
