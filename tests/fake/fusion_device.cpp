// MPI_Iallreduce fusion (algorithms/fusion.hpp) on GPU buffers, without a GPU: the fake CUDA
// driver (fake_cuda.cpp: fake device memory is host memory that the driver reports as
// device memory, and a race detector checks every host access against stream work).
//
//   fusion_device        (run under tests/mpi/run.sh preload; tests/fake/meson.build)
// On a communicator with "allreduce:pmpi:fuse=2K" forced ("allreduce:ht:fuse=2K" with
// --route=ht: the fused messages then run on route ht, which must count them;
// "allreduce:nccl:fuse=2K" with --route=nccl and STREAMCOLL_FUSION_NCCL=1: those on agreed
// GPU memory run on route nccl, the others on pmpi; after route nccl's staging fails on
// one rank, the group fails everywhere and the next one runs on the host):
//   - agreed host memory (the blocking call before was on host buffers), while each rank
//     passes its own kind per call: device, managed, pinned or host, differing between
//     ranks and calls, in place or not: every rank must still fuse the call (the others
//     do), its GPU buffers copied to and from the fused buffer;
//   - agreed device memory (the blocking call on device buffers on every rank), a
//     group's copies to and from the fused buffer synchronised once each way; and again
//     with each rank's own kind per call, as above;
//   - a stream attached on odd ranks only (the agreed facts have none: calls are fused,
//     not stream-ordered): those ranks write their input on the stream without waiting,
//     so the call must synchronise the stream before the input is read;
//   - that synchronisation failing on rank 1 (fake_cuda_fail_after): the call still takes
//     its part, fails there with the CUDA failure and on every other rank too (its group
//     fails everywhere: the agreement's ok flag), nothing hangs, and the next calls are
//     exact;
//   - a copy between a GPU buffer and the fused buffer failing on rank 1: packing fails
//     the group on every rank, unpacking the call on rank 1 alone;
//   - stream-ordered calls (a stream attached on every rank; device and managed buffers;
//     the last rank passes host buffers, which keep plain semantics): the input written
//     on the stream, every other round behind a gate the test holds closed (its own host
//     wait), the calls started and completed (MPI_Waitall, MPI_Wait in reverse,
//     MPI_Testall, differing between ranks) while the gate is closed, so the host cannot
//     have waited for the stream (a watchdog opens it after 20 s, and then the test fails
//     instead of hanging); in the rounds between, calls on GPU and host buffers mixed on
//     one rank (the host-buffer calls keep plain semantics; their completion follows the
//     earlier stream-ordered calls', as on an NCCL communicator); then the stream is
//     synchronised and every result read. They must be fused (fewer messages than calls)
//     and streamcoll must not have synchronised a stream; the holds are
//     cuStreamWaitValue32's, or the spin kernel's (FAKE_CUDA_NO_STREAM_MEMOPS=1,
//     -no-memops-). Staging failing on rank 0 at
//     its D2H copy or its H2D copy (nothing written yet: the stream is synchronised and
//     the call goes on, exact everywhere), and at the event after the H2D copy (the call
//     fails on rank 0, its group on every rank: the classic rank's wait reports it, the
//     stream-ordered ranks' next call on the communicator does), then the next round
//     exact;
//   - with --kernels (a build with the kernels, STREAMCOLL_STAGING_KERNEL not 0): a
//     group's four or more GPU copies go as one batched-copy kernel launch (the fake
//     driver runs it as host code, its reads and writes checked by the race detector),
//     and that launch failing on rank 1 makes some calls fail and none wrong, the next
//     round exact; with --no-kernels (STREAMCOLL_STAGING_KERNEL=0): no launch at all;
// every call completed by a completion call that differs between ranks, its result read
// by the host with the race detector's blessing, and checked against values computed here.
// Fusion must have happened (streamcoll_fusion_counts: fewer messages than calls).
// Prints "N passed, N failed" on rank 0; exits nonzero on failure.
#include <dlfcn.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <memory>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "../mpi/complete_differently.hpp"
#include "harness.hpp"
#include "streamcoll/streamext.h"

namespace {

enum class Kind { host, pinned, device, managed };
const char* kind_name(Kind k) {
  static const char* n[] = {"host", "pinned", "device", "managed"};
  return n[static_cast<int>(k)];
}

struct Buf {
  Kind kind = Kind::host;
  double* p = nullptr;
  size_t n = 0;
  Buf(Kind k, size_t count) : kind(k), n(count) {
    const size_t bytes = std::max<size_t>(count, 1) * sizeof(double);
    switch (k) {
      case Kind::host: p = static_cast<double*>(std::calloc(1, bytes)); break;
      case Kind::pinned: p = static_cast<double*>(api.malloc_pinned(bytes)); break;
      case Kind::device: p = static_cast<double*>(api.malloc_device(0, bytes)); break;
      case Kind::managed: p = static_cast<double*>(api.malloc_managed(bytes)); break;
    }
  }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  ~Buf() {
    if (kind == Kind::host) std::free(p);
    else api.free(p);
  }
};

double input(int rank, size_t i, int call) { return rank * 1000.0 + static_cast<double>(i) + call * 7.0; }
double expected(size_t i, int call) {
  double s = 0;
  for (int r = 0; r < g_size; ++r) s += input(r, i, call);
  return s;
}

struct Call {
  std::unique_ptr<Buf> send, recv;
  bool in_place = false;
  int id = 0;
  MPI_Request req = MPI_REQUEST_NULL;
};

CUstream_st* g_stream = nullptr;
const char* g_route = "pmpi";  // --route=ht|nccl: the forced route that fuses
bool nccl_route() { return std::strcmp(g_route, "nccl") == 0; }
using MessagesOn = unsigned long long (*)(const char*);
MessagesOn g_messages_on = nullptr;  // streamcoll_fusion_messages_on
using PackedOnGpu = unsigned long long (*)();
PackedOnGpu g_packed_on_gpu = nullptr;  // streamcoll_fusion_messages_packed_on_gpu
unsigned long long packed_on_gpu() { return g_packed_on_gpu ? g_packed_on_gpu() : 0; }
int g_kernels = -1;            // --kernels: 1, --no-kernels: 0, else -1 (not checked)

// Starts call `id` with this rank's memory kind `k`; on_stream: the input is written on
// g_stream (attached to comm) and not waited for.
void start(Call& c, MPI_Comm comm, Kind k, size_t n, bool in_place, int id, bool on_stream) {
  c.id = id;
  c.in_place = in_place;
  c.recv = std::make_unique<Buf>(k, n);
  if (!in_place) c.send = std::make_unique<Buf>(k, n);
  Buf& in = in_place ? *c.recv : *c.send;
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = input(g_rank, i, id);
  if (on_stream && (k == Kind::device || k == Kind::managed)) {
    check(api.enqueue_copy(g_stream, in.p, v.data(), n * sizeof(double)) == 0, "enqueue input");
  } else {
    check(api.host_access(in.p, n * sizeof(double), 1) == 0, "host writes the input without a race");
    std::memcpy(in.p, v.data(), n * sizeof(double));
  }
  const int rc = MPI_Iallreduce(in_place ? MPI_IN_PLACE : c.send->p, c.recv->p, static_cast<int>(n),
                                MPI_DOUBLE, MPI_SUM, comm, &c.req);
  check(rc == MPI_SUCCESS, "MPI_Iallreduce");
}

void finish(std::vector<Call>& calls, int how, const std::string& label) {
  std::vector<MPI_Request> reqs;
  for (Call& c : calls) reqs.push_back(c.req);
  const int rc = sctest::complete_differently(reqs, how);
  check(rc == MPI_SUCCESS, label + ": completion");
  for (Call& c : calls) {
    const size_t n_el = c.recv->n;
    check(api.host_access(c.recv->p, n_el * sizeof(double), 0) == 0,
          label + ": the host reads a complete result (" + kind_name(c.recv->kind) + ")");
    size_t bad = n_el;
    for (size_t i = 0; i < n_el && bad == n_el; ++i)
      if (c.recv->p[i] != expected(i, c.id)) bad = i;
    check(bad == n_el, label + ": call " + std::to_string(c.id) + " on " + kind_name(c.recv->kind) +
                           (bad == n_el ? std::string()
                                        : ": element " + std::to_string(bad) + " is " +
                                              std::to_string(c.recv->p[bad]) + ", expected " +
                                              std::to_string(expected(bad, c.id))));
  }
}

MPI_Comm fused_comm(Kind warm) {
  MPI_Comm c;
  MPI_Comm_dup(MPI_COMM_WORLD, &c);
  check(api.set_route(c, (std::string("allreduce:") + g_route + ":fuse=2K").c_str()) == MPI_SUCCESS,
        "set_route");
  Buf a(warm, 1), b(warm, 1);
  check(api.host_access(a.p, sizeof(double), 1) == 0, "warm-up input");
  a.p[0] = 1;
  MPI_Allreduce(a.p, b.p, 1, MPI_DOUBLE, MPI_SUM, c);  // the agreement later calls use
  check(b.p[0] == g_size, "warm-up allreduce");
  return c;
}

void rounds(MPI_Comm comm, const std::string& label, bool stream_here, Kind fixed, bool vary) {
  static int id = 0;
  for (int round = 0; round < 12; ++round) {
    std::vector<Call> calls(9);
    for (int i = 0; i < 9; ++i) {
      const Kind k = vary ? static_cast<Kind>((g_rank + i + round) % 4) : fixed;
      start(calls[i], comm, k, 1 + static_cast<size_t>((i * 13 + round) % 40), (i + round) % 3 == 0,
            id++, stream_here);
    }
    finish(calls, g_rank + round, label + " round " + std::to_string(round));
  }
}

// One call of the failure rounds, completed (wrc): it must fail, or else give the exact
// sum of call `id` in `out` (n elements), readable by the host.
void check_outcome(int wrc, bool must_fail, const std::string& fails, const Buf& out, size_t n,
                   int id, const std::string& L) {
  if (must_fail) {
    check(wrc != MPI_SUCCESS, L + ": " + fails);
    return;
  }
  check(wrc == MPI_SUCCESS, L + ": completes");
  check(api.host_access(out.p, n * sizeof(double), 0) == 0, L + ": result readable");
  bool exact = true;
  for (size_t i = 0; i < n; ++i) exact = exact && out.p[i] == expected(i, id);
  check(exact, L + ": exact");
}

fake_cuda_fail_after_fn find_fail_after();

// Errors on `c` return (a failed generalized request raises its error on MPI_COMM_WORLD's
// handler in Open MPI, on MPI_COMM_SELF's in the standard's reading: both return too);
// the fake driver's failure injection.
fake_cuda_fail_after_fn failures_returned(MPI_Comm c) {
  MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
  const auto fail_after = find_fail_after();
  check(fail_after != nullptr, "fake_cuda_fail_after");
  return fail_after;
}

// Stream-ordered calls (see the file's comment); returns the number of calls started.
int stream_ordered_section() {
  MPI_Comm c = fused_comm(Kind::device);
  // Every rank attaches a stream (the agreed facts have one); the last rank's buffers are
  // host memory, so its calls keep plain semantics.
  const bool ordered = g_rank != g_size - 1 || g_size == 1;
  check(streamcoll_comm_attach_stream(c, g_stream) == MPI_SUCCESS, "attach");
  const Kind plain = Kind::host;
  {  // a blocking call after the attachment: the facts later calls use have the stream
    Buf a(Kind::device, 1), b(Kind::device, 1);
    check(api.host_access(a.p, sizeof(double), 1) == 0, "stream-ordered warm-up input");
    a.p[0] = 1;
    MPI_Allreduce(a.p, b.p, 1, MPI_DOUBLE, MPI_SUM, c);
    check(api.stream_sync(g_stream) == 0 && api.host_access(b.p, sizeof(double), 0) == 0 &&
              b.p[0] == g_size,
          "stream-ordered warm-up allreduce");
  }
  using FusionCounts = void (*)(unsigned long long*, unsigned long long*, unsigned long long*);
  auto counts = reinterpret_cast<FusionCounts>(dlsym(RTLD_DEFAULT, "streamcoll_fusion_counts"));
  unsigned long long calls0 = 0, messages0 = 0, agreements0 = 0, calls1 = 0, messages1 = 0;
  if (counts) counts(&calls0, &messages0, &agreements0);
  const unsigned long long syncs0 = cu("cuStreamSynchronize") + cu("cuEventSynchronize");
  const unsigned long long memop0 = cu("memop_waits"), kernel0 = cu("kernel_waits");
  const unsigned long long nccl0 = g_messages_on ? g_messages_on("nccl") : 0;
  const unsigned long long gpu0 = packed_on_gpu();
  int started = 0;
  static int id = 5000;
  StreamGate gate;
  for (int round = 0; round < 12; ++round) {
    const std::string L = "stream-ordered round " + std::to_string(round);
    const bool gated = round % 2 == 0;
    if (ordered && gated) {
      check(gate.close(g_stream), L + ": gate");
      gate.arm(20);
    }
    std::vector<Call> calls(9);
    for (int i = 0; i < 9; ++i) {
      const Kind gpu = (i + round) % 4 == 1 ? Kind::managed : Kind::device;
      const Kind k = !ordered || (!gated && (i + round) % 3 == 0) ? plain : gpu;
      start(calls[i], c, k, 1 + static_cast<size_t>((i * 11 + round) % 40), (i + round) % 3 == 0,
            id++, ordered);
      ++started;
    }
    if (!ordered) {
      finish(calls, g_rank + round, L);
      continue;
    }
    // Completed with the gate closed: only the host-buffer calls wait for the others.
    std::vector<MPI_Request> reqs;
    for (Call& call : calls) reqs.push_back(call.req);
    const int rc = sctest::complete_differently(reqs, g_rank + round);
    check(rc == MPI_SUCCESS, L + ": completion");
    if (gated) {
      check(!gate.disarm(), L + ": completed while the stream was held (the host did not wait)");
      gate.open();
    }
    check(api.stream_sync(g_stream) == 0, L + ": the stream finishes");
    for (Call& call : calls) call.req = MPI_REQUEST_NULL;
    finish(calls, 0, L + " (results)");  // the requests are null now: results only
  }
  if (counts) counts(&calls1, &messages1, &agreements0);
  if (ordered) {
    // On NCCL, by the thread stepping the queue, on streams of streamcoll's own: a fused
    // buffer in host memory is staged by route nccl, whose copy of the result back is
    // waited for on its copy stream (one synchronisation per message); one in GPU memory
    // (a group of classic calls alone) is allocated on that stream (one) and packed and
    // unpacked by host staging's copies, each batch waited for on the thread's stream (two).
    const unsigned long long nccl = g_messages_on ? g_messages_on("nccl") - nccl0 : 0;
    const unsigned long long gpu = packed_on_gpu() - gpu0;
    if (nccl_route()) check(nccl > 0, "stream-ordered: fused messages on route nccl");
    check(cu("cuStreamSynchronize") + cu("cuEventSynchronize") - syncs0 ==
              (nccl_route() ? nccl + 2 * gpu : 0),
          "stream-ordered: streamcoll synchronised no stream of the application's");
    // The holds: cuStreamWaitValue32, or the spin kernel without stream memory operations.
    const bool no_memops = std::getenv("FAKE_CUDA_NO_STREAM_MEMOPS") != nullptr;
    const unsigned long long memops = cu("memop_waits") - memop0, kernels = cu("kernel_waits") - kernel0;
    check(no_memops ? memops == 0 && kernels > 0 : memops > 0 && kernels == 0,
          "stream-ordered: the streams were held by " + std::string(no_memops ? "the spin kernel" : "cuStreamWaitValue32") +
              " (" + std::to_string(memops) + " memop waits, " + std::to_string(kernels) + " kernel waits)");
  }
  check(messages1 - messages0 < calls1 - calls0,
        "stream-ordered: fused (" + std::to_string(calls1 - calls0) + " calls in " +
            std::to_string(messages1 - messages0) + " messages)");

  // Staging failing on rank 0: at the D2H copy (round 1), at the H2D copy (round 2): the
  // stream is synchronised instead, exact everywhere; at the event after the H2D copy
  // (round 3): the call fails on rank 0 and its group everywhere; round 4 exact.
  const auto fail_after = failures_returned(c);
  for (int round = 0; round < 5 && fail_after; ++round) {
    const std::string L = "stream-ordered failure round " + std::to_string(round);
    const bool failing = g_rank == 0 && ordered && round >= 1 && round <= 3;
    const unsigned long long fired0 = cu("injected_failures");
    if (failing && round == 1) fail_after("cuMemcpyAsync", 1);
    if (failing && round == 2) fail_after("cuMemcpyAsync", 2);
    if (failing && round == 3) fail_after("cuEventRecord", 3);
    const Kind k = ordered ? Kind::device : plain;
    Buf in(k, 4);
    // A call that fails after its copy back was enqueued may still have that copy land in
    // its receive buffer (ht_stream::start): the failing rank keeps that buffer.
    auto* out_p = new Buf(k, 4);
    Buf& out = *out_p;
    std::vector<double> v(4);
    for (size_t i = 0; i < 4; ++i) v[i] = input(g_rank, i, 4000 + round);
    if (ordered) check(api.enqueue_copy(g_stream, in.p, v.data(), sizeof(double) * 4) == 0, L + ": input");
    else {
      check(api.host_access(in.p, 4 * sizeof(double), 1) == 0, L + ": input");
      std::memcpy(in.p, v.data(), sizeof(double) * 4);
    }
    MPI_Request req = MPI_REQUEST_NULL;
    const int rc = MPI_Iallreduce(in.p, out.p, 4, MPI_DOUBLE, MPI_SUM, c, &req);
    ++started;
    if (failing) {
      check(cu("injected_failures") > fired0, L + ": the failure was injected");
      fail_after(round == 3 ? "cuEventRecord" : "cuMemcpyAsync", 0);
    }
    const bool group_fails = round == 3;
    check(failing && round == 3 ? rc != MPI_SUCCESS : rc == MPI_SUCCESS, L + ": the call's own return code");
    const int wrc = MPI_Wait(&req, MPI_STATUS_IGNORE);
    // The next call on the communicator: a blocking allreduce on device buffers on every
    // rank (it reports earlier failures, and keeps the facts later calls are routed from).
    auto next_call = [&](const std::string& what) {
      Buf a(Kind::device, 1), b(Kind::device, 1);
      check(api.host_access(a.p, sizeof(double), 1) == 0, L + ": next call's input");
      a.p[0] = 1;
      const int nrc = MPI_Allreduce(a.p, b.p, 1, MPI_DOUBLE, MPI_SUM, c);
      check(api.stream_sync(g_stream) == 0 && api.host_access(b.p, sizeof(double), 0) == 0 &&
                b.p[0] == g_size,
            L + ": " + what + ": the next call's result");
      return nrc;
    };
    if (ordered) {
      check(api.stream_sync(g_stream) == 0, L + ": the stream finishes");
      if (failing && round == 3) {
        check(wrc != MPI_SUCCESS, L + ": the wait reports the call's failure");
        check(next_call("after") == MPI_SUCCESS, L + ": the next call succeeds (the failure was reported)");
      } else {
        check(wrc == MPI_SUCCESS, L + ": the wait joins the stream");
        // The group's failure, found after the call returned: the next call reports it.
        const int brc = next_call("after");
        check(group_fails ? brc != MPI_SUCCESS : brc == MPI_SUCCESS,
              L + (group_fails ? ": the next call reports the group's failure" : ": the next call succeeds"));
        if (!group_fails) check_outcome(MPI_SUCCESS, false, "", out, 4, 4000 + round, L);
      }
    } else {
      check_outcome(wrc, group_fails, "the call fails on every rank", out, 4, 4000 + round, L);
      check(next_call("after") == MPI_SUCCESS, L + ": the next call succeeds");
    }
    if (!(failing && round == 3)) delete out_p;
  }
  MPI_Comm_free(&c);
  return started;
}

fake_cuda_fail_after_fn find_fail_after() {
  return reinterpret_cast<fake_cuda_fail_after_fn>(
      dlsym(dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD), "fake_cuda_fail_after"));
}

void on_alarm(int) {
  const char msg[] = "fusion_device: timed out (a hang)\n";
  if (write(2, msg, sizeof msg - 1) < 0) {}
  _exit(3);
}

}  // namespace

int main(int argc, char** argv) {
  signal(SIGALRM, on_alarm);
  alarm(120);
  MPI_Init(&argc, &argv);
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--route=ht") == 0) g_route = "ht";
    else if (std::strcmp(argv[i], "--route=nccl") == 0) g_route = "nccl";
    else if (std::strcmp(argv[i], "--kernels") == 0) g_kernels = 1;
    else if (std::strcmp(argv[i], "--no-kernels") == 0) g_kernels = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  int ok = load_api(false) ? 1 : 0, all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all_ok) {
    if (g_rank == 0) std::fprintf(stderr, "fusion_device: the fake CUDA driver or streamcoll not loaded\n");
    MPI_Finalize();
    return 1;
  }
  check(api.runtime_init() == 0, "runtime init");
  g_stream = api.stream_create(1 /* CU_STREAM_NON_BLOCKING */);
  const unsigned long long races0 = cu("races");
  using FusionCounts = void (*)(unsigned long long*, unsigned long long*, unsigned long long*);
  auto counts = reinterpret_cast<FusionCounts>(dlsym(RTLD_DEFAULT, "streamcoll_fusion_counts"));
  check(counts != nullptr, "streamcoll_fusion_counts");
  g_messages_on = reinterpret_cast<MessagesOn>(dlsym(RTLD_DEFAULT, "streamcoll_fusion_messages_on"));
  check(g_messages_on != nullptr, "streamcoll_fusion_messages_on");
  g_packed_on_gpu = reinterpret_cast<PackedOnGpu>(dlsym(RTLD_DEFAULT, "streamcoll_fusion_messages_packed_on_gpu"));
  check(g_packed_on_gpu != nullptr, "streamcoll_fusion_messages_packed_on_gpu");
  auto on_nccl = [] { return g_messages_on ? g_messages_on("nccl") : 0ull; };

  {  // agreed host memory, every rank's own kinds
    MPI_Comm c = fused_comm(Kind::host);
    rounds(c, "agreed host, mixed kinds", false, Kind::host, true);
    MPI_Comm_free(&c);
  }
  {  // agreed device memory
    MPI_Comm c = fused_comm(Kind::device);
    unsigned long long calls0 = 0, messages0 = 0, agreements0 = 0, calls1 = 0, messages1 = 0;
    if (counts) counts(&calls0, &messages0, &agreements0);
    const unsigned long long syncs0 = cu("cuStreamSynchronize"), kernels0 = cu("host_kernels");
    const unsigned long long nccl0 = on_nccl(), gpu0 = packed_on_gpu();
    rounds(c, "agreed device", false, Kind::device, false);
    const unsigned long long nccl = on_nccl() - nccl0, gpu = packed_on_gpu() - gpu0;
    const unsigned long long syncs = cu("cuStreamSynchronize") - syncs0;
    const unsigned long long kernels = cu("host_kernels") - kernels0;
    if (g_kernels == 1) check(kernels > 0, "agreed device: batched-copy kernels ran");
    if (g_kernels == 0) check(kernels == 0, "agreed device: no kernel (STREAMCOLL_STAGING_KERNEL=0)");
    if (counts) counts(&calls1, &messages1, &agreements0);
    // A group's copies are issued together: one synchronisation to pack, one to unpack
    // (on NCCL one more: the allocation of the GPU memory it is packed in, or route nccl's
    // copy of the result back to a fused buffer in host memory).
    const unsigned per = nccl_route() ? 3 : 2;
    check(syncs <= per * (messages1 - messages0),
          "agreed device: " + std::to_string(syncs) + " stream synchronisations for " +
              std::to_string(messages1 - messages0) + " fused messages of " +
              std::to_string(calls1 - calls0) + " calls (at most " + std::to_string(per) +
              " per message)");
    // Agreed GPU memory, a rule of route nccl for it: every fused message on NCCL, each
    // packed in GPU memory (classic calls; GPU memory to be had).
    if (nccl_route()) {
      check(nccl == messages1 - messages0 && nccl > 0,
            "agreed device: " + std::to_string(nccl) + " of " +
                std::to_string(messages1 - messages0) + " fused messages on route nccl");
      check(gpu == nccl, "agreed device: " + std::to_string(gpu) + " of " +
                             std::to_string(nccl) + " messages on NCCL packed in GPU memory");
    } else {
      check(gpu == 0, "agreed device: no message packed in GPU memory off route nccl");
    }
    MPI_Comm_free(&c);
  }
  {  // agreed device memory, while each rank passes its own kind per call
    MPI_Comm c = fused_comm(Kind::device);
    const unsigned long long nccl0 = on_nccl();
    unsigned long long calls0 = 0, messages0 = 0, agreements0 = 0, calls1 = 0, messages1 = 0;
    if (counts) counts(&calls0, &messages0, &agreements0);
    rounds(c, "agreed device, mixed kinds", false, Kind::device, true);
    if (counts) counts(&calls1, &messages1, &agreements0);
    // On NCCL too: a rank's calls on host, pinned or managed memory take part through the
    // fused buffer like the others.
    if (nccl_route())
      check(on_nccl() - nccl0 == messages1 - messages0 && messages1 > messages0,
            "agreed device, mixed kinds: " + std::to_string(on_nccl() - nccl0) + " of " +
                std::to_string(messages1 - messages0) + " fused messages on route nccl");
    MPI_Comm_free(&c);
  }
  {  // a stream on odd ranks only: input written on it, not waited for
    MPI_Comm c = fused_comm(Kind::device);
    if (g_rank % 2) check(streamcoll_comm_attach_stream(c, g_stream) == MPI_SUCCESS, "attach");
    rounds(c, "stream on odd ranks", g_rank % 2 == 1, Kind::device, false);
    // The stream synchronisation fails on rank 1, for one call.
    const auto fail_after = failures_returned(c);
    for (int round = 0; round < 3 && fail_after; ++round) {
      const bool failing = round == 1 && g_rank == 1;
      if (failing) fail_after("cuStreamSynchronize", 1);
      Buf in(Kind::device, 5), out(Kind::device, 5);
      check(api.host_access(in.p, 5 * sizeof(double), 1) == 0, "input");
      for (size_t i = 0; i < 5; ++i) in.p[i] = input(g_rank, i, 1000 + round);
      MPI_Request req = MPI_REQUEST_NULL;
      const int rc = MPI_Iallreduce(in.p, out.p, 5, MPI_DOUBLE, MPI_SUM, c, &req);
      check(failing ? rc != MPI_SUCCESS : rc == MPI_SUCCESS,
            "sync failure round " + std::to_string(round) + ": the call's own return code");
      const int wrc = MPI_Wait(&req, MPI_STATUS_IGNORE);
      check_outcome(wrc, round == 1, "the call fails on every rank", out, 5, 1000 + round,
                    "sync failure round " + std::to_string(round));
    }
    MPI_Comm_free(&c);
  }
  int copy_calls = 0;
  {  // a copy between a GPU buffer and the fused buffer fails on rank 1
    MPI_Comm c = fused_comm(Kind::device);
    MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
    const auto fail_after = find_fail_after();
    // Round 1: packing (rank 1's input is on the GPU): the group fails on every rank.
    // Round 2: unpacking (rank 1's input on the host, its result on the GPU): the call
    // fails on rank 1 alone; the others have the exact result. On NCCL, rank 1's first
    // copy is its packing of the host input into GPU memory (or, where the group is packed
    // in host memory, route nccl's staging of it to the GPU, after which rank 1 tells its
    // peers): the group fails on every rank.
    // NCCL only: round 3: rank 1 cannot start its part of the fused message (route nccl's
    // event on the legacy stream fails): it aborts the duplicate's NCCL communicator, tells
    // its peers, and the group fails on every rank. Round 4: the group was packed for
    // NCCL (every rank could use it at round 3's agreement), but rank 1's is aborted now:
    // the ranks agree on that, copy it to host memory and agree a second time: exact
    // everywhere, on the host. Round 5: packed in host memory from the start (one
    // agreement), exact, on the host.
    const int copy_rounds = nccl_route() ? 6 : 3;
    for (int round = 0; round < copy_rounds && fail_after; ++round) {
      const bool failing = (round == 1 || round == 2 || (round == 3 && nccl_route())) && g_rank == 1;
      const unsigned long long nccl0 = g_messages_on ? g_messages_on("nccl") : 0;
      const unsigned long long fired0 = cu("injected_failures");
      unsigned long long agreements0 = 0, agreements1 = 0;
      counts(nullptr, nullptr, &agreements0);
      // (Round 3: rank 1's first cuEventRecord orders its packing copy after the legacy
      // stream; the second is route nccl's.)
      if (failing) fail_after(round == 3 ? "cuEventRecord" : "cuMemcpyAsync", round == 3 ? 2 : 1);
      Buf in(round == 2 && g_rank == 1 ? Kind::host : Kind::device, 6), out(Kind::device, 6);
      check(api.host_access(in.p, 6 * sizeof(double), 1) == 0, "input");
      for (size_t i = 0; i < 6; ++i) in.p[i] = input(g_rank, i, 2000 + round);
      MPI_Request req = MPI_REQUEST_NULL;
      const int rc = MPI_Iallreduce(in.p, out.p, 6, MPI_DOUBLE, MPI_SUM, c, &req);
      const std::string L = "copy failure round " + std::to_string(round);
      check(rc == MPI_SUCCESS, L + ": the call starts");
      const int wrc = MPI_Wait(&req, MPI_STATUS_IGNORE);
      const bool everywhere = round == 1 || ((round == 2 || round == 3) && nccl_route());
      check_outcome(wrc, everywhere || (round == 2 && g_rank == 1),
                    everywhere ? "the call fails on every rank" : "the call fails", out, 6,
                    2000 + round, L);
      if (failing) check(cu("injected_failures") > fired0, L + ": the failure was injected");
      counts(nullptr, nullptr, &agreements1);
      if (round >= 4) {
        check(g_messages_on && g_messages_on("nccl") == nccl0,
              L + ": after the abort, the group ran on the host");
        check(agreements1 - agreements0 == (round == 4 ? 2u : 1u),
              L + (round == 4 ? ": packed for NCCL, moved to the host after a second agreement"
                              : ": packed in host memory, one agreement"));
      }
      ++copy_calls;
    }
    MPI_Comm_free(&c);
  }
  const int stream_calls = stream_ordered_section();
  int kernel_calls = 0;
  if (g_kernels == 1) {  // a batched-copy launch failing on rank 1
    MPI_Comm c = fused_comm(Kind::device);
    MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
    const auto fail_after = find_fail_after();
    constexpr int kCalls = 8;  // started together: groups of four or more copies
    for (int round = 0; round < 3 && fail_after; ++round) {
      const bool failing = round == 1 && g_rank == 1;
      const unsigned long long fired0 = cu("injected_failures");
      if (failing) fail_after("cuLaunchKernel", 1);
      std::vector<std::unique_ptr<Buf>> in, out;
      std::vector<MPI_Request> reqs(kCalls, MPI_REQUEST_NULL);
      const std::string L = "kernel failure round " + std::to_string(round);
      for (int k = 0; k < kCalls; ++k) {
        in.push_back(std::make_unique<Buf>(Kind::device, 3));
        out.push_back(std::make_unique<Buf>(Kind::device, 3));
        check(api.host_access(in[k]->p, 3 * sizeof(double), 1) == 0, L + ": input");
        for (size_t i = 0; i < 3; ++i) in[k]->p[i] = input(g_rank, i, 3000 + 10 * round + k);
        check(MPI_Iallreduce(in[k]->p, out[k]->p, 3, MPI_DOUBLE, MPI_SUM, c, &reqs[k]) == MPI_SUCCESS,
              L + ": the call starts");
      }
      int failed = 0;
      for (int k = 0; k < kCalls; ++k) {
        const int wrc = MPI_Wait(&reqs[k], MPI_STATUS_IGNORE);
        ++kernel_calls;
        if (wrc != MPI_SUCCESS) {
          ++failed;
          continue;
        }
        check_outcome(wrc, false, "", *out[k], 3, 3000 + 10 * round + k, L + " call " + std::to_string(k));
      }
      if (failing) {
        check(cu("injected_failures") > fired0, L + ": the launch failure was injected");
        check(failed > 0, L + ": calls fail on the rank whose launch failed");
        fail_after("cuLaunchKernel", 0);
      }
      int any = 0;
      MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
      if (round != 1) check(any == 0, L + ": no call fails on any rank");
    }
    MPI_Comm_free(&c);
  }
  unsigned long long calls = 0, messages = 0, agreements = 0;
  if (counts) counts(&calls, &messages, &agreements);
  if (g_messages_on && !nccl_route()) {  // every fused message on the forced route
    const unsigned long long on = g_messages_on(g_route);
    check(on == messages && on > 0, std::to_string(on) + " of " + std::to_string(messages) +
                                            " fused messages on route " + g_route);
  } else if (g_messages_on) {  // on GPU memory on NCCL, on host memory on pmpi
    const unsigned long long on = g_messages_on("nccl"), pmpi = g_messages_on("pmpi");
    check(on > 0 && on + pmpi == messages,
          std::to_string(on) + " on nccl and " + std::to_string(pmpi) + " on pmpi of " +
              std::to_string(messages) + " fused messages");
  }
  check(calls == 4 * 12 * 9 + 3 + static_cast<unsigned long long>(copy_calls + stream_calls + kernel_calls) &&
            messages > 0 && messages < calls,
        "fused: " + std::to_string(calls) + " calls in " + std::to_string(messages) + " messages");
  check(cu("races") == races0, "no race");
  api.stream_destroy(g_stream);
  api.runtime_fini();
  int fails = 0;
  MPI_Allreduce(&g_fail, &fails, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (g_rank == 0)
    std::printf("fusion_device: %d passed, %d failed (rank 0: %llu calls fused into %llu messages)\n",
                g_pass, fails, calls, messages);
  MPI_Finalize();
  return fails == 0 ? 0 : 1;
}
