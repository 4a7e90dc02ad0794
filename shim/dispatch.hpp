// The entry points every collective wrapper uses.
#pragma once

#include <mpi.h>

#include <string>

#include "core/coll_args.hpp"
#include "core/runtime.hpp"

namespace streamcoll {

/// The pass-through fast path, checked by each wrapper before anything else: when it
/// holds, the wrapper tail-calls the PMPI_ function itself. It holds when nothing can
/// route the collective (g_passthrough) and the arguments need no screening by
/// streamcoll (a valid communicator, non-null buffers, a request for a non-blocking
/// call; v-variants never take it, their counts are screened in dispatch()).
inline bool pass_through(Coll c, MPI_Comm comm, const void* sendbuf, const void* recvbuf) {
  return (g_passthrough.load(std::memory_order_relaxed) >> static_cast<int>(c) & 1u) &&
         comm != MPI_COMM_NULL && sendbuf != nullptr && recvbuf != nullptr;
}

/// Everything else: screens, classifies, routes and runs one call, and records its
/// statistics; returns what the MPI call returns. shim/dispatch.cpp.
int dispatch(const CollArgs& a);

/// The route (table syntax, with its parameters: "ht algo=rd") that this thread's last
/// dispatched call went to; kept while statistics are on, empty before the first call.
std::string& last_route_text();

}  // namespace streamcoll
