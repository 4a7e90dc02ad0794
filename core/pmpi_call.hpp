// pmpi: the real MPI call, unchanged. Inline, because it is also the pass-through fast
// path of every wrapper: with the collective known at compile time, the switch folds
// away and a wrapper costs a few loads and compares over the PMPI_ call itself.
#pragma once

#include <mpi.h>

#include "core/coll_args.hpp"
#include "core/next_mpi.hpp"

namespace streamcoll {

/// The real call for `a`, unchanged: its result, its errors, its request. The next MPI_
/// definition (another PMPI tool's, else the MPI's: core/next_mpi.hpp).
inline int run_pmpi(const CollArgs& a) {
  if (a.fortran) return a.fortran->run(a.fortran);
  if (a.nonblocking) {
    switch (a.coll) {
      case Coll::allreduce:
        return SC_NEXT(MPI_Iallreduce)(a.sendbuf, a.recvbuf, a.count, a.datatype, a.op, a.comm,
                               a.request);
      case Coll::reduce:
        return SC_NEXT(MPI_Ireduce)(a.sendbuf, a.recvbuf, a.count, a.datatype, a.op, a.root, a.comm,
                            a.request);
      case Coll::bcast:
        return SC_NEXT(MPI_Ibcast)(a.recvbuf, a.count, a.datatype, a.root, a.comm, a.request);
      case Coll::allgather:
        return SC_NEXT(MPI_Iallgather)(a.sendbuf, a.sendcount, a.sendtype, a.recvbuf, a.recvcount,
                               a.recvtype, a.comm, a.request);
      case Coll::allgatherv:
        return SC_NEXT(MPI_Iallgatherv)(a.sendbuf, a.sendcount, a.sendtype, a.recvbuf, a.recvcounts,
                                a.displs, a.recvtype, a.comm, a.request);
      case Coll::reduce_scatter_block:
        return SC_NEXT(MPI_Ireduce_scatter_block)(a.sendbuf, a.recvbuf, a.count, a.datatype, a.op,
                                          a.comm, a.request);
      case Coll::reduce_scatter:
        return SC_NEXT(MPI_Ireduce_scatter)(a.sendbuf, a.recvbuf, a.recvcounts, a.datatype, a.op,
                                    a.comm, a.request);
      case Coll::alltoall:
        return SC_NEXT(MPI_Ialltoall)(a.sendbuf, a.sendcount, a.sendtype, a.recvbuf, a.recvcount,
                              a.recvtype, a.comm, a.request);
      case Coll::barrier:
        return SC_NEXT(MPI_Ibarrier)(a.comm, a.request);
    }
  }
  switch (a.coll) {
    case Coll::allreduce:
      return SC_NEXT(MPI_Allreduce)(a.sendbuf, a.recvbuf, a.count, a.datatype, a.op, a.comm);
    case Coll::reduce:
      return SC_NEXT(MPI_Reduce)(a.sendbuf, a.recvbuf, a.count, a.datatype, a.op, a.root, a.comm);
    case Coll::bcast:
      return SC_NEXT(MPI_Bcast)(a.recvbuf, a.count, a.datatype, a.root, a.comm);
    case Coll::allgather:
      return SC_NEXT(MPI_Allgather)(a.sendbuf, a.sendcount, a.sendtype, a.recvbuf, a.recvcount,
                            a.recvtype, a.comm);
    case Coll::allgatherv:
      return SC_NEXT(MPI_Allgatherv)(a.sendbuf, a.sendcount, a.sendtype, a.recvbuf, a.recvcounts,
                             a.displs, a.recvtype, a.comm);
    case Coll::reduce_scatter_block:
      return SC_NEXT(MPI_Reduce_scatter_block)(a.sendbuf, a.recvbuf, a.count, a.datatype, a.op, a.comm);
    case Coll::reduce_scatter:
      return SC_NEXT(MPI_Reduce_scatter)(a.sendbuf, a.recvbuf, a.recvcounts, a.datatype, a.op, a.comm);
    case Coll::alltoall:
      return SC_NEXT(MPI_Alltoall)(a.sendbuf, a.sendcount, a.sendtype, a.recvbuf, a.recvcount,
                           a.recvtype, a.comm);
    case Coll::barrier:
      return SC_NEXT(MPI_Barrier)(a.comm);
  }
  return MPI_ERR_INTERN;
}

}  // namespace streamcoll
