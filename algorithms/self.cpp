// self: a communicator of one rank (MPI_COMM_SELF, a split into one-rank groups, a
// Cartesian sub-communicator of one). Every collective there is a local operation: the
// result of a reduction over one rank is its input, a gather or all-to-all of one block
// is that block, a broadcast or barrier moves nothing. So the route copies the send
// buffer's bytes to where the receive buffer takes them, on the GPU, and nothing when the
// call is in place. No NCCL communicator (a one-rank one still takes about 0.5 GB of GPU
// memory: NVIDIA/nccl#2363), no agreement (there are no other ranks to agree with), no
// pinned memory, no thread, nothing set up.
//
// Streams, as the other routes (docs/design.md, "Ordering and lifetime"):
//   classic (no stream attached): the copy goes on the legacy default stream (the
//     calling thread's per-thread stream while a capture makes the legacy one unusable:
//     cuda::classic_stream), so it runs after the application's work there and on its
//     blocking streams, as the copy a CUDA-aware MPI makes; the host waits for that
//     stream, with nothing to copy too (the buffer must be final at the return). MPI_I* does the same and returns a complete request: nothing waits for
//     another rank, and the host waits only for its own GPU's earlier work.
//   stream-ordered (the communicator's stream, streamext): the copy is enqueued on that
//     stream and the call returns; MPI_I* returns a complete request (the stream is
//     already ordered after the copy). On a stream being captured the copy becomes a
//     node of the graph (shim/capture.cpp leaves one-rank communicators to this route).
// cuMemcpyAsync takes any pair of memory kinds (unified addressing), so a mixed call
// (host send buffer, device receive buffer) is one copy too.
//
// Taken: calls whose datatypes are predefined and contiguous (size == extent: pair types
// such as MPI_SHORT_INT have holes, which MPI never writes) and, for reductions, whose op
// is predefined and defined on the type (the dispatcher's eligibility verdict); anything
// else goes to the MPI, which raises what is wrong.
#include <cuda.h>
#include <mpi.h>

#include <cstdint>

#include "algorithms/route.hpp"
#include "core/cuda_driver.hpp"
#include "core/datatypes.hpp"
#include "core/requests.hpp"

namespace streamcoll {
namespace {

using cuda::driver;

// One copy: `bytes` from `src` to `dst` (nothing when 0 or in place).
struct LocalCopy {
  const void* src = nullptr;
  void* dst = nullptr;
  uint64_t bytes = 0;
};

// The bytes of `count` elements of the predefined contiguous type `t`, or -1 when `t` is
// not one (derived, or with holes).
int64_t contiguous_bytes(MPI_Datatype t, int count) {
  const TypeInfo* info = find_type(t);
  if (!info) return -1;
  MPI_Aint lb = 0, extent = 0;
  if (PMPI_Type_get_extent(t, &lb, &extent) != MPI_SUCCESS || lb != 0 || extent != info->size)
    return -1;
  return static_cast<int64_t>(info->size) * count;
}

// What a call on one rank copies; false when the route does not take it.
bool local_copy(const CollArgs& a, LocalCopy* c) {
  c->src = a.sendbuf;
  c->dst = a.recvbuf;
  int64_t bytes = 0;
  switch (a.coll) {
    case Coll::barrier:
    case Coll::bcast:  // the root's buffer is the result
      return a.coll == Coll::barrier || contiguous_bytes(a.datatype, a.count) >= 0;
    case Coll::allreduce:
    case Coll::reduce:
    case Coll::reduce_scatter_block:
      bytes = contiguous_bytes(a.datatype, a.count);
      break;
    case Coll::reduce_scatter:
      bytes = contiguous_bytes(a.datatype, a.recvcounts[0]);
      break;
    case Coll::allgather:
    case Coll::alltoall:
    case Coll::allgatherv: {
      const int rcount = a.coll == Coll::allgatherv ? a.recvcounts[0] : a.recvcount;
      bytes = contiguous_bytes(a.recvtype, rcount);
      if (bytes < 0) return false;
      if (a.coll == Coll::allgatherv)
        c->dst = static_cast<char*>(a.recvbuf) + static_cast<int64_t>(a.displs[0]) *
                                                     (rcount ? bytes / rcount : 0);
      // The send side must carry the same bytes (else MPI raises a truncation).
      if (a.sendbuf != MPI_IN_PLACE && contiguous_bytes(a.sendtype, a.sendcount) != bytes)
        return false;
      break;
    }
  }
  if (bytes < 0) return false;
  c->bytes = a.sendbuf == MPI_IN_PLACE ? 0 : static_cast<uint64_t>(bytes);
  return true;
}

// The copy on `s` (the current context's), or nothing.
CUresult enqueue(const LocalCopy& c, CUstream s) {
  if (c.bytes == 0 || c.src == c.dst) return CUDA_SUCCESS;
  return driver().cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(c.dst),
                                reinterpret_cast<CUdeviceptr>(c.src), c.bytes, s);
}

class SelfRoute final : public Route {
 public:
  RouteId id() const override { return RouteId::self; }

  bool accepts(const CollArgs& a, CommContext& ctx, const config::RouteChoice&,
               const CallEnv&) override {
    LocalCopy c;
    return ctx.size == 1 && !ctx.inter && driver().usable && local_copy(a, &c);
  }
  // Whatever memory the rank passes: one copy takes any kinds.
  bool adapts(const CollArgs&, CommContext&, const config::RouteChoice&,
              const CallEnv&) override {
    return true;
  }

  int run(const CollArgs& a, CommContext&, const config::RouteChoice&,
          const CallEnv& env) override {
    LocalCopy c;
    local_copy(a, &c);  // accepted: true
    const int rc = env.has_stream ? stream_ordered(c, static_cast<CUstream>(env.stream))
                                  : classic(c, env.device >= 0 ? env.device
                                                               : cuda::device_of(a.recvbuf));
    if (rc != MPI_SUCCESS || !a.nonblocking) return rc;
    return start_completed_request(a.request);
  }

 private:
  static int stream_ordered(const LocalCopy& c, CUstream s) {
    return SC_CU_CHECK(enqueue(c, s), "self: cuMemcpyAsync (on the communicator's stream)");
  }

  // On the legacy stream of the buffer's context, the host waiting for it; also with
  // nothing to copy (in place, a bcast): the buffer is final when a classic call returns,
  // so the work the application enqueued before it there (writing the input) must be
  // done. A thread with no current context uses the buffer's device's primary one.
  static int classic(const LocalCopy& c, int device) {
    const cuda::Driver& d = driver();
    CUcontext current = nullptr;
    CUresult r = CUDA_SUCCESS;
    if (SC_CU_RESULT(d.cuCtxGetCurrent(&current)) != CUDA_SUCCESS || !current) {  // none: the primary
      current = cuda::primary_context(device < 0 ? 0 : device, &r);
      if (!current) return SC_CU_FAIL(r, "self: cuDevicePrimaryCtxRetain");
    }
    cuda::ScopedContext scope(current);
    const CUstream s = cuda::classic_stream();
    if (const int rc = SC_CU_CHECK(enqueue(c, s), "self: cuMemcpyAsync")) return rc;
    return SC_CU_CHECK(d.cuStreamSynchronize(s), "self: cuStreamSynchronize");
  }
};

}  // namespace

Route* self_route();
extern const RouteEntry self_entry = {self_route};

Route* self_route() {
  static SelfRoute r;
  return &r;
}

}  // namespace streamcoll
