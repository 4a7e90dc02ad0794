// nccl_route: the collectives the nccl route claims run on NCCL and give the right result.
//
// On device buffers (cudaMalloc), with one GPU per rank (the meson test: one rank), every
// collective the route claims -- allreduce, reduce, bcast, allgather, reduce_scatter_block,
// alltoall -- blocking and non-blocking, in place and not (where MPI allows MPI_IN_PLACE),
// over every datatype NCCL maps (and, for the data-moving ones, other predefined types
// moved as bytes), every op NCCL has (SUM, PROD, MIN, MAX), at 1, 7, 1000 and 1 Mi
// elements, on MPI_COMM_WORLD and on a duplicate of it, each without and with a stream
// attached. For every call it proves:
//   - streamcoll counted it on route nccl, memory device (per-call statistics);
//   - the receive buffer holds the result computed on the host from each rank's input.
// With a stream attached the input is written by cudaMemcpyAsync on that stream right
// before the call and the result read by cudaMemcpyAsync after it, with no host
// synchronisation in between; MPI_Comm_dup must carry the stream over.
// Then type/op pairs NCCL lacks (MPI_SHORT SUM, MPI_INT BAND, MPI_UINT64_T BXOR) must run
// on pmpi and still be right (when the MPI itself takes device buffers).
// Skips (exit 77) without a GPU or without an NCCL library that loads.
#include <string>
#include <vector>

#include "gpu_common.hpp"

using namespace gputest;

namespace {

struct Runner {
  Tally& t;
  Buffers& b;
  int rank, nranks;
  uint64_t seed = 1;
  long calls = 0;

  /// Runs one case on `comm`; `stream` is the stream attached to it (null: classic).
  void run(Case c, MPI_Comm comm, cudaStream_t stream, const char* want_route, const char* where) {
    c.seed = seed++;
    ++calls;
    run_device_case(t, b, c, comm, stream, rank, nranks, want_route, where);
  }

  /// Every claimed collective x type x op x size x blocking/non-blocking x in place/not.
  /// The first call on the communicator is a blocking one (streamcoll learns the layout
  /// there), as the loops run blocking before non-blocking.
  void matrix(MPI_Comm comm, cudaStream_t stream, const std::vector<size_t>& sizes,
              const char* where) {
    const long before = calls;
    const Op no_op{MPI_OP_NULL, "-", OpKind::sum};
    // MPI_I* take route nccl only with STREAMCOLL_NCCL_NONBLOCKING=1 (the application's
    // promise of one order on every rank); without it they run on pmpi, still checked.
    const char* knob = std::getenv("STREAMCOLL_NCCL_NONBLOCKING");
    const bool nb_nccl = knob && std::string(knob) == "1";
    auto want = [&](bool nb) { return nb && !nb_nccl ? "pmpi" : "nccl"; };
    std::vector<Type> moved = nccl_reduction_types();
    for (const Type& x : byte_moved_types()) moved.push_back(x);
    for (Coll coll : {Coll::allreduce, Coll::reduce, Coll::reduce_scatter_block})
      for (const Type& type : nccl_reduction_types())
        for (const Op& op : nccl_ops())
          for (size_t n : sizes)
            for (bool nb : {false, true})
              for (bool in_place : {false, true})
                run(Case{coll, type, op, n, nb, in_place}, comm, stream, want(nb), where);
    for (Coll coll : {Coll::bcast, Coll::allgather, Coll::alltoall})
      for (const Type& type : moved)
        for (size_t n : sizes)
          for (bool nb : {false, true})
            for (bool in_place : {false, true})
              if (!in_place || has_in_place(coll))
                run(Case{coll, type, no_op, n, nb, in_place}, comm, stream, want(nb), where);
    if (rank == 0) std::printf("%s: %ld calls\n", where, calls - before);
  }

  /// Type/op pairs NCCL has no equivalent for: the pmpi route, still correct.
  void unsupported(MPI_Comm comm, cudaStream_t stream, const char* where) {
    const Type shrt = GT_TYPE(MPI_SHORT, int_kind<short>());
    const Type int_ = GT_TYPE(MPI_INT, int_kind<int>());
    const Type u64 = GT_TYPE(MPI_UINT64_T, Kind::u64);
    const struct {
      Type type;
      Op op;
    } pairs[] = {{shrt, GT_OP(MPI_SUM, sum)}, {int_, GT_OP(MPI_BAND, band)},
                 {u64, GT_OP(MPI_BXOR, bxor)}};
    for (const auto& p : pairs)
      for (Coll coll : {Coll::allreduce, Coll::reduce_scatter_block})
        for (bool nb : {false, true})
          for (bool in_place : {false, true})
            run(Case{coll, p.type, p.op, 1000, nb, in_place}, comm, stream, "pmpi", where);
  }
};

constexpr long kUnsupportedCalls = 3 * 2 * 2 * 2;  // pairs x colls x nb x in place

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  skip_if(gpu_unusable_reason(-1));  // device = rank
  require_streamcoll();
  std::string nccl_version;
  skip_if(nccl_unavailable_reason(&nccl_version));
  const int rank = world_rank(), nranks = world_size();
  if (rank == 0) std::printf("nccl_route: NCCL %s, %d rank(s), one GPU each\n", nccl_version.c_str(), nranks);
  const std::string no_pmpi_device = pmpi_device_unsupported_reason();

  Tally t("nccl_route");
  const std::vector<size_t> all_sizes = {1, 7, 1000, size_t(1) << 20};
  const std::vector<size_t> few_sizes = {1, 1000};
  {
    // The largest buffer: alltoall/allgather of 1 Mi 16-byte elements per rank.
    Buffers b((size_t(1) << 20) * 16 * nranks);
    Runner run{t, b, rank, nranks};
    cudaStream_t s = nullptr;
    GT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    run.matrix(MPI_COMM_WORLD, nullptr, all_sizes, "world, classic");

    t.check(streamcoll_comm_attach_stream(MPI_COMM_WORLD, s) == MPI_SUCCESS,
            "streamcoll_comm_attach_stream(MPI_COMM_WORLD) failed");
    run.matrix(MPI_COMM_WORLD, s, all_sizes, "world, stream");

    MPI_Comm dup = MPI_COMM_NULL;
    GT_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &dup));
    streamcoll_stream_t got = nullptr;
    int flag = 0;
    const int rc = streamcoll_comm_get_stream(dup, &got, &flag);
    t.check(rc == MPI_SUCCESS && flag && got == s,
            "MPI_Comm_dup did not carry the stream over (rc %d, flag %d, %p vs %p)", rc, flag,
            static_cast<void*>(got), static_cast<void*>(s));
    run.matrix(dup, s, few_sizes, "dup, stream");

    t.check(streamcoll_comm_detach_stream(dup) == MPI_SUCCESS, "detaching the stream failed");
    flag = 1;
    streamcoll_comm_get_stream(dup, &got, &flag);
    t.check(flag == 0, "the duplicate still has a stream after detaching");
    run.matrix(dup, nullptr, few_sizes, "dup, classic");

    if (no_pmpi_device.empty()) {
      run.unsupported(dup, nullptr, "dup, classic, no NCCL type/op");
      run.unsupported(MPI_COMM_WORLD, s, "world, stream, no NCCL type/op");
    } else {
      t.skip(2 * kUnsupportedCalls * 3, "type/op pairs that go to pmpi on device buffers: " + no_pmpi_device);
    }

    t.check(stat_calls(nullptr, "nccl", "device") > 0, "no call was counted on nccl/device");
    GT_MPI(MPI_Comm_free(&dup));
    streamcoll_comm_detach_stream(MPI_COMM_WORLD);
    GT_CUDA(cudaStreamSynchronize(s));
    GT_CUDA(cudaStreamDestroy(s));
  }
  return t.finish();
}
