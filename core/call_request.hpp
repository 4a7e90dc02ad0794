// One request type for the routes' non-blocking calls: the operation's completion test, its
// blocking wait, the step after it (a staged call's copies back) and what is released with
// it, given as steps, in place of a ManagedRequest subclass per route. Built on the owned
// requests (core/requests.hpp): MPI_Test/MPI_Wait and their array forms reach on_test and
// on_wait through the wrappers; MPI deletes it once it is complete and waited for.
#pragma once

#include <functional>
#include <mutex>

#include "core/requests.hpp"

namespace streamcoll {

/// A non-blocking call's steps. `test` is required; the others may be empty.
struct CallSteps {
  /// Never blocks: sets *done once the operation is over and returns its error (read only
  /// then). Called under the request's lock (MPI_Test, MPI_Wait's polls).
  std::function<int(bool* done)> test;
  /// Blocks until the operation is over and returns its error. Empty: `test` polled.
  std::function<int()> wait;
  /// Once over: given the operation's error, does what is left (copies back) and returns
  /// the call's error. Empty: the operation's error.
  std::function<int(int rc)> after;
  /// At destruction, with whether the request finished (false only when start_request
  /// failed, or the MPI freed it unfinished): releases what the operation holds.
  std::function<void(bool finished)> release;
};

/// The request of `CallSteps`. Thread-safe: one thread completes it; another testing it
/// meanwhile returns at once.
class CallRequest final : public ManagedRequest {
 public:
  explicit CallRequest(CallSteps steps) : s_(std::move(steps)) {}
  ~CallRequest() override;
  void on_test() override;
  void on_wait() override;
  void on_free() override { on_wait(); }
  int error() const override { return error_; }

 private:
  void finish(int rc);  // mu_ held

  CallSteps s_;
  std::mutex mu_;
  bool finished_ = false;
  int error_ = MPI_SUCCESS;
};

/// Starts `steps` as a request stored in *out (start_request). Returns an MPI error code;
/// on failure the request is gone (its `release` ran, unfinished) and *out is untouched.
inline int start_call_request(CallSteps steps, MPI_Request* out) {
  return start_request(new CallRequest(std::move(steps)), out);
}

}  // namespace streamcoll
