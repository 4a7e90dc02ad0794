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
//    cuMemAllocAsync; "pinned memory" from fake_cuda_malloc_pinned or cuMemHostAlloc; each
//    allocation on pages of its own (mmap), never in the heap or on a stack, as the real
//    driver's.
//    cuPointerGetAttributes reports CU_MEMORYTYPE_DEVICE (HOST for pinned memory), the
//    device and IS_MANAGED for it, and, like the real driver, succeeds with zeroed values
//    for any other pointer; cuPointerGetAttribute fails with CUDA_ERROR_INVALID_VALUE for
//    other pointers (pageable host memory).
//  - Streams: an ordered queue of host closures per stream; handle 0 and CU_STREAM_LEGACY
//    name the legacy default stream; CU_STREAM_PER_THREAD names the calling host thread's
//    own default stream (one per thread and device, made at its first use, a blocking
//    stream, as the per-thread default stream of the real driver is); both need a
//    current context, as in the real driver. Streams created without
//    CU_STREAM_NON_BLOCKING (and the per-thread streams) are ordered after the legacy
//    stream, and the legacy stream after them.
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
//  - Host waits (route ht): cuStreamWaitValue32 (GEQ with wrap-around, EQ, AND, NOR;
//    no FLUSH) and a launch of the streamcoll_wait_geq kernel (cuModuleLoadData of a PTX
//    image declaring `.entry streamcoll_wait_geq(.param .u64, .param .u32)`,
//    cuModuleGetFunction, cuLaunchKernel with grid and block 1x1x1, kernelParams[0] ->
//    the flag's device address, [1] -> the value: the same wait as GEQ) are stream work
//    that runs only once the condition holds on the 32-bit word, which the host stores
//    from any thread (read with an acquire load). The word must be 4-byte aligned, in
//    fake device memory or in pinned memory from cuMemHostAlloc with
//    CU_MEMHOSTALLOC_DEVICEMAP (cuMemHostGetDevicePointer gives its device address: the
//    host address; an error for any other memory). A stream held by a wait, and
//    everything ordered after it, is "stuck": cuEventQuery/cuStreamQuery answer
//    CUDA_ERROR_NOT_READY and never block; cuStreamSynchronize/cuEventSynchronize poll,
//    letting go of the lock between polls, so that other threads' calls (a progress
//    thread's queries and copies) go on; a stuck stream that is destroyed finishes once
//    it can. Without deferral, stuck work runs at the first call into the fake after the
//    flag is stored. FAKE_CUDA_NO_STREAM_MEMOPS=1: cuStreamWaitValue32 answers
//    CUDA_ERROR_NOT_SUPPORTED (counted as "not_supported", not as an error) and the
//    memory-operation attributes say 0.
//    FAKE_CUDA_PTXAS=<ptxas>: cuModuleLoadData also runs the real PTX assembler on the
//    image. FAKE_CUDA_WAIT_WARN=<s> (default 60): a synchronising call stuck that long
//    says which wait holds it. The release check (check_release below): pinned memory
//    read by work after a wait is taken as written by the host before it stored the flag;
//    stream accesses to it the host had not seen complete by then are races.
//    Counters: "pending_waits" (gauge), "memop_waits", "kernel_waits",
//    "memop_waits_passed", "kernel_waits_passed", "held_queries" (queries that found a
//    stream stuck behind a host wait), "blocked_syncs" (polls of a synchronising call
//    stuck behind one), "live_modules" (gauge).
//  - Work run beside the host (fake_cuda_enqueue_async; the fake NCCL's operations, which
//    a thread per NCCL communicator runs as a GPU runs a kernel once it is launched): a
//    launch closure that hands the work over and never blocks, then a wait, stuck like a
//    host wait, until a probe the fake polls says the work is done (queries answer
//    CUDA_ERROR_NOT_READY and never block; synchronising calls poll without the lock),
//    then a closure that ends it and carries the work's memory ranges, so that the
//    happens-before check places its reads and writes where they complete. With
//    deferral the launch too waits until something waits for the stream. A query that
//    finds a stream held by async work yields the CPU after letting go of the lock (a
//    caller polling in a tight loop would otherwise starve the threads running the work,
//    which on a GPU would not need the CPU). Counted apart from host waits:
//    "async_launched", "async_pending" (gauge), "async_held_queries",
//    "async_blocked_syncs".
//  - Memory across processes and kernels as host code (route nvgroup): cuMemAlloc memory
//    is POSIX shared memory (page-rounded), so cuIpcGetMemHandle can name it and another
//    process open it with cuIpcOpenMemHandle (its own handles it cannot: as the real
//    driver; cuIpcCloseMemHandle unmaps); cuMemHostRegister makes any host memory (e.g. a
//    shared mapping) pinned, with a device address under CU_MEMHOSTREGISTER_DEVICEMAP.
//    cuDeviceGetByPCIBusId finds this process's devices by bus id; cuDeviceCanAccessPeer
//    says yes between two distinct devices unless FAKE_CUDA_NO_PEER=1. A fatbin image
//    (magic 0xba55ed50, built with nvcc --no-compress) that names one of streamcoll's
//    kernels (kHostKernels: NV-Group's allreduce, route ccube's elementwise reduction,
//    host staging's batched copies) loads; cuLaunchKernel of such a kernel checks the launch and runs the kernel's logic
//    compiled for the host (algorithms/nvgroup_kernel.hpp) as
//    work run beside the host (below), its grid's blocks in turn on one thread; a block
//    waits only for the same block of other processes, which run their own. Counted:
//    "host_kernels", "nvgroup_direct_inputs" (launches whose input is read in place by
//    the peers), "live_ipc_mappings", "live_registered" (gauges).
//    FAKE_CUDA_MALLOC_SHM=1: fake_cuda_malloc(_device) memory is shared memory too, IPC
//    capable like cudaMalloc's (CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE says 1 for
//    shared memory only; cuMemAllocAsync memory never is, as on a real GPU).
//  - Failures on demand: FAKE_CUDA_FAIL=<entry point>:N[,<entry point>:N...] makes the
//    N-th call of each named entry point fail, on the local rank FAKE_CUDA_FAIL_RANK only
//    when that is set; fake_cuda_fail_after(api, n) arms the n-th call from now at run
//    time (a test walking every failure point of a route). Allocations and creations
//    fail with CUDA_ERROR_OUT_OF_MEMORY and do nothing; other calls with
//    CUDA_ERROR_ILLEGAL_ADDRESS: enqueuing calls enqueue nothing; synchronising calls
//    (cuStreamSynchronize, cuEventSynchronize) wait first, then fail; queries
//    (cuStreamQuery, cuEventQuery) fail only once the work is done (a fault reported at
//    the end of the work: whoever sees it may release the buffers), an armed query that
//    finds work pending moves the failure to the next call. Entry points that can fail:
//    kInjectable below. Counted under "injected_failures" (not under "errors", which
//    counts misuse).
//  - Contexts: cuStreamCreate, cuEventCreate, cuMemAllocAsync, cuMemHostAlloc and every
//    use of the legacy stream need a current context (CUDA_ERROR_INVALID_CONTEXT
//    otherwise); cuCtxPushCurrent needs a retained primary context.
//  - Other checks: copies (cuMemcpyDtoDAsync) only between fake allocations; destroyed
//    streams and events are invalid handles; releasing an unretained context fails.
//    fake_cuda_counter() reads call counts and gauges (live streams, events, retained
//    contexts, allocations) for leak checks.
// All of it but the shared memory above is single-process: one recursive lock serialises
// every call; deferred work runs on the thread that waits for it, holding the lock (a
// synchronising call lets go of it between polls while a host wait or async work holds
// its stream). Async work itself runs on its own thread, without the lock, and calls
// nothing here.
#include <cuda.h>
#include <fcntl.h>
#include <sched.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "algorithms/nvgroup_kernel.hpp"
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

struct RangeUse {
  uintptr_t lo, hi;
  bool write;
};

// A wait on a 32-bit word that the host writes (cuStreamWaitValue32, or the
// streamcoll_wait_geq kernel): the stream stops here until the condition holds.
// Or, for work run beside the host (fake_cuda_enqueue_async), the end of that work:
// probe(arg) says whether it is done.
struct HostWait {
  uintptr_t addr = 0;
  uint32_t value = 0;
  unsigned mode = CU_STREAM_WAIT_VALUE_GEQ;
  bool kernel = false;
  int (*probe)(void*) = nullptr;  // set: the end of async work, not a host wait
  void* probe_arg = nullptr;
};

struct Item {
  uint64_t idx = 0;
  std::vector<Dep> deps;      // run these streams up to these positions first
  std::function<void()> fn;   // may be empty (an event record or a wait)
  bool is_wait = false;       // a HostWait (blocks until the flag is written)
  HostWait wait;
  std::vector<RangeUse> ranges;  // what fn reads and writes (for the flag-release check)
  std::string what;
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
  // The last host wait of this stream that was seen satisfied: its position, the flag,
  // and what the host had seen complete at that moment (its release).
  uint64_t release_idx = 0;
  uintptr_t release_flag = 0;
  VC release_host;
  bool released = false;
};

// A module from cuModuleLoadData (PTX text, or a fatbin of streamcoll's kernels) and the
// functions the fake can launch: streamcoll_wait_geq (PTX), or a kernel the fake runs as
// host code (kHostKernels).
struct CUmod_st {
  std::string image;
  bool fatbin = false;
};
struct CUfunc_st {
  CUmod_st* mod = nullptr;
  void (*host)(const void* params) = nullptr;  // a host kernel: run with its parameter
  size_t param_bytes = 0;
  const char* name = "streamcoll_wait_geq";
};

struct CUevent_st {
  bool recorded = false;
  bool internal = false;
  int device = 0;  // of the context it was created in (fake_cuda_device_reset)
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
  unsigned host_flags = 0;  // cuMemHostAlloc flags (CU_MEMHOSTALLOC_*)
  // Shared memory (route nvgroup): a cuMemAlloc allocation (POSIX shared memory, so that
  // another process can open its IPC handle), a mapping of another process's
  // (cuIpcOpenMemHandle), or host memory registered with cuMemHostRegister (not owned).
  enum Kind : uint8_t { plain, shm, ipc, registered } kind = plain;
  std::string shm_name;  // shm: its name
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
thread_local int t_depth = 0;         // fake API calls on this thread's stack (lock depth)
bool g_no_memops = false;              // FAKE_CUDA_NO_STREAM_MEMOPS=1
double g_wait_warn_s = 60;             // FAKE_CUDA_WAIT_WARN: say so when a wait is stuck
// FAKE_CUDA_FAIL / fake_cuda_fail_after: entry point -> the number of its call that fails.
std::map<std::string, unsigned long long> g_fail;
std::set<CUstream_st*> g_orphans;      // destroyed with work stuck behind a host wait
std::set<CUmod_st*> g_modules;         // loaded modules
std::set<CUfunc_st*> g_functions;

void count(const char* name, long long delta = 1) { g_counters[name] += delta; }

// The entry points whose calls FAKE_CUDA_FAIL / fake_cuda_fail_after can make fail.
const char* const kInjectable[] = {
    "cuMemHostAlloc", "cuMemcpyAsync", "cuMemcpyDtoDAsync", "cuMemAllocAsync", "cuEventCreate",
    "cuEventRecord", "cuEventQuery", "cuEventSynchronize", "cuStreamCreate", "cuStreamWaitEvent",
    "cuStreamQuery", "cuStreamSynchronize", "cuStreamWaitValue32", "cuLaunchKernel",
    "cuModuleLoadData", "cuMemHostGetDevicePointer", "cuDevicePrimaryCtxRetain", "cuMemAlloc",
    "cuIpcGetMemHandle", "cuIpcOpenMemHandle", "cuMemHostRegister"};
bool injectable(const std::string& api) {
  for (const char* a : kInjectable)
    if (api == a) return true;
  return false;
}

// Whether this call of `api` (already counted) is the one to fail.
bool injected_failure(const char* api) {
  if (g_fail.empty()) return false;
  auto it = g_fail.find(api);
  if (it == g_fail.end() || g_counters[api] != it->second) return false;
  fprintf(stderr, "fake_cuda: injected failure: call %llu of %s fails\n", it->second, api);
  g_fail.erase(it);
  count("injected_failures");
  return true;
}
// A query armed to fail that finds the work still pending: the next call fails instead.
void postpone_failure(const char* api) {
  auto it = g_fail.find(api);
  if (it != g_fail.end() && g_counters[api] == it->second) ++it->second;
}

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
  const char* nm = getenv("FAKE_CUDA_NO_STREAM_MEMOPS");
  g_no_memops = nm && strcmp(nm, "1") == 0;
  if (const char* w = getenv("FAKE_CUDA_WAIT_WARN")) g_wait_warn_s = atof(w);
  const char* lr = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  if (!lr) lr = getenv("MPI_LOCALRANKID");
  if (!lr) lr = getenv("PMI_LOCAL_RANK");
  g_local_rank = lr ? atoi(lr) : 0;
  if (const char* f = getenv("FAKE_CUDA_FAIL")) {  // "<entry point>:<n>[,...]"
    const char* rk = getenv("FAKE_CUDA_FAIL_RANK");
    if (!rk || atoi(rk) == g_local_rank) {
      std::string list = f;
      for (size_t at = 0; at < list.size();) {
        size_t end = list.find(',', at);
        if (end == std::string::npos) end = list.size();
        const std::string item = list.substr(at, end - at);
        const size_t colon = item.find(':');
        const std::string api = item.substr(0, colon);
        if (colon == std::string::npos || !injectable(api)) {
          fprintf(stderr, "fake_cuda: FAKE_CUDA_FAIL: '%s' is not <entry point>:<n> with an "
                          "entry point that can fail\n", item.c_str());
          abort();
        }
        g_fail[api] = strtoull(item.c_str() + colon + 1, nullptr, 10);
        at = end + 1;
      }
    }
  }
  g_ctx.assign(static_cast<size_t>(g_devices), CUctx_st{});
  for (int i = 0; i < g_devices; ++i) g_ctx[i].device = i;
  auto* legacy = new CUstream_st;
  legacy->id = 0;
  legacy->legacy = true;
  g_streams.push_back(legacy);
}

CUstream_st* legacy() { return g_streams[0]; }

// A default stream's handle (legacy or per-thread): never created or destroyed by the
// program.
bool is_legacy_handle(CUstream h) {
  return h == nullptr || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD;
}

CUcontext current_ctx() { return t_ctx_stack.empty() ? nullptr : t_ctx_stack.back(); }

CUstream_st* new_stream(unsigned flags, int device, bool internal);
// This thread's per-thread default stream on `device`, made at its first use.
thread_local std::map<int, CUstream_st*> t_per_thread;
CUstream_st* per_thread(int device) {
  CUstream_st*& s = t_per_thread[device];
  // blocking; internal: not counted, not destroyable; again after fake_cuda_device_reset
  if (!s || s->destroyed) s = new_stream(0, device, true);
  return s;
}

// The stream object of a handle, or nullptr with *err set.
CUstream_st* resolve(CUstream h, bool check_ctx, CUresult* err) {
  if (is_legacy_handle(h)) {
    CUcontext ctx = current_ctx();
    if (check_ctx && !ctx) {
      *err = CUDA_ERROR_INVALID_CONTEXT;
      return nullptr;
    }
    if (h == CU_STREAM_PER_THREAD) return per_thread(ctx ? ctx->device : 0);
    return legacy();
  }
  if (!g_live_streams.count(h)) {
    *err = CUDA_ERROR_INVALID_HANDLE;
    return nullptr;
  }
  return h;
}

bool run_until(CUstream_st* s, uint64_t pos);
void check_release(CUstream_st* s, const Item& it);
struct Alloc;
const Alloc* find_alloc(const void* p, size_t n, uintptr_t* base = nullptr);

// The host wait's condition, on the word as it is now (an acquire load: the host's
// release store and everything before it are visible once it is seen).
bool wait_holds(const HostWait& w) {
  if (w.probe) return w.probe(w.probe_arg) != 0;
  const uint32_t v = __atomic_load_n(reinterpret_cast<const uint32_t*>(w.addr), __ATOMIC_ACQUIRE);
  switch (w.mode & ~static_cast<unsigned>(CU_STREAM_WAIT_VALUE_FLUSH)) {
    case CU_STREAM_WAIT_VALUE_GEQ: return static_cast<int32_t>(v - w.value) >= 0;
    case CU_STREAM_WAIT_VALUE_EQ: return v == w.value;
    case CU_STREAM_WAIT_VALUE_AND: return (v & w.value) != 0;
    case CU_STREAM_WAIT_VALUE_NOR: return ~(v | w.value) != 0;
    default: return false;
  }
}

// Runs the front item of s if it can run now: its dependencies reach their positions
// and, for a host wait, the flag holds. False (nothing changed for this item) otherwise.
bool try_front(CUstream_st* s) {
  Item& front = s->pending.front();
  s->running = true;
  for (const Dep& d : front.deps)
    if (!run_until(d.stream, d.pos)) {
      s->running = false;
      return false;
    }
  if (front.is_wait && front.wait.probe) {
    if (!wait_holds(front.wait)) {
      s->running = false;
      return false;
    }
    count("async_pending", -1);  // async work done: no flag, no release
  } else if (front.is_wait) {
    if (!wait_holds(front.wait)) {
      s->running = false;
      return false;
    }
    // The host released the flag: what it had seen complete by now is what the work
    // after the wait may rely on (check_release).
    s->released = true;
    s->release_idx = front.idx;
    s->release_flag = front.wait.addr;
    s->release_host = g_host;
    count("pending_waits", -1);
    count(front.wait.kernel ? "kernel_waits_passed" : "memop_waits_passed");
  }
  Item it = std::move(front);
  s->pending.pop_front();
  if (s->released && !it.is_wait) check_release(s, it);
  if (it.fn) it.fn();
  s->completed = it.idx;
  s->running = false;
  count("executed");
  return true;
}

// Runs s up to position pos; false when it is stuck behind a host wait (directly or
// through a dependency) that does not hold yet.
bool run_until(CUstream_st* s, uint64_t pos) {
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
    if (!try_front(s)) return false;
  }
  return true;
}

// Advances streams destroyed while stuck (the real driver finishes their work in the
// background), and, without deferral, every stream stuck behind a host wait (work runs
// as soon as it can).
void pump() {
  for (auto it = g_orphans.begin(); it != g_orphans.end();)
    if (run_until(*it, (*it)->enqueued))
      it = g_orphans.erase(it);
    else
      ++it;
  if (!g_defer)
    for (CUstream_st* s : g_live_streams)
      if (!s->pending.empty()) run_until(s, s->enqueued);
  if (!g_defer && !legacy()->pending.empty()) run_until(legacy(), legacy()->enqueued);
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

// The flag release. A host wait (cuStreamWaitValue32, or the streamcoll_wait_geq kernel)
// orders the work after it on its stream after the host's store to the flag, and so after
// everything the host did before that store. The host's own loads and stores are not
// visible to the fake; they are inferred: pinned memory that the work after a host wait
// reads (up to the next event record or wait on that stream; an H2D copy out of a
// staging buffer) is taken as written by the host before it released the flag. The host
// may do that only after it has seen complete (cuEventQuery / cuEventSynchronize /
// cuStreamQuery / cuStreamSynchronize) every earlier stream access to those bytes: the
// D2H copy that filled the staging buffer, the H2D copy of the buffer's previous use. An
// access not seen complete by the moment the fake first sees the flag hold (the release
// is at or before that moment) is a race, reported like any other. Accesses on the
// waiting stream after the wait are ordered after the release and exempt; so is the flag.
void check_release(CUstream_st* s, const Item& it) {
  if (it.is_wait || it.what == "event record") {
    s->released = false;
    return;
  }
  for (const RangeUse& r : it.ranges) {
    if (r.write) continue;
    const Alloc* a = find_alloc(reinterpret_cast<const void*>(r.lo), r.hi - r.lo);
    if (!a || !a->pinned) continue;
    for (const Access& h : g_history) {
      if (h.sid == s->id && h.idx > s->release_idx) continue;  // ordered after the release
      if (at(s->release_host, h.sid) >= h.idx) continue;      // seen complete before it
      if (!overlap(r.lo, r.hi, h.lo, h.hi)) continue;
      if (overlap(h.lo, h.hi, s->release_flag, s->release_flag + 4)) continue;
      count("races");
      if (g_counters["races"] > 20) continue;
      fprintf(stderr,
              "fake_cuda: RACE: %s (stream %d, #%llu) reads pinned [%p, +%zu) after waiting "
              "for the host's flag %p, so the host wrote it before releasing the flag; but "
              "the host had not seen %s (stream %d, #%llu), which %s [%p, +%zu), complete "
              "(no successful cuEventQuery/Synchronize after it) when it released the flag\n",
              it.what.c_str(), s->id, static_cast<unsigned long long>(it.idx),
              reinterpret_cast<void*>(r.lo), static_cast<size_t>(r.hi - r.lo),
              reinterpret_cast<void*>(s->release_flag), h.what.c_str(), h.sid,
              static_cast<unsigned long long>(h.idx), h.write ? "writes" : "reads",
              reinterpret_cast<void*>(h.lo), static_cast<size_t>(h.hi - h.lo));
    }
  }
}

// The wait a stuck stream is held by (following dependencies): a host wait or the end of
// async work; nullptr if none is found. *at: its stream.
const Item* holder(CUstream_st* s, CUstream_st** at = nullptr, int depth = 0) {
  if (s->pending.empty() || depth > 8) return nullptr;
  const Item& f = s->pending.front();
  for (const Dep& d : f.deps)
    if (d.stream->completed < d.pos) return holder(d.stream, at, depth + 1);
  if (!f.is_wait) return nullptr;
  if (at) *at = s;
  return &f;
}

bool held_by_async(CUstream_st* s) {
  const Item* h = holder(s);
  return h && h->wait.probe;
}

// What holds a stuck stream, for messages.
std::string stuck_at(CUstream_st* s) {
  CUstream_st* at = nullptr;
  const Item* h = holder(s, &at);
  if (!h) return "?";
  char buf[512];
  if (h->wait.probe)
    snprintf(buf, sizeof buf, "stream %d #%llu: %s, launched and not done", at->id,
             static_cast<unsigned long long>(h->idx), h->what.c_str());
  else
    snprintf(buf, sizeof buf, "stream %d #%llu: %s on %p, value %u, mode %u; the word holds %u",
             at->id, static_cast<unsigned long long>(h->idx), h->what.c_str(),
             reinterpret_cast<void*>(h->wait.addr), h->wait.value, h->wait.mode,
             __atomic_load_n(reinterpret_cast<const uint32_t*>(h->wait.addr), __ATOMIC_ACQUIRE));
  return buf;
}

using Lock = std::unique_lock<std::recursive_mutex>;

// Runs s up to pos, as a synchronising call does: while the stream is held by a host
// wait or by async work not done yet, the lock is let go (so that other threads' calls,
// e.g. a progress thread's cuEventQuery, go on) and the thread sleeps, polling.
void run_blocking(Lock& lock, CUstream_st* s, uint64_t pos, const char* api) {
  const auto t0 = std::chrono::steady_clock::now();
  bool warned = false;
  while (!run_until(s, pos)) {
    if (t_depth > 1) {
      fprintf(stderr, "fake_cuda: internal error: %s blocks on a host wait inside another fake "
                      "call, which holds the lock (%s)\n", api, stuck_at(s).c_str());
      abort();
    }
    count(held_by_async(s) ? "async_blocked_syncs" : "blocked_syncs");
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::microseconds(20));
    lock.lock();
    pump();
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!warned && g_wait_warn_s > 0 && waited > g_wait_warn_s) {
      warned = true;
      fprintf(stderr, "fake_cuda: %s has waited %.0f s for %s: %s\n", api, waited,
              held_by_async(s) ? "async work (a fake NCCL operation) to end"
                               : "a host flag that nobody writes",
              stuck_at(s).c_str());
    }
  }
}

// Appends work to s: implicit order first (what the host has seen, the legacy stream),
// then `extra_vc` (an event waited on), then the race check.
void enqueue(CUstream_st* s, std::vector<Dep> deps, const VC* extra_vc, std::function<void()> fn,
             const std::vector<RangeUse>& ranges, const std::string& what,
             const HostWait* wait = nullptr) {
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
  it.ranges = ranges;
  it.what = what;
  if (wait) {
    it.is_wait = true;
    it.wait = *wait;
    count(wait->probe ? "async_pending" : "pending_waits");
  }
  s->pending.push_back(std::move(it));
  // Without deferral work runs at once, unless it is behind a host wait that does not
  // hold yet: then it runs as soon as the stream can go on (pump).
  if (!g_defer) run_until(s, s->enqueued);
}

// The allocation holding [p, p + n), or nullptr.
const Alloc* find_alloc(const void* p, size_t n, uintptr_t* base) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = g_allocs.upper_bound(a);
  if (it == g_allocs.begin()) return nullptr;
  --it;
  if (a < it->first || a + n > it->first + it->second.bytes || a + n < a) return nullptr;
  if (base) *base = it->first;
  return &it->second;
}

// Whether a kernel may read and write [p, p + n): fake device or managed memory, or pinned
// host memory (cuMemHostAlloc, cuMemHostRegister: with unified addressing a kernel uses
// its host address). Pageable host memory is not.
bool is_kernel_reachable(uint64_t p, uint64_t n) {
  return find_alloc(reinterpret_cast<const void*>(p), n, nullptr) != nullptr;
}

// Pages of their own (mmap), outside the process's heap and stacks, as the real driver's
// device, managed and page-locked allocations are (streamcoll takes memory in the heap or
// on a stack for host memory without asking the driver).
size_t mapped_length(size_t bytes) { return (bytes + 4095) / 4096 * 4096; }

void* allocate(size_t bytes, int device, bool managed, bool async, bool pinned = false) {
  if (bytes == 0) return nullptr;
  void* p = mmap(nullptr, mapped_length(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                 -1, 0);
  if (p == MAP_FAILED) return nullptr;
  g_allocs[reinterpret_cast<uintptr_t>(p)] =
      Alloc{bytes, device, managed, pinned, async, false, ++g_alloc_ids, 0u, Alloc::plain, {}};
  count(async ? "live_async_allocs" : pinned ? "live_host_allocs" : "live_allocs");
  return p;
}

std::atomic<unsigned> g_shm_seq{0};

// Device memory as POSIX shared memory (page-rounded), so that cuIpcGetMemHandle can name
// it and another process open it: cuMemAlloc's, and fake_cuda_malloc(_device)'s under
// FAKE_CUDA_MALLOC_SHM=1 (cudaMalloc memory is IPC-capable on a real GPU). nullptr when
// the system refuses.
void* shm_allocate(size_t bytes, int device) {
  char name[48];
  snprintf(name, sizeof name, "/fake-cuda-%d-%u", static_cast<int>(getpid()), g_shm_seq.fetch_add(1));
  const size_t len = (bytes + 4095) / 4096 * 4096;
  const int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return nullptr;
  void* p = ftruncate(fd, static_cast<off_t>(len)) == 0
                ? mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                : MAP_FAILED;
  close(fd);
  if (p == MAP_FAILED) {
    shm_unlink(name);
    return nullptr;
  }
  Alloc a{len, device, false, false, false, false, ++g_alloc_ids, 0u, Alloc::shm, {}};
  a.kind = Alloc::shm;
  a.shm_name = name;
  g_allocs[reinterpret_cast<uintptr_t>(p)] = a;
  count("live_allocs");
  return p;
}

bool malloc_shm() {
  static const bool on = [] {
    const char* v = getenv("FAKE_CUDA_MALLOC_SHM");
    return v && strcmp(v, "1") == 0;
  }();
  return on;
}

void release(uintptr_t base) {
  auto it = g_allocs.find(base);
  if (it == g_allocs.end()) return;
  const uintptr_t hi = base + it->second.bytes;
  const Alloc::Kind kind = it->second.kind;
  const std::string shm_name = it->second.shm_name;
  if (it->second.kind == Alloc::plain || it->second.kind == Alloc::shm)  // ipc, registered: their own gauges
    count(it->second.async ? "live_async_allocs" : it->second.pinned ? "live_host_allocs" : "live_allocs", -1);
  g_allocs.erase(it);
  // The memory is gone: what was done to it matters no more (the address may be reused).
  g_history.erase(std::remove_if(g_history.begin(), g_history.end(),
                                 [&](const Access& a) { return overlap(a.lo, a.hi, base, hi); }),
                  g_history.end());
  if (kind == Alloc::shm || kind == Alloc::ipc) {
    munmap(reinterpret_cast<void*>(base), hi - base);
    if (kind == Alloc::shm) shm_unlink(shm_name.c_str());
  } else if (kind == Alloc::plain) {
    munmap(reinterpret_cast<void*>(base), mapped_length(hi - base));
  }
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
  // The real driver finishes the work in the background; here it runs now, or, when it
  // is stuck behind a host wait, as soon as it can (pump).
  if (!run_until(s, s->enqueued)) g_orphans.insert(s);
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

// A query's answer when s cannot reach its position: held by a host wait or by async
// work. *async: held by async work (the caller yields the CPU to it after the lock).
CUresult held_query(CUstream_st* s, bool* async) {
  *async = held_by_async(s);
  count(*async ? "async_held_queries" : "held_queries");
  count("not_ready");
  return CUDA_ERROR_NOT_READY;
}

// SUCCESS when the work before e is done; otherwise runs it and says NOT_READY.
CUresult query_event(CUevent_st* e, bool* async) {
  if (!e->recorded) return CUDA_SUCCESS;
  if (e->stream->completed >= e->pos) {
    host_observe(e->vc);
    return CUDA_SUCCESS;
  }
  if (!run_until(e->stream, e->pos)) return held_query(e->stream, async);
  count("not_ready");
  return CUDA_ERROR_NOT_READY;
}

// After a query that found a stream held by async work, with the lock let go: the
// thread yields, so that a caller polling in a tight loop leaves the CPU to the threads
// running the work (on a GPU they would not compete for it).
void yield_to_async(Lock& lock, bool async) {
  if (!async) return;
  lock.unlock();
  std::this_thread::yield();
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

namespace {
struct Depth {
  Depth() { ++t_depth; }
  ~Depth() { --t_depth; }
  Depth(const Depth&) = delete;
  Depth& operator=(const Depth&) = delete;
};
}  // namespace

// Every entry point: the lock, and (without deferral) stuck streams advanced.
#define LOCK()                 \
  Lock lock(g_mu);             \
  Depth depth_guard;           \
  init_once();                 \
  pump()

namespace {

// ---- kernels run as host code (route nvgroup) -------------------------------------------
// streamcoll's own kernels whose logic also compiles for the host: a fatbin that names
// one of them loads (cuModuleLoadData) and cuLaunchKernel runs the host version, as work
// run beside the host (like the fake NCCL's operations: a thread runs it, the stream
// waits for its end), every block index in turn on that thread (a block waits only for
// the same block index of other processes, which run their own threads).

void nvgroup_allreduce_host(const void* params) {
  const auto& p = *static_cast<const streamcoll::nvgroup::Params*>(params);
  for (uint32_t b = 0; b < p.blocks; ++b) {
    streamcoll::nvgroup::Shared sh{};
    streamcoll::nvgroup::run_block(p, b, 0, 1, &sh);
  }
}

struct HostKernel {
  const char* name;
  void (*run)(const void*);
  size_t param_bytes;
  // Checks the launch (grid, block, parameters); an error message or nullptr.
  const char* (*check)(const void* params, unsigned gx, unsigned bx);
};

const char* check_nvgroup(const void* params, unsigned gx, unsigned bx) {
  const auto& p = *static_cast<const streamcoll::nvgroup::Params*>(params);
  if (gx != p.blocks || p.blocks == 0 || p.blocks > streamcoll::nvgroup::kMaxBlocks)
    return "grid size is not Params::blocks (1..kMaxBlocks)";
  if (bx == 0 || bx > 1024) return "block size not in 1..1024";
  if (p.members == 0 || p.members > streamcoll::nvgroup::kMaxMembers || p.me >= p.members)
    return "members/me out of range";
  if (p.chunk == 0 || p.seq == 0) return "chunk or seq is 0";
  if (p.mode > static_cast<uint32_t>(streamcoll::nvgroup::Mode::allgather)) return "unknown mode";
  if (!p.flags || !p.fails || !p.status) return "null flags, fails or status";
  for (uint32_t m = 0; m < p.members; ++m)
    if (!p.scratch[m]) return "a null scratch pointer";
  if (p.input && !p.maps) return "an input word without the maps table";
  if (p.input && (p.input >> 56) > static_cast<uint64_t>(streamcoll::nvgroup::kSlots))
    return "an input word naming no slot";
  return nullptr;
}

// Route ccube's elementwise reduction (dst = src op dst), the whole grid's elements in turn.
void reduce_host(const void* params) {
  streamcoll::nvgroup::reduce_thread(*static_cast<const streamcoll::nvgroup::ReduceParams*>(params), 0, 1);
}

const char* check_reduce(const void* params, unsigned gx, unsigned bx) {
  namespace nv = streamcoll::nvgroup;
  const auto& p = *static_cast<const nv::ReduceParams*>(params);
  if (bx != nv::kReduceThreads) return "block size is not kReduceThreads";
  if (gx == 0 || gx > nv::kReduceMaxBlocks) return "grid size not in 1..kReduceMaxBlocks";
  if (p.dtype > static_cast<uint32_t>(nv::DType::f64)) return "unknown dtype";
  if (p.op > static_cast<uint32_t>(nv::ROp::max)) return "unknown op";
  if (p.count == 0 || !p.dst || !p.src) return "no elements, or a null pointer";
  const uintptr_t n = p.count * nv::dtype_size(static_cast<nv::DType>(p.dtype));
  const auto d = reinterpret_cast<uintptr_t>(p.dst), x = reinterpret_cast<uintptr_t>(p.src);
  if (d < x + n && x < d + n) return "src overlaps dst";
  return nullptr;
}

// Host staging's batched copies: every block's segments in turn.
void batch_copy_host(const void* params) {
  const auto& p = *static_cast<const streamcoll::nvgroup::BatchCopyParams*>(params);
  streamcoll::nvgroup::batch_copy_block(p, 0, 1, 0, 1);
}

const char* check_batch_copy(const void* params, unsigned gx, unsigned bx) {
  namespace nv = streamcoll::nvgroup;
  const auto& p = *static_cast<const nv::BatchCopyParams*>(params);
  if (bx != nv::kBatchThreads) return "block size is not kBatchThreads";
  if (p.n == 0 || p.n > nv::kBatchMax) return "segments not in 1..kBatchMax";
  if (gx == 0 || gx > p.n) return "grid size not in 1..segments";
  for (uint32_t i = 0; i < p.n; ++i) {
    const auto& x = p.seg[i];
    if (!x.dst || !x.src || !x.bytes) return "a segment without bytes or with a null end";
    if (x.dst < x.src + x.bytes && x.src < x.dst + x.bytes) return "a segment's ends overlap";
    // Both ends must be reachable by a kernel: fake device memory, or pinned host memory
    // (unified addressing: the host address is the device's).
    if (!is_kernel_reachable(x.dst, x.bytes) || !is_kernel_reachable(x.src, x.bytes))
      return "a segment end that is neither device memory nor pinned host memory";
  }
  return nullptr;
}

const HostKernel kHostKernels[] = {
    {"streamcoll_nvgroup_allreduce", nvgroup_allreduce_host, sizeof(streamcoll::nvgroup::Params),
     check_nvgroup},
    {"streamcoll_reduce", reduce_host, sizeof(streamcoll::nvgroup::ReduceParams), check_reduce},
    {"streamcoll_batch_copy", batch_copy_host, sizeof(streamcoll::nvgroup::BatchCopyParams),
     check_batch_copy},
};

CUresult load_fatbin(CUmodule* module, const unsigned char* b) {
  // Header: magic (4), version (2), header size (2), size of what follows (8).
  uint64_t rest = 0;
  uint16_t header = 0;
  memcpy(&header, b + 6, 2);
  memcpy(&rest, b + 8, 8);
  if (header < 16 || rest == 0 || rest > (1ull << 30)) {
    fprintf(stderr, "fake_cuda: cuModuleLoadData: a malformed fatbin header\n");
    return ret("cuModuleLoadData", CUDA_ERROR_INVALID_IMAGE);
  }
  auto* m = new CUmod_st;
  m->image.assign(reinterpret_cast<const char*>(b), header + rest);
  m->fatbin = true;
  bool known = false;
  for (const HostKernel& k : kHostKernels) known = known || m->image.find(k.name) != std::string::npos;
  if (!known) {
    delete m;
    fprintf(stderr, "fake_cuda: cuModuleLoadData: a fatbin that names none of the kernels the "
                    "fake runs as host code (built with --no-compress?)\n");
    return ret("cuModuleLoadData", CUDA_ERROR_NO_BINARY_FOR_GPU);
  }
  g_modules.insert(m);
  count("live_modules");
  *module = m;
  return CUDA_SUCCESS;
}

struct HostLaunch {
  void (*run)(const void*);
  std::vector<char> params;
  std::thread thread;
  std::atomic<bool> done{false};
};

CUresult launch_host_kernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                            unsigned by, unsigned bz, unsigned shmem, CUstream h, void** params,
                            void** extra) {
  if (!params || extra || !params[0] || gy != 1 || gz != 1 || by != 1 || bz != 1 || shmem != 0)
    return CUDA_ERROR_INVALID_VALUE;
  const HostKernel* k = nullptr;
  for (const HostKernel& x : kHostKernels)
    if (x.run == f->host) k = &x;
  if (const char* why = k->check(params[0], gx, bx)) {
    fprintf(stderr, "fake_cuda: cuLaunchKernel(%s): %s\n", k->name, why);
    return CUDA_ERROR_INVALID_VALUE;
  }
  CUresult err = CUDA_SUCCESS;
  CUstream_st* s = resolve(h, true, &err);
  if (!s) return err;
  auto* l = new HostLaunch;
  l->run = f->host;
  l->params.assign(static_cast<const char*>(params[0]),
                   static_cast<const char*>(params[0]) + f->param_bytes);  // copied at launch
  std::vector<RangeUse> ranges;
  const bool direct_input = f->host == nvgroup_allreduce_host &&
                            reinterpret_cast<const streamcoll::nvgroup::Params*>(l->params.data())->input;
  if (f->host == nvgroup_allreduce_host) {
    namespace nv = streamcoll::nvgroup;
    const auto& p = *reinterpret_cast<const nv::Params*>(l->params.data());
    const uintptr_t block = p.count * nv::dtype_size(static_cast<nv::DType>(p.dtype));
    const auto mode = static_cast<nv::Mode>(p.mode);
    const uintptr_t in_bytes = mode == nv::Mode::reduce_scatter_block ? block * p.members : block;
    const uintptr_t out_bytes = mode == nv::Mode::allgather ? block * p.members : block;
    const auto in = reinterpret_cast<uintptr_t>(p.send), out = reinterpret_cast<uintptr_t>(p.recv);
    if (!overlap(in, in + in_bytes, out, out + out_bytes)) ranges.push_back({in, in + in_bytes, false});
    ranges.push_back({out, out + out_bytes, true});
  } else if (f->host == batch_copy_host) {
    const auto& p = *reinterpret_cast<const streamcoll::nvgroup::BatchCopyParams*>(l->params.data());
    for (uint32_t i = 0; i < p.n; ++i) {
      ranges.push_back({p.seg[i].src, p.seg[i].src + p.seg[i].bytes, false});
      ranges.push_back({p.seg[i].dst, p.seg[i].dst + p.seg[i].bytes, true});
    }
  } else if (f->host == reduce_host) {
    namespace nv = streamcoll::nvgroup;
    const auto& p = *reinterpret_cast<const nv::ReduceParams*>(l->params.data());
    const uintptr_t n = p.count * nv::dtype_size(static_cast<nv::DType>(p.dtype));
    const auto d = reinterpret_cast<uintptr_t>(p.dst), x = reinterpret_cast<uintptr_t>(p.src);
    ranges.push_back({x, x + n, false});
    ranges.push_back({d, d + n, true});
  }
  const std::string name = std::string(k->name) + " (host kernel)";
  enqueue(s, {}, nullptr, [l] {
    count("async_launched");
    l->thread = std::thread([l] {
      l->run(l->params.data());
      l->done.store(true, std::memory_order_release);
    });
  }, {}, name + " (launch)");
  HostWait w;
  w.probe = [](void* a) { return static_cast<HostLaunch*>(a)->done.load(std::memory_order_acquire) ? 1 : 0; };
  w.probe_arg = l;
  enqueue(s, {}, nullptr, nullptr, {}, name + " (running)", &w);
  enqueue(s, {}, nullptr, [l] {
    l->thread.join();
    delete l;
  }, ranges, name);
  count("host_kernels");
  if (direct_input) count("nvgroup_direct_inputs");
  return CUDA_SUCCESS;
}

}  // namespace

// streamcoll::nvgroup::spin_pause for the host build of the kernel: a peer's flag is
// written by another process; let it run (2 cores, 4 ranks).
namespace streamcoll::nvgroup {
void spin_pause() {
  static thread_local unsigned n = 0;
  if (++n % 64 == 0) usleep(50);
  else sched_yield();
}
}  // namespace streamcoll::nvgroup

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
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:  // a boolean, as IS_MANAGED
      *static_cast<bool*>(data) = a && a->kind == Alloc::shm;
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

// For tools (streamcoll-info): "Fake GPU d", 80 GiB each.
FAKE_EXPORT CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
  LOCK();
  count("cuDeviceGetName");
  if (dev < 0 || dev >= g_devices) return ret("cuDeviceGetName", CUDA_ERROR_INVALID_DEVICE);
  if (!name || len <= 0) return ret("cuDeviceGetName", CUDA_ERROR_INVALID_VALUE);
  snprintf(name, static_cast<size_t>(len), "Fake GPU %d", dev);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDeviceTotalMem(size_t* bytes, CUdevice dev) {
  LOCK();
  count("cuDeviceTotalMem");
  if (dev < 0 || dev >= g_devices) return ret("cuDeviceTotalMem", CUDA_ERROR_INVALID_DEVICE);
  if (!bytes) return ret("cuDeviceTotalMem", CUDA_ERROR_INVALID_VALUE);
  *bytes = size_t{80} << 30;
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
  if (injected_failure("cuDevicePrimaryCtxRetain")) return CUDA_ERROR_OUT_OF_MEMORY;
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
  if (injected_failure("cuStreamCreate")) return CUDA_ERROR_OUT_OF_MEMORY;
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
    if (injected_failure("cuStreamQuery")) return CUDA_ERROR_ILLEGAL_ADDRESS;
    return CUDA_SUCCESS;
  }
  postpone_failure("cuStreamQuery");
  bool async = false;
  if (!run_until(s, s->enqueued)) {
    const CUresult r = held_query(s, &async);
    yield_to_async(lock, async);
    return r;
  }
  count("not_ready");
  return CUDA_ERROR_NOT_READY;
}

namespace {
CUresult sync_stream(Lock& lock, CUstream h, bool check_ctx) {
  CUresult err = CUDA_SUCCESS;
  CUstream_st* s = resolve(h, check_ctx, &err);
  if (!s) return err;
  const uint64_t pos = s->enqueued;
  const VC vc = s->vc;
  run_blocking(lock, s, pos, "cuStreamSynchronize");
  host_observe(vc);
  return CUDA_SUCCESS;
}
}  // namespace

FAKE_EXPORT CUresult cuStreamSynchronize(CUstream h) {
  LOCK();
  count("cuStreamSynchronize");
  const CUresult r = sync_stream(lock, h, true);
  if (r == CUDA_SUCCESS && injected_failure("cuStreamSynchronize")) return CUDA_ERROR_ILLEGAL_ADDRESS;
  return ret("cuStreamSynchronize", r);
}

FAKE_EXPORT CUresult cuStreamWaitEvent(CUstream h, CUevent e, unsigned int flags) {
  LOCK();
  count("cuStreamWaitEvent");
  if (injected_failure("cuStreamWaitEvent")) return CUDA_ERROR_ILLEGAL_ADDRESS;
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
  if (injected_failure("cuEventCreate")) return CUDA_ERROR_OUT_OF_MEMORY;
  if (!pe) return ret("cuEventCreate", CUDA_ERROR_INVALID_VALUE);
  if (!current_ctx()) return ret("cuEventCreate", CUDA_ERROR_INVALID_CONTEXT);
  (void)flags;
  auto* e = new CUevent_st;
  e->device = current_ctx()->device;
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
  if (injected_failure("cuEventRecord")) return CUDA_ERROR_ILLEGAL_ADDRESS;
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
  bool async = false;
  const CUresult r = query_event(e, &async);
  if (r == CUDA_SUCCESS && injected_failure("cuEventQuery")) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (r == CUDA_ERROR_NOT_READY) postpone_failure("cuEventQuery");
  yield_to_async(lock, async);
  return r;
}

FAKE_EXPORT CUresult cuEventSynchronize(CUevent e) {
  LOCK();
  count("cuEventSynchronize");
  if (!g_events.count(e)) return ret("cuEventSynchronize", CUDA_ERROR_INVALID_HANDLE);
  if (e->recorded) {
    // What the event stands for now (it may be recorded again while this waits).
    CUstream_st* s = e->stream;
    const uint64_t pos = e->pos;
    const VC vc = e->vc;
    run_blocking(lock, s, pos, "cuEventSynchronize");
    host_observe(vc);
  }
  if (injected_failure("cuEventSynchronize")) return CUDA_ERROR_ILLEGAL_ADDRESS;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h) {
  LOCK();
  count("cuMemcpyDtoDAsync");
  if (injected_failure("cuMemcpyDtoDAsync")) return CUDA_ERROR_ILLEGAL_ADDRESS;
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
  if (injected_failure("cuMemAllocAsync")) return CUDA_ERROR_OUT_OF_MEMORY;
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
  const unsigned known = CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED;
  if (!pp || bytes == 0 || (flags & ~known)) return ret("cuMemHostAlloc", CUDA_ERROR_INVALID_VALUE);
  CUcontext ctx = current_ctx();
  if (!ctx) return ret("cuMemHostAlloc", CUDA_ERROR_INVALID_CONTEXT);
  if (injected_failure("cuMemHostAlloc")) return CUDA_ERROR_OUT_OF_MEMORY;
  *pp = allocate(bytes, ctx->device, false, false, true);
  if (*pp) g_allocs[reinterpret_cast<uintptr_t>(*pp)].host_flags = flags;
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
  if (injected_failure("cuMemcpyAsync")) return CUDA_ERROR_ILLEGAL_ADDRESS;
  enqueue(s, {}, nullptr,
          [dst, src, n] {
            memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n);
          },
          {{src, src + n, false}, {dst, dst + n, true}}, "cuMemcpyAsync");
  return CUDA_SUCCESS;
}

// ---- memory shared between processes (route nvgroup) ------------------------------------
// cuMemAlloc memory is POSIX shared memory, so that cuIpcGetMemHandle can name it and
// another process (another rank, "on the same node") can map it with
// cuIpcOpenMemHandle: fake device memory across processes. cuMemHostRegister makes host
// memory (e.g. a shared mapping) pinned, and with CU_MEMHOSTREGISTER_DEVICEMAP gives it a
// device address (cuMemHostGetDevicePointer: the host address).

namespace {

struct IpcHandle {  // what the fake puts in CUipcMemHandle::reserved (64 bytes)
  uint32_t magic;
  int32_t pid;
  uint64_t bytes;
  char name[48];
};
static_assert(sizeof(IpcHandle) <= sizeof(CUipcMemHandle), "fits the handle");
constexpr uint32_t kIpcMagic = 0xfa4ec0deu;
}  // namespace

FAKE_EXPORT CUresult cuMemAlloc(CUdeviceptr* dptr, size_t bytes) {
  LOCK();
  count("cuMemAlloc");
  if (injected_failure("cuMemAlloc")) return CUDA_ERROR_OUT_OF_MEMORY;
  if (!dptr || bytes == 0) return ret("cuMemAlloc", CUDA_ERROR_INVALID_VALUE);
  CUcontext c = current_ctx();
  if (!c) return ret("cuMemAlloc", CUDA_ERROR_INVALID_CONTEXT);
  void* p = shm_allocate(bytes, c->device);
  if (!p) return ret("cuMemAlloc", CUDA_ERROR_OUT_OF_MEMORY);
  *dptr = reinterpret_cast<CUdeviceptr>(p);
  return CUDA_SUCCESS;
}

// Managed memory (the driver's cuMemAllocManaged, as CUDA Fortran's `managed` arrays and
// OpenACC's unified memory get it): host-addressable, of the current context's GPU.
FAKE_EXPORT CUresult cuMemAllocManaged(CUdeviceptr* dptr, size_t bytes, unsigned int flags) {
  LOCK();
  count("cuMemAllocManaged");
  if (injected_failure("cuMemAllocManaged")) return CUDA_ERROR_OUT_OF_MEMORY;
  if (!dptr || bytes == 0 || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST))
    return ret("cuMemAllocManaged", CUDA_ERROR_INVALID_VALUE);
  CUcontext c = current_ctx();
  if (!c) return ret("cuMemAllocManaged", CUDA_ERROR_INVALID_CONTEXT);
  void* p = allocate(bytes, c->device, true, false);
  if (!p) return ret("cuMemAllocManaged", CUDA_ERROR_OUT_OF_MEMORY);
  *dptr = reinterpret_cast<CUdeviceptr>(p);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemFree(CUdeviceptr dptr) {
  LOCK();
  count("cuMemFree");
  auto it = g_allocs.find(static_cast<uintptr_t>(dptr));
  if (it != g_allocs.end() && it->second.managed && it->second.kind == Alloc::plain &&
      !it->second.async) {  // cuMemAllocManaged's
    check_races(g_host, it->first, it->first + it->second.bytes, true, "the host (cuMemFree)");
    release(it->first);
    return CUDA_SUCCESS;
  }
  if (it == g_allocs.end() || it->second.kind != Alloc::shm) return ret("cuMemFree", CUDA_ERROR_INVALID_VALUE);
  check_races(g_host, it->first, it->first + it->second.bytes, true, "the host (cuMemFree)");
  release(it->first);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle* handle, CUdeviceptr dptr) {
  LOCK();
  count("cuIpcGetMemHandle");
  if (injected_failure("cuIpcGetMemHandle")) return CUDA_ERROR_INVALID_VALUE;
  if (!handle) return ret("cuIpcGetMemHandle", CUDA_ERROR_INVALID_VALUE);
  auto it = g_allocs.find(static_cast<uintptr_t>(dptr));
  if (it == g_allocs.end() || it->second.kind != Alloc::shm) {
    fprintf(stderr, "fake_cuda: cuIpcGetMemHandle(%p): not the start of a cuMemAlloc allocation\n",
            reinterpret_cast<void*>(dptr));
    return ret("cuIpcGetMemHandle", CUDA_ERROR_INVALID_VALUE);
  }
  IpcHandle h{kIpcMagic, static_cast<int32_t>(getpid()), it->second.bytes, {0}};
  snprintf(h.name, sizeof h.name, "%s", it->second.shm_name.c_str());
  memset(handle, 0, sizeof *handle);
  memcpy(handle->reserved, &h, sizeof h);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr* dptr, CUipcMemHandle handle, unsigned int flags) {
  LOCK();
  count("cuIpcOpenMemHandle");
  if (injected_failure("cuIpcOpenMemHandle")) return CUDA_ERROR_OUT_OF_MEMORY;
  CUcontext c = current_ctx();
  if (!c) return ret("cuIpcOpenMemHandle", CUDA_ERROR_INVALID_CONTEXT);
  IpcHandle h;
  memcpy(&h, handle.reserved, sizeof h);
  if (!dptr || h.magic != kIpcMagic || (flags & ~CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS))
    return ret("cuIpcOpenMemHandle", CUDA_ERROR_INVALID_VALUE);
  // As the real driver: a process cannot open its own allocations' handles.
  if (h.pid == static_cast<int32_t>(getpid())) return ret("cuIpcOpenMemHandle", CUDA_ERROR_INVALID_CONTEXT);
  const int fd = shm_open(h.name, O_RDWR, 0600);
  if (fd < 0) return ret("cuIpcOpenMemHandle", CUDA_ERROR_INVALID_HANDLE);
  void* p = mmap(nullptr, h.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return ret("cuIpcOpenMemHandle", CUDA_ERROR_OUT_OF_MEMORY);
  Alloc a{h.bytes, c->device, false, false, false, false, ++g_alloc_ids, 0u, Alloc::ipc, {}};
  a.kind = Alloc::ipc;
  g_allocs[reinterpret_cast<uintptr_t>(p)] = a;
  count("live_ipc_mappings");
  *dptr = reinterpret_cast<CUdeviceptr>(p);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
  LOCK();
  count("cuIpcCloseMemHandle");
  auto it = g_allocs.find(static_cast<uintptr_t>(dptr));
  if (it == g_allocs.end() || it->second.kind != Alloc::ipc) return ret("cuIpcCloseMemHandle", CUDA_ERROR_INVALID_VALUE);
  count("live_ipc_mappings", -1);
  release(it->first);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemHostRegister(void* p, size_t bytes, unsigned int flags) {
  LOCK();
  count("cuMemHostRegister");
  if (injected_failure("cuMemHostRegister")) return CUDA_ERROR_OUT_OF_MEMORY;
  if (!p || bytes == 0) return ret("cuMemHostRegister", CUDA_ERROR_INVALID_VALUE);
  if (!current_ctx()) return ret("cuMemHostRegister", CUDA_ERROR_INVALID_CONTEXT);
  if (find_alloc(p, bytes) || find_alloc(p, 1))
    return ret("cuMemHostRegister", CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  Alloc a{bytes, current_ctx()->device, false, true, false, false, ++g_alloc_ids, 0u, Alloc::registered, {}};
  a.kind = Alloc::registered;
  a.host_flags = flags;
  g_allocs[reinterpret_cast<uintptr_t>(p)] = a;
  count("live_registered");
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemHostUnregister(void* p) {
  LOCK();
  count("cuMemHostUnregister");
  auto it = g_allocs.find(reinterpret_cast<uintptr_t>(p));
  if (it == g_allocs.end() || it->second.kind != Alloc::registered)
    return ret("cuMemHostUnregister", CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
  count("live_registered", -1);
  release(it->first);
  return CUDA_SUCCESS;
}

// "0000:BB:00.0" of one of this process's devices (bus_number()).
FAKE_EXPORT CUresult cuDeviceGetByPCIBusId(CUdevice* dev, const char* bus) {
  LOCK();
  count("cuDeviceGetByPCIBusId");
  if (!dev || !bus) return ret("cuDeviceGetByPCIBusId", CUDA_ERROR_INVALID_VALUE);
  unsigned domain = 0, b = 0, device = 0, fn = 0;
  if (sscanf(bus, "%x:%x:%x.%x", &domain, &b, &device, &fn) != 4)
    return ret("cuDeviceGetByPCIBusId", CUDA_ERROR_INVALID_VALUE);
  for (int d = 0; d < g_devices; ++d)
    if (static_cast<unsigned>(bus_number(d)) == b && domain == 0 && device == 0 && fn == 0) {
      *dev = d;
      return CUDA_SUCCESS;
    }
  return CUDA_ERROR_INVALID_DEVICE;  // not one of ours: not counted as misuse
}

// Peer access between two distinct devices of this process, unless FAKE_CUDA_NO_PEER=1.
FAKE_EXPORT CUresult cuDeviceCanAccessPeer(int* can, CUdevice dev, CUdevice peer) {
  LOCK();
  count("cuDeviceCanAccessPeer");
  if (!can) return ret("cuDeviceCanAccessPeer", CUDA_ERROR_INVALID_VALUE);
  if (dev < 0 || dev >= g_devices || peer < 0 || peer >= g_devices)
    return ret("cuDeviceCanAccessPeer", CUDA_ERROR_INVALID_DEVICE);
  const char* no = getenv("FAKE_CUDA_NO_PEER");
  *can = dev != peer && !(no && strcmp(no, "1") == 0);
  return CUDA_SUCCESS;
}

// ---- host waits: stream memory operations, the spin kernel, mapped pinned memory -------

// The device address of mapped pinned memory: the host address (unified addressing).
// Only for memory from cuMemHostAlloc with CU_MEMHOSTALLOC_DEVICEMAP (this fake is
// stricter than a driver with unified addressing, which maps every allocation).
FAKE_EXPORT CUresult cuMemHostGetDevicePointer(CUdeviceptr* pdptr, void* p, unsigned int flags) {
  LOCK();
  count("cuMemHostGetDevicePointer");
  if (injected_failure("cuMemHostGetDevicePointer")) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (!pdptr || !p || flags != 0) return ret("cuMemHostGetDevicePointer", CUDA_ERROR_INVALID_VALUE);
  const Alloc* a = find_alloc(p, 1);
  if (!a || !a->pinned || !(a->host_flags & CU_MEMHOSTALLOC_DEVICEMAP)) {  // the same bit
                                                                         // for registered memory
    if (g_verbose || (a && a->pinned))
      fprintf(stderr, "fake_cuda: cuMemHostGetDevicePointer(%p): %s\n", p,
              a && a->pinned ? "pinned memory allocated without CU_MEMHOSTALLOC_DEVICEMAP"
                             : "not memory from cuMemHostAlloc");
    return ret("cuMemHostGetDevicePointer", CUDA_ERROR_INVALID_VALUE);
  }
  *pdptr = reinterpret_cast<CUdeviceptr>(p);
  return CUDA_SUCCESS;
}

namespace {
// A word the GPU may wait on: 4-byte aligned, in fake device memory or in mapped pinned
// memory (a device pointer from cuMemHostGetDevicePointer).
bool waitable(CUdeviceptr addr, const char* api) {
  const Alloc* a = find_alloc(reinterpret_cast<const void*>(addr), 4);
  const char* why = nullptr;
  if (addr % 4 != 0) why = "not 4-byte aligned";
  else if (!a) why = "not fake device memory or mapped pinned memory";
  else if (a->free_pending) why = "freed";
  else if (a->pinned && !(a->host_flags & CU_MEMHOSTALLOC_DEVICEMAP)) why = "pinned memory without CU_MEMHOSTALLOC_DEVICEMAP";
  if (why) fprintf(stderr, "fake_cuda: %s: flag address %p: %s\n", api, reinterpret_cast<void*>(addr), why);
  return why == nullptr;
}

CUresult enqueue_wait(CUstream h, CUdeviceptr addr, uint32_t value, unsigned mode, bool kernel,
                      const char* api) {
  CUresult err = CUDA_SUCCESS;
  CUstream_st* s = resolve(h, true, &err);
  if (!s) return err;
  if (!waitable(addr, api)) return CUDA_ERROR_INVALID_VALUE;
  HostWait w;
  w.addr = addr;
  w.value = value;
  w.mode = mode;
  w.kernel = kernel;
  count(kernel ? "kernel_waits" : "memop_waits");
  enqueue(s, {}, nullptr, nullptr, {}, kernel ? "streamcoll_wait_geq kernel" : "cuStreamWaitValue32", &w);
  return CUDA_SUCCESS;
}

bool has_entry(const std::string& image, const char* name) {
  const std::string e = std::string(".entry ") + name;
  for (size_t at = image.find(e); at != std::string::npos; at = image.find(e, at + 1)) {
    const char next = at + e.size() < image.size() ? image[at + e.size()] : '\0';
    if (next == '(' || next == ' ' || next == '\n' || next == '\t' || next == '\r') return true;
  }
  return false;
}

// The parameter list of `.entry name(...)`: the types of its .param declarations.
std::vector<std::string> entry_params(const std::string& image, const char* name) {
  std::vector<std::string> types;
  const size_t at = image.find(std::string(".entry ") + name);
  if (at == std::string::npos) return types;
  const size_t open = image.find('(', at), close = image.find(')', at);
  if (open == std::string::npos || close == std::string::npos || close < open) return types;
  const std::string list = image.substr(open + 1, close - open - 1);
  for (size_t p = list.find(".param"); p != std::string::npos; p = list.find(".param", p + 1)) {
    size_t t = list.find('.', p + 6);
    if (t == std::string::npos) break;
    size_t end = list.find_first_of(" \t\n\r", t);
    types.push_back(list.substr(t, end == std::string::npos ? std::string::npos : end - t));
  }
  return types;
}

// FAKE_CUDA_PTXAS=<ptxas>: the image is also assembled by the real PTX assembler (for
// sm_90), so that a PTX syntax error shows without a GPU.
bool ptxas_accepts(const std::string& image) {
  const char* ptxas = getenv("FAKE_CUDA_PTXAS");
  if (!ptxas || !*ptxas) return true;
  char path[] = "/tmp/fake_cuda_ptx_XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) return true;
  FILE* f = fdopen(fd, "w");
  fwrite(image.data(), 1, image.size(), f);
  fclose(f);
  const std::string cmd = std::string(ptxas) + " -arch=sm_90 " + path + " -o /dev/null 1>&2";
  const int rc = system(cmd.c_str());
  count("ptxas_runs");
  if (rc != 0) fprintf(stderr, "fake_cuda: cuModuleLoadData: ptxas rejects the PTX image (%s)\n", path);
  else remove(path);
  return rc == 0;
}
}  // namespace

// Waits for a host-written word on the stream. FAKE_CUDA_NO_STREAM_MEMOPS=1: not supported
// (as on a driver or system without stream memory operations), so that the caller's
// fallback runs.
FAKE_EXPORT CUresult cuStreamWaitValue32(CUstream h, CUdeviceptr addr, cuuint32_t value, unsigned int flags) {
  LOCK();
  count("cuStreamWaitValue32");
  if (injected_failure("cuStreamWaitValue32")) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (g_no_memops) {  // the driver's answer, not a misuse: counted apart from "errors"
    count("not_supported");
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  const unsigned mode = flags & ~static_cast<unsigned>(CU_STREAM_WAIT_VALUE_FLUSH);
  if (mode > CU_STREAM_WAIT_VALUE_NOR) return ret("cuStreamWaitValue32", CUDA_ERROR_INVALID_VALUE);
  if (flags & CU_STREAM_WAIT_VALUE_FLUSH) return ret("cuStreamWaitValue32", CUDA_ERROR_NOT_SUPPORTED);  // CAN_FLUSH_REMOTE_WRITES = 0
  return ret("cuStreamWaitValue32", enqueue_wait(h, addr, value, flags, false, "cuStreamWaitValue32"));
}

// Some device attributes, as an H200 answers; stream memory operations per
// FAKE_CUDA_NO_STREAM_MEMOPS. Others: 0 (said under FAKE_CUDA_VERBOSE=1).
FAKE_EXPORT CUresult cuDeviceGetAttribute(int* pi, CUdevice_attribute attrib, CUdevice dev) {
  LOCK();
  count("cuDeviceGetAttribute");
  if (!pi) return ret("cuDeviceGetAttribute", CUDA_ERROR_INVALID_VALUE);
  if (dev < 0 || dev >= g_devices) return ret("cuDeviceGetAttribute", CUDA_ERROR_INVALID_DEVICE);
  switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1:
    case CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR:
    case CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR_V1:
    case CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS_V1:
      *pi = g_no_memops ? 0 : 1; break;
    case CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES: *pi = 0; break;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS:
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS:
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
      *pi = 1; break;
    case CU_DEVICE_ATTRIBUTE_INTEGRATED: *pi = 0; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *pi = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *pi = 0; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *pi = 132; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *pi = 32; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *pi = 1024; break;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: *pi = 2; break;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: *pi = 0; break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: *pi = bus_number(dev); break;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: *pi = 0; break;
    default:
      if (attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX) return ret("cuDeviceGetAttribute", CUDA_ERROR_INVALID_VALUE);
      if (g_verbose) fprintf(stderr, "fake_cuda: cuDeviceGetAttribute(%d): not modelled, 0\n", static_cast<int>(attrib));
      *pi = 0;
  }
  return CUDA_SUCCESS;
}

// A module from a PTX image (NUL-terminated text with .version and .target), whose one
// function the fake can give is streamcoll_wait_geq(.u64 flag, .u32 value): the image must
// declare it so, or loading fails (CUDA_ERROR_INVALID_PTX, with a line on stderr). Or from
// a fatbin that names a kernel of kHostKernels (load_fatbin).
FAKE_EXPORT CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  LOCK();
  count("cuModuleLoadData");
  if (injected_failure("cuModuleLoadData")) return CUDA_ERROR_OUT_OF_MEMORY;
  if (!module || !image) return ret("cuModuleLoadData", CUDA_ERROR_INVALID_VALUE);
  if (!current_ctx()) return ret("cuModuleLoadData", CUDA_ERROR_INVALID_CONTEXT);
  const unsigned char* b = static_cast<const unsigned char*>(image);
  if (b[0] == 0x50 && b[1] == 0xed && b[2] == 0x55 && b[3] == 0xba) return load_fatbin(module, b);
  if (b[0] == 0x7f) {
    fprintf(stderr, "fake_cuda: cuModuleLoadData: a cubin image; the fake takes PTX or a fatbin\n");
    return ret("cuModuleLoadData", CUDA_ERROR_INVALID_IMAGE);
  }
  const std::string text(static_cast<const char*>(image), strnlen(static_cast<const char*>(image), 1 << 22));
  const char* why = nullptr;
  if (text.find(".version") == std::string::npos || text.find(".target") == std::string::npos)
    why = "no .version/.target directive: not PTX";
  else if (has_entry(text, "streamcoll_wait_geq")) {
    const auto params = entry_params(text, "streamcoll_wait_geq");
    const bool ok = params.size() == 2 && (params[0] == ".u64" || params[0] == ".b64" || params[0] == ".s64") &&
                    (params[1] == ".u32" || params[1] == ".b32" || params[1] == ".s32");
    if (!ok) why = "streamcoll_wait_geq is not declared (.param .u64 flag, .param .u32 value)";
  }
  if (why) {
    fprintf(stderr, "fake_cuda: cuModuleLoadData: %s\n", why);
    return ret("cuModuleLoadData", CUDA_ERROR_INVALID_PTX);
  }
  if (!ptxas_accepts(text)) return ret("cuModuleLoadData", CUDA_ERROR_INVALID_PTX);
  auto* m = new CUmod_st;
  m->image = text;
  g_modules.insert(m);
  count("live_modules");
  *module = m;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuModuleGetFunction(CUfunction* f, CUmodule m, const char* name) {
  LOCK();
  count("cuModuleGetFunction");
  if (!f || !name) return ret("cuModuleGetFunction", CUDA_ERROR_INVALID_VALUE);
  if (!g_modules.count(m)) return ret("cuModuleGetFunction", CUDA_ERROR_INVALID_HANDLE);
  if (m->fatbin) {
    for (const HostKernel& k : kHostKernels)
      if (strcmp(name, k.name) == 0 && m->image.find(name) != std::string::npos) {
        auto* fn = new CUfunc_st;
        fn->mod = m;
        fn->host = k.run;
        fn->param_bytes = k.param_bytes;
        fn->name = k.name;
        g_functions.insert(fn);
        *f = fn;
        return CUDA_SUCCESS;
      }
    return ret("cuModuleGetFunction", CUDA_ERROR_NOT_FOUND);
  }
  if (strcmp(name, "streamcoll_wait_geq") != 0 || !has_entry(m->image, name))
    return ret("cuModuleGetFunction", CUDA_ERROR_NOT_FOUND);
  auto* fn = new CUfunc_st;
  fn->mod = m;
  g_functions.insert(fn);
  *f = fn;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuModuleUnload(CUmodule m) {
  LOCK();
  count("cuModuleUnload");
  if (!g_modules.count(m)) return ret("cuModuleUnload", CUDA_ERROR_INVALID_HANDLE);
  // A kernel of the module still waiting on a stream: its code would be gone.
  for (CUstream_st* s : g_streams)
    for (const Item& it : s->pending)
      if (it.is_wait && it.wait.kernel) {
        fprintf(stderr, "fake_cuda: cuModuleUnload while a streamcoll_wait_geq kernel is still "
                        "queued on stream %d\n", s->id);
        count("errors");
      }
  for (auto it = g_functions.begin(); it != g_functions.end();)
    if ((*it)->mod == m) {
      delete *it;
      it = g_functions.erase(it);
    } else {
      ++it;
    }
  g_modules.erase(m);
  delete m;
  count("live_modules", -1);
  return CUDA_SUCCESS;
}

// Launches streamcoll_wait_geq: one thread that spins until
// (int32_t)(*flag - value) >= 0, i.e. the same wait as cuStreamWaitValue32 GEQ.
// kernelParams[0] points to the flag's device address, kernelParams[1] to the value
// (read at launch, as the driver copies parameters then).
FAKE_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                    unsigned int bx, unsigned int by, unsigned int bz,
                                    unsigned int shmem, CUstream h, void** params, void** extra) {
  LOCK();
  count("cuLaunchKernel");
  if (injected_failure("cuLaunchKernel")) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (!g_functions.count(f)) return ret("cuLaunchKernel", CUDA_ERROR_INVALID_HANDLE);
  if (f->host) return ret("cuLaunchKernel", launch_host_kernel(f, gx, gy, gz, bx, by, bz, shmem, h, params, extra));
  if (gx != 1 || gy != 1 || gz != 1 || bx != 1 || by != 1 || bz != 1 || shmem != 0) {
    fprintf(stderr, "fake_cuda: cuLaunchKernel(streamcoll_wait_geq): grid %ux%ux%u block %ux%ux%u "
                    "shared %u; the fake expects one thread (1x1x1, 1x1x1, 0)\n", gx, gy, gz, bx, by, bz, shmem);
    return ret("cuLaunchKernel", CUDA_ERROR_INVALID_VALUE);
  }
  if (!params || extra || !params[0] || !params[1]) return ret("cuLaunchKernel", CUDA_ERROR_INVALID_VALUE);
  const CUdeviceptr flag = *static_cast<const CUdeviceptr*>(params[0]);
  const uint32_t value = *static_cast<const uint32_t*>(params[1]);
  return ret("cuLaunchKernel", enqueue_wait(h, flag, value, CU_STREAM_WAIT_VALUE_GEQ, true, "cuLaunchKernel"));
}

// ---- fake_api.h: for test programs -----------------------------------------------------

FAKE_EXPORT void* fake_cuda_malloc(size_t bytes) {
  LOCK();
  if (g_devices <= 0) return nullptr;
  return malloc_shm() && bytes ? shm_allocate(bytes, 0) : allocate(bytes, 0, false, false);
}

FAKE_EXPORT void* fake_cuda_malloc_device(int device, size_t bytes) {
  LOCK();
  if (device < 0 || device >= g_devices) return nullptr;
  return malloc_shm() && bytes ? shm_allocate(bytes, device) : allocate(bytes, device, false, false);
}

FAKE_EXPORT void* fake_cuda_malloc_pinned(size_t bytes) {
  LOCK();
  void* p = g_devices > 0 ? allocate(bytes, 0, false, false, true) : nullptr;
  if (p) g_allocs[reinterpret_cast<uintptr_t>(p)].host_flags = CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP;
  return p;
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

// cudaDeviceReset: every stream, event and allocation of the device's context is gone at
// once (handles to them become invalid; memory is freed). As the real call requires,
// nothing may still run on the device: work still queued is a misuse, reported and
// counted under "errors". Contexts stay retained and usable (their state is new).
FAKE_EXPORT int fake_cuda_device_reset(int device) {
  LOCK();
  if (device < 0 || device >= g_devices) return CUDA_ERROR_INVALID_DEVICE;
  for (CUstream_st* st : std::vector<CUstream_st*>(g_live_streams.begin(), g_live_streams.end())) {
    if (st->legacy || st->device != device) continue;
    if (st->completed < st->enqueued) {
      fprintf(stderr, "fake_cuda: fake_cuda_device_reset(%d) while stream %d still has work\n",
              device, st->id);
      count("errors");
      run_until(st, st->enqueued);
    }
    st->destroyed = true;
    g_live_streams.erase(st);
    if (!st->internal) count("live_streams", -1);
  }
  for (auto it = g_events.begin(); it != g_events.end();) {
    if ((*it)->device == device && !(*it)->internal) {
      count("live_events", -1);
      it = g_events.erase(it);  // the handle stays allocated: stale uses find it unknown
    } else {
      ++it;
    }
  }
  std::vector<uintptr_t> gone;
  for (const auto& [base, a] : g_allocs)
    if (a.device == device) gone.push_back(base);
  for (uintptr_t b : gone) release(b);
  count("device_resets");
  return CUDA_SUCCESS;
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
  return sync_stream(lock, h, false);
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

FAKE_EXPORT int fake_cuda_enqueue_wait(CUstream h, const void* flag, unsigned value) {
  LOCK();
  CUresult err = CUDA_SUCCESS;
  CUstream_st* s = resolve(h, false, &err);
  if (!s) return err;
  const CUdeviceptr addr = reinterpret_cast<CUdeviceptr>(flag);
  if (!waitable(addr, "fake_cuda_enqueue_wait")) return CUDA_ERROR_INVALID_VALUE;
  HostWait w;
  w.addr = addr;
  w.value = value;
  enqueue(s, {}, nullptr, nullptr, {}, "the program's wait", &w);
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

FAKE_EXPORT int fake_cuda_fail_after(const char* api, unsigned long long n) {
  LOCK();
  if (!api || !injectable(api)) return -1;
  if (n == 0) g_fail.erase(api);
  else g_fail[api] = g_counters[api] + n;
  return 0;
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

FAKE_EXPORT int fake_cuda_enqueue_async(CUstream h, int check_ctx, void (*launch)(void*),
                                        int (*done)(void*), void (*finish)(void*), void* arg,
                                        const fake_cuda_range* ranges, int nranges,
                                        const char* what) {
  LOCK();
  CUresult err = CUDA_SUCCESS;
  CUstream_st* s = resolve(h, check_ctx != 0, &err);
  if (!s) return err;
  if (!launch || !done || !finish) return CUDA_ERROR_INVALID_VALUE;
  const std::string name = what ? what : "async work";
  // The three pieces go in together (nothing else can come between: the lock is held).
  // Without deferral the launch runs here, at once, and the stream stops at the end.
  enqueue(s, {}, nullptr, [launch, arg] {
    count("async_launched");
    launch(arg);
  }, {}, name + " (launch)");
  HostWait w;
  w.probe = done;
  w.probe_arg = arg;
  enqueue(s, {}, nullptr, nullptr, {}, name + " (running)", &w);
  enqueue(s, {}, nullptr, [finish, arg] { finish(arg); }, ranges_of(ranges, nranges), name);
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
  if (e->recorded) run_blocking(lock, e->stream, e->pos, "fake_cuda_event_sync");  // not a host observation
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
