// nvgroup: route nvgroup on a real GPU, 1 to 4 ranks sharing GPU 0 (CUDA IPC between
// processes on one device), STREAMCOLL_ROUTE=<each>:nvgroup:chunk=64K (set by meson, so
// that large calls take many rounds).
//
// MPI_Allreduce, MPI_Reduce_scatter_block and MPI_Allgather on device buffers over int,
// float, double, uint8 and int64 with every op the route takes, counts 1, 7, 1000 and
// 64 Ki, in place and not, classic and with a
// stream attached; per call: counted on route nvgroup (MPI_Iallreduce: on route nvgroup
// with STREAMCOLL_NVGROUP_NONBLOCKING=1 on one group, else on the next rule, pmpi), and
// the result equals the one computed on the host from every rank's input. With
// STREAMCOLL_HIERARCHY=2x2 (meson: 4 ranks, cross=ht in the rule) the ranks form two
// groups of two, joined by route ht.
// Classic: the input is written by a kernel on the program's stream, synchronised before
// the call; the result is read right after it. Attached: the input is written on the
// stream by a kernel that runs after a 2 ms spin, with no host synchronisation; the result
// is read by a kernel enqueued on the stream after the call.
// Skips (exit 77) without a GPU, without the test kernels, or without route nvgroup in
// this build (no nvcc).
#include <cstdlib>
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
  cudaStream_t work;
  int rank, nranks;
  uint64_t seed = 1;
  const char* nb_route = "pmpi";  // where MPI_I* calls go

  void run(Case c, MPI_Comm comm, cudaStream_t attached, const char* where) {
    c.seed = seed++;
    cudaStream_t s = attached ? attached : work;
    enqueue_late_input(b, k, c, rank, nranks, s, kSpinMs);
    if (!attached) GT_CUDA(cudaStreamSynchronize(work));
    RouteProbe probe(c.stat_name());
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = issue(c, b.d_send, b.d_recv, comm, &req);
    if (rc == MPI_SUCCESS && c.nonblocking) rc = MPI_Wait(&req, MPI_STATUS_IGNORE);
    const std::string route = probe.route();
    if (attached)
      read_on_stream(b, k, c, nranks, attached);
    else
      GT_CUDA(cudaMemcpy(b.h_out, b.d_recv, recv_bytes(c, nranks), cudaMemcpyDeviceToHost));
    const std::string d = c.describe();
    const char* want = c.nonblocking ? nb_route : "nvgroup";
    t.check(rc == MPI_SUCCESS, "%s [%s]: returned %d", d.c_str(), where, rc);
    t.check(route == want, "%s [%s]: ran on %s, expected %s", d.c_str(), where, route.c_str(), want);
    if (const auto diff = verify(b, c, rank, nranks))
      t.check(diff->empty(), "%s [%s]: wrong result: %s", d.c_str(), where, diff->c_str());
  }

  void matrix(MPI_Comm comm, cudaStream_t attached, const char* where) {
    const std::vector<Type> types = {GT_TYPE(MPI_INT, int_kind<int>()), GT_TYPE(MPI_FLOAT, Kind::f32),
                                     GT_TYPE(MPI_DOUBLE, Kind::f64), GT_TYPE(MPI_UINT8_T, Kind::u8),
                                     GT_TYPE(MPI_INT64_T, Kind::i64)};
    const Op no_op{MPI_OP_NULL, "-", OpKind::sum};
    for (Coll coll : {Coll::allreduce, Coll::reduce_scatter_block, Coll::allgather})
      for (const Type& type : types)
        for (const Op& op : reduces(coll) ? nccl_ops() : std::vector<Op>{no_op})
          for (size_t n : {size_t(1), size_t(7), size_t(1000), size_t(1) << 16})
            for (bool in_place : {false, true})
              run(Case{coll, type, op, n, false, in_place}, comm, attached, where);
    run(Case{Coll::allreduce, types[1], nccl_ops()[0], 1000, true, false}, comm, attached, where);
    if (std::string(nb_route) == "nvgroup")
      for (Coll coll : {Coll::allreduce, Coll::reduce_scatter_block, Coll::allgather})
        for (size_t n : {size_t(7), size_t(1) << 16})
          run(Case{coll, types[2], reduces(coll) ? nccl_ops()[1] : no_op, n, true, n == 7}, comm, attached,
              where);
  }
};

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  skip_if(gpu_unusable_reason(0));  // every rank on GPU 0
  require_streamcoll();
  const int rank = world_rank(), nranks = world_size();
  skip_if(pmpi_device_unsupported_reason());  // MPI_Iallreduce goes to pmpi
  Kernels k;
  require_kernels(k);
  Tally t("nvgroup");
  {
    Buffers b((size_t(1) << 18) * 8 * nranks);
    cudaStream_t work = nullptr, s = nullptr;
    GT_CUDA(cudaStreamCreateWithFlags(&work, cudaStreamNonBlocking));
    GT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    Runner run{t, b, k, work, rank, nranks};
    const char* nb = std::getenv("STREAMCOLL_NVGROUP_NONBLOCKING");
    const char* hier = std::getenv("STREAMCOLL_HIERARCHY");
    if (nb && std::string(nb) == "1" && !(hier && std::string(hier).find('x') != std::string::npos))
      run.nb_route = "nvgroup";
    // The first call sets the route up; without it in this build the calls go to pmpi.
    {
      RouteProbe probe("allreduce");
      Case c{Coll::allreduce, GT_TYPE(MPI_INT, int_kind<int>()), nccl_ops()[0], 10, false, false};
      issue(c, b.d_send, b.d_recv, MPI_COMM_WORLD, nullptr);
      int nv = probe.route() == "nvgroup" ? 1 : 0, all = 0;
      MPI_Allreduce(&nv, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
      skip_if(all ? "" : "route nvgroup not in this build or off here (STREAMCOLL_DEBUG=info says why)");
    }
    run.matrix(MPI_COMM_WORLD, nullptr, "classic");
    t.check(streamcoll_comm_attach_stream(MPI_COMM_WORLD, s) == MPI_SUCCESS,
            "streamcoll_comm_attach_stream(MPI_COMM_WORLD) failed");
    run.matrix(MPI_COMM_WORLD, s, "stream attached");
    streamcoll_comm_detach_stream(MPI_COMM_WORLD);
    GT_CUDA(cudaDeviceSynchronize());
    GT_CUDA(cudaStreamDestroy(s));
    GT_CUDA(cudaStreamDestroy(work));
  }
  return t.finish();
}
