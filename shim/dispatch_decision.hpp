// The pieces of dispatch (shim/dispatch.cpp: how a call is routed) shared by its files:
// a call's decision (Decision), what this rank sees of it (Mine), steps 2 and 3 of
// decide() for blocking calls and persistent inits (shim/dispatch_agree.cpp), the small
// helpers of the call path, inline, the call path's steps that a persistent start runs
// too (shim/dispatch_persistent.cpp), and what a routed call reports
// (shim/dispatch_report.cpp). Internal to shim/dispatch*.cpp.
#pragma once

#include <mpi.h>

#include <time.h>

#include <cstdint>
#include <memory>
#include <string>

#include "algorithms/route.hpp"
#include "core/agreement.hpp"
#include "core/comm_context.hpp"
#include "core/host_staging.hpp"
#include "core/runtime.hpp"
#include "core/trace.hpp"
#include "shim/capture.hpp"
#include "streamext/stream_attr.hpp"

namespace streamcoll::dispatch_detail {

struct Decision {
  int error = MPI_SUCCESS;  ///< raised by streamcoll itself instead of running the call
  MPI_Comm error_comm = MPI_COMM_NULL;  ///< where `error` is raised
  RouteId route = RouteId::pmpi;
  CallEnv env;  ///< memory kind, attached stream
  host_staging::KnownKinds kinds;  ///< each significant buffer's kind, classified once
  bool agreed_stream = false;  ///< the agreed facts: every rank's call carries a stream
  uint64_t bytes = 0;
  bool well_formed = false;  ///< arguments checked: MPI will not reject the call
  CommContext* ctx = nullptr;
  const config::RouteChoice* choice = nullptr;
  std::shared_ptr<const config::TuningTable> forced;  ///< keeps `choice` alive if from it
  /// STREAMCOLL_DEBUG=info only: the rule that chose, the routes that declined and why,
  /// or why the call could not be routed (explain_once).
  std::string why;
  /// The fuse= limit of `choice` when the call is fused (algorithms/fusion.hpp), else 0: found
  /// by the rule walk, once per call.
  uint64_t fuse = 0;
  /// The communicator asserts host memory only (core/alloc_kinds.hpp): env.mem is from
  /// the assertion, equal on every rank; no GPU buffer to stage.
  bool asserted_host = false;
  /// The facts the call was decided from say every rank passed host memory
  /// (AgreedFacts::host_only): equal on every rank.
  bool agreed_host = false;
  /// A blocking call decided from its signature's agreements: those (on ctx).
  SignatureAgreements* sig = nullptr;
};

// A failure of the call, raised through the communicator's error handler; a replayed call
// (shim/capture.hpp) raises nothing: its replay lane keeps its failure for the next call.
inline void raise_error(MPI_Comm comm, int rc) {
  if (!capture::replaying()) PMPI_Comm_call_errhandler(comm, rc);
}

// The stream a call on `comm` is ordered on: the communicator's (streamext), or, for a
// call a CUDA graph replays, its replay lane's own.
inline bool call_stream(MPI_Comm comm, void** stream) {
  return capture::replay_stream(stream) || streamext::attached(comm, stream);
}

inline uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// What this rank sees of a call (core/agreement.hpp), its unable routes asked of the
// routes only when the facts are exchanged.
class Mine {
 public:
  Mine(const CollArgs& a, const CallEnv& env, bool ineligible, bool stream) : a_(a), env_(env) {
    f_.mem = env.mem;
    f_.ineligible = ineligible;
    f_.stream = stream;
  }
  CommContext* ctx = nullptr;  ///< set before get()
  const LocalFacts& get() {
    if (!unable_known_)
      for (int r = 0; r < kNumRoutes; ++r)
        if (Route* route = find_route(static_cast<RouteId>(r)); route && !f_.ineligible &&
                                                               !route->able_here(a_, *ctx, env_))
          f_.unable |= 1u << r;
    unable_known_ = true;
    return f_;
  }

 private:
  const CollArgs& a_;
  const CallEnv& env_;
  LocalFacts f_;
  bool unable_known_ = false;
};

// ---- steps 2 and 3 (shim/dispatch_agree.cpp) ----

// STREAMCOLL_CHECK: every rank chose `route` on `mem` (core/agreement.hpp). A blocking call
// and a persistent collective's init (non-local) are checked at once; a non-blocking call
// later, on the communicator's private duplicate, which the first checked blocking call
// makes (checked_context): never on the application's communicator, which the program may
// free right after the call's MPI_Wait.
void check_choice(const CollArgs& a, const CommContext* ctx, RouteId route, MemKind mem, int rank);

// Step 3 of decide(), the route: the table and the forced routes matched with the agreed
// facts; routes decide whether they accept from the agreed facts too (Route::accepts).
// Fills d.route, d.choice, d.fuse, d.env.agreed_mem, d.agreed_stream.
void choose_route(Decision& d, const CollArgs& a, const AgreedFacts& agreed, int size, int rank,
                  bool check, Runtime& rt);

// Steps 2 and 3 for a blocking call. It is a point every rank of the communicator reaches
// and decides alike (step 1): the context is created there (collectively, the first
// time). The first call of a signature (core/agreement.hpp: CallSignature) agrees at once
// on what each rank sees; while its calls go where any rank's buffers can be taken
// (cacheable()), later ones decide from agreements started at earlier calls of the
// signature (SignatureAgreements: no collective of streamcoll's own on their path but a
// refresh now and then, so a stream-ordered call does not wait for late peers), and a
// call that those facts would route elsewhere agrees at once.
void decide_blocking(Decision& d, const CollArgs& a, Mine& mine, int size, int rank, bool check,
                     Runtime& rt);

// Steps 2 and 3 for a persistent collective's init (MPI_Allreduce_init, ...), decided as
// the non-blocking call its starts are: MPI makes the init non-local and ordered like any
// collective, so every rank of the communicator reaches it alike, and the facts are
// agreed there, at once, on the buffers every start will use (the init fixes them).
// Routes may set up collectively (collective_point()). Fusion is never chosen
// (rule_fuse_limit): a start runs on its own.
void decide_persistent_init(Decision& d, const CollArgs& a, Mine& mine, int size, int rank,
                            bool check, Runtime& rt);

// ---- the call path (shim/dispatch.cpp, each documented there), for the persistent starts ----

Decision decide(const CollArgs& a, Runtime& rt);
int sync_stream(void* stream);
int run_on_pmpi(const CollArgs& a, Decision& d, Runtime& rt);
int run_on_route(const CollArgs& a, const Decision& d);
int report_async_error(const CollArgs& a, CommContext* ctx, int rc);

// ---- what a routed call reports (shim/dispatch_report.cpp) ----

// STREAMCOLL_DEBUG=info: once per communicator and (collective, route, memory kind,
// stream, size class of a power of 4), the route a call took and why.
void explain_once(const CollArgs& a, const Decision& d);

// What the NVTX range and the timeline say of a routed call.
void trace_routed(trace::Call& t, const CollArgs& a, const Decision& d);

}  // namespace streamcoll::dispatch_detail
