// Steps 2 and 3 of decide() (shim/dispatch.cpp, the map at its top): the facts a blocking
// call or a persistent collective's init decides from, agreed at once or from earlier
// calls of its signature, and the route the tuning table and the forced routes choose
// with them (walk_rules: the rules in order, each route asked whether it accepts).
#include <mpi.h>

#include <memory>
#include <string>

#include "algorithms/fusion.hpp"
#include "algorithms/route.hpp"
#include "base/log.hpp"
#include "core/agreement.hpp"
#include "core/comm_context.hpp"
#include "core/datatypes.hpp"
#include "core/repack.hpp"
#include "core/runtime.hpp"
#include "core/trace.hpp"
#include "shim/dispatch_decision.hpp"

namespace streamcoll::dispatch_detail {
namespace {

// The fuse= limit of `choice` for the call `a` of `bytes` (CallKey convention) on `ctx`
// when the call is to be fused (algorithms/fusion.hpp), else 0: an MPI_Iallreduce on a
// communicator with a fusion queue, at most the limit. Equal on every rank: from the
// agreed facts, the rule and the call's size. Calls that carry a stream are fused too
// (stream-ordered where the agreed facts have one: algorithms/fusion.hpp, STREAMS).
uint64_t rule_fuse_limit(const CollArgs& a, const CommContext& ctx,
                         const config::RouteChoice& choice, uint64_t bytes) {
  if (!a.nonblocking || a.persistent_init || a.coll != Coll::allreduce || !ctx.fusion) return 0;
  const auto v = choice.param("fuse");
  if (!v) return 0;
  const auto limit = config::parse_size(*v);
  return limit && bytes <= *limit ? *limit : 0;
}

// The call's signature: what MPI requires every rank to pass alike (core/agreement.hpp).
CallSignature signature_of(const CollArgs& a, uint64_t bytes) {
  CallSignature s;
  s.coll = a.coll;
  s.bytes = bytes;
  if (rooted(a.coll)) s.root = a.root;
  if (takes_op(a.coll))
    if (const OpInfo* op = find_op(a.op)) s.op = 1 + static_cast<int>(op->kind);
  return s;
}

// Step 2 of decide() for a blocking call: the facts it decides from, agreed now
// (*agreed_now) or at earlier calls of its signature (SignatureAgreements), starting a
// refresh where the schedule says.
AgreedFacts signature_facts(SignatureAgreements& sig, CommContext& ctx, MPI_Comm comm, int size,
                            Mine& mine, bool* agreed_now) {
  *agreed_now = sig.begin_call();
  if (*agreed_now) return sig.agree(comm, size, mine.get());
  AgreedFacts agreed = sig.adopt();
  if (sig.refreshes()) sig.refresh(size > 1 ? ctx.agreement_comm() : comm, size, mine.get());
  return agreed;
}

// Whether a blocking call routed as `d` from `agreed` may decide from earlier agreements
// (the next call of its signature too). Host-memory facts and stream-ordered facts (GPU
// memory with a stream on every rank), where an agreement per call would hold the host
// for late peers, may; classic GPU calls, whose host waits for the operation (and so the
// peers) anyway, agree at every call, so a stream attached later, or a route that became
// unable, is seen at the next one. Then the route must take part with whatever buffers
// and stream each rank has now, whatever the adopted facts said: pmpi takes anything;
// another route says whether it does (Route::adapts: nccl, ccube, ht; nvgroup and
// blueconnect stream-ordered), a Fortran call running on its C arguments. From the
// route, the agreed facts and the call's arguments that MPI makes equal on every rank:
// equal everywhere.
bool cacheable(const Decision& d, const CollArgs& a, const AgreedFacts& agreed) {
  if (d.fuse) return false;  // (fusion takes MPI_I* calls only: never here)
  // Facts that are not routable (ranks' kinds differ, or a rank's arguments suited only
  // pmpi: how it described an earlier call's type signature, which the
  // call signature does not hold) are this call's only when agreed at it.
  if (!agreed.valid || !agreed.routable) return false;
  const bool host = agreed.mem == MemKind::host || agreed.mem == MemKind::pinned;
  if (!host && !d.agreed_stream) return false;  // classic GPU calls agree at every call
  if (d.route == RouteId::pmpi) return true;
  Route* route = find_route(d.route);
  if (!route || !d.choice || !d.ctx) return false;
  CallEnv env = d.env;
  env.mem = agreed.mem;
  env.has_stream = d.agreed_stream;
  env.unable = agreed.unable;
  return route->adapts(a, *d.ctx, *d.choice, env);
}

}  // namespace

void check_choice(const CollArgs& a, const CommContext* ctx, RouteId route, MemKind mem, int rank) {
  const bool local = a.nonblocking && !a.persistent_init;
  check_agreement(a.comm, ctx ? ctx->agreement_comm_made() : MPI_COMM_NULL, a.coll, local, route,
                  mem, rank);
}

namespace {

// Under STREAMCOLL_CHECK, at a blocking call or a persistent init (a point every rank of
// the communicator reaches alike): the private duplicate the checks of its non-blocking
// calls run on, made once.
void checked_context(CommContext& ctx, bool check) {
  if (check && ctx.size > 1) ctx.agreement_comm();
}

// Step 3's rule walk: the matching rules in order (`walk`: the forced routes' rule, else
// the table's, the rest of the table on demand) until one's route is in this build, no
// rank is unable to run it, and it accepts the call (Route::accepts, from the agreed
// facts `env`). Fills d.route, d.choice, d.fuse.
void walk_rules(Decision& d, const CollArgs& a, const CallEnv& env, const config::CallKey& key,
                const DecisionCache::Rules& walk, int rank, bool check, Runtime& rt) {
  CommContext* ctx = d.ctx;
  // A forced route (streamcoll_comm_set_route, STREAMCOLL_ROUTE) that declines goes to
  // pmpi; a table rule's route that declines hands the call to the next matching rule.
  // Routes are asked about the call as every rank describes it: where this rank describes
  // a bcast or gather-like call's data its own way, as repacking would pass it.
  CollArgs view;
  const CollArgs& asked = !takes_op(a.coll) && repack::basic_view(a, &view) ? view : a;
  config::RuleWalk rules(rt.table(), walk.forced, key, walk.table, walk.count, walk.overflow);
  const config::Rule* rule = rules.rule();
  // STREAMCOLL_CHECK: the rule every rank matched, before its route sets anything up.
  if (check) check_choice(a, ctx, rule ? rule->choice.route : RouteId::pmpi, env.mem, rank);
  while (rule) {
    d.choice = &rule->choice;
    // A fuse= rule fuses the calls it matches whatever its route would say to them (route
    // nccl declines MPI_I* calls, say): the fused message is routed by its own size
    // (algorithms/fusion.hpp, ROUTE).
    if ((d.fuse = rule_fuse_limit(a, *ctx, rule->choice, d.bytes))) {
      d.route = rule->choice.route;
      break;
    }
    Route* route = find_route(rule->choice.route);
    // GPU memory on one rank: only pmpi and self (one_rank()); nothing there is worth an
    // NCCL communicator, GPU scratch or pinned staging. (Host memory keeps the table's
    // routes: what they take is host memory, on a route the table or the program chose.)
    const bool gpu = env.mem == MemKind::device || env.mem == MemKind::managed ||
                     env.mem == MemKind::mixed;
    const bool one_rank_route = ctx->size > 1 || !gpu || !rt.settings().one_rank_self ||
                                rule->choice.route == RouteId::pmpi ||
                                rule->choice.route == RouteId::self;
    if (route && one_rank_route && !(env.unable >> static_cast<int>(rule->choice.route) & 1u) &&
        route->accepts(asked, *ctx, rule->choice, env)) {
      d.route = rule->choice.route;
      break;
    }
    if (rule->choice.route == RouteId::pmpi) break;
    const config::Rule* next = rules.next();
    if (trace::nvtx_on() || log_enabled(LogLevel::info)) {
      const std::string declined =
          "route " + std::string(name(rule->choice.route)) + " (" + rule->origin + ") " +
          (!route ? "is not available"
           : (env.unable >> static_cast<int>(rule->choice.route) & 1u) ? "cannot run on some rank"
                                                                        : "declines this call");
      if (trace::nvtx_on())
        trace::mark((call_name(a.coll, a.nonblocking) + ": " + declined + "; " +
                     (next ? "trying " + next->origin : std::string("using pmpi")))
                        .c_str());
      if (log_enabled(LogLevel::info)) d.why += declined + "; ";
    }
    SC_TRACE("%s: route %s (%s) %s; %s%s", call_name(a.coll, a.nonblocking).c_str(),
             std::string(name(rule->choice.route)).c_str(), rule->origin.c_str(),
             !route ? "is not available"
             : (env.unable >> static_cast<int>(rule->choice.route) & 1u)
                 ? "cannot run on some rank"
                 : "declines this call",
             next ? "trying " : "using pmpi", next ? next->origin.c_str() : "");
    rule = next;
    if (!rule) d.choice = nullptr;
  }
  if (log_enabled(LogLevel::info))
    d.why += rule && d.choice ? "rule " + rule->origin + " chose it" : "no rule left: pmpi";
}

}  // namespace

void choose_route(Decision& d, const CollArgs& a, const AgreedFacts& agreed, int size, int rank,
                  bool check, Runtime& rt) {
  CommContext* ctx = d.ctx;
  const std::shared_ptr<const config::TuningTable>& forced = d.forced;
  if (!agreed.valid || !agreed.routable) {
    if (check) check_choice(a, ctx, d.route, MemKind::host, rank);
    if (trace::nvtx_on() && agreed.valid)
      trace::mark((call_name(a.coll, a.nonblocking) + " -> pmpi: " + agreed.why).c_str());
    if (log_enabled(LogLevel::info))
      d.why = agreed.valid ? agreed.why : "no blocking call has agreed on its facts yet";
    SC_TRACE("%s %llu B on %s memory -> pmpi (%s)", call_name(a.coll, a.nonblocking).c_str(),
             static_cast<unsigned long long>(d.bytes), std::string(name(d.env.mem)).c_str(),
             agreed.valid ? agreed.why : "no blocking call has agreed on its facts yet");
    return;
  }
  d.env.agreed_mem = agreed.mem;
  CallEnv env = d.env;  // what the route decides from: agreed, with this rank's GPU
  env.mem = agreed.mem;
  env.has_stream = agreed.stream &&
                   (agreed.mem == MemKind::device || agreed.mem == MemKind::managed);
  d.agreed_stream = d.env.agreed_stream = env.agreed_stream = env.has_stream;
  env.unable = agreed.unable;
  config::CallKey key{a.coll, d.bytes, size, ctx->nodes, ctx->ppn, env.mem, env.has_stream};
  // The matching rules: the forced routes' first (streamcoll_comm_set_route), else the
  // table's in order; from the communicator's decision cache when a call with this key was
  // walked before (STREAMCOLL_DECISION_CACHE), else walked now, one rule at a time.
  DecisionCache::Rules walk;
  const int cache = rt.settings().decision_cache;
  if (cache > 0 || (cache < 0 && rt.table().rules().size() >= config::kDecisionCacheRules)) {
    walk = ctx->decisions.lookup(key, forced, rt.table(), rt.table_generation());
  } else {
    if (forced) walk.forced = forced->match(key);
    if (!walk.forced && (walk.table[0] = rt.table().match(key))) {
      walk.count = 1;
      walk.overflow = true;  // the rest on demand
    }
  }
  walk_rules(d, a, env, key, walk, rank, check, rt);
  SC_TRACE("%s %llu B on %s memory%s -> %s", call_name(a.coll, a.nonblocking).c_str(),
           static_cast<unsigned long long>(d.bytes), std::string(name(d.env.mem)).c_str(),
           d.env.has_stream ? " with a stream" : "", std::string(name(d.route)).c_str());
}

void decide_blocking(Decision& d, const CollArgs& a, Mine& mine, int size, int rank, bool check,
                     Runtime& rt) {
  if (!d.ctx) d.ctx = comm_context(a.comm, true);
  if (!d.ctx) return;  // the MPI failed to set one up (on every rank)
  CommContext& ctx = *d.ctx;
  mine.ctx = &ctx;
  checked_context(ctx, check);
  SignatureAgreements& sig = ctx.signature(signature_of(a, d.bytes));
  bool agreed_now = false;
  AgreedFacts agreed = signature_facts(sig, ctx, a.comm, size, mine, &agreed_now);
  // MPI_Iallreduce fusion's queue (algorithms/fusion.hpp), made at the first blocking call
  // that gets here (every rank of the communicator reaches this point alike) when a rule
  // can fuse and the progress thread may call MPI: equal on every rank.
  if (!ctx.fusion_tried && rt.thread_multiple() &&
      (rt.table().fuses() || (d.forced && d.forced->fuses()))) {
    ctx.fusion_tried = true;
    ctx.fusion = fusion::open(ctx, d.forced, d.env.device);
  }
  d.agreed_host = agreed.valid && agreed.host_only;
  const CallEnv local_env = d.env;
  choose_route(d, a, agreed, size, rank, check, rt);
  if (!agreed_now && !cacheable(d, a, agreed)) {
    // Facts from earlier calls would take this one where a rank whose own facts differ
    // could not adapt: every rank (deciding alike) agrees on this call's facts, and the
    // route is chosen again (what choose_route sets, reset).
    agreed = sig.agree(a.comm, size, mine.get());
    d.env = local_env;
    d.route = RouteId::pmpi;
    d.choice = nullptr;
    d.fuse = 0;
    d.agreed_stream = false;
    d.agreed_host = agreed.valid && agreed.host_only;
    choose_route(d, a, agreed, size, rank, check, rt);
  } else if (!agreed_now) {
    d.env.adopted = true;
  }
  // The steady path (shim/steady.hpp) may repeat a decision for the MPI's own call that
  // needs nothing of streamcoll's around it: no fused group, and no staging outcomes to
  // exchange (an MPI that is not CUDA-aware exchanges them unless every rank passed host
  // memory: run_on_pmpi).
  const bool steady = d.route == RouteId::pmpi && !d.fuse &&
                      (!rt.staging_job() || d.agreed_host || a.coll == Coll::barrier);
  sig.decided(cacheable(d, a, agreed), d.route != RouteId::pmpi, steady);
  d.sig = &sig;
  ctx.agreed[static_cast<int>(a.coll)] = agreed;
  ctx.agreed_last = agreed;
  ctx.agreed_by = nullptr;
}

void decide_persistent_init(Decision& d, const CollArgs& a, Mine& mine, int size, int rank,
                            bool check, Runtime& rt) {
  if (!d.ctx) d.ctx = comm_context(a.comm, true);
  if (!d.ctx) return;  // the MPI failed to set one up (on every rank)
  mine.ctx = d.ctx;
  checked_context(*d.ctx, check);
  const AgreedFacts agreed = agree_call(a.comm, size, mine.get());
  d.agreed_host = agreed.valid && agreed.host_only;
  choose_route(d, a, agreed, size, rank, check, rt);
}

}  // namespace streamcoll::dispatch_detail
