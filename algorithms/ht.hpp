// Route ht's stage interface, for routes that run its collectives as a stage of their own
// (blueconnect's levels). See algorithms/ht.cpp, "Failures stay collective".
#pragma once

#include "algorithms/route.hpp"

namespace streamcoll::ht_stage {

/// This rank cannot produce its input for `a` on `ctx` (route ht set up there; a GPU call
/// as agreed, `env` as the call would have run with): its part of the host collective
/// runs anyway, on scratch memory, marked unusable, so that the peers are neither left
/// waiting nor handed garbage as data (their results report Failure::peer). Runs on the
/// progress engine (on this thread when there is none); never blocks on the peers.
void stand_in(CommContext& ctx, const CollArgs& a, const CallEnv& env);

}  // namespace streamcoll::ht_stage
