// The arguments of one intercepted collective call, in one shape for every collective.
#pragma once

#include <mpi.h>

#include <cstdint>

#include "base/coll_traits.hpp"
#include "base/types.hpp"

namespace streamcoll {

/// Field use per collective (elements, never bytes):
///   allreduce, reduce, bcast:   count, datatype (reduce: root; bcast: root, recvbuf is
///                               the buffer)
///   reduce_scatter_block:       count = elements each rank receives, datatype
///   reduce_scatter:             recvcounts[size], datatype
///   allgather, alltoall:        sendcount/sendtype, recvcount/recvtype (per rank)
///   allgatherv:                 sendcount/sendtype, recvcounts[size], displs[size], recvtype
///   barrier:                    comm only
struct CollArgs {
  Coll coll = Coll::barrier;
  bool nonblocking = false;
  const void* sendbuf = nullptr;
  void* recvbuf = nullptr;
  int count = 0;
  MPI_Datatype datatype = MPI_DATATYPE_NULL;
  int sendcount = 0;
  MPI_Datatype sendtype = MPI_DATATYPE_NULL;
  int recvcount = 0;
  MPI_Datatype recvtype = MPI_DATATYPE_NULL;
  const int* recvcounts = nullptr;
  const int* displs = nullptr;
  MPI_Op op = MPI_OP_NULL;
  int root = 0;
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Request* request = nullptr;  ///< non-blocking calls only
  /// The init of a persistent collective (MPI_Allreduce_init, ...: shim/persistent.cpp),
  /// decided as the non-blocking call its starts will be (`nonblocking` is set), at a
  /// point where collective set-up is allowed (collective_point()).
  bool persistent_init = false;
  /// Set for calls made through the Fortran bindings (shim/fortran.cpp): the MPI's own
  /// Fortran binding with the caller's original arguments, which the pmpi route runs
  /// instead of the C call so that Fortran handles, sentinels and ierr stay exact.
  const struct FortranCall* fortran = nullptr;
};

struct FortranCall {
  int (*run)(const FortranCall* self);  ///< runs the real Fortran call, returns its ierr
  MPI_Fint* request = nullptr;          ///< non-blocking calls: where the binding puts its request
};

/// Whether every rank of the communicator reaches this call alike, so that a route may run
/// collective set-up in Route::accepts: a blocking call, or the init of a persistent
/// collective (MPI 4.0, "Persistent Collective Operations": the init calls are non-local
/// and follow the ordering rules of collective operations). Never a non-blocking call's
/// start, nor a persistent collective's MPI_Start: those stay local.
inline bool collective_point(const CollArgs& a) { return !a.nonblocking || a.persistent_init; }

/// Arguments that MPI itself must reject (negative counts, null handles, a missing
/// request). Such calls go to PMPI_ unchanged so that the application sees the real
/// MPI's error class through its error handler.
bool obviously_invalid(const CollArgs& a);

/// True if the call has a null sendbuf or recvbuf pointer at all (cheap pre-check for
/// null_data_buffer; bcast's only buffer is recvbuf).
inline bool has_null_pointer(const CollArgs& a) {
  const CollTraits& t = traits(a.coll);
  return (t.recv != Recv::none && a.recvbuf == nullptr) ||
         (t.send != Ext::none && a.sendbuf == nullptr);
}

/// One buffer the call reads or writes on this rank, with its extent in bytes.
struct BufferUse {
  const void* ptr;
  uint64_t bytes;
};

/// The buffers that matter for memory classification on this rank: MPI_IN_PLACE,
/// zero-sized and insignificant buffers (recvbuf of a non-root reduce) are left out.
/// Fills at most 2 entries of `out`, returns how many. Element sizes in bytes come from
/// the caller (send and receive type sizes).
int significant_buffers(const CollArgs& a, int rank, int size, int send_type_size,
                        int recv_type_size, BufferUse out[2]);

/// True if a buffer that holds data on this rank is a null pointer. With a predefined
/// datatype that is always an error (MPI_ERR_BUFFER); some MPIs crash on it instead.
bool null_data_buffer(const CollArgs& a, int rank, int size, int send_type_size,
                      int recv_type_size);

/// The tuning-table size of the call (config::CallKey::bytes).
uint64_t call_bytes(const CollArgs& a, int size, int send_type_size, int recv_type_size);

}  // namespace streamcoll
