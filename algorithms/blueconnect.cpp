// Route blueconnect: hierarchical allreduce, reduce-scatter and all-gather (M. Cho et al.,
// "BlueConnect: Decomposing All-Reduce for Deep Learning on Heterogeneous Network
// Hierarchy", SysML 2019, section 3). The decomposition is algorithms/blueconnect_plan.hpp;
// the hierarchy comes from core/topology.hpp. This file is the route class; its parts: the
// per-communicator state (layouts, sub-communicators, outcome exchanges) in
// blueconnect_comm, host buffers' calls in blueconnect_engine, GPU buffers' in
// blueconnect_gpu.
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

#include <climits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "algorithms/blueconnect_comm.hpp"
#include "algorithms/blueconnect_engine.hpp"
#include "algorithms/blueconnect_gpu.hpp"
#include "algorithms/route.hpp"
#include "base/log.hpp"
#include "core/comm_context.hpp"
#include "core/datatypes.hpp"
#include "core/errors.hpp"
#include "core/runtime.hpp"
#include "core/topology.hpp"
#if STREAMCOLL_HAVE_NVGROUP
#include "algorithms/nvgroup.hpp"
#endif
#if STREAMCOLL_HAVE_NCCL
#include "algorithms/nccl_map.hpp"
#endif

namespace streamcoll {
namespace bc_detail {
namespace {

std::string factors_text(const std::vector<int>& f) {
  std::string s;
  for (int x : f) s += (s.empty() ? "" : "x") + std::to_string(x);
  return s;
}

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
    return run_host(a, bc, lay, backends, ring_only);
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
}  // namespace bc_detail

Route* blueconnect_route();
void blueconnect_release();
extern const RouteEntry blueconnect_entry = {blueconnect_route, nullptr, blueconnect_release};

Route* blueconnect_route() {
  static bc_detail::BlueConnectRoute r;
  return &r;
}

}  // namespace streamcoll
