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
