// Route nccl's operations (algorithms/nccl_detail.hpp): a call's NCCL collective on a
// stream (enqueue), a rank's part in a call whose buffers are not on the NCCL
// communicator's GPU (run_staged, through core/staging's GpuStage), and the steps of an
// MPI_I* call's request (nccl_steps). Streams and failures: algorithms/nccl.cpp's file
// comment.
#include <nccl.h>

#include <functional>
#include <memory>
#include <string>

#include "algorithms/nccl_detail.hpp"
#include "algorithms/nccl_lib.hpp"
#include "algorithms/nccl_map.hpp"
#include "base/log.hpp"
#include "core/call_request.hpp"
#include "core/cuda_driver.hpp"
#include "core/errors.hpp"
#include "core/staging.hpp"
#include "core/stats.hpp"

namespace streamcoll::nccl_detail {

// A non-blocking call in flight: complete once the event on the stream that ran it is
// (stream-ordered: the attached stream waits for it, and the request completes at once);
// `after` (a staged call's copies back) runs once it is over, whatever its outcome.
CallSteps nccl_steps(std::shared_ptr<NcclComm> c, CUevent done, bool stream_mode, CUstream user,
                     std::function<int()> after) {
  CallSteps st;
  if (stream_mode) {
    // Stream semantics: the attached stream waits for the operation; the host does not.
    st.test = [c, done, user](bool* finished) {
      *finished = true;
      ScopedContext scope(c->cuctx);
      const int rc = SC_CU_CHECK(driver().cuStreamWaitEvent(user, done, 0), "cuStreamWaitEvent");
      const int polled = c->poll();
      return rc != MPI_SUCCESS ? rc : polled;
    };
  } else {
    st.test = [c, done](bool* finished) {
      ScopedContext scope(c->cuctx);
      const bool aborted_before = c->aborted();
      const CUresult r = SC_CU_RESULT(driver().cuEventQuery(done));
      *finished = r != CUDA_ERROR_NOT_READY;
      if (r == CUDA_SUCCESS) return c->completed(aborted_before);
      if (*finished) return SC_CU_FAIL(r, "cuEventQuery");
      // Pending: a failure notice or an asynchronous error aborts the communicator here,
      // which ends its kernels; the request completes, with the error, once the event says
      // the GPU is done with the buffers (completed()).
      c->poll();
      return MPI_SUCCESS;
    };
    st.wait = [c, done] {
      ScopedContext scope(c->cuctx);
      return c->wait(done, nullptr);
    };
  }
  if (after)
    st.after = [after](int rc) {
      const int back = after();  // the operation is over: the staged results to the caller
      return rc != MPI_SUCCESS ? rc : back;
    };
  st.release = [c, done, after](bool finished) {
    if (!finished && after) {  // never completed (start_request failed): in flight
      ScopedContext scope(c->cuctx);
      c->wait(done, nullptr);
      after();
    }
    c->give_event(done);
  };
  return st;
}

// Enqueues the collective on `s` (with `own`, a subclass's operation in its place: route
// ccube's allreduce). Returns the NCCL result; *cu gets a CUDA failure of the copies and
// kernels around it (in-place reduce-scatter, alltoall, the subclass's).
ncclResult_t enqueue(const CollArgs& a, const CommContext& ctx, const NcclComm& c, CUstream s,
                     CUresult* cu, const NcclRoute::Own* own) {
  const nccl::Library& L = *c.lib;
  const TypeInfo* t = call_type(a);
  const size_t ts = static_cast<size_t>(t->size);
  const int p = ctx.size, me = ctx.rank;
  auto* rbuf = static_cast<char*>(a.recvbuf);
  const void* sbuf = a.sendbuf;
  *cu = CUDA_SUCCESS;
  if (own) return own->enqueue(a, ctx, c, s, *own, cu);
  switch (a.coll) {
    case Coll::allreduce: {
      auto type = *nccl::reduction_type(*t);
      auto op = *nccl::reduction_op(find_op(a.op)->kind);
      return L.ncclAllReduce(sbuf == MPI_IN_PLACE ? rbuf : sbuf, rbuf, a.count, type, op,
                             c.comm, s);
    }
    case Coll::reduce: {
      auto type = *nccl::reduction_type(*t);
      auto op = *nccl::reduction_op(find_op(a.op)->kind);
      // MPI_IN_PLACE is only valid at the root, where the input is the receive buffer.
      return L.ncclReduce(sbuf == MPI_IN_PLACE ? rbuf : sbuf, rbuf, a.count, type, op, a.root,
                          c.comm, s);
    }
    case Coll::bcast:
      return L.ncclBroadcast(rbuf, rbuf, a.count * ts, ncclUint8, a.root, c.comm, s);
    case Coll::allgather: {
      const size_t block = static_cast<size_t>(a.recvcount) * ts;
      // MPI in place: this rank's block is already at its place in recvbuf, which is
      // NCCL's in-place condition (sendbuff == recvbuff + rank * block).
      const void* src = sbuf == MPI_IN_PLACE ? rbuf + me * block : sbuf;
      return L.ncclAllGather(src, rbuf, block, ncclUint8, c.comm, s);
    }
    case Coll::reduce_scatter_block: {
      auto type = *nccl::reduction_type(*t);
      auto op = *nccl::reduction_op(find_op(a.op)->kind);
      if (sbuf != MPI_IN_PLACE)
        return L.ncclReduceScatter(sbuf, rbuf, a.count, type, op, c.comm, s);
      // MPI in place: input is all of recvbuf, the result goes to its start, and the rest
      // of recvbuf stays as it was (MPI writes nothing there). NCCL's in place would leave
      // the result over this rank's input block, so reduce into a stream-ordered scratch
      // block and copy it down (rank 0's block is the start: no scratch).
      const size_t block = static_cast<size_t>(a.count) * ts;
      if (me == 0) return L.ncclReduceScatter(rbuf, rbuf, a.count, type, op, c.comm, s);
      CUdeviceptr tmp = 0;
      if ((*cu = driver().cuMemAllocAsync(&tmp, block, s)) != CUDA_SUCCESS) return ncclSuccess;
      ncclResult_t r = L.ncclReduceScatter(rbuf, reinterpret_cast<void*>(tmp), a.count, type,
                                           op, c.comm, s);
      if (r == ncclSuccess)
        *cu = driver().cuMemcpyDtoDAsync(reinterpret_cast<CUdeviceptr>(rbuf), tmp, block, s);
      if (CUresult f = driver().cuMemFreeAsync(tmp, s); *cu == CUDA_SUCCESS) *cu = f;
      return r;
    }
    case Coll::alltoall: {
      const size_t block = static_cast<size_t>(a.recvcount) * ts;
      CUdeviceptr copy = 0;
      const char* src = static_cast<const char*>(sbuf);
      if (sbuf == MPI_IN_PLACE) {  // send from a stream-ordered copy of recvbuf
        if ((*cu = driver().cuMemAllocAsync(&copy, block * p, s)) != CUDA_SUCCESS)
          return ncclSuccess;
        if ((*cu = driver().cuMemcpyDtoDAsync(copy, reinterpret_cast<CUdeviceptr>(rbuf),
                                              block * p, s)) != CUDA_SUCCESS) {
          driver().cuMemFreeAsync(copy, s);
          return ncclSuccess;
        }
        src = reinterpret_cast<const char*>(copy);
      }
      ncclResult_t r = L.ncclGroupStart();
      for (int peer = 0; peer < p && r == ncclSuccess; ++peer) {
        r = L.ncclSend(src + peer * block, block, ncclUint8, peer, c.comm, s);
        if (r == ncclSuccess) r = L.ncclRecv(rbuf + peer * block, block, ncclUint8, peer, c.comm, s);
      }
      ncclResult_t end = L.ncclGroupEnd();
      if (r == ncclSuccess) r = end;
      if (copy) *cu = driver().cuMemFreeAsync(copy, s);
      return r;
    }
    default:
      return ncclInvalidUsage;  // accepts() lets no other collective through
  }
}

// A call whose buffers on this rank are not on the NCCL communicator's GPU (host memory,
// another GPU's, or a mix) while the other ranks' are: it was routed from memory kinds
// agreed at an earlier call (shim/dispatch.cpp), so this rank takes part through device
// copies. The inputs go to a scratch buffer on the classic stream before the collective.
// Non-blocking: the results come back (on the copy stream, waited for) when the request
// completes, so that nothing here waits for other ranks. Blocking: the host waits for the
// collective (polling for failure notices, as a classic call does), then for the copies
// back. This rank keeps plain MPI semantics: its buffers are final when the call returns or
// MPI_Wait/MPI_Test report it, and buffers on another GPU are read and written after the
// work already on that GPU's legacy stream and the application's blocking streams there,
// and after the work on the stream attached to the communicator (env.has_stream). Only
// the bytes MPI says the call writes on this rank are written.
int run_staged(const CollArgs& a, const CommContext& ctx, const std::shared_ptr<NcclComm>& c,
               const NcclRoute::Own* own, const CallEnv& env) {
  const cuda::Driver& d = driver();
  ScopedContext scope(c->cuctx);
  // Any failure before the collective is enqueued leaves this rank out: its peers are told.
  auto lost = [&](int rc) {
    c->fail_collectively(rc, call_name(a.coll, a.nonblocking) + " (staged) could not take its part on this rank");
    d.cuStreamSynchronize(c->classic);  // nothing enqueued may still read the caller's buffers
    return rc;
  };
  CUresult made = CUDA_SUCCESS;
  std::call_once(c->copy_once, [&] { made = d.cuStreamCreate(&c->copy, CU_STREAM_NON_BLOCKING); });
  if (!c->copy)
    return lost(SC_CU_FAIL(made ? made : CUDA_ERROR_INVALID_HANDLE, "cuStreamCreate (staging)"));
  CUstream s = c->classic;
  // After the work on the buffers' GPUs and on the attached stream, which itself goes on.
  auto stage = std::make_shared<staging::GpuStage>();
  if (const int rc = stage->in(a, ctx.rank, ctx.size, c->cuctx, s,
                               env.has_stream ? static_cast<CUstream>(env.stream) : nullptr, "nccl")) {
    stage->drop(s);
    return lost(rc);
  }
  const CollArgs staged = stage->args(a);
  CUresult cu = CUDA_SUCCESS;
  ncclResult_t nr;
  {
    auto use = c->use();
    if (c->aborted()) {
      stage->drop(s);
      return c->poll();
    }
    nr = enqueue(staged, ctx, *c, s, &cu, own);
  }
  int rc = MPI_SUCCESS;
  if (nr != ncclSuccess || cu != CUDA_SUCCESS) {
    stage->drop(s);
    return lost(nr != ncclSuccess
                    ? fail(Failure::nccl, c->lib->describe(call_name(a.coll, true).c_str(), nr, c->comm))
                    : SC_CU_FAIL(cu, call_name(a.coll, true)));
  }
  c->note(s);
  // Runs once the collective is done (or the request is dropped unstarted): results back
  // on the copy stream, which nothing else uses, so waiting for it waits for no other rank.
  auto back = [c, stage]() -> int { return stage->finish(c->copy); };
  if (!a.nonblocking) {
    if (rc = c->wait(nullptr, s); rc != MPI_SUCCESS) {
      stage->drop(s);  // after whatever of the operation is still on s
      return rc;
    }
    return back();
  }
  // Enqueued, but without a request the caller cannot wait for it: lost to it, so its
  // peers are told (the scratch buffer goes once the stream is through).
  CUevent done = c->take_event(&rc);
  if (!done) {
    *a.request = MPI_REQUEST_NULL;
    rc = lost(rc);
    stage->drop(s);
    return rc;
  }
  if (const int er = SC_CU_CHECK(d.cuEventRecord(done, s), "cuEventRecord")) {
    c->give_event(done);
    *a.request = MPI_REQUEST_NULL;
    rc = lost(er);
    stage->drop(s);
    return rc;
  }
  return start_call_request(nccl_steps(c, done, false, nullptr, std::move(back)), a.request);
}

}  // namespace streamcoll::nccl_detail
