// STREAMCOLL_CHECK: every rank of a communicator must choose the same route and see the
// same memory kind for a call, or the job deadlocks or computes garbage. The check adds
// one allreduce of (x, -x) with MPI_MAX per call, which yields the largest and smallest
// choice over the ranks, and aborts the job with a message when they differ.
//
// Blocking calls are checked at once with PMPI_Allreduce. Starting a non-blocking
// collective must stay a local operation, so for those the check is a PMPI_Iallreduce on
// the same communicator (all ranks insert it at the same point of their call sequence,
// so it matches), verified later: polled at every checked call, and waited for at the
// next blocking checked call and at MPI_Finalize. Thread-safe.
#pragma once

#include <mpi.h>

#include "core/types.hpp"

namespace streamcoll {

/// Checks (or starts checking) that all ranks of `comm` chose `route` on `mem` for this
/// call. `rank` is this rank in `comm`. Aborts on disagreement.
void check_agreement(MPI_Comm comm, Coll coll, bool nonblocking, RouteId route, MemKind mem,
                     int rank);

/// What one rank knows of a call that other ranks may see differently (MPI lets ranks
/// pass different memory kinds, call from different language bindings, describe the
/// same type signature with different datatypes, and each rank has its own GPU).
struct LocalFacts {
  MemKind mem = MemKind::host;  ///< kind of this rank's significant buffers (or mixed)
  bool ineligible = false;      ///< no route but pmpi can take this rank's arguments
  bool stream = false;          ///< this rank's communicator carries a stream attribute
  uint32_t unable = 0;          ///< bit per RouteId: the route cannot run here (local check)
};

/// The facts of a call agreed over the communicator: equal on every rank.
struct AgreedFacts {
  bool valid = false;           ///< set by agree_call (false: never agreed)
  bool routable = false;        ///< every rank can take a route other than pmpi
  MemKind mem = MemKind::host;  ///< the kind every rank passes (mixed when they differ)
  bool stream = false;          ///< every rank's communicator carries a stream
  uint32_t unable = 0;          ///< bit per RouteId: some rank cannot run the route
  const char* why = "";         ///< when !routable: the reason, for the log
};

/// Agrees on `mine` over `comm` (`size` ranks): one PMPI_Allreduce (MPI_BOR) of eight
/// ints, none when size == 1. Collective and blocking: call it only at a point every
/// rank of `comm` reaches (a blocking collective that every rank routes the same way).
/// On an MPI failure the result is not routable (the MPI raises its own error in the
/// call that follows).
AgreedFacts agree_call(MPI_Comm comm, int size, const LocalFacts& mine);

/// STREAMCOLL_CHECK, before anything collective of streamcoll's own: verifies that every
/// rank sees the same rank-invariant inputs of a blocking call (collective, bytes, root,
/// whether it may leave pmpi). Aborts the job with a message on a divergence.
void check_inputs(MPI_Comm comm, Coll coll, uint64_t bytes, int root, bool candidate, int rank);

/// Waits for every pending non-blocking check. Collective over the communicators that have
/// one pending; called from Runtime::stop() at MPI_Finalize.
void finish_agreement_checks();

}  // namespace streamcoll
