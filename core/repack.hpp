// Repacking: an MPI_Bcast, MPI_Allgather or MPI_Alltoall (blocking or not) whose data
// this rank describes with a derived datatype, routed from an earlier agreement.
//
// MPI requires the ranks of a bcast or gather-like call to pass equal type signatures,
// not equal datatypes: one rank may send n MPI_INTs where another describes the same n
// ints with MPI_Type_contiguous or a strided vector. A blocking call that agrees at once
// sees such differences (shim/dispatch.cpp); a non-blocking one cannot agree (starting it
// must not wait), and a blocking one may decide from its signature's earlier agreements
// (core/agreement.hpp), so such a call is routed from facts agreed earlier, and a rank
// whose own description the route cannot carry adapts here: its data is copied into
// contiguous host memory described with the signature's basic datatype (the predefined
// type the others pass, whose repetition the signature is), the call runs on that
// through the same route, and the received data is unpacked into the caller's buffers
// before the request completes (before a blocking call returns). Every rank of a
// signature finds the same basic type, so the repacked call is the one the other ranks
// make, and a route asked about it (basic_view) answers alike everywhere. Copies between
// layouts are MPI's own (a self MPI_Sendrecv on MPI_COMM_SELF); GPU buffers are read and
// written through host copies of their spans, after the work on the communicator's stream
// where it has one (the caller waits for it: this rank's own adaptation).
#pragma once

#include <mpi.h>

#include <functional>

#include "core/coll_args.hpp"

namespace streamcoll::repack {

/// The contiguous predefined datatype whose repetition is `t`'s type signature: `t`
/// itself for such a type; the component of a pair type whose two components are alike
/// (MPI_2INT: MPI_INT); the one named type a derived type is built from; MPI_BYTE when
/// the signature mixes named types (every rank's signature mixes them alike) or names
/// one streamcoll does not know; MPI_DATATYPE_NULL when MPI cannot tell. The result is
/// never itself in need of repacking.
MPI_Datatype basic_of(MPI_Datatype t);

/// Whether a call must be repacked to be routed: a bcast, allgather or alltoall with data
/// (non-blocking: with a request), whose send or receive datatype on this rank is not a
/// predefined contiguous type.
bool needed(const CollArgs& a);

/// The call `a` (needed()) as repacking describes it, with the buffers left as they are:
/// basic_of()'s datatype and the counts in it, on every rank alike. What a route is asked
/// whether it accepts the call, where some rank describes its data its own way (the
/// answer must be equal everywhere). False when the call is not repacked.
bool basic_view(const CollArgs& a, CollArgs* view);

/// Runs `a` as `inner(b)`, where `b` is the same call on contiguous host copies described
/// with basic_of(); *a.request is a streamcoll-owned request that completes once b's has
/// and the data is unpacked (its error: b's, or an unpacking failure). Returns inner's
/// result, or an error code of its own when reading a GPU buffer fails (this rank then
/// still takes part, so that no rank waits for it, with zeros for the input it could not
/// read, and reports the error; the other ranks cannot learn of it: docs/design.md, limits).
/// `own`: a failure of this rank's found before (the stream synchronisation), taken as a
/// failure to read its input.
int run(const CollArgs& a, const std::function<int(const CollArgs&)>& inner,
        int own = MPI_SUCCESS);

/// The blocking form: `inner(b, own)` runs the repacked call, told in `own` whether this
/// rank's input could not be read (`own` given here, or a failed read), so that its route
/// fails the call on every rank rather than take part with data it does not have; the
/// result is unpacked into the caller's buffers before this returns. Returns inner's
/// result, or the unpacking's error (not raised: the caller raises what this returns).
int run_blocking(const CollArgs& a, const std::function<int(const CollArgs&, int)>& inner,
                 int own = MPI_SUCCESS);

}  // namespace streamcoll::repack
