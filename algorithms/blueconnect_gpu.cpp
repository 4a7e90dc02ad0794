// Route blueconnect on GPU buffers (algorithms/blueconnect.cpp): the levels' routes set
// up on their sub-communicators and agreed (gpu_levels), and one call (GpuCall: run_gpu;
// staged through scratch on the levels' GPU, run_gpu_staged).
//
// GPU buffers: every stage is route nccl's collective on its level's sub-communicator,
// all enqueued on one stream (the attached stream, or for a classic call a stream of
// ours ordered after the legacy default stream, which the call then waits for). The
// vector is padded to a multiple of p in scratch memory when it does not divide, so that
// every stage cuts equal blocks (NCCL's reduce-scatter and all-gather need them; padding
// elements only ever combine with padding). Blocks move in NCCL's in-place forms.
#include "algorithms/blueconnect_gpu.hpp"

#if STREAMCOLL_HAVE_CUDA && STREAMCOLL_HAVE_NCCL

#include <mpi.h>

#include <atomic>
#include <memory>
#include <vector>

#include "algorithms/blueconnect_plan.hpp"
#include "algorithms/ht.hpp"
#include "algorithms/nccl.hpp"
#include "algorithms/schedule.hpp"
#include "algorithms/schedule_exec.hpp"
#include "base/log.hpp"
#include "core/cuda_driver.hpp"
#include "core/errors.hpp"
#include "core/requests.hpp"
#include "core/service.hpp"
#include "core/staging.hpp"
#if STREAMCOLL_HAVE_NVGROUP
#include "algorithms/nvgroup.hpp"
#endif

namespace streamcoll::bc_detail {

Route* stage_route(Backend b) {
  switch (b) {
    case Backend::nccl: return find_route(RouteId::nccl);
    case Backend::nvgroup: return find_route(RouteId::nvgroup);
    case Backend::ht: return find_route(RouteId::ht);
    default: return nullptr;
  }
}

namespace {

const config::RouteChoice kNoParams{};


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

}  // namespace

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

namespace {

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

}  // namespace

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

}  // namespace streamcoll::bc_detail

#endif  // STREAMCOLL_HAVE_CUDA && STREAMCOLL_HAVE_NCCL
