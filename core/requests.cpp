#include "core/requests.hpp"

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

void ManagedRequest::complete() {
  if (!completed_.exchange(true)) PMPI_Grequest_complete(handle_);
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

}  // namespace streamcoll
