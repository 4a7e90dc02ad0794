// Repacking: a non-blocking MPI_Ibcast, MPI_Iallgather or MPI_Ialltoall whose data this
// rank describes with a derived datatype.
//
// MPI requires the ranks of a bcast or gather-like call to pass equal type signatures,
// not equal datatypes: one rank may send n MPI_INTs where another describes the same n
// ints with MPI_Type_contiguous or a strided vector. A blocking call agrees on such
// differences (shim/dispatch.cpp); a non-blocking one cannot agree (starting it must not
// wait), so it is routed from an earlier agreement, and a rank whose own description the
// route cannot carry adapts here: its data is copied into contiguous host memory described
// with the signature's basic datatype (the predefined type the others pass, whose
// repetition the signature is), the call runs on that through the same routing, and the
// received data is unpacked into the caller's buffers before the request completes.
// Every rank of a signature finds the same basic type, so the repacked call is the one
// the other ranks make. Copies between layouts are MPI's own (a self MPI_Sendrecv on
// MPI_COMM_SELF); GPU buffers are read and written through host copies of their spans.
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

/// Whether a call must be repacked to be routed: a non-blocking bcast, allgather or
/// alltoall with data, whose send or receive datatype on this rank is not a predefined
/// contiguous type.
bool needed(const CollArgs& a);

/// Runs `a` as `inner(b)`, where `b` is the same call on contiguous host copies described
/// with basic_of(); *a.request is a streamcoll-owned request that completes once b's has
/// and the data is unpacked (its error: b's, or an unpacking failure). Returns inner's
/// result, or an error code of its own when reading a GPU buffer fails (this rank then
/// still takes part, so that no rank waits for it, with zeros for the input it could not
/// read, and reports the error; the other ranks cannot learn of it: docs/design.md, limits).
int run(const CollArgs& a, const std::function<int(const CollArgs&)>& inner);

}  // namespace streamcoll::repack
