// The service collectives (core/service.hpp) over the real MPI, with ranks that pass
// different values: every rank must reach the same answer, computed here independently
// from what each rank passed (rank r's flag is a known function of r). Linked against
// the library's internals; any number of ranks.
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "core/service.hpp"

namespace svc = streamcoll::service;

namespace {
int g_fails = 0;
int g_rank = 0;
void expect(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "rank %d: FAIL %s\n", g_rank, what);
    ++g_fails;
  }
}
}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const MPI_Comm w = MPI_COMM_WORLD;
  const int last = size - 1;

  expect(svc::all(true, w), "all(true)");
  expect(svc::all(g_rank != last, w) == (size == 0), "all(false on the last rank)");
  expect(!svc::all(false, w), "all(false)");
  int rc = -1;
  expect(svc::all(true, w, &rc) && rc == MPI_SUCCESS, "all() reports the exchange's code");
  expect(!svc::any(false, w), "any(false)");
  expect(svc::any(g_rank == last, w), "any(true on the last rank)");
  expect(svc::any(g_rank == 0, w), "any(true on rank 0)");

  int64_t agreed = 0;
  expect(svc::all_equal(7, w, &agreed) && agreed == 7, "all_equal(7)");
  expect(svc::all_equal(g_rank, w, &agreed) == (size == 1), "all_equal(rank)");
  expect(agreed == last, "all_equal(rank) gives the largest");
  expect(svc::all_equal(-5 - 1000000000000LL, w), "all_equal of a large negative value");

  const int64_t v[3] = {g_rank, -g_rank * 3, 42};
  int64_t lo[3] = {}, hi[3] = {};
  expect(svc::ranges(v, 3, w, lo, hi) == MPI_SUCCESS, "ranges: MPI_SUCCESS");
  expect(lo[0] == 0 && hi[0] == last, "ranges of the rank");
  expect(lo[1] == -3 * last && hi[1] == 0, "ranges of -3 rank");
  expect(lo[2] == 42 && hi[2] == 42, "ranges of a constant");

  // Non-blocking: started in one order on every rank, completed in another.
  svc::Flag f_any, f_all, f_none;
  MPI_Request r[3];
  expect(svc::start_any(g_rank == last, w, &f_any, &r[0]) == MPI_SUCCESS, "start_any");
  expect(svc::start_all(g_rank != 0 || size == 1, w, &f_all, &r[1]) == MPI_SUCCESS, "start_all");
  expect(svc::start_any(false, w, &f_none, &r[2]) == MPI_SUCCESS, "start_any(false)");
  MPI_Wait(&r[2], MPI_STATUS_IGNORE);
  MPI_Waitall(2, r, MPI_STATUSES_IGNORE);
  expect(f_any.agreed == 1 && f_any.mine == (g_rank == last), "start_any: some rank");
  expect(f_all.agreed == (size == 1 ? 1 : 0), "start_all: rank 0 says no");
  expect(f_none.agreed == 0, "start_any: no rank");

  // A sub-communicator whose ranks are every other rank: the answers are its own.
  MPI_Comm half;
  MPI_Comm_split(w, g_rank % 2, g_rank, &half);
  expect(svc::any(g_rank == last, half) == (g_rank % 2 == last % 2), "any over a split");
  MPI_Comm_free(&half);

  int fails = 0;
  MPI_Allreduce(&g_fails, &fails, 1, MPI_INT, MPI_SUM, w);
  if (g_rank == 0) std::printf("service: %d ranks, %d failures\n", size, fails);
  MPI_Finalize();
  return fails ? 1 : 0;
}
