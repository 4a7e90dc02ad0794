// The collective wrappers: take the pass-through fast path when it holds (one atomic load
// and a few compares, then a tail call to the next MPI_ definition: another PMPI tool's,
// or the MPI's; core/next_mpi.hpp), then, for the common blocking calls, the steady path
// (a decision remembered for the same arguments: shim/steady.hpp; its key built here,
// with the collective known at compile time), otherwise translate the arguments for the
// dispatcher. Routing is in shim/dispatch.cpp.
#include <mpi.h>

#include "core/next_mpi.hpp"
#include "shim/dispatch.hpp"
#include "shim/export.hpp"
#include "shim/steady.hpp"

using streamcoll::Coll;
using streamcoll::CollArgs;
using streamcoll::dispatch;
using streamcoll::gather_counts;
using streamcoll::pass_through;
namespace steady = streamcoll::steady;

namespace {

CollArgs reduction(Coll c, const void* sendbuf, void* recvbuf, int count, MPI_Datatype dt,
                   MPI_Op op, MPI_Comm comm, MPI_Request* req, bool nb) {
  CollArgs a;
  a.coll = c;
  a.nonblocking = nb;
  a.sendbuf = sendbuf;
  a.recvbuf = recvbuf;
  a.count = count;
  a.datatype = dt;
  a.op = op;
  a.comm = comm;
  a.request = req;
  return a;
}

CollArgs gather_like(Coll c, const void* sendbuf, int sendcount, MPI_Datatype sendtype,
                     void* recvbuf, int recvcount, MPI_Datatype recvtype, MPI_Comm comm,
                     MPI_Request* req, bool nb) {
  CollArgs a;
  a.coll = c;
  a.nonblocking = nb;
  a.sendbuf = sendbuf;
  a.sendcount = sendcount;
  a.sendtype = sendtype;
  a.recvbuf = recvbuf;
  a.recvcount = recvcount;
  a.recvtype = recvtype;
  a.comm = comm;
  a.request = req;
  return a;
}

int allreduce(const void* s, void* r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c,
              MPI_Request* q, bool nb) {
  return dispatch(reduction(Coll::allreduce, s, r, n, t, op, c, q, nb));
}
int reduce(const void* s, void* r, int n, MPI_Datatype t, MPI_Op op, int root, MPI_Comm c,
           MPI_Request* q, bool nb) {
  CollArgs a = reduction(Coll::reduce, s, r, n, t, op, c, q, nb);
  a.root = root;
  return dispatch(a);
}
int bcast(void* buf, int n, MPI_Datatype t, int root, MPI_Comm c, MPI_Request* q, bool nb) {
  CollArgs a = reduction(Coll::bcast, nullptr, buf, n, t, MPI_OP_NULL, c, q, nb);
  a.root = root;
  return dispatch(a);
}
int reduce_scatter_block(const void* s, void* r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c,
                         MPI_Request* q, bool nb) {
  return dispatch(reduction(Coll::reduce_scatter_block, s, r, n, t, op, c, q, nb));
}
int reduce_scatter(const void* s, void* r, const int counts[], MPI_Datatype t, MPI_Op op,
                   MPI_Comm c, MPI_Request* q, bool nb) {
  CollArgs a = reduction(Coll::reduce_scatter, s, r, 0, t, op, c, q, nb);
  a.recvcounts = counts;
  return dispatch(a);
}
int allgatherv(const void* s, int sn, MPI_Datatype st, void* r, const int counts[],
               const int displs[], MPI_Datatype rt, MPI_Comm c, MPI_Request* q, bool nb) {
  CollArgs a = gather_like(Coll::allgatherv, s, sn, st, r, 0, rt, c, q, nb);
  a.recvcounts = counts;
  a.displs = displs;
  return dispatch(a);
}
int barrier(MPI_Comm c, MPI_Request* q, bool nb) {
  CollArgs a;
  a.coll = Coll::barrier;
  a.nonblocking = nb;
  a.comm = c;
  a.request = q;
  return dispatch(a);
}

// The blocking calls past the pass-through fast path: the steady path (shim/steady.hpp),
// else the dispatcher. steady::hit() first, inline, whose success makes no call but the
// MPI's (a tail call: no registers saved); else the *_slow function, out of line:
// steady::enter() (stack buffers, facts to write, a fusion group to close), then the
// dispatcher. Kept out of the wrappers, so that the pass-through stays a tail jump.
[[gnu::noinline]] int allreduce_slow(const void* s, void* r, int n, MPI_Datatype t, MPI_Op op,
                                     MPI_Comm c) {
  if (steady::enter(steady::reduction_key(Coll::allreduce, c, n, t, op, 0, s), s, r))
    return SC_NEXT(MPI_Allreduce)(s, r, n, t, op, c);
  return allreduce(s, r, n, t, op, c, nullptr, false);
}
int allreduce_blocking(const void* s, void* r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c) {
  if (steady::hit(steady::reduction_key(Coll::allreduce, c, n, t, op, 0, s), s, r))
    return SC_NEXT(MPI_Allreduce)(s, r, n, t, op, c);
  return allreduce_slow(s, r, n, t, op, c);
}
[[gnu::noinline]] int reduce_slow(const void* s, void* r, int n, MPI_Datatype t, MPI_Op op,
                                  int root, MPI_Comm c) {
  if (steady::enter(steady::reduction_key(Coll::reduce, c, n, t, op, root, s), s, r))
    return SC_NEXT(MPI_Reduce)(s, r, n, t, op, root, c);
  return reduce(s, r, n, t, op, root, c, nullptr, false);
}
int reduce_blocking(const void* s, void* r, int n, MPI_Datatype t, MPI_Op op, int root,
                    MPI_Comm c) {
  if (steady::hit(steady::reduction_key(Coll::reduce, c, n, t, op, root, s), s, r))
    return SC_NEXT(MPI_Reduce)(s, r, n, t, op, root, c);
  return reduce_slow(s, r, n, t, op, root, c);
}
[[gnu::noinline]] int bcast_slow(void* buf, int n, MPI_Datatype t, int root, MPI_Comm c) {
  if (steady::enter(steady::reduction_key(Coll::bcast, c, n, t, MPI_OP_NULL, root, nullptr),
                    nullptr, buf))
    return SC_NEXT(MPI_Bcast)(buf, n, t, root, c);
  return bcast(buf, n, t, root, c, nullptr, false);
}
int bcast_blocking(void* buf, int n, MPI_Datatype t, int root, MPI_Comm c) {
  if (steady::hit(steady::reduction_key(Coll::bcast, c, n, t, MPI_OP_NULL, root, nullptr),
                  nullptr, buf))
    return SC_NEXT(MPI_Bcast)(buf, n, t, root, c);
  return bcast_slow(buf, n, t, root, c);
}
[[gnu::noinline]] int reduce_scatter_block_slow(const void* s, void* r, int n, MPI_Datatype t,
                                                MPI_Op op, MPI_Comm c) {
  if (steady::enter(steady::reduction_key(Coll::reduce_scatter_block, c, n, t, op, 0, s), s, r))
    return SC_NEXT(MPI_Reduce_scatter_block)(s, r, n, t, op, c);
  return reduce_scatter_block(s, r, n, t, op, c, nullptr, false);
}
int reduce_scatter_block_blocking(const void* s, void* r, int n, MPI_Datatype t, MPI_Op op,
                                  MPI_Comm c) {
  if (steady::hit(steady::reduction_key(Coll::reduce_scatter_block, c, n, t, op, 0, s), s, r))
    return SC_NEXT(MPI_Reduce_scatter_block)(s, r, n, t, op, c);
  return reduce_scatter_block_slow(s, r, n, t, op, c);
}
// allgather and alltoall (one shape of arguments): the MPI's call, and the slow path.
template <Coll C>
int gather_mpi(const void* s, int sn, MPI_Datatype st, void* r, int rn, MPI_Datatype rt,
               MPI_Comm c) {
  return C == Coll::allgather ? SC_NEXT(MPI_Allgather)(s, sn, st, r, rn, rt, c)
                              : SC_NEXT(MPI_Alltoall)(s, sn, st, r, rn, rt, c);
}
template <Coll C>
[[gnu::noinline]] int gather_slow(const void* s, int sn, MPI_Datatype st, void* r, int rn,
                                  MPI_Datatype rt, MPI_Comm c) {
  if (steady::enter(steady::gather_key(C, c, s, sn, st, rn, rt), s, r))
    return gather_mpi<C>(s, sn, st, r, rn, rt, c);
  return dispatch(gather_like(C, s, sn, st, r, rn, rt, c, nullptr, false));
}
template <Coll C>
int gather_blocking(const void* s, int sn, MPI_Datatype st, void* r, int rn, MPI_Datatype rt,
                    MPI_Comm c) {
  if (steady::hit(steady::gather_key(C, c, s, sn, st, rn, rt), s, r))
    return gather_mpi<C>(s, sn, st, r, rn, rt, c);
  return gather_slow<C>(s, sn, st, r, rn, rt, c);
}
[[gnu::noinline]] int allgather_blocking(const void* s, int sn, MPI_Datatype st, void* r,
                                         int rn, MPI_Datatype rt, MPI_Comm c) {
  return gather_blocking<Coll::allgather>(s, sn, st, r, rn, rt, c);
}
[[gnu::noinline]] int alltoall_blocking(const void* s, int sn, MPI_Datatype st, void* r, int rn,
                                        MPI_Datatype rt, MPI_Comm c) {
  return gather_blocking<Coll::alltoall>(s, sn, st, r, rn, rt, c);
}

}  // namespace

// Blocking.
SC_EXPORT int MPI_Allreduce(const void* sendbuf, void* recvbuf, int count,
                            MPI_Datatype datatype, MPI_Op op, MPI_Comm comm) {
  if (pass_through(Coll::allreduce, comm, sendbuf, recvbuf, count))
    return SC_NEXT(MPI_Allreduce)(sendbuf, recvbuf, count, datatype, op, comm);
  return allreduce_blocking(sendbuf, recvbuf, count, datatype, op, comm);
}
SC_EXPORT int MPI_Reduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype datatype,
                         MPI_Op op, int root, MPI_Comm comm) {
  if (pass_through(Coll::reduce, comm, sendbuf, recvbuf, count))
    return SC_NEXT(MPI_Reduce)(sendbuf, recvbuf, count, datatype, op, root, comm);
  return reduce_blocking(sendbuf, recvbuf, count, datatype, op, root, comm);
}
SC_EXPORT int MPI_Bcast(void* buffer, int count, MPI_Datatype datatype, int root, MPI_Comm comm) {
  if (pass_through(Coll::bcast, comm, buffer, buffer, count))
    return SC_NEXT(MPI_Bcast)(buffer, count, datatype, root, comm);
  return bcast_blocking(buffer, count, datatype, root, comm);
}
SC_EXPORT int MPI_Allgather(const void* sendbuf, int sendcount, MPI_Datatype sendtype,
                            void* recvbuf, int recvcount, MPI_Datatype recvtype, MPI_Comm comm) {
  if (pass_through(Coll::allgather, comm, sendbuf, recvbuf,
                   gather_counts(sendbuf, sendcount, recvcount)))
    return SC_NEXT(MPI_Allgather)(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm);
  return allgather_blocking(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm);
}
SC_EXPORT int MPI_Allgatherv(const void* sendbuf, int sendcount, MPI_Datatype sendtype,
                             void* recvbuf, const int recvcounts[], const int displs[],
                             MPI_Datatype recvtype, MPI_Comm comm) {
  return allgatherv(sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs, recvtype, comm,
                    nullptr, false);
}
SC_EXPORT int MPI_Reduce_scatter_block(const void* sendbuf, void* recvbuf, int recvcount,
                                       MPI_Datatype datatype, MPI_Op op, MPI_Comm comm) {
  if (pass_through(Coll::reduce_scatter_block, comm, sendbuf, recvbuf, recvcount))
    return SC_NEXT(MPI_Reduce_scatter_block)(sendbuf, recvbuf, recvcount, datatype, op, comm);
  return reduce_scatter_block_blocking(sendbuf, recvbuf, recvcount, datatype, op, comm);
}
SC_EXPORT int MPI_Reduce_scatter(const void* sendbuf, void* recvbuf, const int recvcounts[],
                                 MPI_Datatype datatype, MPI_Op op, MPI_Comm comm) {
  return reduce_scatter(sendbuf, recvbuf, recvcounts, datatype, op, comm, nullptr, false);
}
SC_EXPORT int MPI_Alltoall(const void* sendbuf, int sendcount, MPI_Datatype sendtype,
                           void* recvbuf, int recvcount, MPI_Datatype recvtype, MPI_Comm comm) {
  if (pass_through(Coll::alltoall, comm, sendbuf, recvbuf,
                   gather_counts(sendbuf, sendcount, recvcount)))
    return SC_NEXT(MPI_Alltoall)(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm);
  return alltoall_blocking(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm);
}
SC_EXPORT int MPI_Barrier(MPI_Comm comm) {
  if (pass_through(Coll::barrier, comm, &comm, &comm, 0)) return SC_NEXT(MPI_Barrier)(comm);
  return barrier(comm, nullptr, false);
}

// Non-blocking: the same, with a request (and no fast path without one).
SC_EXPORT int MPI_Iallreduce(const void* sendbuf, void* recvbuf, int count,
                             MPI_Datatype datatype, MPI_Op op, MPI_Comm comm,
                             MPI_Request* request) {
  if (request && pass_through(Coll::allreduce, comm, sendbuf, recvbuf, count))
    return SC_NEXT(MPI_Iallreduce)(sendbuf, recvbuf, count, datatype, op, comm, request);
  return allreduce(sendbuf, recvbuf, count, datatype, op, comm, request, true);
}
SC_EXPORT int MPI_Ireduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype datatype,
                          MPI_Op op, int root, MPI_Comm comm, MPI_Request* request) {
  if (request && pass_through(Coll::reduce, comm, sendbuf, recvbuf, count))
    return SC_NEXT(MPI_Ireduce)(sendbuf, recvbuf, count, datatype, op, root, comm, request);
  return reduce(sendbuf, recvbuf, count, datatype, op, root, comm, request, true);
}
SC_EXPORT int MPI_Ibcast(void* buffer, int count, MPI_Datatype datatype, int root, MPI_Comm comm,
                         MPI_Request* request) {
  if (request && pass_through(Coll::bcast, comm, buffer, buffer, count))
    return SC_NEXT(MPI_Ibcast)(buffer, count, datatype, root, comm, request);
  return bcast(buffer, count, datatype, root, comm, request, true);
}
SC_EXPORT int MPI_Iallgather(const void* sendbuf, int sendcount, MPI_Datatype sendtype,
                             void* recvbuf, int recvcount, MPI_Datatype recvtype, MPI_Comm comm,
                             MPI_Request* request) {
  if (request && pass_through(Coll::allgather, comm, sendbuf, recvbuf,
                              gather_counts(sendbuf, sendcount, recvcount)))
    return SC_NEXT(MPI_Iallgather)(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm,
                           request);
  return dispatch(gather_like(Coll::allgather, sendbuf, sendcount, sendtype, recvbuf, recvcount,
                              recvtype, comm, request, true));
}
SC_EXPORT int MPI_Iallgatherv(const void* sendbuf, int sendcount, MPI_Datatype sendtype,
                              void* recvbuf, const int recvcounts[], const int displs[],
                              MPI_Datatype recvtype, MPI_Comm comm, MPI_Request* request) {
  return allgatherv(sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs, recvtype, comm,
                    request, true);
}
SC_EXPORT int MPI_Ireduce_scatter_block(const void* sendbuf, void* recvbuf, int recvcount,
                                        MPI_Datatype datatype, MPI_Op op, MPI_Comm comm,
                                        MPI_Request* request) {
  if (request && pass_through(Coll::reduce_scatter_block, comm, sendbuf, recvbuf, recvcount))
    return SC_NEXT(MPI_Ireduce_scatter_block)(sendbuf, recvbuf, recvcount, datatype, op, comm, request);
  return reduce_scatter_block(sendbuf, recvbuf, recvcount, datatype, op, comm, request, true);
}
SC_EXPORT int MPI_Ireduce_scatter(const void* sendbuf, void* recvbuf, const int recvcounts[],
                                  MPI_Datatype datatype, MPI_Op op, MPI_Comm comm,
                                  MPI_Request* request) {
  return reduce_scatter(sendbuf, recvbuf, recvcounts, datatype, op, comm, request, true);
}
SC_EXPORT int MPI_Ialltoall(const void* sendbuf, int sendcount, MPI_Datatype sendtype,
                            void* recvbuf, int recvcount, MPI_Datatype recvtype, MPI_Comm comm,
                            MPI_Request* request) {
  if (request && pass_through(Coll::alltoall, comm, sendbuf, recvbuf,
                              gather_counts(sendbuf, sendcount, recvcount)))
    return SC_NEXT(MPI_Ialltoall)(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm,
                          request);
  return dispatch(gather_like(Coll::alltoall, sendbuf, sendcount, sendtype, recvbuf, recvcount,
                              recvtype, comm, request, true));
}
SC_EXPORT int MPI_Ibarrier(MPI_Comm comm, MPI_Request* request) {
  if (request && pass_through(Coll::barrier, comm, &comm, &comm, 0))
    return SC_NEXT(MPI_Ibarrier)(comm, request);
  return barrier(comm, request, true);
}
