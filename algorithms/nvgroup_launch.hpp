// Route nvgroup's calls on a group: the kernel's parameters and rounds, its launch, a
// staged call (nvgroup_launch.cpp). Internal to the route's files.
#pragma once

#include <cstdint>
#include <memory>

#include "algorithms/nvgroup_group.hpp"
#include "algorithms/nvgroup_kernel.hpp"
#include "algorithms/route.hpp"
#include "core/coll_args.hpp"
#include "core/comm_context.hpp"

namespace streamcoll::nvgroup_detail {

// The kernel's parameters for `a` on `g`, all but the addresses; *rounds: how many.
nvgroup::Params shape_of(const CollArgs& a, const Group& g, uint64_t* rounds);

// Rounds [seq, seq + rounds) for the next call, in call order (equal on every rank).
uint64_t reserve(Group& g, uint64_t rounds);

// A rank's part staged through scratch on the group's GPU (nvgroup_launch.cpp).
struct Staged;

// One call's kernel on this rank (the route's run(), algorithms/nvgroup.cpp, for buffers
// the group's GPU reaches; `staged`: the scratch of a staged call, whose results it brings
// back). The forms of the file comment: classic, attached, MPI_I* classic or
// stream-ordered.
int launch(const CollArgs& a, const CallEnv& env, std::shared_ptr<Group> g,
           std::shared_ptr<Staged> staged);

// A call whose buffers here are not on the group's GPU (Staged): the input copied to
// scratch on the classic stream, after the application's work on the buffers' GPUs and on
// the stream attached here, then the kernel as a classic call on this rank (the host
// waits for a blocking call, as for any call on buffers it must find final at return; an
// MPI_I* completes once the results are back). A failure before the kernel still takes
// this call's rounds (launch: input_failure), so the peers' kernels go on without it.
int run_staged(const CollArgs& a, CommContext& ctx, const CallEnv& env,
               std::shared_ptr<Group> g);

}  // namespace streamcoll::nvgroup_detail
