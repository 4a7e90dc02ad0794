// blueconnect: route blueconnect on device buffers (algorithms/blueconnect_gpu.cpp, run_gpu)
// runs its stages through route nccl on a real GPU and gives the right results.
//
// Communicators are duplicates of MPI_COMM_WORLD routed with
// streamcoll_comm_set_route(dup, "*:blueconnect:hierarchy=H:backend=nccl"); H is the
// one-level hierarchy of all ranks ("1" on one rank: a single stage of one rank, which is
// all one GPU allows, since NCCL refuses two ranks on one GPU) and, with one GPU per rank
// and a size that factors, every two-level AxB. On each: MPI_Allreduce,
// MPI_Reduce_scatter_block and MPI_Allgather over every datatype NCCL maps and every op
// it has (SUM, PROD, MIN, MAX), at 1, 7, p, 4099 (padded when p does not divide it) and,
// for float and double, 1 Mi + 3 elements; in place and not; classic (the result is there
// when the call returns), with a stream attached (input written by cudaMemcpyAsync on it
// right before the call, result read by cudaMemcpyAsync on it after, no host
// synchronisation in between) and with the legacy default stream attached. For every call
// it proves:
//   - streamcoll counted it on route blueconnect, memory device;
//   - the receive buffer holds the result computed on the host from each rank's input.
// The non-blocking forms (MPI_I*) must not run on blueconnect (they go to pmpi, still
// right). With the test kernels (STREAMCOLL_TEST_KERNELS): a 50 ms spin on the attached
// stream holds the input back; the call returns in under 5 ms with the stream still busy,
// and the result (read by a kernel after it on the stream) is right.
// Skips (exit 77) without a GPU (one per rank), or without an NCCL library that loads.
#include <string>
#include <vector>

#include "gpu_common.hpp"

using namespace gputest;

namespace {

using SetRouteFn = int (*)(MPI_Comm, const char*);

constexpr size_t kLarge = (size_t(1) << 20) + 3;
constexpr double kSpinMs = 50.0;
constexpr double kHostLimitMs = 5.0;

enum class StreamMode { classic, attached, legacy };
const char* stream_name(StreamMode m) {
  return m == StreamMode::classic ? "classic" : m == StreamMode::attached ? "attached stream"
                                                                           : "legacy stream attached";
}

struct Runner {
  Tally& t;
  Buffers& b;
  int rank, nranks;
  uint64_t seed = 1;
  long calls = 0;

  /// One case on `comm`, whose attached stream is `mode`'s (s for attached).
  void run(Case c, MPI_Comm comm, StreamMode mode, cudaStream_t s, const char* want_route,
           const std::string& where) {
    c.seed = seed++;
    ++calls;
    // The stream the call is ordered on: none (classic), the attached one, or the legacy
    // default stream attached.
    const cudaStream_t stream = mode == StreamMode::classic ? nullptr
                                : mode == StreamMode::legacy ? cudaStreamLegacy
                                                             : s;
    run_device_case(t, b, c, comm, stream, rank, nranks, want_route,
                    where + ", " + stream_name(mode));
  }

  void matrix(MPI_Comm comm, StreamMode mode, cudaStream_t s, const std::string& where) {
    const long before = calls;
    const Op no_op{MPI_OP_NULL, "-", OpKind::sum};
    const std::vector<size_t> sizes = {1, 7, static_cast<size_t>(nranks), 4099, kLarge};
    for (Coll coll : {Coll::allreduce, Coll::reduce_scatter_block, Coll::allgather})
      for (const Type& type : nccl_reduction_types())
        for (const Op& op : reduces(coll) ? nccl_ops() : std::vector<Op>{no_op})
          for (size_t n : sizes) {
            if (n == kLarge && type.kind != Kind::f32 && type.kind != Kind::f64) continue;
            for (bool in_place : {false, true})
              run(Case{coll, type, op, n, false, in_place}, comm, mode, s, "blueconnect", where);
          }
    if (rank == 0) std::printf("%s, %s: %ld calls\n", where.c_str(), stream_name(mode), calls - before);
  }

  /// MPI_I* on a blueconnect communicator: not blueconnect's (pmpi), still right.
  void nonblocking(MPI_Comm comm, StreamMode mode, cudaStream_t s, const std::string& where) {
    const Type f32 = GT_TYPE(MPI_FLOAT, Kind::f32), i64 = GT_TYPE(MPI_INT64_T, Kind::i64);
    const Op sum = GT_OP(MPI_SUM, sum), no_op{MPI_OP_NULL, "-", OpKind::sum};
    for (bool in_place : {false, true}) {
      run(Case{Coll::allreduce, f32, sum, 1000, true, in_place}, comm, mode, s, "pmpi", where);
      run(Case{Coll::reduce_scatter_block, i64, GT_OP(MPI_MAX, max), 7, true, in_place}, comm, mode,
          s, "pmpi", where);
      run(Case{Coll::allgather, i64, no_op, 33, true, in_place}, comm, mode, s, "pmpi", where);
    }
  }
};

/// The host is back at once while a kernel holds the attached stream.
void no_wait(Tally& t, Buffers& b, const Kernels& k, MPI_Comm comm, cudaStream_t s, int rank,
             int nranks, const std::string& where) {
  uint64_t seed = 1000000;
  for (Coll coll : {Coll::allreduce, Coll::reduce_scatter_block, Coll::allgather})
    for (int round = 0; round < 2; ++round) {  // the first one warms up, not timed
      const Case c{coll, GT_TYPE(MPI_INT, int_kind<int>()), GT_OP(MPI_SUM, sum), 100003, false,
                   false, seed++};
      const std::string what = c.describe() + " [" + where + ", attached stream held by a kernel]";
      enqueue_late_input(b, k, c, rank, nranks, s, kSpinMs);
      RouteProbe p(c.stat_name());
      // A blocking call agrees with the other ranks first (one small allreduce: shim/dispatch),
      // so its host time includes waiting for the last rank to arrive; the barrier takes
      // the ranks' skew (verifying the last call, GPU time slices) out of the measure.
      MPI_Barrier(comm);
      const double t0 = now_ms();
      const int rc = issue(c, b.d_send, b.d_recv, comm, nullptr);
      const double ms = now_ms() - t0;
      const cudaError_t q = cudaStreamQuery(s);
      if (rank == 0 && round == 1)
        std::printf("%s: the host was back after %.3f ms (the stream is held %.0f ms)\n", what.c_str(),
                    ms, kSpinMs);
      t.check(rc == MPI_SUCCESS, "%s: returned %d", what.c_str(), rc);
      if (round == 1) {
        t.check(ms < kHostLimitMs, "%s: the host waited %.3f ms (limit %.1f ms)", what.c_str(), ms,
                kHostLimitMs);
        t.check(q == cudaErrorNotReady,
                "%s: the stream had finished when the call returned (cudaStreamQuery: %s): the host waited",
                what.c_str(), cudaGetErrorString(q));
      }
      const std::string route = p.route();
      t.check(route == "blueconnect", "%s: ran on %s, expected blueconnect", what.c_str(), route.c_str());
      read_on_stream(b, k, c, nranks, s);
      const std::string diff = verify(b, c, rank, nranks).value();
      t.check(diff.empty(), "%s: wrong result: %s", what.c_str(), diff.c_str());
    }
}

/// The hierarchies to try on p ranks: all of them in one level, and every AxB.
std::vector<std::string> hierarchies(int p) {
  std::vector<std::string> h = {std::to_string(p)};
  for (int a = 2; a < p; ++a)
    if (p % a == 0) h.push_back(std::to_string(a) + "x" + std::to_string(p / a));
  return h;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  skip_if(gpu_unusable_reason(-1));  // device = rank: NCCL needs one GPU per rank
  require_streamcoll();
  std::string nccl_version;
  skip_if(nccl_unavailable_reason(&nccl_version));
  const auto set_route = reinterpret_cast<SetRouteFn>(dlsym(RTLD_DEFAULT, "streamcoll_comm_set_route"));
  fail_if(set_route ? "" : "streamcoll lacks streamcoll_comm_set_route");
  const int rank = world_rank(), nranks = world_size();
  if (rank == 0)
    std::printf("blueconnect: NCCL %s, %d rank(s), one GPU each\n", nccl_version.c_str(), nranks);
  const std::string no_pmpi_device = pmpi_device_unsupported_reason();
  Kernels k;
  const std::string no_kernels = Kernels::path() ? k.load() : "STREAMCOLL_TEST_KERNELS is not set (built without nvcc)";

  Tally t("blueconnect");
  {
    // The largest buffer: reduce_scatter_block's input or allgather's output of 1 Mi + 3
    // doubles per rank.
    Buffers b(kLarge * 8 * static_cast<size_t>(nranks) + 4096);
    Runner run{t, b, rank, nranks};
    cudaStream_t s = nullptr;
    GT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (const std::string& h : hierarchies(nranks)) {
      MPI_Comm comm = MPI_COMM_NULL;
      GT_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
      const std::string spec = "*:blueconnect:hierarchy=" + h + ":backend=nccl";
      const int rc = set_route(comm, spec.c_str());
      fail_if(rc == MPI_SUCCESS ? "" : "streamcoll_comm_set_route(" + spec + ") returned " + std::to_string(rc));
      const std::string where = "hierarchy " + h;
      run.matrix(comm, StreamMode::classic, nullptr, where);
      t.check(streamcoll_comm_attach_stream(comm, s) == MPI_SUCCESS, "attaching the stream failed");
      run.matrix(comm, StreamMode::attached, s, where);
      if (no_kernels.empty()) no_wait(t, b, k, comm, s, rank, nranks, where);
      if (no_pmpi_device.empty()) run.nonblocking(comm, StreamMode::attached, s, where);
      t.check(streamcoll_comm_detach_stream(comm) == MPI_SUCCESS &&
                  streamcoll_comm_attach_stream(comm, nullptr) == MPI_SUCCESS,
              "attaching the legacy stream failed");
      run.matrix(comm, StreamMode::legacy, nullptr, where);
      t.check(streamcoll_comm_detach_stream(comm) == MPI_SUCCESS, "detaching the stream failed");
      if (no_pmpi_device.empty()) run.nonblocking(comm, StreamMode::classic, nullptr, where);
      GT_CUDA(cudaDeviceSynchronize());
      GT_MPI(MPI_Comm_free(&comm));
    }
    const long nh = static_cast<long>(hierarchies(nranks).size());
    if (!no_kernels.empty()) t.skip(nh * 15, "the host not waiting for a held stream: " + no_kernels);
    if (!no_pmpi_device.empty())
      t.skip(nh * 36, "MPI_I* forms on pmpi with device buffers: " + no_pmpi_device);
    t.check(stat_calls(nullptr, "blueconnect", "device") > 0, "no call was counted on blueconnect/device");
    GT_CUDA(cudaStreamDestroy(s));
  }
  return t.finish();
}
