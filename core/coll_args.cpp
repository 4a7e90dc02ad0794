// A call's validity, buffers and size, read from its collective's row
// (base/colls.def, core/coll_shape.hpp).
#include "core/coll_args.hpp"

#include "core/coll_shape.hpp"

namespace streamcoll {

namespace {
bool uses_count(const CollTraits& t) {
  return t.send == Ext::count || t.send == Ext::count_p || t.recv == Recv::vector;
}
bool uses_counts_array(const CollTraits& t) {
  return t.send == Ext::sum_counts || t.recv == Recv::my_count || t.recv == Recv::vblocks;
}
}  // namespace

bool obviously_invalid(const CollArgs& a) {
  if (a.comm == MPI_COMM_NULL || (a.nonblocking && a.request == nullptr)) return true;
  const CollTraits& t = traits(a.coll);
  if (t.types == Types::none) return false;
  if (t.op && a.op == MPI_OP_NULL) return true;
  if (uses_counts_array(t) && a.recvcounts == nullptr) return true;
  if (t.recv == Recv::vblocks && a.displs == nullptr) return true;
  if (t.types == Types::one) return a.datatype == MPI_DATATYPE_NULL || (uses_count(t) && a.count < 0);
  if (a.recvtype == MPI_DATATYPE_NULL || (t.recv == Recv::blocks && a.recvcount < 0)) return true;
  return a.sendbuf != MPI_IN_PLACE && (a.sendcount < 0 || a.sendtype == MPI_DATATYPE_NULL);
}

namespace {
// Calls fn(ptr, bytes) for every buffer the call reads or writes on this rank, skipping
// MPI_IN_PLACE and insignificant ones (recvbuf of a non-root reduce).
template <class Fn>
void visit_buffers(const CollArgs& a, int rank, int size, int sts, int rts, Fn fn) {
  const CollTraits& t = traits(a.coll);
  if (t.send != Ext::none && significant(t.send_at, a, rank) && !in_place_here(a, rank))
    fn(a.sendbuf, elements(t.send, a, size) * coll_detail::u(sts));
  if (const uint64_t n = recv_elements(a, rank, size); n > 0 || significant(t.recv_at, a, rank))
    if (t.recv != Recv::none) fn(a.recvbuf, n * coll_detail::u(rts));
}
}  // namespace

int significant_buffers(const CollArgs& a, int rank, int size, int sts, int rts,
                        BufferUse out[2]) {
  int n = 0;
  visit_buffers(a, rank, size, sts, rts, [&](const void* p, uint64_t bytes) {
    if (p != nullptr && bytes > 0) out[n++] = BufferUse{p, bytes};
  });
  return n;
}

bool null_data_buffer(const CollArgs& a, int rank, int size, int sts, int rts) {
  bool null = false;
  visit_buffers(a, rank, size, sts, rts, [&](const void* p, uint64_t bytes) {
    null = null || (p == nullptr && bytes > 0);
  });
  return null;
}

uint64_t call_bytes(const CollArgs& a, int size, int sts, int rts) {
  const CollTraits& t = traits(a.coll);
  return elements(t.table, a, size) * coll_detail::u(t.types == Types::one ? sts : rts);
}

}  // namespace streamcoll
