// A fake NCCL for tests without a GPU: the entry points streamcoll looks up
// (algorithms/nccl_lib.hpp, STREAMCOLL_NCCL_ENTRY_POINTS) with nccl.h's signatures, plus
// the fake_nccl_* counters of fake_api.h. It runs on the fake CUDA driver (fake_cuda.cpp,
// libcuda.so.1, found with dlopen) and cannot work with a real one.
//
// The ranks of one communicator are processes on one host. ncclGetUniqueId makes a random
// name; ncclCommInitRank opens the POSIX shared memory segment /fakenccl-<name>: a control
// block (a sense-reversing barrier on std::atomic, spinning with sched_yield, for the
// worker below; another for the host threads, with an exchange area, for ncclCommSplit)
// and one slot per rank (FAKE_NCCL_SLOT_BYTES of data each, default 64 MiB, sparse; pages
// of large operations are given back after them). Init is collective (every rank maps the
// segment, then a barrier); rank 0 then unlinks the name, so nothing is left in /dev/shm
// even if a process dies later. The segment is a file in FAKE_NCCL_SEGMENT_DIR instead
// when that is set, or in $TMPDIR or /tmp when there is no /dev/shm.
//
// ncclCommSplit is collective over every rank of the parent, on the host threads, which
// may call it while the parent's worker runs operations: each rank writes its color and
// key into the parent's exchange area, a host barrier, each reads its group (the ranks of
// its color, ordered by key, then by rank in the parent), a second host barrier (the area
// is free for the next split). Color NCCL_SPLIT_NOCOLOR gives *newcomm = NULL; another
// negative color, a config not made with NCCL_CONFIG_INITIALIZER (magic 0xcafebeef), an
// aborted parent or no current CUDA context fail on that rank before the collective part
// (the others then wait for it, as with NCCL, until FAKE_NCCL_TIMEOUT_S). Each group's
// child is made as ncclCommInitRank makes a communicator, on the parent's device, with a
// segment named after the parent's, the split's number on the parent and the color. Of
// the config only splitShare is read: 1 shares the parent's resources (below), 0 or
// unset does not; a null config takes the parent's (ncclCommInitRank's: not shared).
// ncclCommCount and ncclCommUserRank answer for any communicator.
//
// Resources, modelled on NCCL 2.28's: a communicator with resources of its own
// (ncclCommInitRank, a split without splitShare) takes device memory from the fake CUDA
// (fake_cuda_device_reserve on its device, counted against the device's total as
// allocations are; cuMemGetInfo shows it), after the init handshake, as NCCL allocates
// its buffers late in init; a split with splitShare=1 takes none and holds its parent's.
// The memory is given back (fake_cuda_device_unreserve) once the last communicator holding
// it is destroyed or aborted. Size: FAKE_NCCL_COMM_BYTES=<bytes>[K|M|G|T] (powers of
// 1024) if set, else a base of 512 MiB (the 536870912 bytes of the one-rank
// communicator's "Failed to CUDA calloc 536870912 bytes" in NVIDIA/nccl issue #2363, NCCL
// 2.28) plus, per channel (FAKE_NCCL_CHANNELS, default 16) and per ring peer
// (min(nranks - 1, 2)), one connection's buffers with NCCL's defaults: SIMPLE's
// NCCL_BUFFSIZE of 4 MiB, LL128's 120 elements x 640 threads x 8 steps x 8 bytes
// (4,915,200) and LL's 8 lines x 512 threads x 8 steps x 16 bytes (524,288): 9,633,792
// bytes. So 536,870,912 bytes at 1 rank, 691,011,584 at 2, 845,152,256 from 3 on. A rank
// whose device cannot take it fails that init or split with ncclUnhandledCudaError,
// ncclGetLastError saying "Failed to CUDA calloc <n> bytes" (counted under
// "init_failures"), its segment and all else of it released; the other ranks succeed.
// Gauges: "own_resource_comms" and "shared_comms" (live communicators of each kind in this
// process), "resource_bytes" (reserved now).
//
// Execution, as on a GPU, where a kernel once launched runs by itself: each communicator
// has a worker thread (its "GPU", started at its first operation's launch, joined by
// ncclCommDestroy and ncclCommAbort), and an operation is async work on the caller's
// stream of the fake CUDA (fake_cuda_enqueue_async), three pieces:
//  1. launch, when the stream gets to it (at once, or with FAKE_CUDA_DEFER=1 when
//     something waits for the stream: a query, a synchronize, a stream waiting on an
//     event after it): hands the operation to the worker and returns, never blocking;
//  2. a wait until the worker has run it: the stream is "stuck" meanwhile, as behind a
//     host wait, so cuEventQuery/cuStreamQuery answer CUDA_ERROR_NOT_READY and never
//     block, and cuStreamSynchronize/cuEventSynchronize poll, letting go of the fake's
//     lock;
//  3. the end: the operation's buffers are declared (read, written) on this piece, so the
//     fake's race check sees the accesses where they complete.
// A host thread therefore never blocks in another rank's operation: a rank may poll an
// NCCL operation's event while serving MPI for a rank that joins the operation later.
// The worker runs an operation so: it copies its input into its slot with the
// operation's signature, barrier, checks that all ranks run the same operation, computes
// its output from the slots, barrier; then marks it done (a release store that the
// wait's acquire load sees). Operations of one communicator run in issue order across
// streams, as NCCL orders them: each one's launch waits, through an event, for the end
// of the one issued before it. Reductions: sum, prod, min, max on int8, uint8,
// int32, uint32, int64, uint64, float32, float64 (float16, bfloat16 and fp8 give
// ncclInvalidArgument). Send/recv, as in NCCL, are matched per pair of ranks in issue
// order (the k-th send from a to b with the k-th receive at b from a), whatever groups
// they are in on either side: the sends and receives of one ncclGroupStart/End (or a
// lone one) are one operation, which posts its sends (into the rank's slot, announced in
// a ring of kRing messages per peer) and takes its receives in any order as the peers'
// messages arrive, and ends when all its receives are in and all its sends taken. So a
// rank may take part in a peer's exchange in a later group, leave a round out, or run
// rounds the others do not, and only a cycle of waits (as with NCCL) hangs. A receive of
// another size than the matching send is a mismatch. Collectives inside a group run as
// if outside it.
//
// Checks, like real NCCL's argument checks (ncclInvalidArgument, with ncclGetLastError
// saying why): buffers must be fake device memory; buffers may overlap only in NCCL's
// in-place forms (sendbuff == recvbuff for allreduce, broadcast, reduce;
// sendbuff == recvbuff + rank * sendcount for allgather; recvbuff == sendbuff + rank *
// recvcount for reduce-scatter); send and receive buffers of one group must not overlap;
// ncclCommInitRank needs a current CUDA context; ranks running different operations
// ("mismatches") make the communicator report ncclInvalidUsage as its asynchronous error.
//
// Knobs: FAKE_NCCL_ASYNC_ERROR_AFTER=N: ncclCommGetAsyncError reports ncclRemoteError on
// a communicator once N operations have been issued on it. FAKE_NCCL_FAIL_INIT=K (K >= 1):
// ncclCommInitRank fails on rank K-1 after the handshake (the others succeed; the segment
// is gone for the failed rank only, as when a rank fails late in init);
// FAKE_NCCL_FAIL_INIT=all: it fails on every rank, before the handshake (ncclCommSplit is
// left alone: a failing split comes from device memory, FAKE_CUDA_MEM_TOTAL).
// FAKE_NCCL_COMM_BYTES, FAKE_NCCL_CHANNELS: a communicator's device memory (Resources).
// FAKE_NCCL_SPLIT_IGNORE_KEY=1: ncclCommSplit ranks a group in the parent's order,
// ignoring the keys (a faulty split, for testing the caller's check of the child).
// FAKE_NCCL_TIMEOUT_S (default 120): a worker waiting longer in a barrier (the other
// ranks never launched the matching operation) aborts the process, with a message.
//
// FAKE_NCCL_FAIL=<entry point>:N[,...] (FAKE_NCCL_FAIL_RANK: on that local rank only) or
// fake_nccl_fail_after(api, n) at run time: that call of ncclAllReduce, ncclReduce,
// ncclBroadcast, ncclAllGather, ncclReduceScatter, ncclSend, ncclRecv or ncclGroupEnd
// fails with ncclUnhandledCudaError and issues nothing (a group whose ncclGroupEnd fails
// is dropped), as a rank whose NCCL call fails never joins the operation.
//
// Threads: ncclCommGetAsyncError and ncclCommAbort may come from any thread (streamcoll's
// watchdog); an abort makes this rank's pending and running operations of the
// communicator end at once (a barrier in progress is left), without their results: it
// joins the worker, after which nothing touches the buffers, and the operations' stream
// work completes (also that of operations launched later, which end at once). As with
// real NCCL over shared memory or NVLink, the other ranks do not notice: their
// operations keep waiting for this rank (until they abort too, or FAKE_NCCL_TIMEOUT_S).
// Groups are per thread.
//
// Stream capture (CUDA graphs): an operation issued on a capturing stream is a graph node
// (fake_cuda_capture_node), not issued; each launch of a graph holding it issues it again
// at cuGraphLaunch, on the launch stream, as a live call would: after the communicator's
// previous operation, matched with the peers' operations in the order they reach the
// communicator (a rank may replay while its peers call live). Groups captured too. A
// launch after ncclCommDestroy/ncclCommAbort of the communicator aborts the process with
// a message (undefined behaviour with real NCCL).
//
// The worker blocks asynchronous signals (they stay with the program's threads) and calls
// nothing in the fake CUDA.
#include <dlfcn.h>
#include <fcntl.h>
#include <nccl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "fake_api.h"
#include "fake_env.hpp"

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

constexpr int kMaxRanks = 128;
constexpr size_t kControlBytes = 4096;
constexpr size_t kHeaderBytes = 64 * 1024;
constexpr uint64_t kRing = 24;  // messages in flight from one rank to one peer
const char kIdMagic[] = "fakenccl:";

// ncclCommSplit's exchange: a rank's color and key.
struct SplitEntry {
  std::atomic<int32_t> color;
  std::atomic<int32_t> key;
};

struct Control {
  std::atomic<uint32_t> nranks;
  std::atomic<uint32_t> joined;
  std::atomic<uint32_t> arrived;  // the worker's barrier (operations)
  std::atomic<uint32_t> sense;
  std::atomic<uint32_t> unused;  // (was: a job-wide abort flag; aborts are per rank)
  // The host's barrier (ncclCommSplit, on the host thread while the worker may be in its
  // own barrier), and what it exchanges.
  std::atomic<uint32_t> host_arrived;
  std::atomic<uint32_t> host_sense;
  SplitEntry split[kMaxRanks];
};
static_assert(sizeof(Control) <= kControlBytes, "control block");
static_assert(std::atomic<uint32_t>::is_always_lock_free, "process-shared atomics");
static_assert(std::atomic<uint64_t>::is_always_lock_free, "process-shared atomics");

enum Kind : uint32_t { k_allreduce = 1, k_reduce, k_broadcast, k_allgather, k_reducescatter, k_sendrecv };
const char* kind_name(uint32_t k) {
  static const char* const names[] = {"?", "AllReduce", "Reduce", "Broadcast", "AllGather",
                                      "ReduceScatter", "SendRecv"};
  return k <= k_sendrecv ? names[k] : "?";
}

struct Signature {
  uint64_t seq;
  uint32_t kind, dtype, op;
  int32_t root;
  uint64_t count;
};

// A point-to-point message: its bytes at `off` of the sender's slot.
struct Msg {
  uint64_t off, bytes;
};

struct SlotHeader {
  Signature sig;
  // Point-to-point, written by this rank only: messages posted to each peer (the k-th
  // one in ring[peer][k % kRing], published by the release store of posted), and
  // messages taken from each peer (released once their bytes are copied out).
  std::atomic<uint64_t> posted[kMaxRanks];
  std::atomic<uint64_t> taken[kMaxRanks];
  Msg ring[kMaxRanks][kRing];
};
static_assert(sizeof(SlotHeader) <= kHeaderBytes, "slot header");

// ---- the fake CUDA's helpers ----------------------------------------------------------

struct Cuda {
  bool ok = false;
  fake_cuda_enqueue_async_fn enqueue_async = nullptr;
  fake_cuda_event_new_fn event_new = nullptr;
  fake_cuda_event_record_fn event_record = nullptr;
  fake_cuda_stream_wait_fn stream_wait = nullptr;
  fake_cuda_event_sync_fn event_sync = nullptr;
  fake_cuda_event_delete_fn event_delete = nullptr;
  fake_cuda_is_device_fn is_device = nullptr;
  fake_cuda_current_device_fn current_device = nullptr;
  fake_cuda_capture_node_fn capture_node = nullptr;
  fake_cuda_device_reserve_fn device_reserve = nullptr;
  fake_cuda_device_unreserve_fn device_unreserve = nullptr;
};

const Cuda& cuda() {
  static const Cuda c = [] {
    Cuda c;
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) return c;
    bool all = true;
    auto get = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
      all = all && fn != nullptr;
    };
    get(c.enqueue_async, "fake_cuda_enqueue_async");
    get(c.event_new, "fake_cuda_event_new");
    get(c.event_record, "fake_cuda_event_record");
    get(c.stream_wait, "fake_cuda_stream_wait");
    get(c.event_sync, "fake_cuda_event_sync");
    get(c.event_delete, "fake_cuda_event_delete");
    get(c.is_device, "fake_cuda_is_device");
    get(c.current_device, "fake_cuda_current_device");
    get(c.capture_node, "fake_cuda_capture_node");
    get(c.device_reserve, "fake_cuda_device_reserve");
    get(c.device_unreserve, "fake_cuda_device_unreserve");
    c.ok = all;
    return c;
  }();
  return c;
}

// ---- counters and errors -----------------------------------------------------------------

// Counters only. Never destroyed: a worker may still count while the process exits.
std::mutex& g_mu = *new std::mutex;
std::map<std::string, unsigned long long>& g_counters = *new std::map<std::string, unsigned long long>;
std::atomic<unsigned long long> g_calls{0};
thread_local std::string t_last_error;

void tally(const char* name) {
  std::lock_guard<std::mutex> lock(g_mu);
  ++g_counters[name];
}

// A gauge, counted up and down (live communicators, reserved bytes).
void gauge(const char* name, long long delta) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_counters[name] += static_cast<unsigned long long>(delta);
}

// FAKE_NCCL_FAIL / fake_nccl_fail_after: entry point -> the number of its call that fails.
std::map<std::string, unsigned long long>& g_fail = *new std::map<std::string, unsigned long long>;
const char* const kInjectable[] = {"ncclAllReduce", "ncclReduce", "ncclBroadcast",
                                   "ncclAllGather", "ncclReduceScatter", "ncclSend",
                                   "ncclRecv", "ncclGroupEnd"};
bool injectable(const std::string& api) {
  for (const char* a : kInjectable)
    if (api == a) return true;
  return false;
}

void read_fail_env() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* f = getenv("FAKE_NCCL_FAIL");
    if (!f || !*f) return;
    const char* rk = getenv("FAKE_NCCL_FAIL_RANK");
    const char* lr = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    if (!lr) lr = getenv("MPI_LOCALRANKID");
    if (rk && (!lr || atoi(rk) != atoi(lr))) return;
    std::string list = f;
    std::lock_guard<std::mutex> lock(g_mu);
    for (size_t at = 0; at < list.size();) {
      size_t end = list.find(',', at);
      if (end == std::string::npos) end = list.size();
      const std::string item = list.substr(at, end - at);
      const size_t colon = item.find(':');
      if (colon == std::string::npos || !injectable(item.substr(0, colon))) {
        fprintf(stderr, "fake NCCL: FAKE_NCCL_FAIL: '%s' is not <entry point>:<n> with an "
                        "entry point that can fail\n", item.c_str());
        abort();
      }
      g_fail[item.substr(0, colon)] = strtoull(item.c_str() + colon + 1, nullptr, 10);
      at = end + 1;
    }
  });
}

// Whether this call of `api` (already tallied) is the one to fail.
bool injected(const char* api) {
  read_fail_env();
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_fail.empty()) return false;
  auto it = g_fail.find(api);
  if (it == g_fail.end() || g_counters[api] != it->second) return false;
  g_fail.erase(it);
  ++g_counters["injected_failures"];
  fprintf(stderr, "fake NCCL: injected failure: call %llu of %s fails\n",
          g_counters[api], api);
  return true;
}

ncclResult_t fail(ncclResult_t r, const std::string& why) {
  t_last_error = "fake NCCL: " + why;
  tally("errors");
  if (const char* v = getenv("FAKE_NCCL_VERBOSE"); v && strcmp(v, "1") == 0)
    fprintf(stderr, "%s\n", t_last_error.c_str());
  return r;
}

double now_s() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

size_t env_size(const char* name, size_t def) {
  const char* v = getenv(name);
  return v && *v ? static_cast<size_t>(strtoull(v, nullptr, 10)) : def;
}

// One pass of a worker's wait for its peers (a barrier, a send/recv group): yields, then
// after 16384 passes sleeps 50 us (a rank that has not launched its part: let others
// run); every 1024 passes, past FAKE_NCCL_TIMEOUT_S (default 120), prints `why()` and
// aborts the process.
template <class Why>
void wait_pass(unsigned pass, double start, Why why) {
  static const double timeout = static_cast<double>(env_size("FAKE_NCCL_TIMEOUT_S", 120));
  if (pass < 16384) {
    sched_yield();
  } else {
    const timespec ts{0, 50 * 1000};
    nanosleep(&ts, nullptr);
  }
  if (pass % 1024 == 0 && now_s() - start > timeout) {
    fprintf(stderr, "fake NCCL: %s (waited %.0f s). Aborting.\n", why().c_str(), timeout);
    abort();
  }
}

// ---- the communicator ------------------------------------------------------------------

struct Op;

// What the operations share with the handle (the handle may be destroyed first).
struct Shared {
  int rank = 0, nranks = 1;
  char* base = nullptr;
  size_t map_bytes = 0, slot_bytes = 0;
  uint32_t local_sense = 0;  // the init barrier's thread, then the worker's
  uint64_t executed = 0;     // the worker's: collectives run (their sequence numbers)
  std::atomic<bool> aborted{false};
  std::atomic<bool> destroyed{false};  // the handle is gone (ncclCommDestroy/ncclCommAbort)
  std::atomic<int> async_error{ncclSuccess};

  // The worker (the communicator's "GPU"): runs the launched operations in launch order.
  // Started at the first launch, stopped and joined by ncclCommDestroy/ncclCommAbort.
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Op*> queue;  // launched, not yet taken by the worker
  std::thread worker;
  bool stopping = false;  // no more launches: the worker ends once the queue is empty

  ~Shared() {
    if (worker.joinable()) worker.detach();  // not reached: destroy and abort join it
    if (base) munmap(base, map_bytes);
  }
  Control* control() const { return reinterpret_cast<Control*>(base); }
  SlotHeader* header(int r) const {
    return reinterpret_cast<SlotHeader*>(base + kControlBytes + static_cast<size_t>(r) * (kHeaderBytes + slot_bytes));
  }
  char* data(int r) const { return reinterpret_cast<char*>(header(r)) + kHeaderBytes; }

  // The worker's barrier (and init's, before there is a worker). false if the
  // communicator was aborted meanwhile.
  bool barrier() {
    return sense_barrier(control()->arrived, control()->sense, local_sense,
                         "in a barrier; the other ranks never ran the matching operation");
  }
  // The host thread's (ncclCommSplit), apart from the worker's, which may be running.
  bool host_barrier() {
    return sense_barrier(control()->host_arrived, control()->host_sense, host_local_sense,
                         "in ncclCommSplit; the other ranks never called it");
  }

 private:
  uint32_t host_local_sense = 0;

  // A sense-reversing barrier of the nranks ranks on (arrived, sense).
  bool sense_barrier(std::atomic<uint32_t>& arrived, std::atomic<uint32_t>& sense, uint32_t& local,
                     const char* stuck) {
    local ^= 1u;
    if (arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint32_t>(nranks)) {
      arrived.store(0, std::memory_order_relaxed);
      sense.store(local, std::memory_order_release);
      return true;
    }
    const double start = now_s();
    for (unsigned i = 1; sense.load(std::memory_order_acquire) != local; ++i) {
      if (aborted.load(std::memory_order_acquire)) return false;
      wait_pass(i, start, [&] {
        return "rank " + std::to_string(rank) + " of " + std::to_string(nranks) + " " + stuck;
      });
    }
    return true;
  }
};

}  // namespace

namespace {
// Device memory a communicator took from the fake CUDA (fake_cuda_device_reserve): its
// own, or, under splitShare, its parent's; given back once the last communicator holding
// it is destroyed or aborted.
struct Resources {
  int device = 0;
  unsigned long long bytes = 0;
  Resources(int d, unsigned long long b) : device(d), bytes(b) {}
  Resources(const Resources&) = delete;
  Resources& operator=(const Resources&) = delete;
  ~Resources();
};
}  // namespace

struct ncclComm {
  std::shared_ptr<Shared> sh;
  CUevent_st* last = nullptr;  // recorded after the latest operation (cudaEvent_t)
  std::atomic<uint64_t> issued{0};  // read by ncclCommGetAsyncError from any thread
  int device = -1;
  std::string name;             // its segment's, unique: the children's derive from it
  uint64_t splits = 0;          // ncclCommSplit calls on it (the children's names)
  bool split_share = false;     // made sharing its parent's resources (the children inherit it)
  std::shared_ptr<Resources> res;
};

namespace {

size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
  }
}

bool reducible(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: case ncclInt32: case ncclUint32: case ncclInt64:
    case ncclUint64: case ncclFloat32: case ncclFloat64: return true;
    default: return false;
  }
}

template <class T>
T combine(T a, T b, ncclRedOp_t op) {
  switch (op) {
    case ncclSum: return static_cast<T>(a + b);
    case ncclProd: return static_cast<T>(a * b);
    case ncclMin: return b < a ? b : a;
    case ncclMax: return a < b ? b : a;
    default: return a;
  }
}

// out[i] = op over ranks of in_r[offset + i].
template <class T>
void reduce_typed(void* out, const Shared& sh, size_t offset, size_t count, ncclRedOp_t op) {
  T* o = static_cast<T*>(out);
  const T* first = reinterpret_cast<const T*>(sh.data(0)) + offset;
  for (size_t i = 0; i < count; ++i) o[i] = first[i];
  for (int r = 1; r < sh.nranks; ++r) {
    const T* in = reinterpret_cast<const T*>(sh.data(r)) + offset;
    for (size_t i = 0; i < count; ++i) o[i] = combine(o[i], in[i], op);
  }
}

void reduce_slots(void* out, const Shared& sh, size_t offset, size_t count, ncclDataType_t t,
                  ncclRedOp_t op) {
  switch (t) {
    case ncclInt8: reduce_typed<int8_t>(out, sh, offset, count, op); break;
    case ncclUint8: reduce_typed<uint8_t>(out, sh, offset, count, op); break;
    case ncclInt32: reduce_typed<int32_t>(out, sh, offset, count, op); break;
    case ncclUint32: reduce_typed<uint32_t>(out, sh, offset, count, op); break;
    case ncclInt64: reduce_typed<int64_t>(out, sh, offset, count, op); break;
    case ncclUint64: reduce_typed<uint64_t>(out, sh, offset, count, op); break;
    case ncclFloat32: reduce_typed<float>(out, sh, offset, count, op); break;
    case ncclFloat64: reduce_typed<double>(out, sh, offset, count, op); break;
    default: break;  // refused at issue
  }
}

struct P2p {
  bool send;
  int peer;
  void* buf;
  size_t bytes;
};

// One operation, as issued. Owned by its stream work (fake_cuda_enqueue_async: freed by
// finish_op); the worker uses it between launch_op and setting `done`.
struct Op {
  std::shared_ptr<Shared> sh;
  std::atomic<int> done{0};  // set by the worker (release) when it has finished with it
  Signature sig{};
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;  // elements (sendrecv: unused)
  ncclDataType_t type = ncclInt8;
  ncclRedOp_t op = ncclSum;
  int root = 0;
  std::vector<P2p> p2p;
};

// Runs a send/recv group on the worker thread (file comment): posts the sends as room in
// the peers' rings allows, takes the receives as the peers' messages arrive, in any order
// across peers and in issue order per peer, until every receive is in and every send taken.
void run_p2p(Op* o) {
  Shared& sh = *o->sh;
  const int me = sh.rank;
  SlotHeader* mine = sh.header(me);
  char* slot = sh.data(me);
  struct Send {
    const P2p* x;
    uint64_t off;
    uint64_t index = 0;  // its number among the messages to its peer, once posted
    bool posted = false;
  };
  std::vector<Send> sends;
  std::vector<const P2p*> recvs;
  uint64_t staged = 0;
  for (const P2p& x : o->p2p) {
    if (x.send) {
      sends.push_back({&x, staged});
      staged += x.bytes;
    } else {
      recvs.push_back(&x);
    }
  }
  std::vector<bool> received(recvs.size(), false);
  size_t left_sends = sends.size(), left_recvs = recvs.size();
  const double start = now_s();
  for (unsigned spin = 1;; ++spin) {
    if (sh.aborted.load(std::memory_order_acquire)) return;
    bool moved = false;
    for (Send& x : sends) {  // post what the rings have room for, in issue order per peer
      if (x.posted) continue;
      const int p = x.x->peer;
      const uint64_t k = mine->posted[p].load(std::memory_order_relaxed);
      if (k - sh.header(p)->taken[me].load(std::memory_order_acquire) >= kRing) continue;
      bool earlier_waits = false;  // an earlier send to p of this group not yet posted
      for (const Send& y : sends) {
        if (&y == &x) break;
        earlier_waits = earlier_waits || (!y.posted && y.x->peer == p);
      }
      if (earlier_waits) continue;
      memcpy(slot + x.off, x.x->buf, x.x->bytes);
      mine->ring[p][k % kRing] = {x.off, x.x->bytes};
      mine->posted[p].store(k + 1, std::memory_order_release);
      x.index = k;
      x.posted = moved = true;
    }
    for (size_t i = 0; i < recvs.size(); ++i) {  // take what has arrived, per peer in order
      if (received[i]) continue;
      const P2p& x = *recvs[i];
      bool earlier_waits = false;
      for (size_t j = 0; j < i; ++j) earlier_waits = earlier_waits || (!received[j] && recvs[j]->peer == x.peer);
      if (earlier_waits) continue;
      const SlotHeader* from = sh.header(x.peer);
      const uint64_t k = mine->taken[x.peer].load(std::memory_order_relaxed);
      if (from->posted[me].load(std::memory_order_acquire) <= k) continue;
      const Msg m = from->ring[me][k % kRing];
      if (m.bytes != x.bytes) {
        fprintf(stderr, "fake NCCL: rank %d receives %zu bytes from rank %d, which sent %llu\n",
                me, x.bytes, x.peer, static_cast<unsigned long long>(m.bytes));
        tally("mismatches");
        sh.async_error.store(ncclInvalidUsage);
      }
      memcpy(x.buf, sh.data(x.peer) + m.off, std::min<uint64_t>(m.bytes, x.bytes));
      mine->taken[x.peer].store(k + 1, std::memory_order_release);
      received[i] = moved = true;
      --left_recvs;
    }
    left_sends = 0;
    for (const Send& x : sends)
      if (!x.posted || sh.header(x.x->peer)->taken[me].load(std::memory_order_acquire) <= x.index)
        ++left_sends;
    if (left_sends == 0 && left_recvs == 0) break;
    if (moved) {
      spin = 0;
      continue;
    }
    wait_pass(spin, start, [&] {
      return "rank " + std::to_string(me) + " of " + std::to_string(sh.nranks) +
             " in a send/recv group (" + std::to_string(left_sends) + " sends not taken, " +
             std::to_string(left_recvs) + " receives not in); its peers never ran the "
             "matching sends or receives";
    });
  }
  // Give the slot's pages back after a large group (as after a large collective).
  if (staged > (size_t{1} << 20)) madvise(slot, (staged + 4095) / 4096 * 4096, MADV_REMOVE);
  tally("executed");
}

// Runs o on the worker thread: barriers with the other ranks' workers.
void run_op(Op* o) {
  Shared& sh = *o->sh;
  if (sh.aborted.load()) return;  // aborted: this rank's kernels end
  if (o->sig.kind == k_sendrecv) return run_p2p(o);
  const int me = sh.rank, n = sh.nranks;
  const size_t ts = type_size(o->type);
  o->sig.seq = ++sh.executed;
  SlotHeader* mine = sh.header(me);
  mine->sig = o->sig;
  char* slot = sh.data(me);
  size_t staged = 0;  // bytes of the slot written
  switch (o->sig.kind) {
    case k_allreduce: case k_reduce: case k_allgather:
      memcpy(slot, o->send, staged = o->count * ts);
      break;
    case k_broadcast:
      if (me == o->root) memcpy(slot, o->send, staged = o->count * ts);
      break;
    case k_reducescatter: memcpy(slot, o->send, staged = o->count * ts * n); break;
    case k_sendrecv: break;  // run_p2p
  }
  if (!sh.barrier()) return;
  for (int r = 0; r < n; ++r) {
    const Signature& s = sh.header(r)->sig;
    if (memcmp(&s, &o->sig, sizeof s) != 0) {
      fprintf(stderr, "fake NCCL: rank %d runs operation %llu as %s(count %llu, type %u, op %u, "
              "root %d) but rank %d as %s(count %llu, type %u, op %u, root %d)\n", me,
              static_cast<unsigned long long>(o->sig.seq), kind_name(o->sig.kind),
              static_cast<unsigned long long>(o->sig.count), o->sig.dtype, o->sig.op,
              o->sig.root, r, kind_name(s.kind), static_cast<unsigned long long>(s.count),
              s.dtype, s.op, s.root);
      tally("mismatches");
      sh.async_error.store(ncclInvalidUsage);
      sh.barrier();
      return;
    }
  }
  switch (o->sig.kind) {
    case k_allreduce: reduce_slots(o->recv, sh, 0, o->count, o->type, o->op); break;
    case k_reduce: if (me == o->root) reduce_slots(o->recv, sh, 0, o->count, o->type, o->op); break;
    case k_broadcast: memcpy(o->recv, sh.data(o->root), o->count * ts); break;
    case k_allgather:
      for (int r = 0; r < n; ++r)
        memcpy(static_cast<char*>(o->recv) + r * o->count * ts, sh.data(r), o->count * ts);
      break;
    case k_reducescatter: reduce_slots(o->recv, sh, me * o->count, o->count, o->type, o->op); break;
    case k_sendrecv: break;  // run_p2p
  }
  sh.barrier();
  // Give the slot's pages back after a large operation: /dev/shm may be small (64 MiB in
  // a default container), and a segment lives as long as its communicator.
  if (staged > (size_t{1} << 20))
    madvise(slot, (staged + 4095) / 4096 * 4096, MADV_REMOVE);
  tally("executed");
}

// The worker: takes launched operations in order and runs them. After `done` is set, the
// stream work owning the operation may free it at any moment: nothing touches it after.
void work(Shared* sh) {
  for (;;) {
    Op* o = nullptr;
    {
      std::unique_lock<std::mutex> lock(sh->mu);
      sh->cv.wait(lock, [&] { return !sh->queue.empty() || sh->stopping; });
      if (sh->queue.empty()) return;  // stopping, nothing left
      o = sh->queue.front();
      sh->queue.pop_front();
    }
    run_op(o);  // returns at once once the communicator is aborted
    o->done.store(1, std::memory_order_release);
  }
}

// The three pieces of an operation's stream work (fake_cuda_enqueue_async), run by the
// fake CUDA holding its lock: none blocks or calls the fake CUDA.
// 1. The stream reached the operation: hand it to the worker (started at the first one).
void launch_op(void* arg) {
  Op* o = static_cast<Op*>(arg);
  Shared& sh = *o->sh;
  std::lock_guard<std::mutex> lock(sh.mu);
  if (sh.stopping) {  // launched after ncclCommAbort: ends without running
    o->done.store(1, std::memory_order_release);
    return;
  }
  sh.queue.push_back(o);
  if (!sh.worker.joinable()) {
    // The worker takes no asynchronous signals (a test's SIGALRM watchdog, MPI's own):
    // they stay with the program's threads. It inherits the mask it starts with.
    sigset_t all, old;
    sigfillset(&all);
    for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTRAP}) sigdelset(&all, sig);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    sh.worker = std::thread(work, &sh);
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
  }
  sh.cv.notify_one();
}

// 2. Polled while the stream waits for the operation.
int op_done(void* arg) { return static_cast<Op*>(arg)->done.load(std::memory_order_acquire); }

// 3. The operation is over: its memory ranges are declared on this piece.
void finish_op(void* arg) { delete static_cast<Op*>(arg); }

// Ends the worker: launches from now on end at once; what was launched runs first (after
// an abort, each returns at once). Called by ncclCommDestroy/ncclCommAbort, never holding
// the fake CUDA's lock, so no operation's stream work waits for this thread meanwhile.
void stop_worker(Shared& sh) {
  {
    std::lock_guard<std::mutex> lock(sh.mu);
    sh.stopping = true;
  }
  sh.cv.notify_all();
  if (sh.worker.joinable()) sh.worker.join();
}

bool overlaps(const void* a, size_t na, const void* b, size_t nb) {
  auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return na && nb && x < y + nb && y < x + na;
}

ncclResult_t check_comm(ncclComm_t comm) {
  if (!comm) return fail(ncclInvalidArgument, "null communicator");
  if (comm->sh->aborted.load()) return fail(ncclInvalidUsage, "communicator was aborted");
  if (!cuda().ok) return fail(ncclSystemError, "libcuda.so.1 is not the fake CUDA driver");
  return ncclSuccess;
}

ncclResult_t check_device(const void* p, size_t bytes, const char* what) {
  if (bytes == 0) return ncclSuccess;
  if (!cuda().is_device(p, bytes))
    return fail(ncclInvalidArgument, std::string(what) + " is not device memory (fake CUDA)");
  return ncclSuccess;
}

// Issues o on stream s: after the communicator's previous operation, as NCCL orders them.
ncclResult_t issue_live(ncclComm_t comm, std::unique_ptr<Op> o, CUstream_st* s,
                        const std::vector<fake_cuda_range>& ranges) {
  const Cuda& c = cuda();
  if (comm->last && c.stream_wait(s, comm->last, 1) != 0)
    return fail(ncclUnhandledCudaError, "invalid stream (or no current context for stream 0)");
  const std::string what = std::string("nccl") + kind_name(o->sig.kind);
  // Counted as issued before it may run (launched at once, without deferral): an
  // asynchronous error due after it must be visible to another thread while it runs.
  ++comm->issued;
  ++g_calls;
  if (c.enqueue_async(s, 1, launch_op, op_done, finish_op, o.get(), ranges.data(),
                      static_cast<int>(ranges.size()), what.c_str()) != 0) {
    --comm->issued;
    --g_calls;
    return fail(ncclUnhandledCudaError, "invalid stream (or no current context for stream 0)");
  }
  o.release();  // the stream work owns it (finish_op)
  if (!comm->last) comm->last = c.event_new();
  c.event_record(comm->last, s, 1);
  return ncclSuccess;
}

// ---- stream capture: an operation as a CUDA graph node -----------------------------------
// On a capturing stream an operation is a node of the graph (fake_cuda_capture_node): each
// launch of the graph issues it again, at cuGraphLaunch, on the launch stream, as a live
// call would (after the communicator's previous operation; matched with the peers'
// operations in the order they reach the communicator, as NCCL orders by launch). A
// launch after ncclCommDestroy/ncclCommAbort of its communicator aborts the process.

struct Captured {
  ncclComm_t comm;              // valid while !sh->destroyed
  std::shared_ptr<Shared> sh;
  std::unique_ptr<Op> op;       // the template each launch copies
  std::vector<fake_cuda_range> ranges;
};

std::unique_ptr<Op> copy_op(const Op& t) {
  auto o = std::make_unique<Op>();
  o->sh = t.sh;
  o->sig = t.sig;
  o->send = t.send;
  o->recv = t.recv;
  o->count = t.count;
  o->type = t.type;
  o->op = t.op;
  o->root = t.root;
  o->p2p = t.p2p;
  return o;
}

// A graph launch reached the node (the fake CUDA's lock held, on the launching thread).
void replay_op(void* arg, CUstream_st* s) {
  auto* c = static_cast<Captured*>(arg);
  if (c->sh->destroyed.load()) {
    fprintf(stderr, "fake NCCL: a CUDA graph launch runs nccl%s captured on a communicator "
                    "(rank %d of %d) that was destroyed since (ncclCommDestroy/ncclCommAbort): "
                    "undefined behaviour with real NCCL. Aborting.\n",
            kind_name(c->op->sig.kind), c->sh->rank, c->sh->nranks);
    abort();
  }
  tally("replayed");
  if (issue_live(c->comm, copy_op(*c->op), s, c->ranges) != ncclSuccess) {
    fprintf(stderr, "fake NCCL: a CUDA graph launch could not issue nccl%s: %s. Aborting.\n",
            kind_name(c->op->sig.kind), t_last_error.c_str());
    abort();
  }
}

void release_captured(void* arg) { delete static_cast<Captured*>(arg); }

// Issues o on `stream`, or, when the stream is capturing, makes it a graph node.
ncclResult_t issue(ncclComm_t comm, std::unique_ptr<Op> o, cudaStream_t stream,
                   std::vector<fake_cuda_range> ranges) {
  auto* s = reinterpret_cast<CUstream_st*>(stream);
  const std::string what = std::string("nccl") + kind_name(o->sig.kind);
  auto* node = new Captured{comm, comm->sh, std::move(o), ranges};
  int captured = 0;
  if (cuda().capture_node(s, 1, &captured, replay_op, release_captured, node, ranges.data(),
                          static_cast<int>(ranges.size()), what.c_str()) != 0) {
    delete node;
    return fail(ncclUnhandledCudaError, "invalid stream, no current context for stream 0, or "
                                        "an invalidated stream capture");
  }
  if (captured) {  // the graph owns the node now (release_captured)
    tally("captured");
    return ncclSuccess;
  }
  o = std::move(node->op);
  delete node;
  return issue_live(comm, std::move(o), s, ranges);
}

std::unique_ptr<Op> make_op(ncclComm_t comm, uint32_t kind, size_t count, ncclDataType_t t,
                            ncclRedOp_t op, int root) {
  auto o = std::make_unique<Op>();
  o->sh = comm->sh;
  o->sig.kind = kind;
  o->sig.dtype = static_cast<uint32_t>(t);
  o->sig.op = static_cast<uint32_t>(op);
  o->sig.root = root;
  o->sig.count = count;
  o->count = count;
  o->type = t;
  o->op = op;
  o->root = root;
  return o;
}

ncclResult_t check_reduction(ncclDataType_t t, ncclRedOp_t op) {
  if (!reducible(t))
    return fail(ncclInvalidArgument, "datatype " + std::to_string(t) + " not reducible here");
  if (op != ncclSum && op != ncclProd && op != ncclMin && op != ncclMax)
    return fail(ncclInvalidArgument, "op " + std::to_string(op) + " not supported");
  return ncclSuccess;
}

ncclResult_t check_size(ncclComm_t comm, size_t bytes) {
  if (bytes > comm->sh->slot_bytes)
    return fail(ncclInvalidArgument, std::to_string(bytes) + " bytes exceed FAKE_NCCL_SLOT_BYTES");
  return ncclSuccess;
}

// The send/recv group of this thread.
struct Group {
  int depth = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  std::vector<P2p> p2p;
  ncclResult_t error = ncclSuccess;
};
thread_local Group t_group;

ncclResult_t p2p(bool send, void* buf, size_t count, ncclDataType_t t, int peer, ncclComm_t comm,
                 cudaStream_t stream) {
  tally(send ? "ncclSend" : "ncclRecv");
  if (ncclResult_t r = check_comm(comm); r != ncclSuccess) return r;
  if (injected(send ? "ncclSend" : "ncclRecv")) {
    if (t_group.depth > 0) t_group.error = ncclUnhandledCudaError;
    return fail(ncclUnhandledCudaError, send ? "injected failure of ncclSend"
                                             : "injected failure of ncclRecv");
  }
  if (peer < 0 || peer >= comm->sh->nranks) return fail(ncclInvalidArgument, "peer out of range");
  const size_t ts = type_size(t);
  if (!ts) return fail(ncclInvalidArgument, "bad datatype");
  if (ncclResult_t r = check_device(buf, count * ts, send ? "sendbuff" : "recvbuff"); r != ncclSuccess)
    return r;
  if (t_group.depth == 0) {
    // One operation on its own: a group of one.
    t_group.comm = comm;
    t_group.stream = stream;
    t_group.p2p = {{send, peer, buf, count * ts}};
    ++t_group.depth;
    return ncclGroupEnd();
  }
  if (t_group.comm && (t_group.comm != comm || t_group.stream != stream))
    return t_group.error = fail(ncclInvalidUsage, "one group on one communicator and stream only (fake)");
  t_group.comm = comm;
  t_group.stream = stream;
  t_group.p2p.push_back({send, peer, buf, count * ts});
  return ncclSuccess;
}

const char* error_string(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

// ---- communicators: their segment, their resources -----------------------------------------

using fake_env::parse_bytes;

// NCCL 2.28's device memory for one communicator of nranks (file comment, "Resources"):
// FAKE_NCCL_COMM_BYTES, or the base plus one ring connection's buffers per channel and
// ring peer.
unsigned long long comm_bytes(int nranks) {
  if (const char* v = getenv("FAKE_NCCL_COMM_BYTES"); v && *v) {
    unsigned long long n = 0;
    if (!parse_bytes(v, &n)) {
      fprintf(stderr, "fake NCCL: FAKE_NCCL_COMM_BYTES: '%s' is not <bytes>[K|M|G|T]\n", v);
      abort();
    }
    return n;
  }
  constexpr unsigned long long kBase = 512ull << 20;              // issue #2363's calloc
  constexpr unsigned long long kSimple = 4ull << 20;              // NCCL_BUFFSIZE
  constexpr unsigned long long kLl128 = 120ull * 640 * 8 * 8;     // 4,915,200
  constexpr unsigned long long kLl = 8ull * 512 * 8 * 16;         // 524,288
  static_assert(kSimple + kLl128 + kLl == 9633792, "one connection's buffers");
  const unsigned long long channels = env_size("FAKE_NCCL_CHANNELS", 16);
  const unsigned long long peers = static_cast<unsigned long long>(std::min(nranks - 1, 2));
  return kBase + channels * peers * (kSimple + kLl128 + kLl);
}

Resources::~Resources() {
  cuda().device_unreserve(device, bytes);
  gauge("resource_bytes", -static_cast<long long>(bytes));
}

// What a new communicator is made of: ncclCommInitRank's arguments, or a split's.
struct InitArgs {
  std::string name;  // unique: the segment is /fakenccl-<name>
  int nranks = 1, rank = 0, device = 0;
  const char* fail_init = nullptr;       // FAKE_NCCL_FAIL_INIT=K (ncclCommInitRank only)
  bool split_share = false;              // splitShare: it takes the parent's resources,
  std::shared_ptr<Resources> shared;     // these (null: its own)
};

// Opens (every rank creates it if need be) and maps the communicator's segment; *path and
// *in_shm say what rank 0 unlinks.
ncclResult_t map_segment(Shared& sh, const std::string& unique, std::string* path, bool* in_shm) {
  // POSIX shared memory; a file in FAKE_NCCL_SEGMENT_DIR if set, or where there is no
  // /dev/shm, in $TMPDIR or /tmp.
  std::string name = "/fakenccl-" + unique;
  const char* dir = getenv("FAKE_NCCL_SEGMENT_DIR");
  *in_shm = !(dir && *dir);
  int fd = *in_shm ? shm_open(name.c_str(), O_CREAT | O_RDWR, 0600) : -1;
  if (fd < 0) {
    if (!dir || !*dir) dir = getenv("TMPDIR");
    name = std::string(dir && *dir ? dir : "/tmp") + name;
    *in_shm = false;
    fd = open(name.c_str(), O_CREAT | O_RDWR, 0600);
  }
  if (fd < 0) return fail(ncclSystemError, "shm_open/open " + name + ": " + strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 ||
      (static_cast<size_t>(st.st_size) < sh.map_bytes &&
       ftruncate(fd, static_cast<off_t>(sh.map_bytes)) != 0)) {
    close(fd);
    return fail(ncclSystemError, "ftruncate " + name + ": " + strerror(errno));
  }
  void* base = mmap(nullptr, sh.map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) return fail(ncclSystemError, "mmap " + name + ": " + strerror(errno));
  sh.base = static_cast<char*>(base);
  *path = name;
  return ncclSuccess;
}

// The handshake: every rank has the segment mapped; then rank 0 unlinks its name.
ncclResult_t join_segment(Shared& sh, const std::string& path, bool in_shm) {
  Control* c = sh.control();
  uint32_t expect = 0;
  if (!c->nranks.compare_exchange_strong(expect, static_cast<uint32_t>(sh.nranks)) &&
      expect != static_cast<uint32_t>(sh.nranks))
    return fail(ncclInvalidUsage, "ranks disagree on nranks");
  c->joined.fetch_add(1);
  sh.barrier();
  if (sh.rank == 0) in_shm ? shm_unlink(path.c_str()) : unlink(path.c_str());
  return ncclSuccess;
}

// The communicator's device memory, taken after the handshake, as NCCL allocates its
// buffers late in init: a rank that cannot have it fails alone ("Failed to CUDA calloc",
// NCCL's words), the others succeed.
ncclResult_t take_resources(const InitArgs& a, std::shared_ptr<Resources>* out) {
  if (a.shared) {
    *out = a.shared;
    return ncclSuccess;
  }
  const unsigned long long bytes = comm_bytes(a.nranks);
  if (cuda().device_reserve(a.device, bytes) != 0) {
    tally("init_failures");
    return fail(ncclUnhandledCudaError, "Failed to CUDA calloc " + std::to_string(bytes) + " bytes");
  }
  gauge("resource_bytes", static_cast<long long>(bytes));
  *out = std::make_shared<Resources>(a.device, bytes);
  return ncclSuccess;
}

// The collective part of ncclCommInitRank and ncclCommSplit: maps the segment, the
// handshake, then this rank's resources. On failure nothing of it is left on this rank.
ncclResult_t init_comm(ncclComm_t* out, const InitArgs& a) {
  auto sh = std::make_shared<Shared>();
  sh->rank = a.rank;
  sh->nranks = a.nranks;
  sh->slot_bytes = (env_size("FAKE_NCCL_SLOT_BYTES", size_t{64} << 20) + 4095) / 4096 * 4096;
  sh->map_bytes = kControlBytes + static_cast<size_t>(a.nranks) * (kHeaderBytes + sh->slot_bytes);
  std::string path;
  bool in_shm = true;
  if (ncclResult_t r = map_segment(*sh, a.name, &path, &in_shm); r != ncclSuccess) return r;
  if (ncclResult_t r = join_segment(*sh, path, in_shm); r != ncclSuccess) return r;
  if (a.fail_init && atoi(a.fail_init) == a.rank + 1) {
    tally("init_failures");
    return fail(ncclSystemError, "FAKE_NCCL_FAIL_INIT=" + std::string(a.fail_init));
  }
  std::shared_ptr<Resources> res;
  if (ncclResult_t r = take_resources(a, &res); r != ncclSuccess) return r;
  auto* comm = new ncclComm;
  comm->sh = std::move(sh);
  comm->device = a.device;
  comm->name = a.name;
  comm->split_share = a.split_share;
  comm->res = std::move(res);
  gauge(a.split_share ? "shared_comms" : "own_resource_comms", 1);
  *out = comm;
  return ncclSuccess;
}

// The end of a communicator's handle (ncclCommDestroy, ncclCommAbort): its gauges, and its
// resources once no other communicator shares them.
void forget_comm(ncclComm_t comm) {
  gauge(comm->split_share ? "shared_comms" : "own_resource_comms", -1);
  delete comm;
}

// ---- ncclCommSplit ---------------------------------------------------------------------------

// The split's arguments checked on this rank (before the collective part, as NCCL's).
ncclResult_t check_split(ncclComm_t comm, int color, ncclComm_t* newcomm, const ncclConfig_t* config) {
  if (!newcomm) return fail(ncclInvalidArgument, "null newcomm");
  *newcomm = nullptr;
  if (ncclResult_t r = check_comm(comm); r != ncclSuccess) return r;
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
    return fail(ncclInvalidArgument, "color " + std::to_string(color) +
                                         " is neither non-negative nor NCCL_SPLIT_NOCOLOR");
  if (config && config->magic != 0xcafebeef)
    return fail(ncclInvalidArgument, "config not initialized with NCCL_CONFIG_INITIALIZER");
  if (cuda().current_device() < 0) return fail(ncclUnhandledCudaError, "no current CUDA context");
  return ncclSuccess;
}

// This rank's place in its color's group: ranks of the parent with its color, ordered by
// key, then by rank in the parent. Read from the exchange area after the host barrier.
// FAKE_NCCL_SPLIT_IGNORE_KEY=1: the keys are ignored (ranks in the parent's order), as a
// faulty NCCL might do, for testing the caller's check of the child's ranks.
void split_place(const Shared& sh, int color, int key, int* nranks, int* rank) {
  static const bool ignore_key = [] {
    const char* v = getenv("FAKE_NCCL_SPLIT_IGNORE_KEY");
    return v && strcmp(v, "1") == 0;
  }();
  std::vector<std::pair<int, int>> group;  // (key, parent rank)
  const Control* c = sh.control();
  if (ignore_key) key = 0;
  for (int r = 0; r < sh.nranks; ++r)
    if (c->split[r].color.load(std::memory_order_relaxed) == color)
      group.push_back({ignore_key ? 0 : c->split[r].key.load(std::memory_order_relaxed), r});
  std::sort(group.begin(), group.end());
  *nranks = static_cast<int>(group.size());
  *rank = static_cast<int>(std::find(group.begin(), group.end(), std::make_pair(key, sh.rank)) - group.begin());
}

}  // namespace

// ---- nccl.h ------------------------------------------------------------------------------

FAKE_EXPORT ncclResult_t ncclGetVersion(int* version) {
  tally("ncclGetVersion");
  if (!version) return fail(ncclInvalidArgument, "null version");
  *version = 22800;
  return ncclSuccess;
}

FAKE_EXPORT const char* ncclGetErrorString(ncclResult_t r) { return error_string(r); }

FAKE_EXPORT const char* ncclGetLastError(ncclComm_t) { return t_last_error.c_str(); }

FAKE_EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  tally("ncclGetUniqueId");
  if (!id) return fail(ncclInvalidArgument, "null id");
  unsigned char raw[8];
  FILE* f = fopen("/dev/urandom", "rb");
  if (!f || fread(raw, 1, sizeof raw, f) != sizeof raw) {
    if (f) fclose(f);
    return fail(ncclSystemError, "cannot read /dev/urandom");
  }
  fclose(f);
  memset(id->internal, 0, sizeof id->internal);
  int n = snprintf(id->internal, sizeof id->internal, "%s%d-", kIdMagic, static_cast<int>(getpid()));
  for (unsigned char b : raw) n += snprintf(id->internal + n, sizeof id->internal - n, "%02x", b);
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t ncclCommInitRank(ncclComm_t* out, int nranks, ncclUniqueId id, int rank) {
  tally("ncclCommInitRank");
  if (!out) return fail(ncclInvalidArgument, "null comm");
  *out = nullptr;
  if (nranks < 1 || nranks > kMaxRanks || rank < 0 || rank >= nranks)
    return fail(ncclInvalidArgument, "bad nranks/rank");
  if (strncmp(id.internal, kIdMagic, strlen(kIdMagic)) != 0 ||
      memchr(id.internal, 0, sizeof id.internal) == nullptr)
    return fail(ncclInvalidArgument, "not a unique id of the fake NCCL");
  if (!cuda().ok) return fail(ncclSystemError, "libcuda.so.1 is not the fake CUDA driver");
  const int device = cuda().current_device();
  if (device < 0) return fail(ncclUnhandledCudaError, "no current CUDA context");
  const char* fail_init = getenv("FAKE_NCCL_FAIL_INIT");
  if (fail_init && strcmp(fail_init, "all") == 0) {
    tally("init_failures");
    return fail(ncclSystemError, "FAKE_NCCL_FAIL_INIT=all");
  }
  InitArgs a;
  a.name = id.internal + strlen(kIdMagic);
  a.nranks = nranks;
  a.rank = rank;
  a.device = device;
  a.fail_init = fail_init;
  return init_comm(out, a);
}

// Collective over every rank of comm, on the host thread (the parent's worker may be
// running its operations meanwhile: the host's own barrier and exchange area). The
// children are communicators as ncclCommInitRank's, each with a segment of its own named
// after the parent's, the split's number on the parent and the color.
FAKE_EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                       ncclConfig_t* config) {
  tally("ncclCommSplit");
  if (ncclResult_t r = check_split(comm, color, newcomm, config); r != ncclSuccess) return r;
  std::shared_ptr<Shared> sh = comm->sh;  // (the handle may be aborted from another thread)
  Control* c = sh->control();
  c->split[sh->rank].color.store(color, std::memory_order_relaxed);
  c->split[sh->rank].key.store(key, std::memory_order_relaxed);
  if (!sh->host_barrier()) return fail(ncclInvalidUsage, "communicator was aborted during ncclCommSplit");
  InitArgs a;
  split_place(*sh, color, key, &a.nranks, &a.rank);
  // Every rank has read the exchange area before the next split on comm may write it.
  if (!sh->host_barrier()) return fail(ncclInvalidUsage, "communicator was aborted during ncclCommSplit");
  const uint64_t seq = ++comm->splits;
  if (color == NCCL_SPLIT_NOCOLOR) return ncclSuccess;  // *newcomm stays NULL
  a.name = comm->name + "-s" + std::to_string(seq) + "-c" + std::to_string(color);
  a.device = comm->device;
  // No config: the parent's; splitShare 1 shares its resources, 0 or unset does not.
  a.split_share = config ? config->splitShare == 1 : comm->split_share;
  if (a.split_share) a.shared = comm->res;
  return init_comm(newcomm, a);
}

FAKE_EXPORT ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  tally("ncclCommCount");
  if (!comm || !count) return fail(ncclInvalidArgument, "null argument");
  *count = comm->sh->nranks;
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  tally("ncclCommUserRank");
  if (!comm || !rank) return fail(ncclInvalidArgument, "null argument");
  *rank = comm->sh->rank;
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  tally("ncclCommDestroy");
  if (!comm) return fail(ncclInvalidArgument, "null comm");
  // Pending operations finish first (they need the other ranks, which destroy too): the
  // last one's event is recorded after its end, and each waited for the one before.
  if (comm->last) {
    cuda().event_sync(comm->last);
    cuda().event_delete(comm->last);
  }
  stop_worker(*comm->sh);  // idle by now
  comm->sh->destroyed.store(true);
  forget_comm(comm);
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
  tally("ncclCommAbort");
  if (!comm) return ncclSuccess;
  // This rank's pending operations end without running, or leave their barrier. Once
  // the worker is joined nothing touches the operations' buffers any more, and every
  // operation's stream work can complete (those launched later end at once).
  comm->sh->aborted.store(true);
  stop_worker(*comm->sh);
  if (comm->last) cuda().event_delete(comm->last);
  comm->sh->destroyed.store(true);
  forget_comm(comm);
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* err) {
  tally("ncclCommGetAsyncError");
  if (!comm || !err) return fail(ncclInvalidArgument, "null argument");
  *err = static_cast<ncclResult_t>(comm->sh->async_error.load());
  if (*err == ncclSuccess) {
    const char* after = getenv("FAKE_NCCL_ASYNC_ERROR_AFTER");
    if (after && *after && comm->issued.load() >= strtoull(after, nullptr, 10)) {
      *err = ncclRemoteError;
      t_last_error = "fake NCCL: FAKE_NCCL_ASYNC_ERROR_AFTER=" + std::string(after);
    }
  }
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count,
                                       ncclDataType_t t, ncclRedOp_t op, ncclComm_t comm,
                                       cudaStream_t stream) {
  tally("ncclAllReduce");
  if (ncclResult_t r = check_comm(comm); r != ncclSuccess) return r;
  if (injected("ncclAllReduce")) return fail(ncclUnhandledCudaError, "injected failure of ncclAllReduce");
  if (ncclResult_t r = check_reduction(t, op); r != ncclSuccess) return r;
  const size_t bytes = count * type_size(t);
  if (ncclResult_t r = check_size(comm, bytes); r != ncclSuccess) return r;
  if (ncclResult_t r = check_device(send, bytes, "sendbuff"); r != ncclSuccess) return r;
  if (ncclResult_t r = check_device(recv, bytes, "recvbuff"); r != ncclSuccess) return r;
  if (send != recv && overlaps(send, bytes, recv, bytes))
    return fail(ncclInvalidArgument, "AllReduce: buffers overlap but are not in place");
  if (count == 0) return ncclSuccess;
  auto o = make_op(comm, k_allreduce, count, t, op, 0);
  o->send = send;
  o->recv = recv;
  return issue(comm, std::move(o), stream, {{send, bytes, 0}, {recv, bytes, 1}});
}

FAKE_EXPORT ncclResult_t ncclReduce(const void* send, void* recv, size_t count, ncclDataType_t t,
                                    ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  tally("ncclReduce");
  if (ncclResult_t r = check_comm(comm); r != ncclSuccess) return r;
  if (injected("ncclReduce")) return fail(ncclUnhandledCudaError, "injected failure of ncclReduce");
  if (ncclResult_t r = check_reduction(t, op); r != ncclSuccess) return r;
  if (root < 0 || root >= comm->sh->nranks) return fail(ncclInvalidArgument, "root out of range");
  const bool is_root = root == comm->sh->rank;
  const size_t bytes = count * type_size(t);
  if (ncclResult_t r = check_size(comm, bytes); r != ncclSuccess) return r;
  if (ncclResult_t r = check_device(send, bytes, "sendbuff"); r != ncclSuccess) return r;
  if (is_root) {  // recvbuff is only used at the root
    if (ncclResult_t r = check_device(recv, bytes, "recvbuff"); r != ncclSuccess) return r;
    if (send != recv && overlaps(send, bytes, recv, bytes))
      return fail(ncclInvalidArgument, "Reduce: buffers overlap but are not in place");
  }
  if (count == 0) return ncclSuccess;
  auto o = make_op(comm, k_reduce, count, t, op, root);
  o->send = send;
  o->recv = is_root ? recv : nullptr;
  std::vector<fake_cuda_range> ranges = {{send, bytes, 0}};
  if (is_root) ranges.push_back({recv, bytes, 1});
  return issue(comm, std::move(o), stream, ranges);
}

FAKE_EXPORT ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count,
                                       ncclDataType_t t, int root, ncclComm_t comm,
                                       cudaStream_t stream) {
  tally("ncclBroadcast");
  if (ncclResult_t r = check_comm(comm); r != ncclSuccess) return r;
  if (injected("ncclBroadcast")) return fail(ncclUnhandledCudaError, "injected failure of ncclBroadcast");
  if (root < 0 || root >= comm->sh->nranks) return fail(ncclInvalidArgument, "root out of range");
  const size_t ts = type_size(t);
  if (!ts) return fail(ncclInvalidArgument, "bad datatype");
  const bool is_root = root == comm->sh->rank;
  const size_t bytes = count * ts;
  if (ncclResult_t r = check_size(comm, bytes); r != ncclSuccess) return r;
  if (ncclResult_t r = check_device(recv, bytes, "recvbuff"); r != ncclSuccess) return r;
  if (is_root) {  // sendbuff is only used at the root
    if (ncclResult_t r = check_device(send, bytes, "sendbuff"); r != ncclSuccess) return r;
    if (send != recv && overlaps(send, bytes, recv, bytes))
      return fail(ncclInvalidArgument, "Broadcast: buffers overlap but are not in place");
  }
  if (count == 0) return ncclSuccess;
  auto o = make_op(comm, k_broadcast, count, t, ncclSum, root);
  o->send = is_root ? send : nullptr;
  o->recv = recv;
  std::vector<fake_cuda_range> ranges = {{recv, bytes, 1}};
  if (is_root) ranges.push_back({send, bytes, 0});
  return issue(comm, std::move(o), stream, ranges);
}

FAKE_EXPORT ncclResult_t ncclAllGather(const void* send, void* recv, size_t count,
                                       ncclDataType_t t, ncclComm_t comm, cudaStream_t stream) {
  tally("ncclAllGather");
  if (ncclResult_t r = check_comm(comm); r != ncclSuccess) return r;
  if (injected("ncclAllGather")) return fail(ncclUnhandledCudaError, "injected failure of ncclAllGather");
  const size_t ts = type_size(t);
  if (!ts) return fail(ncclInvalidArgument, "bad datatype");
  const size_t bytes = count * ts, n = static_cast<size_t>(comm->sh->nranks);
  if (ncclResult_t r = check_size(comm, bytes); r != ncclSuccess) return r;
  if (ncclResult_t r = check_device(send, bytes, "sendbuff"); r != ncclSuccess) return r;
  if (ncclResult_t r = check_device(recv, bytes * n, "recvbuff"); r != ncclSuccess) return r;
  const char* in_place = static_cast<const char*>(recv) + comm->sh->rank * bytes;
  if (send != in_place && overlaps(send, bytes, recv, bytes * n))
    return fail(ncclInvalidArgument,
                "AllGather: buffers overlap but sendbuff != recvbuff + rank * sendcount");
  if (count == 0) return ncclSuccess;
  auto o = make_op(comm, k_allgather, count, t, ncclSum, 0);
  o->send = send;
  o->recv = recv;
  return issue(comm, std::move(o), stream, {{send, bytes, 0}, {recv, bytes * n, 1}});
}

FAKE_EXPORT ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count,
                                           ncclDataType_t t, ncclRedOp_t op, ncclComm_t comm,
                                           cudaStream_t stream) {
  tally("ncclReduceScatter");
  if (ncclResult_t r = check_comm(comm); r != ncclSuccess) return r;
  if (injected("ncclReduceScatter")) return fail(ncclUnhandledCudaError, "injected failure of ncclReduceScatter");
  if (ncclResult_t r = check_reduction(t, op); r != ncclSuccess) return r;
  const size_t bytes = count * type_size(t), n = static_cast<size_t>(comm->sh->nranks);
  if (ncclResult_t r = check_size(comm, bytes * n); r != ncclSuccess) return r;
  if (ncclResult_t r = check_device(send, bytes * n, "sendbuff"); r != ncclSuccess) return r;
  if (ncclResult_t r = check_device(recv, bytes, "recvbuff"); r != ncclSuccess) return r;
  const char* in_place = static_cast<const char*>(send) + comm->sh->rank * bytes;
  if (recv != in_place && overlaps(send, bytes * n, recv, bytes))
    return fail(ncclInvalidArgument,
                "ReduceScatter: buffers overlap but recvbuff != sendbuff + rank * recvcount");
  if (count == 0) return ncclSuccess;
  auto o = make_op(comm, k_reducescatter, count, t, op, 0);
  o->send = send;
  o->recv = recv;
  return issue(comm, std::move(o), stream, {{send, bytes * n, 0}, {recv, bytes, 1}});
}

FAKE_EXPORT ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t t, int peer,
                                  ncclComm_t comm, cudaStream_t stream) {
  return p2p(true, const_cast<void*>(send), count, t, peer, comm, stream);
}

FAKE_EXPORT ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t t, int peer,
                                  ncclComm_t comm, cudaStream_t stream) {
  return p2p(false, recv, count, t, peer, comm, stream);
}

FAKE_EXPORT ncclResult_t ncclGroupStart() {
  tally("ncclGroupStart");
  ++t_group.depth;
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t ncclGroupEnd() {
  tally("ncclGroupEnd");
  if (t_group.depth <= 0) return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--t_group.depth > 0) return ncclSuccess;
  Group g = std::move(t_group);
  t_group = Group{};
  if (injected("ncclGroupEnd")) return fail(ncclUnhandledCudaError, "injected failure of ncclGroupEnd");
  if (g.error != ncclSuccess) return g.error;
  if (g.p2p.empty()) return ncclSuccess;
  ncclComm_t comm = g.comm;
  if (ncclResult_t r = check_comm(comm); r != ncclSuccess) return r;
  size_t to[kMaxRanks] = {0};
  std::vector<fake_cuda_range> ranges;
  for (const P2p& x : g.p2p) {
    if (x.send) to[x.peer] += x.bytes;
    ranges.push_back({x.buf, x.bytes, x.send ? 0 : 1});
  }
  size_t total = 0;
  for (int p = 0; p < comm->sh->nranks; ++p) total += to[p];
  if (ncclResult_t r = check_size(comm, total); r != ncclSuccess) return r;
  for (const P2p& s : g.p2p)
    for (const P2p& r : g.p2p)
      if (s.send && !r.send && overlaps(s.buf, s.bytes, r.buf, r.bytes))
        return fail(ncclInvalidArgument, "a send buffer overlaps a receive buffer of the group");
  auto o = make_op(comm, k_sendrecv, 0, ncclInt8, ncclSum, 0);  // groups may differ by rank
  o->p2p = std::move(g.p2p);
  return issue(comm, std::move(o), g.stream, ranges);
}

// ---- fake_api.h ----------------------------------------------------------------------------

FAKE_EXPORT unsigned long long fake_nccl_calls(void) { return g_calls.load(); }

FAKE_EXPORT int fake_nccl_fail_after(const char* api, unsigned long long n) {
  if (!api || !injectable(api)) return -1;
  read_fail_env();
  std::lock_guard<std::mutex> lock(g_mu);
  if (n == 0) g_fail.erase(api);
  else g_fail[api] = g_counters[api] + n;
  return 0;
}

FAKE_EXPORT unsigned long long fake_nccl_counter(const char* name) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_counters.find(name ? name : "");
  return it == g_counters.end() ? 0 : it->second;
}
