#include "core/requests.hpp"

#include <sched.h>
#include <time.h>

#include <mutex>
#include <unordered_map>

namespace streamcoll::requests {

std::atomic<int> g_owned{0};

namespace {
std::mutex g_mu;
std::unordered_map<MPI_Request, OwnedRequest*>& table() {
  static std::unordered_map<MPI_Request, OwnedRequest*> t;
  return t;
}
}  // namespace

void adopt(MPI_Request req, OwnedRequest* op) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (table().emplace(req, op).second) g_owned.fetch_add(1, std::memory_order_release);
}

OwnedRequest* peek(MPI_Request req) {
  if (req == MPI_REQUEST_NULL) return nullptr;
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = table().find(req);
  return it == table().end() ? nullptr : it->second;
}

OwnedRequest* take(MPI_Request req) {
  if (req == MPI_REQUEST_NULL) return nullptr;
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = table().find(req);
  if (it == table().end()) return nullptr;
  OwnedRequest* op = it->second;
  table().erase(it);
  g_owned.fetch_sub(1, std::memory_order_release);
  return op;
}

std::vector<Owned> find(int n, const MPI_Request* reqs) {
  std::vector<Owned> out;
  std::lock_guard<std::mutex> lock(g_mu);
  if (table().empty()) return out;
  for (int i = 0; i < n; ++i) {
    if (reqs[i] == MPI_REQUEST_NULL) continue;
    auto it = table().find(reqs[i]);
    if (it != table().end()) out.push_back(Owned{i, it->second, false});
  }
  return out;
}

void Backoff::pause() {
  // Spin first: an operation about to end ends soonest so. Then yield at every round:
  // the progress engine's thread (route ht) may share this core. After some thousands of
  // yields (milliseconds), sleep a little too: sched_yield alone may not let a thread
  // of lower priority run.
  constexpr unsigned kSpins = 64, kYields = 8192;
  if (n_ < kSpins + kYields) ++n_;
  if (n_ <= kSpins) return;
  sched_yield();
  if (n_ >= kSpins + kYields) {
    const timespec ts{0, 20 * 1000};  // 20 us
    nanosleep(&ts, nullptr);
  }
}

void progress() {
  int flag = 0;
  PMPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
}

int poll(std::vector<Owned>& owned) {
  int complete = 0;
  for (Owned& o : owned) {
    if (!o.done) {
      o.done = o.op->advance();
    }
    complete += o.done ? 1 : 0;
  }
  if (complete < static_cast<int>(owned.size())) progress();
  return complete;
}

void complete_all(std::vector<Owned>& owned) {
  for (Backoff b; poll(owned) < static_cast<int>(owned.size());) b.pause();
}

void complete_one(OwnedRequest* op) {
  for (Backoff b;; b.pause()) {
    if (op->advance()) return;
    progress();
  }
}

}  // namespace streamcoll::requests

namespace streamcoll {
namespace {

int query_fn(void* self, MPI_Status* status) {
  PMPI_Status_set_elements(status, MPI_BYTE, 0);
  PMPI_Status_set_cancelled(status, 0);
  status->MPI_SOURCE = MPI_UNDEFINED;
  status->MPI_TAG = MPI_UNDEFINED;
  // MPI returns the query function's result as the error of MPI_Wait/MPI_Test.
  return static_cast<ManagedRequest*>(self)->error();
}

int free_fn(void* self) {
  auto* op = static_cast<ManagedRequest*>(self);
  // Forget the handle now, before MPI may hand the same value to a new request.
  requests::take(op->handle());
  delete op;
  return MPI_SUCCESS;
}

int cancel_fn(void*, int) { return MPI_SUCCESS; }  // collectives cannot be cancelled

}  // namespace

void ManagedRequest::settle() {
  if (completed() && !settled_.exchange(true)) PMPI_Grequest_complete(handle_);
}

int start_request(ManagedRequest* op, MPI_Request* out) {
  int rc = PMPI_Grequest_start(query_fn, free_fn, cancel_fn, op, &op->handle_);
  if (rc != MPI_SUCCESS) {
    delete op;
    return rc;
  }
  requests::adopt(op->handle_, op);
  *out = op->handle_;
  return MPI_SUCCESS;
}

int start_completed_request(MPI_Request* out) {
  auto query = [](void*, MPI_Status* st) {
    PMPI_Status_set_elements(st, MPI_BYTE, 0);
    PMPI_Status_set_cancelled(st, 0);
    st->MPI_SOURCE = MPI_UNDEFINED;
    st->MPI_TAG = MPI_UNDEFINED;
    return MPI_SUCCESS;
  };
  auto noop_free = [](void*) { return MPI_SUCCESS; };
  auto noop_cancel = [](void*, int) { return MPI_SUCCESS; };
  int rc = PMPI_Grequest_start(query, noop_free, noop_cancel, nullptr, out);
  if (rc == MPI_SUCCESS) rc = PMPI_Grequest_complete(*out);
  return rc;
}

}  // namespace streamcoll
