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
//    Each device has FAKE_CUDA_MEM_TOTAL=<bytes>[K|M|G|T] (powers of 1024; default 80
//    GiB) of memory, on local rank FAKE_CUDA_MEM_TOTAL_RANK only when that is set (the
//    other ranks keep the default); cuDeviceTotalMem says it. Used of it: device memory
//    (fake_cuda_malloc, _device, cuMemAlloc, cuMemAllocAsync, captured ones included) at
//    its mapped, page-rounded length, from the allocation until whatever frees it
//    (cuMemFree, cuMemFreeAsync when it runs, fake_cuda_free, the last graph or exec
//    holding a graph allocation, a device reset), and what a library reserves for itself
//    (fake_cuda_device_reserve/unreserve: the fake NCCL's communicators, which a device
//    reset leaves alone). Pinned and managed memory (host memory, or migrated on demand)
//    and IPC or registered mappings (another's memory) are not counted. An allocation or
//    reservation that does not fit fails (CUDA_ERROR_OUT_OF_MEMORY; nullptr from
//    fake_cuda_malloc*) and takes nothing; counted under "out_of_memory". cuMemGetInfo
//    gives the free and total bytes of the current context's device. Gauges:
//    "device_bytes_used" (over all devices) and "device_bytes_peak" (its highest so far).
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
//    With deferral a thread of the fake also runs, on its own, the work that has been
//    queued for FAKE_CUDA_GPU_PROGRESS_MS=<n> ms (default 20; 0: never; without deferral
//    only where set, for work stuck behind a host wait released meanwhile), as a GPU runs
//    queued work without being asked (a rank blocked in MPI needs its peers' queued GPU
//    work to run while their hosts are blocked too); work younger than that waits for the
//    host, so a missing order still shows. Counted: "gpu_progress_executed".
//    A host wait's release (the flag written by the host, or by cuStreamWriteValue32 on
//    another stream) orders the work behind it after what the host had seen, or after
//    the writer's work; the race check of work enqueued behind a wait whose flag does not
//    hold yet is made at the release.
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
//    says yes between two distinct devices the node's topology connects (below) unless
//    FAKE_CUDA_NO_PEER=1. The node's topology, FAKE_CUDA_PEERS, by bus number (the BB of
//    0000:BB:00.0): unset or "all": every pair of distinct GPUs has peer access (NVLink
//    or a P2P-capable switch); "none": no pair has; "1,2/3,4": peer access within each
//    '/'-separated group only (NVLink pairs), the other pairs PCIe-only without P2P. With
//    one visible device per process (FAKE_CUDA_BUS_ID=per-rank, FAKE_CUDA_DEVICES=1: the
//    isolation of CUDA_VISIBLE_DEVICES) no process can name another's GPU, but
//    cuIpcOpenMemHandle opens a peer's allocation wherever the topology gives the two GPUs
//    peer access, and fails with CUDA_ERROR_PEER_ACCESS_UNSUPPORTED where it does not (what
//    the real driver's lazy peer enabling does between GPUs without P2P, as we read its
//    documentation; not verified on such hardware). A fatbin image
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
//  - Stream capture and CUDA graphs (cuStreamBeginCapture ... cuGraphLaunch): captured
//    work becomes graph nodes; a launch enqueues every node's work, in capture order, on
//    the launch stream as ordinary stream work; the driver's capture rules, invalidation
//    included; host functions (cuLaunchHostFunc) on a thread of the fake's own. See
//    "stream capture and graphs" below.
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
// nothing here; so do host functions (cuLaunchHostFunc), whose CUDA calls are refused.
#include <ctype.h>
#include <cuda.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
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
#include "fake_env.hpp"

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
struct Capture;
}  // namespace

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
  // Enqueued behind a host wait that had not passed: its race check waits for the release
  // (held_vc: its order at enqueue, to which the release adds what the host had seen).
  bool held = false;
  VC held_vc;
  uint64_t held_seq = 0;  // the history recorded before it (g_history_seq)
  // A host function's launch: the host sees the stream's work before it complete.
  VC observe;
  uint64_t enqueued_ns = 0;  // CLOCK_MONOTONIC at enqueue (the GPU progress thread's age)
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
  VC released_acc;  // every release_host so far: complete once the stream passed its wait
  bool released = false;
  // Stream capture: the capture this stream belongs to (began here, or joined through an
  // event), and the nodes its next captured work depends on.
  std::shared_ptr<Capture> cap;
  std::vector<size_t> cap_tail;
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
  // Last recorded in a capture: that capture and the nodes the record stood for.
  std::shared_ptr<Capture> cap;
  std::vector<size_t> cap_nodes;
  bool timing = true;  // not CU_EVENT_DISABLE_TIMING: cuEventElapsedTime may read it
  // When the stream ran past the last record (steady-clock ns; 0 until then), for
  // cuEventElapsedTime; shared with the record's work item, which may outlive the event.
  std::shared_ptr<std::atomic<uint64_t>> stamp;
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
  // Bytes counted against the device's memory (the mapped length of device memory; 0 for
  // pinned, managed, IPC and registered memory): given back by release(), whatever frees it.
  size_t charged = 0;
};


struct Access {
  int sid;
  uint64_t idx;
  uintptr_t lo, hi;
  bool write;
  std::string what;
  uint64_t seq = 0;  // order of recording (g_history_seq)
};

// A conflict found while one side (held_*) was behind a host wait that had not passed:
// a race unless the release orders the other side before it (check_released).
struct HeldPair {
  int held_sid;
  uint64_t held_idx;
  int sid;
  uint64_t idx;
  uintptr_t lo, hi;
  bool write;
  std::string who;
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
// Graph allocations: cuMemAllocAsync in a capture (base -> the capture's id); see
// capture_alloc. Here because release() forgets a base that is freed by other means.
std::map<uintptr_t, unsigned long long> g_graph_allocs;
// Device memory, per device (the model's "Memory" item): the total, the bytes in use
// (allocations and reservations), and the part of them that reservations hold.
std::vector<unsigned long long> g_mem_total, g_mem_used, g_mem_reserved;
std::vector<Access> g_history;  // accesses of work the host has not seen complete
uint64_t g_history_seq = 0;
std::vector<HeldPair> g_held_pairs;
std::map<uintptr_t, VC> g_flag_writers;  // cuStreamWriteValue32: the writer's order, per flag
// cuStreamWriteValue32 enqueued: the latest write of each flag (its stream and position).
std::map<uintptr_t, std::pair<CUstream_st*, uint64_t>> g_pending_writes;
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

// ---- stream capture: the state (entry points: "stream capture and graphs" below) --------

// A node of a captured graph: what each launch of an exec holding it enqueues on the
// launch stream (ordinary stream work, so the happens-before check sees every run).
struct Node {
  std::function<void(CUstream_st*)> issue;
  std::vector<size_t> deps;       // earlier nodes of the graph this one depends on
  std::vector<RangeUse> ranges;   // what its work reads and writes (the graph's race check)
  std::string what;
  std::function<void()> release;  // once the last graph or exec holding it is gone
  Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;
  ~Node() {
    if (release) release();
  }
};
using Nodes = std::vector<std::shared_ptr<Node>>;

// One capture sequence, from cuStreamBeginCapture to cuStreamEndCapture on its origin.
struct Capture {
  unsigned long long id = 0;
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  CUstream_st* origin = nullptr;
  std::thread::id thread;          // the thread that began it
  bool active = true;              // until cuStreamEndCapture
  bool invalidated = false;        // a rule was broken: nothing of it will run
  std::set<CUstream_st*> streams;  // the origin and the streams that joined
  Nodes nodes;                     // in capture order, a topological order
  // The graph being built (cuStreamGetCaptureInfo hands it out, cuGraphRetainUserObject
  // takes it): returned by cuStreamEndCapture, destroyed with a failed capture.
  CUgraph_st* graph = nullptr;
};
std::vector<std::shared_ptr<Capture>> g_captures;  // the active ones
unsigned long long g_capture_ids = 0;
// cuThreadExchangeStreamCaptureMode: this thread's interaction mode (GLOBAL by default).
thread_local CUstreamCaptureMode t_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
thread_local bool t_in_host_fn = false;  // running a host function (cuLaunchHostFunc)

// A rule of stream capture was broken: the capture is invalidated, as the driver does;
// its streams answer CUDA_ERROR_STREAM_CAPTURE_INVALIDATED until it is ended.
void invalidate(Capture* c, const std::string& why) {
  if (!c->active || c->invalidated) return;
  c->invalidated = true;
  c->nodes.clear();
  count("capture_invalidated");
  fprintf(stderr, "fake_cuda: stream capture %llu (stream %d) invalidated: %s\n", c->id,
          c->origin->id, why.c_str());
}

// The entry points whose calls FAKE_CUDA_FAIL / fake_cuda_fail_after can make fail.
const char* const kInjectable[] = {
    "cuMemHostAlloc", "cuMemcpyAsync", "cuMemcpyDtoDAsync", "cuMemAllocAsync", "cuEventCreate",
    "cuEventRecord", "cuEventQuery", "cuEventSynchronize", "cuStreamCreate", "cuStreamWaitEvent",
    "cuStreamQuery", "cuStreamSynchronize", "cuStreamWaitValue32", "cuStreamWriteValue32", "cuLaunchKernel",
    "cuModuleLoadData", "cuMemHostGetDevicePointer", "cuDevicePrimaryCtxRetain", "cuMemAlloc",
    "cuIpcGetMemHandle", "cuIpcOpenMemHandle", "cuMemHostRegister", "cuMemGetInfo"};
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

void run_aged_streams(uint64_t age_ns);
uint64_t g_gpu_progress_age_ns = 0;  // 0: no GPU progress thread
uint64_t mono_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// The GPU running queued work on its own, with deferred stream work: a thread of the fake
// runs every stream's work that has been queued for at least N ms (FAKE_CUDA_GPU_PROGRESS_MS,
// default 20; 0: off), looking every N/4 ms, as a GPU runs work without the host waiting
// for it. Late enough that a missing order still shows (work the program or streamcoll
// should have waited for is still pending when they look, microseconds after enqueueing
// it) and soon enough that a program whose progress needs a peer's GPU work to run while
// that peer's host is blocked in MPI (a rank replaying a CUDA graph against live peers;
// a stream-ordered NCCL operation queued behind the application's work) does not hang
// here when it would not on a GPU. Off, a deferred stream runs only when the host waits
// for it: a test that relies on that says why (FAKE_CUDA_GPU_PROGRESS_MS=0). Counted:
// "gpu_progress_executed" (work the thread ran), so that a test asserting that a call left
// its work pending can tell the GPU's own progress from a call that waited.
// (Joined at exit, before the fake's state is destroyed.)
std::atomic<bool> g_gpu_progress_stop{false};
std::thread* g_gpu_progress = nullptr;

void start_gpu_progress() {
  sigset_t all, old;  // asynchronous signals stay with the program's threads
  sigfillset(&all);
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTRAP}) sigdelset(&all, sig);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  const uint64_t tick_us = std::max<uint64_t>(g_gpu_progress_age_ns / 4000, 100);
  g_gpu_progress = new std::thread([tick_us] {
    while (!g_gpu_progress_stop.load()) {
      std::this_thread::sleep_for(std::chrono::microseconds(tick_us));
      if (!g_gpu_progress_stop.load()) run_aged_streams(g_gpu_progress_age_ns);
    }
  });
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  atexit([] {
    g_gpu_progress_stop.store(true);
    g_gpu_progress->join();
  });
}

using fake_env::parse_bytes;

// Each device's memory: FAKE_CUDA_MEM_TOTAL (default 80 GiB, an H100's), on local rank
// FAKE_CUDA_MEM_TOTAL_RANK only when that is set (the others keep the default).
unsigned long long device_memory_total() {
  const unsigned long long def = 80ull << 30;
  const char* v = getenv("FAKE_CUDA_MEM_TOTAL");
  if (!v || !*v) return def;
  const char* rk = getenv("FAKE_CUDA_MEM_TOTAL_RANK");
  if (rk && *rk && atoi(rk) != g_local_rank) return def;
  unsigned long long n = 0;
  if (!parse_bytes(v, &n)) {
    fprintf(stderr, "fake_cuda: FAKE_CUDA_MEM_TOTAL: '%s' is not <bytes>[K|M|G|T]\n", v);
    abort();
  }
  return n;
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
  {
    // (Without deferral work runs when enqueued; the thread then only runs work stuck
    // behind a host wait that another thread released, and only where asked for.)
    const char* g = getenv("FAKE_CUDA_GPU_PROGRESS_MS");
    const double ms = g && *g ? atof(g) : g_defer ? 20.0 : 0.0;
    if (ms > 0) {
      g_gpu_progress_age_ns = static_cast<uint64_t>(ms * 1e6);
      start_gpu_progress();
    }
  }
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
  g_mem_total.assign(static_cast<size_t>(g_devices), device_memory_total());
  g_mem_used.assign(static_cast<size_t>(g_devices), 0);
  g_mem_reserved.assign(static_cast<size_t>(g_devices), 0);
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

// Whether a capture holds a blocking stream (one ordered with the legacy stream): the
// legacy stream is unusable meanwhile. invalidate_them: the use is made, and breaks them.
bool legacy_blocked(bool invalidate_them) {
  bool any = false;
  for (const auto& c : g_captures)
    for (CUstream_st* x : c->streams)
      if (!(x->flags & CU_STREAM_NON_BLOCKING) && x->cap == c) {
        any = true;
        if (invalidate_them) invalidate(c.get(), "the legacy stream was used while a blocking stream captures");
        break;
      }
  return any;
}

// resolve() for a call that enqueues work: the legacy stream while a blocking stream
// captures (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, the capture invalidated), a stream of an
// invalidated capture (CUDA_ERROR_STREAM_CAPTURE_INVALIDATED).
CUstream_st* resolve_work(CUstream h, bool check_ctx, CUresult* err) {
  CUstream_st* s = resolve(h, check_ctx, err);
  if (!s) return nullptr;
  if (s->legacy && legacy_blocked(true)) {
    *err = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    return nullptr;
  }
  if (s->cap && s->cap->invalidated) {
    *err = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    return nullptr;
  }
  return s;
}

// A query or synchronization of s (the driver rejects those of a capturing stream, and of
// the legacy stream while a blocking stream captures, and invalidates the capture).
CUresult capture_forbids_wait(CUstream_st* s, const char* api) {
  if (s->legacy && legacy_blocked(true)) return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
  if (!s->cap) return CUDA_SUCCESS;
  invalidate(s->cap.get(), std::string(api) + " of a capturing stream");
  return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

// The same for an event last recorded in a capture: still active (unsupported, and the
// capture invalidated) or ended (CUDA_ERROR_CAPTURED_EVENT).
CUresult capture_forbids_event(CUevent_st* e, const char* api) {
  if (!e->cap) return CUDA_SUCCESS;
  if (!e->cap->active) return CUDA_ERROR_CAPTURED_EVENT;
  invalidate(e->cap.get(), std::string(api) + " of an event recorded in the capture");
  return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

// A "potentially unsafe" call (cuMemAlloc, cuMemFree, cuMemHostAlloc, ...: they do not
// go through a stream) under cuThreadExchangeStreamCaptureMode's rules: prohibited while
// this thread has a capture not begun RELAXED, or, in GLOBAL mode, while another thread
// has a GLOBAL one; such captures are invalidated.
CUresult unsafe_during_capture(const char* api) {
  if (t_capture_mode == CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_SUCCESS;
  const std::thread::id me = std::this_thread::get_id();
  bool prohibited = false;
  for (const auto& c : g_captures) {
    const bool mine = c->thread == me && c->mode != CU_STREAM_CAPTURE_MODE_RELAXED;
    const bool global = t_capture_mode == CU_STREAM_CAPTURE_MODE_GLOBAL && c->thread != me &&
                        c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
    if (!mine && !global) continue;
    prohibited = true;
    invalidate(c.get(), std::string(api) + (mine ? " during the capture" : " on another thread during a GLOBAL capture"));
  }
  return prohibited ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

// Appends a node to s's capture, after the nodes s's work so far ends with.
void add_node(CUstream_st* s, std::shared_ptr<Node> n) {
  Capture& c = *s->cap;
  n->deps = s->cap_tail;
  s->cap_tail = {c.nodes.size()};
  c.nodes.push_back(std::move(n));
  count("captured_nodes");
}

// The handle a node's work is enqueued with at launch (the fake NCCL resolves it again).
CUstream handle_of(CUstream_st* s) { return s->legacy ? CU_STREAM_LEGACY : s; }

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

int check_races(const VC& vc, uintptr_t lo, uintptr_t hi, bool write, const std::string& who,
                int sid = -1, uint64_t idx = 0, uint64_t seq_limit = UINT64_MAX);
void report_race(const std::string& who, bool write, uintptr_t lo, uintptr_t hi, const std::string& what,
                 int sid, uint64_t idx, bool a_write, uintptr_t a_lo, uintptr_t a_hi);
void host_observe(const VC& vc);
bool overlap(uintptr_t lo1, uintptr_t hi1, uintptr_t lo2, uintptr_t hi2);

uint64_t held_from(const CUstream_st* s) {
  for (const Item& it : s->pending)
    if (it.is_wait && !it.wait.probe) {
      // A flag already written: the release has happened (the fake has not run the wait
      // yet), and whatever comes now cannot be ordered before it.
      if (wait_holds(it.wait)) continue;
      return it.idx;
    }
  return UINT64_MAX;
}

// The host wait at the front of s has passed: the work behind it, up to the next host
// wait, is ordered after what the host had seen by the release; its race check, held
// since it was enqueued, is made now (against work enqueued since too).
void check_released(CUstream_st* s) {
  bool first = true;
  for (Item& it : s->pending) {
    if (first) {  // the wait itself
      first = false;
      continue;
    }
    if (it.is_wait && !it.wait.probe) break;
    if (!it.held) continue;
    it.held = false;
    merge(it.held_vc, s->release_host);
    const std::string who = it.what + " (stream " + std::to_string(s->id) + ", #" +
                            std::to_string(it.idx) + ")";
    for (const RangeUse& r : it.ranges)
      check_races(it.held_vc, r.lo, r.hi, r.write, who, s->id, it.idx, it.held_seq);
    // what was recorded since, and not ordered after it
    for (size_t i = 0; i < g_held_pairs.size();) {
      const HeldPair& p = g_held_pairs[i];
      if (p.held_sid != s->id || p.held_idx != it.idx) {
        ++i;
        continue;
      }
      if (at(it.held_vc, p.sid) < p.idx)
        for (const RangeUse& r : it.ranges)
          if ((r.write || p.write) && overlap(r.lo, r.hi, p.lo, p.hi))
            report_race(p.who, p.write, p.lo, p.hi, it.what, s->id, it.idx, r.write, r.lo, r.hi);
      g_held_pairs[i] = g_held_pairs.back();
      g_held_pairs.pop_back();
    }
    VC().swap(it.held_vc);
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
    // A flag that stream work writes (cuStreamWriteValue32): that stream is run up to the
    // write, as a GPU runs every stream without being asked.
    if (!wait_holds(front.wait))
      if (auto w = g_pending_writes.find(front.wait.addr); w != g_pending_writes.end()) {
        const auto [ws, widx] = w->second;
        if (ws != s && !ws->running && ws->completed < widx) run_until(ws, widx);
      }
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
    if (auto w = g_flag_writers.find(front.wait.addr); w != g_flag_writers.end())
      merge(s->release_host, w->second);  // written by stream work (cuStreamWriteValue32)
    merge(s->vc, s->release_host);  // work enqueued from now on
    merge(s->released_acc, s->release_host);  // what a wait for the stream observes
    check_released(s);
    count("pending_waits", -1);
    count(front.wait.kernel ? "kernel_waits_passed" : "memop_waits_passed");
  }
  Item it = std::move(front);
  s->pending.pop_front();
  if (s->released && !it.is_wait) check_release(s, it);
  if (!it.observe.empty()) host_observe(it.observe);
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

// The GPU progress thread's round: every stream run as far as its work queued `age_ns` ago
// or earlier (and what that work depends on) can go.
void run_aged_streams(uint64_t age_ns) {
  std::unique_lock<std::recursive_mutex> lock(g_mu);
  const uint64_t now = mono_ns();
  auto run_aged = [&](CUstream_st* s) {
    if (s->pending.empty() || s->running) return;
    uint64_t upto = 0;
    for (const Item& it : s->pending) {
      if (now - it.enqueued_ns < age_ns) break;
      upto = it.idx;
    }
    if (!upto) return;
    const uint64_t before = s->completed;
    run_until(s, upto);
    if (s->completed > before) count("gpu_progress_executed", static_cast<long long>(s->completed - before));
  };
  for (CUstream_st* s : g_live_streams) run_aged(s);
  run_aged(legacy());
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
// The position of the first host wait on s whose flag does not hold yet (work after it
// is ordered after a release that has not happened), or UINT64_MAX.
uint64_t held_from(const CUstream_st* s);

void report_race(const std::string& who, bool write, uintptr_t lo, uintptr_t hi, const std::string& what,
                 int sid, uint64_t idx, bool a_write, uintptr_t a_lo, uintptr_t a_hi) {
  count("races");
  if (g_counters["races"] > 20) return;  // the first ones say enough
  fprintf(stderr,
          "fake_cuda: RACE: %s %s [%p, +%zu) while %s (stream %d, #%llu) %s [%p, +%zu), "
          "and nothing orders the two\n",
          who.c_str(), write ? "writes" : "reads", reinterpret_cast<void*>(lo),
          static_cast<size_t>(hi - lo), what.c_str(), sid, static_cast<unsigned long long>(idx),
          a_write ? "writes" : "reads", reinterpret_cast<void*>(a_lo), static_cast<size_t>(a_hi - a_lo));
}

// `who` (work at position idx of stream sid, or the host: sid -1) accesses [lo, hi) with
// order `vc`, against the history recorded before `seq_limit`. An access behind a host
// wait that has not passed is decided at that wait's release (a HeldPair).
int check_races(const VC& vc, uintptr_t lo, uintptr_t hi, bool write, const std::string& who,
                int sid, uint64_t idx, uint64_t seq_limit) {
  int races = 0;
  std::map<int, uint64_t> held;  // per stream of the history: held_from
  for (const Access& a : g_history) {
    if (a.seq > seq_limit) continue;
    if (at(vc, a.sid) >= a.idx) continue;  // ordered after it
    if (!(a.write || write) || !overlap(lo, hi, a.lo, a.hi)) continue;
    auto h = held.find(a.sid);
    if (h == held.end()) h = held.emplace(a.sid, held_from(g_streams[a.sid])).first;
    if (a.idx > h->second) {  // behind a host wait: decided at its release
      if (sid >= 0) g_held_pairs.push_back({a.sid, a.idx, sid, idx, lo, hi, write, who});
      continue;
    }
    ++races;
    report_race(who, write, lo, hi, a.what, a.sid, a.idx, a.write, a.lo, a.hi);
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

void enqueue(CUstream_st* s, std::vector<Dep> deps, const VC* extra_vc, std::function<void()> fn,
             const std::vector<RangeUse>& ranges, const std::string& what,
             const HostWait* wait = nullptr);

// Work enqueued on a capturing stream: a node that enqueues the same work (the closure is
// run once per launch, so it must not own one-shot state) on the launch stream.
void capture_work(CUstream_st* s, std::function<void()> fn, const std::vector<RangeUse>& ranges,
                  const std::string& what, const HostWait* wait) {
  if (wait && wait->probe) {
    fprintf(stderr, "fake_cuda: internal error: async work captured as plain work (%s)\n", what.c_str());
    abort();
  }
  auto n = std::make_shared<Node>();
  const bool has_wait = wait != nullptr;
  const HostWait w = has_wait ? *wait : HostWait{};
  n->issue = [fn, ranges, what, has_wait, w](CUstream_st* t) {
    enqueue(t, {}, nullptr, fn, ranges, what, has_wait ? &w : nullptr);
  };
  n->ranges = ranges;
  n->what = what;
  add_node(s, std::move(n));
}

// Appends work to s: implicit order first (what the host has seen, the legacy stream),
// then `extra_vc` (an event waited on), then the race check. On a capturing stream: a
// graph node instead (capture_work).
void enqueue(CUstream_st* s, std::vector<Dep> deps, const VC* extra_vc, std::function<void()> fn,
             const std::vector<RangeUse>& ranges, const std::string& what,
             const HostWait* wait) {
  if (s->cap) return capture_work(s, std::move(fn), ranges, what, wait);
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
  if (held_from(s) != UINT64_MAX) {  // behind a host wait: checked at its release
    it.held = !ranges.empty();
    if (it.held) it.held_vc = s->vc, it.held_seq = g_history_seq;
  } else {
    for (const RangeUse& r : ranges) check_races(s->vc, r.lo, r.hi, r.write, who, s->id, it.idx);
  }
  if (what == "host function (launch)") it.observe = s->vc;
  for (const RangeUse& r : ranges)
    g_history.push_back({s->id, it.idx, r.lo, r.hi, r.write, what, ++g_history_seq});
  it.deps = std::move(deps);
  it.fn = std::move(fn);
  it.ranges = ranges;
  it.what = what;
  it.enqueued_ns = g_gpu_progress_age_ns ? mono_ns() : 0;
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

// ---- device memory: each device's total and what is used of it ---------------------------
// Used: device allocations at their mapped length, and what a library reserved for itself
// (fake_cuda_device_reserve: the fake NCCL's communicators). Checked before anything is
// mapped, so that a refused allocation leaves nothing behind, as on a full GPU.

// Whether `bytes` more fit on `device`; a refusal is counted under "out_of_memory".
bool device_memory_fits(int device, unsigned long long bytes) {
  if (bytes == 0) return true;
  const unsigned long long total = g_mem_total[device], used = g_mem_used[device];
  if (bytes <= total && used <= total - bytes) return true;
  count("out_of_memory");
  if (g_verbose)
    fprintf(stderr, "fake_cuda: device %d: %llu bytes do not fit (%llu of %llu used)\n", device,
            bytes, used, total);
  return false;
}

// Counts `delta` bytes more (or, negative, fewer) as used on `device`; the gauges follow.
void charge_device_memory(int device, long long delta) {
  g_mem_used[device] += static_cast<unsigned long long>(delta);
  count("device_bytes_used", delta);
  unsigned long long& peak = g_counters["device_bytes_peak"];
  peak = std::max(peak, g_counters["device_bytes_used"]);
}

void* allocate(size_t bytes, int device, bool managed, bool async, bool pinned = false) {
  if (bytes == 0) return nullptr;
  const size_t charged = managed || pinned ? 0 : mapped_length(bytes);  // device memory only
  if (!device_memory_fits(device, charged)) return nullptr;
  void* p = mmap(nullptr, mapped_length(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                 -1, 0);
  if (p == MAP_FAILED) return nullptr;
  g_allocs[reinterpret_cast<uintptr_t>(p)] =
      Alloc{bytes, device, managed, pinned, async, false, ++g_alloc_ids, 0u, Alloc::plain, {}, charged};
  charge_device_memory(device, static_cast<long long>(charged));
  count(async ? "live_async_allocs" : pinned ? "live_host_allocs" : "live_allocs");
  return p;
}

std::atomic<unsigned> g_shm_seq{0};

// Device memory as POSIX shared memory (page-rounded), so that cuIpcGetMemHandle can name
// it and another process open it: cuMemAlloc's, and fake_cuda_malloc(_device)'s under
// FAKE_CUDA_MALLOC_SHM=1 (cudaMalloc memory is IPC-capable on a real GPU). nullptr when
// the system refuses.
// A name already taken is a segment left by an earlier process with this pid that did not
// live to unlink it (killed, aborted; no live process but this one has the pid, and this
// one never reuses a name): removed, and the name taken (however many such are left).
void* shm_allocate(size_t bytes, int device) {
  char name[48];
  const size_t len = (bytes + 4095) / 4096 * 4096;
  if (!device_memory_fits(device, len)) return nullptr;
  snprintf(name, sizeof name, "/fake-cuda-%d-%u", static_cast<int>(getpid()), g_shm_seq.fetch_add(1));
  int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0 && errno == EEXIST && shm_unlink(name) == 0)
    fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
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
  a.charged = len;
  g_allocs[reinterpret_cast<uintptr_t>(p)] = a;
  charge_device_memory(device, static_cast<long long>(len));
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
  if (it->second.charged) charge_device_memory(it->second.device, -static_cast<long long>(it->second.charged));
  g_allocs.erase(it);
  // A graph allocation freed otherwise (a device reset, a live cuMemFreeAsync): its node's
  // release must not free whatever is mapped at the address later.
  g_graph_allocs.erase(base);
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
  if (s->cap) {  // a capture event: the nodes s's captured work ends with, no stream work
    e->cap = s->cap;
    e->cap_nodes = s->cap_tail;
    return CUDA_SUCCESS;
  }
  e->cap.reset();
  auto stamp = std::make_shared<std::atomic<uint64_t>>(0);
  e->stamp = stamp;
  enqueue(s, {}, nullptr, [stamp] {
    stamp->store(static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::steady_clock::now().time_since_epoch()).count()));
  }, {}, "event record");
  e->recorded = true;
  e->stream = s;
  e->pos = s->enqueued;
  e->vc = s->vc;
  return CUDA_SUCCESS;
}

// s waits for an event recorded in a capture: s joins that capture (its later work is
// captured too, after the event's nodes), or, capturing already, depends on them.
CUresult join_capture(CUstream_st* s, CUevent_st* e) {
  Capture* c = e->cap.get();
  if (!c->active) return CUDA_ERROR_CAPTURED_EVENT;
  if (c->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  if (s->cap && s->cap != e->cap) {
    invalidate(s->cap.get(), "a wait on an event of another capture");
    invalidate(c, "a stream of another capture waited on its event");
    return CUDA_ERROR_STREAM_CAPTURE_MERGE;
  }
  if (s->legacy) {
    invalidate(c, "the legacy stream waited on its event (the legacy stream cannot capture)");
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  if (!s->cap) {
    s->cap = e->cap;
    s->cap_tail = e->cap_nodes;
    c->streams.insert(s);
    count("capture_joins");
    return CUDA_SUCCESS;
  }
  for (size_t n : e->cap_nodes)
    if (std::find(s->cap_tail.begin(), s->cap_tail.end(), n) == s->cap_tail.end()) s->cap_tail.push_back(n);
  return CUDA_SUCCESS;
}

// cuStreamWaitEvent's work. On a capturing stream, an event recorded outside the capture
// is an error (the capture invalidated) unless CU_EVENT_WAIT_EXTERNAL asks for an
// external wait node (each launch waits for the event as it is recorded then).
CUresult wait_event(CUstream_st* s, CUevent_st* e, unsigned flags = 0) {
  if (e->cap) return join_capture(s, e);
  if (!e->recorded) return CUDA_SUCCESS;  // waiting for a never-recorded event is a no-op
  if (s->cap && (flags & CU_EVENT_WAIT_EXTERNAL)) {
    auto n = std::make_shared<Node>();
    n->issue = [e](CUstream_st* t) {
      if (g_events.count(e) && e->recorded && !e->cap) wait_event(t, e);
    };
    n->what = "external event wait";
    add_node(s, std::move(n));
    return CUDA_SUCCESS;
  }
  if (s->cap) {
    invalidate(s->cap.get(), "a wait on an event recorded outside the capture (no CU_EVENT_WAIT_EXTERNAL)");
    return CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
  }
  enqueue(s, {{e->stream, e->pos}}, &e->vc, nullptr, {}, "stream wait");
  return CUDA_SUCCESS;
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
  if (CUresult r = capture_forbids_event(e, "cuEventQuery"); r != CUDA_SUCCESS) return r;
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

// Whether GPUs with bus numbers a and b reach each other's memory: the same GPU, or peer
// access in the node's topology (FAKE_CUDA_PEERS: "all" (default), "none", or groups of
// bus numbers "1,2/3,4").
bool peer_capable(int a, int b) {
  if (a == b) return true;
  const char* t = getenv("FAKE_CUDA_PEERS");
  if (!t || !*t || strcmp(t, "all") == 0) return true;
  if (strcmp(t, "none") == 0) return false;
  int group = 0, ga = -1, gb = -1;
  for (const char* p = t; *p;) {
    char* end = nullptr;
    const long v = strtol(p, &end, 10);
    if (end == p) {
      fprintf(stderr, "fake_cuda: FAKE_CUDA_PEERS='%s' is not all|none|groups like 1,2/3,4\n", t);
      abort();
    }
    if (v == a) ga = group;
    if (v == b) gb = group;
    p = end;
    if (*p == '/') ++group;
    if (*p == ',' || *p == '/') ++p;
  }
  return ga >= 0 && ga == gb;
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
CUresult called_from_host_fn(const char* api);
}  // namespace

// Every CUDA entry point: refused in a host function (cuLaunchHostFunc), as the driver
// refuses it; then LOCK(), and the call counted under its name.
#define API(name)                                    \
  if (t_in_host_fn) return called_from_host_fn(name); \
  LOCK();                                            \
  count(name)

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

// A host kernel's run as work beside the host (launch, wait for its thread, end).
void enqueue_host_kernel(CUstream_st* s, void (*run)(const void*), const std::vector<char>& params,
                         const std::vector<RangeUse>& ranges, const std::string& name) {
  auto* l = new HostLaunch;
  l->run = run;
  l->params = params;
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
}

CUresult launch_host_kernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                            unsigned by, unsigned bz, unsigned shmem, CUstream h, void** kparams,
                            void** extra) {
  if (!kparams || extra || !kparams[0] || gy != 1 || gz != 1 || by != 1 || bz != 1 || shmem != 0)
    return CUDA_ERROR_INVALID_VALUE;
  const HostKernel* k = nullptr;
  for (const HostKernel& x : kHostKernels)
    if (x.run == f->host) k = &x;
  if (const char* why = k->check(kparams[0], gx, bx)) {
    fprintf(stderr, "fake_cuda: cuLaunchKernel(%s): %s\n", k->name, why);
    return CUDA_ERROR_INVALID_VALUE;
  }
  CUresult err = CUDA_SUCCESS;
  CUstream_st* s = resolve_work(h, true, &err);
  if (!s) return err;
  const std::vector<char> params(static_cast<const char*>(kparams[0]),  // copied at launch
                                 static_cast<const char*>(kparams[0]) + f->param_bytes);
  std::vector<RangeUse> ranges;
  const bool direct_input = f->host == nvgroup_allreduce_host &&
                            reinterpret_cast<const streamcoll::nvgroup::Params*>(params.data())->input;
  if (f->host == nvgroup_allreduce_host) {
    namespace nv = streamcoll::nvgroup;
    const auto& p = *reinterpret_cast<const nv::Params*>(params.data());
    const uintptr_t block = p.count * nv::dtype_size(static_cast<nv::DType>(p.dtype));
    const auto mode = static_cast<nv::Mode>(p.mode);
    const uintptr_t in_bytes = mode == nv::Mode::reduce_scatter_block ? block * p.members : block;
    const uintptr_t out_bytes = mode == nv::Mode::allgather ? block * p.members : block;
    const auto in = reinterpret_cast<uintptr_t>(p.send), out = reinterpret_cast<uintptr_t>(p.recv);
    if (!overlap(in, in + in_bytes, out, out + out_bytes)) ranges.push_back({in, in + in_bytes, false});
    ranges.push_back({out, out + out_bytes, true});
  } else if (f->host == batch_copy_host) {
    const auto& p = *reinterpret_cast<const streamcoll::nvgroup::BatchCopyParams*>(params.data());
    for (uint32_t i = 0; i < p.n; ++i) {
      ranges.push_back({p.seg[i].src, p.seg[i].src + p.seg[i].bytes, false});
      ranges.push_back({p.seg[i].dst, p.seg[i].dst + p.seg[i].bytes, true});
    }
  } else if (f->host == reduce_host) {
    namespace nv = streamcoll::nvgroup;
    const auto& p = *reinterpret_cast<const nv::ReduceParams*>(params.data());
    const uintptr_t n = p.count * nv::dtype_size(static_cast<nv::DType>(p.dtype));
    const auto d = reinterpret_cast<uintptr_t>(p.dst), x = reinterpret_cast<uintptr_t>(p.src);
    ranges.push_back({x, x + n, false});
    ranges.push_back({d, d + n, true});
  }
  const std::string name = std::string(k->name) + " (host kernel)";
  if (s->cap) {  // a kernel node: its parameters as copied at capture, launched each run
    auto n = std::make_shared<Node>();
    n->issue = [run = f->host, params = std::move(params), ranges, name](CUstream_st* t) {
      enqueue_host_kernel(t, run, params, ranges, name);
    };
    n->ranges = ranges;
    n->what = name;
    add_node(s, std::move(n));
  } else {
    enqueue_host_kernel(s, f->host, params, ranges, name);
  }
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
  API("cuInit");
  return ret("cuInit", flags == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE);
}

FAKE_EXPORT CUresult cuDriverGetVersion(int* version) {
  API("cuDriverGetVersion");
  if (!version) return ret("cuDriverGetVersion", CUDA_ERROR_INVALID_VALUE);
  *version = CUDA_VERSION;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDeviceGetCount(int* n) {
  API("cuDeviceGetCount");
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
    case CUDA_ERROR_ILLEGAL_STATE: *str = "the operation cannot be performed in the present state"; break;
    case CUDA_ERROR_NOT_PERMITTED: *str = "operation not permitted"; break;
    case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: *str = "operation not permitted when stream is capturing"; break;
    case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: *str = "operation failed due to a previous error during capture"; break;
    case CUDA_ERROR_STREAM_CAPTURE_MERGE: *str = "operation would result in a merge of separate capture sequences"; break;
    case CUDA_ERROR_STREAM_CAPTURE_UNMATCHED: *str = "capture was not ended in the same stream as it began"; break;
    case CUDA_ERROR_STREAM_CAPTURE_UNJOINED: *str = "capturing stream has unjoined work"; break;
    case CUDA_ERROR_STREAM_CAPTURE_ISOLATION: *str = "dependency created on uncaptured work in another stream"; break;
    case CUDA_ERROR_STREAM_CAPTURE_IMPLICIT: *str = "operation would make the legacy stream depend on a capturing blocking stream"; break;
    case CUDA_ERROR_CAPTURED_EVENT: *str = "operation not permitted on an event last recorded in a capturing stream"; break;
    case CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD: *str = "attempt to terminate a thread-local capture sequence from another thread"; break;
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
  API("cuPointerGetAttributes");
  if (!attrs || !data) return ret("cuPointerGetAttributes", CUDA_ERROR_INVALID_VALUE);
  uintptr_t base = 0;
  const Alloc* a = find_alloc(reinterpret_cast<const void*>(ptr), 1, &base);
  for (unsigned i = 0; i < n; ++i)
    if (CUresult r = attribute(attrs[i], data[i], a, base, ptr); r != CUDA_SUCCESS)
      return ret("cuPointerGetAttributes", r);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attr, CUdeviceptr ptr) {
  API("cuPointerGetAttribute");
  uintptr_t base = 0;
  const Alloc* a = find_alloc(reinterpret_cast<const void*>(ptr), 1, &base);
  if (!data || !a) return ret("cuPointerGetAttribute", CUDA_ERROR_INVALID_VALUE);
  return ret("cuPointerGetAttribute", attribute(attr, data, a, base, ptr));
}

FAKE_EXPORT CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  API("cuDeviceGet");
  if (!device) return ret("cuDeviceGet", CUDA_ERROR_INVALID_VALUE);
  if (ordinal < 0 || ordinal >= g_devices) return ret("cuDeviceGet", CUDA_ERROR_INVALID_DEVICE);
  *device = ordinal;
  return CUDA_SUCCESS;
}

// For tools (streamcoll-info): "Fake GPU d", 80 GiB each.
FAKE_EXPORT CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
  API("cuDeviceGetName");
  if (dev < 0 || dev >= g_devices) return ret("cuDeviceGetName", CUDA_ERROR_INVALID_DEVICE);
  if (!name || len <= 0) return ret("cuDeviceGetName", CUDA_ERROR_INVALID_VALUE);
  snprintf(name, static_cast<size_t>(len), "Fake GPU %d", dev);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDeviceTotalMem(size_t* bytes, CUdevice dev) {
  API("cuDeviceTotalMem");
  if (dev < 0 || dev >= g_devices) return ret("cuDeviceTotalMem", CUDA_ERROR_INVALID_DEVICE);
  if (!bytes) return ret("cuDeviceTotalMem", CUDA_ERROR_INVALID_VALUE);
  *bytes = g_mem_total[dev];
  return CUDA_SUCCESS;
}

// The current context's device: what is free of its memory and its total.
FAKE_EXPORT CUresult cuMemGetInfo(size_t* free_bytes, size_t* total) {
  API("cuMemGetInfo");
  CUcontext c = current_ctx();
  if (!c) return ret("cuMemGetInfo", CUDA_ERROR_INVALID_CONTEXT);
  if (!free_bytes || !total) return ret("cuMemGetInfo", CUDA_ERROR_INVALID_VALUE);
  if (injected_failure("cuMemGetInfo")) return CUDA_ERROR_ILLEGAL_ADDRESS;
  *total = g_mem_total[c->device];
  *free_bytes = g_mem_total[c->device] - g_mem_used[c->device];
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDeviceGetPCIBusId(char* bus, int len, CUdevice dev) {
  API("cuDeviceGetPCIBusId");
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
  API("cuDevicePrimaryCtxRetain");
  if (injected_failure("cuDevicePrimaryCtxRetain")) return CUDA_ERROR_OUT_OF_MEMORY;
  if (!pctx) return ret("cuDevicePrimaryCtxRetain", CUDA_ERROR_INVALID_VALUE);
  if (dev < 0 || dev >= g_devices) return ret("cuDevicePrimaryCtxRetain", CUDA_ERROR_INVALID_DEVICE);
  ++g_ctx[dev].refs;
  count("ctx_refs");
  *pctx = &g_ctx[dev];
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
  API("cuDevicePrimaryCtxRelease");
  if (dev < 0 || dev >= g_devices) return ret("cuDevicePrimaryCtxRelease", CUDA_ERROR_INVALID_DEVICE);
  if (g_ctx[dev].refs <= 0) return ret("cuDevicePrimaryCtxRelease", CUDA_ERROR_INVALID_CONTEXT);
  --g_ctx[dev].refs;
  count("ctx_refs", -1);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuCtxGetCurrent(CUcontext* pctx) {
  API("cuCtxGetCurrent");
  if (!pctx) return ret("cuCtxGetCurrent", CUDA_ERROR_INVALID_VALUE);
  *pctx = current_ctx();
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuCtxGetDevice(CUdevice* device) {
  API("cuCtxGetDevice");
  if (!device) return ret("cuCtxGetDevice", CUDA_ERROR_INVALID_VALUE);
  CUcontext c = current_ctx();
  if (!c) return ret("cuCtxGetDevice", CUDA_ERROR_INVALID_CONTEXT);
  *device = c->device;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuCtxPushCurrent(CUcontext ctx) {
  API("cuCtxPushCurrent");
  bool known = false;
  for (auto& c : g_ctx) known = known || &c == ctx;
  // A primary context is usable only while retained.
  if (!known || ctx->refs <= 0) return ret("cuCtxPushCurrent", CUDA_ERROR_INVALID_CONTEXT);
  t_ctx_stack.push_back(ctx);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuCtxPopCurrent(CUcontext* pctx) {
  API("cuCtxPopCurrent");
  if (t_ctx_stack.empty()) return ret("cuCtxPopCurrent", CUDA_ERROR_INVALID_CONTEXT);
  CUcontext c = t_ctx_stack.back();
  t_ctx_stack.pop_back();
  if (pctx) *pctx = c;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuStreamCreate(CUstream* ph, unsigned int flags) {
  API("cuStreamCreate");
  if (injected_failure("cuStreamCreate")) return CUDA_ERROR_OUT_OF_MEMORY;
  if (!ph || (flags & ~static_cast<unsigned>(CU_STREAM_NON_BLOCKING)))
    return ret("cuStreamCreate", CUDA_ERROR_INVALID_VALUE);
  CUcontext ctx = current_ctx();
  if (!ctx) return ret("cuStreamCreate", CUDA_ERROR_INVALID_CONTEXT);
  *ph = new_stream(flags, ctx->device, false);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuStreamDestroy(CUstream h) {
  API("cuStreamDestroy");
  if (is_legacy_handle(h) || !g_live_streams.count(h) || h->internal)
    return ret("cuStreamDestroy", CUDA_ERROR_INVALID_HANDLE);
  destroy_stream(h);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuStreamQuery(CUstream h) {
  API("cuStreamQuery");
  CUresult err = CUDA_SUCCESS;
  CUstream_st* s = resolve(h, true, &err);
  if (!s) return ret("cuStreamQuery", err);
  if (CUresult r = capture_forbids_wait(s, "cuStreamQuery"); r != CUDA_SUCCESS) return ret("cuStreamQuery", r);
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
  if (CUresult r = capture_forbids_wait(s, "cuStreamSynchronize"); r != CUDA_SUCCESS) return r;
  const uint64_t pos = s->enqueued;
  VC vc = s->vc;
  run_blocking(lock, s, pos, "cuStreamSynchronize");
  merge(vc, s->released_acc);  // the work the passed waits were released after
  host_observe(vc);
  return CUDA_SUCCESS;
}
}  // namespace

FAKE_EXPORT CUresult cuStreamSynchronize(CUstream h) {
  API("cuStreamSynchronize");
  const CUresult r = sync_stream(lock, h, true);
  if (r == CUDA_SUCCESS && injected_failure("cuStreamSynchronize")) return CUDA_ERROR_ILLEGAL_ADDRESS;
  return ret("cuStreamSynchronize", r);
}

FAKE_EXPORT CUresult cuStreamWaitEvent(CUstream h, CUevent e, unsigned int flags) {
  API("cuStreamWaitEvent");
  if (injected_failure("cuStreamWaitEvent")) return CUDA_ERROR_ILLEGAL_ADDRESS;
  CUresult err = CUDA_SUCCESS;
  CUstream_st* s = resolve_work(h, true, &err);
  if (!s) return ret("cuStreamWaitEvent", err);
  if (!g_events.count(e)) return ret("cuStreamWaitEvent", CUDA_ERROR_INVALID_HANDLE);
  // CU_EVENT_WAIT_EXTERNAL: only in a capture
  if (flags != 0 && !(flags == CU_EVENT_WAIT_EXTERNAL && s->cap))
    return ret("cuStreamWaitEvent", CUDA_ERROR_INVALID_VALUE);
  return ret("cuStreamWaitEvent", wait_event(s, e, flags));
}

FAKE_EXPORT CUresult cuEventCreate(CUevent* pe, unsigned int flags) {
  API("cuEventCreate");
  if (injected_failure("cuEventCreate")) return CUDA_ERROR_OUT_OF_MEMORY;
  if (!pe) return ret("cuEventCreate", CUDA_ERROR_INVALID_VALUE);
  if (!current_ctx()) return ret("cuEventCreate", CUDA_ERROR_INVALID_CONTEXT);
  auto* e = new CUevent_st;
  e->timing = !(flags & CU_EVENT_DISABLE_TIMING);
  e->device = current_ctx()->device;
  g_events.insert(e);
  count("live_events");
  *pe = e;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuEventDestroy(CUevent e) {
  API("cuEventDestroy");
  if (!g_events.count(e) || e->internal) return ret("cuEventDestroy", CUDA_ERROR_INVALID_HANDLE);
  g_events.erase(e);
  delete e;
  count("live_events", -1);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuEventRecord(CUevent e, CUstream h) {
  API("cuEventRecord");
  if (injected_failure("cuEventRecord")) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (!g_events.count(e)) return ret("cuEventRecord", CUDA_ERROR_INVALID_HANDLE);
  CUresult err = CUDA_SUCCESS;
  CUstream_st* s = resolve_work(h, true, &err);
  if (!s) return ret("cuEventRecord", err);
  return record(e, s);
}

FAKE_EXPORT CUresult cuEventQuery(CUevent e) {
  API("cuEventQuery");
  if (!g_events.count(e)) return ret("cuEventQuery", CUDA_ERROR_INVALID_HANDLE);
  bool async = false;
  const CUresult r = query_event(e, &async);
  if (r == CUDA_SUCCESS && injected_failure("cuEventQuery")) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (r == CUDA_ERROR_NOT_READY) postpone_failure("cuEventQuery");
  yield_to_async(lock, async);
  return r;
}

// Milliseconds between the times the streams ran past the two events' records (the host
// clock of the fake's stream work); CUDA_ERROR_NOT_READY while either has not run.
FAKE_EXPORT CUresult cuEventElapsedTime_v2(float* ms, CUevent a, CUevent b) {
  API("cuEventElapsedTime");
  if (!ms) return ret("cuEventElapsedTime", CUDA_ERROR_INVALID_VALUE);
  if (!g_events.count(a) || !g_events.count(b) || !a->timing || !b->timing || a->cap || b->cap)
    return ret("cuEventElapsedTime", CUDA_ERROR_INVALID_HANDLE);
  if (!a->recorded || !b->recorded) return ret("cuEventElapsedTime", CUDA_ERROR_INVALID_HANDLE);
  const uint64_t ta = a->stamp ? a->stamp->load() : 0, tb = b->stamp ? b->stamp->load() : 0;
  if (!ta || !tb) return CUDA_ERROR_NOT_READY;
  *ms = static_cast<float>((static_cast<double>(tb) - static_cast<double>(ta)) / 1e6);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuEventSynchronize(CUevent e) {
  API("cuEventSynchronize");
  if (!g_events.count(e)) return ret("cuEventSynchronize", CUDA_ERROR_INVALID_HANDLE);
  if (CUresult r = capture_forbids_event(e, "cuEventSynchronize"); r != CUDA_SUCCESS)
    return ret("cuEventSynchronize", r);
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
  API("cuMemcpyDtoDAsync");
  if (injected_failure("cuMemcpyDtoDAsync")) return CUDA_ERROR_ILLEGAL_ADDRESS;
  CUresult err = CUDA_SUCCESS;
  CUstream_st* s = resolve_work(h, true, &err);
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

namespace {
// Graph allocations (g_graph_allocs): the address is fixed when the node is made and
// stays the graph's until the last graph or exec holding the node is destroyed (a
// simplification: the driver frees it at the graph's free node and may reuse it between
// launches). Its device memory stays counted as used as long.
CUresult capture_alloc(CUstream_st* s, uintptr_t a, size_t bytes) {
  g_graph_allocs[a] = s->cap->id;
  auto n = std::make_shared<Node>();
  const std::vector<RangeUse> ranges = {{a, a + bytes, true}};
  n->issue = [ranges](CUstream_st* t) { enqueue(t, {}, nullptr, nullptr, ranges, "cuMemAllocAsync (graph)"); };
  n->ranges = ranges;
  n->what = "cuMemAllocAsync (graph)";
  n->release = [a] {
    if (g_graph_allocs.erase(a) && g_allocs.count(a)) release(a);
  };
  add_node(s, std::move(n));
  return CUDA_SUCCESS;
}

// cuMemFreeAsync in a capture: of an allocation of the same capture (a free node; the
// memory goes with the graph). Not modelled: freeing other memory in a graph (said on
// stderr, CUDA_ERROR_NOT_SUPPORTED, the capture invalidated).
CUresult capture_free(CUstream_st* s, uintptr_t base, size_t bytes) {
  auto it = g_graph_allocs.find(base);
  if (it == g_graph_allocs.end() || it->second != s->cap->id) {
    fprintf(stderr, "fake_cuda: cuMemFreeAsync in a capture of memory not allocated in that capture: "
                    "not modelled by the fake\n");
    invalidate(s->cap.get(), "cuMemFreeAsync of memory from outside the capture (not modelled)");
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  capture_work(s, nullptr, {{base, base + bytes, true}}, "cuMemFreeAsync (graph)", nullptr);
  return CUDA_SUCCESS;
}
}  // namespace

FAKE_EXPORT CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytes, CUstream h) {
  API("cuMemAllocAsync");
  if (injected_failure("cuMemAllocAsync")) return CUDA_ERROR_OUT_OF_MEMORY;
  if (!dptr || bytes == 0) return ret("cuMemAllocAsync", CUDA_ERROR_INVALID_VALUE);
  CUcontext ctx = current_ctx();
  if (!ctx) return ret("cuMemAllocAsync", CUDA_ERROR_INVALID_CONTEXT);
  CUresult err = CUDA_SUCCESS;
  CUstream_st* s = resolve_work(h, true, &err);
  if (!s) return ret("cuMemAllocAsync", err);
  void* p = allocate(bytes, ctx->device, false, true);
  if (!p) return ret("cuMemAllocAsync", CUDA_ERROR_OUT_OF_MEMORY);
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  *dptr = a;
  if (s->cap) return capture_alloc(s, a, bytes);
  // Stream-ordered: the memory is the stream's from here on.
  enqueue(s, {}, nullptr, nullptr, {{a, a + bytes, true}}, "cuMemAllocAsync");
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream h) {
  API("cuMemFreeAsync");
  CUresult err = CUDA_SUCCESS;
  CUstream_st* s = resolve_work(h, true, &err);
  if (!s) return ret("cuMemFreeAsync", err);
  auto it = g_allocs.find(dptr);
  if (it == g_allocs.end() || !it->second.async || it->second.free_pending)
    return ret("cuMemFreeAsync", CUDA_ERROR_INVALID_VALUE);
  if (s->cap) return ret("cuMemFreeAsync", capture_free(s, dptr, it->second.bytes));
  it->second.free_pending = true;
  const uintptr_t base = dptr;
  enqueue(s, {}, nullptr, [base] { release(base); },
          {{base, base + it->second.bytes, true}}, "cuMemFreeAsync");
  return CUDA_SUCCESS;
}

// Page-locked host memory and a copy between any two pointers (unified addressing), for
// host staging (core/host_staging.cpp).
FAKE_EXPORT CUresult cuMemHostAlloc(void** pp, size_t bytes, unsigned int flags) {
  API("cuMemHostAlloc");
  if (CUresult r = unsafe_during_capture("cuMemHostAlloc"); r != CUDA_SUCCESS) return ret("cuMemHostAlloc", r);
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
  API("cuMemFreeHost");
  if (CUresult r = unsafe_during_capture("cuMemFreeHost"); r != CUDA_SUCCESS) return ret("cuMemFreeHost", r);
  auto it = g_allocs.find(reinterpret_cast<uintptr_t>(p));
  if (it == g_allocs.end() || !it->second.pinned) return ret("cuMemFreeHost", CUDA_ERROR_INVALID_VALUE);
  const uintptr_t a = it->first;
  check_races(g_host, a, a + it->second.bytes, true, "cuMemFreeHost");
  release(a);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h) {
  API("cuMemcpyAsync");
  CUresult err = CUDA_SUCCESS;
  CUstream_st* s = resolve_work(h, true, &err);
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
  int32_t bus;  // the exporting GPU's bus number (the node's topology decides who opens it)
  char name[44];
};
static_assert(sizeof(IpcHandle) <= sizeof(CUipcMemHandle), "fits the handle");
constexpr uint32_t kIpcMagic = 0xfa4ec0deu;
}  // namespace

FAKE_EXPORT CUresult cuMemAlloc(CUdeviceptr* dptr, size_t bytes) {
  API("cuMemAlloc");
  if (CUresult r = unsafe_during_capture("cuMemAlloc"); r != CUDA_SUCCESS) return ret("cuMemAlloc", r);
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
  API("cuMemAllocManaged");
  if (CUresult r = unsafe_during_capture("cuMemAllocManaged"); r != CUDA_SUCCESS) return ret("cuMemAllocManaged", r);
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
  API("cuMemFree");
  if (CUresult r = unsafe_during_capture("cuMemFree"); r != CUDA_SUCCESS) return ret("cuMemFree", r);
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
  API("cuIpcGetMemHandle");
  if (injected_failure("cuIpcGetMemHandle")) return CUDA_ERROR_INVALID_VALUE;
  if (!handle) return ret("cuIpcGetMemHandle", CUDA_ERROR_INVALID_VALUE);
  auto it = g_allocs.find(static_cast<uintptr_t>(dptr));
  if (it == g_allocs.end() || it->second.kind != Alloc::shm) {
    fprintf(stderr, "fake_cuda: cuIpcGetMemHandle(%p): not the start of a cuMemAlloc allocation\n",
            reinterpret_cast<void*>(dptr));
    return ret("cuIpcGetMemHandle", CUDA_ERROR_INVALID_VALUE);
  }
  IpcHandle h{kIpcMagic, static_cast<int32_t>(getpid()), it->second.bytes, bus_number(it->second.device), {0}};
  snprintf(h.name, sizeof h.name, "%s", it->second.shm_name.c_str());
  memset(handle, 0, sizeof *handle);
  memcpy(handle->reserved, &h, sizeof h);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr* dptr, CUipcMemHandle handle, unsigned int flags) {
  API("cuIpcOpenMemHandle");
  if (injected_failure("cuIpcOpenMemHandle")) return CUDA_ERROR_OUT_OF_MEMORY;
  CUcontext c = current_ctx();
  if (!c) return ret("cuIpcOpenMemHandle", CUDA_ERROR_INVALID_CONTEXT);
  IpcHandle h;
  memcpy(&h, handle.reserved, sizeof h);
  if (!dptr || h.magic != kIpcMagic || (flags & ~CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS))
    return ret("cuIpcOpenMemHandle", CUDA_ERROR_INVALID_VALUE);
  // As the real driver: a process cannot open its own allocations' handles.
  if (h.pid == static_cast<int32_t>(getpid())) return ret("cuIpcOpenMemHandle", CUDA_ERROR_INVALID_CONTEXT);
  // The GPUs must reach each other (the same GPU, or peer access in the node's topology).
  if (!peer_capable(h.bus, bus_number(c->device))) return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
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
  API("cuIpcCloseMemHandle");
  auto it = g_allocs.find(static_cast<uintptr_t>(dptr));
  if (it == g_allocs.end() || it->second.kind != Alloc::ipc) return ret("cuIpcCloseMemHandle", CUDA_ERROR_INVALID_VALUE);
  count("live_ipc_mappings", -1);
  release(it->first);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemHostRegister(void* p, size_t bytes, unsigned int flags) {
  API("cuMemHostRegister");
  if (CUresult r = unsafe_during_capture("cuMemHostRegister"); r != CUDA_SUCCESS) return ret("cuMemHostRegister", r);
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
  API("cuMemHostUnregister");
  if (CUresult r = unsafe_during_capture("cuMemHostUnregister"); r != CUDA_SUCCESS) return ret("cuMemHostUnregister", r);
  auto it = g_allocs.find(reinterpret_cast<uintptr_t>(p));
  if (it == g_allocs.end() || it->second.kind != Alloc::registered)
    return ret("cuMemHostUnregister", CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
  count("live_registered", -1);
  release(it->first);
  return CUDA_SUCCESS;
}

// "0000:BB:00.0" of one of this process's devices (bus_number()).
FAKE_EXPORT CUresult cuDeviceGetByPCIBusId(CUdevice* dev, const char* bus) {
  API("cuDeviceGetByPCIBusId");
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
  API("cuDeviceCanAccessPeer");
  if (!can) return ret("cuDeviceCanAccessPeer", CUDA_ERROR_INVALID_VALUE);
  if (dev < 0 || dev >= g_devices || peer < 0 || peer >= g_devices)
    return ret("cuDeviceCanAccessPeer", CUDA_ERROR_INVALID_DEVICE);
  const char* no = getenv("FAKE_CUDA_NO_PEER");
  *can = dev != peer && !(no && strcmp(no, "1") == 0) && peer_capable(bus_number(dev), bus_number(peer));
  return CUDA_SUCCESS;
}

// ---- host waits: stream memory operations, the spin kernel, mapped pinned memory -------

// The device address of mapped pinned memory: the host address (unified addressing).
// Only for memory from cuMemHostAlloc with CU_MEMHOSTALLOC_DEVICEMAP (this fake is
// stricter than a driver with unified addressing, which maps every allocation).
FAKE_EXPORT CUresult cuMemHostGetDevicePointer(CUdeviceptr* pdptr, void* p, unsigned int flags) {
  API("cuMemHostGetDevicePointer");
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
  CUstream_st* s = resolve_work(h, true, &err);
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
  API("cuStreamWaitValue32");
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

// The stream writes `value` to the flag once its earlier work is done (with the memory
// barrier the default flags ask for). A host wait released by it orders the waiting
// stream after the writer's work (g_flag_writers).
FAKE_EXPORT CUresult cuStreamWriteValue32(CUstream h, CUdeviceptr addr, cuuint32_t value, unsigned int flags) {
  API("cuStreamWriteValue32");
  if (injected_failure("cuStreamWriteValue32")) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (g_no_memops) {
    count("not_supported");
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (flags & ~static_cast<unsigned>(CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER))
    return ret("cuStreamWriteValue32", CUDA_ERROR_INVALID_VALUE);
  CUresult err = CUDA_SUCCESS;
  CUstream_st* s = resolve_work(h, true, &err);
  if (!s) return ret("cuStreamWriteValue32", err);
  if (!waitable(addr, "cuStreamWriteValue32")) return ret("cuStreamWriteValue32", CUDA_ERROR_INVALID_VALUE);
  // The write's order, as enqueue() makes it (before it, which may run it at once); on a
  // capturing stream: the capture's, not each launch's.
  auto order = std::make_shared<VC>(s->vc);
  merge(*order, g_host);
  if (order->size() <= static_cast<size_t>(s->id)) order->resize(s->id + 1, 0);
  (*order)[s->id] = s->enqueued + 1;
  if (!s->cap) g_pending_writes[addr] = {s, s->enqueued + 1};
  enqueue(s, {}, nullptr, [addr, value, order] {
    g_flag_writers[addr] = *order;
    __atomic_store_n(reinterpret_cast<uint32_t*>(addr), value, __ATOMIC_RELEASE);
  }, {}, "cuStreamWriteValue32");
  count("memop_writes");
  return CUDA_SUCCESS;
}

// Some device attributes, as an H200 answers; stream memory operations per
// FAKE_CUDA_NO_STREAM_MEMOPS. Others: 0 (said under FAKE_CUDA_VERBOSE=1).
FAKE_EXPORT CUresult cuDeviceGetAttribute(int* pi, CUdevice_attribute attrib, CUdevice dev) {
  API("cuDeviceGetAttribute");
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
  API("cuModuleLoadData");
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
  API("cuModuleGetFunction");
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
  API("cuModuleUnload");
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
  API("cuLaunchKernel");
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

// ---- stream capture and graphs ----------------------------------------------------------
// cuStreamBeginCapture: the stream's work from then on (copies, kernels, waits, host
// functions, graph allocations, the fake NCCL's operations through fake_cuda_capture_node)
// becomes graph nodes instead of running. An event recorded on a capturing stream is a
// capture event; a stream waiting on it joins the capture (its later work is captured,
// after the event's nodes). cuStreamEndCapture on the origin gives the graph: every
// joined stream must have been joined back (its last nodes reach the origin's), or
// CUDA_ERROR_STREAM_CAPTURE_UNJOINED. Rules whose violation invalidates the capture (the
// driver's, "Prohibited and Unhandled Operations"): queries and synchronizations of a
// capturing stream or a capture event (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED); the legacy
// stream while a blocking stream captures (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT); a wait on
// an event from outside the capture (CUDA_ERROR_STREAM_CAPTURE_ISOLATION) or from another
// capture (CUDA_ERROR_STREAM_CAPTURE_MERGE); potentially unsafe calls (cuMemAlloc,
// cuMemFree, cuMemAllocManaged, cuMemHostAlloc, cuMemFreeHost, cuMemHostRegister,
// cuMemHostUnregister) per the capture and thread modes (unsafe_during_capture).
// An invalidated capture's streams answer CUDA_ERROR_STREAM_CAPTURE_INVALIDATED until
// cuStreamEndCapture, which returns that error and a NULL graph.
// cuGraphLaunch enqueues every node's work, in capture order (a topological order), on
// the launch stream as ordinary stream work, after the exec's previous launch (as the
// driver orders launches of one exec); so the happens-before check sees each run. The
// graph's own unordered nodes are checked for races once, at cuStreamEndCapture.
// Host functions (cuLaunchHostFunc, live or in a graph) run on one thread of the fake's
// own, in stream order, as work beside the host; a CUDA call from one answers
// CUDA_ERROR_NOT_PERMITTED.

// cuUserObjectCreate: an object whose destructor runs when its last reference goes (the
// application's, and those of the graphs and executable graphs that retain it).
struct CUuserObject_st {
  void* ptr = nullptr;
  CUhostFn destroy = nullptr;
  unsigned refs = 0;
};
namespace {
std::set<CUuserObject_st*> g_user_objects;

// Drops `n` references of `o`; the destructor runs at the last, as a host function would
// (no CUDA call allowed: the driver runs it on an internal thread).
void release_user_object(CUuserObject_st* o, unsigned n) {
  o->refs -= std::min(n, o->refs);
  if (o->refs) return;
  g_user_objects.erase(o);
  count("live_user_objects", -1);
  const bool was = t_in_host_fn;
  t_in_host_fn = true;
  o->destroy(o->ptr);
  t_in_host_fn = was;
  delete o;
}
}  // namespace

// The user-object references a graph holds; shared with the executable graphs made from
// it, so they last as long as the last of them.
struct UserRefs {
  std::vector<std::pair<CUuserObject_st*, unsigned>> held;
  ~UserRefs() {
    for (auto& [o, n] : held) release_user_object(o, n);
  }
};

struct CUgraph_st {
  Nodes nodes;
  std::shared_ptr<UserRefs> users = std::make_shared<UserRefs>();
};
struct CUgraphExec_st {
  Nodes nodes;
  std::shared_ptr<UserRefs> users;
  CUevent_st last;  // recorded after its latest launch (internal, never in g_events)
};

namespace {

std::set<CUgraph_st*> g_graphs;
std::set<CUgraphExec_st*> g_execs;

// ---- host functions: one thread of the fake's, as the driver's callback thread ----

struct HostCall {
  CUhostFn fn;
  void* data;
  std::atomic<int> done{0};
};

struct HostFnThread {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<HostCall*> queue;
  bool started = false;
};

HostFnThread& host_fn_thread() {
  static auto* t = new HostFnThread;  // never destroyed: the thread outlives main
  return *t;
}

void host_fn_loop(HostFnThread* t) {
  for (;;) {
    HostCall* c = nullptr;
    {
      std::unique_lock<std::mutex> lock(t->mu);
      t->cv.wait(lock, [&] { return !t->queue.empty(); });
      c = t->queue.front();
      t->queue.pop_front();
    }
    t_in_host_fn = true;
    c->fn(c->data);
    t_in_host_fn = false;
    c->done.store(1, std::memory_order_release);
  }
}

// Hands a host function to the thread (the launch piece: holding the lock, never blocks).
void start_host_call(HostCall* c) {
  HostFnThread& t = host_fn_thread();
  std::lock_guard<std::mutex> lock(t.mu);
  t.queue.push_back(c);
  if (!t.started) {
    t.started = true;
    sigset_t all, old;  // asynchronous signals stay with the program's threads
    sigfillset(&all);
    for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTRAP}) sigdelset(&all, sig);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    std::thread(host_fn_loop, &t).detach();
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
  }
  t.cv.notify_one();
}

// fn(data) when s gets there: launch, the stream held until it returned, end.
void enqueue_host_call(CUstream_st* s, CUhostFn fn, void* data) {
  auto* c = new HostCall{fn, data};
  enqueue(s, {}, nullptr, [c] { start_host_call(c); }, {}, "host function (launch)");
  HostWait w;
  w.probe = [](void* a) { return static_cast<HostCall*>(a)->done.load(std::memory_order_acquire); };
  w.probe_arg = c;
  enqueue(s, {}, nullptr, nullptr, {}, "host function (running)", &w);
  enqueue(s, {}, nullptr, [c] {
    count("host_funcs_run");
    delete c;
  }, {}, "host function");
}

// A CUDA call made by a host function (API()): the driver does not permit it.
CUresult called_from_host_fn(const char* api) {
  Lock lock(g_mu);
  count(api);
  count("not_permitted");
  fprintf(stderr, "fake_cuda: %s called from a host function (cuLaunchHostFunc): not permitted\n", api);
  return CUDA_ERROR_NOT_PERMITTED;
}

// ---- capture sequences ----

void end_capture(Capture* c) {
  delete c->graph;  // (null once cuStreamEndCapture handed it out)
  c->graph = nullptr;
  for (CUstream_st* x : c->streams)
    if (x->cap.get() == c) {
      x->cap.reset();
      x->cap_tail.clear();
    }
  c->active = false;
  g_captures.erase(std::remove_if(g_captures.begin(), g_captures.end(),
                                  [c](const std::shared_ptr<Capture>& p) { return p.get() == c; }),
                   g_captures.end());
}

// Nodes whose work precedes node i (its ancestors), for every i.
std::vector<std::vector<bool>> ancestors(const Nodes& nodes) {
  std::vector<std::vector<bool>> anc(nodes.size(), std::vector<bool>(nodes.size(), false));
  for (size_t i = 0; i < nodes.size(); ++i)
    for (size_t d : nodes[i]->deps) {
      anc[i][d] = true;
      for (size_t k = 0; k < d; ++k)
        if (anc[d][k]) anc[i][k] = true;
    }
  return anc;
}

// Whether every node in `tail` (a joined stream's last nodes) precedes or is one of the
// origin's last nodes: the stream was joined back.
bool joined_back(const std::vector<size_t>& tail, const std::vector<size_t>& origin,
                 const std::vector<std::vector<bool>>& anc) {
  for (size_t n : tail) {
    bool reached = false;
    for (size_t o : origin) reached = reached || n == o || anc[o][n];
    if (!reached) return false;
  }
  return true;
}

// Two nodes of the graph that nothing orders, one writing what the other touches: a race
// on a GPU, though the fake's launches run the nodes one after the other.
void check_graph_races(const Nodes& nodes, const std::vector<std::vector<bool>>& anc) {
  for (size_t j = 0; j < nodes.size(); ++j)
    for (size_t i = 0; i < j; ++i) {
      if (anc[j][i]) continue;
      for (const RangeUse& a : nodes[i]->ranges)
        for (const RangeUse& b : nodes[j]->ranges) {
          if (!(a.write || b.write) || !overlap(a.lo, a.hi, b.lo, b.hi)) continue;
          count("races");
          count("graph_races");
          if (g_counters["races"] > 20) continue;
          fprintf(stderr, "fake_cuda: RACE in a captured graph: node %zu (%s) %s [%p, +%zu) and node %zu "
                          "(%s) %s [%p, +%zu), and nothing orders the two\n",
                  i, nodes[i]->what.c_str(), a.write ? "writes" : "reads", reinterpret_cast<void*>(a.lo),
                  static_cast<size_t>(a.hi - a.lo), j, nodes[j]->what.c_str(), b.write ? "writes" : "reads",
                  reinterpret_cast<void*>(b.lo), static_cast<size_t>(b.hi - b.lo));
        }
    }
}

// One launch: every node's work on s, in capture order, each followed by a marker that
// counts it run.
void launch_nodes(CUstream_st* s, const Nodes& nodes) {
  for (const auto& n : nodes) {
    n->issue(s);
    enqueue(s, {}, nullptr, [] { count("graph_node_run"); }, {}, "graph node end");
  }
}

std::vector<RangeUse> ranges_of_nodes(const Nodes& nodes) {
  std::vector<RangeUse> out;
  for (const auto& n : nodes) out.insert(out.end(), n->ranges.begin(), n->ranges.end());
  return out;
}

}  // namespace

FAKE_EXPORT CUresult cuStreamBeginCapture(CUstream h, CUstreamCaptureMode mode) {
  API("cuStreamBeginCapture");
  if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
      mode != CU_STREAM_CAPTURE_MODE_RELAXED)
    return ret("cuStreamBeginCapture", CUDA_ERROR_INVALID_VALUE);
  CUresult err = CUDA_SUCCESS;
  CUstream_st* s = resolve(h, true, &err);
  if (!s) return ret("cuStreamBeginCapture", err);
  if (s->legacy) return ret("cuStreamBeginCapture", CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  if (s->cap) return ret("cuStreamBeginCapture", CUDA_ERROR_ILLEGAL_STATE);
  auto c = std::make_shared<Capture>();
  c->id = ++g_capture_ids;
  c->mode = mode;
  c->origin = s;
  c->thread = std::this_thread::get_id();
  c->streams.insert(s);
  c->graph = new CUgraph_st;
  s->cap = c;
  s->cap_tail.clear();
  g_captures.push_back(c);
  count("captures");
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuStreamEndCapture(CUstream h, CUgraph* graph) {
  API("cuStreamEndCapture");
  if (!graph) return ret("cuStreamEndCapture", CUDA_ERROR_INVALID_VALUE);
  *graph = nullptr;
  CUresult err = CUDA_SUCCESS;
  CUstream_st* s = resolve(h, true, &err);
  if (!s) return ret("cuStreamEndCapture", err);
  if (!s->cap) return ret("cuStreamEndCapture", CUDA_ERROR_ILLEGAL_STATE);
  Capture* c = s->cap.get();
  if (c->origin != s) {
    invalidate(c, "cuStreamEndCapture on a stream that joined it, not its origin");
    return ret("cuStreamEndCapture", CUDA_ERROR_STREAM_CAPTURE_UNMATCHED);
  }
  if (c->mode != CU_STREAM_CAPTURE_MODE_RELAXED && c->thread != std::this_thread::get_id())
    return ret("cuStreamEndCapture", CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
  const std::shared_ptr<Capture> keep = s->cap;
  if (c->invalidated) {
    end_capture(c);
    return ret("cuStreamEndCapture", CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  }
  const auto anc = ancestors(c->nodes);
  for (CUstream_st* x : c->streams)
    if (x != s && x->cap.get() == c && !joined_back(x->cap_tail, s->cap_tail, anc)) {
      fprintf(stderr, "fake_cuda: cuStreamEndCapture: stream %d joined capture %llu and was not "
                      "joined back into its origin (stream %d)\n", x->id, c->id, s->id);
      count("capture_unjoined");
      c->nodes.clear();
      end_capture(c);
      return ret("cuStreamEndCapture", CUDA_ERROR_STREAM_CAPTURE_UNJOINED);
    }
  check_graph_races(c->nodes, anc);
  CUgraph_st* g = c->graph;
  c->graph = nullptr;
  g->nodes = std::move(c->nodes);
  end_capture(c);
  g_graphs.insert(g);
  count("live_graphs");
  *graph = g;
  return CUDA_SUCCESS;
}

namespace {
CUstreamCaptureStatus capture_status(const CUstream_st* s) {
  if (!s->cap) return CU_STREAM_CAPTURE_STATUS_NONE;
  return s->cap->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED : CU_STREAM_CAPTURE_STATUS_ACTIVE;
}
}  // namespace

FAKE_EXPORT CUresult cuStreamIsCapturing(CUstream h, CUstreamCaptureStatus* status) {
  API("cuStreamIsCapturing");
  if (!status) return ret("cuStreamIsCapturing", CUDA_ERROR_INVALID_VALUE);
  CUresult err = CUDA_SUCCESS;
  CUstream_st* s = resolve(h, true, &err);
  if (!s) return ret("cuStreamIsCapturing", err);
  // the legacy stream while a blocking stream captures: an error, the capture untouched
  if (s->legacy && legacy_blocked(false)) return ret("cuStreamIsCapturing", CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
  *status = capture_status(s);
  return CUDA_SUCCESS;
}

// The status, the capture's id and the graph being built; no dependency nodes (NULL, 0):
// the fake has no CUgraphNode handles.
FAKE_EXPORT CUresult cuStreamGetCaptureInfo(CUstream h, CUstreamCaptureStatus* status, cuuint64_t* id,
                                            CUgraph* graph, const CUgraphNode** deps,
                                            const CUgraphEdgeData** edges, size_t* ndeps) {
  API("cuStreamGetCaptureInfo");
  if (!status) return ret("cuStreamGetCaptureInfo", CUDA_ERROR_INVALID_VALUE);
  CUresult err = CUDA_SUCCESS;
  CUstream_st* s = resolve(h, true, &err);
  if (!s) return ret("cuStreamGetCaptureInfo", err);
  if (s->legacy && legacy_blocked(false)) return ret("cuStreamGetCaptureInfo", CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
  *status = capture_status(s);
  if (id) *id = s->cap ? s->cap->id : 0;
  if (graph) *graph = s->cap ? s->cap->graph : nullptr;
  if (deps) *deps = nullptr;
  if (edges) *edges = nullptr;
  if (ndeps) *ndeps = 0;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  API("cuThreadExchangeStreamCaptureMode");
  if (!mode || (*mode != CU_STREAM_CAPTURE_MODE_GLOBAL && *mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
                *mode != CU_STREAM_CAPTURE_MODE_RELAXED))
    return ret("cuThreadExchangeStreamCaptureMode", CUDA_ERROR_INVALID_VALUE);
  std::swap(*mode, t_capture_mode);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuGraphInstantiate(CUgraphExec* exec, CUgraph g, unsigned long long flags) {
  API("cuGraphInstantiate");
  const unsigned long long known = CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH |
                                   CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD |
                                   CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY;
  if (!exec || (flags & ~known)) return ret("cuGraphInstantiate", CUDA_ERROR_INVALID_VALUE);
  if (!g_graphs.count(g)) return ret("cuGraphInstantiate", CUDA_ERROR_INVALID_HANDLE);
  auto* x = new CUgraphExec_st;
  x->nodes = g->nodes;  // shared: the exec outlives the graph
  x->users = g->users;  // and so do the user objects the graph retains
  x->last.internal = true;
  g_execs.insert(x);
  count("live_graph_execs");
  *exec = x;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuGraphLaunch(CUgraphExec x, CUstream h) {
  API("cuGraphLaunch");
  if (!g_execs.count(x)) return ret("cuGraphLaunch", CUDA_ERROR_INVALID_HANDLE);
  CUresult err = CUDA_SUCCESS;
  CUstream_st* s = resolve_work(h, true, &err);
  if (!s) return ret("cuGraphLaunch", err);
  if (s->cap) {  // a child graph node: the exec's nodes, run at each launch of the parent
    auto n = std::make_shared<Node>();
    n->issue = [nodes = x->nodes](CUstream_st* t) { launch_nodes(t, nodes); };
    n->ranges = ranges_of_nodes(x->nodes);
    n->what = "graph launch (child graph)";
    add_node(s, std::move(n));
    return CUDA_SUCCESS;
  }
  wait_event(s, &x->last);  // after the exec's previous launch, on whatever stream
  launch_nodes(s, x->nodes);
  record(&x->last, s);
  count("graph_launches");
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuGraphExecDestroy(CUgraphExec x) {
  API("cuGraphExecDestroy");
  if (!g_execs.erase(x)) return ret("cuGraphExecDestroy", CUDA_ERROR_INVALID_HANDLE);
  delete x;  // launched work holds what it needs (the nodes' closures were copied)
  count("live_graph_execs", -1);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuGraphDestroy(CUgraph g) {
  API("cuGraphDestroy");
  if (!g_graphs.erase(g)) return ret("cuGraphDestroy", CUDA_ERROR_INVALID_HANDLE);
  delete g;
  count("live_graphs", -1);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuUserObjectCreate(CUuserObject* out, void* ptr, CUhostFn destroy,
                                        unsigned int refs, unsigned int flags) {
  API("cuUserObjectCreate");
  if (!out || !destroy || refs == 0 || flags != CU_USER_OBJECT_NO_DESTRUCTOR_SYNC)
    return ret("cuUserObjectCreate", CUDA_ERROR_INVALID_VALUE);  // (the only flag there is)
  auto* o = new CUuserObject_st{ptr, destroy, refs};
  g_user_objects.insert(o);
  count("live_user_objects");
  *out = o;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuUserObjectRetain(CUuserObject o, unsigned int n) {
  API("cuUserObjectRetain");
  if (!g_user_objects.count(o) || n == 0) return ret("cuUserObjectRetain", CUDA_ERROR_INVALID_VALUE);
  o->refs += n;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuUserObjectRelease(CUuserObject o, unsigned int n) {
  API("cuUserObjectRelease");
  if (!g_user_objects.count(o) || n == 0 || n > o->refs)
    return ret("cuUserObjectRelease", CUDA_ERROR_INVALID_VALUE);
  release_user_object(o, n);
  return CUDA_SUCCESS;
}

// A graph (or the graph of an active capture, from cuStreamGetCaptureInfo) takes `n`
// references of `o`: the caller's own with CU_GRAPH_USER_OBJECT_MOVE, else new ones.
FAKE_EXPORT CUresult cuGraphRetainUserObject(CUgraph g, CUuserObject o, unsigned int n,
                                             unsigned int flags) {
  API("cuGraphRetainUserObject");
  bool capturing = false;
  for (const auto& c : g_captures) capturing = capturing || (c->graph == g && g);
  if ((!g_graphs.count(g) && !capturing) || !g_user_objects.count(o) || n == 0 ||
      (flags & ~static_cast<unsigned>(CU_GRAPH_USER_OBJECT_MOVE)))
    return ret("cuGraphRetainUserObject", CUDA_ERROR_INVALID_VALUE);
  if (!(flags & CU_GRAPH_USER_OBJECT_MOVE)) o->refs += n;
  else if (n > o->refs) return ret("cuGraphRetainUserObject", CUDA_ERROR_INVALID_VALUE);
  g->users->held.emplace_back(o, n);
  return CUDA_SUCCESS;
}

// fn(userData) once the stream gets there, on the fake's host-function thread; in a
// capture, a host node (run at each launch).
FAKE_EXPORT CUresult cuLaunchHostFunc(CUstream h, CUhostFn fn, void* data) {
  API("cuLaunchHostFunc");
  if (!fn) return ret("cuLaunchHostFunc", CUDA_ERROR_INVALID_VALUE);
  CUresult err = CUDA_SUCCESS;
  CUstream_st* s = resolve_work(h, true, &err);
  if (!s) return ret("cuLaunchHostFunc", err);
  if (s->cap) {
    auto n = std::make_shared<Node>();
    n->issue = [fn, data](CUstream_st* t) { enqueue_host_call(t, fn, data); };
    n->what = "host function";
    add_node(s, std::move(n));
    return CUDA_SUCCESS;
  }
  enqueue_host_call(s, fn, data);
  return CUDA_SUCCESS;
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
// once (handles to them become invalid; memory is freed, and no longer counted as used;
// reservations stay until their library gives them back: a reset under a live NCCL
// communicator is undefined with the real driver). As the real call requires,
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
  CUstream_st* s = resolve_work(h, false, &err);
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
  CUstream_st* s = resolve_work(h, false, &err);
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

namespace {
// Work that owns a one-shot argument cannot be a graph node (each launch runs every node):
// a fake user's bug (fake_cuda_capture_node is for that), said, and the capture invalidated.
int one_shot_in_capture(CUstream_st* s, const char* api) {
  fprintf(stderr, "fake_cuda: %s on a capturing stream: one-shot work cannot be captured "
                  "(use fake_cuda_capture_node)\n", api);
  invalidate(s->cap.get(), std::string(api) + " (one-shot work)");
  return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}
}  // namespace

// Device memory a library takes for itself (the fake NCCL's communicators), with no
// mapping: counted as used like an allocation, and refused like one when it does not fit.
FAKE_EXPORT int fake_cuda_device_reserve(int device, unsigned long long bytes) {
  LOCK();
  if (device < 0 || device >= g_devices) return CUDA_ERROR_INVALID_DEVICE;
  if (!device_memory_fits(device, bytes)) return CUDA_ERROR_OUT_OF_MEMORY;
  g_mem_reserved[device] += bytes;
  charge_device_memory(device, static_cast<long long>(bytes));
  return CUDA_SUCCESS;
}

// Gives reserved memory back; more than the device has reserved is the caller's bug
// (said, counted under "errors", and only what was reserved given back).
FAKE_EXPORT void fake_cuda_device_unreserve(int device, unsigned long long bytes) {
  LOCK();
  if (device < 0 || device >= g_devices || bytes > g_mem_reserved[device]) {
    fprintf(stderr, "fake_cuda: fake_cuda_device_unreserve(%d, %llu): more than was reserved\n",
            device, bytes);
    count("errors");
    if (device < 0 || device >= g_devices) return;
    bytes = g_mem_reserved[device];
  }
  g_mem_reserved[device] -= bytes;
  charge_device_memory(device, -static_cast<long long>(bytes));
}

FAKE_EXPORT int fake_cuda_capture_node(CUstream h, int check_ctx, int* captured,
                                       void (*issue)(void*, CUstream), void (*release)(void*),
                                       void* arg, const fake_cuda_range* ranges, int nranges,
                                       const char* what) {
  LOCK();
  if (!captured || !issue || !release) return CUDA_ERROR_INVALID_VALUE;
  *captured = 0;
  CUresult err = CUDA_SUCCESS;
  CUstream_st* s = resolve_work(h, check_ctx != 0, &err);
  if (!s) return err;
  if (!s->cap) return CUDA_SUCCESS;
  auto n = std::make_shared<Node>();
  n->issue = [issue, arg](CUstream_st* t) { issue(arg, handle_of(t)); };
  n->release = [release, arg] { release(arg); };
  n->ranges = ranges_of(ranges, nranges);
  n->what = what ? what : "fake node";
  add_node(s, std::move(n));
  *captured = 1;
  return CUDA_SUCCESS;
}

FAKE_EXPORT int fake_cuda_enqueue(CUstream h, int check_ctx, void (*fn)(void*), void* arg,
                                  const fake_cuda_range* ranges, int nranges, const char* what) {
  LOCK();
  CUresult err = CUDA_SUCCESS;
  CUstream_st* s = resolve_work(h, check_ctx != 0, &err);
  if (!s) return err;
  if (s->cap) return one_shot_in_capture(s, "fake_cuda_enqueue");
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
  CUstream_st* s = resolve_work(h, check_ctx != 0, &err);
  if (!s) return err;
  if (!launch || !done || !finish) return CUDA_ERROR_INVALID_VALUE;
  if (s->cap) return one_shot_in_capture(s, "fake_cuda_enqueue_async");
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
  CUstream_st* s = resolve_work(h, check_ctx != 0, &err);
  if (!s) return err;
  return record(e, s);
}

FAKE_EXPORT int fake_cuda_stream_wait(CUstream h, CUevent e, int check_ctx) {
  LOCK();
  if (!g_events.count(e)) return CUDA_ERROR_INVALID_HANDLE;
  CUresult err = CUDA_SUCCESS;
  CUstream_st* s = resolve_work(h, check_ctx != 0, &err);
  if (!s) return err;
  return wait_event(s, e);
}

FAKE_EXPORT int fake_cuda_event_sync(CUevent e) {
  LOCK();
  if (!g_events.count(e)) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult r = capture_forbids_event(e, "fake_cuda_event_sync"); r != CUDA_SUCCESS) return r;
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
