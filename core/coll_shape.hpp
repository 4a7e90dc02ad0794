// A call's shape, read from its collective's row (base/coll_traits.hpp): the elements
// its counts name, the ranges of recvbuf it writes, where its input lies. Every count is
// in elements (of the send type for `send`, of the receive type, which is `datatype` for
// one-type collectives, for everything else); byte sizes are the callers', from the type
// sizes. Pure: no MPI call, no driver. Thread-safe.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cstdint>

#include "base/coll_traits.hpp"
#include "core/coll_args.hpp"

namespace streamcoll {

namespace coll_detail {
inline uint64_t u(int v) { return v > 0 ? static_cast<uint64_t>(v) : 0; }
inline uint64_t sum_counts(const int* counts, int size) {
  uint64_t n = 0;
  for (int i = 0; i < size; ++i) n += u(counts[i]);
  return n;
}
}  // namespace coll_detail

/// The elements `e` counts for call `a` on a communicator of `size` ranks (negative
/// counts read as 0).
inline uint64_t elements(Ext e, const CollArgs& a, int size) {
  using coll_detail::u;
  switch (e) {
    case Ext::none: return 0;
    case Ext::count: return u(a.count);
    case Ext::count_p: return u(a.count) * u(size);
    case Ext::sum_counts: return coll_detail::sum_counts(a.recvcounts, size);
    case Ext::sendcount: return u(a.sendcount);
    case Ext::sendcount_p: return u(a.sendcount) * u(size);
    case Ext::recvcount_p: return u(a.recvcount) * u(size);
  }
  return 0;
}

/// Whether a buffer significant at `w` is significant on `rank` of call `a`.
inline bool significant(Where w, const CollArgs& a, int rank) {
  return w == Where::all || (w == Where::root) == (rank == a.root);
}

/// Whether `a` runs in place on `rank`: sendbuf MPI_IN_PLACE where the collective has an
/// in-place form and recvbuf is significant (a reduce's non-root ranks read sendbuf).
inline bool in_place_here(const CollArgs& a, int rank) {
  const CollTraits& t = traits(a.coll);
  return a.sendbuf == MPI_IN_PLACE && t.in_place != Input::none && t.in_place != Input::at_root &&
         significant(t.recv_at, a, rank);
}

/// Calls fn(first, n) for each range of recvbuf the call writes on `rank` (receive-type
/// elements; nothing where recvbuf is not significant), in rank order.
template <class Fn>
void for_each_result(const CollArgs& a, int rank, int size, Fn fn) {
  const CollTraits& t = traits(a.coll);
  if (!significant(t.recv_at, a, rank)) return;
  switch (t.recv) {
    case Recv::none: return;
    case Recv::vector: return fn(int64_t{0}, int64_t{a.count});
    case Recv::my_count: return fn(int64_t{0}, int64_t{a.recvcounts[rank]});
    case Recv::blocks: return fn(int64_t{0}, int64_t{a.recvcount} * size);
    case Recv::vblocks:
      for (int i = 0; i < size; ++i) fn(int64_t{a.displs[i]}, int64_t{a.recvcounts[i]});
      return;
  }
}

/// Where this rank's input lies in the receive layout (receive-type elements: first, n):
/// in recvbuf when the call runs in place, and where a staged copy puts sendbuf's
/// elements otherwise. n = 0: the rank has no input (a bcast's non-root).
struct ElemRange {
  int64_t first = 0, n = 0;
};
inline ElemRange input_region(const CollArgs& a, int rank, int size) {
  const CollTraits& t = traits(a.coll);
  switch (t.in_place) {
    case Input::none: return {};
    case Input::at_root: return rank == a.root ? ElemRange{0, a.count} : ElemRange{};
    case Input::send_region: return {0, static_cast<int64_t>(elements(t.send, a, size))};
    case Input::own_block:
      if (t.recv == Recv::vblocks) return {a.displs[rank], a.recvcounts[rank]};
      return {int64_t{rank} * a.recvcount, a.recvcount};
    case Input::out:
      break;
  }
  ElemRange r;  // the whole result region: one range for vector and blocks
  const int64_t n = t.recv == Recv::vector ? a.count : int64_t{a.recvcount} * size;
  r.n = n;
  return r;
}

/// The extent of recvbuf on `rank` that the call touches (receive-type elements from 0):
/// the result, and in place (or at a bcast's root) the input. 0 where it touches none.
inline uint64_t recv_elements(const CollArgs& a, int rank, int size) {
  const CollTraits& t = traits(a.coll);
  const bool out = significant(t.recv_at, a, rank);
  const bool in = in_place_here(a, rank) || (t.in_place == Input::at_root && rank == a.root);
  if (!out && !in) return 0;
  uint64_t n = 0;
  if (out) {
    if (t.recv == Recv::vblocks) n = coll_detail::sum_counts(a.recvcounts, size);
    else if (t.recv == Recv::my_count) n = coll_detail::u(a.recvcounts[rank]);
    else n = t.recv == Recv::vector ? coll_detail::u(a.count) : elements(Ext::recvcount_p, a, size);
  }
  if (in) {
    const ElemRange r = input_region(a, rank, size);
    if (r.first + r.n > 0) n = std::max(n, static_cast<uint64_t>(r.first + r.n));
  }
  return n;
}

}  // namespace streamcoll
