// A fake CUDA driver, built as libcuda.so.1, so that streamcoll's GPU paths run without a
// GPU. It exports the entry points streamcoll looks up (core/cuda_driver.hpp,
// STREAMCOLL_CUDA_ENTRY_POINTS) under the symbol names cuda.h maps them to
// (cuStreamDestroy -> cuStreamDestroy_v2, ...: each definition below is spelt with the
// header's macro, so it gets the header's signature and symbol), plus the fake_cuda_*
// helpers of fake_api.h. A new entry point in that list must be added here too (streamcoll
// turns its GPU routes off when one is missing, and the tests say "streamcoll opened the
// fake CUDA driver" failed).
//
// Model:
//  - Devices: FAKE_CUDA_DEVICES of them (default 1), each with one primary context.
//    PCI bus ids come from FAKE_CUDA_BUS_ID: unset or "same" -> 0000:01:00.0 on every
//    rank (device d: bus 1 + d); "per-rank" -> bus 1 + local_rank * devices + d;
//    "mod:K" -> bus 1 + (local_rank % K) * devices + d (so ranks K apart share a GPU);
//    anything else is used as is. The local rank is OMPI_COMM_WORLD_LOCAL_RANK or
//    MPI_LOCALRANKID (MPICH).
//  - Memory: "device memory" is host memory from fake_cuda_malloc, _device, _managed or
//    cuMemAllocAsync; "pinned memory" from fake_cuda_malloc_pinned or cuMemHostAlloc.
//    cuPointerGetAttributes reports CU_MEMORYTYPE_DEVICE (HOST for pinned memory), the
//    device and IS_MANAGED for it, and, like the real driver, succeeds with zeroed values
//    for any other pointer; cuPointerGetAttribute fails with CUDA_ERROR_INVALID_VALUE for
//    other pointers (pageable host memory).
//  - Streams: an ordered queue of host closures per stream; handle 0, CU_STREAM_LEGACY
//    and CU_STREAM_PER_THREAD all name the legacy default stream (which needs a current
//    context, as in the real driver). Streams created without CU_STREAM_NON_BLOCKING are
//    ordered after the legacy stream, and the legacy stream after them.
//    By default work runs at once, when it is enqueued. With FAKE_CUDA_DEFER=1 it runs
//    only when something waits for it: cuStreamSynchronize, cuStreamQuery, cuEventQuery
//    or cuEventSynchronize of an event recorded after it, cuStreamDestroy, or a stream
//    waiting on such an event (cuStreamWaitEvent) running its own work. A query that
//    finds work pending runs it and still answers CUDA_ERROR_NOT_READY once, so callers'
//    polling loops are exercised. Events record a position in a stream.
//  - Happens-before: every piece of work carries a vector clock (stream order, event
//    waits, the legacy stream's implicit order, and whatever the host has seen complete
//    through a synchronize or a successful query). Work that reads or writes memory that
//    an earlier, unordered piece of work on another stream writes (or reads, for a
//    write) is a race: counted under "races" and printed on stderr, whether or not work
//    is deferred. fake_cuda_host_access() checks the host's own accesses the same way.
//  - Contexts: cuStreamCreate, cuEventCreate, cuMemAllocAsync, cuMemHostAlloc and every
//    use of the legacy stream need a current context (CUDA_ERROR_INVALID_CONTEXT
//    otherwise); cuCtxPushCurrent needs a retained primary context.
//  - Other checks: copies (cuMemcpyDtoDAsync) only between fake allocations; destroyed
//    streams and events are invalid handles; releasing an unretained context fails.
//    fake_cuda_counter() reads call counts and gauges (live streams, events, retained
//    contexts, allocations) for leak checks.
// All of it is single-process: one recursive lock serialises every call; deferred work
// runs on the thread that waits for it, holding the lock.
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "fake_api.h"

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

using VC = std::vector<uint64_t>;  // vector clock, indexed by stream id

void merge(VC& into, const VC& from) {
  if (into.size() < from.size()) into.resize(from.size(), 0);
  for (size_t i = 0; i < from.size(); ++i) into[i] = std::max(into[i], from[i]);
}
uint64_t at(const VC& v, int i) { return static_cast<size_t>(i) < v.size() ? v[i] : 0; }

}  // namespace

struct CUctx_st {
  int device = 0;
  int refs = 0;  // primary context retain count
};

struct CUstream_st;

namespace {

struct Dep {
  CUstream_st* stream;
  uint64_t pos;
};

struct Item {
  uint64_t idx = 0;
  std::vector<Dep> deps;      // run these streams up to these positions first
  std::function<void()> fn;   // may be empty (an event record or a wait)
};

}  // namespace

struct CUstream_st {
  int id = 0;
  unsigned flags = 0;
  int device = 0;
  bool legacy = false;
  bool destroyed = false;
  bool internal = false;  // made by fake_cuda_stream_create (not counted as live)
  std::deque<Item> pending;
  uint64_t enqueued = 0, completed = 0;
  bool running = false;
  VC vc;  // what the next piece of work on this stream is ordered after
};

struct CUevent_st {
  bool recorded = false;
  bool internal = false;
  CUstream_st* stream = nullptr;
  uint64_t pos = 0;
  VC vc;
};

namespace {

struct Alloc {
  size_t bytes;
  int device;
  bool managed;
  bool pinned;        // page-locked host memory (cuMemHostAlloc)
  bool async;         // from cuMemAllocAsync
  bool free_pending;  // cuMemFreeAsync enqueued
  unsigned long long id;
};

struct Access {
  int sid;
  uint64_t idx;
  uintptr_t lo, hi;
  bool write;
  std::string what;
};

std::recursive_mutex g_mu;
bool g_defer = false;
bool g_verbose = false;
int g_devices = 1;
std::string g_bus_mode;
int g_local_rank = 0;
std::vector<CUctx_st> g_ctx;
std::vector<CUstream_st*> g_streams;  // by id; never freed (work may still name them)
std::set<CUstream_st*> g_live_streams;
std::set<CUevent_st*> g_events;
std::map<uintptr_t, Alloc> g_allocs;
unsigned long long g_alloc_ids = 0;
std::vector<Access> g_history;  // accesses of work the host has not seen complete
VC g_host;                      // what the host has seen complete
std::map<std::string, unsigned long long> g_counters;
thread_local std::vector<CUcontext> t_ctx_stack;

void count(const char* name, long long delta = 1) { g_counters[name] += delta; }

CUresult ret(const char* api, CUresult r) {
  if (r != CUDA_SUCCESS && r != CUDA_ERROR_NOT_READY) {
    count("errors");
    if (g_verbose) fprintf(stderr, "fake_cuda: %s -> error %d\n", api, static_cast<int>(r));
  }
  return r;
}

void init_once() {
  static bool done = false;
  if (done) return;
  done = true;
  const char* d = getenv("FAKE_CUDA_DEFER");
  g_defer = d && strcmp(d, "1") == 0;
  const char* v = getenv("FAKE_CUDA_VERBOSE");
  g_verbose = v && strcmp(v, "1") == 0;
  if (const char* n = getenv("FAKE_CUDA_DEVICES")) g_devices = atoi(n);
  if (g_devices < 0) g_devices = 0;
  if (const char* b = getenv("FAKE_CUDA_BUS_ID")) g_bus_mode = b;
  const char* lr = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  if (!lr) lr = getenv("MPI_LOCALRANKID");
  if (!lr) lr = getenv("PMI_LOCAL_RANK");
  g_local_rank = lr ? atoi(lr) : 0;
  g_ctx.assign(static_cast<size_t>(g_devices), CUctx_st{});
  for (int i = 0; i < g_devices; ++i) g_ctx[i].device = i;
  auto* legacy = new CUstream_st;
  legacy->id = 0;
  legacy->legacy = true;
  g_streams.push_back(legacy);
}

CUstream_st* legacy() { return g_streams[0]; }

bool is_legacy_handle(CUstream h) {
  return h == nullptr || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD;
}

CUcontext current_ctx() { return t_ctx_stack.empty() ? nullptr : t_ctx_stack.back(); }

// The stream object of a handle, or nullptr with *err set.
CUstream_st* resolve(CUstream h, bool check_ctx, CUresult* err) {
  if (is_legacy_handle(h)) {
    if (check_ctx && !current_ctx()) {
      *err = CUDA_ERROR_INVALID_CONTEXT;
      return nullptr;
    }
    return legacy();
  }
  if (!g_live_streams.count(h)) {
    *err = CUDA_ERROR_INVALID_HANDLE;
    return nullptr;
  }
  return h;
}

void run_until(CUstream_st* s, uint64_t pos);

void execute(CUstream_st* s, Item& it) {
  s->running = true;
  for (const Dep& d : it.deps) run_until(d.stream, d.pos);
  if (it.fn) it.fn();
  s->completed = it.idx;
  s->running = false;
  count("executed");
}

void run_until(CUstream_st* s, uint64_t pos) {
  while (s->completed < pos) {
    if (s->running) {
      fprintf(stderr, "fake_cuda: internal error: stream %d waits for itself\n", s->id);
      abort();
    }
    if (s->pending.empty()) {
      fprintf(stderr, "fake_cuda: internal error: stream %d has no work up to %llu\n", s->id,
              static_cast<unsigned long long>(pos));
      abort();
    }
    Item it = std::move(s->pending.front());
    s->pending.pop_front();
    execute(s, it);
  }
}

void prune_history() {
  g_history.erase(std::remove_if(g_history.begin(), g_history.end(),
                                 [](const Access& a) { return at(g_host, a.sid) >= a.idx; }),
                  g_history.end());
}

// The host has seen everything `vc` covers complete.
void host_observe(const VC& vc) {
  merge(g_host, vc);
  prune_history();
}

bool overlap(uintptr_t lo1, uintptr_t hi1, uintptr_t lo2, uintptr_t hi2) {
  return lo1 < hi2 && lo2 < hi1;
}

// Checks an access of work ordered after `vc` against the history; returns the races.
int check_races(const VC& vc, uintptr_t lo, uintptr_t hi, bool write, const std::string& who) {
  int races = 0;
  for (const Access& a : g_history) {
    if (at(vc, a.sid) >= a.idx) continue;  // ordered after it
    if (!(a.write || write) || !overlap(lo, hi, a.lo, a.hi)) continue;
    ++races;
    count("races");
    if (g_counters["races"] > 20) continue;  // the first ones say enough
    fprintf(stderr,
            "fake_cuda: RACE: %s %s [%p, +%zu) while %s (stream %d, #%llu) %s [%p, +%zu), "
            "and nothing orders the two\n",
            who.c_str(), write ? "writes" : "reads", reinterpret_cast<void*>(lo),
            static_cast<size_t>(hi - lo), a.what.c_str(), a.sid,
            static_cast<unsigned long long>(a.idx), a.write ? "writes" : "reads",
            reinterpret_cast<void*>(a.lo), static_cast<size_t>(a.hi - a.lo));
  }
  return races;
}

struct RangeUse {
  uintptr_t lo, hi;
  bool write;
};

// Appends work to s: implicit order first (what the host has seen, the legacy stream),
// then `extra_vc` (an event waited on), then the race check.
void enqueue(CUstream_st* s, std::vector<Dep> deps, const VC* extra_vc, std::function<void()> fn,
             const std::vector<RangeUse>& ranges, const std::string& what) {
  merge(s->vc, g_host);
  if (s->legacy) {
    for (CUstream_st* b : g_live_streams)
      if (!(b->flags & CU_STREAM_NON_BLOCKING) && b->enqueued > b->completed) {
        deps.push_back({b, b->enqueued});
        merge(s->vc, b->vc);
      } else if (!(b->flags & CU_STREAM_NON_BLOCKING)) {
        merge(s->vc, b->vc);
      }
  } else if (!(s->flags & CU_STREAM_NON_BLOCKING)) {
    CUstream_st* l = legacy();
    if (l->enqueued > l->completed) deps.push_back({l, l->enqueued});
    merge(s->vc, l->vc);
  }
  if (extra_vc) merge(s->vc, *extra_vc);
  Item it;
  it.idx = ++s->enqueued;
  if (s->vc.size() <= static_cast<size_t>(s->id)) s->vc.resize(s->id + 1, 0);
  s->vc[s->id] = it.idx;
  const std::string who = what + " (stream " + std::to_string(s->id) + ", #" +
                          std::to_string(it.idx) + ")";
  for (const RangeUse& r : ranges) check_races(s->vc, r.lo, r.hi, r.write, who);
  for (const RangeUse& r : ranges) g_history.push_back({s->id, it.idx, r.lo, r.hi, r.write, what});
  it.deps = std::move(deps);
  it.fn = std::move(fn);
  if (g_defer) {
    s->pending.push_back(std::move(it));
  } else {
    run_until(s, s->enqueued - 1);  // nothing pending without deferral; for form's sake
    execute(s, it);
  }
}

// The allocation holding [p, p + n), or nullptr.
const Alloc* find_alloc(const void* p, size_t n, uintptr_t* base = nullptr) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = g_allocs.upper_bound(a);
  if (it == g_allocs.begin()) return nullptr;
  --it;
  if (a < it->first || a + n > it->first + it->second.bytes || a + n < a) return nullptr;
  if (base) *base = it->first;
  return &it->second;
}

void* allocate(size_t bytes, int device, bool managed, bool async, bool pinned = false) {
  if (bytes == 0) return nullptr;
  void* p = aligned_alloc(256, (bytes + 255) / 256 * 256);
  if (!p) return nullptr;
  g_allocs[reinterpret_cast<uintptr_t>(p)] =
      Alloc{bytes, device, managed, pinned, async, false, ++g_alloc_ids};
  count(async ? "live_async_allocs" : pinned ? "live_host_allocs" : "live_allocs");
  return p;
}

void release(uintptr_t base) {
  auto it = g_allocs.find(base);
  if (it == g_allocs.end()) return;
  const uintptr_t hi = base + it->second.bytes;
  count(it->second.async ? "live_async_allocs" : it->second.pinned ? "live_host_allocs" : "live_allocs", -1);
  g_allocs.erase(it);
  // The memory is gone: what was done to it matters no more (the address may be reused).
  g_history.erase(std::remove_if(g_history.begin(), g_history.end(),
                                 [&](const Access& a) { return overlap(a.lo, a.hi, base, hi); }),
                  g_history.end());
  free(reinterpret_cast<void*>(base));
}

CUstream_st* new_stream(unsigned flags, int device, bool internal) {
  auto* s = new CUstream_st;
  s->id = static_cast<int>(g_streams.size());
  s->flags = flags;
  s->device = device;
  s->internal = internal;
  g_streams.push_back(s);
  g_live_streams.insert(s);
  if (!internal) count("live_streams");
  return s;
}

void destroy_stream(CUstream_st* s) {
  // The real driver finishes the work in the background; here it runs now.
  run_until(s, s->enqueued);
  s->destroyed = true;
  g_live_streams.erase(s);
  if (!s->internal) count("live_streams", -1);
}

CUresult record(CUevent_st* e, CUstream_st* s) {
  enqueue(s, {}, nullptr, nullptr, {}, "event record");
  e->recorded = true;
  e->stream = s;
  e->pos = s->enqueued;
  e->vc = s->vc;
  return CUDA_SUCCESS;
}

void wait_event(CUstream_st* s, CUevent_st* e) {
  if (!e->recorded) return;  // waiting for a never-recorded event is a no-op
  enqueue(s, {{e->stream, e->pos}}, &e->vc, nullptr, {}, "stream wait");
}

// SUCCESS when the work before e is done; otherwise runs it and says NOT_READY.
CUresult query_event(CUevent_st* e) {
  if (!e->recorded) return CUDA_SUCCESS;
  if (e->stream->completed >= e->pos) {
    host_observe(e->vc);
    return CUDA_SUCCESS;
  }
  run_until(e->stream, e->pos);
  count("not_ready");
  return CUDA_ERROR_NOT_READY;
}

int bus_number(int device) {
  int group = 0;
  if (g_bus_mode == "per-rank") {
    group = g_local_rank;
  } else if (g_bus_mode.rfind("mod:", 0) == 0) {
    int k = atoi(g_bus_mode.c_str() + 4);
    group = k > 0 ? g_local_rank % k : 0;
  }
  return 1 + group * g_devices + device;
}

std::vector<RangeUse> ranges_of(const fake_cuda_range* r, int n) {
  std::vector<RangeUse> out;
  for (int i = 0; i < n; ++i)
    if (r[i].ptr && r[i].bytes)
      out.push_back({reinterpret_cast<uintptr_t>(r[i].ptr),
                     reinterpret_cast<uintptr_t>(r[i].ptr) + r[i].bytes, r[i].write != 0});
  return out;
}

}  // namespace

#define LOCK()                                    \
  std::lock_guard<std::recursive_mutex> lock(g_mu); \
  init_once()

// ---- the CUDA driver API --------------------------------------------------------------

FAKE_EXPORT CUresult cuInit(unsigned int flags) {
  LOCK();
  count("cuInit");
  return ret("cuInit", flags == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE);
}

FAKE_EXPORT CUresult cuDriverGetVersion(int* version) {
  LOCK();
  count("cuDriverGetVersion");
  if (!version) return ret("cuDriverGetVersion", CUDA_ERROR_INVALID_VALUE);
  *version = CUDA_VERSION;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDeviceGetCount(int* n) {
  LOCK();
  count("cuDeviceGetCount");
  if (!n) return ret("cuDeviceGetCount", CUDA_ERROR_INVALID_VALUE);
  *n = g_devices;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuGetErrorString(CUresult error, const char** str) {
  if (!str) return CUDA_ERROR_INVALID_VALUE;
  switch (error) {
    case CUDA_SUCCESS: *str = "no error"; break;
    case CUDA_ERROR_INVALID_VALUE: *str = "invalid argument"; break;
    case CUDA_ERROR_OUT_OF_MEMORY: *str = "out of memory"; break;
    case CUDA_ERROR_NOT_INITIALIZED: *str = "initialization error"; break;
    case CUDA_ERROR_INVALID_DEVICE: *str = "invalid device ordinal"; break;
    case CUDA_ERROR_INVALID_CONTEXT: *str = "invalid device context"; break;
    case CUDA_ERROR_INVALID_HANDLE: *str = "invalid resource handle"; break;
    case CUDA_ERROR_NOT_READY: *str = "device not ready"; break;
    case CUDA_ERROR_NOT_SUPPORTED: *str = "operation not supported"; break;
    case CUDA_ERROR_ILLEGAL_ADDRESS: *str = "an illegal memory access was encountered"; break;
    default: *str = nullptr; return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

namespace {
// One attribute of a fake allocation (a != nullptr) or of an unknown pointer (defaults).
CUresult attribute(CUpointer_attribute attr, void* data, const Alloc* a, uintptr_t base,
                   CUdeviceptr ptr) {
  switch (attr) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      *static_cast<unsigned int*>(data) = !a ? 0 : a->pinned ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:  // "a boolean": written as one byte
      *static_cast<bool*>(data) = a && a->managed;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      *static_cast<int*>(data) = a ? a->device : CU_DEVICE_INVALID;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      *static_cast<CUcontext*>(data) = a ? &g_ctx[a->device] : nullptr;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
      *static_cast<CUdeviceptr*>(data) = a ? ptr : 0;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
      *static_cast<void**>(data) = a && (a->managed || a->pinned) ? reinterpret_cast<void*>(ptr) : nullptr;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      *static_cast<CUdeviceptr*>(data) = a ? base : 0;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      *static_cast<size_t*>(data) = a ? a->bytes : 0;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
      *static_cast<unsigned long long*>(data) = a ? a->id : 0;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_NOT_SUPPORTED;  // not modelled: fail loudly
  }
}
}  // namespace

FAKE_EXPORT CUresult cuPointerGetAttributes(unsigned int n, CUpointer_attribute* attrs,
                                            void** data, CUdeviceptr ptr) {
  LOCK();
  count("cuPointerGetAttributes");
  if (!attrs || !data) return ret("cuPointerGetAttributes", CUDA_ERROR_INVALID_VALUE);
  uintptr_t base = 0;
  const Alloc* a = find_alloc(reinterpret_cast<const void*>(ptr), 1, &base);
  for (unsigned i = 0; i < n; ++i)
    if (CUresult r = attribute(attrs[i], data[i], a, base, ptr); r != CUDA_SUCCESS)
      return ret("cuPointerGetAttributes", r);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attr, CUdeviceptr ptr) {
  LOCK();
  count("cuPointerGetAttribute");
  uintptr_t base = 0;
  const Alloc* a = find_alloc(reinterpret_cast<const void*>(ptr), 1, &base);
  if (!data || !a) return ret("cuPointerGetAttribute", CUDA_ERROR_INVALID_VALUE);
  return ret("cuPointerGetAttribute", attribute(attr, data, a, base, ptr));
}

FAKE_EXPORT CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  LOCK();
  count("cuDeviceGet");
  if (!device) return ret("cuDeviceGet", CUDA_ERROR_INVALID_VALUE);
  if (ordinal < 0 || ordinal >= g_devices) return ret("cuDeviceGet", CUDA_ERROR_INVALID_DEVICE);
  *device = ordinal;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDeviceGetPCIBusId(char* bus, int len, CUdevice dev) {
  LOCK();
  count("cuDeviceGetPCIBusId");
  if (dev < 0 || dev >= g_devices) return ret("cuDeviceGetPCIBusId", CUDA_ERROR_INVALID_DEVICE);
  char id[64];
  const bool literal = !g_bus_mode.empty() && g_bus_mode != "same" && g_bus_mode != "per-rank" &&
                       g_bus_mode.rfind("mod:", 0) != 0;
  if (literal)
    snprintf(id, sizeof id, "%s", g_bus_mode.c_str());
  else
    snprintf(id, sizeof id, "0000:%02x:00.0", bus_number(dev));
  if (!bus || len <= static_cast<int>(strlen(id))) return ret("cuDeviceGetPCIBusId", CUDA_ERROR_INVALID_VALUE);
  memcpy(bus, id, strlen(id) + 1);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  LOCK();
  count("cuDevicePrimaryCtxRetain");
  if (!pctx) return ret("cuDevicePrimaryCtxRetain", CUDA_ERROR_INVALID_VALUE);
  if (dev < 0 || dev >= g_devices) return ret("cuDevicePrimaryCtxRetain", CUDA_ERROR_INVALID_DEVICE);
  ++g_ctx[dev].refs;
  count("ctx_refs");
  *pctx = &g_ctx[dev];
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
  LOCK();
  count("cuDevicePrimaryCtxRelease");
  if (dev < 0 || dev >= g_devices) return ret("cuDevicePrimaryCtxRelease", CUDA_ERROR_INVALID_DEVICE);
  if (g_ctx[dev].refs <= 0) return ret("cuDevicePrimaryCtxRelease", CUDA_ERROR_INVALID_CONTEXT);
  --g_ctx[dev].refs;
  count("ctx_refs", -1);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuCtxGetCurrent(CUcontext* pctx) {
  LOCK();
  count("cuCtxGetCurrent");
  if (!pctx) return ret("cuCtxGetCurrent", CUDA_ERROR_INVALID_VALUE);
  *pctx = current_ctx();
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuCtxGetDevice(CUdevice* device) {
  LOCK();
  count("cuCtxGetDevice");
  if (!device) return ret("cuCtxGetDevice", CUDA_ERROR_INVALID_VALUE);
  CUcontext c = current_ctx();
  if (!c) return ret("cuCtxGetDevice", CUDA_ERROR_INVALID_CONTEXT);
  *device = c->device;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuCtxPushCurrent(CUcontext ctx) {
  LOCK();
  count("cuCtxPushCurrent");
  bool known = false;
  for (auto& c : g_ctx) known = known || &c == ctx;
  // A primary context is usable only while retained.
  if (!known || ctx->refs <= 0) return ret("cuCtxPushCurrent", CUDA_ERROR_INVALID_CONTEXT);
  t_ctx_stack.push_back(ctx);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuCtxPopCurrent(CUcontext* pctx) {
  LOCK();
  count("cuCtxPopCurrent");
  if (t_ctx_stack.empty()) return ret("cuCtxPopCurrent", CUDA_ERROR_INVALID_CONTEXT);
  CUcontext c = t_ctx_stack.back();
  t_ctx_stack.pop_back();
  if (pctx) *pctx = c;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuStreamCreate(CUstream* ph, unsigned int flags) {
  LOCK();
  count("cuStreamCreate");
  if (!ph || (flags & ~static_cast<unsigned>(CU_STREAM_NON_BLOCKING)))
    return ret("cuStreamCreate", CUDA_ERROR_INVALID_VALUE);
  CUcontext ctx = current_ctx();
  if (!ctx) return ret("cuStreamCreate", CUDA_ERROR_INVALID_CONTEXT);
  *ph = new_stream(flags, ctx->device, false);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuStreamDestroy(CUstream h) {
  LOCK();
  count("cuStreamDestroy");
  if (is_legacy_handle(h) || !g_live_streams.count(h) || h->internal)
    return ret("cuStreamDestroy", CUDA_ERROR_INVALID_HANDLE);
  destroy_stream(h);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuStreamQuery(CUstream h) {
  LOCK();
  count("cuStreamQuery");
  CUresult err = CUDA_SUCCESS;
  CUstream_st* s = resolve(h, true, &err);
  if (!s) return ret("cuStreamQuery", err);
  if (s->completed >= s->enqueued) {
    host_observe(s->vc);
    return CUDA_SUCCESS;
  }
  run_until(s, s->enqueued);
  count("not_ready");
  return CUDA_ERROR_NOT_READY;
}

namespace {
CUresult sync_stream(CUstream h, bool check_ctx) {
  CUresult err = CUDA_SUCCESS;
  CUstream_st* s = resolve(h, check_ctx, &err);
  if (!s) return err;
  run_until(s, s->enqueued);
  host_observe(s->vc);
  return CUDA_SUCCESS;
}
}  // namespace

FAKE_EXPORT CUresult cuStreamSynchronize(CUstream h) {
  LOCK();
  count("cuStreamSynchronize");
  return ret("cuStreamSynchronize", sync_stream(h, true));
}

FAKE_EXPORT CUresult cuStreamWaitEvent(CUstream h, CUevent e, unsigned int flags) {
  LOCK();
  count("cuStreamWaitEvent");
  CUresult err = CUDA_SUCCESS;
  CUstream_st* s = resolve(h, true, &err);
  if (!s) return ret("cuStreamWaitEvent", err);
  if (!g_events.count(e)) return ret("cuStreamWaitEvent", CUDA_ERROR_INVALID_HANDLE);
  if (flags != 0) return ret("cuStreamWaitEvent", CUDA_ERROR_INVALID_VALUE);
  wait_event(s, e);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuEventCreate(CUevent* pe, unsigned int flags) {
  LOCK();
  count("cuEventCreate");
  if (!pe) return ret("cuEventCreate", CUDA_ERROR_INVALID_VALUE);
  if (!current_ctx()) return ret("cuEventCreate", CUDA_ERROR_INVALID_CONTEXT);
  (void)flags;
  auto* e = new CUevent_st;
  g_events.insert(e);
  count("live_events");
  *pe = e;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuEventDestroy(CUevent e) {
  LOCK();
  count("cuEventDestroy");
  if (!g_events.count(e) || e->internal) return ret("cuEventDestroy", CUDA_ERROR_INVALID_HANDLE);
  g_events.erase(e);
  delete e;
  count("live_events", -1);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuEventRecord(CUevent e, CUstream h) {
  LOCK();
  count("cuEventRecord");
  if (!g_events.count(e)) return ret("cuEventRecord", CUDA_ERROR_INVALID_HANDLE);
  CUresult err = CUDA_SUCCESS;
  CUstream_st* s = resolve(h, true, &err);
  if (!s) return ret("cuEventRecord", err);
  return record(e, s);
}

FAKE_EXPORT CUresult cuEventQuery(CUevent e) {
  LOCK();
  count("cuEventQuery");
  if (!g_events.count(e)) return ret("cuEventQuery", CUDA_ERROR_INVALID_HANDLE);
  return query_event(e);
}

FAKE_EXPORT CUresult cuEventSynchronize(CUevent e) {
  LOCK();
  count("cuEventSynchronize");
  if (!g_events.count(e)) return ret("cuEventSynchronize", CUDA_ERROR_INVALID_HANDLE);
  if (e->recorded) {
    run_until(e->stream, e->pos);
    host_observe(e->vc);
  }
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h) {
  LOCK();
  count("cuMemcpyDtoDAsync");
  CUresult err = CUDA_SUCCESS;
  CUstream_st* s = resolve(h, true, &err);
  if (!s) return ret("cuMemcpyDtoDAsync", err);
  if (n == 0) return CUDA_SUCCESS;
  const Alloc* d = find_alloc(reinterpret_cast<void*>(dst), n);
  const Alloc* r = find_alloc(reinterpret_cast<void*>(src), n);
  if (!d || !r || d->free_pending || r->free_pending)
    return ret("cuMemcpyDtoDAsync", CUDA_ERROR_INVALID_VALUE);
  enqueue(s, {}, nullptr,
          [dst, src, n] {
            memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n);
          },
          {{src, src + n, false}, {dst, dst + n, true}}, "cuMemcpyDtoDAsync");
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytes, CUstream h) {
  LOCK();
  count("cuMemAllocAsync");
  if (!dptr || bytes == 0) return ret("cuMemAllocAsync", CUDA_ERROR_INVALID_VALUE);
  CUcontext ctx = current_ctx();
  if (!ctx) return ret("cuMemAllocAsync", CUDA_ERROR_INVALID_CONTEXT);
  CUresult err = CUDA_SUCCESS;
  CUstream_st* s = resolve(h, true, &err);
  if (!s) return ret("cuMemAllocAsync", err);
  void* p = allocate(bytes, ctx->device, false, true);
  if (!p) return ret("cuMemAllocAsync", CUDA_ERROR_OUT_OF_MEMORY);
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  // Stream-ordered: the memory is the stream's from here on.
  enqueue(s, {}, nullptr, nullptr, {{a, a + bytes, true}}, "cuMemAllocAsync");
  *dptr = a;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream h) {
  LOCK();
  count("cuMemFreeAsync");
  CUresult err = CUDA_SUCCESS;
  CUstream_st* s = resolve(h, true, &err);
  if (!s) return ret("cuMemFreeAsync", err);
  auto it = g_allocs.find(dptr);
  if (it == g_allocs.end() || !it->second.async || it->second.free_pending)
    return ret("cuMemFreeAsync", CUDA_ERROR_INVALID_VALUE);
  it->second.free_pending = true;
  const uintptr_t base = dptr;
  enqueue(s, {}, nullptr, [base] { release(base); },
          {{base, base + it->second.bytes, true}}, "cuMemFreeAsync");
  return CUDA_SUCCESS;
}

// Page-locked host memory and a copy between any two pointers (unified addressing), for
// host staging (core/host_staging.cpp).
FAKE_EXPORT CUresult cuMemHostAlloc(void** pp, size_t bytes, unsigned int flags) {
  LOCK();
  count("cuMemHostAlloc");
  (void)flags;
  if (!pp || bytes == 0) return ret("cuMemHostAlloc", CUDA_ERROR_INVALID_VALUE);
  CUcontext ctx = current_ctx();
  if (!ctx) return ret("cuMemHostAlloc", CUDA_ERROR_INVALID_CONTEXT);
  *pp = allocate(bytes, ctx->device, false, false, true);
  return ret("cuMemHostAlloc", *pp ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY);
}

FAKE_EXPORT CUresult cuMemFreeHost(void* p) {
  LOCK();
  count("cuMemFreeHost");
  auto it = g_allocs.find(reinterpret_cast<uintptr_t>(p));
  if (it == g_allocs.end() || !it->second.pinned) return ret("cuMemFreeHost", CUDA_ERROR_INVALID_VALUE);
  const uintptr_t a = it->first;
  check_races(g_host, a, a + it->second.bytes, true, "cuMemFreeHost");
  release(a);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h) {
  LOCK();
  count("cuMemcpyAsync");
  CUresult err = CUDA_SUCCESS;
  CUstream_st* s = resolve(h, true, &err);
  if (!s) return ret("cuMemcpyAsync", err);
  if (n == 0) return CUDA_SUCCESS;
  if (!dst || !src) return ret("cuMemcpyAsync", CUDA_ERROR_INVALID_VALUE);
  enqueue(s, {}, nullptr,
          [dst, src, n] {
            memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n);
          },
          {{src, src + n, false}, {dst, dst + n, true}}, "cuMemcpyAsync");
  return CUDA_SUCCESS;
}

// ---- fake_api.h: for test programs -----------------------------------------------------

FAKE_EXPORT void* fake_cuda_malloc(size_t bytes) {
  LOCK();
  return g_devices > 0 ? allocate(bytes, 0, false, false) : nullptr;
}

FAKE_EXPORT void* fake_cuda_malloc_device(int device, size_t bytes) {
  LOCK();
  return device >= 0 && device < g_devices ? allocate(bytes, device, false, false) : nullptr;
}

FAKE_EXPORT void* fake_cuda_malloc_pinned(size_t bytes) {
  LOCK();
  return g_devices > 0 ? allocate(bytes, 0, false, false, true) : nullptr;
}

FAKE_EXPORT void* fake_cuda_malloc_managed(size_t bytes) {
  LOCK();
  return g_devices > 0 ? allocate(bytes, 0, true, false) : nullptr;
}

FAKE_EXPORT void fake_cuda_free(void* p) {
  LOCK();
  if (!p) return;
  auto it = g_allocs.find(reinterpret_cast<uintptr_t>(p));
  if (it == g_allocs.end() || it->second.async) {
    fprintf(stderr, "fake_cuda: fake_cuda_free(%p): not a fake_cuda_malloc* allocation\n", p);
    count("errors");
    return;
  }
  const uintptr_t a = it->first;
  check_races(g_host, a, a + it->second.bytes, true, "the host (freeing it)");
  release(a);
}

FAKE_EXPORT int fake_cuda_runtime_init(void) {
  LOCK();
  if (g_devices == 0) return CUDA_ERROR_NO_DEVICE;
  ++g_ctx[0].refs;
  count("ctx_refs");
  if (t_ctx_stack.empty())
    t_ctx_stack.push_back(&g_ctx[0]);
  else
    t_ctx_stack.back() = &g_ctx[0];
  return CUDA_SUCCESS;
}

FAKE_EXPORT void fake_cuda_runtime_fini(void) {
  LOCK();
  if (g_devices == 0 || g_ctx[0].refs <= 0) return;
  --g_ctx[0].refs;
  count("ctx_refs", -1);
  if (!t_ctx_stack.empty() && t_ctx_stack.back() == &g_ctx[0]) t_ctx_stack.pop_back();
}

FAKE_EXPORT CUstream fake_cuda_stream_create(unsigned flags) {
  LOCK();
  return new_stream(flags & CU_STREAM_NON_BLOCKING, 0, false);
}

FAKE_EXPORT void fake_cuda_stream_destroy(CUstream h) {
  LOCK();
  if (!is_legacy_handle(h) && g_live_streams.count(h)) destroy_stream(h);
}

FAKE_EXPORT int fake_cuda_stream_sync(CUstream h) {
  LOCK();
  return sync_stream(h, false);
}

FAKE_EXPORT int fake_cuda_pending(CUstream h) {
  LOCK();
  CUresult err;
  CUstream_st* s = resolve(h, false, &err);
  return s ? static_cast<int>(s->pending.size()) : -1;
}

FAKE_EXPORT int fake_cuda_enqueue_copy(CUstream h, void* dst, const void* src, size_t bytes) {
  LOCK();
  CUresult err = CUDA_SUCCESS;
  CUstream_st* s = resolve(h, false, &err);
  if (!s) return err;
  const Alloc* d = find_alloc(dst, bytes);
  if (!d || d->free_pending) return CUDA_ERROR_INVALID_VALUE;
  auto copy = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                  static_cast<const char*>(src) + bytes);
  const uintptr_t a = reinterpret_cast<uintptr_t>(dst);
  enqueue(s, {}, nullptr, [dst, copy] { memcpy(dst, copy->data(), copy->size()); },
          {{a, a + bytes, true}}, "the program's copy to the device");
  return CUDA_SUCCESS;
}

FAKE_EXPORT int fake_cuda_host_access(const void* p, size_t bytes, int write) {
  LOCK();
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  return check_races(g_host, a, a + bytes, write != 0, "the host");
}

FAKE_EXPORT int fake_cuda_deferred(void) {
  LOCK();
  return g_defer ? 1 : 0;
}

FAKE_EXPORT unsigned long long fake_cuda_counter(const char* name) {
  LOCK();
  auto it = g_counters.find(name ? name : "");
  return it == g_counters.end() ? 0 : it->second;
}

FAKE_EXPORT unsigned long long fake_cuda_sync_count(void) {
  return fake_cuda_counter("cuStreamSynchronize");
}

// ---- fake_api.h: for the fake NCCL ------------------------------------------------------

FAKE_EXPORT int fake_cuda_enqueue(CUstream h, int check_ctx, void (*fn)(void*), void* arg,
                                  const fake_cuda_range* ranges, int nranges, const char* what) {
  LOCK();
  CUresult err = CUDA_SUCCESS;
  CUstream_st* s = resolve(h, check_ctx != 0, &err);
  if (!s) return err;
  enqueue(s, {}, nullptr, [fn, arg] { fn(arg); }, ranges_of(ranges, nranges),
          what ? what : "fake work");
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUevent fake_cuda_event_new(void) {
  LOCK();
  auto* e = new CUevent_st;
  e->internal = true;
  g_events.insert(e);
  return e;
}

FAKE_EXPORT int fake_cuda_event_record(CUevent e, CUstream h, int check_ctx) {
  LOCK();
  if (!g_events.count(e)) return CUDA_ERROR_INVALID_HANDLE;
  CUresult err = CUDA_SUCCESS;
  CUstream_st* s = resolve(h, check_ctx != 0, &err);
  if (!s) return err;
  return record(e, s);
}

FAKE_EXPORT int fake_cuda_stream_wait(CUstream h, CUevent e, int check_ctx) {
  LOCK();
  if (!g_events.count(e)) return CUDA_ERROR_INVALID_HANDLE;
  CUresult err = CUDA_SUCCESS;
  CUstream_st* s = resolve(h, check_ctx != 0, &err);
  if (!s) return err;
  wait_event(s, e);
  return CUDA_SUCCESS;
}

FAKE_EXPORT int fake_cuda_event_sync(CUevent e) {
  LOCK();
  if (!g_events.count(e)) return CUDA_ERROR_INVALID_HANDLE;
  if (e->recorded) run_until(e->stream, e->pos);  // not a host observation: internal
  return CUDA_SUCCESS;
}

FAKE_EXPORT void fake_cuda_event_delete(CUevent e) {
  LOCK();
  if (g_events.erase(e)) delete e;
}

FAKE_EXPORT int fake_cuda_is_device(const void* p, size_t bytes) {
  LOCK();
  const Alloc* a = find_alloc(p, bytes ? bytes : 1);
  return a && !a->free_pending && !a->pinned ? 1 : 0;
}

FAKE_EXPORT int fake_cuda_current_device(void) {
  LOCK();
  CUcontext c = current_ctx();
  return c ? c->device : -1;
}
