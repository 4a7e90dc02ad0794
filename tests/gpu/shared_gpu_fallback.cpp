// shared_gpu_fallback: ranks sharing one GPU fall back to pmpi, correctly, stream included.
//
// Every rank uses GPU 0 (the meson tests: 2 and 3 ranks). NCCL refuses two ranks on one
// GPU, so streamcoll must see the sharing (same host, same PCI bus id) and send the
// communicator's collectives to pmpi. For allreduce, reduce, bcast, allgather,
// reduce_scatter_block and alltoall on device buffers, over several types and ops, sizes
// 1, 1000 and 256 Ki elements, blocking and non-blocking, in place and not, it proves per
// call:
//   - streamcoll counted it on route pmpi, memory device (never nccl);
//   - the result equals the one computed on the host from every rank's input.
// Classic: the input is written by kernels on a stream the program synchronises before the
// call; the result is read right after the call on another stream.
// With a stream attached: the input is written on that stream by a kernel that runs after
// a 2 ms spin, and the call comes with no host synchronisation at all -- the fallback
// must synchronise the stream first, or it reads the poison left in the buffers; the
// result is read by a kernel enqueued on the stream after the call.
// Skips (exit 77) without a GPU, without the kernels (no nvcc at build time), or when the
// MPI itself cannot take device buffers (pmpi passes them on unchanged).
#include <string>
#include <vector>

#include "gpu_common.hpp"

using namespace gputest;

namespace {

constexpr double kSpinMs = 2.0;

struct Runner {
  Tally& t;
  Buffers& b;
  const Kernels& k;
  cudaStream_t work;  // the program's own stream (classic mode)
  int rank, nranks;
  uint64_t seed = 1;

  /// One case; `attached` is the stream attached to `comm` (null: classic mode).
  void run(Case c, MPI_Comm comm, cudaStream_t attached, const char* where) {
    c.seed = seed++;
    cudaStream_t s = attached ? attached : work;
    enqueue_late_input(b, k, c, rank, nranks, s, kSpinMs);
    if (!attached) GT_CUDA(cudaStreamSynchronize(work));  // classic: the program's job

    RouteProbe probe(c.stat_name());
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = issue(c, b.d_send, b.d_recv, comm, &req);
    if (rc == MPI_SUCCESS && c.nonblocking) rc = MPI_Wait(&req, MPI_STATUS_IGNORE);
    const std::string route = probe.route();

    if (attached)
      read_on_stream(b, k, c, nranks, attached);
    else  // classic: visible to any stream once the call has returned
      GT_CUDA(cudaMemcpy(b.h_out, b.d_recv, recv_bytes(c, nranks), cudaMemcpyDeviceToHost));

    const std::string d = c.describe();
    t.check(rc == MPI_SUCCESS, "%s [%s]: returned %d", d.c_str(), where, rc);
    t.check(route == "pmpi", "%s [%s]: ran on %s, expected pmpi (ranks share GPU 0)", d.c_str(),
            where, route.c_str());
    if (const auto diff = verify(b, c, rank, nranks))
      t.check(diff->empty(), "%s [%s]: wrong result: %s", d.c_str(), where, diff->c_str());
  }

  void matrix(MPI_Comm comm, cudaStream_t attached, const char* where) {
    const std::vector<Type> types = {GT_TYPE(MPI_INT, int_kind<int>()), GT_TYPE(MPI_FLOAT, Kind::f32),
                                     GT_TYPE(MPI_DOUBLE, Kind::f64), GT_TYPE(MPI_UINT8_T, Kind::u8),
                                     GT_TYPE(MPI_INT64_T, Kind::i64)};
    const Op no_op{MPI_OP_NULL, "-", OpKind::sum};
    for (Coll coll : {Coll::allreduce, Coll::reduce, Coll::bcast, Coll::allgather,
                      Coll::reduce_scatter_block, Coll::alltoall})
      for (const Type& type : types)
        for (const Op& op : reduces(coll) ? nccl_ops() : std::vector<Op>{no_op})
          for (size_t n : {size_t(1), size_t(1000), size_t(1) << 18})
            for (bool nb : {false, true})
              for (bool in_place : {false, true})
                if (!in_place || has_in_place(coll))
                  run(Case{coll, type, op, n, nb, in_place}, comm, attached, where);
  }
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  skip_if(gpu_unusable_reason(0));  // every rank on GPU 0
  require_streamcoll();
  const int rank = world_rank(), nranks = world_size();
  skip_if(nranks < 2 ? "needs at least 2 ranks to share the GPU" : "");
  skip_if(pmpi_device_unsupported_reason());
  Kernels k;
  require_kernels(k);
  std::string nccl_version;
  const std::string no_nccl = nccl_unavailable_reason(&nccl_version);
  if (rank == 0) {
    if (no_nccl.empty())
      std::printf("shared_gpu_fallback: %d ranks on GPU 0, NCCL %s loadable: only the "
                  "shared-GPU detection keeps these calls off nccl\n", nranks, nccl_version.c_str());
    else
      std::printf("note: %s: the calls go to pmpi anyway, the shared-GPU detection is not "
                  "exercised (the fallback's correctness still is)\n", no_nccl.c_str());
  }

  Tally t("shared_gpu_fallback");
  {
    Buffers b((size_t(1) << 18) * 8 * nranks);
    cudaStream_t work = nullptr, s = nullptr;
    GT_CUDA(cudaStreamCreateWithFlags(&work, cudaStreamNonBlocking));
    GT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    Runner run{t, b, k, work, rank, nranks};

    run.matrix(MPI_COMM_WORLD, nullptr, "classic");
    t.check(streamcoll_comm_attach_stream(MPI_COMM_WORLD, s) == MPI_SUCCESS,
            "streamcoll_comm_attach_stream(MPI_COMM_WORLD) failed");
    run.matrix(MPI_COMM_WORLD, s, "stream attached");
    streamcoll_comm_detach_stream(MPI_COMM_WORLD);

    t.check(stat_calls(nullptr, "nccl", nullptr) == 0,
            "%llu call(s) were counted on nccl", stat_calls(nullptr, "nccl", nullptr));
    GT_CUDA(cudaDeviceSynchronize());
    GT_CUDA(cudaStreamDestroy(s));
    GT_CUDA(cudaStreamDestroy(work));
  }
  return t.finish();
}
