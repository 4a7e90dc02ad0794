// A collective described once (its row in base/colls.def): the buffers it reads and
// writes on each rank, in elements of which datatype, where its input lies in place, and
// the size the tuning table counts. Every layer that needs one of these reads it here
// (core/coll_args.cpp: validity, buffers, size; core/staging.cpp: the staged layout;
// core/host_staging.cpp: the host copies' extents; shim/dispatch.cpp: the datatypes),
// instead of a switch on the collective of its own. What stays per collective is its
// binding (shim/collectives.cpp, shim/fortran.cpp, core/pmpi_call.hpp) and each route's
// own operation.
//
// The call-level reading of a row (the elements of a call, its ranges) is
// core/coll_shape.hpp. Units: elements, never bytes. Thread-safe (constants).
#pragma once

#include <cstdint>

#include "base/types.hpp"

namespace streamcoll {

/// The datatypes a collective takes: none (barrier), one (`datatype`: the reductions and
/// bcast, for both sides), two (`sendtype` and `recvtype`).
enum class Types : uint8_t { none, one, two };
/// A number of elements, from the call's counts: count, count * ranks, the sum of
/// recvcounts, sendcount, sendcount * ranks, recvcount * ranks.
enum class Ext : uint8_t { none, count, count_p, sum_counts, sendcount, sendcount_p, recvcount_p };
/// The ranges of recvbuf the call writes (receive-type elements): none; vector (`count`
/// from 0); my_count (recvcounts[rank] from 0); blocks (recvcount per rank, in rank
/// order, one contiguous range); vblocks (recvcounts[i] at displs[i] for each rank i).
enum class Recv : uint8_t { none, vector, my_count, blocks, vblocks };
/// The ranks where a buffer is significant.
enum class Where : uint8_t { all, root, non_root };
/// With sendbuf MPI_IN_PLACE, where the input lies in recvbuf: none (no in-place form);
/// out (the whole result region); own_block (this rank's block of it); send_region (the
/// first `send` elements); at_root (bcast: the buffer itself is the root's input).
enum class Input : uint8_t { none, out, own_block, send_region, at_root };

struct CollTraits {
  Types types;
  bool op, rooted;
  Ext send;
  Where send_at;
  Recv recv;
  Where recv_at;
  Input in_place;
  Ext table;
};

namespace coll_row {
enum class Flag : uint8_t { no, op, root };
}  // namespace coll_row

inline constexpr CollTraits kCollTraits[kNumColls] = {
#define COLL(id, types, op, rooted, send, send_at, recv, recv_at, in_place, table)      \
  CollTraits{Types::types,       coll_row::Flag::op != coll_row::Flag::no,              \
             coll_row::Flag::rooted != coll_row::Flag::no, Ext::send, Where::send_at, \
             Recv::recv,         Where::recv_at, Input::in_place, Ext::table},
#include "base/colls.def"
#undef COLL
};

inline const CollTraits& traits(Coll c) { return kCollTraits[static_cast<int>(c)]; }

/// True for the collectives that take an MPI_Op.
inline bool takes_op(Coll c) { return traits(c).op; }
/// True for the collectives that have a root.
inline bool rooted(Coll c) { return traits(c).rooted; }
/// The collectives whose one `datatype` describes both sides (the reductions, bcast).
inline bool one_type(Coll c) { return traits(c).types == Types::one; }

}  // namespace streamcoll
