// Route blueconnect on GPU buffers: each level's stage on a route (nccl, nvgroup, ht) of
// its sub-communicator, or a host schedule (blueconnect_gpu.cpp). Internal to the route's
// files; only in builds with CUDA and NCCL.
#pragma once

#include "algorithms/blueconnect_comm.hpp"
#include "algorithms/route.hpp"
#include "config/tuning_table.hpp"
#include "core/coll_args.hpp"
#include "core/comm_context.hpp"

#if STREAMCOLL_HAVE_CUDA && STREAMCOLL_HAVE_NCCL

#include <memory>
#include <vector>

namespace streamcoll::bc_detail {

/// The route a level's stages run on for backend `b` (nccl, nvgroup, ht), or null.
Route* stage_route(Backend b);

/// Collective over the communicator (a blocking call; bc.mu held): the sub-communicators
/// and their contexts (once per layout), then each level's route set up on its
/// sub-communicator (once per level and backend), every outcome agreed, so that every
/// rank answers alike. Then, per call, whether each level's route takes the call's stage
/// (its datatype and op), a local answer from agreed state. True when every level can run.
bool gpu_levels(Layout& lay, BcComm& bc, const CollArgs& a, const CallEnv& env,
                const std::vector<Backend>& backends, const config::RouteChoice& choice);

/// One call on GPU buffers on the levels' GPU, classic or stream-ordered (GpuCall).
int run_gpu(const CollArgs& a, BcComm& bc, const std::shared_ptr<Layout>& lay_ptr,
            const CallEnv& env, const std::vector<Backend>& backends, bool ring_only,
            const config::RouteChoice& choice);

/// A call on GPU facts whose buffers here are not on the levels' GPU: staged through
/// scratch there and run as a classic call on this rank.
int run_gpu_staged(const CollArgs& a, BcComm& bc, const std::shared_ptr<Layout>& lay,
                   const CallEnv& env, const std::vector<Backend>& backends, bool ring_only,
                   const config::RouteChoice& choice);

}  // namespace streamcoll::bc_detail

#endif  // STREAMCOLL_HAVE_CUDA && STREAMCOLL_HAVE_NCCL
