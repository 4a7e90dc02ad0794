// The one entry point every collective wrapper calls.
#pragma once

#include "algorithms/pmpi.hpp"
#include "core/coll_args.hpp"
#include "core/runtime.hpp"

namespace streamcoll {

/// Routes and runs one intercepted call; returns what the MPI call returns.
int dispatch_routed(const CollArgs& a);

/// The fast path, inlined into each wrapper: when nothing can route the call and no
/// argument needs screening (see dispatch_routed), the real call, directly.
inline int dispatch(const CollArgs& a) {
  if ((g_passthrough.load(std::memory_order_relaxed) >> static_cast<int>(a.coll) & 1u) &&
      a.comm != MPI_COMM_NULL && !has_null_pointer(a) && a.recvcounts == nullptr &&
      (a.request != nullptr || !a.nonblocking))
    return run_pmpi(a);
  return dispatch_routed(a);
}

}  // namespace streamcoll
