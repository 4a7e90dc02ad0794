// Route nvgroup's collective set-up on a communicator (nvgroup_setup.cpp). Internal to the
// route's files.
#pragma once

#include "algorithms/nvgroup_group.hpp"
#include "algorithms/route.hpp"
#include "config/tuning_table.hpp"
#include "core/comm_context.hpp"

namespace streamcoll::nvgroup_detail {

// The collective set-up (file comment). Every rank of ctx reaches it at the same call.
// Leaves st ready, with its group, or off.
void set_up(NvgroupState& st, const CallEnv& env, const CommContext& ctx,
            const config::RouteChoice& choice);

}  // namespace streamcoll::nvgroup_detail
