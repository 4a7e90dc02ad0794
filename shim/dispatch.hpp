// The entry points every collective wrapper uses.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "core/coll_args.hpp"
#include "core/runtime.hpp"

namespace streamcoll {

/// Nonzero while this thread is inside the MPI's own Fortran binding, called by one of
/// streamcoll's Fortran wrappers (shim/fortran.cpp). MPICH's binding calls the C MPI_
/// functions, which are streamcoll's own: they then go straight to the next MPI_
/// definition, so that a Fortran call is routed (and agreed on) once, not twice.
inline thread_local int g_in_binding __attribute__((tls_model("initial-exec"))) = 0;

/// The pass-through fast path, checked by each wrapper before anything else: when it
/// holds, the wrapper tail-calls the PMPI_ function itself. It holds when nothing can
/// route the collective (g_passthrough) and the arguments need no screening by
/// streamcoll (a valid communicator, non-null buffers, no negative count, a request for a
/// non-blocking call; v-variants never take it, their counts are screened in dispatch()).
/// `counts`: the call's significant counts OR-ed together (negative if one of them is).
inline bool pass_through(Coll c, MPI_Comm comm, const void* sendbuf, const void* recvbuf,
                         int counts) {
  return ((g_passthrough.load(std::memory_order_relaxed) >> static_cast<int>(c) & 1u) &&
          comm != MPI_COMM_NULL && sendbuf != nullptr && recvbuf != nullptr && counts >= 0) ||
         g_in_binding;
}

/// The significant counts of a gather-like call, for pass_through (sendcount is ignored
/// with MPI_IN_PLACE, and may then be anything).
inline int gather_counts(const void* sendbuf, int sendcount, int recvcount) {
  return (sendbuf == MPI_IN_PLACE ? 0 : sendcount) | recvcount;
}

/// Inside an MPI communicator constructor on `parent`, after the MPI's own call returned
/// `rc` and `child`: the child's route state derived from the parent's, collectively over
/// it (shim/comm_ctor.cpp).
void derive_child(MPI_Comm parent, int rc, MPI_Comm child);

/// Everything else: screens, classifies, routes and runs one call, and records its
/// statistics; returns what the MPI call returns. shim/dispatch.cpp.
int dispatch(const CollArgs& a);

/// A persistent collective's routing (MPI_Allreduce_init, ...: shim/persistent.cpp),
/// decided once, at its init; opaque outside shim/dispatch_persistent.cpp.
struct PersistentPlan;
/// Shared: a CUDA graph that captured a start holds it too (shim/capture.hpp).
using PlanPtr = std::shared_ptr<PersistentPlan>;

/// At a persistent collective's init (`init`: its arguments, `request` the application's):
/// screens them, agrees on every rank's facts (one allreduce on init.comm: MPI makes the
/// init non-local and ordered like any collective), chooses the route every start takes
/// and lets it set up, all as for the non-blocking call a start is. Returns the plan, or
/// nullptr when the starts are the MPI's own persistent request's with nothing for
/// streamcoll to do (host memory on the pmpi route; arguments the MPI must judge). *rc: an
/// error streamcoll raised itself (then no request is to be made), else MPI_SUCCESS.
/// Thread-safe as a collective call is.
/// `avoid_mpi_request`: the MPI's own persistent form of this collective is known to be
/// wrong (a fact of the MPI library, equal on every rank): route pmpi starts the MPI's
/// non-blocking form instead.
PlanPtr plan_persistent(const CollArgs& init, bool avoid_mpi_request, int* rc);
/// Whether the plan's starts are MPI_Start of the MPI's own persistent request (the pmpi
/// route); otherwise the request handed out is a stand-in and each start runs the route
/// on a request of its own.
bool plan_uses_mpi_request(const PersistentPlan& p);
/// MPI_Start of a planned request (`handle`, inactive): for a plan on the MPI's request,
/// the order after this rank's attached stream (synchronised) and MPI_Start(handle), *inner
/// null; otherwise the route started with no decision and no agreement, its operation's
/// request in *inner (MPI_REQUEST_NULL when it is already complete). Stream-ordered where the
/// agreed facts and this rank have a stream; on a stream being captured, recorded (each
/// launch of the graph then starts it as here; *inner a completed request). Returns an MPI
/// error code, raised through the communicator's error handler. Thread-safe (the plan is
/// only read).
int start_persistent(const PlanPtr& p, MPI_Request* handle, MPI_Request* inner);

/// Statistics (STREAMCOLL_STATS): the clock calls are timed with (ns, monotonic).
uint64_t stats_clock();
/// Statistics: records a call of `c` that ran on `route` over `mem` (`bytes`, CallKey
/// convention) since `t0` (stats_clock), and what streamcoll_last_route then says (the
/// route with `choice`'s parameters where `choice` chose it). Thread-safe.
void record_call(Coll c, bool nonblocking, RouteId route, MemKind mem, uint64_t bytes,
                 uint64_t t0, const config::RouteChoice* choice);

/// The route (table syntax, with its parameters: "ht algo=rd") that this thread's last
/// dispatched call went to; kept while statistics are on, empty before the first call.
std::string& last_route_text();

}  // namespace streamcoll
