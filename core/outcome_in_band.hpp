// The staging outcome carried in band (core/host_staging.hpp): a small blocking allreduce or
// reduce carries every rank's staging outcome as one more element of its own message, and a
// small blocking bcast or allgather as a status byte beside its data, instead of a separate
// exchange before the call (service.hpp's any()). Host staging's own service collective:
// which form a call takes is decided from what MPI makes equal on every rank (the call's
// count, datatype, op and size), so every rank takes the same one.
// Thread safety: as the MPI's collectives on the call's communicator.
#pragma once

#include <cstdint>

#include "core/coll_args.hpp"
#include "core/datatypes.hpp"
#include "core/host_staging.hpp"

namespace streamcoll::host_staging {

/// The in-band form a call takes, from what MPI makes equal on every rank: a reduction's
/// flag (its "fine" value, 0 or 1, for `type`) or a bcast/allgather's block bytes; neither
/// (taken() false): the separate exchange.
struct InBand {
  const TypeInfo* type = nullptr;
  int fine = -1;
  uint64_t block = 0;
  bool taken() const { return fine >= 0 || block > 0; }
};
/// The in-band form of `a` (blocking calls only) on a communicator of `size` ranks.
InBand in_band_form(const CollArgs& a, int size);

/// Runs `b` (the call `a` on this rank's staged buffers, or `a` itself) in form `f` with this
/// rank's outcome `own` (MPI_SUCCESS: its input is staged) and `readable` (its result can be
/// written back): the call's result written to b's buffers only when every rank's outcome
/// is fine; otherwise every rank that gets a result reports an error (raised through a's
/// communicator's handler). Returns the MPI error code.
int call_in_band(const InBand& f, const CollArgs& a, const CollArgs& b, int own, bool readable,
                 int rank, int size);

/// A blocking call whose buffers the dispatcher found in host memory (`known`), with the
/// outcomes in band: nothing to stage. False where it does not apply; else true, with the
/// call's result in *rc.
bool host_in_band(const CollArgs& a, int own, const KnownKinds* known, int* rc);

}  // namespace streamcoll::host_staging
