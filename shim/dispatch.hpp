// The one entry point every collective wrapper calls.
#pragma once

#include "core/coll_args.hpp"

namespace streamcoll {

/// Routes and runs one intercepted call; returns what the MPI call returns.
int dispatch(const CollArgs& a);

}  // namespace streamcoll
