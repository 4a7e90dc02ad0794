// ht_route: the host-transfer route (algorithms/ht.cpp) on a real GPU, every rank on GPU 0.
//
// NCCL refuses two ranks on one GPU; ht does not care (it copies to the host, runs the
// collective there, and copies back), so this runs with 1, 2 and 3 ranks sharing the one
// GPU of the test node. Routes are forced per communicator with streamcoll_comm_set_route
// (found with dlsym), one duplicate of MPI_COMM_WORLD per host algorithm (rd,
// rabenseifner, ring, mpi):
//
//  1. Correctness: allreduce, reduce, bcast, allgather, reduce_scatter_block, on device
//     buffers (cudaMalloc), blocking and MPI_I* + MPI_Wait, in place and not, classic (no
//     stream: the input is synchronised before the call, the result read with cudaMemcpy
//     right after it returns) and stream-ordered (a stream attached: the input written by
//     cudaMemcpyAsync on it just before the call, the result read by cudaMemcpyAsync on it
//     just after, with no host synchronisation in between); MPI_INT, MPI_INT64_T,
//     MPI_UINT8_T, MPI_FLOAT, MPI_DOUBLE with MPI_SUM, MPI_PROD, MPI_MIN, MPI_MAX (and
//     MPI_BAND on the integers); 1, 7, 1000 and 256 Ki elements. Every call must be
//     counted on route ht, device memory, and give the result computed on the host.
//  2. The host does not wait (the stream_semantics pattern): on the attached stream a
//     kernel spins 50 ms and then writes the input; MPI_Allreduce (in place and not) and
//     MPI_Iallreduce + MPI_Wait must return to the host in under 5 ms while the stream is
//     still busy (cudaStreamQuery: not ready), and a kernel after them on the stream must
//     read the right sum. Per algorithm.
//
// Run it under STREAMCOLL_HT_WAIT=auto (cuStreamWaitValue32) and =kernel (the spin-kernel
// fallback): tests/gpu/meson.build. Skips (exit 77) without a GPU or without the test
// kernels (no nvcc at build time).
#include <unistd.h>

#include <string>
#include <vector>

#include "gpu_common.hpp"

using namespace gputest;

namespace {

using SetRouteFn = int (*)(MPI_Comm, const char*);

const char* const kAlgos[] = {"rd", "rabenseifner", "ring", "mpi", "ccube:chunk=1000"};
constexpr Coll kColls[] = {Coll::allreduce, Coll::reduce, Coll::bcast, Coll::allgather,
                           Coll::reduce_scatter_block};
constexpr double kSpinMs = 50.0;
constexpr double kHostLimitMs = 5.0;
constexpr double kLateMs = 300.0;  // the last rank's lateness at a timed call
constexpr size_t kLargest = size_t(1) << 18;
constexpr size_t kNoWaitCount = size_t(1) << 20;

std::string route_spec(const char* algo) {
  std::string s;
  for (Coll c : kColls) s += std::string(s.empty() ? "" : ",") + coll_name(c) + ":ht:algo=" + algo;
  return s;
}

std::vector<Type> types() {
  return {GT_TYPE(MPI_INT, int_kind<int>()), GT_TYPE(MPI_INT64_T, Kind::i64),
          GT_TYPE(MPI_UINT8_T, Kind::u8), GT_TYPE(MPI_FLOAT, Kind::f32),
          GT_TYPE(MPI_DOUBLE, Kind::f64)};
}

std::vector<Op> ops_for(const Type& t) {
  std::vector<Op> ops = {GT_OP(MPI_SUM, sum), GT_OP(MPI_PROD, prod), GT_OP(MPI_MIN, min),
                         GT_OP(MPI_MAX, max)};
  if (t.kind != Kind::f32 && t.kind != Kind::f64) ops.push_back(GT_OP(MPI_BAND, band));
  return ops;
}

struct Runner {
  Tally& t;
  Buffers& b;
  int rank, nranks;
  uint64_t seed = 1;
  long calls = 0;

  void run(Case c, MPI_Comm comm, cudaStream_t stream, const std::string& where) {
    c.seed = seed++;
    ++calls;
    run_device_case(t, b, c, comm, stream, rank, nranks, "ht", where);
  }

  // Every collective x type x op x size; all four variants (blocking or not, in place or
  // not) below the largest size, two at it.
  void matrix(MPI_Comm comm, cudaStream_t stream, const std::string& where) {
    const long before = calls;
    const std::vector<size_t> sizes = {1, 7, 1000, kLargest};
    const Op no_op{MPI_OP_NULL, "-", OpKind::sum};
    unsigned k = 0;
    for (Coll coll : kColls)
      for (const Type& type : types())
        for (const Op& op : reduces(coll) ? ops_for(type) : std::vector<Op>{no_op})
          for (size_t n : sizes)
            for (int v = 0; v < 4; ++v) {
              const bool nb = v & 1, in_place = (v & 2) != 0;
              if (in_place && !has_in_place(coll)) continue;
              if (n == kLargest && (v + static_cast<int>(k)) % 2 == 1) continue;
              ++k;
              run(Case{coll, type, op, n, nb, in_place}, comm, stream, where);
            }
    if (rank == 0) std::printf("%s: %ld calls\n", where.c_str(), calls - before);
  }
};

// Part 2: the host is back at once while the stream is held by a 50 ms kernel.
struct NoWait {
  Tally& t;
  Buffers& b;
  const Kernels& k;
  cudaStream_t s;
  int rank, nranks;
  uint64_t seed = 1000000;

  /// timed=false: a warm-up (the staging pool may grow on the first call of a size).
  void one(MPI_Comm comm, const char* algo, bool nonblocking, bool in_place, bool timed = true) {
    const Case c{Coll::allreduce, GT_TYPE(MPI_INT, int_kind<int>()), GT_OP(MPI_SUM, sum),
                 kNoWaitCount, nonblocking, in_place, seed++};
    const std::string what = std::string(nonblocking ? "MPI_Iallreduce + MPI_Wait" : "MPI_Allreduce") +
                             (in_place ? " in place" : "") + " on the attached stream, algo=" + algo;
    enqueue_late_input(b, k, c, rank, nranks, s, kSpinMs);
    RouteProbe p(c.stat_name());
    MPI_Request req = MPI_REQUEST_NULL;
    // The first call of the signature (the warm-up) agrees with the other ranks at once
    // (one small allreduce: shim/dispatch), so its host time includes waiting for the
    // last rank. Later ones decide from earlier agreements: the host is back at once even
    // though the last rank arrives kLateMs late (nothing takes the skew out of the
    // measure).
    if (!timed) MPI_Barrier(comm);
    if (timed && nranks > 1 && rank == nranks - 1) usleep(static_cast<useconds_t>(kLateMs * 1000));
    const double t0 = now_ms();
    int rc = issue(c, b.d_send, b.d_recv, comm, nonblocking ? &req : nullptr);
    if (rc == MPI_SUCCESS && nonblocking) rc = MPI_Wait(&req, MPI_STATUS_IGNORE);
    const double ms = now_ms() - t0;
    const cudaError_t q = cudaStreamQuery(s);
    if (rank == 0)
      std::printf("%s: the host was back after %.3f ms (the stream is held %.0f ms)%s\n", what.c_str(),
                  ms, kSpinMs, timed ? "" : " -- warm-up, not asserted");
    t.check(rc == MPI_SUCCESS, "%s: returned %d", what.c_str(), rc);
    if (timed) {
      t.check(ms < kHostLimitMs, "%s: the host waited %.3f ms (limit %.1f ms)", what.c_str(), ms,
              kHostLimitMs);
      t.check(q == cudaErrorNotReady,
              "%s: the stream had finished when the call returned (cudaStreamQuery: %s): the host waited",
              what.c_str(), cudaGetErrorString(q));
    }
    const std::string route = p.route();
    t.check(route == "ht", "%s: ran on %s, expected ht", what.c_str(), route.c_str());
    read_on_stream(b, k, c, nranks, s);  // a kernel after the call on the stream
    const std::string diff = verify(b, c, rank, nranks).value();
    t.check(diff.empty(), "%s: wrong result: %s", what.c_str(), diff.c_str());
  }
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  skip_if(gpu_unusable_reason(0));  // every rank on GPU 0: ranks share it
  require_streamcoll();
  Kernels k;
  require_kernels(k);
  const auto set_route = reinterpret_cast<SetRouteFn>(dlsym(RTLD_DEFAULT, "streamcoll_comm_set_route"));
  fail_if(set_route ? "" : "streamcoll lacks streamcoll_comm_set_route");
  const int rank = world_rank(), nranks = world_size();
  const char* wait = std::getenv("STREAMCOLL_HT_WAIT");
  if (rank == 0)
    std::printf("ht_route: %d rank(s) on GPU 0, STREAMCOLL_HT_WAIT=%s\n", nranks, wait ? wait : "(unset: auto)");

  Tally t("ht_route");
  {
    // The largest buffer: allgather of 256 Ki 8-byte elements per rank (or reduce-scatter's
    // send buffer of the same), or the 1 Mi ints of the timed allreduce.
    Buffers b(std::max(kLargest * 8 * static_cast<size_t>(nranks), kNoWaitCount * sizeof(int)) + 4096);
    cudaStream_t s = nullptr;
    GT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    Runner run{t, b, rank, nranks};
    NoWait nowait{t, b, k, s, rank, nranks};
    for (const char* algo : kAlgos) {
      MPI_Comm comm = MPI_COMM_NULL;
      GT_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
      const std::string spec = route_spec(algo);
      const int rc = set_route(comm, spec.c_str());
      fail_if(rc == MPI_SUCCESS ? "" : "streamcoll_comm_set_route(" + spec + ") returned " + std::to_string(rc));
      run.matrix(comm, nullptr, std::string("algo=") + algo + ", classic");
      t.check(streamcoll_comm_attach_stream(comm, s) == MPI_SUCCESS, "attaching the stream failed");
      run.matrix(comm, s, std::string("algo=") + algo + ", stream");
      // Warm the timed path (first stream-ordered call of this shape), then time it.
      nowait.one(comm, algo, false, false, false);
      nowait.one(comm, algo, false, false);
      nowait.one(comm, algo, false, true);
      nowait.one(comm, algo, true, false);
      t.check(streamcoll_comm_detach_stream(comm) == MPI_SUCCESS, "detaching the stream failed");
      GT_CUDA(cudaStreamSynchronize(s));
      GT_MPI(MPI_Comm_free(&comm));
    }
    t.check(stat_calls(nullptr, "ht", "device") > 0, "no call was counted on ht/device");
    GT_CUDA(cudaDeviceSynchronize());
    GT_CUDA(cudaStreamDestroy(s));
  }
  return t.finish();
}
