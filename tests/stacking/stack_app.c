/* The stacking test's program (run.sh): an ordinary MPI program on host buffers whose
 * ranks make a known number of calls, checks every result, then compares the counts of
 * the tools loaded with it: the counting tool's (counter_get, if loaded) and streamcoll's
 * own statistics (streamcoll_get_stats, STREAMCOLL_STATS=1, if loaded). Both must equal
 * the calls made: neither may lose one. Prints "N passed, N failed" on rank 0.
 *   stack_app EXPECT   EXPECT: "both" (the tool and streamcoll see every call), "tool"
 *                      (only the tool: streamcoll absent or bypassed)                  */
#include <dlfcn.h>
#include <mpi.h>
#include <stdio.h>
#include <string.h>

typedef struct {
  unsigned long long calls, bytes;
  double seconds;
} stat_t;

static int fails, passes, rank;
static void check(int ok, const char* what) {
  if (ok) {
    ++passes;
  } else {
    ++fails;
    fprintf(stderr, "[rank %d] FAIL: %s\n", rank, what);
  }
}

int main(int argc, char** argv) {
  const char* expect = argc > 1 ? argv[1] : "both";
  MPI_Init(&argc, &argv);
  int size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  enum { n = 1000, reps = 25 };
  static double in[n], out[n];
  for (int r = 0; r < reps; ++r) {
    for (int i = 0; i < n; ++i) in[i] = rank + i + r;
    MPI_Allreduce(in, out, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    int ok = 1;
    for (int i = 0; i < n; ++i) ok &= out[i] == (double)size * (i + r) + size * (size - 1) / 2.0;
    check(ok, "MPI_Allreduce exact");
  }
  int root_value = rank == 0 ? 42 : 0;
  MPI_Bcast(&root_value, 1, MPI_INT, 0, MPI_COMM_WORLD);
  check(root_value == 42, "MPI_Bcast exact");
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Request q[3];
  long x[3] = {rank, rank + 1, rank + 2}, y[3];
  for (int i = 0; i < 3; ++i) MPI_Iallreduce(&x[i], &y[i], 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD, &q[i]);
  MPI_Wait(&q[0], MPI_STATUS_IGNORE);
  MPI_Waitall(2, &q[1], MPI_STATUSES_IGNORE);
  for (int i = 0; i < 3; ++i) check(y[i] == (long)size * (size - 1) / 2 + (long)size * i, "MPI_Iallreduce exact");

  long (*counter)(const char*) = (long (*)(const char*))dlsym(RTLD_DEFAULT, "counter_get");
  int (*stats)(const char*, const char*, const char*, stat_t*) =
      (int (*)(const char*, const char*, const char*, stat_t*))dlsym(RTLD_DEFAULT, "streamcoll_get_stats");
  check(counter != NULL, "the counting tool is loaded");
  if (counter) {
    check(counter("MPI_Init") + counter("MPI_Init_thread") == 1, "the tool saw MPI_Init once");
    check(counter("MPI_Allreduce") == reps, "the tool counted every MPI_Allreduce");
    check(counter("MPI_Bcast") == 1 && counter("MPI_Barrier") == 1, "the tool counted MPI_Bcast, MPI_Barrier");
    check(counter("MPI_Iallreduce") == 3, "the tool counted every MPI_Iallreduce");
    check(counter("MPI_Wait") == 1 && counter("MPI_Waitall") == 1, "the tool counted MPI_Wait, MPI_Waitall");
  }
  if (strcmp(expect, "both") == 0) {
    check(stats != NULL, "streamcoll is loaded");
    stat_t s;
    if (stats) {
      check(stats("allreduce", NULL, NULL, &s) == 0 && s.calls == reps, "streamcoll counted every MPI_Allreduce");
      check(stats("iallreduce", NULL, NULL, &s) == 0 && s.calls == 3, "streamcoll counted every MPI_Iallreduce");
      check(stats("bcast", NULL, NULL, &s) == 0 && s.calls == 1, "streamcoll counted MPI_Bcast");
      check(stats("barrier", NULL, NULL, &s) == 0 && s.calls == 1, "streamcoll counted MPI_Barrier");
    }
  } else if (stats) {
    stat_t s;
    check(stats("allreduce", NULL, NULL, &s) != 0 || s.calls == 0, "streamcoll was bypassed, as expected");
  }
  int total = 0;
  MPI_Allreduce(&fails, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Finalize();
  if (counter && strcmp(expect, "both") == 0 && counter("MPI_Finalize") != 1) {
    fprintf(stderr, "[rank %d] FAIL: the tool did not see MPI_Finalize\n", rank);
    total += 1;
  }
  if (rank == 0) printf("stacking (%s): %d passed, %d failed\n", expect, passes, total);
  return total == 0 ? 0 : 1;
}
