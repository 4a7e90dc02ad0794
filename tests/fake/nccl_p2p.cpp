// The fake NCCL's send/recv on its own (no streamcoll): NCCL's matching rules, which
// route ccube's rounds rely on. Plain MPI + dl: the fake CUDA driver (libcuda.so.1 through
// LD_LIBRARY_PATH) and the fake NCCL (argv[1]) are opened with dlopen. Needs 3 or more
// ranks (ranks past 2 only take part in the ring and the collective).
//
//   1. unaligned groups: rank 0 sends 3 messages to rank 1 in one group, rank 1 takes
//      them with 3 lone ncclRecv calls;
//   2. a rank that sits a round out: ranks 0 and 1 exchange while rank 2 issues nothing,
//      then every rank sends to the next and receives from the previous in one group;
//   3. more messages to one peer than the fake's ring holds (40, in one group on the
//      sender, in two groups of 20 on the receiver);
//   4. receives from several peers taken as they arrive: rank 0 receives from 2 then
//      from 1 in one group; rank 1 sends to 0 alone, then receives from 2; rank 2 sends to
//      1 first, then to 0, in two groups;
//   5. an allreduce after ranks ran different numbers of groups (collectives are
//      matched among themselves): right, and no mismatch reported;
//   6. a receive larger than the matching send: the receiver's communicator reports
//      ncclInvalidUsage as its asynchronous error and counts a mismatch.
// Every message's bytes are checked against what its sender wrote. Prints "N passed, N
// failed" on rank 0; exits nonzero on a failure.
#include <dlfcn.h>
#include <mpi.h>
#include <nccl.h>

#include <cstdint>
#include <cstdio>
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
  ncclResult_t (*Send)(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*Recv)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*GroupStart)();
  ncclResult_t (*GroupEnd)();
  ncclResult_t (*AllReduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                            cudaStream_t);
  ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t*);
  ncclResult_t (*CommDestroy)(ncclComm_t);
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
} C;

template <class F>
bool sym(void* h, F& fn, const char* name) {
  fn = h ? reinterpret_cast<F>(dlsym(h, name)) : nullptr;
  if (!fn) std::fprintf(stderr, "[rank %d] %s not found\n", g_rank, name);
  return fn != nullptr;
}

bool load(const char* nccl_path) {
  void* cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  void* nc = dlopen(nccl_path, RTLD_NOW | RTLD_LOCAL);
  bool ok = sym(cu, C.malloc, "fake_cuda_malloc") && sym(cu, C.free, "fake_cuda_free") &&
            sym(cu, C.runtime_init, "fake_cuda_runtime_init") &&
            sym(cu, C.runtime_fini, "fake_cuda_runtime_fini") &&
            sym(cu, C.stream_create, "fake_cuda_stream_create") &&
            sym(cu, C.stream_destroy, "fake_cuda_stream_destroy") &&
            sym(cu, C.stream_sync, "fake_cuda_stream_sync");
  ok = ok && sym(nc, N.GetUniqueId, "ncclGetUniqueId") && sym(nc, N.CommInitRank, "ncclCommInitRank") &&
       sym(nc, N.Send, "ncclSend") && sym(nc, N.Recv, "ncclRecv") &&
       sym(nc, N.GroupStart, "ncclGroupStart") && sym(nc, N.GroupEnd, "ncclGroupEnd") &&
       sym(nc, N.AllReduce, "ncclAllReduce") && sym(nc, N.CommGetAsyncError, "ncclCommGetAsyncError") &&
       sym(nc, N.CommDestroy, "ncclCommDestroy") && sym(nc, N.counter, "fake_nccl_counter");
  return ok;
}

// The bytes of message `k` from rank `from` to rank `to` in step `step`.
uint8_t byte_of(int step, int from, int to, int k, size_t i) {
  return static_cast<uint8_t>(step * 131 + from * 31 + to * 17 + k * 7 + i);
}

// A device buffer holding message (step, from, to, k) of `bytes`.
void* message(int step, int to, int k, size_t bytes) {
  auto* p = static_cast<uint8_t*>(C.malloc(bytes));
  for (size_t i = 0; i < bytes; ++i) p[i] = byte_of(step, g_rank, to, k, i);
  return p;
}

bool holds(const void* buf, int step, int from, int k, size_t bytes) {
  const auto* p = static_cast<const uint8_t*>(buf);
  for (size_t i = 0; i < bytes; ++i)
    if (p[i] != byte_of(step, from, g_rank, k, i)) return false;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  int ok = argc > 1 && g_size >= 3 && load(argv[1]) ? 1 : 0, all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all) {
    if (g_rank == 0) std::fprintf(stderr, "nccl_p2p: usage: nccl_p2p <fake libnccl> (3+ ranks)\n");
    MPI_Finalize();
    return 1;
  }
  C.runtime_init();
  cudaStream_t s = reinterpret_cast<cudaStream_t>(C.stream_create(1));
  ncclUniqueId id;
  if (g_rank == 0) N.GetUniqueId(&id);
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm = nullptr;
  check(N.CommInitRank(&comm, g_size, id, g_rank) == ncclSuccess, "ncclCommInitRank");
  const int me = g_rank, next = (me + 1) % g_size, prev = (me + g_size - 1) % g_size;
  std::vector<void*> bufs;
  auto keep = [&](void* p) {
    bufs.push_back(p);
    return p;
  };
  auto sync = [&](const char* what) { check(C.stream_sync(reinterpret_cast<CUstream_st*>(s)) == 0, what); };

  // 1. Unaligned groups.
  if (me == 0) {
    N.GroupStart();
    for (int k = 0; k < 3; ++k) N.Send(keep(message(1, 1, k, 100 + k)), 100 + k, ncclUint8, 1, comm, s);
    check(N.GroupEnd() == ncclSuccess, "1: a group of 3 sends");
  } else if (me == 1) {
    void* r[3];
    for (int k = 0; k < 3; ++k)
      check(N.Recv(r[k] = keep(C.malloc(100 + k)), 100 + k, ncclUint8, 0, comm, s) == ncclSuccess,
            "1: a lone receive");
    sync("1: sync");
    for (int k = 0; k < 3; ++k) check(holds(r[k], 1, 0, k, 100 + k), "1: message " + std::to_string(k));
  }
  sync("1: sync");

  // 2. Rank 2 sits a round out; then a ring.
  if (me < 2) {
    const int peer = 1 - me;
    void* r = keep(C.malloc(64));
    N.GroupStart();
    N.Send(keep(message(2, peer, 0, 64)), 64, ncclUint8, peer, comm, s);
    N.Recv(r, 64, ncclUint8, peer, comm, s);
    check(N.GroupEnd() == ncclSuccess, "2: exchange");
    sync("2: sync");
    check(holds(r, 2, peer, 0, 64), "2: the exchange's message");
  }
  {
    void* r = keep(C.malloc(4096));
    N.GroupStart();
    N.Recv(r, 4096, ncclUint8, prev, comm, s);
    N.Send(keep(message(2, next, 1, 4096)), 4096, ncclUint8, next, comm, s);
    check(N.GroupEnd() == ncclSuccess, "2: ring");
    sync("2: ring sync");
    check(holds(r, 2, prev, 1, 4096), "2: the ring's message");
  }

  // 3. More messages than the ring holds.
  constexpr int kMany = 40;
  if (me == 0) {
    N.GroupStart();
    for (int k = 0; k < kMany; ++k) N.Send(keep(message(3, 1, k, 8 + k)), 8 + k, ncclUint8, 1, comm, s);
    check(N.GroupEnd() == ncclSuccess, "3: 40 sends in one group");
  } else if (me == 1) {
    std::vector<void*> r(kMany);
    for (int half = 0; half < 2; ++half) {
      N.GroupStart();
      for (int k = half * kMany / 2; k < (half + 1) * kMany / 2; ++k)
        N.Recv(r[k] = keep(C.malloc(8 + k)), 8 + k, ncclUint8, 0, comm, s);
      check(N.GroupEnd() == ncclSuccess, "3: 20 receives in one group");
    }
    sync("3: sync");
    bool right = true;
    for (int k = 0; k < kMany; ++k) right = right && holds(r[k], 3, 0, k, 8 + k);
    check(right, "3: 40 messages in order");
  }
  sync("3: sync");

  // 4. Receives from several peers.
  if (me == 0) {
    void* a = keep(C.malloc(32));
    void* b = keep(C.malloc(48));
    N.GroupStart();
    N.Recv(a, 32, ncclUint8, 2, comm, s);
    N.Recv(b, 48, ncclUint8, 1, comm, s);
    check(N.GroupEnd() == ncclSuccess, "4: receives from 2 then 1");
    sync("4: sync");
    check(holds(a, 4, 2, 0, 32) && holds(b, 4, 1, 0, 48), "4: both messages");
  } else if (me == 1) {
    void* r = keep(C.malloc(16));
    N.Send(keep(message(4, 0, 0, 48)), 48, ncclUint8, 0, comm, s);
    N.Recv(r, 16, ncclUint8, 2, comm, s);
    sync("4: sync");
    check(holds(r, 4, 2, 1, 16), "4: rank 1's message from 2");
  } else if (me == 2) {
    N.Send(keep(message(4, 1, 1, 16)), 16, ncclUint8, 1, comm, s);
    N.Send(keep(message(4, 0, 0, 32)), 32, ncclUint8, 0, comm, s);
  }
  sync("4: sync");

  // 5. A collective after different numbers of groups per rank.
  {
    auto* in = static_cast<int64_t*>(keep(C.malloc(8 * 100)));
    auto* out = static_cast<int64_t*>(keep(C.malloc(8 * 100)));
    for (int i = 0; i < 100; ++i) in[i] = (me + 1) * 1000 + i;
    check(N.AllReduce(in, out, 100, ncclInt64, ncclSum, comm, s) == ncclSuccess, "5: allreduce");
    sync("5: sync");
    const int64_t ranks = g_size, tri = ranks * (ranks + 1) / 2;
    bool right = true;
    for (int i = 0; i < 100; ++i) right = right && out[i] == tri * 1000 + ranks * i;
    check(right, "5: allreduce result");
    check(N.counter("mismatches") == 0, "5: no mismatch reported");
    ncclResult_t e = ncclInternalError;
    check(N.CommGetAsyncError(comm, &e) == ncclSuccess && e == ncclSuccess, "5: no asynchronous error");
  }

  // 6. A receive larger than the send.
  if (me == 0) {
    N.Send(keep(message(6, 1, 0, 8)), 8, ncclUint8, 1, comm, s);
  } else if (me == 1) {
    N.Recv(keep(C.malloc(16)), 16, ncclUint8, 0, comm, s);
  }
  sync("6: sync");
  if (me == 1) {
    ncclResult_t e = ncclSuccess;
    check(N.CommGetAsyncError(comm, &e) == ncclSuccess && e == ncclInvalidUsage,
          "6: a larger receive is reported (ncclInvalidUsage)");
    check(N.counter("mismatches") == 1, "6: one mismatch counted");
  }

  N.CommDestroy(comm);
  for (void* p : bufs) C.free(p);
  C.stream_destroy(reinterpret_cast<CUstream_st*>(s));
  C.runtime_fini();
  int counts[2] = {g_pass, g_fail}, total[2] = {0, 0};
  MPI_Reduce(counts, total, 2, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
  if (g_rank == 0) std::printf("nccl_p2p (%d ranks): %d passed, %d failed\n", g_size, total[0], total[1]);
  MPI_Finalize();
  return total[1] == 0 && g_fail == 0 ? 0 : 1;
}
