// Requests that streamcoll owns. A route that completes a non-blocking collective itself
// hands the application a real MPI_Request: a generalized request (MPI_Grequest_start)
// that it adopts here, so that owned and ordinary requests mix freely in one array of
// MPI_Wait*/MPI_Test*.
//
// MPI's progress rule. A wait may have to drive MPI's progress for other requests to
// complete: ordinary requests of the same array, or requests elsewhere in the process
// that a peer needs to progress before it can join the collective the wait is waiting
// for (rank 0: MPI_Iallreduce, MPI_Irecv, MPI_Waitall; rank 1: a rendezvous MPI_Send to
// rank 0, then MPI_Iallreduce). So the wait/test wrappers (shim/requests.cpp, and the
// Fortran bindings in shim/fortran.cpp) never block inside streamcoll: they poll, giving
// each owned request on_test() and driving MPI's progress (PMPI_Iprobe, or a PMPI_ test
// form on the ordinary requests), until the PMPI_ wait form can return at once or has
// only ordinary requests left to wait for; then they call that wait form itself, so that
// statuses, indices, errors (MPI_ERR_IN_STATUS), MPI_UNDEFINED and null or inactive
// requests are exactly the MPI's.
//
// Contract for an OwnedRequest:
//  - it says in completed() when the operation is done (set from any thread), and
//    completes its request (MPI_Grequest_complete) in settle(), which only the thread
//    about to ask the MPI about the handle calls (advance(): the wrappers, or an owner
//    polling a request of its own), never the engine thread behind the application's
//    back: MPICH 4.0 (ch4) frees the request inside MPI_Grequest_complete, and that raced
//    an MPI_Wait on the application's thread (assertions "pool == 0", "ref_count >= 0"
//    in host-routes-preload-np1, a few runs in 40). It stays alive until the generalized
//    request's free function runs, and that free function forgets the handle
//    (requests::take) before MPI may reuse it (ManagedRequest does all of this);
//  - on_test() never blocks (no host wait for the GPU, for the progress engine or for
//    MPI) and, called repeatedly, completes the request eventually: it is all the wait
//    wrappers give it. A stream-ordered request completes in its first on_test() by
//    making the stream wait (the host does not wait for the GPU);
//  - on_wait() may block until the operation is done; no wait or test wrapper calls it
//    (blocking there could starve MPI's progress, see above). It remains for owners'
//    own use (e.g. from on_free);
//  - on_free() (MPI_Request_free) runs once the request is complete (the wrapper has
//    polled it as a wait would), just before the MPI frees the handle.
// Thread-safe: adopt/take/peek/find may be called concurrently from any thread.
#pragma once

#include <mpi.h>

#include <atomic>
#include <vector>

namespace streamcoll {

class OwnedRequest {
 public:
  virtual ~OwnedRequest() = default;
  /// Completes the operation, blocking the calling thread if need be. Not called by the
  /// wait/test wrappers (see the contract above).
  virtual void on_wait() = 0;
  /// MPI_Wait*/MPI_Test*/MPI_Request_get_status on this request: advance without ever
  /// blocking; repeated calls complete it eventually (e.g. query an event, or make the
  /// attached stream wait and complete at once).
  virtual void on_test() = 0;
  /// MPI_Request_free: the handle is given up, after the request was polled to
  /// completion; release what must go with the handle.
  virtual void on_free() {}
  /// The error code MPI_Wait/MPI_Test report for this request once it is complete.
  virtual int error() const { return MPI_SUCCESS; }
  /// Whether the operation is done (its owner's part; the MPI hears of it in settle()).
  /// Never blocks. The wrappers poll this rather than ask the MPI
  /// (MPI_Request_get_status runs the query function early, and an error it returns
  /// makes Open MPI 4.1's MPI_Waitall spin forever under MPI_THREAD_MULTIPLE).
  virtual bool completed() const = 0;
  /// Once completed(): completes the MPI's request (MPI_Grequest_complete), on the
  /// calling thread, which is about to ask the MPI about the handle. Idempotent.
  virtual void settle() {}
  /// What a caller about to test or wait for the handle with a PMPI_ call does first, on
  /// its own thread: on_test(), then settle() once the operation is done. Returns whether
  /// it settled: the MPI's request is complete (completed() alone may turn true on
  /// another thread right after, before anything settled it).
  bool advance() {
    on_test();
    if (!completed()) return false;
    settle();
    return true;
  }
};

/// An OwnedRequest whose generalized request streamcoll starts (requests::start) and
/// which MPI deletes, through the request's free function, once the application has
/// waited for it (or freed it) and it is complete.
class ManagedRequest : public OwnedRequest {
 public:
  /// Marks the operation done (its results and error() are final); from any thread.
  /// The MPI's request completes in settle(), on the thread that next advances it.
  void complete() { completed_.store(true, std::memory_order_release); }
  bool completed() const override { return completed_.load(std::memory_order_acquire); }
  /// MPI_Grequest_complete, once, after complete(). Thread-safe.
  void settle() override;
  MPI_Request handle() const { return handle_; }

 private:
  friend int start_request(ManagedRequest* op, MPI_Request* out);
  MPI_Request handle_ = MPI_REQUEST_NULL;
  std::atomic<bool> completed_{false};
  std::atomic<bool> settled_{false};
};

/// Starts a generalized request owned by `op`, adopts it (requests::adopt) and stores it
/// in *out. Returns an MPI error code; on failure `op` is deleted.
int start_request(ManagedRequest* op, MPI_Request* out);

/// A request that is complete when it is returned (a generalized request started and
/// completed at once, owned by no one: MPI frees it at the application's wait), for a
/// non-blocking call whose operation is already done or ordered on a stream (a call
/// recorded into a CUDA graph, a one-rank communicator's copy). Its status is empty.
/// Returns an MPI error code.
int start_completed_request(MPI_Request* out);

namespace requests {

/// Number of owned requests alive; the wrappers skip all lookups when it is 0.
extern std::atomic<int> g_owned;
inline bool any_owned() { return g_owned.load(std::memory_order_acquire) != 0; }

/// Registers `op` as the owner of `req`.
void adopt(MPI_Request req, OwnedRequest* op);
/// The owner of `req`, or nullptr; the entry stays.
OwnedRequest* peek(MPI_Request req);
/// Forgets `req` (from its free function, before MPI may reuse the handle); returns its
/// owner or nullptr.
OwnedRequest* take(MPI_Request req);

/// An owned request of an array: its position, its owner, and whether it has been seen
/// complete.
struct Owned {
  int index;
  OwnedRequest* op;
  bool done;
};
/// The owned requests among reqs[0, n), in array order (one lookup under one lock).
std::vector<Owned> find(int n, const MPI_Request* reqs);

/// Polite polling: spins a little, then yields the core at each pause (a progress thread
/// or the GPU driver's threads may need it), and sleeps a few microseconds once a wait
/// has gone on for long.
class Backoff {
 public:
  void pause();

 private:
  unsigned n_ = 0;
};

/// Drives MPI's progress once, with no other effect: PMPI_Iprobe(MPI_ANY_SOURCE,
/// MPI_ANY_TAG) on MPI_COMM_WORLD (it matches nothing). On MPI_COMM_SELF it progressed
/// Open MPI but not MPICH 4.0, whose waits on streamcoll's requests then hung.
void progress();
/// One round of polling, never blocking: advance() to each owned request not yet seen
/// complete, then progress(). Returns the number of requests of `owned` complete.
int poll(std::vector<Owned>& owned);
/// Polls (backing off) until every request of `owned` is complete.
void complete_all(std::vector<Owned>& owned);
/// The same for one owned request.
void complete_one(OwnedRequest* op);

}  // namespace requests
}  // namespace streamcoll
