// pmpi: the real MPI call, unchanged. The fallback for everything, and the route for
// host buffers in the default table. Cost: whatever the MPI library's own algorithm costs.
#include "algorithms/route.hpp"

namespace streamcoll {

int run_pmpi(const CollArgs& a) {
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

namespace {
class PmpiRoute final : public Route {
 public:
  RouteId id() const override { return RouteId::pmpi; }
  bool accepts(const CollArgs&, const CommContext&, const config::RouteChoice&) const override {
    return true;
  }
  int run(const CollArgs& a, CommContext&, const config::RouteChoice&) override {
    return run_pmpi(a);
  }
};
}  // namespace

Route* pmpi_route() {
  static PmpiRoute r;
  return &r;
}

}  // namespace streamcoll
