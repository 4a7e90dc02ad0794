// stream_semantics: a communicator with a CUDA stream attached orders its GPU collectives
// on that stream, and the host does not wait (include/streamcoll/streamext.h).
//
// Stream S is attached to MPI_COMM_WORLD; every rank uses GPU 0. On S a kernel spins 50 ms
// and then copy kernels write the input of an MPI_Allreduce (4 Mi ints) into buffers that
// held poison; the call comes at once, with no host synchronisation; a kernel enqueued on
// S after the call copies the result out, and the host checks it after
// cudaStreamSynchronize(S). So the collective ran after the earlier work on S and before
// the later work on S. Cases: MPI_Allreduce (in place and not); MPI_Iallreduce + MPI_Wait;
// MPI_Iallreduce + MPI_Test; MPI_Iallreduce mixed with an MPI_Irecv/MPI_Isend pair in
// one MPI_Waitall (the point-to-point data checked too).
//   One rank (route nccl expected): the call, and the Wait/Test/Waitall after it, return
//   to the host in under 5 ms (printed) while S is still busy (cudaStreamQuery says not
//   ready), and the first MPI_Test completes the request.
//   Two or more ranks on the one GPU (NCCL cannot take them; route pmpi expected): the
//   fallback synchronises S and waits; only the results are asserted, not the timing.
// Classic mode after detaching S: the program synchronises before the call, and once
// MPI_Allreduce (or MPI_Wait of MPI_Iallreduce) returns, the result is there for a copy
// on another stream.
// Skips (exit 77) without a GPU, without the kernels (no nvcc at build time), with one
// rank when NCCL does not load, with several when the MPI cannot take device buffers.
#include <string>
#include <vector>

#include "gpu_common.hpp"

using namespace gputest;

namespace {

constexpr double kSpinMs = 50.0;
constexpr double kHostLimitMs = 5.0;
constexpr size_t kCount = size_t(1) << 22;
constexpr int kP2pCount = 1000, kTag = 7;

struct Steps {
  Tally& t;
  Buffers& b;
  const Kernels& k;
  cudaStream_t s;      // attached to MPI_COMM_WORLD in the stream-ordered steps
  cudaStream_t other;  // an unrelated stream, for the classic-mode reads
  int rank, nranks;
  bool async;           // one rank: the call is expected to be stream-ordered on nccl
  const char* want_route;
  uint64_t seed = 1;

  Case allreduce(bool nonblocking, bool in_place) {
    return Case{Coll::allreduce, GT_TYPE(MPI_INT, int_kind<int>()), GT_OP(MPI_SUM, sum), kCount,
                nonblocking, in_place, seed++};
  }

  void check_route(const RouteProbe& p, const std::string& what) {
    const std::string r = p.route();
    t.check(r == want_route, "%s: ran on %s, expected %s", what.c_str(), r.c_str(), want_route);
  }

  /// One rank: the host came back within the limit while S was still held by the spin.
  void check_host_not_held(const std::string& what, double ms) {
    const cudaError_t q = cudaStreamQuery(s);
    if (rank == 0)
      std::printf("%s: the host was back after %.3f ms (the stream is held %.0f ms)%s\n",
                  what.c_str(), ms, kSpinMs, async ? "" : " -- fallback, not asserted");
    if (!async) return;
    t.check(ms < kHostLimitMs, "%s: the host waited %.3f ms (limit %.1f ms)", what.c_str(), ms,
            kHostLimitMs);
    t.check(q == cudaErrorNotReady,
            "%s: the stream had already finished when the call returned (cudaStreamQuery: %s): "
            "the host waited for the stream", what.c_str(), cudaGetErrorString(q));
  }

  void check_result(const Case& c, const std::string& what) {
    read_on_stream(b, k, c, nranks, s);
    const std::string diff = verify(b, c, rank, nranks).value();  // allreduce: all defined
    t.check(diff.empty(), "%s: wrong result: %s", what.c_str(), diff.c_str());
  }

  void blocking(bool in_place) {
    const Case c = allreduce(false, in_place);
    const std::string what = "MPI_Allreduce on S" + std::string(in_place ? " (in place)" : "");
    enqueue_late_input(b, k, c, rank, nranks, s, kSpinMs);
    RouteProbe p(c.stat_name());
    // A blocking call agrees with the other ranks first (one small allreduce: shim/dispatch),
    // so its host time includes waiting for the last rank to arrive; the barrier takes
    // the ranks' skew (verifying the last call, GPU time slices) out of the measure.
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = now_ms();
    const int rc = issue(c, b.d_send, b.d_recv, MPI_COMM_WORLD, nullptr);
    const double ms = now_ms() - t0;
    check_host_not_held(what, ms);
    t.check(rc == MPI_SUCCESS, "%s: returned %d", what.c_str(), rc);
    check_route(p, what);
    check_result(c, what);
  }

  void iallreduce_wait() {
    const Case c = allreduce(true, false);
    const std::string what = "MPI_Iallreduce + MPI_Wait on S";
    enqueue_late_input(b, k, c, rank, nranks, s, kSpinMs);
    RouteProbe p(c.stat_name());
    MPI_Request req = MPI_REQUEST_NULL;
    const double t0 = now_ms();
    int rc = issue(c, b.d_send, b.d_recv, MPI_COMM_WORLD, &req);
    if (rc == MPI_SUCCESS) rc = MPI_Wait(&req, MPI_STATUS_IGNORE);
    const double ms = now_ms() - t0;
    check_host_not_held(what, ms);
    t.check(rc == MPI_SUCCESS, "%s: returned %d", what.c_str(), rc);
    t.check(req == MPI_REQUEST_NULL, "%s: the request is not MPI_REQUEST_NULL after MPI_Wait",
            what.c_str());
    check_route(p, what);
    check_result(c, what);
  }

  void iallreduce_test() {
    const Case c = allreduce(true, false);
    const std::string what = "MPI_Iallreduce + MPI_Test on S";
    enqueue_late_input(b, k, c, rank, nranks, s, kSpinMs);
    RouteProbe p(c.stat_name());
    MPI_Request req = MPI_REQUEST_NULL;
    const double t0 = now_ms();
    int rc = issue(c, b.d_send, b.d_recv, MPI_COMM_WORLD, &req);
    int flag = 0, tests = 0;
    while (rc == MPI_SUCCESS && !flag) {
      rc = MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
      ++tests;
    }
    const double ms = now_ms() - t0;
    check_host_not_held(what, ms);
    t.check(rc == MPI_SUCCESS, "%s: returned %d", what.c_str(), rc);
    if (async)  // the stream waits, the request completes at once
      t.check(tests == 1, "%s: MPI_Test completed the request at call %d, not the first",
              what.c_str(), tests);
    check_route(p, what);
    check_result(c, what);
  }

  void waitall_mixed() {
    const Case c = allreduce(true, false);
    const std::string what = "MPI_Iallreduce + MPI_Irecv/MPI_Isend in one MPI_Waitall";
    const int right = (rank + 1) % nranks, left = (rank + nranks - 1) % nranks;
    std::vector<int> out(kP2pCount), in(kP2pCount, -1);
    for (int i = 0; i < kP2pCount; ++i) out[i] = rank * 100000 + i;
    enqueue_late_input(b, k, c, rank, nranks, s, kSpinMs);
    RouteProbe p(c.stat_name());
    MPI_Request reqs[3];
    MPI_Status st[3];
    const double t0 = now_ms();
    GT_MPI(MPI_Irecv(in.data(), kP2pCount, MPI_INT, left, kTag, MPI_COMM_WORLD, &reqs[0]));
    int rc = issue(c, b.d_send, b.d_recv, MPI_COMM_WORLD, &reqs[1]);
    GT_MPI(MPI_Isend(out.data(), kP2pCount, MPI_INT, right, kTag, MPI_COMM_WORLD, &reqs[2]));
    if (rc == MPI_SUCCESS) rc = MPI_Waitall(3, reqs, st);
    const double ms = now_ms() - t0;
    check_host_not_held(what, ms);
    t.check(rc == MPI_SUCCESS, "%s: returned %d", what.c_str(), rc);
    for (int i = 0; i < 3; ++i)
      t.check(reqs[i] == MPI_REQUEST_NULL, "%s: request %d not MPI_REQUEST_NULL after MPI_Waitall",
              what.c_str(), i);
    t.check(st[0].MPI_SOURCE == left && st[0].MPI_TAG == kTag,
            "%s: receive status says source %d tag %d, expected %d %d", what.c_str(),
            st[0].MPI_SOURCE, st[0].MPI_TAG, left, kTag);
    int bad = -1;
    for (int i = 0; i < kP2pCount && bad < 0; ++i)
      if (in[i] != left * 100000 + i) bad = i;
    t.check(bad < 0, "%s: point-to-point element %d: got %d, want %d", what.c_str(), bad,
            bad < 0 ? 0 : in[bad], left * 100000 + bad);
    check_route(p, what);
    check_result(c, what);
  }

  /// No stream attached: the program synchronises before the call; after it, the result is
  /// in the buffer for a copy on another stream.
  void classic(bool nonblocking) {
    const Case c = allreduce(nonblocking, false);
    const std::string what =
        std::string(nonblocking ? "MPI_Iallreduce + MPI_Wait" : "MPI_Allreduce") + ", no stream";
    enqueue_late_input(b, k, c, rank, nranks, s, kSpinMs);
    GT_CUDA(cudaDeviceSynchronize());
    RouteProbe p(c.stat_name());
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = issue(c, b.d_send, b.d_recv, MPI_COMM_WORLD, &req);
    if (rc == MPI_SUCCESS && nonblocking) rc = MPI_Wait(&req, MPI_STATUS_IGNORE);
    GT_CUDA(cudaMemcpyAsync(b.h_out, b.d_recv, recv_bytes(c, nranks), cudaMemcpyDeviceToHost, other));
    GT_CUDA(cudaStreamSynchronize(other));
    t.check(rc == MPI_SUCCESS, "%s: returned %d", what.c_str(), rc);
    check_route(p, what);
    const std::string diff = verify(b, c, rank, nranks).value();  // allreduce: all defined
    t.check(diff.empty(), "%s: wrong result: %s", what.c_str(), diff.c_str());
  }
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  skip_if(gpu_unusable_reason(0));  // every rank on GPU 0
  require_streamcoll();
  const int rank = world_rank(), nranks = world_size();
  const bool async = nranks == 1;
  std::string nccl_version;
  if (async)
    skip_if(nccl_unavailable_reason(&nccl_version));
  else
    skip_if(pmpi_device_unsupported_reason());
  Kernels k;
  require_kernels(k);
  if (rank == 0) {
    if (async)
      std::printf("stream_semantics: 1 rank, NCCL %s: stream-ordered on nccl expected\n",
                  nccl_version.c_str());
    else
      std::printf("stream_semantics: %d ranks share GPU 0: pmpi fallback expected, results "
                  "asserted, host timing not\n", nranks);
  }

  Tally t("stream_semantics");
  {
    Buffers b(kCount * sizeof(int) * nranks);
    cudaStream_t s = nullptr, other = nullptr;
    GT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    GT_CUDA(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
    Steps steps{t, b, k, s, other, rank, nranks, async, async ? "nccl" : "pmpi"};

    t.check(streamcoll_comm_attach_stream(MPI_COMM_WORLD, s) == MPI_SUCCESS,
            "streamcoll_comm_attach_stream(MPI_COMM_WORLD) failed");
    streamcoll_stream_t got = nullptr;
    int flag = 0;
    streamcoll_comm_get_stream(MPI_COMM_WORLD, &got, &flag);
    t.check(flag && got == s, "streamcoll_comm_get_stream does not return the attached stream");

    // Warm-up, not timed: the first call on a communicator sets things up (layout, NCCL).
    {
      const Case c = steps.allreduce(false, false);
      prepare(c, rank, nranks, b.h_send, b.h_recv);
      GT_CUDA(cudaMemcpy(b.d_send, b.h_send, kCount * sizeof(int), cudaMemcpyHostToDevice));
      GT_CUDA(cudaDeviceSynchronize());
      GT_MPI(MPI_Allreduce(b.d_send, b.d_recv, static_cast<int>(kCount), MPI_INT, MPI_SUM,
                           MPI_COMM_WORLD));
      GT_CUDA(cudaMemcpyAsync(b.h_out, b.d_recv, kCount * sizeof(int), cudaMemcpyDeviceToHost, s));
      GT_CUDA(cudaStreamSynchronize(s));
      const std::string diff = verify(b, c, rank, nranks).value();
      t.check(diff.empty(), "warm-up MPI_Allreduce on S: wrong result: %s", diff.c_str());
    }

    steps.blocking(false);
    steps.blocking(true);
    steps.iallreduce_wait();
    steps.iallreduce_test();
    steps.waitall_mixed();

    GT_CUDA(cudaStreamSynchronize(s));
    t.check(streamcoll_comm_detach_stream(MPI_COMM_WORLD) == MPI_SUCCESS, "detaching S failed");
    flag = 1;
    streamcoll_comm_get_stream(MPI_COMM_WORLD, &got, &flag);
    t.check(flag == 0, "MPI_COMM_WORLD still has a stream after detaching");
    steps.classic(false);
    steps.classic(true);

    GT_CUDA(cudaDeviceSynchronize());
    GT_CUDA(cudaStreamDestroy(other));
    GT_CUDA(cudaStreamDestroy(s));
  }
  return t.finish();
}
