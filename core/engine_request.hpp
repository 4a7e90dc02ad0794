// Requests that the progress engine (core/progress) completes: the MPI_I* calls of routes
// that run host collectives on the engine thread (ht, blueconnect).
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>

#include "core/requests.hpp"

namespace streamcoll {

/// The engine's "done" for a request, for an owner's blocking on_wait() (e.g. from
/// on_free()): it sleeps after a short spin, since on a full node the progress thread
/// needs that core. The wait/test wrappers do not block here: they poll the generalized
/// request itself, keeping MPI progressing (core/requests.hpp).
class Completion {
 public:
  /// Engine side, before ManagedRequest::complete() (after which the request may be freed).
  void signal() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_.store(true, std::memory_order_release);
    }
    cv_.notify_all();
  }
  /// Application side: returns once signal() has run.
  void wait() {
    for (int i = 0; i < 4000; ++i)
      if (done_.load(std::memory_order_acquire)) return;
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_.load(std::memory_order_acquire); });
  }

 private:
  std::atomic<bool> done_{false};
  std::mutex mu_;
  std::condition_variable cv_;
};

/// MPI_I* on host buffers: the request the application waits for; the engine completes
/// it with finish() (from the engine thread). MPI deletes it once complete and waited for.
class HostRequest final : public ManagedRequest {
 public:
  void on_wait() override { done_.wait(); }
  /// Nothing to advance: the engine completes it; the wrappers' polling sees that.
  void on_test() override {}
  int error() const override { return err_.load(std::memory_order_acquire); }
  void finish(int rc) {
    err_.store(rc, std::memory_order_release);
    done_.signal();
    complete();
  }

 private:
  std::atomic<int> err_{MPI_SUCCESS};
  Completion done_;
};

}  // namespace streamcoll
