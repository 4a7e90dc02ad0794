// What the fake-driver route tests (nccl_route.cpp, ht_route.cpp, bc_route.cpp) share:
// pass/fail counting, the fakes' helpers and streamcoll's C API found with dlsym (the
// programs are plain MPI + dl, streamcoll preloaded), counters and statistics.
// Included by one translation unit per program.
#pragma once

#include <dlfcn.h>
#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "fake_api.h"
#include "streamcoll/streamcoll.h"

namespace {

// ---- results ------------------------------------------------------------------------------

int g_pass = 0, g_fail = 0, g_rank = 0, g_size = 1;

inline bool check(bool ok, const std::string& what) {
  if (ok) {
    ++g_pass;
  } else {
    ++g_fail;
    if (g_fail <= 50) std::fprintf(stderr, "[rank %d] FAIL: %s\n", g_rank, what.c_str());
    if (g_fail == 50) std::fprintf(stderr, "[rank %d] (further failures not shown)\n", g_rank);
  }
  return ok;
}

// ---- the fakes and streamcoll, through dlsym ----------------------------------------------

struct Api {
  fake_cuda_malloc_fn malloc = nullptr;
  fake_cuda_malloc_device_fn malloc_device = nullptr;
  fake_cuda_malloc_managed_fn malloc_managed = nullptr;
  fake_cuda_malloc_pinned_fn malloc_pinned = nullptr;
  fake_cuda_free_fn free = nullptr;
  fake_cuda_runtime_init_fn runtime_init = nullptr;
  fake_cuda_runtime_fini_fn runtime_fini = nullptr;
  fake_cuda_stream_create_fn stream_create = nullptr;
  fake_cuda_stream_destroy_fn stream_destroy = nullptr;
  fake_cuda_stream_sync_fn stream_sync = nullptr;
  fake_cuda_pending_fn pending = nullptr;
  fake_cuda_enqueue_copy_fn enqueue_copy = nullptr;
  fake_cuda_enqueue_wait_fn enqueue_wait = nullptr;
  fake_cuda_host_access_fn host_access = nullptr;
  fake_cuda_deferred_fn deferred = nullptr;
  fake_cuda_counter_fn cuda_counter = nullptr;
  fake_cuda_sync_count_fn sync_count = nullptr;
  fake_nccl_calls_fn nccl_calls = nullptr;      // with the fake NCCL only
  fake_nccl_counter_fn nccl_counter = nullptr;  // with the fake NCCL only
  int (*get_stats)(const char*, const char*, const char*, streamcoll_stat_t*) = nullptr;
  int (*set_route)(MPI_Comm, const char*) = nullptr;
};
Api api;

template <class F>
inline bool sym(void* h, F& fn, const char* name) {
  fn = reinterpret_cast<F>(dlsym(h, name));
  if (!fn) std::fprintf(stderr, "[rank %d] %s not found\n", g_rank, name);
  return fn != nullptr;
}

/// Finds the fake driver's helpers (libcuda.so.1 must be the fake), with need_nccl the
/// fake NCCL's (STREAMCOLL_NCCL_LIB), and streamcoll's C API. False, with a message, when
/// something is missing.
inline bool load_api(bool need_nccl) {
  void* cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!cu) {
    std::fprintf(stderr, "[rank %d] libcuda.so.1: %s\n", g_rank, dlerror());
    return false;
  }
  bool ok = sym(cu, api.malloc, "fake_cuda_malloc") &&  // else: not the fake driver
            sym(cu, api.malloc_device, "fake_cuda_malloc_device") &&
            sym(cu, api.malloc_managed, "fake_cuda_malloc_managed") &&
            sym(cu, api.malloc_pinned, "fake_cuda_malloc_pinned") &&
            sym(cu, api.free, "fake_cuda_free") &&
            sym(cu, api.runtime_init, "fake_cuda_runtime_init") &&
            sym(cu, api.runtime_fini, "fake_cuda_runtime_fini") &&
            sym(cu, api.stream_create, "fake_cuda_stream_create") &&
            sym(cu, api.stream_destroy, "fake_cuda_stream_destroy") &&
            sym(cu, api.stream_sync, "fake_cuda_stream_sync") &&
            sym(cu, api.pending, "fake_cuda_pending") &&
            sym(cu, api.enqueue_copy, "fake_cuda_enqueue_copy") &&
            sym(cu, api.enqueue_wait, "fake_cuda_enqueue_wait") &&
            sym(cu, api.host_access, "fake_cuda_host_access") &&
            sym(cu, api.deferred, "fake_cuda_deferred") &&
            sym(cu, api.cuda_counter, "fake_cuda_counter") &&
            sym(cu, api.sync_count, "fake_cuda_sync_count");
  if (need_nccl) {
    const char* path = std::getenv("STREAMCOLL_NCCL_LIB");
    void* nc = path ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : nullptr;
    if (!nc) {
      std::fprintf(stderr, "[rank %d] STREAMCOLL_NCCL_LIB=%s: not loadable\n", g_rank,
                   path ? path : "(unset)");
      return false;
    }
    ok = ok && sym(nc, api.nccl_calls, "fake_nccl_calls") &&
         sym(nc, api.nccl_counter, "fake_nccl_counter");
  }
  return ok && sym(RTLD_DEFAULT, api.get_stats, "streamcoll_get_stats") &&
         sym(RTLD_DEFAULT, api.set_route, "streamcoll_comm_set_route");
}

/// The fake driver's / fake NCCL's counter `name` (0 without the fake NCCL).
inline unsigned long long cu(const char* name) { return api.cuda_counter(name); }
inline unsigned long long nc(const char* name) { return api.nccl_counter ? api.nccl_counter(name) : 0; }

/// streamcoll_get_stats' call count (null arguments: any), ~0 on error.
inline unsigned long long stat_calls(const char* coll, const char* route, const char* mem) {
  streamcoll_stat_t s{};
  if (api.get_stats(coll, route, mem, &s) != 0) return ~0ull;
  return s.calls;
}
inline unsigned long long stat_calls(const std::string& coll, const char* route, const char* mem) {
  return stat_calls(coll.c_str(), route, mem);
}

/// Whether `cond` holds now or within `seconds` (streamcoll's watchdog thread may hold the
/// last reference to a communicator's NCCL state for a moment, and abort asynchronously).
template <class F>
inline bool eventually(F cond, double seconds = 5) {
  for (int i = 0; i < static_cast<int>(seconds * 100); ++i) {
    if (cond()) return true;
    usleep(10000);
  }
  return cond();
}

}  // namespace
