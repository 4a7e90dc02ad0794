// Discovery of a communicator's link hierarchy (base/hierarchy.hpp says what a hierarchy
// is and how its levels and positions are laid out): NUMA via hwloc, node via
// MPI_Comm_split_type, switch/rack groups via STREAMCOLL_NODE_GROUPS.
#pragma once

#include <mpi.h>

#include <optional>
#include <string>

#include "base/hierarchy.hpp"

namespace streamcoll {
struct CommContext;
}

namespace streamcoll::topo {

/// Collective over ctx.comm (call at a blocking collective only): the discovered
/// hierarchy (numa, node, STREAMCOLL_NODE_GROUPS levels), or nullopt with *why. Printed
/// under STREAMCOLL_DEBUG=info. `device`: the CUDA device ordinal of this rank's buffers
/// (its NUMA node is the GPU's), or -1 for host buffers (the CPU binding's).
std::optional<Hierarchy> discover(const CommContext& ctx, int device, std::string* why);

}  // namespace streamcoll::topo
