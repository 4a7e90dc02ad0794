// The entry points every collective wrapper uses.
#pragma once

#include <mpi.h>

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

/// Everything else: screens, classifies, routes and runs one call, and records its
/// statistics; returns what the MPI call returns. shim/dispatch.cpp.
int dispatch(const CollArgs& a);

/// The route (table syntax, with its parameters: "ht algo=rd") that this thread's last
/// dispatched call went to; kept while statistics are on, empty before the first call.
std::string& last_route_text();

}  // namespace streamcoll
