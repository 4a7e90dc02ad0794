// Collectives recorded into a CUDA graph (shim/capture.hpp: the design and the rules).
#include "shim/capture.hpp"

#include <mpi.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/log.hpp"
#include "core/comm_context.hpp"
#include "core/cuda_driver.hpp"
#include "core/datatypes.hpp"
#include "core/errors.hpp"
#include "core/requests.hpp"
#include "core/runtime.hpp"
#include "shim/dispatch.hpp"
#include "streamext/stream_attr.hpp"

#if STREAMCOLL_HAVE_CUDA
#include "algorithms/ht_device.hpp"
#endif

namespace streamcoll::capture {

namespace {
thread_local void* t_replay_stream = nullptr;
thread_local bool t_replaying = false;
}  // namespace

bool replay_stream(void** stream) {
  if (!t_replaying) return false;
  *stream = t_replay_stream;
  return true;
}

bool replaying() { return t_replaying; }

#if STREAMCOLL_HAVE_CUDA
namespace {

class Lane;

// Whether a communicator still exists, for the calls captured on it: an attribute of the
// communicator (set locally at its first captured call) whose delete callback, at
// MPI_Comm_free, marks it gone and ends its replay lane once the lane has made (or
// skipped) what was handed to it.
struct CommLife {
  std::atomic<bool> alive{true};
  std::atomic<int> captured{0};  // calls held by graphs
  std::shared_ptr<Lane> lane;    // set at the first record, before any call can be posted
};
using LifeRef = std::shared_ptr<CommLife>;

// One captured call: its arguments (the count arrays copied), where it runs, its flag.
struct Captured {
  CollArgs args;
  std::vector<int> recvcounts, displs;
  std::function<int(MPI_Request*)> start;  ///< a persistent collective's start (record_start)
  CUcontext ctx = nullptr;
  int device = -1;
  uint32_t* flag = nullptr;  // pinned, device-mapped; the graph waits for >= 1
  CUdeviceptr dev_flag = 0;
  LifeRef life;
  ~Captured() {
    if (flag) ht_device::DeviceSide::get().pool.put_flag(flag, dev_flag);  // no CUDA call
    if (life) life->captured.fetch_sub(1);
  }
};

// Process-wide counts of the replay lanes (streamcoll_capture_counts).
std::atomic<uint64_t> g_lanes_started{0}, g_lanes_live{0}, g_replayed{0}, g_skipped{0};

// The replay lane of one communicator: a thread that makes the communicator's replayed
// calls one after the other, in the order the GPU hands them over (its launches' order),
// each on a stream of the lane's own.
//
// Why one per communicator. A replayed call may hold its thread: the first call of a
// signature agrees at once, a route sets itself up collectively at its first call, the
// first refresh duplicates the communicator, a rank that runs ahead waits for the
// refresh it needs, route pmpi makes the MPI's own blocking call, and an MPI_I*'s wait
// completes on the host for the MPI's own request. Each of those waits only for the
// peers' calls on the same communicator, which reach them in the same order (MPI's rule,
// and the rule for graphs: shim/capture.hpp). A rank may launch its graphs of different
// communicators in an order of its own (even ranks A then B, odd ranks B then A), as it
// may make stream-ordered calls on different communicators live; one thread for all of
// them would hold B's replay behind a blocking step of A's while the peer's A waits behind
// its own B: a deadlock. Separate streams too: one stream for every replay would order
// A's GPU work (an NCCL kernel) before B's on one rank and after it on another.
//
// Lifetime. Started at the communicator's first recorded call (on the application's
// thread: a host node must not wait for a thread to start); ended at MPI_Comm_free (once
// what was handed over is made or skipped) or at MPI_Finalize; its thread joined by the
// next lane's start or by stop(). Threads: one per communicator with captured calls that
// is not freed yet (counted: streamcoll_capture_counts, STREAMCOLL_DEBUG=info).
class Lane {
 public:
  Lane() = default;
  Lane(const Lane&) = delete;
  Lane& operator=(const Lane&) = delete;

  // On the application's thread, before the lane's first call can be posted.
  void start(bool stopped) {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped) {
      stopped_ = true;
      finished_.store(true);
      return;
    }
    g_lanes_started.fetch_add(1, std::memory_order_relaxed);
    g_lanes_live.fetch_add(1, std::memory_order_relaxed);
    thread_ = std::thread([this] { loop(); });
  }

  // From the host node (a driver thread): no CUDA call, no blocking beyond the lock.
  void post(Captured* c) {
    std::unique_lock<std::mutex> lock(mu_);
    if (stopped_ || gone_) {  // after MPI_Finalize, or the communicator freed
      lock.unlock();
      if (!c->life->alive.load()) skipped(*c);
      __atomic_store_n(c->flag, 1u, __ATOMIC_RELEASE);  // let the stream go on
      return;
    }
    queue_.push_back(c);
    cv_.notify_one();
  }

  // The communicator is freed (its attribute's delete callback): the lane ends once its
  // queue is empty; calls posted later are skipped at once.
  void gone() {
    std::lock_guard<std::mutex> lock(mu_);
    gone_ = true;
    cv_.notify_one();
  }

  // MPI_Finalize: what was handed over is made first, then the thread ends.
  void stop() {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
    cv_.notify_one();
  }

  bool finished() const { return finished_.load(std::memory_order_acquire); }
  void join() {
    if (thread_.joinable()) thread_.join();
  }

 private:
  void loop() {
    cuda::relax_capture_mode();  // (the driver is loaded: a call was recorded)
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return stopped_ || gone_ || !queue_.empty(); });
      if (queue_.empty()) break;  // ended, every call handed over made
      Captured* c = queue_.front();
      queue_.pop_front();
      lock.unlock();
      run(*c);
      lock.lock();
    }
    const bool freed = gone_ && !stopped_;
    lock.unlock();
    if (freed) close_streams();  // (at MPI_Finalize they stay: the driver may be going)
    g_lanes_live.fetch_sub(1, std::memory_order_relaxed);
    finished_.store(true, std::memory_order_release);
  }

  // The call, as the application made it: an MPI_I* call stays one (MPI never matches a
  // blocking collective with a non-blocking one), completed at once (stream-ordered, its
  // MPI_Wait makes the lane's stream wait, before the flag is written there; on route pmpi
  // the host waits for the MPI's request, as a live caller's would, holding this
  // communicator's lane only).
  static int make_call(const Captured& c) {
    CollArgs a = c.args;
    if (!a.nonblocking) return dispatch(a);
    MPI_Request request = MPI_REQUEST_NULL;
    a.request = &request;
    int rc = c.start ? c.start(&request) : dispatch(a);
    if (rc == MPI_SUCCESS && request != MPI_REQUEST_NULL) rc = MPI_Wait(&request, MPI_STATUS_IGNORE);
    return rc;
  }

  CUstream stream_for(CUcontext ctx) {
    CUstream& s = streams_[ctx];
    if (!s && SC_CU_RESULT(cuda::driver().cuStreamCreate(&s, CU_STREAM_NON_BLOCKING)) != CUDA_SUCCESS)
      s = nullptr;
    return s;
  }

  // A freed communicator's lane gives its streams back (their last flag writes still run).
  void close_streams() {
    for (auto& [ctx, s] : streams_) {
      if (!s) continue;
      cuda::ScopedContext scope(ctx);
      SC_CU_TOLERATE(cuda::driver().cuStreamDestroy(s));
    }
    streams_.clear();
  }

  static void skipped(const Captured& c) {
    g_skipped.fetch_add(1, std::memory_order_relaxed);
    SC_WARN("a CUDA graph launched %s captured on a communicator freed since: the call is "
            "skipped, its output not written", call_name(c.args.coll, false).c_str());
  }

  void run(Captured& c) {
    const cuda::Driver& d = cuda::driver();
    const std::string what = call_name(c.args.coll, false);
    if (!c.life->alive.load()) {
      skipped(c);
    } else {
      cuda::ScopedContext scope(c.ctx);
      CUstream s = stream_for(c.ctx);
      if (!s) {
        keep(c.args.comm, fail(Failure::cuda, "replay of " + what + ": cuStreamCreate failed"), what);
      } else {
        g_replayed.fetch_add(1, std::memory_order_relaxed);
        t_replay_stream = s;
        t_replaying = true;
        const int rc = make_call(c);
        t_replaying = false;
        t_replay_stream = nullptr;
        if (rc != MPI_SUCCESS) keep(c.args.comm, rc, what);
        // The stream releases the graph once the call's work is done; this thread goes on
        // to the next call at once (it must not wait for peers that may need its next
        // call first). Once the flag may be written, `c` may be gone (the graph done and
        // destroyed): nothing of it is touched after. Without stream memory operations the
        // lane waits for the stream itself.
        if (d.cuStreamWriteValue32 &&
            SC_CU_RESULT(d.cuStreamWriteValue32(s, c.dev_flag, 1, CU_STREAM_WRITE_VALUE_DEFAULT)) ==
                CUDA_SUCCESS)  // else the lane waits
          return;
        const CUresult r = d.cuStreamSynchronize(s);
        if (rc == MPI_SUCCESS)
          if (const int e = SC_CU_CHECK(r, "replay of " + what + ": cuStreamSynchronize"))
            keep(c.args.comm, e, what);
      }
    }
    __atomic_store_n(c.flag, 1u, __ATOMIC_RELEASE);
  }

  // A replayed call's failure, for the next call on the communicator to report.
  static void keep(MPI_Comm comm, int rc, const std::string& what) {
    CommContext* ctx = comm_context(comm, false);
    int none = MPI_SUCCESS;
    if (ctx) ctx->async_error->compare_exchange_strong(none, rc);
    SC_WARN("replay of %s captured in a CUDA graph failed; %s", what.c_str(),
            ctx ? "the next call on the communicator reports it" : "nothing can report it");
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Captured*> queue_;
  std::thread thread_;
  bool stopped_ = false, gone_ = false;
  std::atomic<bool> finished_{false};
  std::map<CUcontext, CUstream> streams_;  // the lane's thread's only
};

// The lanes of the process: started at first records, joined once ended.
class Lanes {
 public:
  static Lanes& get() {
    static Lanes* l = new Lanes;  // never destroyed: host nodes may outlive exit
    return *l;
  }

  // A new lane, started (on the application's thread); the ended ones joined first.
  std::shared_ptr<Lane> open() {
    auto lane = std::make_shared<Lane>();
    std::lock_guard<std::mutex> lock(mu_);
    reap_locked();
    lane->start(stopped_);
    if (!stopped_) lanes_.push_back(lane);
    return lane;
  }

  void stop() {
    std::vector<std::shared_ptr<Lane>> all;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopped_ = true;
      all.swap(lanes_);
    }
    for (auto& l : all) l->stop();
    for (auto& l : all) l->join();
  }

 private:
  void reap_locked() {
    for (auto it = lanes_.begin(); it != lanes_.end();) {
      if (!(*it)->finished()) {
        ++it;
        continue;
      }
      (*it)->join();  // (its thread has left its loop: at most its last instructions)
      it = lanes_.erase(it);
    }
  }

  std::mutex mu_;
  std::vector<std::shared_ptr<Lane>> lanes_;
  bool stopped_ = false;
};

int g_life_keyval = MPI_KEYVAL_INVALID;
std::once_flag g_life_once;
std::mutex g_life_mu;  // a communicator's first record: its attribute and lane

int life_gone(MPI_Comm, int, void* value, void*) {
  auto* ref = static_cast<LifeRef*>(value);
  (*ref)->alive.store(false);
  if (const int n = (*ref)->captured.load())
    SC_WARN("MPI_Comm_free of a communicator whose collectives %d captured call(s) of CUDA "
            "graphs still hold: launching those graphs now skips the calls (destroy the "
            "graphs before freeing the communicator)", n);
  if ((*ref)->lane) (*ref)->lane->gone();
  delete ref;
  return MPI_SUCCESS;
}

// The communicator's life, and its replay lane started, at its first record.
LifeRef life_of(MPI_Comm comm) {
  std::call_once(g_life_once, [] {
    PMPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, life_gone, &g_life_keyval, nullptr);
  });
  std::lock_guard<std::mutex> lock(g_life_mu);
  void* v = nullptr;
  int found = 0;
  PMPI_Comm_get_attr(comm, g_life_keyval, &v, &found);
  if (found) return *static_cast<LifeRef*>(v);
  auto* ref = new LifeRef(std::make_shared<CommLife>());
  (*ref)->lane = Lanes::get().open();
  SC_INFO("capture: a replay thread started for a communicator (%llu live)",
          static_cast<unsigned long long>(g_lanes_live.load()));
  PMPI_Comm_set_attr(comm, g_life_keyval, ref);
  return *ref;
}

void CUDA_CB on_launch(void* p) {
  auto* c = static_cast<Captured*>(p);
  __atomic_store_n(c->flag, 0u, __ATOMIC_SEQ_CST);  // re-armed at every launch
  c->life->lane->post(c);
}

void CUDA_CB on_destroy(void* p) { delete static_cast<Captured*>(p); }

bool gpu_buffers(const CollArgs& a) {
  auto gpu = [](const void* p) {
    if (!p || p == MPI_IN_PLACE) return false;
    const MemKind k = cuda::classify_buffer(p, nullptr);
    return k == MemKind::device || k == MemKind::managed;
  };
  return gpu(a.sendbuf) || gpu(a.recvbuf);
}

// The call's own copy of its arguments: count arrays copied, the Fortran binding left out
// (a replay runs the C call on the converted handles).
std::unique_ptr<Captured> copy_call(const CollArgs& a) {
  auto c = std::make_unique<Captured>();
  c->args = a;
  c->args.fortran = nullptr;
  c->args.request = nullptr;  // a replay's own
  int size = 1;
  PMPI_Comm_size(a.comm, &size);
  if (a.recvcounts) c->recvcounts.assign(a.recvcounts, a.recvcounts + size);
  if (a.displs) c->displs.assign(a.displs, a.displs + size);
  c->args.recvcounts = a.recvcounts ? c->recvcounts.data() : nullptr;
  c->args.displs = a.displs ? c->displs.data() : nullptr;
  return c;
}

// The two nodes of a captured call, and its lifetime tied to the graph. A CUresult.
CUresult add_nodes(CUstream s, std::unique_ptr<Captured> c, const char** what) {
  const cuda::Driver& d = cuda::driver();
  ht_device::DeviceSide& ds = ht_device::DeviceSide::get();
  ht_device::Device* g = ds.device(c->device);
  if (!g) return *what = "the GPU's set-up", CUDA_ERROR_INVALID_DEVICE;
  if (!ds.pool.get_flag(&c->flag, &c->dev_flag))
    return *what = "a flag (cuMemHostAlloc)", CUDA_ERROR_OUT_OF_MEMORY;
  CUstreamCaptureStatus status;
  cuuint64_t id = 0;
  CUgraph graph = nullptr;
  CUresult r = d.cuStreamGetCaptureInfo(s, &status, &id, &graph, nullptr, nullptr, nullptr);
  if (r != CUDA_SUCCESS) return *what = "cuStreamGetCaptureInfo", r;
  CUuserObject owner = nullptr;
  Captured* raw = c.get();
  r = d.cuUserObjectCreate(&owner, raw, on_destroy, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC);
  if (r != CUDA_SUCCESS) return *what = "cuUserObjectCreate", r;
  c.release();  // the user object owns it from here
  if ((r = d.cuGraphRetainUserObject(graph, owner, 1, CU_GRAPH_USER_OBJECT_MOVE)) !=
      CUDA_SUCCESS) {
    SC_CU_TOLERATE(d.cuUserObjectRelease(owner, 1));
    return *what = "cuGraphRetainUserObject", r;
  }
  if ((r = d.cuLaunchHostFunc(s, on_launch, raw)) != CUDA_SUCCESS)
    return *what = "cuLaunchHostFunc", r;
  if ((r = ds.hold_stream(*g, s, raw->dev_flag, Runtime::get().settings().ht_wait)) !=
      CUDA_SUCCESS)
    return *what = "holding the stream (cuStreamWaitValue32 / spin kernel)", r;
  return CUDA_SUCCESS;
}

// A call that route self takes as it is (algorithms/self.cpp): one rank, predefined types
// (the route checks the rest, and a call it declines on a capturing stream fails there).
bool one_rank(const CollArgs& a) {
  int inter = 1, size = 0;
  if (!Runtime::get().settings().one_rank_self) return false;
  if (PMPI_Comm_test_inter(a.comm, &inter) != MPI_SUCCESS || inter ||
      PMPI_Comm_size(a.comm, &size) != MPI_SUCCESS || size != 1)
    return false;
  if (a.coll == Coll::bcast) return find_type(a.datatype) != nullptr;
  if (takes_op(a.coll)) return find_type(a.datatype) && find_op(a.op);
  return find_type(a.recvtype) && (a.sendbuf == MPI_IN_PLACE || find_type(a.sendtype));
}

int refuse(const CollArgs& a, const std::string& why) {
  const int rc = fail(Failure::cuda, call_name(a.coll, a.nonblocking) +
                                         " on a stream being captured into a CUDA graph: " + why);
  PMPI_Comm_call_errhandler(a.comm, rc);
  return rc;
}

}  // namespace

namespace {

bool record_call(const CollArgs& a, std::function<int(MPI_Request*)> start, int* rc) {
  if (t_replaying || a.comm == MPI_COMM_NULL) return false;
  void* stream = nullptr;
  if (!streamext::attached(a.comm, &stream)) return false;
  const cuda::Driver& d = cuda::driver();
  if (!d.usable || !d.cuStreamIsCapturing) return false;
  CUstream s = static_cast<CUstream>(stream);
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  if (SC_CU_RESULT(d.cuStreamIsCapturing(s, &status)) != CUDA_SUCCESS ||  // not capturing
      status == CU_STREAM_CAPTURE_STATUS_NONE || !gpu_buffers(a))
    return false;
  if (status != CU_STREAM_CAPTURE_STATUS_ACTIVE)
    return *rc = refuse(a, "the capture was invalidated before this call"), true;
  // A communicator of one rank: route self's copy goes on the capturing stream itself (a
  // memcpy node of the graph), with no replay lane, no thread and no MPI call at launch.
  if (one_rank(a)) return false;
  if (!Runtime::get().thread_multiple())
    return *rc = refuse(a, "capture needs MPI_THREAD_MULTIPLE (streamcoll makes the call "
                           "from a thread of its own at each launch)"), true;
  if (!d.cuLaunchHostFunc || !d.cuStreamGetCaptureInfo || !d.cuUserObjectCreate ||
      !d.cuGraphRetainUserObject || !ht_device::DeviceSide::can_hold(Runtime::get().settings().ht_wait))
    return *rc = refuse(a, "this CUDA driver lacks host functions, user objects or stream "
                           "memory operations"), true;
  std::unique_ptr<Captured> c = copy_call(a);
  c->start = std::move(start);
  d.cuCtxGetCurrent(&c->ctx);
  c->device = cuda::device_of(a.recvbuf && a.recvbuf != MPI_IN_PLACE ? a.recvbuf : a.sendbuf);
  if (c->device < 0) d.cuCtxGetDevice(&c->device);
  c->life = life_of(a.comm);
  c->life->captured.fetch_add(1);
  const char* what = "";
  CUresult r;
  {
    cuda::RelaxedCapture relaxed;  // the flag pool's allocations: not into the capture
    r = add_nodes(s, std::move(c), &what);
  }
  if (r != CUDA_SUCCESS)
    return *rc = refuse(a, SC_CU_WHY(r, what)), true;
  SC_TRACE("%s recorded into a CUDA graph", call_name(a.coll, a.nonblocking).c_str());
  *rc = a.nonblocking ? start_completed_request(a.request) : MPI_SUCCESS;
  return true;
}

}  // namespace

bool record(const CollArgs& a, int* rc) { return record_call(a, nullptr, rc); }

bool record_start(const CollArgs& a, std::function<int(MPI_Request*)> start, int* rc) {
  return record_call(a, std::move(start), rc);
}

void stop() { Lanes::get().stop(); }

Counts counts() {
  Counts c;
  c.lanes_started = g_lanes_started.load(std::memory_order_relaxed);
  c.lanes_live = g_lanes_live.load(std::memory_order_relaxed);
  c.replayed = g_replayed.load(std::memory_order_relaxed);
  c.skipped = g_skipped.load(std::memory_order_relaxed);
  return c;
}

#else  // no CUDA toolkit at build time: nothing can be captured

bool record(const CollArgs&, int*) { return false; }
bool record_start(const CollArgs&, std::function<int(MPI_Request*)>, int*) { return false; }
void stop() {}
Counts counts() { return Counts{}; }

#endif

}  // namespace streamcoll::capture
