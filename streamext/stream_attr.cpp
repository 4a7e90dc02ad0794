#include "streamext/stream_attr.hpp"

#include <atomic>
#include <mutex>

#include "base/log.hpp"
#include "core/runtime.hpp"
#include "shim/export.hpp"

namespace streamcoll::streamext {
namespace {

std::mutex g_mu;
std::atomic<int> g_keyval{MPI_KEYVAL_INVALID};

// MPI_Comm_dup: the duplicate is ordered on the same stream.
int copy_fn(MPI_Comm, int, void*, void* value_in, void* value_out, int* flag) {
  *static_cast<void**>(value_out) = value_in;
  *flag = 1;
  return MPI_SUCCESS;
}

int delete_fn(MPI_Comm, int, void* value, void*) {
  SC_TRACE("stream %p detached from a communicator", value);
  return MPI_SUCCESS;
}

}  // namespace

int keyval() {
  int k = g_keyval.load(std::memory_order_acquire);
  if (k != MPI_KEYVAL_INVALID) return k;
  Runtime& rt = Runtime::get();
  if (!rt.active()) return MPI_KEYVAL_INVALID;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    k = g_keyval.load();
    if (k != MPI_KEYVAL_INVALID) return k;
    if (PMPI_Comm_create_keyval(copy_fn, delete_fn, &k, nullptr) != MPI_SUCCESS)
      return MPI_KEYVAL_INVALID;
    g_keyval.store(k, std::memory_order_release);
  }
  // From now on a communicator may carry a stream: calls on GPU buffers must be looked at
  // even where the table routes them to pmpi (which then synchronises the stream). Outside
  // g_mu: Runtime::stop() takes the runtime's lock, then ours.
  rt.enable_stream_attribute();
  SC_INFO("stream attribute keyval created");
  return k;
}

bool in_use() { return g_keyval.load(std::memory_order_acquire) != MPI_KEYVAL_INVALID; }

bool attached(MPI_Comm comm, void** stream) {
  int k = g_keyval.load(std::memory_order_acquire);
  if (k == MPI_KEYVAL_INVALID) return false;
  int found = 0;
  void* value = nullptr;
  if (PMPI_Comm_get_attr(comm, k, &value, &found) != MPI_SUCCESS || !found) return false;
  *stream = value;
  return true;
}

void stop() {
  std::lock_guard<std::mutex> lock(g_mu);
  int k = g_keyval.exchange(MPI_KEYVAL_INVALID);
  if (k != MPI_KEYVAL_INVALID) PMPI_Comm_free_keyval(&k);
}

}  // namespace streamcoll::streamext

SC_EXPORT int streamcoll_get_stream_keyval(void) { return streamcoll::streamext::keyval(); }
