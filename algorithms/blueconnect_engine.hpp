// Route blueconnect on host (or pinned) buffers: a call's stages on backends sched and mpi,
// on the calling thread or the progress engine (blueconnect_engine.cpp). Internal to the
// route's files.
#pragma once

#include <memory>
#include <vector>

#include "algorithms/blueconnect_comm.hpp"
#include "core/coll_args.hpp"

namespace streamcoll::bc_detail {

/// Runs `a` (allreduce, reduce_scatter_block or allgather on host buffers) on `lay` of
/// `bc`, each level on its backend (sched or mpi): a blocking call on this thread, an
/// MPI_I* on the progress engine, its request in *a.request. Returns an MPI error code.
int run_host(const CollArgs& a, const std::shared_ptr<BcComm>& bc,
             const std::shared_ptr<Layout>& lay, const std::vector<Backend>& backends,
             bool ring_only);

}  // namespace streamcoll::bc_detail
