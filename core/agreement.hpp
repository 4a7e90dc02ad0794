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

/// Waits for every pending non-blocking check. Collective over the communicators that have
/// one pending; called from Runtime::stop() at MPI_Finalize.
void finish_agreement_checks();

}  // namespace streamcoll
