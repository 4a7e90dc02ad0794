// Communicators made the way process-group codes make them, under streamcoll with the fake
// CUDA driver and the fake NCCL: what NCCL communicators and GPU memory streamcoll takes.
//
//   comm_churn MODE
//   churn   one-rank communicators (MPI_COMM_SELF, a split into one-rank groups, a
//           Cartesian sub-communicator of one): allreduce, reduce, bcast, allgather,
//           reduce-scatter-block and alltoall on device memory, blocking and MPI_I*,
//           classic and stream-ordered, persistent, and captured into a CUDA graph: every
//           value exact (allgatherv and reduce_scatter too: STREAMCOLL_STATS=1 puts them on
//           the full path), route self, no NCCL communicator made. Then (2+ ranks) a GPU
//           allreduce on MPI_COMM_WORLD (its NCCL communicator, the only one with
//           resources of its own), 40 duplicates alive at once, 40 dup/free cycles,
//           MPI_Comm_dup_with_info, a split with MPI_UNDEFINED, MPI_Cart_create: values
//           exact; the children share the parent's resources (ncclCommSplit), at most
//           STREAMCOLL_NCCL_MAX_COMMS live, the rest on pmpi; the fake GPU memory taken is
//           one communicator's (FAKE_NCCL_COMM_BYTES) and streamcoll reports it.
//   budget  (2+ ranks; local rank 1's budget is STREAMCOLL_NCCL_MEMORY=300M, set here
//           before MPI_Init, FAKE_NCCL_COMM_BYTES=256M): world's NCCL communicator is made;
//           a second one with resources of its own (MPI_Comm_idup, not derived) is turned
//           away by rank 1's budget, and every rank takes pmpi, values exact; rank 1 then
//           allocates 32 MiB of the GPU.
//   misordered (2+ ranks; FAKE_NCCL_SPLIT_IGNORE_KEY=1): the fake NCCL's split ignores the
//           keys, so a child with reversed ranks is not the MPI one: streamcoll's check
//           refuses it, the child sets up its own NCCL communicator, values exact.
//   nearfull (2+ ranks; FAKE_CUDA_MEM_TOTAL small on local rank 1): ncclCommInitRank
//           fails for lack of memory on rank 1 only: every rank falls back, values exact,
//           rank 1's GPU allocation after it succeeds.
// A watchdog (alarm) fails the run if anything blocks. Prints "N passed, N failed".
#include <cuda.h>
#include <dlfcn.h>
#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "harness.hpp"
#include "streamcoll/streamext.h"

#if defined(OPEN_MPI) && OPEN_MPI
#include <mpi-ext.h>
#if defined(OMPI_HAVE_MPI_EXT_PCOLLREQ) && OMPI_HAVE_MPI_EXT_PCOLLREQ
#define PCOLL(name) MPIX_##name
#endif
#elif MPI_VERSION >= 4
#define PCOLL(name) MPI_##name
#endif

namespace {

using NcclCounts = void (*)(unsigned long long*, unsigned long long*, unsigned long long*,
                            unsigned long long*, unsigned long long*, unsigned long long*);
NcclCounts g_nccl_counts = nullptr;

struct Nccl {
  unsigned long long own = 0, shared = 0, live = 0, refused = 0, bytes = 0, peak = 0;
};
Nccl nccl_counts() {
  Nccl n;
  if (g_nccl_counts) g_nccl_counts(&n.own, &n.shared, &n.live, &n.refused, &n.bytes, &n.peak);
  return n;
}

// The driver calls the program makes itself (cuda.h's symbol names).
struct Cu {
#define CU_FNS(X)                                                                          \
  X(cuStreamBeginCapture) X(cuStreamEndCapture) X(cuGraphInstantiate) X(cuGraphLaunch)    \
  X(cuGraphExecDestroy) X(cuGraphDestroy) X(cuStreamSynchronize) X(cuMemGetInfo)
#define CU_FN(name) decltype(&::name) name = nullptr;
  CU_FNS(CU_FN)
#undef CU_FN
  bool load() {
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h) return false;
    bool ok = true;
#define STR2(x) #x
#define STR(x) STR2(x)
#define CU_LOAD(name) \
  ok = ok && (name = reinterpret_cast<decltype(name)>(dlsym(h, STR(name)))) != nullptr;
    CU_FNS(CU_LOAD)
#undef CU_LOAD
    return ok;
  }
} drv;

constexpr int kN = 96;

// A device buffer of n ints, filled with `base + i`.
int* device_ints(int n, int base) {
  auto* p = static_cast<int*>(api.malloc(n * sizeof(int)));
  for (int i = 0; i < n; ++i) p[i] = base + i;
  return p;
}

bool equal_to(const int* p, int n, int base) {
  for (int i = 0; i < n; ++i)
    if (p[i] != base + i) return false;
  return true;
}

// Every collective on a one-rank `comm`, its result checked: blocking or MPI_I*, on the
// communicator's stream `s` when not null (synchronised before reading).
void one_rank_calls(MPI_Comm comm, CUstream_st* s, bool nonblocking, const std::string& what) {
  int* a = device_ints(kN, 7);
  int* b = device_ints(kN, -1000);
  auto done = [&](MPI_Request* r) {
    if (nonblocking) MPI_Wait(r, MPI_STATUS_IGNORE);
    if (s) api.stream_sync(s);
  };
  auto reset = [&] { for (int i = 0; i < kN; ++i) b[i] = -1000 + i; };
  MPI_Request r = MPI_REQUEST_NULL;
  nonblocking ? MPI_Iallreduce(a, b, kN, MPI_INT, MPI_SUM, comm, &r)
              : MPI_Allreduce(a, b, kN, MPI_INT, MPI_SUM, comm);
  done(&r);
  check(equal_to(b, kN, 7), what + ": allreduce");
  reset();
  nonblocking ? MPI_Ireduce(a, b, kN, MPI_INT, MPI_MAX, 0, comm, &r)
              : MPI_Reduce(a, b, kN, MPI_INT, MPI_MAX, 0, comm);
  done(&r);
  check(equal_to(b, kN, 7), what + ": reduce");
  reset();
  nonblocking ? MPI_Iallgather(a, kN, MPI_INT, b, kN, MPI_INT, comm, &r)
              : MPI_Allgather(a, kN, MPI_INT, b, kN, MPI_INT, comm);
  done(&r);
  check(equal_to(b, kN, 7), what + ": allgather");
  reset();
  nonblocking ? MPI_Ialltoall(a, kN, MPI_INT, b, kN, MPI_INT, comm, &r)
              : MPI_Alltoall(a, kN, MPI_INT, b, kN, MPI_INT, comm);
  done(&r);
  check(equal_to(b, kN, 7), what + ": alltoall");
  reset();
  nonblocking ? MPI_Ireduce_scatter_block(a, b, kN, MPI_INT, MPI_SUM, comm, &r)
              : MPI_Reduce_scatter_block(a, b, kN, MPI_INT, MPI_SUM, comm);
  done(&r);
  check(equal_to(b, kN, 7), what + ": reduce_scatter_block");
  // The v-forms (on the full path here: STREAMCOLL_STATS=1): the block at displs[0].
  const int counts[1] = {kN / 2}, displs[1] = {kN / 4};
  reset();
  nonblocking ? MPI_Iallgatherv(a, kN / 2, MPI_INT, b, counts, displs, MPI_INT, comm, &r)
              : MPI_Allgatherv(a, kN / 2, MPI_INT, b, counts, displs, MPI_INT, comm);
  done(&r);
  check(equal_to(b, kN / 4, -1000) && equal_to(b + kN / 4, kN / 2, 7) &&
            equal_to(b + 3 * kN / 4, kN / 4, -1000 + 3 * kN / 4),
        what + ": allgatherv (only the block at displs[0] written)");
  reset();
  nonblocking ? MPI_Ireduce_scatter(a, b, counts, MPI_INT, MPI_SUM, comm, &r)
              : MPI_Reduce_scatter(a, b, counts, MPI_INT, MPI_SUM, comm);
  done(&r);
  check(equal_to(b, kN / 2, 7) && equal_to(b + kN / 2, kN / 2, -1000 + kN / 2),
        what + ": reduce_scatter (recvcounts[0] elements written)");
  nonblocking ? MPI_Ibcast(a, kN, MPI_INT, 0, comm, &r) : MPI_Bcast(a, kN, MPI_INT, 0, comm);
  done(&r);
  check(equal_to(a, kN, 7), what + ": bcast leaves the buffer");
  nonblocking ? MPI_Iallreduce(MPI_IN_PLACE, a, kN, MPI_INT, MPI_SUM, comm, &r)
              : MPI_Allreduce(MPI_IN_PLACE, a, kN, MPI_INT, MPI_SUM, comm);
  done(&r);
  check(equal_to(a, kN, 7), what + ": allreduce in place");
  api.free(a);
  api.free(b);
}

// A persistent allreduce and a captured one on a one-rank `comm` with stream `s`.
void one_rank_persistent_and_captured(MPI_Comm comm, CUstream_st* s) {
  int* a = device_ints(kN, 3);
  int* b = device_ints(kN, 0);
#ifdef PCOLL
  MPI_Request req;
  check(PCOLL(Allreduce_init)(a, b, kN, MPI_INT, MPI_SUM, comm, MPI_INFO_NULL, &req) ==
            MPI_SUCCESS, "persistent init");
  for (int k = 0; k < 3; ++k) {
    for (int i = 0; i < kN; ++i) a[i] = 3 + i + k;
    MPI_Start(&req);
    MPI_Wait(&req, MPI_STATUS_IGNORE);
    api.stream_sync(s);
    check(equal_to(b, kN, 3 + k), "persistent start " + std::to_string(k));
  }
  MPI_Request_free(&req);
#endif
  auto* st = reinterpret_cast<CUstream>(s);
  CUgraph g = nullptr;
  CUgraphExec ge = nullptr;
  bool ok = drv.cuStreamBeginCapture(st, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS;
  ok = ok && MPI_Allreduce(a, b, kN, MPI_INT, MPI_SUM, comm) == MPI_SUCCESS;
  ok = ok && drv.cuStreamEndCapture(st, &g) == CUDA_SUCCESS;
  ok = ok && drv.cuGraphInstantiate(&ge, g, 0) == CUDA_SUCCESS;
  check(ok, "captured a one-rank allreduce");
  for (int k = 0; ok && k < 3; ++k) {
    for (int i = 0; i < kN; ++i) a[i] = 50 + i + k, b[i] = 0;
    check(drv.cuGraphLaunch(ge, st) == CUDA_SUCCESS, "graph launch");
    drv.cuStreamSynchronize(st);
    check(equal_to(b, kN, 50 + k), "graph replay " + std::to_string(k));
  }
  unsigned long long lanes = 0;
  auto counts = reinterpret_cast<void (*)(unsigned long long*, unsigned long long*,
                                          unsigned long long*, unsigned long long*)>(
      dlsym(RTLD_DEFAULT, "streamcoll_capture_counts"));
  if (counts) counts(&lanes, nullptr, nullptr, nullptr);
  check(lanes == 0, "no replay lane for a one-rank communicator (" + std::to_string(lanes) + ")");
  if (ge) drv.cuGraphExecDestroy(ge);
  if (g) drv.cuGraphDestroy(g);
  api.free(a);
  api.free(b);
}

void singletons(CUstream_st* s) {
  const unsigned long long inits0 = nc("ncclCommInitRank");
  MPI_Comm split1, self2, cart, line;
  MPI_Comm_split(MPI_COMM_WORLD, g_rank, 0, &split1);
  MPI_Comm_dup(MPI_COMM_SELF, &self2);
  int dims[1] = {g_size}, periods[1] = {0}, remain[1] = {0};
  MPI_Cart_create(MPI_COMM_WORLD, 1, dims, periods, 0, &cart);
  MPI_Cart_sub(cart, remain, &line);  // a sub-communicator of one rank
  struct Named {
    MPI_Comm c;
    const char* name;
  } comms[] = {{MPI_COMM_SELF, "MPI_COMM_SELF"}, {split1, "split into ones"},
               {line, "Cartesian sub of one"}};
  // (MPICH 4.0 gives the 0-dimensional sub-communicator to the first rank only, and
  // MPI_COMM_NULL to the others; Open MPI 4.1 gives each rank one.)
  for (const Named& n : comms)
    for (bool nb : {false, true})
      if (n.c != MPI_COMM_NULL)
        one_rank_calls(n.c, nullptr, nb, std::string(n.name) + (nb ? " MPI_I*" : ""));
  check(streamcoll_comm_attach_stream(self2, s) == MPI_SUCCESS, "attach");
  for (bool nb : {false, true}) one_rank_calls(self2, s, nb, std::string("stream-ordered") + (nb ? " MPI_I*" : ""));
  one_rank_persistent_and_captured(self2, s);
  check(nc("ncclCommInitRank") == inits0, "no NCCL communicator for one rank (" +
                                              std::to_string(nc("ncclCommInitRank") - inits0) + ")");
  check(stat_calls("allreduce", "self", "device") >= 6, "route self took them (" +
        std::to_string(stat_calls("allreduce", "self", "device")) + ")");
  check(nccl_counts().own == 0 && nccl_counts().shared == 0, "streamcoll reports no NCCL communicator");
  for (MPI_Comm* c : {&split1, &self2, &line, &cart})
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
}

bool allreduce_right(MPI_Comm comm, int n, int salt) {
  int size = 1, rank = 0;
  MPI_Comm_size(comm, &size);
  MPI_Comm_rank(comm, &rank);
  int* a = device_ints(n, salt * 10 + rank);
  int* b = device_ints(n, 0);
  const int rc = MPI_Allreduce(a, b, n, MPI_INT, MPI_SUM, comm);
  bool ok = rc == MPI_SUCCESS;
  // sum over ranks r of (salt*10 + r + i)
  for (int i = 0; ok && i < n; ++i)
    ok = b[i] == size * (salt * 10 + i) + size * (size - 1) / 2;
  api.free(a);
  api.free(b);
  return ok;
}

unsigned long long model_bytes() {
  const char* v = getenv("FAKE_NCCL_COMM_BYTES");
  return v ? std::strtoull(v, nullptr, 10) : 0;
}

void children() {
  const unsigned long long inits0 = nc("ncclCommInitRank");
  check(allreduce_right(MPI_COMM_WORLD, 64, 1), "world: right");
  check(nc("ncclCommInitRank") - inits0 == 1, "world: one NCCL communicator of its own");
  const Nccl n0 = nccl_counts();
  check(n0.own == 1, "streamcoll made one with resources of its own (" + std::to_string(n0.own) + ")");
  if (model_bytes())
    check(n0.bytes == model_bytes(), "its GPU memory measured: " + std::to_string(n0.bytes) +
                                         " B (the fake NCCL takes " + std::to_string(model_bytes()) + ")");
  // 40 duplicates alive at once.
  std::vector<MPI_Comm> live(40);
  for (size_t i = 0; i < live.size(); ++i) {
    MPI_Comm_dup(MPI_COMM_WORLD, &live[i]);
    check(allreduce_right(live[i], 48, 2 + static_cast<int>(i)), "live dup " + std::to_string(i));
  }
  const Nccl n1 = nccl_counts();
  check(n1.own == 1, "40 live duplicates: still one with its own resources (" + std::to_string(n1.own) + ")");
  check(n1.shared == 31, "31 share world's (STREAMCOLL_NCCL_MAX_COMMS=32 with world's): " +
                             std::to_string(n1.shared));
  check(nc("ncclCommInitRank") - inits0 == 1, "no other ncclCommInitRank");
  check(n1.bytes == n0.bytes, "no more GPU memory taken (" + std::to_string(n1.bytes) + ")");
  for (MPI_Comm& c : live) MPI_Comm_free(&c);
  // 40 dup/free cycles, dup_with_info, a split with MPI_UNDEFINED, a Cartesian communicator.
  for (int i = 0; i < 40; ++i) {
    MPI_Comm c;
    MPI_Comm_dup(MPI_COMM_WORLD, &c);
    check(allreduce_right(c, 32, 100 + i), "dup/free " + std::to_string(i));
    MPI_Comm_free(&c);
  }
  MPI_Comm info_dup, some, cart;
  MPI_Comm_dup_with_info(MPI_COMM_WORLD, MPI_INFO_NULL, &info_dup);
  check(allreduce_right(info_dup, 40, 300), "dup_with_info");
  MPI_Comm_split(MPI_COMM_WORLD, g_rank == 0 ? MPI_UNDEFINED : 1, g_rank, &some);
  check((g_rank == 0) == (some == MPI_COMM_NULL), "MPI_UNDEFINED: no communicator on rank 0");
  if (some != MPI_COMM_NULL) check(allreduce_right(some, 40, 400), "split without rank 0");
  int dims[1] = {g_size}, periods[1] = {1};
  MPI_Cart_create(MPI_COMM_WORLD, 1, dims, periods, 0, &cart);
  check(allreduce_right(cart, 40, 500), "Cartesian");
  MPI_Comm reversed;  // the child's ranks in the reverse order of world's
  MPI_Comm_split(MPI_COMM_WORLD, 0, g_size - g_rank, &reversed);
  check(allreduce_right(reversed, 40, 600), "split with reversed keys");
  MPI_Comm_free(&reversed);
  const Nccl n2 = nccl_counts();
  // 31 live duplicates, 40 cycles, dup_with_info, the Cartesian one, the reversed split,
  // and the split where
  // this rank is in a child of 2+ ranks (a child of one rank takes route self).
  int some_size = 0;
  if (some != MPI_COMM_NULL) MPI_Comm_size(some, &some_size);
  const unsigned long long expect_shared = 31 + 40 + 1 + 1 + 1 + (some_size > 1 ? 1 : 0);
  check(n2.shared == expect_shared, "every child of 2+ ranks shared world's resources (" +
                                        std::to_string(n2.shared) + " of " +
                                        std::to_string(expect_shared) + ")");
  check(n2.own == 1 && nc("ncclCommInitRank") - inits0 == 1, "one own NCCL communicator in all");
  check(nc("own_resource_comms") <= 1, "the fake NCCL holds at most one with its own resources");
  MPI_Comm_free(&info_dup);
  MPI_Comm_free(&cart);
  if (some != MPI_COMM_NULL) MPI_Comm_free(&some);
}

int local_rank() {
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_RANK"})
    if (const char* s = getenv(v)) return atoi(s);
  return 0;
}

// FAKE_NCCL_SPLIT_IGNORE_KEY=1: NCCL's child is not the MPI child (ranks in another
// order); streamcoll's check sees it, no split is kept, and the child sets up at its first
// call (its own NCCL communicator); values exact.
void misordered() {
  check(allreduce_right(MPI_COMM_WORLD, 64, 1), "world: right");
  MPI_Comm reversed;
  MPI_Comm_split(MPI_COMM_WORLD, 0, g_size - g_rank, &reversed);
  check(allreduce_right(reversed, 64, 2), "reversed split: right");
  // An allgather, whose result depends on the ranks' order: the block of child rank r at r.
  int rank = 0, size = 1;
  MPI_Comm_rank(reversed, &rank);
  MPI_Comm_size(reversed, &size);
  int* mine = device_ints(4, 100 * rank);
  int* all = device_ints(4 * size, -1);
  MPI_Allgather(mine, 4, MPI_INT, all, 4, MPI_INT, reversed);
  bool ordered = true;
  for (int r = 0; r < size; ++r) ordered = ordered && equal_to(all + 4 * r, 4, 100 * r);
  check(ordered, "reversed split: allgather in the child's rank order");
  api.free(mine);
  api.free(all);
  const Nccl n = nccl_counts();
  check(n.shared == 0, "the misordered split was not kept (" + std::to_string(n.shared) + ")");
  check(n.own == 2, "the child set up its own at its first call (" + std::to_string(n.own) + ")");
  check(nc("shared_comms") == 0, "the fake NCCL holds no split");
  MPI_Comm_free(&reversed);
}

void budget() {
  check(allreduce_right(MPI_COMM_WORLD, 64, 1), "world: right");
  const Nccl n0 = nccl_counts();
  MPI_Comm other;
  MPI_Request r;
  MPI_Comm_idup(MPI_COMM_WORLD, &other, &r);  // not derived: its own set-up
  MPI_Wait(&r, MPI_STATUS_IGNORE);
  const unsigned long long pmpi0 = stat_calls("allreduce", "pmpi", "device");
  check(allreduce_right(other, 64, 2), "the second communicator: right");
  const Nccl n1 = nccl_counts();
  check(n1.own == n0.own, "no second own NCCL communicator (" + std::to_string(n1.own) + ")");
  check(stat_calls("allreduce", "pmpi", "device") - pmpi0 == 1, "its call took pmpi");
  if (g_rank == 1) check(n1.refused == 1, "rank 1's budget turned it away");
  void* p = api.malloc(32u << 20);
  check(p != nullptr, "the program's allocation after it succeeds");
  if (p) api.free(p);
  MPI_Comm_free(&other);
}

void nearfull() {
  const unsigned long long pmpi0 = stat_calls("allreduce", "pmpi", "device");
  check(allreduce_right(MPI_COMM_WORLD, 64, 1), "world: right although NCCL failed on rank 1");
  check(stat_calls("allreduce", "pmpi", "device") - pmpi0 == 1, "it took pmpi on every rank");
  check(nccl_counts().own == 0, "no NCCL communicator kept");
  check(nc("own_resource_comms") == 0, "the fake NCCL holds none");
  void* p = api.malloc(16u << 20);
  check(p != nullptr, "the program's allocation after it succeeds");
  if (p) api.free(p);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "churn";
  if (mode == "budget" && local_rank() == 1) setenv("STREAMCOLL_NCCL_MEMORY", "300M", 1);
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  alarm(240);
  if (!load_api(true) || !drv.load()) MPI_Abort(MPI_COMM_WORLD, 2);
  g_nccl_counts = reinterpret_cast<NcclCounts>(dlsym(RTLD_DEFAULT, "streamcoll_nccl_counts"));
  check(g_nccl_counts != nullptr, "streamcoll_nccl_counts");
  api.runtime_init();
  CUstream_st* s = api.stream_create(1);
  if (mode == "churn") {
    singletons(s);
    if (g_size >= 2) children();
  } else if (mode == "misordered" && g_size >= 2) {
    misordered();
  } else if (mode == "budget" && g_size >= 2) {
    budget();
  } else if (mode == "nearfull" && g_size >= 2) {
    nearfull();
  }
  alarm(0);
  check(nc("mismatches") == 0, "every rank ran the same NCCL operations");
  api.stream_destroy(s);
  api.runtime_fini();
  int counts[2] = {g_pass, g_fail}, total[2] = {0, 0};
  MPI_Reduce(counts, total, 2, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
  MPI_Finalize();
  if (g_rank == 0)
    std::printf("comm_churn (%s, %d ranks): %d passed, %d failed\n", mode.c_str(), g_size,
                total[0], total[1]);
  return total[1] == 0 && g_fail == 0 ? 0 : 1;
}
