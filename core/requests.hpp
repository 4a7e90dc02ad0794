// Requests that streamcoll owns. A route that completes a non-blocking collective itself
// hands the application a real MPI_Request: a generalized request (MPI_Grequest_start)
// that it adopts here. The wait/test wrappers then give each owned request a chance to
// act (make a stream wait, or advance) before the real PMPI_ call, so that owned and
// ordinary requests mix freely in one array.
//
// Contract for an OwnedRequest: it calls MPI_Grequest_complete on its request when the
// operation is done, from any thread; on_wait() returns only once that has happened
// (or it has arranged for it to happen without the caller's help); it stays alive until
// the generalized request's free_fn runs (it owns itself from there).
// Thread-safe: adopt/take/peek may be called concurrently from any thread.
#pragma once

#include <mpi.h>

#include <atomic>

namespace streamcoll {

class OwnedRequest {
 public:
  virtual ~OwnedRequest() = default;
  /// MPI_Wait* on this request: complete it (e.g. enqueue the wait on a stream, or block
  /// until the progress engine is done), so that the PMPI_ wait that follows returns.
  virtual void on_wait() = 0;
  /// MPI_Test* on this request: advance without blocking.
  virtual void on_test() = 0;
  /// MPI_Request_free: the handle is given up; the operation must still complete.
  virtual void on_free() {}
  /// The error code MPI_Wait/MPI_Test report for this request once it is complete.
  virtual int error() const { return MPI_SUCCESS; }
};

/// An OwnedRequest whose generalized request streamcoll starts (requests::start) and
/// which MPI deletes, through the request's free function, once the application has
/// waited for it (or freed it) and it is complete.
class ManagedRequest : public OwnedRequest {
 public:
  /// Marks the request complete (MPI_Grequest_complete); later calls do nothing.
  /// Thread-safe.
  void complete();
  MPI_Request handle() const { return handle_; }

 private:
  friend int start_request(ManagedRequest* op, MPI_Request* out);
  MPI_Request handle_ = MPI_REQUEST_NULL;
  std::atomic<bool> completed_{false};
};

/// Starts a generalized request owned by `op`, adopts it (requests::adopt) and stores it
/// in *out. Returns an MPI error code; on failure `op` is deleted.
int start_request(ManagedRequest* op, MPI_Request* out);

namespace requests {

/// Number of owned requests alive; the wrappers skip all lookups when it is 0.
extern std::atomic<int> g_owned;
inline bool any_owned() { return g_owned.load(std::memory_order_acquire) != 0; }

/// Registers `op` as the owner of `req`.
void adopt(MPI_Request req, OwnedRequest* op);
/// The owner of `req`, or nullptr; the entry stays.
OwnedRequest* peek(MPI_Request req);
/// Forgets `req` (after MPI has freed it); returns its owner or nullptr.
OwnedRequest* take(MPI_Request req);

}  // namespace requests
}  // namespace streamcoll
