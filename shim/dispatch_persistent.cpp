// A persistent collective (MPI_Allreduce_init, ...; shim/persistent.cpp): its routing
// decided once, at its init, as for the non-blocking call a start is (plan_persistent),
// and each start run on that decision, with no agreement (start_persistent).
#include <mpi.h>

#include <atomic>
#include <memory>
#include <vector>

#include "algorithms/fusion.hpp"
#include "algorithms/route.hpp"
#include "base/log.hpp"
#include "core/comm_context.hpp"
#include "core/cuda_driver.hpp"
#include "core/next_mpi.hpp"
#include "core/runtime.hpp"
#include "core/stats.hpp"
#include "core/trace.hpp"
#include "shim/capture.hpp"
#include "shim/dispatch.hpp"
#include "shim/dispatch_decision.hpp"

namespace streamcoll {

using dispatch_detail::call_stream;
using dispatch_detail::decide;
using dispatch_detail::Decision;
using dispatch_detail::explain_once;
using dispatch_detail::now_ns;
using dispatch_detail::raise_error;
using dispatch_detail::report_async_error;
using dispatch_detail::run_on_pmpi;
using dispatch_detail::run_on_route;
using dispatch_detail::sync_stream;
using dispatch_detail::trace_routed;

// A persistent collective: decided at its init, started without a decision.
struct PersistentPlan {
  CollArgs a;                        ///< the init's arguments (arrays: the copies below)
  std::vector<int> counts, displs;
  Decision d;                        ///< decided at the init; d.choice points at `choice`
  config::RouteChoice choice;
  std::shared_ptr<std::atomic<bool>> alive;  ///< the communicator context's (d.ctx)
  bool mpi_request = false;          ///< the starts are MPI_Start of the MPI's own request
};

bool plan_uses_mpi_request(const PersistentPlan& p) { return p.mpi_request; }

PlanPtr plan_persistent(const CollArgs& init, bool avoid_mpi_request, int* rc) {
  *rc = MPI_SUCCESS;
  Runtime& rt = Runtime::get();
  if (g_in_binding || !rt.active()) return nullptr;
  PlanPtr p = std::make_shared<PersistentPlan>();
  p->a = init;
  p->a.nonblocking = true;
  p->a.persistent_init = true;
  Decision& d = p->d;
  d = decide(p->a, rt);
  if (d.error != MPI_SUCCESS) {
    raise_error(d.error_comm, d.error);
    *rc = d.error;
    return nullptr;
  }
  if (log_enabled(LogLevel::info)) explain_once(p->a, d);
  // The pmpi route on the MPI's own persistent request, unless the job stages GPU buffers
  // through the host (an MPI that is not CUDA-aware: the MPI's request would be handed the
  // GPU buffers) and some rank may pass GPU memory: then each start is the MPI's
  // non-blocking form, staged (core/host_staging). From facts equal on every rank (the
  // job's staging, the agreed or asserted host memory), so every rank starts alike.
  if (d.route == RouteId::pmpi) {
    p->mpi_request = !d.well_formed || (!avoid_mpi_request &&
                                        (!rt.staging_job() || init.coll == Coll::barrier ||
                                         d.agreed_host || d.asserted_host));
    // Nothing for streamcoll at the starts but the order after this rank's stream.
    if (p->mpi_request && d.env.mem != MemKind::device && d.env.mem != MemKind::managed)
      return nullptr;
  }
  if (d.well_formed && (init.recvcounts || init.displs)) {
    int size = d.ctx ? d.ctx->size : 0;
    if (!size) PMPI_Comm_size(init.comm, &size);
    if (init.recvcounts) p->counts.assign(init.recvcounts, init.recvcounts + size);
    if (init.displs) p->displs.assign(init.displs, init.displs + size);
    p->a.recvcounts = init.recvcounts ? p->counts.data() : nullptr;
    p->a.displs = init.displs ? p->displs.data() : nullptr;
  }
  if (d.choice) {
    p->choice = *d.choice;  // the table may be replaced before the last start
    d.choice = &p->choice;
  }
  if (d.ctx) p->alive = d.ctx->alive;
  p->a.persistent_init = false;
  p->a.request = nullptr;
  return p;
}

int start_persistent(const PlanPtr& plan, MPI_Request* handle, MPI_Request* inner) {
  Runtime& rt = Runtime::get();
  const PersistentPlan& p = *plan;
  *inner = MPI_REQUEST_NULL;
  // The communicator freed before this start (MPI allows it; MPICH keeps its attributes,
  // and so the context, while a request holds it; Open MPI 4.1 deletes them at
  // MPI_Comm_free, and its own persistent collectives crash when started then): the
  // context and the route's state are gone, and so is the MPI's collective module of the
  // communicator. Every rank freed it at the same point of its collectives on it, so every
  // rank fails the start alike (MPI_ERR_COMM, raised on MPI_COMM_WORLD), with a message.
  const bool alive = !p.alive || p.alive->load(std::memory_order_acquire);
  void* stream = nullptr;
  const bool gpu = p.d.env.mem == MemKind::device || p.d.env.mem == MemKind::managed;
  const bool has_stream = alive && gpu && call_stream(p.a.comm, &stream);
  // On a stream being captured: recorded, each launch starting it as here (on the
  // replay lane's stream, where call_stream finds it), with the MPI's own request too.
  // The application's start gets a request already complete (*inner: also for a plan on
  // the MPI's own request, which is not started now, and whose wait then must not reach
  // the MPI: MPICH 4.0 never completes a wait on a persistent request not yet started).
  if (has_stream && !capture::replaying()) {
    const MPI_Request h = handle ? *handle : MPI_REQUEST_NULL;
    auto replay = [plan, h](MPI_Request* op) {
      MPI_Request mine = h;
      int rc = start_persistent(plan, &mine, op);
      // The MPI's own request: waited for here, in the MPI (a pmpi call holds the
      // replay lane's thread as a live one holds the caller's), not through the wrappers,
      // which may hold the application's view of the handle.
      if (plan->mpi_request && rc == MPI_SUCCESS) rc = SC_NEXT(MPI_Wait)(&mine, MPI_STATUS_IGNORE);
      return rc;
    };
    CollArgs a = p.a;
    a.request = inner;
    if (int rc; capture::record_start(a, replay, &rc)) return rc;
  }
  if (p.mpi_request) {
    const uint64_t t0 = rt.stats_on() ? now_ns() : 0;
    const int own = has_stream ? sync_stream(stream) : MPI_SUCCESS;
    int rc = SC_NEXT(MPI_Start)(handle);
    if (own != MPI_SUCCESS && rc == MPI_SUCCESS) {
      raise_error(p.a.comm, own);
      rc = own;
    }
    if (t0)
      rt.stats().record(p.a.coll, true, RouteId::pmpi, p.d.env.mem, p.d.bytes, now_ns() - t0);
    return rc;
  }
  CollArgs a = p.a;
  a.request = inner;
  if (!alive) {
    log_error("%s: a persistent collective request of streamcoll's started after its "
              "communicator was freed (this MPI deleted the communicator's state at "
              "MPI_Comm_free); failing it with MPI_ERR_COMM", call_name(a.coll, true).c_str());
    raise_error(MPI_COMM_WORLD, MPI_ERR_COMM);
    return MPI_ERR_COMM;
  }
  const bool timed = rt.stats_on();
  Decision d = p.d;  // (a copy: graphs replay the plan from a replay lane's thread)
  const uint64_t t0 = timed ? now_ns() : 0;
  trace::Call traced(a.coll, true);
  d.env.has_stream = has_stream;
  d.env.stream = has_stream ? stream : nullptr;
  if (traced.on()) trace_routed(traced, a, d);
#if STREAMCOLL_HAVE_CUDA
  cuda::RelaxedCapture relaxed(d.env.mem != MemKind::host);
#endif
  if (d.ctx && d.ctx->fusion) fusion::poke(*d.ctx->fusion);
  int rc = d.route == RouteId::pmpi ? run_on_pmpi(a, d, rt) : run_on_route(a, d);
  rc = report_async_error(a, d.ctx, rc);
  if (timed) rt.stats().record(a.coll, true, d.route, d.env.mem, d.bytes, now_ns() - t0);
  return rc;
}

}  // namespace streamcoll
