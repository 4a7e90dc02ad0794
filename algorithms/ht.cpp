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

#include <atomic>
#include <climits>
#include <memory>

#include "algorithms/ht.hpp"
#include "algorithms/ht_host.hpp"
#include "algorithms/ht_staged.hpp"
#include "algorithms/route.hpp"
#include "base/log.hpp"
#include "core/cuda_driver.hpp"
#include "core/engine_request.hpp"
#include "core/errors.hpp"
#include "core/pmpi_call.hpp"
#include "core/progress.hpp"
#include "core/requests.hpp"
#include "core/runtime.hpp"
#include "core/staging.hpp"

namespace streamcoll {
namespace {

// The host side (algorithms/ht_host) and the GPU side (algorithms/ht_staged).
using ht_detail::Algo;
using ht_detail::AlgoSel;
using ht_detail::choose_algo;
using ht_detail::element_size;
using ht_detail::host_call;
using ht_detail::HostCall;
using ht_detail::HostPart;
using ht_detail::HostTask;
using ht_detail::HtComm;
using ht_detail::HtState;
using ht_detail::run_blocking;
using ht_detail::stand_in;
#if STREAMCOLL_HAVE_CUDA
using ht_detail::Device;
using ht_detail::DeviceSide;
using ht_detail::gpu_of;
using ht_detail::plan_copies;
using ht_detail::run_device_async;
using ht_detail::run_device_classic;
using ht_detail::StandInTask;
#endif

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
  ht_detail::stand_in(a, hc, algo, extent, bytes, status, MPI_SUCCESS);
#endif
}

}  // namespace ht_stage

void ht_shutdown() {
  progress::stop();  // finishes every operation in flight
#if STREAMCOLL_HAVE_CUDA
  DeviceSide::get().shutdown();
#endif
}

}  // namespace streamcoll
