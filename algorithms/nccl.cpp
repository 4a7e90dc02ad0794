// nccl: the collective on the communicator's NCCL communicator.
//
// Source: NCCL (NVIDIA) picks ring or tree per call; ring allreduce costs
// 2(p-1)·α + 2(p-1)/p·n·β for n bytes on p ranks, tree 2·log2(p)·α + 2·n·β (pipelined).
// Stream semantics: Aluminum (Dryden et al., MLHPC 2018), sections IV-B and V-A.
//
// Per communicator (route state, created at the first blocking call routed here, a
// collective step on every rank):
//   1. the rank's GPU is the device of the call's buffer; every rank's (host, PCI bus id)
//      is gathered, and ranks sharing a GPU turn the route off for the communicator
//      (NCCL refuses them; the calls fall back to pmpi, on every rank alike);
//   2. rank 0 makes an ncclUniqueId, PMPI_Bcast carries it, ncclCommInitRank; one
//      PMPI_Allreduce agrees on success, so either every rank uses NCCL or none does.
// Non-blocking calls on a communicator without NCCL state yet go to pmpi: setting up is
// collective, and starting a non-blocking call must stay local.
//
// Streams per call:
//   classic blocking        NCCL on an internal (non-blocking) stream made to wait for an
//                           event recorded on the legacy default stream, so it runs after
//                           the application's legacy and blocking streams' earlier work,
//                           as a legacy-stream copy would; the host waits for it (polling
//                           NCCL's asynchronous errors).
//   classic non-blocking    the same stream; MPI_Test queries an event, MPI_Wait waits.
//   attached S, blocking    NCCL on S; returns at once.
//   attached S, MPI_I*      an internal stream waits for S, runs NCCL, records an event;
//                           MPI_Wait/MPI_Test make S wait for that event (host never).
// NCCL serialises the operations of one NCCL communicator in issue order, whatever
// stream each is on. Operations of different communicators are never ordered by a stream
// of ours (each NCCL communicator has its own, none a blocking stream): ranks may start
// them in different orders (legal MPI). What NCCL itself requires there (its
// documentation, "Using multiple NCCL communicators concurrently": operations on
// different communicators may deadlock unless launched in one order everywhere or able to
// run concurrently on the GPU) is not yet enforced: see README, Safety rules.
#include <nccl.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "algorithms/nccl_lib.hpp"
#include "algorithms/nccl_map.hpp"
#include "algorithms/route.hpp"
#include "core/cuda_driver.hpp"
#include "core/errors.hpp"
#include "core/log.hpp"
#include "core/requests.hpp"
#include "core/runtime.hpp"

namespace streamcoll {
namespace {

using cuda::driver;
using cuda::ScopedContext;

// One NCCL communicator and the CUDA objects around it. Shared by the communicator's
// route state and the requests in flight, so MPI_Comm_free may come before MPI_Wait.
class NcclComm {
 public:
  const nccl::Library* lib = nullptr;
  ncclComm_t comm = nullptr;
  int device = -1;
  CUdevice cudev = 0;
  CUcontext cuctx = nullptr;   ///< the device's primary context (retained)
  /// classic calls: a non-blocking stream, ordered explicitly after the legacy stream at
  /// each call (a blocking stream would also make the application's legacy-stream work,
  /// and through it other communicators' operations, wait for ours)
  CUstream classic = nullptr;
  CUstream side = nullptr;     ///< non-blocking stream for MPI_I* with an attached stream
  CUstream copy = nullptr;     ///< non-blocking stream for staged results (made at first use)
  std::once_flag copy_once;
  int size = 1;

  ~NcclComm() {
    if (!cuctx) return;
    {
      ScopedContext scope(cuctx);
      if (comm && !aborted_.load()) lib->ncclCommDestroy(comm);
      for (CUevent e : events_) driver().cuEventDestroy(e);
      if (classic) driver().cuStreamDestroy(classic);
      if (side) driver().cuStreamDestroy(side);
      if (copy) driver().cuStreamDestroy(copy);
    }
    driver().cuDevicePrimaryCtxRelease(cudev);
  }

  /// An event from the pool (timing disabled), or nullptr with *rc set.
  CUevent take_event(int* rc) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!events_.empty()) {
        CUevent e = events_.back();
        events_.pop_back();
        return e;
      }
    }
    CUevent e = nullptr;
    if (CUresult r = driver().cuEventCreate(&e, CU_EVENT_DISABLE_TIMING); r != CUDA_SUCCESS) {
      *rc = fail(Failure::cuda, cuda::describe("cuEventCreate", r));
      return nullptr;
    }
    return e;
  }
  void give_event(CUevent e) {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(e);
  }

  /// Polls NCCL for an asynchronous error (a failed peer, a network error); on one, the
  /// NCCL communicator is aborted, which ends its kernels instead of leaving them
  /// spinning, and every later call on it fails. Returns whether it is aborted. Makes no
  /// MPI call: the watchdog thread uses it too.
  bool failed() {
    if (aborted_.load(std::memory_order_acquire)) return true;
    ncclResult_t async = ncclSuccess;
    {
      std::shared_lock<std::shared_timed_mutex> use(use_);
      if (aborted_.load(std::memory_order_acquire)) return true;
      ncclResult_t r = lib->ncclCommGetAsyncError(comm, &async);
      if (r != ncclSuccess) async = r;
    }
    if (async == ncclSuccess || async == ncclInProgress) return false;
    abort(async);
    return true;
  }

  /// failed() as an MPI error code, for the threads that make MPI calls.
  int poll() { return failed() ? error_code(Failure::nccl_aborted) : MPI_SUCCESS; }

  /// Holds off abort() while the calling thread enqueues work on the NCCL communicator.
  std::shared_lock<std::shared_timed_mutex> use() {
    return std::shared_lock<std::shared_timed_mutex>(use_);
  }
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }

  /// Waits on the host until `e` has completed (or `s` is idle when e is null), polling
  /// for asynchronous NCCL errors. The caller has the context current.
  int wait(CUevent e, CUstream s) {
    for (unsigned i = 1;; ++i) {
      CUresult r = e ? driver().cuEventQuery(e) : driver().cuStreamQuery(s);
      // An abort ends NCCL's kernels too, and a failure may end them early: done with an
      // asynchronous error pending, or after an abort, is not done.
      if (r == CUDA_SUCCESS) return poll();
      if (r != CUDA_ERROR_NOT_READY)
        return fail(Failure::cuda, cuda::describe(e ? "cuEventQuery" : "cuStreamQuery", r));
      if (i % 1024 == 0) {
        if (int rc = poll(); rc != MPI_SUCCESS) return rc;
        if (i >= 64 * 1024) sched_yield();  // a long operation: let other threads run
      }
    }
  }

 private:
  void abort(ncclResult_t async) {
    std::lock_guard<std::mutex> lock(abort_mu_);
    if (aborted_.load()) return;
    std::string what = lib->describe("asynchronous NCCL error", async, comm);
    // Wait for a thread inside an NCCL call on this communicator to leave it. One that
    // stays (blocked inside NCCL by the very failure) is not waited for: aborting is what
    // unblocks it, and a hung job is worse.
    std::unique_lock<std::shared_timed_mutex> excl(use_, std::defer_lock);
    if (!excl.try_lock_for(std::chrono::seconds(1)))
      what += " (a thread is still inside NCCL; aborting anyway)";
    lib->ncclCommAbort(comm);
    log_error("%s; NCCL communicator of %d ranks aborted, its later calls fail", what.c_str(),
              size);
    aborted_.store(true, std::memory_order_release);
  }

  std::mutex mu_;                // the event pool
  std::vector<CUevent> events_;
  std::mutex abort_mu_;          // one abort
  std::shared_timed_mutex use_;  // shared: a call uses `comm`; exclusive: abort
  std::atomic<bool> aborted_{false};
};

// Polls every ready NCCL communicator for asynchronous errors every 100 ms, so that a
// failure is noticed (and the NCCL communicator aborted, which ends its kernels) also
// while the host does not wait inside streamcoll: stream-ordered calls, or a program
// blocked in cudaStreamSynchronize. Started with the first NCCL communicator, stopped
// (joined) at runtime stop.
class Watchdog {
 public:
  static Watchdog& get() {
    static Watchdog w;
    return w;
  }
  void watch(const std::shared_ptr<NcclComm>& c) {
    std::lock_guard<std::mutex> lock(mu_);
    comms_.push_back(c);
    if (!thread_.joinable() && !stopping_) thread_ = std::thread([this] { loop(); });
  }
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      comms_.clear();
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      cv_.wait_for(lock, std::chrono::milliseconds(100));
      std::vector<std::shared_ptr<NcclComm>> live;
      for (auto it = comms_.begin(); it != comms_.end();) {
        if (auto c = it->lock()) {
          live.push_back(std::move(c));
          ++it;
        } else {
          it = comms_.erase(it);
        }
      }
      lock.unlock();
      for (auto& c : live) c->failed();
      live.clear();  // the last owner may be here: destroy outside the lock
      lock.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::weak_ptr<NcclComm>> comms_;
  std::thread thread_;
  bool stopping_ = false;
};

class NcclState final : public RouteState {
 public:
  enum Status { unset, ready, off };
  Status status = unset;
  std::shared_ptr<NcclComm> comm;
};

// A non-blocking call in flight. Completion is an event on the stream that ran it.
class NcclRequest final : public ManagedRequest {
 public:
  NcclRequest(std::shared_ptr<NcclComm> c, CUevent done, bool stream_mode, CUstream user,
              std::function<int()> after = nullptr)
      : comm_(std::move(c)), done_(done), stream_mode_(stream_mode), user_(user),
        after_(std::move(after)) {}
  ~NcclRequest() override {
    if (after_) {  // never completed (start_request failed): the operation is in flight
      ScopedContext scope(comm_->cuctx);
      comm_->wait(done_, nullptr);
      after_();
    }
    comm_->give_event(done_);
  }

  void on_wait() override {
    if (finished()) return;
    ScopedContext scope(comm_->cuctx);
    if (stream_mode_) {
      enqueue_wait();
      error_ = error_ != MPI_SUCCESS ? error_ : comm_->poll();
    } else {
      error_ = comm_->wait(done_, nullptr);
    }
    finish();
  }
  void on_test() override {
    if (stream_mode_) return on_wait();  // the stream waits: complete at once
    if (finished()) return;
    ScopedContext scope(comm_->cuctx);
    CUresult r = driver().cuEventQuery(done_);
    if (r == CUDA_SUCCESS) {
      error_ = comm_->poll();
      finish();
    } else if (r != CUDA_ERROR_NOT_READY) {
      error_ = fail(Failure::cuda, cuda::describe("cuEventQuery", r));
      finish();
    } else if (int rc = comm_->poll(); rc != MPI_SUCCESS) {
      // Aborted: its kernels end (ncclCommAbort ends them); the request completes, with
      // the error, once the event says the GPU is done with the buffers.
      error_ = rc;
    }
  }
  void on_free() override { on_wait(); }
  int error() const override { return error_; }

 private:
  // Stream semantics: the attached stream waits for the operation; the host does not.
  void enqueue_wait() {
    if (CUresult r = driver().cuStreamWaitEvent(user_, done_, 0); r != CUDA_SUCCESS)
      error_ = fail(Failure::cuda, cuda::describe("cuStreamWaitEvent", r));
  }
  bool finished() {
    std::lock_guard<std::mutex> lock(mu_);
    return finished_;
  }
  void finish() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finished_) return;
      finished_ = true;
    }
    if (after_) {  // the operation is over: the staged results go to the caller's buffers
      const int rc = after_();
      if (error_ == MPI_SUCCESS) error_ = rc;
      after_ = nullptr;
    }
    complete();
  }

  std::shared_ptr<NcclComm> comm_;
  CUevent done_;
  bool stream_mode_;
  CUstream user_;
  std::function<int()> after_;
  int error_ = MPI_SUCCESS;
  std::mutex mu_;
  bool finished_ = false;
};

const TypeInfo* call_type(const CollArgs& a) {
  return find_type(takes_op(a.coll) || a.coll == Coll::bcast ? a.datatype : a.recvtype);
}

// This host, as NCCL tells hosts apart: host name and boot id (containers on one host
// share the boot id, not always the host name).
uint64_t host_hash() {
  char name[256] = {0};
  gethostname(name, sizeof(name) - 1);
  uint64_t h = nccl::hash(name);
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (boot >> id) h = nccl::hash(id.c_str(), h);
  return h;
}

// Local half of the set-up: CUDA objects on the buffer's device. Returns false, with the
// reason, if this rank cannot take part.
bool open_device(NcclComm& c, int buffer_device, nccl::GpuId* id, std::string* why) {
  const cuda::Driver& d = driver();
  c.device = buffer_device;
  char bus[64] = {0};
  CUresult r;
  if (c.device < 0) {  // managed memory may have no device: the thread's current one
    CUcontext current = nullptr;
    CUdevice dev = -1;
    if (d.cuCtxGetCurrent(&current) == CUDA_SUCCESS && current &&
        d.cuCtxGetDevice(&dev) == CUDA_SUCCESS)
      c.device = dev;
  }
  if (c.device < 0) return *why = "no GPU for the buffer and no current CUDA context", false;
  if ((r = d.cuDeviceGet(&c.cudev, c.device)) != CUDA_SUCCESS ||
      (r = d.cuDeviceGetPCIBusId(bus, sizeof(bus) - 1, c.cudev)) != CUDA_SUCCESS)
    return *why = cuda::describe("cuDeviceGetPCIBusId", r), false;
  if ((r = d.cuDevicePrimaryCtxRetain(&c.cuctx, c.cudev)) != CUDA_SUCCESS) {
    c.cuctx = nullptr;
    return *why = cuda::describe("cuDevicePrimaryCtxRetain", r), false;
  }
  ScopedContext scope(c.cuctx);
  if ((r = d.cuStreamCreate(&c.classic, CU_STREAM_NON_BLOCKING)) != CUDA_SUCCESS ||
      (r = d.cuStreamCreate(&c.side, CU_STREAM_NON_BLOCKING)) != CUDA_SUCCESS)
    return *why = cuda::describe("cuStreamCreate", r), false;
  id->host = host_hash();
  id->bus = nccl::hash(bus);
  return true;
}

// The collective set-up (file comment). Every rank reaches it at the same call.
void set_up(NcclState& st, const CallEnv& env, const CommContext& ctx) {
  st.status = NcclState::off;
  const nccl::Library& lib = nccl::library(Runtime::get().settings().nccl_lib);
  auto c = std::make_shared<NcclComm>();
  c->lib = &lib;
  c->size = ctx.size;
  struct Entry {
    uint64_t host, bus, ok;
  } mine{0, 0, 0};
  std::string why;
  nccl::GpuId id;
  if (!lib.usable) {
    why = lib.reason;
  } else if (open_device(*c, env.device, &id, &why)) {
    mine = {id.host, id.bus, 1};
  }
  std::vector<Entry> all(static_cast<size_t>(ctx.size));
  if (PMPI_Allgather(&mine, 3, MPI_UINT64_T, all.data(), 3, MPI_UINT64_T, ctx.comm) !=
      MPI_SUCCESS)
    return;
  std::vector<nccl::GpuId> gpus;
  for (int r = 0; r < ctx.size; ++r) {
    if (!all[r].ok) {
      if (!mine.ok) SC_WARN("nccl: off for a communicator of %d ranks: %s", ctx.size, why.c_str());
      else SC_INFO("nccl: off for a communicator of %d ranks: rank %d cannot use it", ctx.size, r);
      return;
    }
    gpus.push_back({all[r].host, all[r].bus});
  }
  if (auto pair = nccl::shared_gpu(gpus)) {
    SC_INFO("nccl: off for a communicator of %d ranks: ranks %d and %d share one GPU; its "
            "calls go to pmpi", ctx.size, pair->first, pair->second);
    return;
  }

  struct {
    ncclUniqueId id;
    int ok;
  } root{};
  if (ctx.rank == 0) {
    ncclResult_t r = lib.ncclGetUniqueId(&root.id);
    root.ok = r == ncclSuccess;
    if (!root.ok) log_error("%s", lib.describe("ncclGetUniqueId", r).c_str());
  }
  if (PMPI_Bcast(&root, sizeof(root), MPI_BYTE, 0, ctx.comm) != MPI_SUCCESS || !root.ok) return;
  int ok = 0;
  {
    ScopedContext scope(c->cuctx);
    ncclResult_t r = lib.ncclCommInitRank(&c->comm, ctx.size, root.id, ctx.rank);
    ok = r == ncclSuccess;
    if (!ok) {
      log_error("%s", lib.describe("ncclCommInitRank", r).c_str());
      c->comm = nullptr;
    }
  }
  int all_ok = 0;
  if (PMPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, ctx.comm) != MPI_SUCCESS || !all_ok) {
    if (c->comm) {
      ScopedContext scope(c->cuctx);
      lib.ncclCommAbort(c->comm);
      c->comm = nullptr;
    }
    SC_WARN("nccl: could not create an NCCL communicator of %d ranks; its calls go to pmpi",
            ctx.size);
    return;
  }
  SC_INFO("nccl: NCCL %d communicator of %d ranks on device %d", lib.version, ctx.size,
          c->device);
  Watchdog::get().watch(c);
  st.comm = std::move(c);
  st.status = NcclState::ready;
}

NcclState& state_of(CommContext& ctx) {
  auto& slot = ctx.route_state[static_cast<int>(RouteId::nccl)];
  if (!slot) slot = std::make_unique<NcclState>();
  return static_cast<NcclState&>(*slot);
}

// Enqueues the collective on `s`. Returns the NCCL result; *cu gets a CUDA failure of the
// copies around it (in-place reduce-scatter and alltoall).
ncclResult_t enqueue(const CollArgs& a, const CommContext& ctx, const NcclComm& c, CUstream s,
                     CUresult* cu) {
  const nccl::Library& L = *c.lib;
  const TypeInfo* t = call_type(a);
  const size_t ts = static_cast<size_t>(t->size);
  const int p = ctx.size, me = ctx.rank;
  auto* rbuf = static_cast<char*>(a.recvbuf);
  const void* sbuf = a.sendbuf;
  *cu = CUDA_SUCCESS;
  switch (a.coll) {
    case Coll::allreduce: {
      auto type = *nccl::reduction_type(*t);
      auto op = *nccl::reduction_op(find_op(a.op)->kind);
      return L.ncclAllReduce(sbuf == MPI_IN_PLACE ? rbuf : sbuf, rbuf, a.count, type, op,
                             c.comm, s);
    }
    case Coll::reduce: {
      auto type = *nccl::reduction_type(*t);
      auto op = *nccl::reduction_op(find_op(a.op)->kind);
      // MPI_IN_PLACE is only valid at the root, where the input is the receive buffer.
      return L.ncclReduce(sbuf == MPI_IN_PLACE ? rbuf : sbuf, rbuf, a.count, type, op, a.root,
                          c.comm, s);
    }
    case Coll::bcast:
      return L.ncclBroadcast(rbuf, rbuf, a.count * ts, ncclUint8, a.root, c.comm, s);
    case Coll::allgather: {
      const size_t block = static_cast<size_t>(a.recvcount) * ts;
      // MPI in place: this rank's block is already at its place in recvbuf, which is
      // NCCL's in-place condition (sendbuff == recvbuff + rank * block).
      const void* src = sbuf == MPI_IN_PLACE ? rbuf + me * block : sbuf;
      return L.ncclAllGather(src, rbuf, block, ncclUint8, c.comm, s);
    }
    case Coll::reduce_scatter_block: {
      auto type = *nccl::reduction_type(*t);
      auto op = *nccl::reduction_op(find_op(a.op)->kind);
      if (sbuf != MPI_IN_PLACE)
        return L.ncclReduceScatter(sbuf, rbuf, a.count, type, op, c.comm, s);
      // MPI in place: input is all of recvbuf, the result goes to its start, and the rest
      // of recvbuf stays as it was (MPI writes nothing there). NCCL's in place would leave
      // the result over this rank's input block, so reduce into a stream-ordered scratch
      // block and copy it down (rank 0's block is the start: no scratch).
      const size_t block = static_cast<size_t>(a.count) * ts;
      if (me == 0) return L.ncclReduceScatter(rbuf, rbuf, a.count, type, op, c.comm, s);
      CUdeviceptr tmp = 0;
      if ((*cu = driver().cuMemAllocAsync(&tmp, block, s)) != CUDA_SUCCESS) return ncclSuccess;
      ncclResult_t r = L.ncclReduceScatter(rbuf, reinterpret_cast<void*>(tmp), a.count, type,
                                           op, c.comm, s);
      if (r == ncclSuccess)
        *cu = driver().cuMemcpyDtoDAsync(reinterpret_cast<CUdeviceptr>(rbuf), tmp, block, s);
      if (CUresult f = driver().cuMemFreeAsync(tmp, s); *cu == CUDA_SUCCESS) *cu = f;
      return r;
    }
    case Coll::alltoall: {
      const size_t block = static_cast<size_t>(a.recvcount) * ts;
      CUdeviceptr copy = 0;
      const char* src = static_cast<const char*>(sbuf);
      if (sbuf == MPI_IN_PLACE) {  // send from a stream-ordered copy of recvbuf
        if ((*cu = driver().cuMemAllocAsync(&copy, block * p, s)) != CUDA_SUCCESS)
          return ncclSuccess;
        if ((*cu = driver().cuMemcpyDtoDAsync(copy, reinterpret_cast<CUdeviceptr>(rbuf),
                                              block * p, s)) != CUDA_SUCCESS) {
          driver().cuMemFreeAsync(copy, s);
          return ncclSuccess;
        }
        src = reinterpret_cast<const char*>(copy);
      }
      ncclResult_t r = L.ncclGroupStart();
      for (int peer = 0; peer < p && r == ncclSuccess; ++peer) {
        r = L.ncclSend(src + peer * block, block, ncclUint8, peer, c.comm, s);
        if (r == ncclSuccess) r = L.ncclRecv(rbuf + peer * block, block, ncclUint8, peer, c.comm, s);
      }
      ncclResult_t end = L.ncclGroupEnd();
      if (r == ncclSuccess) r = end;
      if (copy) *cu = driver().cuMemFreeAsync(copy, s);
      return r;
    }
    default:
      return ncclInvalidUsage;  // accepts() lets no other collective through
  }
}

// A non-blocking call whose buffers on this rank are not on the NCCL communicator's GPU
// (host memory, another GPU's, or a mix) while the other ranks' are: it was routed from
// the memory kinds agreed at an earlier blocking call (shim/dispatch.cpp), so this rank
// takes part through device copies. The inputs go to a scratch buffer on the classic
// stream before the collective; the results come back (on the copy stream, waited for)
// when the request completes, so that nothing here waits for other ranks. This rank
// keeps plain MPI semantics: its buffers are final when MPI_Wait/MPI_Test report it.
// Only the bytes MPI says the call writes on this rank are written.
int run_staged(const CollArgs& a, const CommContext& ctx, const std::shared_ptr<NcclComm>& c) {
  const TypeInfo* t = call_type(a);
  const uint64_t ts = static_cast<uint64_t>(t->size);
  const uint64_t p = static_cast<uint64_t>(ctx.size), me = static_cast<uint64_t>(ctx.rank);
  const bool in_place = a.sendbuf == MPI_IN_PLACE;
  auto* user = static_cast<char*>(a.recvbuf);
  const char* in = static_cast<const char*>(in_place ? a.recvbuf : a.sendbuf);
  struct Range {
    uint64_t off, bytes;
  };
  uint64_t scratch = 0, in_off = 0, in_bytes = 0;
  if (in_place && a.coll == Coll::allgather) in += me * a.recvcount * ts;
  std::vector<Range> out;  // scratch ranges copied back to the same offsets of recvbuf
  switch (a.coll) {
    case Coll::allreduce:
      scratch = in_bytes = a.count * ts;
      out.push_back({0, scratch});
      break;
    case Coll::reduce:
      scratch = in_bytes = a.count * ts;
      if (static_cast<int>(me) == a.root) out.push_back({0, scratch});
      break;
    case Coll::bcast:
      scratch = a.count * ts;
      in = user;
      if (static_cast<int>(me) == a.root) in_bytes = scratch;
      else out.push_back({0, scratch});
      break;
    case Coll::allgather: {
      const uint64_t block = a.recvcount * ts;
      scratch = p * block;
      in_off = me * block;
      in_bytes = block;
      if (in_place) {  // this rank's block is the input: leave it alone
        if (me > 0) out.push_back({0, me * block});
        if (me + 1 < p) out.push_back({(me + 1) * block, (p - me - 1) * block});
      } else {
        out.push_back({0, scratch});
      }
      break;
    }
    case Coll::reduce_scatter_block:
      scratch = in_bytes = p * a.count * ts;
      out.push_back({0, a.count * ts});
      break;
    case Coll::alltoall:
      scratch = in_bytes = p * a.recvcount * ts;
      out.push_back({0, scratch});
      break;
    default:
      return fail(Failure::nccl, call_name(a.coll, true) + ": no staged form");
  }
  const cuda::Driver& d = driver();
  ScopedContext scope(c->cuctx);
  CUresult made = CUDA_SUCCESS;
  std::call_once(c->copy_once, [&] { made = d.cuStreamCreate(&c->copy, CU_STREAM_NON_BLOCKING); });
  if (!c->copy)
    return fail(Failure::cuda, cuda::describe("cuStreamCreate (staging)", made ? made : CUDA_ERROR_INVALID_HANDLE));
  CUstream s = c->classic;
  CUdeviceptr buf = 0;
  if (CUresult r = d.cuMemAllocAsync(&buf, scratch, s); r != CUDA_SUCCESS)
    return fail(Failure::cuda, cuda::describe("cuMemAllocAsync (staging)", r));
  auto release = [c, buf] { driver().cuMemFreeAsync(buf, c->copy); };
  if (in_bytes) {
    if (CUresult r = d.cuMemcpyAsync(buf + in_off, reinterpret_cast<CUdeviceptr>(in), in_bytes, s);
        r != CUDA_SUCCESS) {
      d.cuMemFreeAsync(buf, s);
      return fail(Failure::cuda, cuda::describe("cuMemcpyAsync (staging in)", r));
    }
  }
  CollArgs staged = a;
  staged.sendbuf = MPI_IN_PLACE;
  staged.recvbuf = reinterpret_cast<void*>(buf);
  CUresult cu = CUDA_SUCCESS;
  ncclResult_t nr;
  {
    auto use = c->use();
    if (c->aborted()) {
      d.cuMemFreeAsync(buf, s);
      return c->poll();
    }
    nr = enqueue(staged, ctx, *c, s, &cu);
  }
  int rc = MPI_SUCCESS;
  if (nr != ncclSuccess || cu != CUDA_SUCCESS) {
    d.cuMemFreeAsync(buf, s);
    return nr != ncclSuccess
               ? fail(Failure::nccl, c->lib->describe(call_name(a.coll, true).c_str(), nr, c->comm))
               : fail(Failure::cuda, cuda::describe(call_name(a.coll, true).c_str(), cu));
  }
  CUevent done = c->take_event(&rc);
  if (!done) return rc;  // the scratch buffer stays allocated: the collective may use it
  if (CUresult r = d.cuEventRecord(done, s); r != CUDA_SUCCESS) {
    c->give_event(done);
    return fail(Failure::cuda, cuda::describe("cuEventRecord", r));
  }
  // Runs once the collective is done (or the request is dropped unstarted): results back
  // on the copy stream, which nothing else uses, so waiting for it waits for no other rank.
  auto back = [c, buf, user, out = std::move(out), release]() -> int {
    const cuda::Driver& d = driver();
    ScopedContext scope(c->cuctx);
    int rc = MPI_SUCCESS;
    for (const Range& r : out) {
      CUresult e = d.cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(user + r.off), buf + r.off,
                                   r.bytes, c->copy);
      if (e != CUDA_SUCCESS && rc == MPI_SUCCESS)
        rc = fail(Failure::cuda, cuda::describe("cuMemcpyAsync (staging out)", e));
    }
    release();
    if (CUresult e = d.cuStreamSynchronize(c->copy); e != CUDA_SUCCESS && rc == MPI_SUCCESS)
      rc = fail(Failure::cuda, cuda::describe("cuStreamSynchronize (staging out)", e));
    return rc;
  };
  return start_request(new NcclRequest(c, done, false, nullptr, std::move(back)), a.request);
}

class NcclRoute final : public Route {
 public:
  RouteId id() const override { return RouteId::nccl; }

  bool accepts(const CollArgs& a, CommContext& ctx, const config::RouteChoice&,
               const CallEnv& env) override {
    if (ctx.inter) return false;
    const OpInfo* op = takes_op(a.coll) ? find_op(a.op) : nullptr;
    if (nccl::Support s = nccl::supports(a.coll, env.mem, call_type(a), op);
        s != nccl::Support::ok) {
      SC_TRACE("nccl: %s", nccl::describe(s));
      return false;
    }
    NcclState& st = state_of(ctx);
    if (st.status == NcclState::unset) {
      if (a.nonblocking) return false;  // set up at the first blocking call
      set_up(st, env, ctx);
    }
    return st.status == NcclState::ready;
  }

  // This rank's GPU buffers must be on the GPU of the communicator's NCCL communicator
  // (set up at its first call, on that call's GPU). Managed memory is reachable from any.
  bool able_here(const CollArgs&, CommContext& ctx, const CallEnv& local) override {
    if (local.mem != MemKind::device) return true;
    auto& slot = ctx.route_state[static_cast<int>(RouteId::nccl)];
    if (!slot) return true;
    const NcclState& st = static_cast<const NcclState&>(*slot);
    return st.status != NcclState::ready || st.comm->device == local.device;
  }

  int run(const CollArgs& a, CommContext& ctx, const config::RouteChoice&,
          const CallEnv& env) override {
    std::shared_ptr<NcclComm> c = state_of(ctx).comm;
    if (int rc = c->poll(); rc != MPI_SUCCESS) return rc;
    // Managed memory is reachable from any GPU; device memory only from its own. A
    // blocking call never gets here otherwise (the ranks agreed on able_here); a
    // non-blocking one, routed from an earlier agreement, stages this rank's buffers.
    const bool reachable = env.mem == MemKind::managed ||
                           (env.mem == MemKind::device && env.device == c->device);
    if (!reachable) {
      if (a.nonblocking) return run_staged(a, ctx, c);
      return fail(Failure::wrong_device,
                  call_name(a.coll, a.nonblocking) + ": buffer on device " +
                      std::to_string(env.device) + ", but this communicator's NCCL "
                      "communicator is on device " + std::to_string(c->device));
    }
    const cuda::Driver& d = driver();
    ScopedContext scope(c->cuctx);
    auto user = static_cast<CUstream>(env.stream);
    CUstream s = c->classic;
    int rc = MPI_SUCCESS;
    if (env.has_stream && a.nonblocking) {
      // Ordered after the work on the attached stream, which itself goes on.
      CUevent ready = c->take_event(&rc);
      if (!ready) return rc;
      CUresult r = d.cuEventRecord(ready, user);
      if (r == CUDA_SUCCESS) r = d.cuStreamWaitEvent(c->side, ready, 0);
      c->give_event(ready);  // the wait has captured it; the event may be recorded again
      if (r != CUDA_SUCCESS) return fail(Failure::cuda, cuda::describe("cuStreamWaitEvent", r));
      s = c->side;
    } else if (env.has_stream) {
      s = user;
    } else {
      // Classic: ordered after the legacy stream and every blocking stream of the
      // application, as a copy on the legacy stream would be: an event recorded on the
      // legacy stream is after every blocking stream's earlier work. Our stream is not a
      // blocking stream, so nothing of another communicator's is in that event's past.
      CUevent legacy = c->take_event(&rc);
      if (!legacy) return rc;
      CUresult r = d.cuEventRecord(legacy, CU_STREAM_LEGACY);
      if (r == CUDA_SUCCESS) r = d.cuStreamWaitEvent(s, legacy, 0);
      c->give_event(legacy);
      if (r != CUDA_SUCCESS)
        return fail(Failure::cuda, cuda::describe("cuStreamWaitEvent (legacy stream)", r));
    }

    CUresult cu;
    ncclResult_t nr;
    {
      auto use = c->use();
      if (c->aborted()) return c->poll();
      nr = enqueue(a, ctx, *c, s, &cu);
    }
    if (nr != ncclSuccess)
      return fail(Failure::nccl,
                  c->lib->describe(call_name(a.coll, a.nonblocking).c_str(), nr, c->comm));
    if (cu != CUDA_SUCCESS)
      return fail(Failure::cuda, cuda::describe(call_name(a.coll, a.nonblocking).c_str(), cu));

    if (!a.nonblocking) return env.has_stream ? MPI_SUCCESS : c->wait(nullptr, s);
    CUevent done = c->take_event(&rc);
    if (!done) return rc;
    if (CUresult r = d.cuEventRecord(done, s); r != CUDA_SUCCESS) {
      c->give_event(done);
      return fail(Failure::cuda, cuda::describe("cuEventRecord", r));
    }
    return start_request(new NcclRequest(c, done, env.has_stream, user), a.request);
  }
};

}  // namespace

Route* nccl_route() {
  static NcclRoute r;
  return &r;
}

void nccl_shutdown() { Watchdog::get().stop(); }

}  // namespace streamcoll
