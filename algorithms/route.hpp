// The route interface. A route is one way of carrying out a collective; the dispatcher
// (shim/dispatch.cpp) picks one per call from the tuning table and falls back to pmpi
// whenever a route is absent from this build or declines the call.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "base/types.hpp"
#include "config/tuning_table.hpp"
#include "core/coll_args.hpp"
#include "core/comm_context.hpp"

namespace streamcoll {

/// What the dispatcher knows about a call beyond its arguments.
struct CallEnv {
  MemKind mem = MemKind::host;  ///< kind of the significant buffers
  int device = -1;              ///< GPU of the first buffer in device memory, or -1
  bool has_stream = false;      ///< the communicator carries a stream (streamext) and the
                                ///< buffers are in GPU memory: stream semantics apply
  void* stream = nullptr;       ///< that stream (a CUstream / cudaStream_t; 0 is valid)
  uint32_t unable = 0;          ///< agreed env: bit per RouteId, some rank cannot run it
  /// The memory kind agreed over the ranks (at this call, or for a non-blocking call at
  /// the blocking call it is routed from): equal on every rank, so a route may decide
  /// from it what every rank must do alike (e.g. exchange a failure status), while `mem`
  /// is this rank's own.
  MemKind agreed_mem = MemKind::host;
  /// The stream mode agreed over the ranks (every rank's call carries a stream), equal on
  /// every rank as agreed_mem is, while `has_stream` is this rank's own: a route whose
  /// classic and stream-ordered forms would exchange different messages takes the agreed
  /// one on every rank (blueconnect's outcome exchange).
  bool agreed_stream = false;
  /// A blocking call decided from its signature's earlier agreements (shim/dispatch_agree.cpp:
  /// cacheable): the ranks' buffers and streams may differ from the agreed facts and from
  /// each other, so a route whose blocking forms differ by stream (ht's algo=mpi) takes
  /// one form on every rank. False for every other call (the facts were agreed at it).
  bool adopted = false;
  /// Set by a route whose classic call runs other routes' stream-ordered operations as
  /// its stages (blueconnect): the count of those stages' work still with the progress
  /// engine, which ends only after it has recorded any failure it found
  /// (CommContext::async_error). The caller waits for 0 before it takes those failures, so
  /// that they are this call's, not a later one's. Null otherwise.
  std::atomic<int>* stage_tasks = nullptr;
  /// A fused message (algorithms/fusion.hpp): a non-blocking allreduce started when its group
  /// was agreed, on the fusion queue's private duplicate. Route nccl takes it under
  /// STREAMCOLL_FUSION_NCCL rather than STREAMCOLL_NCCL_NONBLOCKING.
  bool fused = false;
  /// This rank could not read its input (a call repacked from a derived datatype whose
  /// data it failed to read: core/repack.hpp): the route fails the call on every rank, as
  /// after a failure of its own, rather than take part with data it does not have.
  int input_failure = MPI_SUCCESS;
};

/// `env` for a call staged onto scratch on GPU `device` (core/staging.hpp, GpuStage): its
/// buffers are that GPU's device memory, no stream is attached (the staged rank keeps
/// classic semantics), and `input_failure` (MPI_SUCCESS: none) when the staging failed.
inline CallEnv staged_env(const CallEnv& env, int device, int input_failure) {
  CallEnv e = env;
  e.mem = MemKind::device;
  e.device = device;
  e.has_stream = false;
  e.stream = nullptr;
  if (input_failure != MPI_SUCCESS) e.input_failure = input_failure;
  return e;
}

class Route {
 public:
  virtual ~Route() = default;
  virtual RouteId id() const = 0;

  /// Whether this rank, with its own buffers (`local`), could take part in this route:
  /// a local check (driver capabilities, the buffer's GPU against the communicator's),
  /// never collective, never blocking. The dispatcher agrees on the answers of all ranks
  /// before it asks accepts(); a route that can adapt to any buffer answers true.
  virtual bool able_here(const CollArgs& a, CommContext& ctx, const CallEnv& local) {
    (void)a, (void)ctx, (void)local;
    return true;
  }

  /// Whether this route can carry `a` on `ctx` with parameters `choice`. The answer must
  /// be the same on every rank of the communicator: decide only from values equal on
  /// all ranks: the call's arguments that MPI requires to match (collective, counts,
  /// datatype, op, root), the communicator's agreed state (layout, route state set up
  /// collectively) and `agreed` (the memory kind and stream mode agreed over the ranks,
  /// `agreed.unable` the routes some rank cannot run). Never this rank's own buffers.
  /// A route may set up its per-communicator state here (ctx.route_state), collectively,
  /// but only when `a` is a blocking call: starting a non-blocking call stays local.
  virtual bool accepts(const CollArgs& a, CommContext& ctx, const config::RouteChoice& choice,
                       const CallEnv& agreed) = 0;

  /// Whether this route takes part in `a` (a blocking call it accepted) with whatever
  /// buffers and stream each rank passes, when the call is decided from facts agreed at
  /// earlier calls of its signature, which may no longer hold on some rank
  /// (shim/dispatch_agree.cpp: cacheable): a rank whose memory kind, GPU or stream differs from
  /// `agreed` adapts inside run() (stages its buffers, runs classic where it has no
  /// stream, repacks a derived datatype, fails the call on every rank through the route's
  /// failure path), never by leaving the call. Then the dispatcher need not agree at every
  /// such call, and a stream-ordered one never waits for late peers. The answer must be
  /// equal on every rank: from the same facts as accepts(). The default: no, those calls
  /// agree at every call.
  virtual bool adapts(const CollArgs& a, CommContext& ctx, const config::RouteChoice& choice,
                      const CallEnv& agreed) {
    (void)a, (void)ctx, (void)choice, (void)agreed;
    return false;
  }

  /// Carries out the call with this rank's own buffers (`env`: their memory kind and
  /// GPU, and the stream attached on this rank). For a blocking call the kinds equal the
  /// agreed ones; a non-blocking call is routed from the kinds agreed at the last blocking
  /// call of its collective on the communicator, so a rank whose buffers differ adapts
  /// here (stages them), without blocking on other ranks. Returns an MPI error code; the
  /// dispatcher passes a failure to the communicator's error handler. Non-blocking calls
  /// set *a.request. With env.has_stream the call is ordered on env.stream and must not
  /// block the host.
  virtual int run(const CollArgs& a, CommContext& ctx, const config::RouteChoice& choice,
                  const CallEnv& env) = 0;
};

/// The route for `id` in this build and process, or nullptr when it is not available
/// (not built yet, or its library/device is missing here).
Route* find_route(RouteId id);
/// Whether this build carries route `id` (algorithms/registry.cpp); whether it can run in
/// this process is find_route's answer. Creates nothing.
bool route_built(RouteId id);

/// Stops what routes run in the background (threads); from Runtime::stop(), before the
/// communicator contexts go.
void routes_shutdown();
/// Inside an MPI communicator constructor, after the MPI's own call succeeded: every rank
/// of `parent` (a communicator with a context) calls it, with its new communicator `child`
/// (MPI_COMM_NULL on a rank that got none). A route whose state on the parent lets it
/// make the child's cheaply does so here, collectively over the parent (route nccl: an
/// ncclCommSplit sharing the parent's resources); the others do nothing. From the thread
/// that makes the call.
void routes_derive(CommContext& parent, MPI_Comm child);
/// What routes took in this process (streamcoll_nccl_counts, STREAMCOLL_STATS): NCCL
/// communicators made with resources of their own and split sharing a parent's, alive
/// now, set-ups the budget turned away on this rank, and the GPU memory (bytes) they hold
/// now and held at most. Zero in a build without NCCL. Thread-safe.
struct ResourceCounts {
  uint64_t nccl_own = 0, nccl_shared = 0, nccl_live = 0, nccl_refused = 0;
  uint64_t nccl_bytes = 0, nccl_peak_bytes = 0;
};
ResourceCounts routes_resources();
/// Frees what routes keep beyond their communicators (idle NCCL communicators, the
/// remains of gone ones), after every communicator context is gone; from Runtime::stop().
void routes_release();

/// A route's registration: its file, algorithms/<id>.cpp, defines
/// `extern const RouteEntry <id>_entry = {...};` for its row in base/routes.def, and
/// algorithms/registry.cpp makes the registry from the rows (in RouteId order, which is
/// also the order of shutdown and release). Constant: function addresses only.
struct RouteEntry {
  /// The route (one per process; nullptr where it cannot run in this process), or nullptr
  /// (the function) where this build cannot carry it (route_built is false).
  Route* (*instance)();
  /// Stops its background threads (Runtime::stop, before contexts go), or nullptr.
  void (*shutdown)() = nullptr;
  /// Frees what outlives communicators (after every context is gone), or nullptr.
  void (*release)() = nullptr;
  /// At a communicator constructor (collective over the parent): derives the child's
  /// state from the parent's (routes_derive), or nullptr.
  void (*derive)(CommContext& parent, MPI_Comm child) = nullptr;
  /// Adds what it took to *c (routes_resources), or nullptr.
  void (*resources)(ResourceCounts* c) = nullptr;
};

}  // namespace streamcoll
