#include "core/call_request.hpp"

namespace streamcoll {

CallRequest::~CallRequest() {
  if (s_.release) s_.release(finished_);
}

void CallRequest::finish(int rc) {
  if (s_.after) rc = s_.after(rc);
  error_ = rc;
  finished_ = true;
  complete();
}

void CallRequest::on_test() {
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock() || finished_) return;  // another thread is completing it
  bool done = false;
  const int rc = s_.test(&done);
  if (done) finish(rc);
}

void CallRequest::on_wait() {
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_) return;
  if (s_.wait) return finish(s_.wait());
  requests::Backoff backoff;
  bool done = false;
  int rc = s_.test(&done);
  while (!done) {
    backoff.pause();
    rc = s_.test(&done);
  }
  finish(rc);
}

}  // namespace streamcoll
