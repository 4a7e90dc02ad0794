// nccl: the collective on the communicator's NCCL communicator.
// This file: the route class (NcclRoute, algorithms/nccl.hpp) and the stage interface for
// other routes. Its parts: the set-up and the splits at communicator constructors
// (nccl_setup.cpp), a call's NCCL operation, staged calls and request steps
// (nccl_enqueue.cpp), the NCCL communicators, watchdog, pool, budget and reaper
// (nccl_comm.cpp); what they share is in nccl_detail.hpp.
//
// Source: NCCL (NVIDIA) picks ring or tree per call; ring allreduce costs
// 2(p-1)·α + 2(p-1)/p·n·β for n bytes on p ranks, tree 2·log2(p)·α + 2·n·β (pipelined).
// Stream semantics: Aluminum (Dryden et al., MLHPC 2018), sections IV-B and V-A.
//
// Per communicator (route state, created at the first blocking call routed here, a
// collective step on every rank):
//   1. the rank's GPU is the device of the call's buffer; every rank's (host, PCI bus id)
//      is gathered, and ranks sharing a GPU turn the route off for the communicator
//      (NCCL refuses them; the calls fall back to pmpi, on every rank alike);
//   2. rank 0 makes an ncclUniqueId, PMPI_Bcast carries it, ncclCommInitRank; one
//      PMPI_Allreduce agrees on success, so either every rank uses NCCL or none does.
// Non-blocking calls on a communicator without NCCL state yet go to pmpi: setting up is
// collective, and starting a non-blocking call must stay local.
//
// Streams per call:
//   classic blocking        NCCL on an internal (non-blocking) stream made to wait for an
//                           event recorded on the legacy default stream, so it runs after
//                           the application's legacy and blocking streams' earlier work,
//                           as a legacy-stream copy would; the host waits for it (polling
//                           NCCL's asynchronous errors).
//   classic non-blocking    the same stream; MPI_Test queries an event, MPI_Wait waits.
//   attached S, blocking    NCCL on S; returns at once.
//   attached S, MPI_I*      an internal stream waits for S, runs NCCL, records an event;
//                           MPI_Wait/MPI_Test make S wait for that event (host never).
// Across communicators. NCCL serialises the operations of one NCCL communicator in issue
// order, whatever stream each is on, and MPI makes every rank start the collectives of
// one communicator in the same order, so those cannot deadlock each other. Across NCCL
// communicators NCCL promises nothing (its user guide, "Using multiple NCCL communicators
// concurrently": NCCL kernels block waiting for their peers, so operations of different
// communicators must be launched in the same order on every rank, or be able to run
// concurrently on the GPU, which NCCL does not guarantee; NCCL_LAUNCH_ORDER_IMPLICIT=1
// and CUDA_DEVICE_MAX_CONNECTIONS=1 make them run in launch order). Blocking calls are
// safe: in a legal program the blocking collectives of all communicators happen in one
// order consistent across ranks (or the program would deadlock under any MPI), and our
// launches follow it. MPI_I* calls are not: MPI lets ranks start them on different
// communicators in different orders. So the route takes blocking calls only, unless
// STREAMCOLL_NCCL_NONBLOCKING=1 says the program starts them in one order everywhere
// (a job-wide setting, so every rank decides alike); MPI_I* calls go to the table's next
// rule (pmpi, or ht, whose operations progress independently of each other).
//
// Failures stay collective. A rank that cannot take its part in an NCCL operation (a
// CUDA call before it fails, NCCL refuses it, its wait sees a fault) would leave the
// others' kernels waiting for it forever. So it aborts its NCCL communicator and tells
// every peer, on a private duplicate of the communicator (one small message each; every
// rank keeps one receive posted there); a peer that sees the notice (while it waits for an
// operation, at its next blocking call, or from the watchdog when MPI runs at
// MPI_THREAD_MULTIPLE) aborts its own, which ends its kernels: the operation fails on
// every rank, with MPI_ERR_OTHER, none hangs. An aborted communicator is unusable, which
// every rank reports at the next blocking call's agreement (able_here), so from then on
// the communicator's calls take the table's next rule on every rank alike; nothing else
// is latched. Asynchronous NCCL errors (ncclCommGetAsyncError) are handled the same way.
#include <nccl.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "algorithms/nccl.hpp"
#include "algorithms/nccl_comm.hpp"
#include "algorithms/nccl_detail.hpp"
#include "algorithms/nccl_lib.hpp"
#include "algorithms/nccl_map.hpp"
#include "algorithms/route.hpp"
#include "base/log.hpp"
#include "core/call_request.hpp"
#include "core/cuda_driver.hpp"
#include "core/errors.hpp"
#include "core/runtime.hpp"

namespace streamcoll {

using namespace nccl_detail;  // with its names for the driver and nccl_comm's types

// Routes nccl and ccube: one class (ccube's hooks: algorithms/ccube.cpp), one NCCL
// communicator per communicator (route nccl's state, set up by whichever of them is first
// asked), so they share its set-up, failure handling and stream semantics.

// A rank stages host, managed, mixed and other-GPU memory through the communicator's GPU
// (run_staged) and runs classic or stream-ordered on its own: one NCCL operation on
// every rank whatever each passes. A subclass stages so too, and a rank whose operation
// cannot be prepared (ccube's reduction kernel does not load) fails the call on every
// rank through nccl's failure path. A rank that describes a bcast, allgather or alltoall
// with a derived datatype runs repacked to the others' datatype (core/repack.hpp), and
// one that cannot read its data fails the call on every rank (CallEnv::input_failure).
bool NcclRoute::adapts(const CollArgs& a, CommContext&, const config::RouteChoice&, const CallEnv&) {
  return takes(a) && (takes_op(a.coll) || a.coll == Coll::bcast || a.coll == Coll::allgather ||
                      a.coll == Coll::alltoall);
}

bool NcclRoute::accepts(const CollArgs& a, CommContext& ctx, const config::RouteChoice&,
                        const CallEnv& env) {
  if (!takes(a)) return false;
  // MPI_I*: only where the program promises one start order on all communicators
  // (file comment; a job-wide setting, equal on every rank); fused messages where the
  // site allows them on NCCL (STREAMCOLL_FUSION_NCCL, algorithms/fusion.hpp).
  const config::Settings& set = Runtime::get().settings();
  if (ctx.inter || (ctx.size == 1 && set.one_rank_self)) return false;  // one rank: self
  if (a.nonblocking && !(env.fused ? set.fusion_nccl : set.nccl_nonblocking)) return false;
  const OpInfo* op = takes_op(a.coll) ? find_op(a.op) : nullptr;
  if (nccl::Support s = nccl::supports(a.coll, env.mem, call_type(a), op);
      s != nccl::Support::ok) {
    SC_TRACE("nccl: %s", nccl::describe(s));
    return false;
  }
  NcclState& st = state_of(ctx);
  if (st.status == NcclState::unset) {
    if (!collective_point(a)) return false;  // set up at a blocking call or a persistent init
    set_up(st, env, ctx);
  }
  return st.status == NcclState::ready;
}

// The communicator's NCCL communicator must not be aborted (a failure notice taken in
// here, at a blocking call, makes every rank agree to leave it), and this rank's GPU
// buffers must be on its GPU (set up at its first call, on that call's GPU). Managed
// memory is reachable from any. A subclass adds its own check (able_beyond).
bool NcclRoute::able_here(const CollArgs& a, CommContext& ctx, const CallEnv& local) {
  auto& slot = ctx.route_state[static_cast<int>(RouteId::nccl)];
  const NcclState* st = slot ? static_cast<const NcclState*>(slot.get()) : nullptr;
  if (st && st->status == NcclState::ready) {
    if (st->comm->check_faults(true)) return false;
    if (local.mem == MemKind::device && st->comm->device != local.device) return false;
  }
  return able_beyond(a, local, st && st->status == NcclState::ready ? st->comm->device : local.device);
}

int NcclRoute::run(const CollArgs& a, CommContext& ctx, const config::RouteChoice& choice,
                   const CallEnv& env) {
  std::shared_ptr<NcclComm> c = state_of(ctx).comm;
  // Aborted (a peer's notice, an asynchronous error): the peers have aborted or are
  // told to, so none waits for this rank's part.
  if (int rc = c->poll(); rc != MPI_SUCCESS) return rc;
  const std::string what = call_name(a.coll, a.nonblocking);
  CUstream s = nullptr;  // the stream the operation goes on (set below)
  // Every failure below leaves this rank out of the operation: it tells its peers, and
  // (the abort ends whatever of it was enqueued) a classic call waits for our stream to
  // be through with the caller's buffers before returning. A stream-ordered one does
  // not: the application's stream may hold work the application releases only later,
  // and it cannot reuse the buffers before that stream is through anyway.
  auto lost = [&](int rc) {
    c->fail_collectively(rc, what + " could not take its part on this rank");
    if (s && !env.has_stream) driver().cuStreamSynchronize(s);
    return rc;
  };
  if (env.input_failure != MPI_SUCCESS) return lost(env.input_failure);
  // Managed memory is reachable from any GPU; device memory only from its own. A call
  // routed from an earlier agreement (non-blocking, or blocking from its signature's:
  // shim/dispatch.cpp) whose buffers here are elsewhere stages them.
  const bool reachable = env.mem == MemKind::managed ||
                         (env.mem == MemKind::device && env.device == c->device);
  // A subclass's operation (route ccube's tree), or NCCL's own collective (none).
  Own own;
  if (std::string why; !prepare(a, choice, c->device, &own, &why))
    return lost(fail(Failure::cuda, what + ": " + why));
  const Own* op = own.enqueue ? &own : nullptr;
  if (!reachable) return run_staged(a, ctx, c, op, env);
  const cuda::Driver& d = driver();
  ScopedContext scope(c->cuctx);
  auto user = static_cast<CUstream>(env.stream);
  s = c->classic;
  int rc = MPI_SUCCESS;
  if (env.has_stream) c->stream_ordered.store(true);
  if (env.has_stream && a.nonblocking) {
    // Ordered after the work on the attached stream, which itself goes on.
    CUevent ready = c->take_event(&rc);
    if (!ready) return lost(rc);
    int wr = SC_CU_CHECK(d.cuEventRecord(ready, user), "cuStreamWaitEvent");
    if (wr == MPI_SUCCESS) wr = SC_CU_CHECK(d.cuStreamWaitEvent(c->side, ready, 0), "cuStreamWaitEvent");
    c->give_event(ready);  // the wait has captured it; the event may be recorded again
    if (wr != MPI_SUCCESS) return lost(wr);
    s = c->side;
  } else if (env.has_stream) {
    s = user;
  } else {
    // Classic: ordered after the legacy stream and every blocking stream of the
    // application, as a copy on the legacy stream would be: an event recorded on the
    // legacy stream is after every blocking stream's earlier work. Our stream is not a
    // blocking stream, so nothing of another communicator's is in that event's past.
    CUevent legacy = c->take_event(&rc);
    if (!legacy) return lost(rc);
    const int wr = SC_CU_CHECK(cuda::wait_for_legacy(s, legacy), "cuStreamWaitEvent (legacy stream)");
    c->give_event(legacy);
    if (wr != MPI_SUCCESS) return lost(wr);
  }

  CUresult cu;
  ncclResult_t nr;
  {
    auto use = c->use();
    if (c->aborted()) return c->poll();
    nr = enqueue(a, ctx, *c, s, &cu, op);
  }
  if (nr != ncclSuccess)
    return lost(fail(Failure::nccl, c->lib->describe(what.c_str(), nr, c->comm)));
  if (cu != CUDA_SUCCESS) return lost(SC_CU_FAIL(cu, what));
  c->note(s);

  if (!a.nonblocking) return env.has_stream ? MPI_SUCCESS : c->wait(nullptr, s);
  // Enqueued, but without a request the caller cannot wait for it (nor know when its
  // buffers are free): the operation is lost to it, so its peers are told.
  CUevent done = c->take_event(&rc);
  if (!done) {
    *a.request = MPI_REQUEST_NULL;
    return lost(rc);
  }
  if (const int er = SC_CU_CHECK(d.cuEventRecord(done, s), "cuEventRecord")) {
    c->give_event(done);
    *a.request = MPI_REQUEST_NULL;
    return lost(er);
  }
  if (int src = start_call_request(nccl_steps(c, done, env.has_stream, user), a.request);
      src != MPI_SUCCESS)
    return lost(src);
  return MPI_SUCCESS;
}

void nccl_derive(CommContext& parent, MPI_Comm child);  // nccl_setup.cpp
Route* nccl_route();
void nccl_shutdown();
void nccl_release();
void nccl_resources(ResourceCounts* c);
extern const RouteEntry nccl_entry = {nccl_route, nccl_shutdown, nccl_release, nccl_derive,
                                      nccl_resources};

Route* nccl_route() {
  static NcclRoute r(RouteId::nccl);
  return &r;
}


namespace nccl_stage {

void fail_collectively(CommContext& ctx, int rc, const std::string& why) {
  auto& slot = ctx.route_state[static_cast<int>(RouteId::nccl)];
  if (!slot) return;
  auto& st = static_cast<NcclState&>(*slot);
  if (st.status == NcclState::ready && st.comm) st.comm->fail_collectively(rc, why);
}

int wait_stream(const std::vector<CommContext*>& ctxs, void* stream) {
  std::vector<std::shared_ptr<NcclComm>> comms;
  for (CommContext* c : ctxs) {
    if (!c) continue;
    auto& slot = c->route_state[static_cast<int>(RouteId::nccl)];
    if (!slot) continue;
    auto& st = static_cast<NcclState&>(*slot);
    if (st.status == NcclState::ready && st.comm) comms.push_back(st.comm);
  }
  auto s = static_cast<CUstream>(stream);
  auto aborted = [&] {
    int rc = MPI_SUCCESS;
    for (auto& c : comms)
      if (int e = c->poll(); e != MPI_SUCCESS && rc == MPI_SUCCESS) rc = e;
    return rc;
  };
  for (unsigned i = 1;; ++i) {
    const CUresult r = SC_CU_RESULT(driver().cuStreamQuery(s));  // NOT_READY: not yet
    if (r == CUDA_SUCCESS) return aborted();
    if (r != CUDA_ERROR_NOT_READY) {
      const int rc = SC_CU_FAIL(r, "cuStreamQuery");
      for (auto& c : comms) c->fail_collectively(rc, "a wait for NCCL stages failed on this rank");
      return rc;
    }
    if (i % 1024 == 0) {
      if (int rc = aborted(); rc != MPI_SUCCESS) {
        driver().cuStreamSynchronize(s);  // the aborted kernels end
        return rc;
      }
      if (i >= 64 * 1024) sched_yield();
    }
  }
}

// From the GPU's memory pool, stream-ordered on the copy stream, so that neither the
// allocation nor the free waits for the GPU's other work (cuMemFree may synchronise the
// device, whose work may wait for other ranks): that stream holds only staged results,
// each copied and waited for at once, so synchronising it after the allocation waits
// for no other rank.
std::shared_ptr<void> device_buffer(CommContext& ctx, uint64_t bytes, int* device) {
  auto& slot = ctx.route_state[static_cast<int>(RouteId::nccl)];
  if (!slot || bytes == 0) return nullptr;
  auto& st = static_cast<NcclState&>(*slot);
  if (st.status != NcclState::ready || !st.comm) return nullptr;
  std::shared_ptr<NcclComm> c = st.comm;
  const cuda::Driver& d = driver();
  ScopedContext scope(c->cuctx);
  // Results: without GPU memory the message is packed in host memory (logged at info).
  CUresult r = CUDA_SUCCESS;
  std::call_once(c->copy_once, [&] { r = d.cuStreamCreate(&c->copy, CU_STREAM_NON_BLOCKING); });
  CUdeviceptr p = 0;
  if (c->copy) r = SC_CU_RESULT(d.cuMemAllocAsync(&p, bytes, c->copy));
  if (c->copy && r == CUDA_SUCCESS) {
    r = d.cuStreamSynchronize(c->copy);
    if (r != CUDA_SUCCESS) d.cuMemFreeAsync(p, c->copy);
  }
  if (!c->copy || r != CUDA_SUCCESS) {
    SC_INFO("nccl: no GPU memory for a fused message (%s); it is packed in host memory",
            SC_CU_WHY(r ? r : CUDA_ERROR_INVALID_HANDLE, "cuMemAllocAsync").c_str());
    return nullptr;
  }
  *device = c->device;
  return std::shared_ptr<void>(reinterpret_cast<void*>(p), [c](void* q) {
    ScopedContext free_scope(c->cuctx);
    driver().cuMemFreeAsync(reinterpret_cast<CUdeviceptr>(q), c->copy);
  });
}

}  // namespace nccl_stage

void nccl_shutdown() { Watchdog::get().stop(); }

void nccl_resources(ResourceCounts* c) {
  const nccl::Usage& u = nccl::usage();
  c->nccl_own = u.made_own.load();
  c->nccl_shared = u.made_shared.load();
  c->nccl_live = static_cast<uint64_t>(std::max(0, g_live_nccl.load()));
  c->nccl_refused = u.refused.load();
  c->nccl_bytes = u.bytes.load();
  c->nccl_peak_bytes = u.peak_bytes.load();
}

void nccl_release() {
  Pool::get().stop();
  Reaper::get().drain();
}

}  // namespace streamcoll
