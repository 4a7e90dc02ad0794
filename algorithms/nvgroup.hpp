// Route nvgroup's stage interface, for routes that run its kernels as a stage of their own
// (blueconnect: an NVLink group as the innermost level of a hierarchy). See
// algorithms/nvgroup.cpp. Only in builds with the kernels (STREAMCOLL_HAVE_NVGROUP).
#pragma once

#include "core/coll_args.hpp"
#include "core/comm_context.hpp"

namespace streamcoll::nvgroup_stage {

/// Whether the kernels take `a`'s datatype and op (allreduce, reduce_scatter_block:
/// int8..float64, float16/bfloat16; sum, prod, min, max) or its element size
/// (allgather). Pure: no set-up, no communication.
bool supports(const CollArgs& a);

/// This rank cannot take its part in `a` (a blocking allreduce, reduce_scatter_block or
/// allgather on `ctx`, where route nvgroup is set up): the rounds the call would have
/// taken are given up, so the peers' kernels go on without this rank and report the call
/// failed (their status words). Nothing happens where the route is not set up.
void give_up(CommContext& ctx, const CollArgs& a);

/// Whether a kernel of this rank on `ctx` saw a failure since the last time asked (its
/// status word, cleared here): the caller reports it. Read it once the kernels are done
/// (a classic call, after its stream); false where the route is not set up.
bool take_failure(CommContext& ctx);

}  // namespace streamcoll::nvgroup_stage
