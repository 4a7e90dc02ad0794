// Route ht: host-transfer collectives (N. Dryden et al., "Aluminum: An Asynchronous,
// GPU-Aware Communication Library Optimized for Large-Scale Training of Deep Neural
// Networks on HPC Systems", MLHPC 2018, sections III-B and V-B.2, Figs. 5-6).
//
// Small GPU collectives at scale are latency-bound: a tree over the host network beats
// an NCCL ring (2(p-1)·α) once the two PCIe copies are cheaper than the ring's extra
// latency. For GPU buffers on a stream S (a stream-ordered call):
//
//   S:       [D2H copy into pinned staging] [event e1] [wait: flag >= 1] [H2D copy] [event e2]
//   engine:  poll e1 -> host collective on the staging buffer -> flag = 1 (release) -> poll e2
//            -> staging buffer, flag and events back to their pools
//
// The stream waits with cuStreamWaitValue32 on a flag in pinned, device-mapped memory,
// or, where stream memory operations are unsupported (or STREAMCOLL_HT_WAIT=kernel), on
// a one-thread kernel spinning on the flag. The host returns as soon as the work is
// enqueued; the progress engine (core/progress) does the rest. MPI_I* calls run on a
// side stream that waits for S, and MPI_Wait makes S wait for the side stream.
// Without a stream (classic CUDA-aware semantics) a blocking call copies, reduces and
// copies back on the calling thread; MPI_I* calls go through the engine and their
// request completes when the result is in the GPU buffer.
//
// Host and pinned buffers are a route too (off in the default table): blocking calls run
// streamcoll's algorithm on the calling thread, MPI_I* calls on the engine, which gives
// them asynchronous progress.
//
// The host algorithms are algorithms/schedule.hpp's (recursive doubling, Rabenseifner,
// ring), run on PMPI_ point-to-point over a private duplicate of the communicator with
// one tag per operation, or the MPI's own collective (algo=mpi), started in call order.
//
// Failures stay collective. A rank whose part fails locally (a pinned allocation, a
// copy, an event, holding the stream) still takes part in the host collective, so no
// rank waits for it, with its input marked unusable: the schedule carries that taint to
// every rank whose result depends on it (algorithms/schedule_exec.hpp), and algo=mpi on
// GPU memory (as agreed) exchanges a failure flag with the collective, so no rank
// reports a value built on garbage as a success. A failure leaves nothing behind: the
// next call starts afresh. Errors of a stream-ordered operation found on the engine,
// after the call returned, are reported by the next call on the communicator.
// Cost with p ranks, n bytes, PCIe copy latency α_c and bandwidth β_c:
//   2(α_c + n·β_c) + host collective (schedule.hpp), against NCCL's ring 2(p-1)α + 2n(p-1)/p·β.
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <tuple>
#include <unordered_set>
#include <vector>

#include "algorithms/ht.hpp"
#include "algorithms/ht_device.hpp"
#include "algorithms/route.hpp"
#include "algorithms/schedule.hpp"
#include "algorithms/schedule_exec.hpp"
#include "base/log.hpp"
#include "core/cuda_driver.hpp"
#include "core/datatypes.hpp"
#include "core/engine_request.hpp"
#include "core/errors.hpp"
#include "core/pmpi_call.hpp"
#include "core/private_comm.hpp"
#include "core/progress.hpp"
#include "core/requests.hpp"
#include "core/runtime.hpp"
#include "core/service.hpp"
#include "core/staging.hpp"

namespace streamcoll {
namespace {

using sched::Algo;

// The algorithm of a call with its parameters (the tuning table's algo= and chunk=).
struct AlgoSel {
  Algo algo = Algo::rd;
  uint64_t chunk_bytes = 0;  // ccube: bytes per chunk (0: kCcubeChunk)
  bool operator==(Algo a) const { return algo == a; }
  bool operator!=(Algo a) const { return algo != a; }
};

// ccube's chunk when the table gives none (docs/guide.md, "C-Cube").
constexpr uint64_t kCcubeChunk = 256 * 1024;

// ---------------------------------------------------------------------------------------
// Per communicator: the private duplicate, tags, the order of MPI-collective starts, and a
// cache of schedules. Shared by the context and the operations in flight, so that an
// operation outlives MPI_Comm_free of the application's communicator.

// The side streams of communicator `id` (one per GPU it used) are destroyed: it is gone.
void drop_side_streams(uint64_t id);
std::atomic<uint64_t> g_next_comm_id{0};

struct HtComm : PrivateComm {
  const uint64_t id = g_next_comm_id.fetch_add(1);  // names its side streams
  ~HtComm() { drop_side_streams(id); }
  uint64_t next_ticket = 0;    // application thread: MPI-collective starts, in call order
  std::atomic<uint64_t> turn{0};  // the ticket allowed to start its MPI collective now
  /// The communicator context's (CommContext::async_error): where a stream-ordered
  /// operation's failure found on the engine goes, for the next call to report.
  std::shared_ptr<std::atomic<int>> async_error;

  /// The node of every rank (CommContext::node_of), for ccube's tree.
  std::vector<int> node_of;

  std::mutex cache_mu;
  std::map<std::tuple<int, int, int, uint64_t, bool, uint64_t>,
           std::shared_ptr<const sched::Schedule>>
      cache;

  std::shared_ptr<const sched::Schedule> schedule(const sched::Params& p) {
    auto key = std::make_tuple(static_cast<int>(p.coll), static_cast<int>(p.algo), p.root,
                               p.count, p.in_place, p.chunk);
    std::lock_guard<std::mutex> lock(cache_mu);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    if (cache.size() >= 256) cache.clear();
    auto s = std::make_shared<const sched::Schedule>(sched::build(p));
    cache.emplace(key, s);
    return s;
  }
};

struct HtState final : RouteState {
  std::shared_ptr<HtComm> comm;
};

// What the host collective of one call needs, in the schedule's terms.
struct HostCall {
  Coll coll;
  AlgoSel algo;
  int root = 0;
  uint64_t count = 0;  // schedule.hpp's Params::count
  MPI_Datatype type;
  int extent = 0;
  MPI_Op op = MPI_OP_NULL;
  const void* send = nullptr;  // null: in place
  void* recv = nullptr;
  bool tainted = false;  // this rank's input is unusable (a local failure before the collective)
  // algo=mpi: exchange the taint with the collective (every rank alike: the agreed facts
  // say GPU memory). Without it, a tainted rank aborts the job (abort_lost_input): the
  // agreed facts said host memory, and this rank's GPU input was lost.
  bool status = false;
};

// The schedule's parameters for `h` on `hc`.
sched::Params schedule_params(const HostCall& h, const HtComm& hc) {
  sched::Params p{h.coll, h.algo.algo, hc.rank, hc.size, h.root, h.count, h.send == nullptr};
  if (h.algo == Algo::ccube) {
    p.chunk = std::max<uint64_t>(1, h.algo.chunk_bytes / static_cast<uint64_t>(std::max(h.extent, 1)));
    p.node_of = &hc.node_of;
  }
  return p;
}

// The error a rank reports after its host collective: its own failure first, else a
// peer's that reached it (taint), else success.
int outcome(int own, int collective, bool tainted) {
  if (own != MPI_SUCCESS) return own;
  if (collective != MPI_SUCCESS) return collective;
  if (tainted) {
    log_error("ht: another rank's part of this collective failed; this rank's result is "
              "not valid");
    return error_code(Failure::peer);
  }
  return MPI_SUCCESS;
}

// Starts the MPI's own non-blocking collective for `h` on `comm`.
int start_mpi(const HostCall& h, MPI_Comm comm, MPI_Request* req) {
  const void* s = h.send ? h.send : MPI_IN_PLACE;
  const int n = static_cast<int>(h.count);
  switch (h.coll) {
    case Coll::allreduce: return PMPI_Iallreduce(s, h.recv, n, h.type, h.op, comm, req);
    case Coll::reduce: return PMPI_Ireduce(s, h.recv, n, h.type, h.op, h.root, comm, req);
    case Coll::bcast: return PMPI_Ibcast(h.recv, n, h.type, h.root, comm, req);
    case Coll::allgather:
      return PMPI_Iallgather(s, h.send ? n : 0, h.type, h.recv, n, h.type, comm, req);
    case Coll::reduce_scatter_block:
      return PMPI_Ireduce_scatter_block(s, h.recv, n, h.type, h.op, comm, req);
    default: return MPI_ERR_INTERN;
  }
}

// The MPI's own blocking collective for `h` on `comm`. (Blocking, as the host path's
// run_pmpi is: ranks of one call may take either, and MPI matches a blocking collective
// with a blocking one only.)
int call_mpi(const HostCall& h, MPI_Comm comm) {
  const void* s = h.send ? h.send : MPI_IN_PLACE;
  const int n = static_cast<int>(h.count);
  switch (h.coll) {
    case Coll::allreduce: return PMPI_Allreduce(s, h.recv, n, h.type, h.op, comm);
    case Coll::reduce: return PMPI_Reduce(s, h.recv, n, h.type, h.op, h.root, comm);
    case Coll::bcast: return PMPI_Bcast(h.recv, n, h.type, h.root, comm);
    case Coll::allgather:
      return PMPI_Allgather(s, h.send ? n : 0, h.type, h.recv, n, h.type, comm);
    case Coll::reduce_scatter_block:
      return PMPI_Reduce_scatter_block(s, h.recv, n, h.type, h.op, comm);
    default: return MPI_ERR_INTERN;
  }
}

// The host collective of `h` on the calling thread, blocking: a schedule on hc's private
// communicator, or the MPI's collective on the application's `comm` (in call order there;
// with h.status followed by the failure flags' allreduce there). Returns the MPI's error,
// or, for a rank whose result a tainted peer spoiled, Failure::peer (outcome()).
int run_blocking(const HostCall& h, HtComm& hc, MPI_Comm comm) {
  if (h.algo == Algo::mpi) {
    if (h.tainted && !h.status) abort_lost_input(comm, "ht", error_code(Failure::cuda));
    const int rc = call_mpi(h, comm);
    const bool any = h.status && service::any(h.tainted, comm);
    return outcome(MPI_SUCCESS, rc, any);
  }
  const sched::Params p = schedule_params(h, hc);
  sched::ScheduleRun run(hc.schedule(p), h.send, h.recv, h.type, h.extent, h.op, hc.p2p,
                         hc.tag());
  if (h.tainted) run.taint();
  const int rc = run.run();
  return outcome(MPI_SUCCESS, rc, run.tainted());
}

// The host collective of one operation, advanced one non-blocking step at a time: a
// schedule, or the MPI's collective started in ticket order.
// With h.status (algo=mpi), the failure flags' MPI_Iallreduce starts with the collective,
// at the same ticket, so every rank starts the two in the same order.
class HostPart {
 public:
  HostPart(std::shared_ptr<HtComm> c, const HostCall& h) : comm_(std::move(c)), h_(h) {
    if (h.algo == Algo::mpi) {
      ticket_ = comm_->next_ticket++;
    } else {
      const sched::Params p = schedule_params(h, *comm_);
      run_ = std::make_unique<sched::ScheduleRun>(comm_->schedule(p), h.send, h.recv, h.type,
                                                  h.extent, h.op, comm_->p2p, comm_->tag());
      if (h.tainted) run_->taint();
    }
  }
  ~HostPart() {
    for (MPI_Request& r : reqs_)
      if (r != MPI_REQUEST_NULL) PMPI_Wait(&r, MPI_STATUS_IGNORE);
  }

  /// This rank's input turned out unusable (a failure on the stream before the
  /// collective): called before the first step().
  void taint() {
    h_.tainted = true;
    if (run_) run_->taint();
  }
  /// After *done: whether the result is spoiled (this rank's or a peer's taint).
  bool tainted() const { return run_ ? run_->tainted() : (h_.tainted || flags_.agreed != 0); }

  /// Non-blocking; *done when finished. Returns an MPI error code.
  int step(bool* done) {
    if (run_) return run_->step(done);
    *done = false;
    if (!started_) {
      if (comm_->turn.load(std::memory_order_acquire) != ticket_) return MPI_SUCCESS;
      if (h_.tainted && !h_.status)
        abort_lost_input(comm_->p2p, "ht", error_code(Failure::cuda));
      int rc = start_mpi(h_, comm_->p2p, &reqs_[0]);
      if (h_.status) service::start_any(h_.tainted, comm_->p2p, &flags_, &reqs_[1]);
      started_ = true;
      comm_->turn.fetch_add(1, std::memory_order_release);
      if (rc != MPI_SUCCESS) {
        *done = true;
        return rc;
      }
    }
    int flag = 0;
    int rc = PMPI_Testall(2, reqs_, &flag, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS || flag) *done = true;
    return rc;
  }

 private:
  std::shared_ptr<HtComm> comm_;
  HostCall h_;
  std::unique_ptr<sched::ScheduleRun> run_;
  uint64_t ticket_ = 0;
  bool started_ = false;
  MPI_Request reqs_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};  // the collective, the flags
  service::Flag flags_;  // the failure flags' exchange
};

class HostTask final : public progress::Task {
 public:
  HostTask(std::unique_ptr<HostPart> part, HostRequest* req)
      : part_(std::move(part)), req_(req) {}
  const char* what() const override { return "ht: host collective (progress thread)"; }
  bool step() override {
    bool done = false;
    int rc = part_->step(&done);
    if (!done) return false;
    rc = outcome(MPI_SUCCESS, rc, part_->tainted());
    part_.reset();  // its MPI request is finished before the application hears of it
    req_->finish(rc);
    return true;
  }

 private:
  std::unique_ptr<HostPart> part_;
  HostRequest* req_;  // deleted by MPI once complete and waited for
};

// ---------------------------------------------------------------------------------------
// The call in the schedule's terms.

// ccube is an allreduce: the other collectives of an algo=ccube rule take the default.
AlgoSel choose_algo(const CollArgs& a, const config::RouteChoice& choice, uint64_t bytes,
                    int size) {
  AlgoSel sel{sched::default_algo(a.coll, bytes, size), 0};
  if (auto v = choice.param("algo")) {
    if (*v == "rd") sel.algo = Algo::rd;
    if (*v == "rabenseifner") sel.algo = Algo::rabenseifner;
    if (*v == "ring") sel.algo = Algo::ring;
    if (*v == "mpi") sel.algo = Algo::mpi;
    if (*v == "ccube" && a.coll == Coll::allreduce) sel.algo = Algo::ccube;
  }
  if (sel.algo == Algo::ccube) {
    auto c = choice.param("chunk");
    auto v = c ? config::parse_size(*c) : std::nullopt;
    sel.chunk_bytes = v && *v > 0 ? *v : kCcubeChunk;
  }
  return sel;
}

MPI_Datatype call_type(const CollArgs& a) {
  return a.coll == Coll::allgather ? a.recvtype : a.datatype;
}

uint64_t call_count(const CollArgs& a) {
  return a.coll == Coll::allgather ? static_cast<uint64_t>(a.recvcount)
                                   : static_cast<uint64_t>(a.count);
}

// Bytes per element. The route only gets predefined contiguous types (core/eligibility),
// whose extent is their size: the datatype table has it, no MPI call needed.
int element_size(const CollArgs& a) {
  const TypeInfo* t = find_type(call_type(a));
  return t ? t->size : 0;
}

// The host collective of a call: on the caller's buffers, or, with `staging`, in place on
// a staging buffer that holds the call's whole vector (for reduce on a non-root rank the
// staging buffer is the input and there is no result).
HostCall host_call(const CollArgs& a, AlgoSel algo, int rank, int extent, void* staging = nullptr) {
  HostCall h;
  h.coll = a.coll;
  h.algo = algo;
  h.root = a.root;
  h.count = call_count(a);
  h.type = call_type(a);
  h.extent = extent;
  h.op = a.op;
  if (staging) {
    h.recv = staging;
    if (a.coll == Coll::reduce) {
      // Input in the first half, the root's result in the second (plan_copies): no
      // MPI_IN_PLACE of ours reaches the MPI, which MPICH 4.0-4.1 cannot take at a root
      // other than 0 (reduce_in_place_broken).
      h.send = staging;
      h.recv = rank == a.root ? static_cast<char*>(staging) + h.count * static_cast<uint64_t>(extent)
                              : nullptr;
    }
    return h;
  }
  h.recv = a.recvbuf;
  const bool in_place = a.sendbuf == MPI_IN_PLACE && (a.coll != Coll::reduce || rank == a.root);
  h.send = (a.coll == Coll::bcast || in_place) ? nullptr : a.sendbuf;
  if (a.coll == Coll::reduce && rank != a.root) h.recv = nullptr;  // insignificant
  return h;
}

// ---------------------------------------------------------------------------------------
// GPU buffers.

#if STREAMCOLL_HAVE_CUDA

// The GPU side (pinned pool, side streams, events, the spin-wait kernel): algorithms/ht_device.
using ht_device::Device;
using ht_device::DeviceSide;

// The stream-ordered part of one call on GPU buffers: staging buffer, flag, events.
struct Staging {
  Device* gpu = nullptr;
  void* host = nullptr;          // pinned staging buffer (the schedule's in-place vector)
  uint32_t* flag = nullptr;
  CUdeviceptr dev_flag = 0;
  CUevent copied_in = nullptr;   // after the D2H copy
  CUevent copied_out = nullptr;  // after the H2D copy (the stream is past the wait)
  bool flag_written = false;

  void release() {
    DeviceSide& ds = DeviceSide::get();
    if (flag && !flag_written) __atomic_store_n(flag, 1u, __ATOMIC_RELEASE);  // never strand S
    if (flag) ds.pool.put_flag(flag, dev_flag);
    ds.pool.put(host);
    if (gpu) {
      ds.put_event(*gpu, copied_in);
      ds.put_event(*gpu, copied_out);
    }
    flag = nullptr;
    host = nullptr;
    copied_in = copied_out = nullptr;
  }
};

// Where a call's data lies in its pinned staging buffer (core/staging.hpp): the vector
// host_call runs on, the root's reduce result after the input (the host schedules do not
// reduce in place). A collective ht takes always has one.
staging::Layout plan_copies(const CollArgs& a, int rank, int size) {
  staging::Layout l;
  staging::layout(a, rank, size, &l, /*result_apart=*/true);
  return l;
}

// A stream-ordered operation, advanced by the engine: wait for the D2H copy, run the host
// collective, release the stream, wait for the H2D copy, recycle.
class DeviceTask;

// MPI_I* on GPU buffers. With a stream: MPI_Wait makes the application's stream wait for
// the side stream's copy-out event and completes at once (the host does not wait).
// Without: the engine completes it when the result is in the GPU buffer.
class DeviceRequest final : public ManagedRequest {
 public:
  DeviceRequest(bool stream_ordered, CUstream app_stream, Device* gpu, CUevent done)
      : stream_ordered_(stream_ordered), app_stream_(app_stream), gpu_(gpu), done_(done) {}
  ~DeviceRequest() override { DeviceSide::get().put_event(*gpu_, done_); }

  void on_wait() override {
    if (stream_ordered_)
      join();
    else
      done_signal_.wait();
  }
  void on_test() override { join(); }  // a stream-ordered request is complete once joined
  void on_free() override {  // the operation must still complete, as for MPI_Wait
    if (stream_ordered_)
      join();
    else
      done_signal_.wait();
  }
  int error() const override { return err_.load(std::memory_order_acquire); }
  /// Classic mode only: the engine's report.
  void finish(int rc) {
    err_.store(rc, std::memory_order_release);
    done_signal_.signal();
    complete();
  }

 private:
  void join() {
    if (!stream_ordered_ || joined_.exchange(true)) return;
    cuda::ScopedContext scope(gpu_->ctx);
    if (const int rc = SC_CU_CHECK(cuda::driver().cuStreamWaitEvent(app_stream_, done_, 0),
                                   "ht: cuStreamWaitEvent (MPI_Wait)"))
      err_.store(rc);
    complete();
  }

  const bool stream_ordered_;
  CUstream app_stream_;
  Device* gpu_;
  CUevent done_;  // owned: recorded after the H2D copy on the side stream
  std::atomic<bool> joined_{false};
  std::atomic<int> err_{MPI_SUCCESS};
  Completion done_signal_;
};

class DeviceTask final : public progress::Task {
 public:
  DeviceTask(std::shared_ptr<HtComm> comm, Staging st, std::unique_ptr<HostPart> part,
             DeviceRequest* req, std::atomic<int>* stage_tasks)
      : comm_(std::move(comm)), st_(st), part_(std::move(part)), req_(req), stage_tasks_(stage_tasks) {
    if (stage_tasks_) stage_tasks_->fetch_add(1, std::memory_order_relaxed);
  }
  const char* what() const override {
    return "ht: host collective of a GPU call (progress thread)";
  }

  bool step() override {
    const cuda::Driver& d = cuda::driver();
    cuda::ScopedContext scope(st_.gpu->ctx);
    if (phase_ == 0) {
      CUresult r = SC_CU_RESULT(d.cuEventQuery(st_.copied_in));
      if (r == CUDA_ERROR_NOT_READY) return false;
      if (r != CUDA_SUCCESS) {  // no input: take part all the same, tainted
        own_ = SC_CU_FAIL(r, "ht: D2H copy");
        part_->taint();
        // Whatever the copy did, it must be over before the host collective writes the
        // staging buffer (a driver with a sticky error runs nothing more).
        d.cuEventSynchronize(st_.copied_in);
      }
      phase_ = 1;
    }
    if (phase_ == 1) {
      bool done = false;
      int rc = part_->step(&done);
      if (!done) return false;
      rc = outcome(own_, rc, part_->tainted());
      part_.reset();
      // A stream-ordered failure is recorded before the stream goes on, so that a call
      // the application makes once its stream is through reports it.
      if (rc != MPI_SUCCESS && !req_) report_async(rc);
      // Let the stream go on: it copies the staging buffer back (a valid result, or, on
      // failure, whatever is there: the caller hears of the error).
      __atomic_store_n(st_.flag, 1u, __ATOMIC_RELEASE);
      st_.flag_written = true;
      if (rc != MPI_SUCCESS) return finish(rc);
      phase_ = 2;
    }
    CUresult r = SC_CU_RESULT(d.cuEventQuery(st_.copied_out));
    if (r == CUDA_ERROR_NOT_READY) return false;
    return finish(SC_CU_CHECK(r, "ht: H2D copy"));
  }

  /// For a task the engine never took: lets the stream go on, recycles, reports `rc`.
  void abandon(int rc) {
    cuda::ScopedContext scope(st_.gpu->ctx);
    finish(rc);
  }

 private:
  bool finish(int rc) {
    part_.reset();
    // After an error the stream may still be copying: wait for it before recycling.
    if (rc != MPI_SUCCESS && st_.copied_out) {
      if (!st_.flag_written) {
        __atomic_store_n(st_.flag, 1u, __ATOMIC_RELEASE);
        st_.flag_written = true;
      }
      cuda::driver().cuEventSynchronize(st_.copied_out);
    }
    st_.release();
    if (req_) req_->finish(rc);
    else if (rc != MPI_SUCCESS) report_async(rc);
    // The last use of this call's state: its stage caller may go on (CallEnv::stage_tasks).
    if (stage_tasks_) stage_tasks_->fetch_sub(1, std::memory_order_release);
    return true;
  }

  // Stream-ordered: the call returned long ago; a later call on the communicator reports
  // it (once). Later calls themselves are unaffected.
  void report_async(int rc) {
    if (reported_) return;
    reported_ = true;
    log_error("ht: a stream-ordered operation failed (MPI error %d); the next call on the "
              "communicator reports it", rc);
    int none = MPI_SUCCESS;
    comm_->async_error->compare_exchange_strong(none, rc);
  }

  std::shared_ptr<HtComm> comm_;
  Staging st_;
  std::unique_ptr<HostPart> part_;
  DeviceRequest* req_;  // classic MPI_I* only: null for stream-ordered calls
  std::atomic<int>* stage_tasks_;  // CallEnv::stage_tasks, or null
  int phase_ = 0;
  int own_ = MPI_SUCCESS;  // this rank's failure before the collective
  bool reported_ = false;
};

// Cleans up, on the engine, after a failure on a stream the host must not wait for (the
// application's attached stream, or one ordered after it: it may hold work the
// application releases only later): once the copy in is over (its event), the flag lets
// the stream on; once the copy back is over (its event), everything goes back to the
// pools. What no event can tell the stream is through with (a flag it may still wait on,
// a staging buffer it may still read) stays allocated: a failure costs that much.
class UnwindTask final : public progress::Task {
 public:
  UnwindTask(Staging st, bool enqueued, bool recorded_in, bool held, bool recorded_out)
      : st_(st), enqueued_(enqueued), in_(recorded_in), held_(held), out_(recorded_out) {}
  bool step() override {
    const cuda::Driver& d = cuda::driver();
    cuda::ScopedContext scope(st_.gpu->ctx);
    if (in_ && d.cuEventQuery(st_.copied_in) == CUDA_ERROR_NOT_READY) return false;
    if (held_ && !st_.flag_written) {
      __atomic_store_n(st_.flag, 1u, __ATOMIC_RELEASE);
      st_.flag_written = true;
    }
    if (out_ && d.cuEventQuery(st_.copied_out) == CUDA_ERROR_NOT_READY) return false;
    if (out_ || !enqueued_ || (in_ && !held_)) {
      st_.release();  // the stream is through with all of it
    } else {  // leave what the stream may still use; the events can go
      DeviceSide& ds = DeviceSide::get();
      ds.put_event(*st_.gpu, st_.copied_in);
      ds.put_event(*st_.gpu, st_.copied_out);
    }
    return true;
  }

 private:
  Staging st_;
  bool enqueued_, in_, held_, out_;
};

// After a failure: the stream's use of the staging objects must be over before they are
// recycled. `may_block`: the stream is ours, ordered after nothing the application holds
// (classic calls): wait here; otherwise the engine waits (UnwindTask).
void unwind_staged(Staging* st, CUstream stream, bool may_block, bool enqueued,
                   bool recorded_in, bool held, bool recorded_out) {
  const cuda::Driver& d = cuda::driver();
  if (may_block || !enqueued) {
    if (held) {
      if (recorded_in) d.cuEventSynchronize(st->copied_in);
      __atomic_store_n(st->flag, 1u, __ATOMIC_RELEASE);
      st->flag_written = true;
    }
    if (enqueued) d.cuStreamSynchronize(stream);
    st->release();
    return;
  }
  auto* task = new UnwindTask(*st, enqueued, recorded_in, held, recorded_out);
  if (!progress::submit(task)) delete task;  // no engine (after MPI_Finalize began): left as is
  *st = Staging{};
}

// Enqueues the copies and the wait on `stream`. Returns an MPI error code; on failure
// everything acquired is released (unwind_staged).
int enqueue_staged(Staging* st, const staging::Layout& l, void* recvbuf, CUstream stream,
                   config::HtWait mode, bool may_block) {
  DeviceSide& ds = DeviceSide::get();
  const cuda::Driver& d = cuda::driver();
  // What is on the stream so far: on a failure, the copy in must be over before the flag
  // lets the stream read the staging buffer, and the stream through before the buffers
  // are recycled (or the caller's freed).
  bool enqueued = false, recorded = false, held = false;
  auto unwind = [&](int rc) {
    unwind_staged(st, stream, may_block, enqueued, recorded, held, false);
    return rc;
  };
  st->host = ds.pool.get(l.scratch);
  if (!st->host)
    return unwind(SC_CU_FAIL(CUDA_ERROR_OUT_OF_MEMORY, "ht: cuMemHostAlloc (staging buffer)"));
  if (!ds.pool.get_flag(&st->flag, &st->dev_flag))
    return unwind(SC_CU_FAIL(CUDA_ERROR_OUT_OF_MEMORY, "ht: cuMemHostAlloc (flag)"));
  st->copied_in = ds.event(*st->gpu);
  st->copied_out = ds.event(*st->gpu);
  if (!st->copied_in || !st->copied_out)
    return unwind(SC_CU_FAIL(CUDA_ERROR_UNKNOWN, "ht: cuEventCreate"));
  const auto buf = reinterpret_cast<CUdeviceptr>(st->host);
  if (const int rc = staging::copy_in(l, buf, stream)) return unwind(rc);
  enqueued = l.in_bytes > 0;
  if (const int rc = SC_CU_CHECK(d.cuEventRecord(st->copied_in, stream), "ht: cuEventRecord"))
    return unwind(rc);
  enqueued = recorded = true;
  if (const int rc = SC_CU_CHECK(ds.hold_stream(*st->gpu, stream, st->dev_flag, mode),
                                 "ht: holding the stream (cuStreamWaitValue32 / spin kernel)"))
    return unwind(rc);
  held = true;  // from here the stream waits on the flag: bail() releases it
  if (const int rc = staging::copy_out(l, buf, recvbuf, stream)) return unwind(rc);
  if (const int rc = SC_CU_CHECK(d.cuEventRecord(st->copied_out, stream), "ht: cuEventRecord"))
    return unwind(rc);
  return MPI_SUCCESS;
}

// Classic semantics, blocking: copy in, collective on this thread, copy out; all ordered
// with the legacy default stream, as a CUDA-aware MPI's blocking call would be. Without
// pinned memory the staging buffer is pageable (slower copies, same result); a failed
// copy in makes this rank take part tainted.
int run_device_classic(const CollArgs& a, HtComm& hc, AlgoSel algo, int extent, Device& gpu,
                       bool status) {
  const cuda::Driver& d = cuda::driver();
  DeviceSide& ds = DeviceSide::get();
  cuda::ScopedContext scope(gpu.ctx);
  const staging::Layout l = plan_copies(a, hc.rank, hc.size);
  void* host = ds.pool.get(l.scratch);
  std::vector<char> pageable;
  if (!host) {
    SC_WARN("ht: no pinned memory for %llu bytes of staging; using pageable memory",
            static_cast<unsigned long long>(l.scratch));
    pageable.resize(l.scratch ? l.scratch : 1);
  }
  char* h = host ? static_cast<char*>(host) : pageable.data();
  CUstream legacy = cuda::classic_stream();  // the legacy default stream, as a rule
  const auto buf = reinterpret_cast<CUdeviceptr>(h);
  int own = staging::copy_in(l, buf, legacy);
  if (own == MPI_SUCCESS && l.in_bytes) own = SC_CU_CHECK(d.cuStreamSynchronize(legacy), "ht: D2H copy");
  // Every rank runs the collective, even after a local copy failure (tainted), so none
  // hangs and none takes this rank's garbage for data.
  HostCall hcall = host_call(a, algo, hc.rank, extent, h);
  hcall.tainted = own != MPI_SUCCESS;
  hcall.status = status;
  int rc = run_blocking(hcall, hc, a.comm);
  if (own != MPI_SUCCESS) rc = own;
  if (rc == MPI_SUCCESS && !l.out.empty()) {
    rc = staging::copy_out(l, buf, a.recvbuf, legacy);
    if (rc == MPI_SUCCESS) rc = SC_CU_CHECK(d.cuStreamSynchronize(legacy), "ht: H2D copy");
  }
  if (host) ds.pool.put(host);
  return rc;
}

// This rank's part of a host collective whose input it could not produce: it runs on
// scratch memory, tainted, so that the other ranks are neither left waiting for it nor
// handed garbage as data, and ends by itself; nothing waits for it.
class StandInTask final : public progress::Task {
 public:
  StandInTask(const std::shared_ptr<HtComm>& hc, const CollArgs& a, AlgoSel algo, int extent,
              uint64_t bytes, bool status)
      : scratch_(bytes ? bytes : 1) {
    HostCall h = host_call(a, algo, hc->rank, extent, scratch_.data());
    h.tainted = true;
    h.status = status;
    part_ = std::make_unique<HostPart>(hc, h);  // on the application thread: ticket order
  }
  bool step() override {
    bool done = false;
    part_->step(&done);
    return done;
  }

 private:
  std::vector<char> scratch_;
  std::unique_ptr<HostPart> part_;
};

// A local failure (rc) before this rank's part of a host collective reached the engine:
// the part runs anyway, tainted, on the engine (never blocking the caller: a non-blocking
// start must not wait for other ranks), or on this thread when there is no engine.
// Returns `rc`.
int stand_in(const CollArgs& a, const std::shared_ptr<HtComm>& hc, AlgoSel algo, int extent,
             uint64_t bytes, bool status, int rc) {
  // (Without failure flags the part could not tell the others: the job ends here, before
  // the call returns.)
  if (algo == Algo::mpi && !status) abort_lost_input(a.comm, "ht", rc);
  auto* task = new StandInTask(hc, a, algo, extent, bytes, status);
  if (!progress::submit(task)) {
    while (!task->step()) {
    }
    delete task;
  }
  if (a.nonblocking && a.request) *a.request = MPI_REQUEST_NULL;
  return rc;
}

// Stream-ordered (env.has_stream) or non-blocking: through the engine.
int run_device_async(const CollArgs& a, const std::shared_ptr<HtComm>& hc, AlgoSel algo,
                     int extent, Device& gpu, const CallEnv& env, config::HtWait mode,
                     bool status) {
  const cuda::Driver& d = cuda::driver();
  DeviceSide& ds = DeviceSide::get();
  cuda::ScopedContext scope(gpu.ctx);
  DeviceSide::Checked checked(ds, gpu);
  const staging::Layout l = plan_copies(a, hc->rank, hc->size);

  // The stream the work goes on: the attached stream for a blocking call; the side
  // stream, after the attached (or legacy) stream, for MPI_I*.
  CUstream app = env.has_stream ? static_cast<CUstream>(env.stream) : cuda::classic_stream();
  CUstream work = app;
  CUevent start = nullptr;
  if (a.nonblocking) {
    work = ds.side(gpu, hc->id);
    if (!work)
      return stand_in(a, hc, algo, extent, l.scratch, status,
                      fail(Failure::cuda, "ht: cuStreamCreate (side stream) failed"));
    start = ds.event(gpu);
    if (!start)
      return stand_in(a, hc, algo, extent, l.scratch, status,
                      fail(Failure::cuda, "ht: cuEventCreate failed"));
    int rc = SC_CU_CHECK(d.cuEventRecord(start, app), "ht: ordering the side stream");
    if (rc == MPI_SUCCESS)
      rc = SC_CU_CHECK(d.cuStreamWaitEvent(work, start, 0), "ht: ordering the side stream");
    ds.put_event(gpu, start);  // recorded and waited on: reusable
    if (rc != MPI_SUCCESS) return stand_in(a, hc, algo, extent, l.scratch, status, rc);
  }
  Staging st;
  st.gpu = &gpu;
  // The host may wait for the work stream only in classic mode (ours, after the legacy
  // stream); never for the application's attached stream.
  const bool may_block = !env.has_stream;
  if (int rc = enqueue_staged(&st, l, a.recvbuf, work, mode, may_block); rc != MPI_SUCCESS)
    return stand_in(a, hc, algo, extent, l.scratch, status, rc);

  DeviceRequest* req = nullptr;
  if (a.nonblocking) {
    // The request's own event (the task recycles the staging events independently).
    CUevent done = ds.event(gpu);
    if (const int rc = SC_CU_CHECK(done ? d.cuEventRecord(done, work) : CUDA_ERROR_UNKNOWN,
                                   "ht: cuEventRecord (request)")) {
      ds.put_event(gpu, done);
      unwind_staged(&st, work, may_block, true, true, true, true);  // let the stream go on
      return stand_in(a, hc, algo, extent, l.scratch, status, rc);
    }
    req = new DeviceRequest(env.has_stream, app, &gpu, done);
    if (int rc = start_request(req, a.request); rc != MPI_SUCCESS) {
      unwind_staged(&st, work, may_block, true, true, true, true);
      return stand_in(a, hc, algo, extent, l.scratch, status, rc);  // start_request deleted req
    }
  }
  HostCall hcall = host_call(a, algo, hc->rank, extent, st.host);
  hcall.status = status;
  auto part = std::make_unique<HostPart>(hc, hcall);
  // A stream-ordered request is completed by MPI_Wait itself (and may be freed by MPI
  // before the engine is done): the engine reports to it only in classic mode.
  DeviceRequest* report_to = env.has_stream ? nullptr : req;
  auto* task = new DeviceTask(hc, st, std::move(part), report_to, env.stage_tasks);
  if (!progress::submit(task)) {  // only after MPI_Finalize began: run it here
    log_error("ht: the progress engine is stopped; running the operation on this thread");
    while (!task->step()) {
    }
    delete task;
  }
  return MPI_SUCCESS;
}

void drop_side_streams(uint64_t id) { DeviceSide::get().drop(id); }

#else
void drop_side_streams(uint64_t) {}
#endif  // STREAMCOLL_HAVE_CUDA

#if STREAMCOLL_HAVE_CUDA

// The GPU whose context carries this rank's copies: the device buffer's, else the current
// context's (managed memory), else device 0.
int gpu_of(const CallEnv& env) {
  if (env.device >= 0) return env.device;
  const cuda::Driver& d = cuda::driver();
  CUcontext current = nullptr;
  CUdevice dev = -1;
  if (d.usable && SC_CU_RESULT(d.cuCtxGetCurrent(&current)) == CUDA_SUCCESS && current &&  // probes
      SC_CU_RESULT(d.cuCtxGetDevice(&dev)) == CUDA_SUCCESS)
    return dev;
  return 0;
}

#endif  // STREAMCOLL_HAVE_CUDA (continued)

// ---------------------------------------------------------------------------------------

class HtRoute final : public Route {
 public:
  RouteId id() const override { return RouteId::ht; }

  // A rank stages GPU memory through the host and runs classic or stream-ordered on its
  // own (algo=mpi through the engine on every rank: CallEnv::adopted), with the failure
  // flags the agreed kind says: every reduction. Bcast and allgather only stream-ordered
  // (a repacked rank's lost input travels as a taint of the host collective); host calls
  // forced onto ht keep agreeing at each call, so that one whose datatype suits only the
  // MPI still goes there unchanged rather than repacked.
  bool adapts(const CollArgs& a, CommContext&, const config::RouteChoice&,
              const CallEnv& agreed) override {
    return takes_op(a.coll) ||
           (agreed.has_stream && (a.coll == Coll::bcast || a.coll == Coll::allgather));
  }

  bool accepts(const CollArgs& a, CommContext& ctx, const config::RouteChoice& choice,
               const CallEnv& env) override {
    switch (a.coll) {
      case Coll::allreduce:
      case Coll::reduce:
      case Coll::bcast:
      case Coll::allgather:
      case Coll::reduce_scatter_block: break;
      default: return false;
    }
    (void)choice;
    const bool host = env.mem == MemKind::host || env.mem == MemKind::pinned;
    const bool device = env.mem == MemKind::device;
    if (!host && !device) return false;
    Runtime& rt = Runtime::get();
    if (!rt.thread_multiple()) {
      warn_once(no_threads_, "ht: route ht needs MPI_THREAD_MULTIPLE, and MPI runs at a lower "
                             "thread level (STREAMCOLL_THREAD_MULTIPLE=0, or the MPI cannot "
                             "provide it); its calls go to pmpi");
      return false;
    }
    // Every message of a schedule is at most the call's whole vector.
    const uint64_t elems = call_bytes(a, ctx.size, 1, 1);
    if (elems > static_cast<uint64_t>(INT_MAX)) return false;
#if !STREAMCOLL_HAVE_CUDA
    if (device) return false;
#endif
    // Whether every rank's driver can hold a stream on a flag is able_here's, agreed.
    if (!ctx.route_state[static_cast<int>(RouteId::ht)]) {
      if (!collective_point(a)) return false;  // set-up is collective: at a blocking call or a persistent init
      if (!set_up(ctx)) return false;
    }
    return true;
  }

  // GPU buffers need a driver that can hold a stream on a flag. A process with the driver
  // loaded answers for its GPU whatever this call's buffers are, so that a non-blocking
  // call on GPU memory later (routed from these agreed answers) can run here too.
  bool able_here(const CollArgs&, CommContext&, const CallEnv& local) override {
#if STREAMCOLL_HAVE_CUDA
    const cuda::Driver& d = cuda::driver();
    if (local.mem != MemKind::device && !d.usable) return true;
    if (d.usable && DeviceSide::can_hold(Runtime::get().settings().ht_wait) &&
        (local.mem != MemKind::device || local.device >= 0))
      return true;
    warn_once(no_device_, "ht: this CUDA driver cannot hold a stream on a flag "
                          "(cuStreamWaitValue32 / cuLaunchKernel); ht is off for GPU calls");
    return false;
#else
    return local.mem != MemKind::device;
#endif
  }

  int run(const CollArgs& a, CommContext& ctx, const config::RouteChoice& choice,
          const CallEnv& env) override {
    auto& st = static_cast<HtState&>(*ctx.route_state[static_cast<int>(RouteId::ht)]);
    const std::shared_ptr<HtComm>& hc = st.comm;
    const int extent = element_size(a);
    const AlgoSel algo = choose_algo(a, choice, call_bytes(a, hc->size, extent, extent), hc->size);
    // algo=mpi on GPU memory (as agreed: every rank decides alike) exchanges the ranks'
    // failure flags with the collective; schedules carry them in their messages.
    const bool status = algo == Algo::mpi && env.agreed_mem == MemKind::device;
    // A blocking call decided from earlier agreements, whose ranks may differ in stream
    // and memory: algo=mpi's forms do not match each other (the engine's collective on
    // the private duplicate in ticket order, stream-ordered; the MPI's blocking one on the
    // communicator, classic), so every rank's part goes through the engine, a rank
    // without a stream waiting for its own. A schedule's forms match (one tag per call
    // on the private duplicate, from the application thread in call order either way):
    // each rank takes its own.
    if (env.adopted && !a.nonblocking && algo == Algo::mpi && !env.has_stream)
      return run_through_engine(a, ctx, choice, env);

#if STREAMCOLL_HAVE_CUDA
    // GPU memory on this rank: device memory, and, for an MPI_I* routed from an
    // agreement this rank's buffers differ from, managed memory or a mix with host memory
    // (the copies take any pointer the driver can address; for a blocking call the
    // agreement left only device memory here).
    if (env.mem == MemKind::device || env.mem == MemKind::managed || env.mem == MemKind::mixed) {
      const staging::Layout l = plan_copies(a, hc->rank, hc->size);
      Device* gpu = DeviceSide::get().device(gpu_of(env));
      if (!gpu) {
        const int rc = fail(Failure::cuda, "ht: the buffer's GPU has no usable context");
        if (!a.nonblocking && !env.has_stream) {  // blocking: take part here, tainted
          StandInTask part(hc, a, algo, extent, l.scratch, status);
          while (!part.step()) {
          }
          return rc;
        }
        return stand_in(a, hc, algo, extent, l.scratch, status, rc);
      }
      if (!env.has_stream && !a.nonblocking)
        return run_device_classic(a, *hc, algo, extent, *gpu, status);
      return run_device_async(a, hc, algo, extent, *gpu, env,
                              Runtime::get().settings().ht_wait, status);
    }
#endif
    HostCall h = host_call(a, algo, hc->rank, extent);
    h.status = status;
    // A blocking call repacked from a derived datatype whose data this rank could not read
    // (CallEnv::input_failure): it takes part tainted, as after a failed copy of its own.
    h.tainted = env.input_failure != MPI_SUCCESS;
    if (!a.nonblocking) {
      // The MPI's own blocking call, unchanged (with a status exchange: the schedule form).
      if (algo == Algo::mpi && !status && !h.tainted) return run_pmpi(a);
      const int rc = run_blocking(h, *hc, a.comm);
      return h.tainted ? env.input_failure : rc;
    }
    auto* req = new HostRequest;
    if (int rc = start_request(req, a.request); rc != MPI_SUCCESS) {
      // No request to hand back: this rank's part still runs (tainted, on scratch), so
      // that the others finish.
      return stand_in(a, hc, algo, extent, call_bytes(a, hc->size, extent, extent), status, rc);
    }
    auto* task = new HostTask(std::make_unique<HostPart>(hc, h), req);
    if (!progress::submit(task)) {  // only after MPI_Finalize began: run it here
      while (!task->step()) {
      }
      delete task;
    }
    return MPI_SUCCESS;
  }

 private:
  // This rank's part of a blocking call run through the engine (as the MPI_I* form),
  // waited for here: classic semantics on this rank.
  int run_through_engine(const CollArgs& a, CommContext& ctx, const config::RouteChoice& choice,
                         const CallEnv& env) {
    CollArgs b = a;
    MPI_Request req = MPI_REQUEST_NULL;
    b.nonblocking = true;
    b.request = &req;
    CallEnv e = env;
    e.adopted = false;
    int rc = run(b, ctx, choice, e);
    if (req != MPI_REQUEST_NULL) {
      if (OwnedRequest* op = requests::peek(req)) {
        requests::complete_one(op);
        if (rc == MPI_SUCCESS) rc = op->error();
      }
      PMPI_Request_free(&req);  // complete: frees it at once
    }
    return rc;
  }

  static void warn_once(std::atomic<bool>& flag, const char* msg) {
    if (!flag.exchange(true)) SC_WARN("%s", msg);
  }

  // Collective over ctx.comm (a blocking call): the private duplicate.
  static bool set_up(CommContext& ctx) {
    auto hc = std::make_shared<HtComm>();
    if (!hc->open(ctx, "ht")) return false;
    hc->async_error = ctx.async_error;
    hc->node_of = ctx.node_of;
    auto state = std::make_unique<HtState>();
    state->comm = std::move(hc);
    ctx.route_state[static_cast<int>(RouteId::ht)] = std::move(state);
    return true;
  }

  std::atomic<bool> no_threads_{false};
  std::atomic<bool> no_device_{false};
};

}  // namespace

Route* ht_route();
void ht_shutdown();
extern const RouteEntry ht_entry = {ht_route, ht_shutdown};

Route* ht_route() {
  static HtRoute r;
  return &r;
}

namespace ht_stage {

void stand_in(CommContext& ctx, const CollArgs& a, const CallEnv& env) {
#if !STREAMCOLL_HAVE_CUDA
  (void)ctx, (void)a, (void)env;  // no GPU calls in this build
#else
  auto& slot = ctx.route_state[static_cast<int>(RouteId::ht)];
  if (!slot) return;
  const std::shared_ptr<HtComm>& hc = static_cast<HtState&>(*slot).comm;
  const int extent = element_size(a);
  const config::RouteChoice none{};
  const AlgoSel algo = choose_algo(a, none, call_bytes(a, hc->size, extent, extent), hc->size);
  const bool status = algo == Algo::mpi && env.agreed_mem == MemKind::device;
  const uint64_t bytes = call_bytes(a, hc->size, extent, extent);
  streamcoll::stand_in(a, hc, algo, extent, bytes, status, MPI_SUCCESS);
#endif
}

}  // namespace ht_stage

namespace ht_stream {

Streams::Streams() : copy_key_(g_next_comm_id.fetch_add(2)), hold_key_(copy_key_ + 1) {}
Streams::~Streams() {
  drop_side_streams(copy_key_);
  drop_side_streams(hold_key_);
}

#if STREAMCOLL_HAVE_CUDA
namespace {

class JoinImpl final : public Join {
 public:
  JoinImpl(Device* gpu, CUevent done) : gpu_(gpu), done_(done) {}
  ~JoinImpl() override { DeviceSide::get().put_event(*gpu_, done_); }
  int wait_on(void* app) override {
    cuda::ScopedContext scope(gpu_->ctx);
    if (const int rc = SC_CU_CHECK(cuda::driver().cuStreamWaitEvent(static_cast<CUstream>(app), done_, 0),
                                   "fusion: cuStreamWaitEvent (MPI_Wait)"))
      return rc;
    return MPI_SUCCESS;
  }

 private:
  Device* gpu_;
  CUevent done_;
};

// After finish(): waits for the copy back, reports its failure, recycles.
class TailTask final : public progress::Task {
 public:
  TailTask(Staging st, std::shared_ptr<std::atomic<int>> async_error)
      : st_(st), async_error_(std::move(async_error)) {}
  bool step() override {
    cuda::ScopedContext scope(st_.gpu->ctx);
    const CUresult r = SC_CU_RESULT(cuda::driver().cuEventQuery(st_.copied_out));
    if (r == CUDA_ERROR_NOT_READY) return false;
    if (r != CUDA_SUCCESS) {
      const int rc = SC_CU_FAIL(r, "fusion: H2D copy");
      cuda::driver().cuEventSynchronize(st_.copied_out);
      int none = MPI_SUCCESS;
      if (async_error_) async_error_->compare_exchange_strong(none, rc);
    }
    st_.release();
    return true;
  }

 private:
  Staging st_;
  std::shared_ptr<std::atomic<int>> async_error_;
};

class StageImpl final : public Stage {
 public:
  StageImpl(Staging st, std::shared_ptr<std::atomic<int>> async_error)
      : st_(st), async_error_(std::move(async_error)) {}
  ~StageImpl() override {
    if (st_.host) finish();  // never strand the hold stream
  }
  void* buffer() const override { return st_.host; }
  Input input(int* rc) override {
    if (state_ != Input::pending) {
      *rc = rc_;
      return state_;
    }
    cuda::ScopedContext scope(st_.gpu->ctx);
    const CUresult r = SC_CU_RESULT(cuda::driver().cuEventQuery(st_.copied_in));
    if (r == CUDA_ERROR_NOT_READY) return Input::pending;
    if (r != CUDA_SUCCESS) {
      rc_ = SC_CU_FAIL(r, "fusion: D2H copy");
      // Over before anything writes the buffer (a sticky error runs nothing more).
      cuda::driver().cuEventSynchronize(st_.copied_in);
      state_ = Input::failed;
    } else {
      state_ = Input::ready;
    }
    *rc = rc_;
    return state_;
  }
  void finish() override {
    if (!st_.host) return;
    __atomic_store_n(st_.flag, 1u, __ATOMIC_RELEASE);
    st_.flag_written = true;
    auto* task = new TailTask(st_, async_error_);
    st_ = Staging{};
    if (!progress::submit(task)) {  // after MPI_Finalize began: finish here
      while (!task->step()) {
      }
      delete task;
    }
  }

 private:
  Staging st_;
  std::shared_ptr<std::atomic<int>> async_error_;
  Input state_ = Input::pending;
  int rc_ = MPI_SUCCESS;
};

}  // namespace

int start(const Streams& streams, int device, void* app_stream, const void* src, void* dst,
          uint64_t bytes, std::shared_ptr<std::atomic<int>> async_error,
          std::unique_ptr<Stage>* stage, std::unique_ptr<Join>* join, bool* dst_untouched) {
  *dst_untouched = true;
  const cuda::Driver& d = cuda::driver();
  DeviceSide& ds = DeviceSide::get();
  const config::HtWait mode = Runtime::get().settings().ht_wait;
  if (!d.usable || !DeviceSide::can_hold(mode))
    return fail(Failure::cuda, "fusion: this CUDA driver cannot hold a stream on a flag");
  CallEnv where;  // the buffer's GPU, else (managed memory) the current context's
  where.device = device;
  Device* gpu = ds.device(gpu_of(where));
  if (!gpu) return fail(Failure::cuda, "fusion: the buffer's GPU has no usable context");
  cuda::ScopedContext scope(gpu->ctx);
  DeviceSide::Checked checked(ds, *gpu);
  CUstream app = static_cast<CUstream>(app_stream);
  CUstream copy = ds.side(*gpu, streams.copy_key());
  CUstream hold = ds.side(*gpu, streams.hold_key());
  if (!copy || !hold) return fail(Failure::cuda, "fusion: cuStreamCreate (side stream) failed");

  Staging st;
  st.gpu = gpu;
  CUevent start_ev = ds.event(*gpu), done = ds.event(*gpu);
  st.copied_in = ds.event(*gpu);
  st.copied_out = ds.event(*gpu);
  st.host = ds.pool.get(bytes);
  const bool flag = ds.pool.get_flag(&st.flag, &st.dev_flag);
  if (!start_ev || !done || !st.copied_in || !st.copied_out || !st.host || !flag) {
    ds.put_event(*gpu, start_ev);
    ds.put_event(*gpu, done);
    if (!flag) st.flag = nullptr;
    st.release();  // nothing enqueued
    return fail(Failure::cuda, "fusion: no events or pinned memory for a stream-ordered call");
  }
  // What is on the streams so far decides how a failure unwinds (unwind_staged).
  bool enqueued = false, recorded_in = false, held = false, recorded_out = false;
  auto bail = [&](int rc) {  // rc: the failure, logged where it arose
    ds.put_event(*gpu, start_ev);
    ds.put_event(*gpu, done);
    // The call then fails on this rank, or (dst untouched) the caller synchronises the
    // call's stream and runs the call another way. Either way the application may free
    // or reuse `src` and `dst` once the call is complete, and nothing orders its stream
    // after ours: nothing of ours may still read or write them then. So the hold goes (a
    // copy back then moves the input, not a result, into `dst`: the call has failed) and
    // both streams are waited for (found as races by the fake driver: the copy in still
    // reading a freed input, be62a19 and again after a failed event record).
    if (enqueued) {
      if (held) {
        __atomic_store_n(st.flag, 1u, __ATOMIC_RELEASE);
        st.flag_written = true;
      }
      d.cuStreamSynchronize(copy);
      if (held) d.cuStreamSynchronize(hold);
    }
    unwind_staged(&st, nullptr, false, false, recorded_in, held, recorded_out);  // nothing left queued
    return rc;
  };
  const char* ordering = "fusion: ordering the copy stream after the call's stream";
  if (const int rc = SC_CU_CHECK(d.cuEventRecord(start_ev, app), ordering)) return bail(rc);
  if (const int rc = SC_CU_CHECK(d.cuStreamWaitEvent(copy, start_ev, 0), ordering)) return bail(rc);
  if (bytes > 0) {
    if (const int rc = SC_CU_CHECK(d.cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(st.host),
                                                   reinterpret_cast<CUdeviceptr>(src), bytes, copy),
                                   "fusion: cuMemcpyAsync (D2H)"))
      return bail(rc);
    enqueued = true;
  }
  if (const int rc = SC_CU_CHECK(d.cuEventRecord(st.copied_in, copy), "fusion: cuEventRecord"))
    return bail(rc);
  enqueued = recorded_in = true;
  if (const int rc = SC_CU_CHECK(d.cuStreamWaitEvent(hold, st.copied_in, 0),
                                 "fusion: cuStreamWaitEvent (hold stream)"))
    return bail(rc);
  if (const int rc = SC_CU_CHECK(ds.hold_stream(*gpu, hold, st.dev_flag, mode),
                                 "fusion: holding the stream (cuStreamWaitValue32 / spin kernel)"))
    return bail(rc);
  held = true;
  if (bytes > 0) {
    if (const int rc = SC_CU_CHECK(d.cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(dst),
                                                   reinterpret_cast<CUdeviceptr>(st.host), bytes, hold),
                                   "fusion: cuMemcpyAsync (H2D)"))
      return bail(rc);
    *dst_untouched = false;  // from here a failure lets the copy back run
  }
  if (const int rc = SC_CU_CHECK(d.cuEventRecord(st.copied_out, hold), "fusion: cuEventRecord"))
    return bail(rc);
  recorded_out = true;
  if (const int rc = SC_CU_CHECK(d.cuEventRecord(done, hold), "fusion: cuEventRecord")) return bail(rc);
  ds.put_event(*gpu, start_ev);  // recorded and waited on: reusable
  *join = std::make_unique<JoinImpl>(gpu, done);
  *stage = std::make_unique<StageImpl>(st, std::move(async_error));
  return MPI_SUCCESS;
}

#else  // !STREAMCOLL_HAVE_CUDA

int start(const Streams&, int, void*, const void*, void*, uint64_t,
          std::shared_ptr<std::atomic<int>>, std::unique_ptr<Stage>*, std::unique_ptr<Join>*,
          bool* dst_untouched) {
  *dst_untouched = true;
  return MPI_ERR_OTHER;  // no GPU calls in this build
}

#endif  // STREAMCOLL_HAVE_CUDA

}  // namespace ht_stream

void ht_shutdown() {
  progress::stop();  // finishes every operation in flight
#if STREAMCOLL_HAVE_CUDA
  DeviceSide::get().shutdown();
#endif
}

}  // namespace streamcoll
