// pmpi: the real MPI call, unchanged. Inline, because it is also the pass-through fast
// path of every wrapper: with the collective known at compile time, the switch folds
// away and a wrapper costs a few loads and compares over the PMPI_ call itself.
#pragma once

#include <mpi.h>

#include "core/coll_args.hpp"

namespace streamcoll {

/// The real PMPI_ call for `a`, unchanged: its result, its errors, its request.
inline int run_pmpi(const CollArgs& a) {
  if (a.fortran) return a.fortran->run(a.fortran);
  if (a.nonblocking) {
    switch (a.coll) {
      case Coll::allreduce:
        return PMPI_Iallreduce(a.sendbuf, a.recvbuf, a.count, a.datatype, a.op, a.comm,
                               a.request);
      case Coll::reduce:
        return PMPI_Ireduce(a.sendbuf, a.recvbuf, a.count, a.datatype, a.op, a.root, a.comm,
                            a.request);
      case Coll::bcast:
        return PMPI_Ibcast(a.recvbuf, a.count, a.datatype, a.root, a.comm, a.request);
      case Coll::allgather:
        return PMPI_Iallgather(a.sendbuf, a.sendcount, a.sendtype, a.recvbuf, a.recvcount,
                               a.recvtype, a.comm, a.request);
      case Coll::allgatherv:
        return PMPI_Iallgatherv(a.sendbuf, a.sendcount, a.sendtype, a.recvbuf, a.recvcounts,
                                a.displs, a.recvtype, a.comm, a.request);
      case Coll::reduce_scatter_block:
        return PMPI_Ireduce_scatter_block(a.sendbuf, a.recvbuf, a.count, a.datatype, a.op,
                                          a.comm, a.request);
      case Coll::reduce_scatter:
        return PMPI_Ireduce_scatter(a.sendbuf, a.recvbuf, a.recvcounts, a.datatype, a.op,
                                    a.comm, a.request);
      case Coll::alltoall:
        return PMPI_Ialltoall(a.sendbuf, a.sendcount, a.sendtype, a.recvbuf, a.recvcount,
                              a.recvtype, a.comm, a.request);
      case Coll::barrier:
        return PMPI_Ibarrier(a.comm, a.request);
    }
  }
  switch (a.coll) {
    case Coll::allreduce:
      return PMPI_Allreduce(a.sendbuf, a.recvbuf, a.count, a.datatype, a.op, a.comm);
    case Coll::reduce:
      return PMPI_Reduce(a.sendbuf, a.recvbuf, a.count, a.datatype, a.op, a.root, a.comm);
    case Coll::bcast:
      return PMPI_Bcast(a.recvbuf, a.count, a.datatype, a.root, a.comm);
    case Coll::allgather:
      return PMPI_Allgather(a.sendbuf, a.sendcount, a.sendtype, a.recvbuf, a.recvcount,
                            a.recvtype, a.comm);
    case Coll::allgatherv:
      return PMPI_Allgatherv(a.sendbuf, a.sendcount, a.sendtype, a.recvbuf, a.recvcounts,
                             a.displs, a.recvtype, a.comm);
    case Coll::reduce_scatter_block:
      return PMPI_Reduce_scatter_block(a.sendbuf, a.recvbuf, a.count, a.datatype, a.op, a.comm);
    case Coll::reduce_scatter:
      return PMPI_Reduce_scatter(a.sendbuf, a.recvbuf, a.recvcounts, a.datatype, a.op, a.comm);
    case Coll::alltoall:
      return PMPI_Alltoall(a.sendbuf, a.sendcount, a.sendtype, a.recvbuf, a.recvcount,
                           a.recvtype, a.comm);
    case Coll::barrier:
      return PMPI_Barrier(a.comm);
  }
  return MPI_ERR_INTERN;
}

}  // namespace streamcoll
