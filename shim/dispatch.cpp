// How a collective call is routed. Read this file first.
//
// THE RULE. Every rank of a communicator must take the same route for a call and run the
// same set-up collectives, or a legal program hangs or computes garbage. So a routing
// decision uses only facts that are equal on every rank, and each rank adapts to its own
// buffers inside the chosen route. The facts, and why each is equal everywhere:
//   - the collective, blocking or not, its byte size, datatype (reductions), op and
//     root: MPI requires every rank to make the same call with matching arguments
//     (a gather-like call's datatypes may differ between ranks: only its type signature,
//     hence its size, must match);
//   - the tuning table, STREAMCOLL_ROUTE and the other steering settings, whether any
//     node of the job has a CUDA driver, whether the MPI is CUDA-aware everywhere (if not,
//     every call with data exchanges the ranks' staging outcomes, in band for a small
//     blocking allreduce: core/host_staging.hpp)
//     and the thread level: agreed over MPI_COMM_WORLD at MPI_Init (core/runtime.cpp);
//     ranks that differ get no routing at all;
//   - the communicator: its size, and its node layout found collectively when its
//     context is created (core/comm_context), at a blocking call that every rank
//     treats alike;
//   - routes forced on the communicator: streamcoll_comm_set_route is collective over it
//     (same spec on every rank), and affects that communicator only;
//   - the facts agreed per signature (core/agreement: agree_call, SignatureAgreements):
//     at the first blocking call of a signature that may leave pmpi (and at every call
//     while they go to a route that cannot take what a rank passes), the ranks exchange,
//     in one small allreduce, what only each of them can see; later calls that pass
//     host memory or are stream-ordered, to pmpi or to a route that takes whatever each
//     rank passes (Route::adapts), decide from agreements started
//     at earlier calls of the signature (the n-th call of a signature is the same call on
//     every rank: no rank waits for another there, unless one runs ahead by more than
//     SignatureAgreements::kRunAhead calls), and a rank whose own facts differ adapts
//     inside the route (as for a non-blocking call, below; a bcast or gather-like call it
//     describes with a derived datatype repacked: core/repack). What each rank sees: the
//     memory kind of its buffers (MPI lets a rank pass host memory where another passes
//     device memory, and makes MPI_Reduce's receive buffer significant at the root only),
//     whether its arguments suit a route at all (how it describes a type signature; the
//     language binding is no such fact: Fortran calls are routed alike), whether the
//     communicator carries a stream attribute on it, and
//     which routes it cannot run (Route::able_here: a driver that cannot hold a stream, a
//     buffer on another GPU than the communicator's NCCL one). Ranks that pass different
//     memory kinds go to pmpi together.
//   - a persistent collective's init (MPI_Allreduce_init, ...) is a point every rank
//     reaches alike (MPI 4.0 makes it non-local and ordered like a collective): the facts
//     of its buffers, fixed from then on, are agreed there at once, and every start takes
//     the route chosen then, as the non-blocking call it is (shim/persistent.cpp);
//   - a non-blocking call cannot agree (starting one must not wait for other ranks): it is
//     routed from the facts agreed at the last blocking call of the same collective on
//     the communicator (before one, of any collective; equal everywhere: MPI orders
//     blocking calls alike on every rank), or goes to pmpi before there was one. A rank
//     whose own call differs from those facts adapts locally: inside the route for its
//     buffers (nccl stages other memory through its GPU, ht stages any GPU memory through
//     the host, pmpi takes any memory), and here for a bcast/allgather/alltoall it
//     describes with a derived datatype (repacked to the others' datatype: core/repack).
// Never used for a decision: this rank's memory kind, GPU, stream, environment or timing.
// The fast path (shim/dispatch.hpp: pass_through) and the full path below may differ
// between ranks (a process with GPU buffers to stage looks closer), so the full path
// does nothing collective for a call that is not a candidate (step 1).
// STREAMCOLL_CHECK=1 verifies the invariant inputs and the chosen rule with an extra
// allreduce, before any set-up collective runs, and aborts with a message on a divergence.
//
//   MPI_Allreduce(...)                       shim/collectives.cpp
//      pass_through(): nothing can route it here -> PMPI_ call
//      steady::enter(): a blocking call that repeats a decision remembered for its
//        arguments (pmpi, host memory), nothing it rests on changed -> PMPI_ call
//                                                                   shim/steady.hpp
//   -> dispatch(CollArgs)
//      steady::call(): the same for the other calls (Fortran, statistics on)
//      decide():
//        screen_arguments()  MPI_COMM_NULL                       -> MPI_ERR_COMM
//                 non-blocking call without a request         -> MPI_ERR_REQUEST
//                 other invalid arguments, inter-communicator -> pmpi (MPI raises)
//                 a negative count, recvcounts[i] too         -> MPI_ERR_COUNT
//                 null data buffer with a predefined type     -> MPI_ERR_BUFFER
//        classify()  memory kind of the significant buffers (CUDA driver), or the
//                 communicator's assertion; the communicator's stream, if any  streamext/
//        step 1   candidate()? (rank-invariant: table, forced routes, arguments) -> pmpi
//        step 2   blocking, decide_blocking(): the signature's agreement, at once or
//                 from earlier calls (context created the first time, collectively)
//                                                             shim/dispatch_agree.cpp
//                 non-blocking: the last blocking call's agreement, or pmpi
//                 a persistent collective's init, decide_persistent_init(): agreed at
//                 once (MPI makes the init non-local); its starts run that decision
//                 (plan_persistent, start_persistent: shim/dispatch_persistent.cpp;
//                 the MPI symbols in shim/persistent.cpp)
//                 agreed facts not routable (mixed kinds, a rank's arguments) -> pmpi
//        step 3   choose_route(), walk_rules(): tuning table with the agreed facts: first
//                 matching rule          shim/dispatch_agree.cpp, config/tuning_table
//                 route absent, unable on some rank, or declines -> the next rule
//                 (a forced route: STREAMCOLL_ROUTE, streamcoll_comm_set_route)  -> pmpi
//                 no rule left                                -> pmpi
//      run_on_route(): route.run(args, this rank's buffers)   algorithms/
//      run_on_pmpi(): with a stream, the stream is synchronised first, so the call is
//        still correct, only not asynchronous; on GPU buffers with an MPI that is not
//        CUDA-aware, the buffers are staged through host memory   core/host_staging
//      run_fused(): MPI_Iallreduce calls fused                algorithms/fusion
//      statistics (STREAMCOLL_STATS)      shim/dispatch_report.cpp, core/stats
#include "shim/dispatch.hpp"

#include <time.h>

#include "algorithms/fusion.hpp"
#include "algorithms/route.hpp"
#include "base/log.hpp"
#include "core/agreement.hpp"
#include "core/alloc_kinds.hpp"
#include "core/comm_context.hpp"
#include "core/cuda_driver.hpp"
#include "core/datatypes.hpp"
#include "core/eligibility.hpp"
#include "core/errors.hpp"
#include "core/host_staging.hpp"
#include "core/pmpi_call.hpp"
#include "core/repack.hpp"
#include "core/runtime.hpp"
#include "core/stats.hpp"
#include "core/trace.hpp"
#include "shim/capture.hpp"
#include "shim/dispatch_decision.hpp"
#include "shim/steady.hpp"
#include "streamext/stream_attr.hpp"

namespace streamcoll {
namespace {

using dispatch_detail::call_stream;
using dispatch_detail::check_choice;
using dispatch_detail::choose_route;
using dispatch_detail::decide;
using dispatch_detail::decide_blocking;
using dispatch_detail::decide_persistent_init;
using dispatch_detail::Decision;
using dispatch_detail::explain_once;
using dispatch_detail::Mine;
using dispatch_detail::now_ns;
using dispatch_detail::raise_error;
using dispatch_detail::report_async_error;
using dispatch_detail::run_on_pmpi;
using dispatch_detail::run_on_route;
using dispatch_detail::sync_stream;
using dispatch_detail::trace_routed;

int type_size(MPI_Datatype t, const TypeInfo* info) {
  if (info) return info->size;
  int size = 0;
  if (t == MPI_DATATYPE_NULL || PMPI_Type_size(t, &size) != MPI_SUCCESS) return 0;
  return size;
}

// The memory kind of the call's buffers, and the GPU of the first one in device memory;
// each buffer's kind into *known.
MemKind combine(const BufferUse* bufs, int n, int* device, host_staging::KnownKinds* known) {
  MemKind kind = MemKind::host;
  for (int i = 0; i < n; ++i) {
    int dev = -1;
    MemKind k = cuda::classify_buffer(bufs[i].ptr, &dev);
    if (known->n < 2) {
      known->ptr[known->n] = bufs[i].ptr;
      known->kind[known->n++] = k;
    }
    if (*device < 0) *device = dev;
    if (i == 0) kind = k;
    else if (k != kind) return MemKind::mixed;
  }
  return kind;
}

// STREAMCOLL_CHECK: the buffers of a call on a communicator that asserts memory kinds
// (mpi_assert_memory_alloc_kinds) are of those kinds; otherwise the program broke its
// assertion, and streamcoll, which routes from it, aborts with a message.
void check_asserted(const CollArgs& a, uint32_t asserted, const host_staging::KnownKinds& kinds,
                    int rank) {
  for (int i = 0; i < kinds.n; ++i) {
    if (alloc_kinds::allows(asserted, kinds.kind[i])) continue;
    log_error("STREAMCOLL_CHECK: rank %d passed %s memory to %s on a communicator whose "
              "%s does not allow it. Aborting.", rank,
              std::string(name(kinds.kind[i])).c_str(), call_name(a.coll, a.nonblocking).c_str(),
              alloc_kinds::kAssertKey);
    PMPI_Abort(a.comm, MPI_ERR_OTHER);
  }
}

// Whether `v` leaves the call to the agreement (step 2 of decide()): the verdicts that
// every rank reaches alike (MPI makes the arguments behind them match on all ranks) end
// the decision at once; those that only this rank's own arguments can cause do not.
bool invariant_verdict(Verdict v, Coll c) {
  const bool same_datatype = takes_op(c);  // reductions: one datatype on every rank
  switch (v) {
    case Verdict::eligible:
    case Verdict::mixed_memory:  // memory kinds are each rank's own
      return true;
    case Verdict::derived_type:
    case Verdict::type_mismatch:
      // bcast and the gather family require equal type signatures, not equal datatypes
      return !same_datatype;
    default:  // invalid arguments, inter-communicator, no data, user op, op not defined
      return false;
  }
}

// The errors streamcoll raises itself before looking at a call further (MPIs that crash
// on them, or write outside the buffers): an error class and where it is raised, or
// MPI_SUCCESS.
int screen(const CollArgs& a, MPI_Comm* where) {
  if (a.comm == MPI_COMM_NULL) {
    // Raised here because some MPIs (Open MPI 4.1's MPI_Allgather) crash on it. Errors
    // without a valid communicator go to MPI_COMM_WORLD's handler, as Open MPI and
    // MPICH raise them.
    *where = MPI_COMM_WORLD;
    return MPI_ERR_COMM;
  }
  *where = a.comm;
  if (a.nonblocking && a.request == nullptr) return MPI_ERR_REQUEST;  // Open MPI 4.1 writes through it
  // A negative count (MPICH 4.0's MPI_Allreduce takes one without an error, and writes
  // outside its buffers). sendcount means nothing with MPI_IN_PLACE.
  const bool gather_like = a.coll == Coll::allgather || a.coll == Coll::allgatherv ||
                           a.coll == Coll::alltoall;
  if (a.coll != Coll::barrier &&
      (gather_like ? (a.sendbuf != MPI_IN_PLACE && a.sendcount < 0) ||
                         (a.coll != Coll::allgatherv && a.recvcount < 0)
                   : a.coll != Coll::reduce_scatter && a.count < 0))
    return MPI_ERR_COUNT;
  return MPI_SUCCESS;
}

// This rank and the size of `comm`, from its context where one was made (the MPI's
// queries cost tens of nanoseconds a call); false for an inter-communicator.
bool intra_rank_size(MPI_Comm comm, const CommContext* ctx, int* rank, int* size) {
  if (ctx) {
    *rank = ctx->rank;
    *size = ctx->size;
    return !ctx->inter;
  }
  int inter = 0;
  if (PMPI_Comm_test_inter(comm, &inter) != MPI_SUCCESS || inter) return false;
  PMPI_Comm_rank(comm, rank);
  PMPI_Comm_size(comm, size);
  return true;
}

// A v-variant's negative receive count (Open MPI 4.1 copies one before checking it).
bool negative_recvcount(const CollArgs& a, int size) {
  if (a.recvcounts)
    for (int i = 0; i < size; ++i)
      if (a.recvcounts[i] < 0) return true;
  return false;
}

// decide(), first: the call's arguments checked and measured. The errors streamcoll raises
// itself (d.error); calls the MPI must see as they are (false: to pmpi, where MPI raises
// what is wrong); else d.bytes, d.well_formed, the call's facts (*f), the communicator's
// context if it has one (*ctx), this rank and its size, and the send and receive type
// sizes (*sts, *rts).
bool screen_arguments(const CollArgs& a, Decision& d, CallFacts* f, CommContext** ctx,
                      int* rank, int* size, int* sts, int* rts) {
  if ((d.error = screen(a, &d.error_comm)) != MPI_SUCCESS) return false;
  f->coll = a.coll;
  f->invalid_args = obviously_invalid(a);
  if (f->invalid_args) return false;  // PMPI raises the error; nothing else may touch a.comm
  *ctx = comm_context(a.comm, false);
  if (!intra_rank_size(a.comm, *ctx, rank, size)) return false;
  if (negative_recvcount(a, *size)) {
    d.error = MPI_ERR_COUNT;
    d.error_comm = a.comm;
    return false;
  }
  if (rooted(a.coll) && (a.root < 0 || a.root >= *size))
    return false;  // MPI_ERR_ROOT from PMPI
  d.well_formed = true;

  const bool reduction_family = one_type(a.coll);  // `datatype` for both sides
  const MPI_Datatype rtype = reduction_family ? a.datatype : a.recvtype;
  const MPI_Datatype stype =
      reduction_family ? a.datatype : (a.sendbuf == MPI_IN_PLACE ? rtype : a.sendtype);
  f->send_type = a.coll == Coll::barrier ? nullptr : find_type(stype);
  f->recv_type = a.coll == Coll::barrier ? nullptr : find_type(rtype);
  *sts = type_size(stype, f->send_type);
  *rts = type_size(rtype, f->recv_type);
  f->counts_match = a.sendbuf == MPI_IN_PLACE || reduction_family ||
                    a.coll == Coll::allgatherv || a.sendcount == a.recvcount;
  f->op = takes_op(a.coll) ? find_op(a.op) : nullptr;
  d.bytes = f->bytes = call_bytes(a, *size, *sts, *rts);

  // A null pointer where a predefined datatype says data lives: MPI_ERR_BUFFER (as
  // MPICH reports it), rather than handing it to an MPI that may dereference it.
  if (has_null_pointer(a) && f->send_type && f->recv_type &&
      null_data_buffer(a, *rank, *size, *sts, *rts)) {
    SC_WARN("%s: null buffer with %llu bytes of data; raising MPI_ERR_BUFFER",
            call_name(a.coll, a.nonblocking).c_str(), static_cast<unsigned long long>(d.bytes));
    d.error = MPI_ERR_BUFFER;
    d.error_comm = a.comm;
    return false;
  }
  return true;
}

// decide(), then: this rank's memory kind for the call (d.env.mem, f->mem). Host memory
// asserted on the communicator (mpi_assert_memory_alloc_kinds, agreed when the info was
// set: shim/comm_info.cpp) is a fact equal on every rank: no buffer is classified, and a
// call that no rule routes for host memory goes to pmpi at once (false). Otherwise each
// significant buffer is classified once (d.kinds), and under STREAMCOLL_CHECK held
// against what the communicator asserts.
bool classify(const CollArgs& a, const CommContext* ctx, Decision& d, CallFacts* f, int rank,
              int size, int sts, int rts, bool check, Runtime& rt) {
  const uint32_t asserted = ctx ? ctx->asserted_kinds.load(std::memory_order_relaxed) : 0;
  if (alloc_kinds::host_only(asserted) && !check) {
    d.env.mem = f->mem = alloc_kinds::routing_kind(asserted);
    d.asserted_host = true;
    std::shared_ptr<const config::TuningTable> forced = ctx->forced_routes();
    return rt.table().routes_host(a.coll) || (forced && forced->routes_host(a.coll));
  }
  BufferUse bufs[2];
  d.env.mem = f->mem = combine(bufs, significant_buffers(a, rank, size, sts, rts, bufs),
                               &d.env.device, &d.kinds);
  if (asserted && check) check_asserted(a, asserted, d.kinds, rank);
  return true;
}

// Step 1, rank-invariant: may this call leave pmpi at all? From the call's arguments that
// MPI requires to match, the table (agreed at MPI_Init) and the communicator's forced
// routes (streamcoll_comm_set_route is collective). A verdict that only this rank's
// arguments can cause (memory kinds, how a gather-like call describes its type
// signature) is not used here: it goes into the agreement (step 2).
bool candidate(const CollArgs& a, const Decision& d, Verdict verdict,
               const config::TuningTable* forced, int rank, bool check, Runtime& rt) {
  const bool is =
      invariant_verdict(verdict, a.coll) &&
      (rt.candidate(a.coll) || (forced && forced->may_leave_pmpi_any(a.coll)));
  if (check && !a.nonblocking)
    check_inputs(a.comm, d.ctx ? d.ctx->agreement_comm_made() : MPI_COMM_NULL, a.coll, d.bytes,
                 a.root, is, rank);
  if (!is) {
    if (check) check_choice(a, d.ctx, d.route, MemKind::host, rank);
    SC_TRACE("%s %llu B on %s memory -> pmpi (%s)", call_name(a.coll, a.nonblocking).c_str(),
             static_cast<unsigned long long>(d.bytes), std::string(name(d.env.mem)).c_str(),
             verdict == Verdict::eligible ? "no rule routes it" : describe(verdict));
  }
  return is;
}

// After a blocking call's decision: what the steady path may repeat (shim/steady.hpp),
// remembered with the buffers this rank's calls with these arguments read or write, or
// forgotten where the decision says it may not.
void remember_steady(const CollArgs& a, const Decision& d, int rank, int size, int sts,
                     int rts) {
  if (!steady::allowed()) return;
  steady::Decided learned;
  if (d.sig && d.sig->steady() && d.error == MPI_SUCCESS) {
    learned.ctx = d.ctx;
    learned.sig = d.sig;
    learned.bytes = d.bytes;
    learned.choice = d.choice;
    BufferUse bufs[2];
    for (int i = 0, n = significant_buffers(a, rank, size, sts, rts, bufs); i < n; ++i) {
      if (bufs[i].ptr == a.sendbuf) learned.buffers |= steady::kSend;
      if (bufs[i].ptr == a.recvbuf) learned.buffers |= steady::kRecv;
    }
  }
  steady::remember(a, learned);
}

// A communicator of one rank whose call has a buffer in GPU memory: route self
// (algorithms/self.cpp), a local copy on the GPU, with nothing to agree (the only rank's
// facts are the agreed ones) and nothing set up; blocking, MPI_I* and persistent alike,
// whatever the table or forced routes say. The context is made here if need be (with one
// rank, a local step). False: the call is decided as any other (host memory only, a
// datatype or op the route does not take: then walk_rules keeps it off every route but
// pmpi and self).
bool one_rank(const CollArgs& a, Decision& d, int size, Verdict verdict, Runtime& rt) {
  if (size != 1 || !rt.settings().one_rank_self ||
      (verdict != Verdict::eligible && verdict != Verdict::mixed_memory))
    return false;
  if (d.env.mem == MemKind::host || d.env.mem == MemKind::pinned) return false;
  Route* self = find_route(RouteId::self);
  if (!self) return false;
  if (!d.ctx) d.ctx = comm_context(a.comm, true);
  static const config::RouteChoice kNoParams;
  if (!d.ctx || !self->accepts(a, *d.ctx, kNoParams, d.env)) return false;
  d.route = RouteId::self;
  d.env.agreed_mem = d.env.mem;
  d.agreed_stream = d.env.agreed_stream = d.env.has_stream;
  if (log_enabled(LogLevel::info)) d.why = "a communicator of one rank: a local copy";
  SC_TRACE("%s %llu B on %s memory on one rank -> self", call_name(a.coll, a.nonblocking).c_str(),
           static_cast<unsigned long long>(d.bytes), std::string(name(d.env.mem)).c_str());
  return true;
}

}  // namespace

namespace dispatch_detail {

// How the call is routed, in the order of the map at the top of this file: arguments
// screened, this rank's memory kind and stream, step 1 (candidate?), then steps 2 and 3
// (the facts every rank decides from, and the route they choose).
Decision decide(const CollArgs& a, Runtime& rt) {
  Decision d;
  CallFacts f;
  CommContext* ctx = nullptr;
  int rank = 0, size = 1, sts = 0, rts = 0;
  if (!screen_arguments(a, d, &f, &ctx, &rank, &size, &sts, &rts)) return d;
  const bool check = rt.check_on();
  if (!classify(a, ctx, d, &f, rank, size, sts, rts, check, rt)) return d;
  if (!rt.full_path(a.coll)) return d;  // only statistics asked for the facts above
  void* stream = nullptr;
  const bool attached = call_stream(a.comm, &stream);
  if (attached && (d.env.mem == MemKind::device || d.env.mem == MemKind::managed)) {
    d.env.has_stream = true;
    d.env.stream = stream;
  }
  const Verdict verdict = eligibility(f);
  d.ctx = ctx;
  if (one_rank(a, d, size, verdict, rt)) return d;
  d.forced = ctx ? ctx->forced_routes() : nullptr;
  if (!candidate(a, d, verdict, d.forced.get(), rank, check, rt)) {
    d.ctx = nullptr;  // to pmpi, as one that touches no context
    d.forced = nullptr;
    return d;
  }
  Mine mine(a, d.env, verdict != Verdict::eligible, attached);
  if (!a.nonblocking) {
    decide_blocking(d, a, mine, size, rank, check, rt);
    remember_steady(a, d, rank, size, sts, rts);
    return d;
  }
  if (a.persistent_init) {
    decide_persistent_init(d, a, mine, size, rank, check, rt);
    return d;
  }
  // A non-blocking call must start without waiting for the others: it uses the facts of
  // the last blocking call of its collective on the communicator, and goes to pmpi before
  // there was one.
  AgreedFacts agreed;
  if (ctx) {
    agreed = ctx->agreed[static_cast<int>(a.coll)];
    if (!agreed.valid) agreed = ctx->agreed_last;
  }
  d.agreed_host = agreed.valid && agreed.host_only;
  choose_route(d, a, agreed, size, rank, check, rt);
  return d;
}

// Before the real MPI call on a communicator that carries a stream: the input may still
// be being written by work on the stream, so the host waits for the stream; the MPI call
// then returns (blocking) with the result in place for later work on the stream.
int sync_stream(void* stream) {
#if STREAMCOLL_HAVE_CUDA
  if (const int rc = SC_CU_CHECK(cuda::driver().cuStreamSynchronize(static_cast<CUstream>(stream)),
                                 "cuStreamSynchronize (before the MPI call)"))
    return rc;
#else
  (void)stream;
#endif
  return MPI_SUCCESS;
}

}  // namespace dispatch_detail

namespace {

// Whether a non-blocking call on a.comm may leave pmpi: an earlier blocking call agreed on
// routable facts for it (decide() routes it from those).
bool may_route(const CollArgs& a) {
  if (a.comm == MPI_COMM_NULL) return false;
  CommContext* ctx = comm_context(a.comm, false);
  if (!ctx) return false;
  const AgreedFacts& f = ctx->agreed[static_cast<int>(a.coll)].valid
                             ? ctx->agreed[static_cast<int>(a.coll)]
                             : ctx->agreed_last;
  return f.valid && f.routable;
}

}  // namespace

namespace {
int dispatch_described(const CollArgs& a, Runtime& rt);
}  // namespace

int dispatch(const CollArgs& a) {
  if (g_in_binding) return run_pmpi(a);  // beneath a Fortran call streamcoll has routed
  // A blocking call that repeats an earlier one's decision (shim/steady.hpp).
  if (int rc; steady::call(a, &rc)) return rc;
  Runtime& rt = Runtime::get();
  if (!rt.active()) return run_pmpi(a);
  // A stream-ordered call on a stream being captured becomes nodes of the CUDA graph.
  if (int rc; streamext::in_use() && capture::record(a, &rc)) return rc;
  // A non-blocking bcast/gather-like call that this rank describes with a derived datatype,
  // on a communicator whose agreement may route it: it runs repacked to the datatype the
  // other ranks pass (core/repack.hpp), through the same routing (once: the repacked call
  // is never repacked again).
  if (a.nonblocking && repack::needed(a) && rt.full_path(a.coll) && may_route(a)) {
    // (The data is read now: after the work on the communicator's stream, if it has one.)
    void* stream = nullptr;
    const int own = call_stream(a.comm, &stream) ? sync_stream(stream) : MPI_SUCCESS;
    return repack::run(a, [&rt](const CollArgs& b) { return dispatch_described(b, rt); }, own);
  }
  return dispatch_described(a, rt);
}

namespace {

// A call fused with others (algorithms/fusion.hpp): stream-ordered where the agreed facts
// have a stream and this rank's buffers are on a GPU (fusion::start synchronises the stream
// where it cannot stage the call). A stream on this rank's communicator that the agreed
// facts do not have (some rank's lacks one) is synchronised at the call, as the pmpi route
// does. A failure at the start leaves the call taking its part (the others fuse it); its
// group fails everywhere.
int run_fused(const CollArgs& a, const Decision& d) {
  CallEnv env = d.env;
  env.has_stream = d.env.has_stream && d.agreed_stream;
  const int own = d.env.has_stream && !env.has_stream ? sync_stream(d.env.stream) : MPI_SUCCESS;
  const int rc = fusion::start(*d.ctx->fusion, a, d.fuse, env, own, d.forced, sync_stream);
  if (rc != MPI_SUCCESS) raise_error(a.comm, rc);
  return rc;
}

}  // namespace

namespace dispatch_detail {

// A call to the MPI's own collective. A failed synchronisation of the stream still leaves
// this rank in the call (the others are in it); it is this rank's failure (with an outcome
// exchange: everyone's).
int run_on_pmpi(const CollArgs& a, Decision& d, Runtime& rt) {
  const int own = d.env.has_stream ? sync_stream(d.env.stream) : MPI_SUCCESS;
  // On an MPI that is not CUDA-aware, the ranks learn of a rank's lost GPU input
  // (host_staging::Outcomes): exchanged, but where the facts the call was decided from
  // say no rank stages (then a rank that stages anyway aborts the job if it loses its
  // input: no collective of streamcoll's own, and no longer message, on host calls).
  using host_staging::Outcomes;
  const Outcomes outcomes =
      !rt.staging_job() || a.coll == Coll::barrier || !d.well_formed || d.asserted_host
          ? Outcomes::none
      : d.agreed_host ? Outcomes::fatal
                      : Outcomes::exchanged;
  if (outcomes == Outcomes::exchanged || host_staging::wanted(a, d.env.mem, outcomes))
    return host_staging::run(a, outcomes, own, &d.kinds);  // raises its own failures
  int rc = run_pmpi(a);
  if (own != MPI_SUCCESS) {
    raise_error(a.comm, own);
    rc = own;
  }
  return rc;
}

// A call to one of streamcoll's routes, with this rank's buffers.
int run_on_route(const CollArgs& a, const Decision& d) {
  static const config::RouteChoice kNoParams;
  Route* route = find_route(d.route);
  const config::RouteChoice& choice = d.choice ? *d.choice : kNoParams;
  int rc;
  if (!a.nonblocking && repack::needed(a)) {
    // Routed from earlier agreements while this rank describes its data its own way
    // (cacheable(): route nccl): it takes part repacked, on host copies, its host waiting
    // for its stream's work first (its own adaptation; the others are not held).
    const int own = d.env.has_stream ? sync_stream(d.env.stream) : MPI_SUCCESS;
    rc = repack::run_blocking(
        a,
        [&](const CollArgs& b, int lost) {
          CallEnv env = d.env;
          env.mem = MemKind::host;
          env.device = -1;
          env.has_stream = false;
          env.stream = nullptr;
          env.input_failure = lost;
          return route->run(b, *d.ctx, choice, env);
        },
        own);
  } else {
    rc = route->run(a, *d.ctx, choice, d.env);
  }
  if (rc != MPI_SUCCESS) raise_error(a.comm, rc);
  return rc;
}

// An earlier stream-ordered operation on this communicator that failed after its call had
// returned: reported after this call ran (it decided nothing from it), when this one
// succeeded.
int report_async_error(const CollArgs& a, CommContext* ctx, int rc) {
  if (!ctx) return rc;
  if (ctx->polls.load(std::memory_order_relaxed)) ctx->poll_routes();
  if (ctx->async_error->load(std::memory_order_relaxed) == MPI_SUCCESS) return rc;
  const int late = ctx->async_error->exchange(MPI_SUCCESS);
  if (late != MPI_SUCCESS && rc == MPI_SUCCESS) {
    SC_WARN("%s: reporting the failure of an earlier stream-ordered operation on this "
            "communicator", call_name(a.coll, a.nonblocking).c_str());
    raise_error(a.comm, late);
    return late;
  }
  return rc;
}

}  // namespace dispatch_detail

namespace {

// dispatch() for a call whose datatypes need no repacking.
int dispatch_described(const CollArgs& a, Runtime& rt) {
  const bool timed = rt.stats_on();

  const uint64_t t0 = timed ? now_ns() : 0;
  trace::Call traced(a.coll, a.nonblocking);  // NVTX range, timeline record (when on)
  Decision d = decide(a, rt);
  if (d.error == MPI_SUCCESS && traced.on()) trace_routed(traced, a, d);
  if (d.error == MPI_SUCCESS && log_enabled(LogLevel::info)) explain_once(a, d);
#if STREAMCOLL_HAVE_CUDA
  // A call on GPU or pinned memory may allocate (staging, scratch, an NCCL communicator)
  // or synchronise streamcoll's own streams: in the relaxed capture mode, so that a
  // capture another thread of the program holds open in global mode survives it.
  cuda::RelaxedCapture relaxed(d.env.mem != MemKind::host);
#endif
  int rc;
  const bool fused = d.error == MPI_SUCCESS && d.fuse;
  // Any other call on a communicator with fused calls open closes their group (they
  // would not be joined by later calls for long, and the application may wait for them
  // inside this one).
  if (!fused && d.ctx && d.ctx->fusion) fusion::poke(*d.ctx->fusion);
  if (d.error != MPI_SUCCESS) {
    raise_error(d.error_comm, d.error);
    rc = d.error;
  } else if (fused) {
    rc = run_fused(a, d);
  } else if (d.route == RouteId::pmpi) {
    rc = run_on_pmpi(a, d, rt);
  } else {
    rc = run_on_route(a, d);
  }
  rc = report_async_error(a, d.ctx, rc);
  if (timed) record_call(a.coll, a.nonblocking, d.route, d.env.mem, d.bytes, t0, d.choice);
  return rc;
}

}  // namespace

}  // namespace streamcoll
