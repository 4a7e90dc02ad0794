// Service collectives: the small agreements streamcoll itself runs over a communicator
// (UCC's ucc_service_allreduce is the model): whether every rank is ready, whether any
// rank failed, whether all ranks hold the same value. Written once here; every route and
// layer that must decide alike on all ranks uses them.
//
// Each is one MPI_Allreduce (or MPI_Iallreduce) on `comm` as every rank of it calls it,
// in the same order relative to the other collectives on `comm`: collective, like the
// call they serve. The MPI_ calls go to the MPI (PMPI_), never through streamcoll again.
// A failed exchange reads as the answer that stops: not all ready, some rank failed, not
// equal (the MPI reports its own error as well; a rank whose exchange failed may then
// differ from its peers, which the MPI's error handler, not streamcoll, resolves).
// Thread safety: as the MPI's collectives on `comm`.
#pragma once

#include <mpi.h>

#include <cstdint>

namespace streamcoll::service {

/// Whether `mine` is true on every rank of `comm` (MPI_MIN over one int). Blocking; false
/// when the exchange fails. With `rc`, the MPI's error code of the exchange.
bool all(bool mine, MPI_Comm comm, int* rc = nullptr);

/// Whether `mine` is true on some rank of `comm` (MPI_MAX over one int): a failure flag.
/// Blocking; true when the exchange fails.
bool any(bool mine, MPI_Comm comm);

/// Whether every rank of `comm` passes the same `v` (MPI_MAX over {v, -v}). Blocking;
/// false when the exchange fails. With `agreed`, the largest value passed (v itself when
/// all are equal); untouched when the exchange fails.
bool all_equal(int64_t v, MPI_Comm comm, int64_t* agreed = nullptr);

/// The range of each of `n` (1..kMaxRanges) values over the ranks of `comm`: lo[i] and hi[i]
/// the smallest and largest v[i] (one MPI_Allreduce of 2n values under MPI_MAX: {v, -v}).
/// Blocking, no allocation. Returns the MPI's error code (lo and hi untouched on failure;
/// MPI_ERR_COUNT, with no exchange, for n out of range).
inline constexpr int kMaxRanges = 8;
int ranges(const int64_t* v, int n, MPI_Comm comm, int64_t* lo, int64_t* hi);

/// A non-blocking service collective's storage: this rank's flag and the agreed one. It
/// must stay where it is until the request completes.
struct Flag {
  int mine = 0;
  int agreed = 0;
};

/// Starts the exchange of any() (MPI_MAX) on `f`, or all() (MPI_MIN) with `all`: `f->mine`
/// is set from `mine`, f->agreed holds the answer once *req completes (before, the answer
/// that stops nothing: any() 0, all() 1). Returns the MPI's error code; on failure *req is
/// MPI_REQUEST_NULL and f->agreed already reads as any()'s or all()'s failed answer (1, 0).
int start_any(bool mine, MPI_Comm comm, Flag* f, MPI_Request* req);
int start_all(bool mine, MPI_Comm comm, Flag* f, MPI_Request* req);

}  // namespace streamcoll::service
