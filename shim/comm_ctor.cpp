// The MPI calls that make a communicator from a parent, collectively over it: the MPI's
// own call, then, where the parent has route state a child can be derived from (an NCCL
// communicator: algorithms/nccl.cpp, "Communicators made from one with an NCCL
// communicator"), the child's, made here while every rank of the parent is in the call.
// A parent without such state costs one attribute lookup (its context) after the MPI's
// call; a process with no GPU in the job, none.
//
// Intercepted: MPI_Comm_dup, MPI_Comm_split, MPI_Comm_create, MPI_Cart_create,
// MPI_Cart_sub, MPI_Graph_create, MPI_Dist_graph_create, MPI_Dist_graph_create_adjacent,
// and (shim/comm_info.cpp) MPI_Comm_dup_with_info and MPI_Comm_split_type. Not derived,
// so the child sets up at its first GPU call as any communicator does:
//   - MPI_Comm_idup, MPI_Comm_idup_with_info: non-blocking, nothing collective may run at
//     their start;
//   - MPI_Comm_create_group, MPI_Intercomm_create, MPI_Intercomm_merge: only the new
//     group's ranks (or two groups of an inter-communicator, which gets no routes) take
//     part, not every rank of a parent with an NCCL communicator;
//   - calls through Open MPI's Fortran bindings, which call PMPI_ directly.
// A call that fails on this rank derives nothing: the MPI raised the error (a constructor
// that fails on some ranks only leaves the program erroneous anyway).
#include <mpi.h>

#include "algorithms/route.hpp"
#include "core/comm_context.hpp"
#include "core/next_mpi.hpp"
#include "core/runtime.hpp"
#include "shim/dispatch.hpp"
#include "shim/export.hpp"

namespace streamcoll {

// After the MPI's own constructor on `parent` returned `rc` and `child`.
void derive_child(MPI_Comm parent, int rc, MPI_Comm child) {
  if (rc != MPI_SUCCESS || g_in_binding || parent == MPI_COMM_NULL) return;
  Runtime& rt = Runtime::get();
  if (!rt.active() || !rt.job_gpu()) return;
  CommContext* ctx = comm_context(parent, false);
  if (ctx && !ctx->inter) routes_derive(*ctx, child);
}

}  // namespace streamcoll

using streamcoll::derive_child;

SC_EXPORT int MPI_Comm_dup(MPI_Comm comm, MPI_Comm* newcomm) {
  const int rc = SC_NEXT(MPI_Comm_dup)(comm, newcomm);
  derive_child(comm, rc, *newcomm);
  return rc;
}

SC_EXPORT int MPI_Comm_split(MPI_Comm comm, int color, int key, MPI_Comm* newcomm) {
  const int rc = SC_NEXT(MPI_Comm_split)(comm, color, key, newcomm);
  derive_child(comm, rc, *newcomm);
  return rc;
}

SC_EXPORT int MPI_Comm_create(MPI_Comm comm, MPI_Group group, MPI_Comm* newcomm) {
  const int rc = SC_NEXT(MPI_Comm_create)(comm, group, newcomm);
  derive_child(comm, rc, *newcomm);
  return rc;
}

SC_EXPORT int MPI_Cart_create(MPI_Comm comm, int ndims, const int dims[], const int periods[],
                              int reorder, MPI_Comm* newcomm) {
  const int rc = SC_NEXT(MPI_Cart_create)(comm, ndims, dims, periods, reorder, newcomm);
  derive_child(comm, rc, *newcomm);
  return rc;
}

SC_EXPORT int MPI_Cart_sub(MPI_Comm comm, const int remain_dims[], MPI_Comm* newcomm) {
  const int rc = SC_NEXT(MPI_Cart_sub)(comm, remain_dims, newcomm);
  derive_child(comm, rc, *newcomm);
  return rc;
}

SC_EXPORT int MPI_Graph_create(MPI_Comm comm, int nnodes, const int index[], const int edges[],
                               int reorder, MPI_Comm* newcomm) {
  const int rc = SC_NEXT(MPI_Graph_create)(comm, nnodes, index, edges, reorder, newcomm);
  derive_child(comm, rc, *newcomm);
  return rc;
}

SC_EXPORT int MPI_Dist_graph_create(MPI_Comm comm, int n, const int sources[],
                                    const int degrees[], const int destinations[],
                                    const int weights[], MPI_Info info, int reorder,
                                    MPI_Comm* newcomm) {
  const int rc = SC_NEXT(MPI_Dist_graph_create)(comm, n, sources, degrees, destinations,
                                                weights, info, reorder, newcomm);
  derive_child(comm, rc, *newcomm);
  return rc;
}

SC_EXPORT int MPI_Dist_graph_create_adjacent(MPI_Comm comm, int indegree, const int sources[],
                                             const int sourceweights[], int outdegree,
                                             const int destinations[], const int destweights[],
                                             MPI_Info info, int reorder, MPI_Comm* newcomm) {
  const int rc = SC_NEXT(MPI_Dist_graph_create_adjacent)(comm, indegree, sources, sourceweights,
                                                         outdegree, destinations, destweights,
                                                         info, reorder, newcomm);
  derive_child(comm, rc, *newcomm);
  return rc;
}
