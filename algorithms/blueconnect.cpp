// Route blueconnect: hierarchical allreduce, reduce-scatter and all-gather (M. Cho et al.,
// "BlueConnect: Decomposing All-Reduce for Deep Learning on Heterogeneous Network
// Hierarchy", SysML 2019, section 3). The decomposition is algorithms/blueconnect_plan.hpp;
// the hierarchy comes from core/topology.hpp.
//
// For a call on host (or pinned) buffers, every rank runs its stages in order:
//   allreduce             reduce-scatter stages 0..k, then all-gather stages k..0, on the
//                         receive buffer (the first stage reads the send buffer)
//   reduce_scatter_block  the p input blocks permuted into tree order (blueconnect_plan.hpp)
//                         in scratch (or read where they are when rank order is tree
//                         order), reduce-scatter stages 0..k in scratch, the rank's block
//                         out: in place too, recv is written at its first block only
//   allgather             the rank's block into its tree-order slot, all-gather stages
//                         k..0, the blocks permuted into rank order
// Each stage runs on a backend of its own, per level, from the table's backend= (one
// name per level innermost first, joined by '/'; the last serves every level above the
// list's end, so one name serves them all):
//   sched  streamcoll's schedules (algorithms/schedule.hpp: recursive halving/doubling
//          for a power-of-two group, the ring otherwise; algo=ring forces rings) on
//          PMPI_ point-to-point over a private duplicate of the communicator
//   mpi    the MPI's own MPI_Ireduce_scatter / MPI_Iallgatherv on a sub-communicator per
//          level (created once per hierarchy, at a blocking call, and cached)
// Blocking calls run on the calling thread; MPI_I* calls on the progress engine
// (core/progress), as route ht's do, and need MPI_THREAD_MULTIPLE. Collectives on a
// sub-communicator start in call order on every rank (a ticket per level).
//
// Which hierarchy: the rule's hierarchy=AxB..., else STREAMCOLL_HIERARCHY, else the
// discovered one (core/topology.hpp); imposed factors whose product is not the
// communicator size, or a non-uniform discovered hierarchy, make the route decline (the
// call goes to pmpi).
//
// GPU buffers (blocking calls; backend nccl by default): each stage is a route's
// reduce-scatter or all-gather on the level's sub-communicator, in NCCL's in-place forms,
// all on one stream: the attached stream (stream semantics: the host does not wait) or,
// for a classic call, a stream of ours ordered after the legacy default stream, which the
// call then waits for. The routes: nccl; nvgroup (the level is one NVLink group: route
// nvgroup's kernel halves; this is how route nvgroup spans several groups); ht (the host
// transfer, stream-ordered like the others). An allreduce's outermost level on a route is
// one allreduce of its segment. Each level's route is set up on its sub-communicator at
// the first call that needs it, and agreed (a level whose route cannot run makes the rule
// decline on every rank). A classic call may run levels on backend sched instead (host
// transfer on the calling thread: the segment to pinned memory, the stage's schedule, the
// result back), e.g. nccl/sched. MPI_I* calls, backend mpi, and sched stages with an
// attached stream are not carried for GPU buffers (the call goes elsewhere).
//
// Failures stay collective (GPU buffers). A rank whose part of a stage fails still runs
// every later stage (with whatever its data is), so that no level waits for it: an NCCL
// stage it cannot enter aborts that level's NCCL communicator and tells the level's peers
// (route nccl's notices), an nvgroup stage gives its rounds up (the failure word), an ht
// stage runs its part on scratch marked unusable, a host stage whose input copy failed
// runs its schedule tainted; failures the levels' routes find after their stages returned
// are taken at the end of the call (classic) or by the next call (stream-ordered);
// and a call ends with one small allreduce of the ranks' outcomes over the communicator,
// so that every rank reports an error when any part failed, never a value built on one
// (stream-ordered calls: non-blocking, a peer's failure reported by a later call).
//
// Calls decided from earlier agreements (stream-ordered: Route::adapts): a rank whose
// buffers are not on the levels' GPU stages them through scratch there and runs classic
// (run_gpu_staged), one without the stream runs classic; each call waits (on the GPU) for
// the previous call of the communicator on this rank, whatever stream that used.
// Host buffers have no local failure points (schedules carry a peer's taint anyway).
#include <mpi.h>

#include <sched.h>

#include <atomic>
#include <climits>
#include <cstring>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "algorithms/blueconnect_plan.hpp"
#include "algorithms/ht.hpp"
#include "algorithms/route.hpp"
#include "algorithms/schedule.hpp"
#include "algorithms/schedule_exec.hpp"
#include "base/log.hpp"
#include "core/comm_context.hpp"
#include "core/cuda_driver.hpp"
#include "core/datatypes.hpp"
#include "core/staging.hpp"
#include "core/engine_request.hpp"
#include "core/errors.hpp"
#include "core/private_comm.hpp"
#include "core/progress.hpp"
#include "core/requests.hpp"
#include "core/runtime.hpp"
#include "core/service.hpp"
#include "core/topology.hpp"
#if STREAMCOLL_HAVE_NVGROUP
#include "algorithms/nvgroup.hpp"
#endif
#if STREAMCOLL_HAVE_NCCL
#include "algorithms/nccl.hpp"
#include "algorithms/nccl_map.hpp"
#endif

namespace streamcoll {
namespace {

enum class Backend : uint8_t { sched, mpi, nccl, nvgroup, ht };

// The backend of `level`: one per level, innermost first; the last serves every level
// above the list's end (so one name serves them all).
Backend backend_at(const std::vector<Backend>& b, int level) {
  return b[std::min(static_cast<size_t>(level), b.size() - 1)];
}

// One hierarchy in use on a communicator, with what the mpi backend needs.
struct Layout {
  topo::Hierarchy h;
  bool identity_slots = true;  // tree slot of every rank's position == rank
  std::vector<MPI_Comm> sub;   // per level, MPI_COMM_NULL until the mpi backend needs it
  std::vector<uint64_t> next_ticket;                   // application thread
  std::unique_ptr<std::atomic<uint64_t>[]> turn;       // per level: ticket allowed to start
  // GPU buffers: a route (nccl, nvgroup, ht) on each level's sub-communicator.
  enum Ready : uint8_t { unset, ready, off };
  Ready gpu = unset;  // the sub-communicators, their contexts, the device, the classic stream
  std::map<std::pair<int, Backend>, Ready> stage_ready;  // per level and backend, agreed
  std::vector<CommContext*> sub_ctx;  // the sub-communicators' contexts (owned by MPI)
#if STREAMCOLL_HAVE_CUDA
  int device = -1;
  CUdevice cudev = 0;
  CUcontext cuctx = nullptr;  // the device's primary context (retained)
  CUstream classic = nullptr; // classic calls: ordered after the legacy default stream
  CUevent legacy = nullptr;   // ... through this event (cuda::wait_for_legacy)
  // Recorded behind each GPU call's work on this rank: the next call, on another stream
  // (classic after stream-ordered, or another attached stream), waits for it, so that
  // the levels' operations of this communicator run in call order on every rank.
  CUevent last = nullptr;
  CUstream last_stream = nullptr;  // where `last` was recorded; null: not yet
  void* staging = nullptr;    // pinned host memory for host stages (classic calls only)
  uint64_t staging_bytes = 0;

  /// Pinned staging of at least `bytes`, or nullptr; the caller has cuctx current.
  char* pinned(uint64_t bytes) {
    if (bytes > staging_bytes) {
      if (staging) SC_CU_TOLERATE(cuda::driver().cuMemFreeHost(staging));
      staging = nullptr;
      staging_bytes = 0;
      if (SC_CU_RESULT(cuda::driver().cuMemHostAlloc(&staging, std::max<uint64_t>(bytes, 1), 0)) !=
          CUDA_SUCCESS)  // the caller's to handle (pageable memory)
        return staging = nullptr, nullptr;
      staging_bytes = bytes;
    }
    return static_cast<char*>(staging);
  }
#endif

  explicit Layout(topo::Hierarchy hier) : h(std::move(hier)) {
    const size_t L = static_cast<size_t>(h.levels());
    sub.assign(L, MPI_COMM_NULL);
    next_ticket.assign(L, 0);
    turn.reset(new std::atomic<uint64_t>[L]);
    for (size_t i = 0; i < L; ++i) turn[i].store(0);
    for (int r = 0; r < h.ranks(); ++r)
      identity_slots = identity_slots &&
                       bc::tree_slot(h.factors, h.position_of[static_cast<size_t>(r)]) == r;
  }
  ~Layout() {
    for (MPI_Comm& c : sub)
      if (c != MPI_COMM_NULL) PMPI_Comm_free(&c);  // frees their contexts too
#if STREAMCOLL_HAVE_CUDA
    if (classic || legacy || last || staging) {
      cuda::ScopedContext scope(cuctx);
      if (classic) SC_CU_TOLERATE(cuda::driver().cuStreamDestroy(classic));
      if (legacy) SC_CU_TOLERATE(cuda::driver().cuEventDestroy(legacy));
      if (last) SC_CU_TOLERATE(cuda::driver().cuEventDestroy(last));
      if (staging) SC_CU_TOLERATE(cuda::driver().cuMemFreeHost(staging));
    }
    if (cuctx) SC_CU_TOLERATE(cuda::driver().cuDevicePrimaryCtxRelease(cudev));
#endif
  }
  bool has_subs() const { return sub.empty() || sub[0] != MPI_COMM_NULL; }

  // Collective over p2p: one sub-communicator per level, ranks ordered by coordinate.
  bool make_subs(MPI_Comm p2p, int rank) {
    const int pos = h.position_of[static_cast<size_t>(rank)];
    int stride = 1;
    for (int l = 0; l < h.levels(); ++l) {
      const int m = h.factors[static_cast<size_t>(l)];
      const int c = (pos / stride) % m;
      if (PMPI_Comm_split(p2p, pos - c * stride, c, &sub[static_cast<size_t>(l)]) != MPI_SUCCESS) {
        sub[static_cast<size_t>(l)] = MPI_COMM_NULL;
        return false;
      }
      PMPI_Comm_set_errhandler(sub[static_cast<size_t>(l)], MPI_ERRORS_RETURN);
      stride *= m;
    }
    return true;
  }
};

// The stages of one call shape, built once and cached.
struct Prepared {
  bc::Plan plan;
  std::vector<std::shared_ptr<const sched::Schedule>> rs, ag;  // per stage (sched backend)
  std::vector<std::vector<int>> counts, displs;  // per stage, mpi backend: in elements,
                                                 // displs relative to the segment
  uint64_t scratch_elems = 0;                    // largest own block (mpi reduce-scatter)
};

// Per communicator; shared with the operations in flight, so that they outlive
// MPI_Comm_free of the application's communicator.
struct BcComm : PrivateComm {
  bool discovery_done = false;
  std::optional<topo::Hierarchy> discovered;
  std::string why_not;    // why there is no discovered hierarchy
  bool told = false;      // the reason was logged

  std::mutex mu;
  std::map<std::string, std::shared_ptr<Layout>> layouts;  // by hierarchy source
  std::map<std::tuple<const Layout*, int, uint64_t, bool, bool>, std::shared_ptr<const Prepared>>
      prepared;

  // Stream-ordered calls' outcomes (GpuCall::finish): each rank's failure flag, MAX-reduced
  // over p2p by an MPI_Iallreduce that no call waits for (a peer may sit in
  // cudaStreamSynchronize, making no MPI progress, behind work that needs this rank's next
  // call), completed at a later call of this communicator (take_outcomes, RouteState::
  // poll) or at MPI_Finalize (blueconnect_release). Every rank starts them in call order.
  struct Outcome {
    service::Flag flag;
    MPI_Request req = MPI_REQUEST_NULL;
  };
  std::mutex outcomes_mu;
  std::list<Outcome> outcomes;

  // Starts the exchange of this rank's flag.
  int exchange_outcome(int mine) {
    std::lock_guard<std::mutex> lock(outcomes_mu);
    Outcome& o = outcomes.emplace_back();
    if (service::start_any(mine != 0, p2p, &o.flag, &o.req) != MPI_SUCCESS) {
      outcomes.pop_back();
      return fail(Failure::peer, "blueconnect: the outcome exchange could not start");
    }
    return MPI_SUCCESS;
  }

  // The earlier exchanges that have completed: a peer's failure in one of them is
  // reported once, as an earlier stream-ordered call's.
  int take_outcomes() {
    std::lock_guard<std::mutex> lock(outcomes_mu);
    int rc = MPI_SUCCESS;
    for (auto it = outcomes.begin(); it != outcomes.end();) {
      int done = 0;
      const int trc = PMPI_Test(&it->req, &done, MPI_STATUS_IGNORE);
      if (trc == MPI_SUCCESS && !done) {
        ++it;
        continue;
      }
      if ((trc != MPI_SUCCESS || (it->flag.agreed && !it->flag.mine)) && rc == MPI_SUCCESS)
        rc = fail(Failure::peer, "blueconnect: another rank's part of an earlier stream-ordered "
                                 "call on this communicator failed; its result is not valid");
      it = outcomes.erase(it);
    }
    return rc;
  }

  ~BcComm();

  std::shared_ptr<const Prepared> prepare(const std::shared_ptr<Layout>& lay, Coll coll,
                                          uint64_t vec, bool from_send, bool ring_only) {
    auto key = std::make_tuple(lay.get(), static_cast<int>(coll), vec, from_send, ring_only);
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = prepared.find(key); it != prepared.end()) return it->second;
    auto p = std::make_shared<Prepared>();
    p->plan = bc::plan(lay->h, rank, vec, ring_only);
    for (size_t i = 0; i < p->plan.stages.size(); ++i) {
      const bc::Stage& st = p->plan.stages[i];
      p->rs.push_back(std::make_shared<const sched::Schedule>(
          sched::build_stage_reduce_scatter(st, from_send && i == 0)));
      p->ag.push_back(std::make_shared<const sched::Schedule>(sched::build_stage_all_gather(st)));
      std::vector<int> c, d;
      for (int j = 0; j < st.size(); ++j) {
        c.push_back(static_cast<int>(st.block_len(j)));
        d.push_back(static_cast<int>(st.block_off(j) - st.seg_off));
      }
      p->counts.push_back(std::move(c));
      p->displs.push_back(std::move(d));
      p->scratch_elems = std::max(p->scratch_elems, st.block_len(st.me));
    }
    if (prepared.size() >= 256) prepared.clear();
    prepared.emplace(key, p);
    return p;
  }
};

// Outcome exchanges still open when their communicator went, with the duplicate they run
// on (freeing it under a pending exchange crashes Open MPI 4.1's libnbc, and waiting for
// them there could wait for a peer that makes no MPI call before it needs this rank's
// next one): waited for, and the duplicates freed, at MPI_Finalize, where every rank is
// in MPI (blueconnect_release).
std::mutex g_orphans_mu;
std::list<BcComm::Outcome> g_orphans;
std::vector<MPI_Comm> g_orphan_comms;

BcComm::~BcComm() {
  take_outcomes();  // (the finished ones; their failures have no call left to report them)
  layouts.clear();  // the levels' communicators before the duplicate
  if (outcomes.empty()) return;
  std::lock_guard<std::mutex> lock(g_orphans_mu);
  g_orphans.splice(g_orphans.end(), outcomes);  // (the nodes, and so the buffers, move)
  g_orphan_comms.push_back(p2p);
  p2p = MPI_COMM_NULL;  // not freed by ~PrivateComm
}

struct BcState final : RouteState {
  std::shared_ptr<BcComm> comm;
  // Stream-ordered calls' outcome exchanges still open (BcComm::take_outcomes).
  int poll(bool* pending) override {
    const int rc = comm->take_outcomes();
    std::lock_guard<std::mutex> lock(comm->outcomes_mu);
    *pending = !comm->outcomes.empty();
    return rc;
  }
};

// ---------------------------------------------------------------------------------------
// One call, advanced in parts: the copy in, the stages, the copy out.

class BcOp {
 public:
  struct Call {
    Coll coll;
    const char* send;  // null: in place
    char* recv;
    uint64_t count;    // allreduce: the vector; others: elements per rank
    MPI_Datatype type;
    int extent;
    MPI_Op op;
  };

  BcOp(std::shared_ptr<BcComm> c, std::shared_ptr<Layout> lay, const Call& call,
       const std::vector<Backend>& backends, bool ring_only)
      : comm_(std::move(c)), lay_(std::move(lay)), call_(call), tag_(comm_->tag()) {
    const int p = comm_->size, me = comm_->rank;
    const uint64_t ext = static_cast<uint64_t>(call.extent);
    const int myslot = bc::tree_slot(lay_->h.factors, lay_->h.position_of[static_cast<size_t>(me)]);
    bool from_send = false;
    uint64_t vec = call.count;
    switch (call.coll) {
      case Coll::allreduce:
        work_ = call.recv;
        from_send = call.send != nullptr;
        input_ = call.send;
        break;
      case Coll::reduce_scatter_block:
        // The stages combine in scratch: MPI writes the caller's first block only, in place
        // too (the other blocks of recv keep the input).
        vec = call.count * static_cast<uint64_t>(p);
        work_ = scratch(vec * ext);
        if (lay_->identity_slots) {
          from_send = true;  // the input is in tree order already: read it where it is
          input_ = call.send ? call.send : call.recv;
        } else {
          const char* in = call.send ? call.send : call.recv;
          const uint64_t blk = call.count * ext;
          for (int r = 0; r < p; ++r) {
            const int slot =
                bc::tree_slot(lay_->h.factors, lay_->h.position_of[static_cast<size_t>(r)]);
            std::memcpy(work_ + static_cast<uint64_t>(slot) * blk, in + static_cast<uint64_t>(r) * blk, blk);
          }
        }
        break;
      case Coll::allgather: {
        vec = call.count * static_cast<uint64_t>(p);
        const uint64_t blk = call.count * ext;
        const char* own = call.send ? call.send : call.recv + static_cast<uint64_t>(me) * blk;
        if (lay_->identity_slots) {
          work_ = call.recv;
        } else {
          work_ = scratch(vec * ext);
        }
        if (own != work_ + static_cast<uint64_t>(myslot) * blk)
          std::memcpy(work_ + static_cast<uint64_t>(myslot) * blk, own, blk);
        break;
      }
      default: break;
    }
    prep_ = comm_->prepare(lay_, call.coll, vec, from_send, ring_only);
    from_send_ = from_send;
    const size_t L = prep_->plan.stages.size();
    // The parts: reduce-scatter stages 0..L-1 then all-gather stages L-1..0, as the
    // collective needs them.
    if (call.coll != Coll::allgather)
      for (size_t i = 0; i < L; ++i) parts_.push_back({static_cast<int>(i), true});
    if (call.coll != Coll::reduce_scatter_block)
      for (size_t i = L; i-- > 0;) parts_.push_back({static_cast<int>(i), false});
    for (Part& pt : parts_) {
      const size_t l = static_cast<size_t>(pt.stage);
      pt.backend = backend_at(backends, static_cast<int>(l));
      if (pt.backend == Backend::mpi) pt.ticket = lay_->next_ticket[l]++;
    }
    for (const Part& pt : parts_)
      if (pt.backend == Backend::mpi && pt.reduce_scatter && !rs_out_)
        rs_out_.reset(new char[std::max<uint64_t>(prep_->scratch_elems * ext, 1)]);
  }

  ~BcOp() {
    if (req_ != MPI_REQUEST_NULL) PMPI_Wait(&req_, MPI_STATUS_IGNORE);
  }

  /// Non-blocking; sets *done when the call is finished. Returns an MPI error code.
  int step(bool* done) { return advance(false, done); }

  /// The whole call on this thread.
  int run() {
    bool done = false;
    return advance(true, &done);
  }

 private:
  struct Part {
    int stage;
    bool reduce_scatter;
    Backend backend = Backend::sched;
    uint64_t ticket = 0;
  };

  // Uninitialised scratch of `bytes` (at least 1), owned by the operation.
  char* scratch(uint64_t bytes) {
    scratch_.reset(new char[std::max<uint64_t>(bytes, 1)]);
    return scratch_.get();
  }

  // Runs parts until one is not finished (non-blocking) or all are. After a failure the
  // remaining parts are skipped, but their tickets are still handed on in turn, or later
  // calls on the sub-communicators would wait for them forever; a non-blocking op does
  // that without spinning, since the ticket's turn may depend on another task of the
  // same engine thread.
  int advance(bool blocking, bool* done) {
    *done = false;
    while (next_ < parts_.size()) {
      Part& pt = parts_[next_];
      if (rc_ != MPI_SUCCESS) {
        if (pt.backend == Backend::mpi && started_ <= next_) {
          std::atomic<uint64_t>& turn = lay_->turn[static_cast<size_t>(pt.stage)];
          while (turn.load(std::memory_order_acquire) != pt.ticket) {
            if (!blocking) return rc_;
            sched_yield();
          }
          turn.fetch_add(1, std::memory_order_release);
          started_ = next_ + 1;
        }
        ++next_;
        continue;
      }
      bool part_done = false;
      if (int rc = step_part(pt, &part_done, blocking); rc != MPI_SUCCESS) {
        rc_ = rc;
        run_.reset();
        ++next_;
        continue;
      }
      if (!part_done) return MPI_SUCCESS;
      ++next_;
    }
    if (rc_ == MPI_SUCCESS) finish();
    *done = true;
    return rc_;
  }

  int step_part(Part& pt, bool* done, bool blocking) {
    const bc::Stage& st = prep_->plan.stages[static_cast<size_t>(pt.stage)];
    if (pt.backend == Backend::sched) {
      if (!run_) {
        const auto& s = pt.reduce_scatter ? prep_->rs[static_cast<size_t>(pt.stage)]
                                          : prep_->ag[static_cast<size_t>(pt.stage)];
        run_ = std::make_unique<sched::ScheduleRun>(s, input_, work_, call_.type,
                                                    call_.extent, call_.op, comm_->p2p, tag_);
      }
      int rc = blocking ? run_->run() : run_->step(done);
      if (blocking) *done = true;
      if (*done) run_.reset();
      return rc;
    }
    // mpi: start in ticket order, then wait or test.
    if (started_ <= next_) {
      std::atomic<uint64_t>& turn = lay_->turn[static_cast<size_t>(pt.stage)];
      while (turn.load(std::memory_order_acquire) != pt.ticket) {
        if (!blocking) return MPI_SUCCESS;
        sched_yield();
      }
      int rc = start_mpi(pt, st);
      started_ = next_ + 1;
      turn.fetch_add(1, std::memory_order_release);
      if (rc != MPI_SUCCESS) return rc;
    }
    int rc;
    if (blocking) {
      rc = PMPI_Wait(&req_, MPI_STATUS_IGNORE);
      *done = true;
    } else {
      int flag = 0;
      rc = PMPI_Test(&req_, &flag, MPI_STATUS_IGNORE);
      *done = flag != 0;
    }
    if (rc == MPI_SUCCESS && *done && pt.reduce_scatter) {
      const uint64_t ext = static_cast<uint64_t>(call_.extent);
      std::memcpy(work_ + st.block_off(st.me) * ext, rs_out_.get(), st.block_len(st.me) * ext);
    }
    return rc;
  }

  int start_mpi(const Part& pt, const bc::Stage& st) {
    const size_t i = static_cast<size_t>(pt.stage);
    const uint64_t ext = static_cast<uint64_t>(call_.extent);
    MPI_Comm sub = lay_->sub[i];
    char* seg = work_ + st.seg_off * ext;
    if (pt.reduce_scatter) {
      const char* in = (from_send_ && i == 0) ? input_ + st.seg_off * ext : seg;
      void* out = rs_out_.get();
      return PMPI_Ireduce_scatter(in, out, prep_->counts[i].data(), call_.type, call_.op, sub,
                                  &req_);
    }
    return PMPI_Iallgatherv(MPI_IN_PLACE, 0, call_.type, seg, prep_->counts[i].data(),
                            prep_->displs[i].data(), call_.type, sub, &req_);
  }

  // The result where the collective wants it.
  void finish() {
    const int p = comm_->size;
    const uint64_t ext = static_cast<uint64_t>(call_.extent);
    const uint64_t blk = call_.count * ext;
    if (call_.coll == Coll::reduce_scatter_block) {
      std::memmove(call_.recv, work_ + prep_->plan.final_off * ext, blk);
    } else if (call_.coll == Coll::allgather && work_ != call_.recv) {
      for (int r = 0; r < p; ++r) {
        const int slot = bc::tree_slot(lay_->h.factors, lay_->h.position_of[static_cast<size_t>(r)]);
        std::memcpy(call_.recv + static_cast<uint64_t>(r) * blk,
                    work_ + static_cast<uint64_t>(slot) * blk, blk);
      }
    }
  }

  std::shared_ptr<BcComm> comm_;
  std::shared_ptr<Layout> lay_;
  Call call_;
  int tag_;
  std::shared_ptr<const Prepared> prep_;
  bool from_send_ = false;
  const char* input_ = nullptr;    // with from_send_: this rank's input, read by stage 0
  char* work_ = nullptr;           // the vector the stages work on
  std::unique_ptr<char[]> scratch_;  // work_ when it is not the receive buffer
  std::unique_ptr<char[]> rs_out_;   // mpi reduce-scatter output
  std::vector<Part> parts_;
  size_t next_ = 0;                // the part in progress
  size_t started_ = 0;             // parts [0, started_) have started their MPI call
  int rc_ = MPI_SUCCESS;           // the first failure
  std::unique_ptr<sched::ScheduleRun> run_;
  MPI_Request req_ = MPI_REQUEST_NULL;
};

class BcTask final : public progress::Task {
 public:
  BcTask(std::unique_ptr<BcOp> op, HostRequest* req) : op_(std::move(op)), req_(req) {}
  const char* what() const override { return "blueconnect: levels (progress thread)"; }
  bool step() override {
    bool done = false;
    int rc = op_->step(&done);
    if (!done) return false;
    op_.reset();
    req_->finish(rc);
    return true;
  }

 private:
  std::unique_ptr<BcOp> op_;
  HostRequest* req_;
};

// ---------------------------------------------------------------------------------------

int element_size(MPI_Datatype t) {
  const TypeInfo* info = find_type(t);
  return info ? info->size : 0;
}

std::string factors_text(const std::vector<int>& f) {
  std::string s;
  for (int x : f) s += (s.empty() ? "" : "x") + std::to_string(x);
  return s;
}

// ---------------------------------------------------------------------------------------
// GPU buffers: every stage is route nccl's collective on its level's sub-communicator,
// all enqueued on one stream (the attached stream, or for a classic call a stream of
// ours ordered after the legacy default stream, which the call then waits for). The
// vector is padded to a multiple of p in scratch memory when it does not divide, so that
// every stage cuts equal blocks (NCCL's reduce-scatter and all-gather need them; padding
// elements only ever combine with padding). Blocks move in NCCL's in-place forms.

#if STREAMCOLL_HAVE_CUDA && STREAMCOLL_HAVE_NCCL

const config::RouteChoice kNoParams{};

Route* stage_route(Backend b) {
  switch (b) {
    case Backend::nccl: return find_route(RouteId::nccl);
    case Backend::nvgroup: return find_route(RouteId::nvgroup);
    case Backend::ht: return find_route(RouteId::ht);
    default: return nullptr;
  }
}

// The parameters a level's route runs with: none, but for nvgroup the rule's chunk= and
// blocks=, and cross=none (the level is one group: nvgroup must not decompose it again).
config::RouteChoice stage_choice(Backend b, const config::RouteChoice& choice) {
  config::RouteChoice c;
  if (b != Backend::nvgroup) return c;
  c.route = RouteId::nvgroup;
  for (const char* key : {"chunk", "blocks", "direct"})
    if (auto v = choice.param(key)) c.params.emplace_back(key, std::string(*v));
  c.params.emplace_back("cross", "none");
  return c;
}

// Collective over the communicator (a blocking call; bc.mu held): the sub-communicators
// and their contexts (once per layout), then each level's route set up on its
// sub-communicator (once per level and backend), every outcome agreed, so that every
// rank answers alike. Then, per call, whether each level's route takes the call's stage
// (its datatype and op), a local answer from agreed state. True when every level can run.
bool gpu_levels(Layout& lay, BcComm& bc, const CollArgs& a, const CallEnv& env,
                const std::vector<Backend>& backends, const config::RouteChoice& choice) {
  auto agree = [&](bool mine) { return service::all(mine, bc.p2p); };
  if (lay.gpu == Layout::unset) {
    lay.gpu = Layout::off;
    const cuda::Driver& d = cuda::driver();
    int ok = d.usable && env.device >= 0;
    // Results, not errors: without them the GPU layout is off and the route refuses.
    if (ok && SC_CU_RESULT(d.cuDeviceGet(&lay.cudev, env.device)) == CUDA_SUCCESS &&
        SC_CU_RESULT(d.cuDevicePrimaryCtxRetain(&lay.cuctx, lay.cudev)) == CUDA_SUCCESS) {
      lay.device = env.device;
      cuda::ScopedContext scope(lay.cuctx);
      if (SC_CU_RESULT(d.cuStreamCreate(&lay.classic, CU_STREAM_DEFAULT)) != CUDA_SUCCESS) {
        lay.classic = nullptr;
        ok = 0;
      } else if (SC_CU_RESULT(d.cuEventCreate(&lay.legacy, CU_EVENT_DISABLE_TIMING)) != CUDA_SUCCESS) {
        lay.legacy = nullptr;
        ok = 0;
      } else if (SC_CU_RESULT(d.cuEventCreate(&lay.last, CU_EVENT_DISABLE_TIMING)) != CUDA_SUCCESS) {
        lay.last = nullptr;
        ok = 0;
      }
    } else {
      lay.cuctx = nullptr;
      ok = 0;
    }
    // On a refusal, the levels let go of their sub-communicators (freeing one frees its
    // context); the mpi backend makes them again if it needs them.
    auto give_up = [&] {
      lay.sub_ctx.clear();
      for (MPI_Comm& c : lay.sub)
        if (c != MPI_COMM_NULL) PMPI_Comm_free(&c);
      return false;
    };
    if (!lay.has_subs() && !lay.make_subs(bc.p2p, bc.rank)) ok = 0;
    if (!agree(ok)) return give_up();
    lay.sub_ctx.assign(lay.sub.size(), nullptr);
    for (size_t l = 0; l < lay.sub.size(); ++l) {
      lay.sub_ctx[l] = comm_context(lay.sub[l], true);
      if (!agree(lay.sub_ctx[l] != nullptr)) return give_up();
    }
    lay.gpu = Layout::ready;
  }
  if (lay.gpu != Layout::ready) return false;
  // Each level's route, probed with the call's own kind of stage.
  CollArgs probe = a;
  probe.coll = a.coll == Coll::allgather ? Coll::allgather : Coll::reduce_scatter_block;
  probe.nonblocking = false;
  for (int l = 0; l < lay.h.levels(); ++l) {
    const Backend b = backend_at(backends, l);
    if (b == Backend::sched) continue;
    Route* route = stage_route(b);
    CommContext& sub = *lay.sub_ctx[static_cast<size_t>(l)];
    probe.comm = lay.sub[static_cast<size_t>(l)];
    Layout::Ready& ready = lay.stage_ready[{l, b}];
    if (ready == Layout::unset) {  // collective: the route sets itself up there
      ready = agree(route && route->accepts(probe, sub, stage_choice(b, choice), env)) ? Layout::ready
                                                                                      : Layout::off;
      if (ready == Layout::off)
        SC_INFO("blueconnect: level %d of %s: its backend cannot run on its communicator; GPU "
                "calls go elsewhere", l, lay.h.describe().c_str());
    }
    if (ready != Layout::ready || !route->accepts(probe, sub, stage_choice(b, choice), env))
      return false;
    if (a.coll == Coll::allreduce && l + 1 == lay.h.levels()) {  // the fused top: allreduce
      probe.coll = Coll::allreduce;
      if (!route->accepts(probe, sub, stage_choice(b, choice), env)) return false;
    }
  }
  return true;
}

// A failure a level's route found after its stage had returned (ht's engine, nvgroup's
// kernels): taken here, for this call to report.
int take_late(Layout& lay) {
  int rc = MPI_SUCCESS;
  for (CommContext* sub : lay.sub_ctx) {
    if (!sub) continue;
    const int late = sub->async_error->exchange(MPI_SUCCESS);
    if (rc == MPI_SUCCESS && late != MPI_SUCCESS) rc = late;
#if STREAMCOLL_HAVE_NVGROUP
    if (nvgroup_stage::take_failure(*sub) && rc == MPI_SUCCESS)
      rc = fail(Failure::peer, "blueconnect: a stage on route nvgroup failed on a rank of its group");
#endif
  }
  return rc;
}

// One call of route blueconnect on GPU buffers, classic or stream-ordered: its work
// buffer, its stages on the levels' routes (or host schedules), its copies and its outcome.
class GpuCall {
 public:
  GpuCall(const CollArgs& a, BcComm& bc, const std::shared_ptr<Layout>& lay_ptr,
          const CallEnv& env, const std::vector<Backend>& backends, bool ring_only,
          const config::RouteChoice& choice)
      : a_(a), bc_(bc), lay_ptr_(lay_ptr), lay_(*lay_ptr), env_(env), backends_(backends),
        ring_only_(ring_only), choice_(choice), d_(cuda::driver()),
        type_(a.coll == Coll::allgather ? a.recvtype : a.datatype),
        ext_(static_cast<uint64_t>(element_size(type_))),
        n_(static_cast<uint64_t>(a.coll == Coll::allgather ? a.recvcount : a.count)),
        vec_(a.coll == Coll::allreduce
                 ? (n_ + static_cast<uint64_t>(bc.size) - 1) / static_cast<uint64_t>(bc.size) *
                       static_cast<uint64_t>(bc.size)
                 : n_ * static_cast<uint64_t>(bc.size)),
        s_(env.has_stream ? static_cast<CUstream>(env.stream) : lay_ptr->classic),
        recv_(static_cast<char*>(a.recvbuf)),
        send_(a.sendbuf == MPI_IN_PLACE ? nullptr : static_cast<const char*>(a.sendbuf)),
        work_(recv_), input_(send_), blk_(n_ * ext_) {
    stage_env_ = env;
    stage_env_.has_stream = true;  // enqueue on s_; the host waits in finish() if classic
    stage_env_.stream = s_;
    if (!env.has_stream) stage_env_.stage_tasks = &stage_tasks_;
  }

  int run() {
    cuda::ScopedContext scope(lay_.cuctx);
    set_up_work();
    std::shared_ptr<const Prepared> prep =
        bc_.prepare(lay_ptr_, a_.coll, vec_, from_send_, ring_only_);
    const auto& stages = prep->plan.stages;
    // An allreduce's outermost stage on a route: one allreduce of the segment (the
    // cross-group step on each rank's slice), not a reduce-scatter and an all-gather.
    const bool fuse_top = a_.coll == Coll::allreduce && !stages.empty() &&
                          backend_at(backends_, stages.back().level) != Backend::sched;
    const size_t rs_end = stages.size() - (fuse_top ? 1 : 0);
    if (a_.coll != Coll::allgather)
      for (size_t i = 0; i < rs_end; ++i) run_stage(stages[i], true);
    if (fuse_top) stage(stages.back(), true, true);
    if (a_.coll != Coll::reduce_scatter_block)
      for (size_t i = rs_end; i-- > 0;) run_stage(stages[i], false);
    copy_out(*prep);
    return finish();
  }

 private:
  static CUdeviceptr dptr(const void* x) { return reinterpret_cast<CUdeviceptr>(x); }
  // Whether `r` failed; the call's first failure is kept in rc_ and logged (located: BC_CU).
  bool cuda_failed(const char* file, int line, const char* what, CUresult r) {
    if (r != CUDA_SUCCESS && rc_ == MPI_SUCCESS) rc_ = cuda::failure_at(file, line, what, r);
    return r != CUDA_SUCCESS;
  }
#define BC_CU(call, what) cuda_failed(__FILE__, __LINE__, (what), (call))
  void copy(char* dst, const char* src, uint64_t bytes) {
    if (lost_ || bytes == 0 || dst == src) return;
    BC_CU(d_.cuMemcpyDtoDAsync(dptr(dst), dptr(src), bytes, s_), "blueconnect: cuMemcpyDtoDAsync");
  }
  uint64_t slot_of(int r) const {
    return static_cast<uint64_t>(
        bc::tree_slot(lay_.h.factors, lay_.h.position_of[static_cast<size_t>(r)]));
  }

  // The order after the application's work, the work buffer and this rank's input in it.
  void set_up_work() {
    // No input to give (a staged call's copy failed, a repacked call's read): no data part.
    if (env_.input_failure != MPI_SUCCESS) {
      rc_ = env_.input_failure;
      lost_ = true;
    }
    // A classic call touches the caller's buffers after the work already on the legacy
    // stream and the application's blocking streams (our stream, a blocking one, would
    // wait for the legacy stream's alone); where it cannot, this rank takes no data part.
    if (!env_.has_stream && !lost_)
      if (BC_CU(cuda::wait_for_legacy(s_, lay_.legacy), "blueconnect: ordering after the legacy stream"))
        lost_ = true;
    // After this communicator's previous call on this rank, whatever its stream (its
    // stages must not be overtaken: the levels' routes match operations in call order).
    if (lay_.last_stream && lay_.last_stream != s_ && !lost_)
      if (BC_CU(d_.cuStreamWaitEvent(s_, lay_.last, 0), "blueconnect: ordering after the previous call"))
        lost_ = true;
    // reduce_scatter_block always combines in scratch: MPI writes the first block of recv
    // only, in place too (the other blocks keep the input).
    need_scratch_ = (a_.coll == Coll::allreduce && vec_ != n_) ||
                    a_.coll == Coll::reduce_scatter_block ||
                    (a_.coll == Coll::allgather && !lay_.identity_slots);
    // Without its work buffer this rank cannot run any stage: it fails every level's
    // NCCL stages collectively, and its host stages run tainted on host scratch.
    if (need_scratch_ && !lost_) {
      if (const int rc = SC_CU_CHECK(d_.cuMemAllocAsync(&scratch_, vec_ * ext_, s_),
                                     "blueconnect: cuMemAllocAsync")) {
        rc_ = rc;
        lost_ = true;
        scratch_ = 0;
      } else {
        work_ = reinterpret_cast<char*>(scratch_);
      }
    }
    const int p = bc_.size;
    switch (a_.coll) {
      case Coll::allreduce:
        if (need_scratch_) copy(work_, send_ ? send_ : recv_, n_ * ext_);
        else from_send_ = send_ != nullptr;
        break;
      case Coll::reduce_scatter_block:
        if (lay_.identity_slots) {
          from_send_ = true;  // in tree order already: read where it is
          input_ = send_ ? send_ : recv_;
        } else {
          const char* in = send_ ? send_ : recv_;
          for (int r = 0; r < p; ++r)
            copy(work_ + slot_of(r) * blk_, in + static_cast<uint64_t>(r) * blk_, blk_);
        }
        break;
      case Coll::allgather:
        copy(work_ + slot_of(bc_.rank) * blk_,
             send_ ? send_ : recv_ + static_cast<uint64_t>(bc_.rank) * blk_, blk_);
        break;
      default: break;
    }
  }

  // A stage on a route (nccl, nvgroup, ht) of the level's sub-communicator, enqueued on
  // s_. `fused`: the outermost level of an allreduce, its reduce-scatter and all-gather as
  // one allreduce of the segment.
  void stage(const bc::Stage& st, bool reduce_scatter, bool fused) {
    CommContext& sub = *lay_.sub_ctx[static_cast<size_t>(st.level)];
    const Backend b = backend_at(backends_, st.level);
    CollArgs c{};
    c.nonblocking = false;
    c.comm = lay_.sub[static_cast<size_t>(st.level)];
    const int count = static_cast<int>(st.block_len(st.me));
    const char* base = from_send_ && st.level == 0 ? input_ : work_;
    if (fused) {
      c.coll = Coll::allreduce;
      const char* in = base + st.seg_off * ext_;
      c.recvbuf = work_ + st.seg_off * ext_;
      c.sendbuf = in == c.recvbuf ? MPI_IN_PLACE : in;
      c.count = static_cast<int>(st.seg_len);
      c.datatype = type_;
      c.op = a_.op;
    } else if (reduce_scatter) {
      c.coll = Coll::reduce_scatter_block;
      c.sendbuf = base + st.seg_off * ext_;
      c.recvbuf = work_ + st.block_off(st.me) * ext_;
      c.count = count;
      c.datatype = type_;
      c.op = a_.op;
    } else {
      c.coll = Coll::allgather;
      c.sendbuf = MPI_IN_PLACE;
      c.recvbuf = work_ + st.seg_off * ext_;
      c.sendcount = c.recvcount = count;
      c.sendtype = c.recvtype = type_;
    }
    if (lost_) {  // no data to take part with: the level's peers are told
      if (b == Backend::nccl) {
        nccl_stage::fail_collectively(sub, rc_, "blueconnect: a stage could not run on this rank");
#if STREAMCOLL_HAVE_NVGROUP
      } else if (b == Backend::nvgroup) {
        nvgroup_stage::give_up(sub, c);
#endif
      } else {
        ht_stage::stand_in(sub, c, stage_env_);  // its part on scratch, marked unusable
      }
      return;
    }
    // Even after a failure of this rank's (its data is then garbage, and the outcome
    // allreduce in finish() says so everywhere): the level's peers need its part.
    const int src = stage_route(b)->run(c, sub, stage_choice(b, choice_), stage_env_);
    if (rc_ == MPI_SUCCESS) rc_ = src;
  }

  // A stage on backend sched (classic calls only): the segment to pinned host memory,
  // the stage's schedule there on the calling thread, the result back. Every rank runs
  // the schedule even after a local failure, so that the others are not left waiting.
  void host_stage(const bc::Stage& st, bool reduce_scatter) {
    const uint64_t bytes = st.seg_len * ext_;
    bc::Stage local = st;  // the same stage on a vector that starts at the segment
    local.seg_off = 0;
    for (uint64_t& b : local.bounds) b -= st.seg_off;
    const uint64_t out_off = reduce_scatter ? local.block_off(local.me) : 0;
    const uint64_t out_len = reduce_scatter ? local.block_len(local.me) : local.seg_len;
    std::vector<char> fallback;  // pageable: slower copies, same result
    char* h = lay_.pinned(bytes);
    if (!h) {
      fallback.resize(bytes + 1);
      h = fallback.data();
    }
    const char* src =
        (reduce_scatter && from_send_ && st.level == 0 ? input_ : work_) + st.seg_off * ext_;
    bool tainted = rc_ != MPI_SUCCESS;  // this rank's data is garbage already
    if (!tainted && bytes) {
      tainted = BC_CU(d_.cuMemcpyAsync(dptr(h), dptr(src), bytes, s_), "blueconnect: D2H copy") ||
                BC_CU(d_.cuStreamSynchronize(s_), "blueconnect: D2H copy");
    }
    auto sch = std::make_shared<const sched::Schedule>(
        reduce_scatter ? sched::build_stage_reduce_scatter(local, false)
                       : sched::build_stage_all_gather(local));
    sched::ScheduleRun run(sch, nullptr, h, type_, static_cast<int>(ext_), a_.op, bc_.p2p,
                           bc_.tag());
    if (tainted) run.taint();
    const int hrc = run.run();
    if (rc_ == MPI_SUCCESS) rc_ = hrc;
    if (rc_ == MPI_SUCCESS && run.tainted()) rc_ = error_code(Failure::peer);
    if (rc_ == MPI_SUCCESS && out_len) {
      // The pageable fallback goes with this stage: the copy must be done before.
      if (!BC_CU(d_.cuMemcpyAsync(dptr(work_ + (st.seg_off + out_off) * ext_),
                                  dptr(h + out_off * ext_), out_len * ext_, s_),
                 "blueconnect: H2D copy") &&
          !fallback.empty())
        BC_CU(d_.cuStreamSynchronize(s_), "blueconnect: H2D copy");
    }
  }

  void run_stage(const bc::Stage& st, bool reduce_scatter) {
    if (backend_at(backends_, st.level) == Backend::sched)
      host_stage(st, reduce_scatter);
    else
      stage(st, reduce_scatter, false);
  }

  // The result from the work buffer into the caller's.
  void copy_out(const Prepared& prep) {
    switch (a_.coll) {
      case Coll::allreduce: copy(recv_, work_, n_ * ext_); break;
      case Coll::reduce_scatter_block: copy(recv_, work_ + prep.plan.final_off * ext_, blk_); break;
      case Coll::allgather:
        for (int r = 0; r < bc_.size && work_ != recv_; ++r)
          copy(recv_ + static_cast<uint64_t>(r) * blk_, work_ + slot_of(r) * blk_, blk_);
        break;
      default: break;
    }
  }

  // The scratch freed, a classic call waited for, and the outcome over the communicator.
  int finish() {
    if (scratch_)
      BC_CU(d_.cuMemFreeAsync(scratch_, s_), "blueconnect: cuMemFreeAsync");
    if (!BC_CU(d_.cuEventRecord(lay_.last, s_), "blueconnect: cuEventRecord (behind the call)"))
      lay_.last_stream = s_;
    if (!env_.has_stream) {
      // Polling the levels' failure notices: a peer that could not run a stage makes this
      // rank abort that level, which ends its kernels.
      if (int wrc = nccl_stage::wait_stream(lay_.sub_ctx, s_); wrc != MPI_SUCCESS && rc_ == MPI_SUCCESS)
        rc_ = wrc;
      // And the engine's side of the ht stages: a failure it finds after letting the
      // stream go on (the copy back) is recorded before it lets go of the stage. The
      // stream is streamcoll's own, so each stage's work ends.
      for (requests::Backoff b; stage_tasks_.load(std::memory_order_acquire) > 0;) b.pause();
    }
    // What the levels' routes found after their stages returned: this call's (classic:
    // its stages are done now) or an earlier stream-ordered call's.
    if (int late = take_late(lay_); late != MPI_SUCCESS && rc_ == MPI_SUCCESS) rc_ = late;
    // The outcome over the whole communicator: a part that failed anywhere spoils the
    // result everywhere (stages mix every rank's data). Where the agreed facts say
    // stream-ordered, the exchange is non-blocking on every rank (a peer may be late: the
    // host does not wait), and a peer's failure is a later call's to report, also on a
    // rank of such a call that has no stream (classic here: waiting for the exchange
    // could wait for a peer's next MPI call, which may itself wait for this rank).
    const int mine = rc_ != MPI_SUCCESS ? 1 : 0;
    bool any = false;
    if (env_.agreed_stream) {
      if (int earlier = bc_.take_outcomes(); earlier != MPI_SUCCESS && rc_ == MPI_SUCCESS)
        rc_ = earlier;
      any = bc_.exchange_outcome(mine) != MPI_SUCCESS;
    } else {
      any = service::any(mine != 0, bc_.p2p);
    }
    if (rc_ == MPI_SUCCESS && any) {
      log_error("blueconnect: another rank's part of this collective failed; this rank's "
                "result is not valid");
      rc_ = error_code(Failure::peer);
    }
    return rc_;
  }

  const CollArgs& a_;
  BcComm& bc_;
  const std::shared_ptr<Layout>& lay_ptr_;
  Layout& lay_;
  const CallEnv& env_;
  const std::vector<Backend>& backends_;
  const bool ring_only_;
  const config::RouteChoice& choice_;
  const cuda::Driver& d_;
  const MPI_Datatype type_;
  const uint64_t ext_, n_, vec_;  // element bytes, elements per rank, the vector's elements
  const CUstream s_;
  CallEnv stage_env_;
  std::atomic<int> stage_tasks_{0};  // a classic call's stages still with the engine
  char* const recv_;
  const char* const send_;  // null in place
  CUdeviceptr scratch_ = 0;
  int rc_ = MPI_SUCCESS;
  bool lost_ = false;  // no work buffer: this rank takes no data part in any stage
  bool need_scratch_ = false;
  char* work_;
  bool from_send_ = false;
  const char* input_;  // with from_send_: this rank's input, read by the first stage
  const uint64_t blk_;  // bytes of one rank's block
};
#undef BC_CU

int run_gpu(const CollArgs& a, BcComm& bc, const std::shared_ptr<Layout>& lay_ptr,
            const CallEnv& env, const std::vector<Backend>& backends, bool ring_only,
            const config::RouteChoice& choice) {
  GpuCall call(a, bc, lay_ptr, env, backends, ring_only, choice);
  return call.run();
}

// A call on GPU facts whose buffers here are not on the levels' GPU (host memory, managed
// memory, another GPU: routed from facts agreed at an earlier call, shim/dispatch.cpp):
// staged through scratch there (core/staging.hpp), after the application's work on
// the buffers' GPUs and on the stream attached here, and run as a classic call on this
// rank (the host waits, and its outcome exchange takes the agreed form). A failed copy in
// still takes part, with no data (GpuCall: lost_), so that no level waits for it.
int run_gpu_staged(const CollArgs& a, BcComm& bc, const std::shared_ptr<Layout>& lay,
                   const CallEnv& env, const std::vector<Backend>& backends, bool ring_only,
                   const config::RouteChoice& choice) {
  cuda::ScopedContext scope(lay->cuctx);
  staging::GpuStage stage;
  const int in = stage.in(a, bc.rank, bc.size, lay->cuctx, lay->classic,
                          env.has_stream ? static_cast<CUstream>(env.stream) : nullptr, "blueconnect");
  int rc = run_gpu(stage.args(a), bc, lay, staged_env(env, lay->device, in), backends, ring_only,
                   choice);  // the host waited for it
  const int out = stage.finish(lay->classic, rc == MPI_SUCCESS);
  return rc == MPI_SUCCESS ? out : rc;
}

#endif  // STREAMCOLL_HAVE_CUDA && STREAMCOLL_HAVE_NCCL

class BlueConnectRoute final : public Route {
 public:
  RouteId id() const override { return RouteId::blueconnect; }

  bool accepts(const CollArgs& a, CommContext& ctx, const config::RouteChoice& choice,
               const CallEnv& env) override {
    if (a.coll != Coll::allreduce && a.coll != Coll::reduce_scatter_block &&
        a.coll != Coll::allgather)
      return false;
    const bool gpu = env.mem == MemKind::device;
    if (!gpu && env.mem != MemKind::host && env.mem != MemKind::pinned) return false;
    if (a.nonblocking && !Runtime::get().thread_multiple()) return false;  // no engine
    // A non-blocking call is routed from an earlier agreement, and this route cannot
    // adapt to a rank whose buffers are of another kind than agreed: where GPU memory may
    // exist, it takes blocking calls only.
    if (a.nonblocking && Runtime::get().job_gpu()) return false;
    const int extent = element_size(a.coll == Coll::allgather ? a.recvtype : a.datatype);
    if (extent <= 0) return false;
    const uint64_t elems = call_bytes(a, ctx.size, 1, 1);
    if (elems > static_cast<uint64_t>(INT_MAX)) return false;
    std::vector<Backend> backends;
    bool ring_only = false;
    if (!parse_params(choice, gpu, &backends, &ring_only)) return false;
    bool any_route = false, any_sched = false, any_mpi = false;
    for (Backend b : backends) {
      any_route = any_route || (b != Backend::sched && b != Backend::mpi);
      any_sched = any_sched || b == Backend::sched;
      any_mpi = any_mpi || b == Backend::mpi;
    }
    if (!gpu && any_route) return false;  // nccl, nvgroup, ht: GPU buffers only
    // GPU buffers: stages on routes, and host stages (sched) for classic calls only.
    if (gpu && (any_mpi || (any_sched && env.has_stream) || a.nonblocking || !gpu_supports(a, backends)))
      return false;

    auto& slot = ctx.route_state[static_cast<int>(RouteId::blueconnect)];
    if (!slot) {
      if (!collective_point(a)) return false;  // set-up is collective: at a blocking call or a persistent init
      if (!set_up(ctx)) return false;
    }
    BcComm& bc = *static_cast<BcState&>(*slot).comm;
    if (!choice.param("hierarchy") && Runtime::get().settings().hierarchy.empty() &&
        !bc.discovery_done) {
      if (!collective_point(a)) return false;  // discovery is collective
      bc.discovered = topo::discover(ctx, env.device, &bc.why_not);
      bc.discovery_done = true;
    }
    std::shared_ptr<Layout> lay = layout(bc, choice);
    if (!lay) return false;
    if (static_cast<int>(backends.size()) > lay->h.levels()) {
      log_once(bc, "blueconnect: backend= names " + std::to_string(backends.size()) +
                       " levels, the hierarchy " + lay->h.describe() + " has " +
                       std::to_string(lay->h.levels()) + "; calls go elsewhere");
      return false;
    }
#if STREAMCOLL_HAVE_CUDA && STREAMCOLL_HAVE_NCCL
    if (gpu) {
      std::lock_guard<std::mutex> lock(bc.mu);
      return gpu_levels(*lay, bc, a, env, backends, choice);
    }
#endif
    bool need_subs = false;
    for (Backend b : backends) need_subs = need_subs || b == Backend::mpi;
    if (need_subs && !lay->has_subs()) {
      if (!collective_point(a)) return false;  // creating them is collective
      std::lock_guard<std::mutex> lock(bc.mu);
      if (!lay->make_subs(bc.p2p, bc.rank)) {
        SC_WARN("blueconnect: MPI_Comm_split failed; the mpi backend is off for %s",
                lay->h.describe().c_str());
        return false;
      }
    }
    return true;
  }

  // Stream-ordered calls on GPU facts: a rank whose buffers are elsewhere stages them
  // (run_gpu_staged), one without the stream runs classic, one without its input takes
  // part with none (GpuCall: lost_); the outcome exchange is non-blocking on every rank.
  // Host calls agree at every call.
  bool adapts(const CollArgs&, CommContext&, const config::RouteChoice&,
              const CallEnv& agreed) override {
#if STREAMCOLL_HAVE_CUDA && STREAMCOLL_HAVE_NCCL
    return agreed.has_stream && agreed.mem == MemKind::device;
#else
    (void)agreed;
    return false;
#endif
  }

  // This rank's allgather must describe its block with the receive type (ranks may use
  // different datatypes for one type signature). GPU buffers: on the GPU of the levels'
  // NCCL communicators, none of which may be aborted (route nccl's able_here on each).
  bool able_here(const CollArgs& a, CommContext& ctx, const CallEnv& local) override {
    if (a.coll == Coll::allgather && a.sendbuf != MPI_IN_PLACE &&
        (a.sendtype != a.recvtype || a.sendcount != a.recvcount))
      return false;
#if STREAMCOLL_HAVE_CUDA && STREAMCOLL_HAVE_NCCL
    if (local.mem != MemKind::device) return true;
    auto& slot = ctx.route_state[static_cast<int>(RouteId::blueconnect)];
    if (!slot) return true;
    BcComm& bc = *static_cast<BcState&>(*slot).comm;
    std::vector<std::pair<CommContext*, Route*>> stages;
    {
      std::lock_guard<std::mutex> lock(bc.mu);
      for (auto& [key, lay] : bc.layouts) {
        if (!lay || lay->gpu != Layout::ready) continue;
        if (lay->device != local.device) return false;
        for (auto& [level_backend, ready] : lay->stage_ready)
          if (ready == Layout::ready)
            stages.emplace_back(lay->sub_ctx[static_cast<size_t>(level_backend.first)],
                                stage_route(level_backend.second));
      }
    }
    for (auto& [sub, route] : stages)
      if (sub && route && !route->able_here(a, *sub, local)) return false;
#else
    (void)ctx, (void)local;
#endif
    return true;
  }

  int run(const CollArgs& a, CommContext& ctx, const config::RouteChoice& choice,
          const CallEnv& env) override {
    (void)env;
    const std::shared_ptr<BcComm>& bc =
        static_cast<BcState&>(*ctx.route_state[static_cast<int>(RouteId::blueconnect)]).comm;
    std::shared_ptr<Layout> lay = layout(*bc, choice);
    std::vector<Backend> backends;
    bool ring_only = false;
    parse_params(choice, env.agreed_mem == MemKind::device, &backends, &ring_only);

#if STREAMCOLL_HAVE_CUDA && STREAMCOLL_HAVE_NCCL
    // GPU facts (agreed: equal everywhere); this rank's buffers may be elsewhere (a call
    // decided from earlier agreements: adapts; a buffer on another GPU: able_here makes
    // every rank avoid that at an agreed call, should it happen anyway).
    if (env.agreed_mem == MemKind::device) {
      const int rc = env.mem != MemKind::device || env.device != lay->device
                         ? run_gpu_staged(a, *bc, lay, env, backends, ring_only, choice)
                         : run_gpu(a, *bc, lay, env, backends, ring_only, choice);
      if (env.agreed_stream) ctx.polls.store(true, std::memory_order_relaxed);  // its outcome
      return rc;
    }
#endif
    BcOp::Call call{};
    call.coll = a.coll;
    call.type = a.coll == Coll::allgather ? a.recvtype : a.datatype;
    call.extent = element_size(call.type);
    call.count = static_cast<uint64_t>(a.coll == Coll::allgather ? a.recvcount : a.count);
    call.op = a.op;
    call.recv = static_cast<char*>(a.recvbuf);
    call.send = a.sendbuf == MPI_IN_PLACE ? nullptr : static_cast<const char*>(a.sendbuf);
    auto op = std::make_unique<BcOp>(bc, lay, call, backends, ring_only);
    if (!a.nonblocking) return op->run();
    auto* req = new HostRequest;
    if (int rc = start_request(req, a.request); rc != MPI_SUCCESS) {
      bool done = false;  // the other ranks are in the call: take part, then report
      while (!done) op->step(&done);
      return rc;
    }
    auto* task = new BcTask(std::move(op), req);
    if (!progress::submit(task)) {
      delete task;
      log_error("blueconnect: the progress engine is stopped");
      req->finish(MPI_ERR_OTHER);
    }
    return MPI_SUCCESS;
  }

 private:
  // Whether the levels' routes can carry the stages of `a` (datatype and op): nccl by
  // NCCL's types and ops, nvgroup by its kernels', ht any the route gets (predefined).
  static bool gpu_supports(const CollArgs& a, const std::vector<Backend>& backends) {
#if STREAMCOLL_HAVE_CUDA && STREAMCOLL_HAVE_NCCL
    bool ok = true;
    for (Backend b : backends) {
      if (b == Backend::nvgroup) {
#if STREAMCOLL_HAVE_NVGROUP
        ok = ok && nvgroup_stage::supports(a);
#else
        ok = false;  // not in this build
#endif
      } else if (b == Backend::nccl || b == Backend::sched) {
        ok = ok && nccl_supports(a);
      }
    }
    return ok;
#else
    (void)a, (void)backends;
    return false;
#endif
  }

#if STREAMCOLL_HAVE_CUDA && STREAMCOLL_HAVE_NCCL
  static bool nccl_supports(const CollArgs& a) {
    if (a.coll == Coll::allgather)
      return nccl::supports(Coll::allgather, MemKind::device, find_type(a.recvtype), nullptr) ==
             nccl::Support::ok;
    const TypeInfo* t = find_type(a.datatype);
    const OpInfo* op = find_op(a.op);
    return nccl::supports(Coll::reduce_scatter_block, MemKind::device, t, op) ==
               nccl::Support::ok &&
           (a.coll != Coll::allreduce ||
            nccl::supports(Coll::allgather, MemKind::device, t, nullptr) == nccl::Support::ok);
  }
#endif

  // backend= (default: nccl for GPU buffers, sched otherwise) and algo=.
  static bool parse_params(const config::RouteChoice& choice, bool gpu,
                           std::vector<Backend>* backends, bool* ring_only) {
    backends->clear();
    std::string_view list = choice.param("backend").value_or(gpu ? "nccl" : "sched");
    size_t start = 0;
    for (size_t i = 0; i <= list.size(); ++i) {
      if (i < list.size() && list[i] != '/') continue;
      auto name = list.substr(start, i - start);
      start = i + 1;
      if (name == "sched") backends->push_back(Backend::sched);
      else if (name == "mpi") backends->push_back(Backend::mpi);
      else if (name == "nccl") backends->push_back(Backend::nccl);
      else if (name == "nvgroup") backends->push_back(Backend::nvgroup);
      else if (name == "ht") backends->push_back(Backend::ht);
      else return false;
    }
    *ring_only = choice.param("algo").value_or("auto") == "ring";
    return !backends->empty();
  }

  static void log_once(BcComm& bc, const std::string& msg) {
    if (bc.told) return;
    bc.told = true;
    SC_INFO("%s", msg.c_str());
  }

  // The hierarchy for a call: the rule's, STREAMCOLL_HIERARCHY, or the discovered one.
  static std::shared_ptr<Layout> layout(BcComm& bc, const config::RouteChoice& choice) {
    std::vector<int> factors;
    std::string key;
    if (auto v = choice.param("hierarchy")) {
      factors = topo::parse_factors(*v).value_or(std::vector<int>{});
      key = "rule:" + std::string(*v);
    } else if (!Runtime::get().settings().hierarchy.empty()) {
      factors = Runtime::get().settings().hierarchy;
      key = "env";
    } else {
      key = "discovered";
    }
    std::lock_guard<std::mutex> lock(bc.mu);
    if (auto it = bc.layouts.find(key); it != bc.layouts.end()) return it->second;
    std::optional<topo::Hierarchy> h;
    std::string why;
    if (key == "discovered") {
      h = bc.discovered;
      why = bc.why_not;
    } else {
      h = topo::impose(factors, bc.size, &why);
      if (!h) why = "hierarchy " + factors_text(factors) + ": " + why;
    }
    std::shared_ptr<Layout> lay;
    if (h) {
      lay = std::make_shared<Layout>(std::move(*h));
      SC_INFO("blueconnect: communicator of %d ranks, hierarchy %s", bc.size,
              lay->h.describe().c_str());
    } else if (!bc.told) {
      bc.told = true;
      SC_INFO("blueconnect: no hierarchy for a communicator of %d ranks (%s); its calls go "
              "elsewhere", bc.size, why.c_str());
    }
    bc.layouts.emplace(key, lay);  // a null entry remembers the refusal
    return lay;
  }

  // Collective over ctx.comm (a blocking call): the private duplicate.
  static bool set_up(CommContext& ctx) {
    auto bc = std::make_shared<BcComm>();
    if (!bc->open(ctx, "blueconnect")) return false;
    auto state = std::make_unique<BcState>();
    state->comm = std::move(bc);
    ctx.route_state[static_cast<int>(RouteId::blueconnect)] = std::move(state);
    return true;
  }
};

}  // namespace

Route* blueconnect_route();
void blueconnect_release();
extern const RouteEntry blueconnect_entry = {blueconnect_route, nullptr, blueconnect_release};

Route* blueconnect_route() {
  static BlueConnectRoute r;
  return &r;
}

void blueconnect_release() {
  std::lock_guard<std::mutex> lock(g_orphans_mu);
  for (BcComm::Outcome& o : g_orphans) PMPI_Wait(&o.req, MPI_STATUS_IGNORE);
  g_orphans.clear();
  for (MPI_Comm& c : g_orphan_comms) PMPI_Comm_free(&c);
  g_orphan_comms.clear();
}

}  // namespace streamcoll
