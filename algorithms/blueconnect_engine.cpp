// Route blueconnect on host (or pinned) buffers (algorithms/blueconnect.cpp): one call as
// an operation advanced in parts (BcOp: the copy in, the stages on backend sched or mpi,
// the copy out), run on the calling thread for a blocking call, or by the progress engine
// (core/progress) for an MPI_I* call (BcTask).
#include "algorithms/blueconnect_engine.hpp"

#include <mpi.h>

#include <sched.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <vector>

#include "algorithms/blueconnect_plan.hpp"
#include "algorithms/schedule.hpp"
#include "algorithms/schedule_exec.hpp"
#include "base/log.hpp"
#include "core/engine_request.hpp"
#include "core/errors.hpp"
#include "core/progress.hpp"
#include "core/requests.hpp"

namespace streamcoll::bc_detail {
namespace {

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

}  // namespace

int run_host(const CollArgs& a, const std::shared_ptr<BcComm>& bc,
             const std::shared_ptr<Layout>& lay, const std::vector<Backend>& backends,
             bool ring_only) {
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

}  // namespace streamcoll::bc_detail
