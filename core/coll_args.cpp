#include "core/coll_args.hpp"

namespace streamcoll {

bool obviously_invalid(const CollArgs& a) {
  if (a.comm == MPI_COMM_NULL || (a.nonblocking && a.request == nullptr)) return true;
  switch (a.coll) {
    case Coll::barrier:
      return false;
    case Coll::allreduce:
    case Coll::reduce:
    case Coll::bcast:
    case Coll::reduce_scatter_block:
      if (a.count < 0 || a.datatype == MPI_DATATYPE_NULL) return true;
      return takes_op(a.coll) && a.op == MPI_OP_NULL;
    case Coll::reduce_scatter:
      return a.recvcounts == nullptr || a.datatype == MPI_DATATYPE_NULL || a.op == MPI_OP_NULL;
    case Coll::allgather:
    case Coll::alltoall:
      if (a.sendcount < 0 || a.recvcount < 0) return true;
      if (a.recvtype == MPI_DATATYPE_NULL) return true;
      return a.sendbuf != MPI_IN_PLACE && a.sendtype == MPI_DATATYPE_NULL;
    case Coll::allgatherv:
      if (a.recvcounts == nullptr || a.displs == nullptr) return true;
      if (a.recvtype == MPI_DATATYPE_NULL) return true;
      if (a.sendbuf != MPI_IN_PLACE && (a.sendcount < 0 || a.sendtype == MPI_DATATYPE_NULL))
        return true;
      return false;
  }
  return true;
}

namespace {
uint64_t sum_counts(const int* counts, int size) {
  uint64_t n = 0;
  for (int i = 0; i < size; ++i) n += counts[i] > 0 ? static_cast<uint64_t>(counts[i]) : 0;
  return n;
}
uint64_t u(int v) { return v > 0 ? static_cast<uint64_t>(v) : 0; }

// Calls fn(ptr, bytes) for every buffer the call reads or writes on this rank, skipping
// MPI_IN_PLACE and insignificant ones (recvbuf of a non-root reduce).
template <class Fn>
void visit_buffers(const CollArgs& a, int rank, int size, int sts, int rts, Fn fn) {
  const bool in_place = a.sendbuf == MPI_IN_PLACE;
  switch (a.coll) {
    case Coll::barrier:
      break;
    case Coll::allreduce:
      if (!in_place) fn(a.sendbuf, u(a.count) * u(sts));
      fn(a.recvbuf, u(a.count) * u(sts));
      break;
    case Coll::reduce:
      // MPI_IN_PLACE is only meaningful at the root; recvbuf only matters there.
      if (!(in_place && rank == a.root)) fn(a.sendbuf, u(a.count) * u(sts));
      if (rank == a.root) fn(a.recvbuf, u(a.count) * u(sts));
      break;
    case Coll::bcast:
      fn(a.recvbuf, u(a.count) * u(sts));
      break;
    case Coll::reduce_scatter_block:
      if (!in_place) fn(a.sendbuf, u(a.count) * u(size) * u(sts));
      fn(a.recvbuf, (in_place ? u(a.count) * u(size) : u(a.count)) * u(sts));
      break;
    case Coll::reduce_scatter: {
      uint64_t total = sum_counts(a.recvcounts, size);
      if (!in_place) fn(a.sendbuf, total * u(sts));
      fn(a.recvbuf, (in_place ? total : u(a.recvcounts[rank])) * u(sts));
      break;
    }
    case Coll::allgather:
      if (!in_place) fn(a.sendbuf, u(a.sendcount) * u(sts));
      fn(a.recvbuf, u(a.recvcount) * u(size) * u(rts));
      break;
    case Coll::allgatherv:
      if (!in_place) fn(a.sendbuf, u(a.sendcount) * u(sts));
      fn(a.recvbuf, sum_counts(a.recvcounts, size) * u(rts));
      break;
    case Coll::alltoall:
      if (!in_place) fn(a.sendbuf, u(a.sendcount) * u(size) * u(sts));
      fn(a.recvbuf, u(a.recvcount) * u(size) * u(rts));
      break;
  }
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
  switch (a.coll) {
    case Coll::barrier: return 0;
    case Coll::allreduce:
    case Coll::reduce:
    case Coll::bcast: return u(a.count) * u(sts);
    case Coll::reduce_scatter_block: return u(a.count) * u(size) * u(sts);
    case Coll::reduce_scatter: return sum_counts(a.recvcounts, size) * u(sts);
    case Coll::allgather: return u(a.recvcount) * u(size) * u(rts);
    case Coll::allgatherv: return sum_counts(a.recvcounts, size) * u(rts);
    case Coll::alltoall: return u(a.recvcount) * u(size) * u(rts);
  }
  return 0;
}

}  // namespace streamcoll
