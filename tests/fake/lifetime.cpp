// NCCL communicators over a program's lifetime, under streamcoll with the fake CUDA driver
// and the fake NCCL.
//
//   lifetime MODE
//   many   40 times MPI_Comm_dup, an allreduce on device memory, MPI_Comm_free: one NCCL
//          communicator serves them all (ncclCommInitRank once); then 40 duplicates
//          alive at once: at most 32 NCCL communicators exist, the other duplicates' calls
//          go to the MPI; a split communicator gets its own; every result right
//   gated  a stream-ordered allreduce on a stream the program holds (a host wait), then
//          MPI_Comm_free while it is still held: returns at once (freeing never waits for
//          the application's streams); the program lets the stream go: the result is
//          right; the same with the communicator's last reference dropped by MPI_Wait of a
//          request (STREAMCOLL_NCCL_NONBLOCKING=1) after MPI_Comm_free
//   reset  NCCL and ht calls and a burst of stream-ordered fused calls, then
//          cudaDeviceReset (fake_cuda_device_reset): the communicators are freed
//          (MPI_Comm_free, MPI_Finalize) without a crash or a hang; calls on new
//          communicators after the reset are right: route nccl, route ht (blocking and
//          MPI_Iallreduce) and stream-ordered fused calls, whose events, side streams,
//          pinned buffers and flags (route ht's pools) must be made anew
//   churn  100 times: MPI_Comm_split (or MPI_Comm_dup), a blocking allreduce on device
//          memory, an MPI_Iallreduce or MPI_Ibcast (ranks some tenths of a millisecond
//          apart) and its MPI_Wait, MPI_Comm_free at once; every value right. For
//          STREAMCOLL_CHECK=1, whose check of a non-blocking call must not be left pending on
//          the freed communicator: with LIFETIME_PENDING_TOOL=1 and
//          tests/tools/pending_at_free.c preloaded, nothing may be pending there
// A watchdog fails the run if anything blocks. Prints "N passed, N failed" on rank 0.
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

namespace {

fake_cuda_device_reset_fn g_reset = nullptr;

// One blocking allreduce of n ints on fake device memory; true if right.
bool allreduce_right(MPI_Comm comm, size_t n, unsigned salt) {
  void* a = api.malloc(n * sizeof(int));
  void* b = api.malloc(n * sizeof(int));
  auto in = inputs<int>(comm_rank(comm), n, Op::sum, salt);
  std::memcpy(a, in.data(), n * sizeof(int));
  const int rc = MPI_Allreduce(a, b, static_cast<int>(n), MPI_INT, MPI_SUM, comm);
  std::vector<int> got(n);
  std::memcpy(got.data(), b, n * sizeof(int));
  api.free(a);
  api.free(b);
  return rc == MPI_SUCCESS && got == reduced<int>(comm_size(comm), n, Op::sum, salt);
}

void many() {
  const unsigned long long inits0 = nc("ncclCommInitRank");
  for (int i = 0; i < 40; ++i) {
    MPI_Comm c;
    MPI_Comm_dup(MPI_COMM_WORLD, &c);
    check(allreduce_right(c, 100, 1 + i), "dup " + std::to_string(i) + ": right");
    MPI_Comm_free(&c);
  }
  check(nc("ncclCommInitRank") - inits0 == 1,
        "40 duplicates one after the other: one NCCL communicator (" +
            std::to_string(nc("ncclCommInitRank") - inits0) + " made)");
  check(stat_calls("allreduce", "nccl", "device") >= 40, "they took route nccl");

  const unsigned long long inits1 = nc("ncclCommInitRank");
  const unsigned long long pmpi0 = stat_calls("allreduce", "pmpi", "device");
  std::vector<MPI_Comm> live(40);
  for (size_t i = 0; i < live.size(); ++i) {
    MPI_Comm_dup(MPI_COMM_WORLD, &live[i]);
    check(allreduce_right(live[i], 64, 100 + i), "live dup " + std::to_string(i) + ": right");
  }
  const unsigned long long made = nc("ncclCommInitRank") - inits1;
  // One idle communicator from above serves the first; 31 more are made; 8 go to the MPI.
  check(made == 31, "40 live duplicates: 32 NCCL communicators at most (" + std::to_string(made) +
                        " made besides the reused one)");
  check(stat_calls("allreduce", "pmpi", "device") - pmpi0 == 8,
        "the duplicates beyond them went to the MPI (" +
            std::to_string(stat_calls("allreduce", "pmpi", "device") - pmpi0) + ")");
  for (MPI_Comm& c : live) MPI_Comm_free(&c);
  // A split communicator is another group: its own NCCL communicator (with 2+ ranks).
  if (g_size >= 2) {
    MPI_Comm half;
    MPI_Comm_split(MPI_COMM_WORLD, g_rank % 2, g_rank, &half);
    check(allreduce_right(half, 32, 500), "split: right");
    MPI_Comm_free(&half);
  }
}

// A stream-ordered allreduce on `stream` behind a closed gate; returns the gate.
struct Gated {
  void* flag = nullptr;
  void* a = nullptr;
  void* b = nullptr;
  size_t n = 256;
  unsigned salt = 0;
};

Gated start_gated(MPI_Comm comm, CUstream_st* stream, unsigned salt, bool nonblocking,
                  MPI_Request* req) {
  Gated g;
  g.salt = salt;
  g.flag = api.malloc(sizeof(unsigned));
  std::memset(g.flag, 0, sizeof(unsigned));
  g.a = api.malloc(g.n * sizeof(int));
  g.b = api.malloc(g.n * sizeof(int));
  auto in = inputs<int>(g_rank, g.n, Op::sum, salt);
  std::memcpy(g.a, in.data(), g.n * sizeof(int));
  check(api.enqueue_wait(stream, g.flag, 1) == 0, "gate");
  check(streamcoll_comm_attach_stream(comm, stream) == MPI_SUCCESS, "attach");
  const int rc = nonblocking
                     ? MPI_Iallreduce(g.a, g.b, static_cast<int>(g.n), MPI_INT, MPI_SUM, comm, req)
                     : MPI_Allreduce(g.a, g.b, static_cast<int>(g.n), MPI_INT, MPI_SUM, comm);
  check(rc == MPI_SUCCESS, "stream-ordered call on a held stream returns");
  return g;
}

void finish_gated(Gated& g, CUstream_st* stream, const std::string& what) {
  __atomic_store_n(static_cast<unsigned*>(g.flag), 1u, __ATOMIC_RELEASE);
  api.stream_sync(stream);
  std::vector<int> got(g.n);
  std::memcpy(got.data(), g.b, g.n * sizeof(int));
  check(got == reduced<int>(g_size, g.n, Op::sum, g.salt), what + ": right once the stream went on");
  api.free(g.flag);
  api.free(g.a);
  api.free(g.b);
}

void gated() {
  CUstream_st* s = api.stream_create(0);
  {
    MPI_Comm c;
    MPI_Comm_dup(MPI_COMM_WORLD, &c);
    check(allreduce_right(c, 16, 1), "set-up call");
    Gated g = start_gated(c, s, 2, false, nullptr);
    alarm(20);
    MPI_Comm_free(&c);  // must not wait for the held stream
    alarm(0);
    check(true, "MPI_Comm_free returned while the operation waits behind the held stream");
    finish_gated(g, s, "blocking, then MPI_Comm_free");
  }
  const char* nb = std::getenv("STREAMCOLL_NCCL_NONBLOCKING");
  if (nb && std::strcmp(nb, "1") == 0) {
    MPI_Comm c;
    MPI_Comm_dup(MPI_COMM_WORLD, &c);
    check(allreduce_right(c, 16, 3), "set-up call");
    MPI_Request r = MPI_REQUEST_NULL;
    Gated g = start_gated(c, s, 4, true, &r);
    alarm(20);
    MPI_Comm_free(&c);
    alarm(0);
    check(MPI_Wait(&r, MPI_STATUS_IGNORE) == MPI_SUCCESS, "MPI_Wait after MPI_Comm_free");
    finish_gated(g, s, "MPI_Iallreduce, MPI_Comm_free, then MPI_Wait");
  }
  api.stream_destroy(s);
}

// A burst of 8 stream-ordered MPI_Iallreduce calls fused on route ht (16 ints each, on
// fake device memory, the stream `s` attached to a new duplicate), completed with
// MPI_Waitall and read once the stream is through; true if every result is right. Uses
// route ht's pooled events and side streams (algorithms/ht_device.hpp, DeviceSide).
bool fused_burst_right(CUstream_st* s, unsigned salt) {
  MPI_Comm c;
  MPI_Comm_dup(MPI_COMM_WORLD, &c);
  bool ok = api.set_route(c, "allreduce:ht:fuse=2K") == MPI_SUCCESS &&
            streamcoll_comm_attach_stream(c, s) == MPI_SUCCESS;
  {  // a blocking call after the attachment (stream-ordered): the facts the fused calls use
    void* w = api.malloc(sizeof(int));
    std::memset(w, 0, sizeof(int));
    ok = MPI_Allreduce(MPI_IN_PLACE, w, 1, MPI_INT, MPI_SUM, c) == MPI_SUCCESS && ok;
    ok = api.stream_sync(s) == 0 && ok;
    api.free(w);
  }
  constexpr int kCalls = 8, kN = 16;
  std::vector<void*> bufs;
  std::vector<MPI_Request> reqs(kCalls, MPI_REQUEST_NULL);
  for (int i = 0; i < kCalls && ok; ++i) {
    bufs.push_back(api.malloc(kN * sizeof(int)));
    auto in = inputs<int>(comm_rank(c), kN, Op::sum, salt + 1 + i);
    std::memcpy(bufs.back(), in.data(), kN * sizeof(int));
    ok = MPI_Iallreduce(MPI_IN_PLACE, bufs.back(), kN, MPI_INT, MPI_SUM, c, &reqs[i]) == MPI_SUCCESS;
  }
  ok = MPI_Waitall(kCalls, reqs.data(), MPI_STATUSES_IGNORE) == MPI_SUCCESS && ok;
  ok = api.stream_sync(s) == 0 && ok;
  for (size_t i = 0; i < bufs.size(); ++i) {
    std::vector<int> got(kN);
    std::memcpy(got.data(), bufs[i], kN * sizeof(int));
    ok = ok && got == reduced<int>(comm_size(c), kN, Op::sum, salt + 1 + static_cast<unsigned>(i));
    api.free(bufs[i]);
  }
  MPI_Comm_free(&c);
  return ok;
}

void reset() {
  MPI_Comm nccl, ht;
  MPI_Comm_dup(MPI_COMM_WORLD, &nccl);
  MPI_Comm_dup(MPI_COMM_WORLD, &ht);
  check(api.set_route(ht, "allreduce:ht:algo=rd") == MPI_SUCCESS, "set_route ht");
  check(allreduce_right(nccl, 128, 1), "route nccl before the reset");
  check(allreduce_right(ht, 128, 2), "route ht before the reset");
  // Stream-ordered ht calls leave side streams and pinned buffers behind too.
  {
    CUstream_st* s = api.stream_create(0);
    MPI_Request r = MPI_REQUEST_NULL;
    void* a = api.malloc(64 * sizeof(int));
    std::memset(a, 0, 64 * sizeof(int));
    check(MPI_Iallreduce(MPI_IN_PLACE, a, 64, MPI_INT, MPI_SUM, ht, &r) == MPI_SUCCESS, "ht MPI_I*");
    check(MPI_Wait(&r, MPI_STATUS_IGNORE) == MPI_SUCCESS, "ht MPI_Wait");
    api.stream_sync(s);
    api.free(a);
    api.stream_destroy(s);
  }
  {
    CUstream_st* s = api.stream_create(0);
    check(fused_burst_right(s, 20), "stream-ordered fused calls before the reset: right");
    api.stream_destroy(s);
  }
  const unsigned long long events0 = cu("cuEventCreate");
  check(g_reset(0) == 0, "cudaDeviceReset");
  alarm(30);
  MPI_Comm_free(&nccl);
  MPI_Comm_free(&ht);
  alarm(0);
  check(true, "MPI_Comm_free after the reset returned");
  // New communicators after the reset.
  MPI_Comm c1, c2;
  MPI_Comm_dup(MPI_COMM_WORLD, &c1);
  MPI_Comm_dup(MPI_COMM_WORLD, &c2);
  check(api.set_route(c2, "allreduce:ht:algo=rd") == MPI_SUCCESS, "set_route ht");
  check(allreduce_right(c1, 128, 3), "a new communicator after the reset: right");
  check(allreduce_right(c2, 128, 4), "route ht after the reset: right");
  // The events and side streams pooled before the reset are gone with it: the calls
  // below take new ones (made after the reset), and are right.
  {
    CUstream_st* s = api.stream_create(0);
    check(fused_burst_right(s, 40), "stream-ordered fused calls after the reset: right");
    api.stream_destroy(s);
    void* a = api.malloc(64 * sizeof(int));
    auto in = inputs<int>(g_rank, 64, Op::sum, 60);
    std::memcpy(a, in.data(), 64 * sizeof(int));
    MPI_Request r = MPI_REQUEST_NULL;
    const bool started = MPI_Iallreduce(MPI_IN_PLACE, a, 64, MPI_INT, MPI_SUM, c2, &r) == MPI_SUCCESS;
    const bool waited = MPI_Wait(&r, MPI_STATUS_IGNORE) == MPI_SUCCESS;
    std::vector<int> got(64);
    std::memcpy(got.data(), a, 64 * sizeof(int));
    check(started && waited && got == reduced<int>(g_size, 64, Op::sum, 60),
          "route ht's MPI_Iallreduce after the reset: right");
    api.free(a);
  }
  check(cu("cuEventCreate") > events0, "events made anew after the reset");
  MPI_Comm_free(&c1);
  MPI_Comm_free(&c2);
}

// With tests/tools/pending_at_free.c preloaded after streamcoll (LIFETIME_PENDING_TOOL=1):
// the non-blocking collectives pending on a communicator when the program freed it
// (pending_at_free_count); -2 without the tool.
long pending_at_free() {
  auto count = reinterpret_cast<long (*)()>(dlsym(RTLD_DEFAULT, "pending_at_free_count"));
  return count ? count() : -2;
}

void churn() {
  constexpr size_t kN = 64;
  constexpr int kRounds = 100;
  const bool tool = std::getenv("LIFETIME_PENDING_TOOL") != nullptr;
  if (tool) {  // the tool's own check: a request left on a freed communicator is counted
    auto selftest = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "pending_at_free_selftest"));
    check(selftest && selftest() == 1, "pending_at_free counts a request left at MPI_Comm_free");
  }
  const long pending0 = pending_at_free();
  void* a = api.malloc(kN * sizeof(int));
  void* b = api.malloc(kN * sizeof(int));
  int bad = 0;
  for (int i = 0; i < kRounds; ++i) {
    MPI_Comm c;
    if (i % 2) MPI_Comm_dup(MPI_COMM_WORLD, &c);
    else MPI_Comm_split(MPI_COMM_WORLD, 0, g_rank, &c);
    if (!allreduce_right(c, kN, 1 + i)) ++bad;
    auto in = inputs<int>(g_rank, kN, Op::sum, 1000 + i);
    std::memcpy(a, in.data(), kN * sizeof(int));
    MPI_Request r = MPI_REQUEST_NULL;
    int rc;
    std::vector<int> want;
    if (i % 3 == 0) usleep(static_cast<useconds_t>(200 * ((g_rank + i) % g_size)));  // ranks apart
    if (i % 4 < 2) {
      rc = MPI_Iallreduce(a, b, kN, MPI_INT, MPI_SUM, c, &r);
      want = reduced<int>(g_size, kN, Op::sum, 1000 + i);
    } else {
      const int root = i % g_size;
      rc = MPI_Ibcast(a, kN, MPI_INT, root, c, &r);
      want = inputs<int>(root, kN, Op::sum, 1000 + i);
    }
    if (rc == MPI_SUCCESS) rc = MPI_Wait(&r, MPI_STATUS_IGNORE);
    MPI_Comm_free(&c);
    std::vector<int> got(kN);
    std::memcpy(got.data(), i % 4 < 2 ? b : a, kN * sizeof(int));
    if (rc != MPI_SUCCESS || got != want) ++bad;
  }
  check(bad == 0, std::to_string(kRounds) + " communicators made, used (blocking and " +
                      "non-blocking) and freed at once: " + std::to_string(bad) + " wrong");
  if (tool)
    check(pending_at_free() == pending0,
          "nothing of streamcoll's pending on a communicator the program freed (" +
              std::to_string(pending_at_free() - pending0) + " operations)");
  api.free(a);
  api.free(b);
}

void on_alarm(int) {
  static const char msg[] = "lifetime: watchdog expired: a call blocked\n";
  (void)!write(2, msg, sizeof msg - 1);
  _exit(3);
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  const std::string mode = argc > 1 ? argv[1] : "";
  int ok = (mode == "many" || mode == "gated" || mode == "reset" || mode == "churn") && load_api(true) ? 1 : 0;
  if (ok) {
    void* cu_lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    g_reset = reinterpret_cast<fake_cuda_device_reset_fn>(dlsym(cu_lib, "fake_cuda_device_reset"));
    ok = g_reset != nullptr;
  }
  int all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all_ok) {
    if (g_rank == 0) std::fprintf(stderr, "lifetime: unknown mode, or the fakes not loaded\n");
    MPI_Finalize();
    return 1;
  }
  signal(SIGALRM, on_alarm);
  check(api.runtime_init() == 0, "runtime init");
  alarm(240);
  if (mode == "many") many();
  else if (mode == "gated") gated();
  else if (mode == "churn") churn();
  else reset();
  alarm(0);
  check(nc("mismatches") == 0, "every rank ran the same NCCL operations");
  if (mode != "reset") check(cu("errors") == 0, "the fake driver returned no error");
  api.runtime_fini();
  int counts[2] = {g_pass, g_fail}, total[2] = {0, 0};
  MPI_Reduce(counts, total, 2, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
  alarm(60);  // MPI_Finalize frees what is left, after the reset too
  MPI_Finalize();
  alarm(0);
  if (g_rank == 0) std::printf("lifetime (%s, %d ranks): %d passed, %d failed\n", mode.c_str(), g_size, total[0], total[1]);
  return total[1] == 0 && g_fail == 0 ? 0 : 1;
}
