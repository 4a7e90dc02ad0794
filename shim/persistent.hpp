// Persistent collectives (MPI 4.0: MPI_Allreduce_init ... MPI_Start, MPI_Startall; Open MPI
// 4.1: MPIX_*_init), routed by streamcoll. shim/persistent.cpp holds the wrappers and the
// table of streamcoll's persistent requests; this is what the wait/test family
// (shim/requests.cpp) needs of it.
//
// The request handed to the application is persistent on the MPI's side as well, so that
// an inactive one behaves exactly as MPI says wherever it goes (a wait or test returns at
// once with an empty status, MPI_Waitany skips it, MPI_Request_get_status sets flag):
// for the pmpi route the MPI's own persistent collective request; for a route of
// streamcoll's, a stand-in that is never started (a persistent receive from
// MPI_PROC_NULL, which holds the communicator as the MPI's request would). While it is
// active, the operation a start began runs on a request of its own (a route's
// generalized request, or the MPI's non-blocking form); the wait/test family hands the
// MPI that request in the handle's place (Substituted), and gives the application its
// persistent handle back, inactive once the operation's request completed: a persistent
// handle never becomes MPI_REQUEST_NULL.
#pragma once

#include <mpi.h>

#include <atomic>
#include <utility>
#include <vector>

namespace streamcoll::persistent {

/// streamcoll's persistent requests alive (planned at an init, not yet freed), and those
/// active (started, their operation's request not yet completed). The wrappers look
/// nothing up while these are 0.
extern std::atomic<int> g_planned;
extern std::atomic<int> g_active;
inline bool any_planned() { return g_planned.load(std::memory_order_acquire) != 0; }
inline bool any_active() { return g_active.load(std::memory_order_acquire) != 0; }

/// The request of the operation running for `handle`, an active persistent request of
/// streamcoll's; MPI_REQUEST_NULL for any other handle.
MPI_Request running(MPI_Request handle);
/// `handle`'s operation is complete and its request freed by the MPI: the handle is
/// inactive again (it may be started anew).
void finished(MPI_Request handle);

/// An array of requests as the MPI is to see it: each active persistent request of
/// streamcoll's replaced by its operation's request (one lookup under one lock).
class Substituted {
 public:
  Substituted(int n, const MPI_Request* requests);
  bool any() const { return !subs_.empty(); }
  MPI_Request* data() { return v_.data(); }
  /// Writes the array back: each replaced position gets its persistent handle again
  /// (made inactive when the call completed and freed its operation's request), every
  /// other position what the call left in it.
  void restore(MPI_Request* requests);

 private:
  std::vector<MPI_Request> v_;
  std::vector<std::pair<int, MPI_Request>> subs_;  // (position, persistent handle)
};

/// MPI_Request_free of `*handle`, when it is one of streamcoll's persistent requests
/// (true; *rc what the call returns): an inactive one releases its plan and the MPI's
/// request; an active one is an error (MPI_ERR_REQUEST, raised through its
/// communicator's error handler; MPI 4.0 makes freeing an active persistent collective
/// request erroneous). False for any other handle.
bool free_request(MPI_Request* handle, int* rc);

}  // namespace streamcoll::persistent
