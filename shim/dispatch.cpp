// How a collective call is routed. Read this file first.
//
//   MPI_Allreduce(...)                       shim/collectives.cpp
//      pass_through(): no GPU, no host routes, no statistics -> PMPI_ call
//   -> dispatch(CollArgs)
//      decide():  MPI_COMM_NULL                               -> MPI_ERR_COMM
//                 non-blocking call without a request         -> MPI_ERR_REQUEST
//                 other invalid arguments, inter-communicator -> pmpi (MPI raises)
//                 negative recvcounts[i] (v-variants)         -> MPI_ERR_COUNT
//                 null data buffer with a predefined type     -> MPI_ERR_BUFFER
//                 memory kind of the significant buffers (CUDA driver)
//                 GPU buffers: the communicator's stream, if any  streamext/
//                 derived type, user op, mixed memory kinds,
//                 Fortran binding (core/eligibility)          -> pmpi
//                 communicator context (node layout)          core/comm_context
//                 tuning table: first matching rule           config/tuning_table
//                 route absent in this build, or declines     -> the next matching rule
//                 (a forced route: STREAMCOLL_ROUTE, streamcoll_comm_set_route)  -> pmpi
//                 no rule left                                -> pmpi
//                 (pmpi with a stream: the stream is synchronised first, so the
//                 call is still correct, only not asynchronous)
//                 (pmpi on GPU buffers with an MPI that is not CUDA-aware: the
//                 buffers are staged through host memory  core/host_staging)
//      STREAMCOLL_CHECK: one extra allreduce verifies every rank chose the same
//      route and memory kind                                 core/agreement
//      route.run(args)                                        algorithms/
//      statistics (STREAMCOLL_STATS)                          core/stats
#include "shim/dispatch.hpp"

#include <time.h>

#include "algorithms/pmpi.hpp"
#include "algorithms/route.hpp"
#include "core/agreement.hpp"
#include "core/comm_context.hpp"
#include "core/cuda_driver.hpp"
#include "core/datatypes.hpp"
#include "core/eligibility.hpp"
#include "core/errors.hpp"
#include "core/host_staging.hpp"
#include "core/log.hpp"
#include "core/runtime.hpp"
#include "streamext/stream_attr.hpp"

namespace streamcoll {
namespace {

struct Decision {
  int error = MPI_SUCCESS;  ///< raised by streamcoll itself instead of running the call
  MPI_Comm error_comm = MPI_COMM_NULL;  ///< where `error` is raised
  RouteId route = RouteId::pmpi;
  CallEnv env;  ///< memory kind, attached stream
  uint64_t bytes = 0;
  CommContext* ctx = nullptr;
  const config::RouteChoice* choice = nullptr;
  std::shared_ptr<const config::TuningTable> forced;  ///< keeps `choice` alive if from it
};

uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

int type_size(MPI_Datatype t, const TypeInfo* info) {
  if (info) return info->size;
  int size = 0;
  if (t == MPI_DATATYPE_NULL || PMPI_Type_size(t, &size) != MPI_SUCCESS) return 0;
  return size;
}

// The memory kind of the call's buffers, and the GPU of the first one in device memory.
MemKind combine(const BufferUse* bufs, int n, int* device) {
  MemKind kind = MemKind::host;
  for (int i = 0; i < n; ++i) {
    int dev = -1;
    MemKind k = cuda::classify(bufs[i].ptr, &dev);
    if (*device < 0) *device = dev;
    if (i == 0) kind = k;
    else if (k != kind) return MemKind::mixed;
  }
  return kind;
}

Decision decide(const CollArgs& a, Runtime& rt) {
  Decision d;
  if (a.comm == MPI_COMM_NULL) {
    // Raised here because some MPIs (Open MPI 4.1's MPI_Allgather) crash on it. Errors
    // without a valid communicator go to MPI_COMM_WORLD's handler, as Open MPI and
    // MPICH raise them.
    d.error = MPI_ERR_COMM;
    d.error_comm = MPI_COMM_WORLD;
    return d;
  }
  if (a.nonblocking && a.request == nullptr) {  // Open MPI 4.1 writes through it
    d.error = MPI_ERR_REQUEST;
    d.error_comm = a.comm;
    return d;
  }
  CallFacts f;
  f.coll = a.coll;
  f.fortran = a.fortran != nullptr;
  f.invalid_args = obviously_invalid(a);
  if (f.invalid_args) return d;  // PMPI raises the error; nothing else may touch a.comm

  int inter = 0;
  if (PMPI_Comm_test_inter(a.comm, &inter) != MPI_SUCCESS || inter) return d;
  int rank = 0, size = 1;
  PMPI_Comm_rank(a.comm, &rank);
  PMPI_Comm_size(a.comm, &size);
  if (a.recvcounts) {
    // Open MPI 4.1 copies a negative count of the v-variants before checking it.
    for (int i = 0; i < size; ++i)
      if (a.recvcounts[i] < 0) {
        d.error = MPI_ERR_COUNT;
        d.error_comm = a.comm;
        return d;
      }
  }
  if ((a.coll == Coll::reduce || a.coll == Coll::bcast) && (a.root < 0 || a.root >= size))
    return d;  // MPI_ERR_ROOT from PMPI

  const bool reduction_family = a.coll == Coll::allreduce || a.coll == Coll::reduce ||
                                a.coll == Coll::bcast || a.coll == Coll::reduce_scatter ||
                                a.coll == Coll::reduce_scatter_block;
  const MPI_Datatype rtype = reduction_family ? a.datatype : a.recvtype;
  const MPI_Datatype stype =
      reduction_family ? a.datatype : (a.sendbuf == MPI_IN_PLACE ? rtype : a.sendtype);
  f.send_type = a.coll == Coll::barrier ? nullptr : find_type(stype);
  f.recv_type = a.coll == Coll::barrier ? nullptr : find_type(rtype);
  const int sts = type_size(stype, f.send_type), rts = type_size(rtype, f.recv_type);
  f.counts_match = a.sendbuf == MPI_IN_PLACE || reduction_family ||
                   a.coll == Coll::allgatherv || a.sendcount == a.recvcount;
  f.op = takes_op(a.coll) ? find_op(a.op) : nullptr;
  d.bytes = f.bytes = call_bytes(a, size, sts, rts);

  // A null pointer where a predefined datatype says data lives: MPI_ERR_BUFFER (as
  // MPICH reports it), rather than handing it to an MPI that may dereference it.
  if (has_null_pointer(a) && f.send_type && f.recv_type &&
      null_data_buffer(a, rank, size, sts, rts)) {
    SC_WARN("%s: null buffer with %llu bytes of data; raising MPI_ERR_BUFFER",
            call_name(a.coll, a.nonblocking).c_str(), static_cast<unsigned long long>(d.bytes));
    d.error = MPI_ERR_BUFFER;
    d.error_comm = a.comm;
    return d;
  }

  BufferUse bufs[2];
  d.env.mem = f.mem = combine(bufs, significant_buffers(a, rank, size, sts, rts, bufs),
                                  &d.env.device);
  if (!rt.full_path(a.coll)) return d;  // only statistics asked for the facts above
  if (d.env.mem == MemKind::device || d.env.mem == MemKind::managed)
    d.env.has_stream = streamext::attached(a.comm, &d.env.stream);
  const Verdict verdict = eligibility(f);
  const bool check = rt.check_on();
  if (!check &&
      (verdict != Verdict::eligible || !rt.may_route(a.coll, d.env.mem))) {
    SC_TRACE("%s %llu B on %s memory -> pmpi (%s)", call_name(a.coll, a.nonblocking).c_str(),
             static_cast<unsigned long long>(d.bytes), std::string(name(d.env.mem)).c_str(),
             verdict == Verdict::eligible ? "no rule routes it" : describe(verdict));
    return d;
  }

  // The communicator's context holds the layout the table matches on. It is created
  // collectively at the first blocking call that could be routed; until then non-blocking
  // calls on the communicator pass through (the same on every rank).
  if (verdict == Verdict::eligible && rt.may_route(a.coll, d.env.mem) &&
      (d.ctx = comm_context(a.comm, !a.nonblocking)) != nullptr) {
    config::CallKey key{a.coll,   d.bytes,   size, d.ctx->nodes, d.ctx->ppn,
                        d.env.mem, d.env.has_stream};
    const config::Rule* rule = nullptr;
    if ((d.forced = d.ctx->forced_routes())) rule = d.forced->match(key);  // comm_set_route
    // A forced route (streamcoll_comm_set_route, STREAMCOLL_ROUTE) that declines goes to
    // pmpi; a table rule's route that declines hands the call to the next matching rule.
    const bool by_comm = rule != nullptr;
    if (!rule) rule = rt.table().match(key);
    while (rule) {
      d.choice = &rule->choice;
      Route* route = find_route(rule->choice.route);
      if (route && route->accepts(a, *d.ctx, rule->choice, d.env)) {
        d.route = rule->choice.route;
        break;
      }
      if (rule->choice.route == RouteId::pmpi) break;
      const bool forced = by_comm || rule->origin == "STREAMCOLL_ROUTE";
      const config::Rule* next = forced ? nullptr : rt.table().match(key, rule);
      SC_TRACE("%s: route %s (%s) %s; %s%s", call_name(a.coll, a.nonblocking).c_str(),
               std::string(name(rule->choice.route)).c_str(), rule->origin.c_str(),
               route ? "declines this call" : "is not available",
               next ? "trying " : "using pmpi", next ? next->origin.c_str() : "");
      rule = next;
      if (!rule) d.choice = nullptr;
    }
  }
  if (check) check_agreement(a.comm, a.coll, a.nonblocking, d.route, d.env.mem, rank);
  SC_TRACE("%s %llu B on %s memory%s -> %s", call_name(a.coll, a.nonblocking).c_str(),
           static_cast<unsigned long long>(d.bytes), std::string(name(d.env.mem)).c_str(),
           d.env.has_stream ? " with a stream" : "", std::string(name(d.route)).c_str());
  return d;
}

// Before the real MPI call on a communicator that carries a stream: the input may still
// be being written by work on the stream, so the host waits for the stream; the MPI call
// then returns (blocking) with the result in place for later work on the stream.
int sync_stream(void* stream) {
#if STREAMCOLL_HAVE_CUDA
  if (CUresult r = cuda::driver().cuStreamSynchronize(static_cast<CUstream>(stream));
      r != CUDA_SUCCESS)
    return fail(Failure::cuda, cuda::describe("cuStreamSynchronize (before the MPI call)", r));
#else
  (void)stream;
#endif
  return MPI_SUCCESS;
}

}  // namespace

int dispatch(const CollArgs& a) {
  Runtime& rt = Runtime::get();
  if (!rt.active()) return run_pmpi(a);
  const bool timed = rt.stats_on();

  const uint64_t t0 = timed ? now_ns() : 0;
  Decision d = decide(a, rt);
  int rc;
  if (d.error != MPI_SUCCESS) {
    PMPI_Comm_call_errhandler(d.error_comm, d.error);
    rc = d.error;
  } else if (d.route == RouteId::pmpi) {
    rc = d.env.has_stream ? sync_stream(d.env.stream) : MPI_SUCCESS;
    if (rc != MPI_SUCCESS)
      PMPI_Comm_call_errhandler(a.comm, rc);
    else if (host_staging::wanted(a, d.env.mem))
      rc = host_staging::run(a);  // raises its own CUDA failures
    else
      rc = run_pmpi(a);
  } else {
    static const config::RouteChoice kNoParams;
    rc = find_route(d.route)->run(a, *d.ctx, d.choice ? *d.choice : kNoParams, d.env);
    if (rc != MPI_SUCCESS) PMPI_Comm_call_errhandler(a.comm, rc);
  }
  if (timed) {
    rt.stats().record(a.coll, a.nonblocking, d.route, d.env.mem, d.bytes, now_ns() - t0);
    // The route with its parameters, for streamcoll_last_route (statistics only: the
    // string costs a little per call).
    std::string& last = last_route_text();
    last = name(d.route);
    if (d.route != RouteId::pmpi && d.choice)
      for (const auto& [k, v] : d.choice->params) last += " " + k + "=" + v;
  }
  return rc;
}

std::string& last_route_text() {
  thread_local std::string text;
  return text;
}

}  // namespace streamcoll
