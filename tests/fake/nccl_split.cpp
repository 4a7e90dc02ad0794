// The fake NCCL's ncclCommSplit and its communicators' device memory on their own (no
// streamcoll): what route nccl's sub-communicators will rely on. Plain MPI + dl, as
// nccl_p2p.cpp: the fake CUDA driver (libcuda.so.1 through LD_LIBRARY_PATH) and the fake
// NCCL (argv[1]) are opened with dlopen; MPI carries the unique id (and the tally). Needs
// exactly 3 ranks on one node. The environment says what to expect:
// FAKE_NCCL_COMM_BYTES (a communicator's device memory; unset: the fake's model,
// FAKE_NCCL_CHANNELS included), FAKE_CUDA_MEM_TOTAL on local rank FAKE_CUDA_MEM_TOTAL_RANK
// (the "tight" rank; the others have the default 80 GiB), small enough that the tight
// rank holds the communicators of steps 1-3 and no more.
//
//   1. ncclCommInitRank of the 3 ranks: ncclCommCount, ncclCommUserRank; one communicator
//      with resources of its own, its bytes reserved (cuMemGetInfo's free down by them);
//   2. ncclCommSplit by color rank % 2 ({0, 2}, {1}), key -rank (so rank 2 comes first),
//      no config (resources of its own), while an ncclAllReduce on the parent may still
//      run: counts, ranks, an allreduce on each child and the parent's, values exact;
//   3. ncclCommSplit with splitShare=1, rank 1 passing NCCL_SPLIT_NOCOLOR (NULL, success):
//      no more device memory; its child split again without a config (inherits sharing);
//      allreduces on both;
//   4. arguments refused on every rank (before the collective part): color -2, a config
//      without NCCL_CONFIG_INITIALIZER's magic: ncclInvalidArgument, NULL;
//   5. device memory too small on the tight rank: a split of the parent with
//      splitShare=0 and a new ncclCommInitRank fail there (ncclUnhandledCudaError,
//      "Failed to CUDA calloc <n> bytes", nothing taken), and succeed on the others, which
//      then destroy and abort them;
//   6. everything destroyed, the parent first (its memory stays while the splits sharing
//      it live): the gauges own_resource_comms, shared_comms, resource_bytes and the
//      free memory follow at each step, back to 0 and to the start. No mismatch.
// Prints "N passed, N failed" on rank 0; exits nonzero on a failure.
#include <dlfcn.h>
#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fake_api.h"

namespace {

int g_rank = 0, g_size = 1, g_pass = 0, g_fail = 0;

bool check(bool ok, const std::string& what) {
  ok ? ++g_pass : ++g_fail;
  if (!ok) std::fprintf(stderr, "[rank %d] FAIL: %s\n", g_rank, what.c_str());
  return ok;
}

struct Nccl {
  ncclResult_t (*GetUniqueId)(ncclUniqueId*);
  ncclResult_t (*CommInitRank)(ncclComm_t*, int, ncclUniqueId, int);
  ncclResult_t (*CommSplit)(ncclComm_t, int, int, ncclComm_t*, ncclConfig_t*);
  ncclResult_t (*CommCount)(const ncclComm_t, int*);
  ncclResult_t (*CommUserRank)(const ncclComm_t, int*);
  ncclResult_t (*AllReduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                            cudaStream_t);
  ncclResult_t (*CommDestroy)(ncclComm_t);
  ncclResult_t (*CommAbort)(ncclComm_t);
  const char* (*GetLastError)(ncclComm_t);
  fake_nccl_counter_fn counter;
} N;

struct Cuda {
  fake_cuda_malloc_fn malloc;
  fake_cuda_free_fn free;
  fake_cuda_runtime_init_fn runtime_init;
  fake_cuda_runtime_fini_fn runtime_fini;
  fake_cuda_stream_create_fn stream_create;
  fake_cuda_stream_destroy_fn stream_destroy;
  fake_cuda_stream_sync_fn stream_sync;
  fake_cuda_counter_fn counter;
  int (*MemGetInfo)(size_t*, size_t*);  // cuMemGetInfo (cuda.h's cuMemGetInfo_v2)
} C;

template <class F>
bool sym(void* h, F& fn, const char* name) {
  fn = h ? reinterpret_cast<F>(dlsym(h, name)) : nullptr;
  if (!fn) std::fprintf(stderr, "[rank %d] %s not found\n", g_rank, name);
  return fn != nullptr;
}

bool load_cuda() {
  void* cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  return sym(cu, C.malloc, "fake_cuda_malloc") && sym(cu, C.free, "fake_cuda_free") &&
         sym(cu, C.runtime_init, "fake_cuda_runtime_init") &&
         sym(cu, C.runtime_fini, "fake_cuda_runtime_fini") &&
         sym(cu, C.stream_create, "fake_cuda_stream_create") &&
         sym(cu, C.stream_destroy, "fake_cuda_stream_destroy") &&
         sym(cu, C.stream_sync, "fake_cuda_stream_sync") && sym(cu, C.counter, "fake_cuda_counter") &&
         sym(cu, C.MemGetInfo, "cuMemGetInfo_v2");
}

bool load_nccl(const char* path) {
  void* nc = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  return sym(nc, N.GetUniqueId, "ncclGetUniqueId") && sym(nc, N.CommInitRank, "ncclCommInitRank") &&
         sym(nc, N.CommSplit, "ncclCommSplit") && sym(nc, N.CommCount, "ncclCommCount") &&
         sym(nc, N.CommUserRank, "ncclCommUserRank") && sym(nc, N.AllReduce, "ncclAllReduce") &&
         sym(nc, N.CommDestroy, "ncclCommDestroy") && sym(nc, N.CommAbort, "ncclCommAbort") &&
         sym(nc, N.GetLastError, "ncclGetLastError") && sym(nc, N.counter, "fake_nccl_counter");
}

// ---- what to expect ----------------------------------------------------------------------

// <bytes>[K|M|G|T], powers of 1024 (as the fakes read FAKE_NCCL_COMM_BYTES and
// FAKE_CUDA_MEM_TOTAL); 0 if unset.
unsigned long long env_bytes(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return 0;
  char* end = nullptr;
  unsigned long long n = std::strtoull(v, &end, 10);
  if (*end) n <<= 10 * static_cast<int>(std::string("KMGT").find(static_cast<char>(std::toupper(*end))) + 1);
  return n;
}

// The device memory of a communicator of n ranks: FAKE_NCCL_COMM_BYTES, or the fake's
// model (fake_nccl.cpp, "Resources"): 512 MiB + channels x min(n - 1, 2) x 9,633,792.
unsigned long long comm_bytes(int n) {
  if (unsigned long long b = env_bytes("FAKE_NCCL_COMM_BYTES")) return b;
  const char* ch = std::getenv("FAKE_NCCL_CHANNELS");
  const unsigned long long channels = ch && *ch ? std::strtoull(ch, nullptr, 10) : 16;
  return 536870912ull + channels * static_cast<unsigned long long>(std::min(n - 1, 2)) * 9633792ull;
}

// The tight rank (FAKE_CUDA_MEM_TOTAL_RANK) and this rank's device total.
int tight_rank() {
  const char* r = std::getenv("FAKE_CUDA_MEM_TOTAL_RANK");
  return r && *r ? std::atoi(r) : -1;
}
unsigned long long my_total() {
  const unsigned long long t = env_bytes("FAKE_CUDA_MEM_TOTAL");
  return t && (tight_rank() < 0 || g_rank == tight_rank()) ? t : 80ull << 30;
}

// What this rank's gauges should say, kept as the test goes, and the free memory at the
// start (the test's buffers already allocated: free0 - bytes is what should be free).
struct Expect {
  long long own = 0, shared = 0;
  unsigned long long bytes = 0, free0 = 0;
} E;

size_t free_now() {
  size_t f = 0, t = 0;
  return C.MemGetInfo(&f, &t) == 0 ? f : 0;
}

void check_state(const std::string& step) {
  const unsigned long long own = N.counter("own_resource_comms"), shared = N.counter("shared_comms"),
                           bytes = N.counter("resource_bytes"), f = free_now();
  check(own == static_cast<unsigned long long>(E.own) && shared == static_cast<unsigned long long>(E.shared) &&
            bytes == E.bytes && f == E.free0 - E.bytes,
        step + ": own_resource_comms " + std::to_string(own) + " (expected " + std::to_string(E.own) +
            "), shared_comms " + std::to_string(shared) + " (" + std::to_string(E.shared) +
            "), resource_bytes " + std::to_string(bytes) + " (" + std::to_string(E.bytes) + "), free " +
            std::to_string(f) + " (" + std::to_string(E.free0 - E.bytes) + ")");
}

// ---- communicators and their operations -----------------------------------------------

cudaStream_t g_stream = nullptr;
// The allreduces' buffers (100 int64 each), all allocated before the start's free is read.
constexpr int kBuffers = 12;
std::vector<void*> g_bufs;
int g_next_buf = 0;

int64_t* buffer() {
  if (g_next_buf == kBuffers) {
    std::fprintf(stderr, "[rank %d] nccl_split: more than %d buffers\n", g_rank, kBuffers);
    std::abort();
  }
  return static_cast<int64_t*>(g_bufs[g_next_buf++]);
}

void sync(const std::string& what) { check(C.stream_sync(reinterpret_cast<CUstream_st*>(g_stream)) == 0, what + ": sync"); }

// comm's size and this rank's place in it.
void check_shape(ncclComm_t comm, int n, int rank, const std::string& what) {
  int count = -1, me = -1;
  check(N.CommCount(comm, &count) == ncclSuccess && count == n,
        what + ": ncclCommCount " + std::to_string(count) + " (expected " + std::to_string(n) + ")");
  check(N.CommUserRank(comm, &me) == ncclSuccess && me == rank,
        what + ": ncclCommUserRank " + std::to_string(me) + " (expected " + std::to_string(rank) + ")");
}

// An allreduce on comm of (world rank + 1) * 1000 + i, issued (in, out: 100 int64 each).
void issue_allreduce(ncclComm_t comm, int64_t* in, int64_t* out, const std::string& what) {
  for (int i = 0; i < 100; ++i) in[i] = (g_rank + 1) * 1000 + i;
  std::memset(out, 0, 8 * 100);
  check(N.AllReduce(in, out, 100, ncclInt64, ncclSum, comm, g_stream) == ncclSuccess, what + ": ncclAllReduce");
}

// Its result, once synchronised: the sum over `ranks` (world ranks).
void check_allreduce(const int64_t* out, const std::vector<int>& ranks, const std::string& what) {
  int64_t base = 0;
  for (int r : ranks) base += (r + 1) * 1000;
  bool right = true;
  for (int i = 0; i < 100; ++i) right = right && out[i] == base + static_cast<int64_t>(ranks.size()) * i;
  check(right, what + ": allreduce values");
}

void allreduce(ncclComm_t comm, const std::vector<int>& ranks, const std::string& what) {
  int64_t* in = buffer();
  int64_t* out = buffer();
  issue_allreduce(comm, in, out, what);
  sync(what);
  check_allreduce(out, ranks, what);
}

ncclConfig_t share_config(int split_share) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.splitShare = split_share;
  return config;
}

// ---- the steps -----------------------------------------------------------------------------

ncclComm_t step_init(ncclUniqueId id) {
  ncclComm_t parent = nullptr;
  check(N.CommInitRank(&parent, g_size, id, g_rank) == ncclSuccess && parent, "1: ncclCommInitRank");
  check_shape(parent, 3, g_rank, "1: the parent");
  E.own = 1;
  E.bytes = comm_bytes(3);
  check_state("1: the parent");
  return parent;
}

// {0, 2} (keys 0, -2: rank 2 first) and {1}, resources of their own; the parent's
// allreduce issued before the split, synchronised after it.
ncclComm_t step_split(ncclComm_t parent) {
  int64_t* in = buffer();
  int64_t* out = buffer();
  issue_allreduce(parent, in, out, "2: the parent before the split");
  ncclComm_t child = nullptr;
  check(N.CommSplit(parent, g_rank % 2, -g_rank, &child, nullptr) == ncclSuccess && child,
        "2: ncclCommSplit by rank % 2");
  sync("2: the parent");
  check_allreduce(out, {0, 1, 2}, "2: the parent's allreduce across the split");
  const int n = g_rank == 1 ? 1 : 2, rank = g_rank == 0 ? 1 : 0;
  check_shape(child, n, rank, "2: the child");
  E.own = 2;
  E.bytes += comm_bytes(n);
  check_state("2: a child with resources of its own");
  allreduce(child, g_rank == 1 ? std::vector<int>{1} : std::vector<int>{0, 2}, "2: the child");
  check_state("2: after its allreduce");
  return child;
}

// splitShare=1, rank 1 left out; then the child split again without a config.
void step_share(ncclComm_t parent, ncclComm_t* shared, ncclComm_t* grandchild) {
  ncclConfig_t config = share_config(1);
  const int color = g_rank == 1 ? NCCL_SPLIT_NOCOLOR : 5;
  *shared = reinterpret_cast<ncclComm_t>(&config);  // must come back NULL on rank 1
  check(N.CommSplit(parent, color, g_rank, shared, &config) == ncclSuccess, "3: ncclCommSplit, splitShare=1");
  if (g_rank == 1) {
    check(*shared == nullptr, "3: NCCL_SPLIT_NOCOLOR: no communicator");
    check_state("3: left out");
    return;
  }
  check(*shared != nullptr, "3: a shared child");
  check_shape(*shared, 2, g_rank / 2, "3: the shared child");
  E.shared = 1;
  check_state("3: a shared child takes no memory");
  allreduce(*shared, {0, 2}, "3: the shared child");
  check(N.CommSplit(*shared, 0, 0, grandchild, nullptr) == ncclSuccess && *grandchild,
        "3: its split without a config");
  check_shape(*grandchild, 2, g_rank / 2, "3: the grandchild");
  E.shared = 2;
  check_state("3: the grandchild inherits sharing");
  allreduce(*grandchild, {0, 2}, "3: the grandchild");
}

void step_refused(ncclComm_t parent) {
  ncclComm_t c = reinterpret_cast<ncclComm_t>(&c);
  check(N.CommSplit(parent, -2, 0, &c, nullptr) == ncclInvalidArgument && c == nullptr,
        "4: color -2: ncclInvalidArgument, NULL");
  ncclConfig_t bad = share_config(0);
  bad.magic = 0;
  c = reinterpret_cast<ncclComm_t>(&c);
  check(N.CommSplit(parent, 0, 0, &c, &bad) == ncclInvalidArgument && c == nullptr,
        "4: a config without NCCL_CONFIG_INITIALIZER: ncclInvalidArgument, NULL");
  check_state("4: nothing taken");
}

// A communicator of 3 made where the tight rank has no room: fails there, alone.
void check_tight(ncclResult_t r, ncclComm_t c, const std::string& what, unsigned long long failures0) {
  if (g_rank == tight_rank()) {
    const std::string want = "Failed to CUDA calloc " + std::to_string(comm_bytes(3)) + " bytes";
    const std::string said = N.GetLastError(nullptr);
    check(r == ncclUnhandledCudaError && c == nullptr, what + ": fails on the tight rank (ncclUnhandledCudaError)");
    check(said.find(want) != std::string::npos, what + ": ncclGetLastError '" + said + "' says '" + want + "'");
    check(N.counter("init_failures") == failures0 + 1, what + ": counted under init_failures");
  } else {
    check(r == ncclSuccess && c != nullptr, what + ": succeeds on the other ranks");
    if (c) check_shape(c, 3, g_rank, what);
    ++E.own;
    E.bytes += comm_bytes(3);
  }
  check_state(what);
}

void step_tight(ncclComm_t parent, ncclUniqueId id2) {
  ncclConfig_t own = share_config(0);
  ncclComm_t split = nullptr, init = nullptr;
  unsigned long long failures0 = N.counter("init_failures");
  ncclResult_t r = N.CommSplit(parent, 0, 0, &split, &own);
  check_tight(r, split, "5: a split of 3 with splitShare=0", failures0);
  failures0 = N.counter("init_failures");
  r = N.CommInitRank(&init, g_size, id2, g_rank);
  check_tight(r, init, "5: ncclCommInitRank of 3", failures0);
  if (split) {
    check(N.CommDestroy(split) == ncclSuccess, "5: ncclCommDestroy of the split");
    --E.own;
    E.bytes -= comm_bytes(3);
  }
  if (init) {
    check(N.CommAbort(init) == ncclSuccess, "5: ncclCommAbort of the new communicator");
    --E.own;
    E.bytes -= comm_bytes(3);
  }
  check_state("5: destroyed and aborted");
}

// The parent first: the splits sharing its memory keep it until they are gone too.
void step_destroy(ncclComm_t parent, ncclComm_t child, ncclComm_t shared, ncclComm_t grandchild) {
  allreduce(parent, {0, 1, 2}, "6: the parent after all the splits");
  check(N.CommDestroy(parent) == ncclSuccess, "6: ncclCommDestroy of the parent");
  --E.own;
  if (!shared) E.bytes -= comm_bytes(3);
  check_state(shared ? "6: the parent gone, its memory still shared" : "6: the parent gone");
  if (shared) {
    check(N.CommDestroy(grandchild) == ncclSuccess && N.CommDestroy(shared) == ncclSuccess,
          "6: ncclCommDestroy of the shared ones");
    E.shared = 0;
    E.bytes -= comm_bytes(3);
    check_state("6: the shared ones gone, the parent's memory with them");
  }
  check(N.CommAbort(child) == ncclSuccess, "6: ncclCommAbort of the child");
  E.own = 0;
  E.bytes = 0;
  check_state("6: nothing left");
  check(N.counter("mismatches") == 0, "6: no mismatch");
}

void run(ncclUniqueId id, ncclUniqueId id2) {
  for (int i = 0; i < kBuffers; ++i) g_bufs.push_back(C.malloc(8 * 100));
  E.free0 = free_now();
  size_t f = 0, total = 0;
  check(C.MemGetInfo(&f, &total) == 0 && total == my_total(),
        "the device's total: " + std::to_string(total) + " (expected " + std::to_string(my_total()) + ")");
  check(E.free0 == total - kBuffers * 4096ull, "at the start only the test's buffers are used (a page each)");
  ncclComm_t parent = step_init(id);
  ncclComm_t child = step_split(parent);
  ncclComm_t shared = nullptr, grandchild = nullptr;
  step_share(parent, &shared, &grandchild);
  step_refused(parent);
  step_tight(parent, id2);
  step_destroy(parent, child, shared, grandchild);
  for (void* p : g_bufs) C.free(p);
  check(free_now() == total && C.counter("device_bytes_used") == 0, "all the device's memory free again");
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  int ok = argc > 1 && g_size == 3 && load_cuda() && load_nccl(argv[1]) ? 1 : 0, all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all) {
    if (g_rank == 0) std::fprintf(stderr, "nccl_split: usage: nccl_split <fake libnccl> (3 ranks)\n");
    MPI_Finalize();
    return 1;
  }
  C.runtime_init();
  g_stream = reinterpret_cast<cudaStream_t>(C.stream_create(1));
  ncclUniqueId ids[2];
  if (g_rank == 0) N.GetUniqueId(&ids[0]), N.GetUniqueId(&ids[1]);
  MPI_Bcast(ids, sizeof ids, MPI_BYTE, 0, MPI_COMM_WORLD);
  run(ids[0], ids[1]);
  C.stream_destroy(reinterpret_cast<CUstream_st*>(g_stream));
  C.runtime_fini();
  int counts[2] = {g_pass, g_fail}, total[2] = {0, 0};
  MPI_Reduce(counts, total, 2, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
  if (g_rank == 0) std::printf("nccl_split (%d ranks): %d passed, %d failed\n", g_size, total[0], total[1]);
  MPI_Finalize();
  return total[1] == 0 && g_fail == 0 ? 0 : 1;
}
