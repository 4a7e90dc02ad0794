// What streamcoll knows about one communicator. Created at the first call on the
// communicator that needs it (a collective operation over the communicator), cached as
// an MPI attribute under a private keyval, and freed by the attribute's delete callback
// when the communicator is freed, or by Runtime::stop() before MPI_Finalize.
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "base/types.hpp"
#include "config/tuning_table.hpp"
#include "core/agreement.hpp"

namespace streamcoll {
namespace fusion {
struct Queue;
}

namespace detail {
extern std::atomic<uint64_t> g_remembered;  // remembered_generation()'s counter
}
/// Changes whenever something that a lookup or decision remembered across calls rests on
/// may have changed: a context went (its communicator freed, or every context at stop:
/// the MPI may give the next communicator the freed one's handle), a context dropped its
/// signatures' agreements, a communicator's forced routes or asserted memory kinds were
/// set, the tuning table was loaded. What remembers (comm_context itself, the steady path
/// of shim/steady.hpp) compares it before use. One acquire load. Thread-safe.
inline uint64_t remembered_generation() {
  return detail::g_remembered.load(std::memory_order_acquire);
}
/// Makes every remembered lookup and decision stale (remembered_generation changes).
void forget_remembered();

/// What a route keeps for one communicator (e.g. its NCCL communicator). Destroyed with
/// the context: at MPI_Comm_free, or before MPI_Finalize, in context creation order.
struct RouteState {
  virtual ~RouteState() = default;
  /// Finishes what the route's earlier calls left for MPI progress to complete (a
  /// non-blocking exchange of outcomes: blueconnect), without waiting; from
  /// CommContext::poll_routes. Returns a failure found so (reported like async_error),
  /// and sets *pending when something is still left.
  virtual int poll(bool* pending) {
    *pending = false;
    return MPI_SUCCESS;
  }
};

/// The table walk of one communicator's calls, cached (Horovod's response cache, as a
/// decision cache): for a call's CallKey, the rules that match it, in order: the forced
/// routes' first match (streamcoll_comm_set_route, STREAMCOLL_ROUTE), else every match of
/// the tuning table. A repeated key costs a hash lookup instead of the walk. Entries are
/// dropped when the forced routes are replaced or the table reloaded (its generation), and
/// die with the context (MPI_Comm_free). Only the table walk is cached: the agreement and
/// the routes' own accepts() still run for every call, so no rank-local state is reused.
/// Thread safety: lookup() takes an internal lock (calls on one communicator may come
/// from several threads).
class DecisionCache {
 public:
  static constexpr int kMaxRules = 8;    ///< matches kept per key (more: walk each time)
  static constexpr size_t kMaxKeys = 4096;  ///< then the cache starts over
  struct Rules {
    const config::Rule* forced = nullptr;  ///< the forced routes' first match
    const config::Rule* table[kMaxRules] = {};
    int count = 0;                        ///< of table[]
    bool overflow = false;                ///< more than kMaxRules table matches
  };
  /// The rules for `key` (walking `forced` and `table` on a miss).
  Rules lookup(const config::CallKey& key,
               const std::shared_ptr<const config::TuningTable>& forced,
               const config::TuningTable& table, uint64_t table_generation);
  uint64_t hits() const { return hits_.load(std::memory_order_relaxed); }
  uint64_t misses() const { return misses_.load(std::memory_order_relaxed); }

 private:
  struct KeyHash {
    size_t operator()(const config::CallKey& k) const;
  };
  struct KeyEq {
    bool operator()(const config::CallKey& a, const config::CallKey& b) const;
  };
  std::mutex mu_;
  // Held, so that its rules (and its address) outlive the entries that point into it.
  std::shared_ptr<const config::TuningTable> forced_;
  uint64_t generation_ = 0;
  std::unordered_map<config::CallKey, Rules, KeyHash, KeyEq> map_;
  std::atomic<uint64_t> hits_{0}, misses_{0};
};

struct CommContext {
  MPI_Comm comm = MPI_COMM_NULL;  ///< the application's communicator (not owned)
  int rank = 0;
  int size = 1;
  bool inter = false;             ///< inter-communicators get no routes (nothing below set)

  // Node layout, from MPI_Comm_split_type(MPI_COMM_TYPE_SHARED).
  MPI_Comm local = MPI_COMM_NULL;  ///< ranks of `comm` on this node (owned)
  int local_rank = 0;
  int local_size = 1;
  int nodes = 1;                   ///< nodes the communicator spans
  int ppn = 1;                     ///< largest number of its ranks on one node
  bool uniform = true;             ///< every node holds `ppn` ranks
  /// Every rank's node, as the rank (in `comm`) of that node's lowest rank: equal on all
  /// ranks (gathered when the context is made).
  std::vector<int> node_of;

  /// Per collective: the facts agreed at the last blocking call of that collective on
  /// this communicator that could leave pmpi. Non-blocking calls are routed from them
  /// (or, before the first of their collective, from the last agreement of any)
  /// (they cannot agree themselves: starting one must stay local). Written only at
  /// blocking calls, which MPI orders on every rank alike, so equal on every rank.
  AgreedFacts agreed[kNumColls];
  AgreedFacts agreed_last;  ///< the last of those, any collective: for a collective with none

  /// The agreements of this communicator's blocking calls, per signature (what their
  /// later calls decide from, core/agreement.hpp): made at the signature's first call.
  /// More than kMaxSignatures: all are dropped (their pending agreements completed) and
  /// counting starts over, at the same call on every rank.
  SignatureAgreements& signature(const CallSignature& s);
  /// The communicator the refreshes run on: a private duplicate of `comm`, made at the
  /// first refresh (collective: every rank makes its calls alike), so that nothing of
  /// streamcoll's is in flight on the application's communicator when the application
  /// frees it (an MPI may then keep it, and call the context's delete callback from a
  /// later wait: MPICH does). MPI_COMM_NULL if the MPI refused (the refreshes then fail
  /// alike, and the calls agree at once).
  MPI_Comm agreement_comm();
  /// The duplicate if agreement_comm() made it, else MPI_COMM_NULL; never collective (for
  /// STREAMCOLL_CHECK's checks of non-blocking calls, core/agreement.hpp, which run there).
  MPI_Comm agreement_comm_made() const { return agree_comm_; }
  /// Every signature's pending refreshes and STREAMCOLL_CHECK's pending checks on the
  /// duplicate waited for (SignatureAgreements::finish, finish_agreement_checks), then the
  /// duplicate freed; at the context's end.
  void finish_agreements();
  static constexpr size_t kMaxSignatures = 1024;

  /// An error found after the call that caused it had returned (a stream-ordered
  /// operation whose host part failed on the progress engine, a peer's failure noticed
  /// later): the next call on this communicator, on this rank, runs as usual and then
  /// reports it (shim/dispatch.cpp). Never changes a routing decision. Shared with the
  /// operations in flight, which may outlive the context.
  std::shared_ptr<std::atomic<int>> async_error =
      std::make_shared<std::atomic<int>>(MPI_SUCCESS);
  /// False once the context is gone (its communicator freed, or MPI_Finalize): held by
  /// what may outlive the context and must not touch it then (a persistent collective's
  /// plan, shim/persistent.cpp: MPI lets a program free the communicator first).
  std::shared_ptr<std::atomic<bool>> alive = std::make_shared<std::atomic<bool>>(true);

  /// Per route, created by the route at its first call on the communicator.
  std::unique_ptr<RouteState> route_state[kNumRoutes];
  /// Set by a route that left work for later calls to finish (RouteState::poll): every
  /// later call on this communicator that streamcoll looks at polls the routes' states
  /// (poll_routes) until none is left, and a failure found there is reported as an
  /// async_error, also where the communicator's calls have gone to another route since.
  /// One relaxed load per call otherwise.
  std::atomic<bool> polls{false};
  /// The signature whose agreed facts agreed[its collective] and agreed_last hold because
  /// the steady path (shim/steady.hpp) wrote them there last: it need not write them again
  /// while no blocking call on the full path has written others (which sets this null).
  const SignatureAgreements* agreed_by = nullptr;
  void poll_routes() {
    bool left = false;
    for (auto& s : route_state) {
      if (!s) continue;
      bool pending = false;
      if (const int rc = s->poll(&pending); rc != MPI_SUCCESS) {
        int none = MPI_SUCCESS;
        async_error->compare_exchange_strong(none, rc);
      }
      left = left || pending;
    }
    if (!left) polls.store(false, std::memory_order_relaxed);
  }
  DecisionCache decisions;  ///< the table walk of this communicator's calls
  /// STREAMCOLL_DEBUG=info: the (collective, route, memory, stream, size class) keys whose
  /// decision was explained once already (shim/dispatch.cpp); under explained_mu.
  std::unordered_set<uint64_t> explained;
  std::mutex explained_mu;
  /// MPI_Iallreduce fusion (algorithms/fusion.hpp): made at a blocking call when the table can
  /// fuse (equal on every rank); null when it cannot. Shared with the progress thread,
  /// which finishes the calls in flight after the context is gone.
  std::shared_ptr<fusion::Queue> fusion;
  bool fusion_tried = false;  ///< fusion::open ran (once per communicator)
  /// The memory kinds the application asserts it passes on this communicator
  /// (mpi_assert_memory_alloc_kinds, core/alloc_kinds.hpp), 0: none asserted. Set at the
  /// collective info calls (shim/comm_info.cpp) only when every rank asserted the same.
  std::atomic<uint32_t> asserted_kinds{0};
  uint64_t seq = 0;  ///< creation order in this process (contexts are torn down in it)

  /// Routes forced on this communicator (streamcoll_comm_set_route), matched before the
  /// tuning table; null when none. Replaced as a whole (atomic shared_ptr access), so a
  /// call in flight keeps the table it matched.
  std::shared_ptr<const config::TuningTable> forced_routes() const {
    // (The flag spares a communicator without forced routes the shared_ptr's lock.)
    if (!has_forced_.load(std::memory_order_acquire)) return nullptr;
    return std::atomic_load(&forced_);
  }
  void set_forced_routes(std::shared_ptr<const config::TuningTable> t) {
    const bool some = t != nullptr;
    std::atomic_store(&forced_, std::move(t));
    has_forced_.store(some, std::memory_order_release);
    forget_remembered();
  }
  /// Sets asserted_kinds (the collective info calls, shim/comm_info.cpp).
  void set_asserted_kinds(uint32_t kinds) {
    asserted_kinds.store(kinds, std::memory_order_relaxed);
    forget_remembered();
  }

 private:
  std::shared_ptr<const config::TuningTable> forced_;
  std::atomic<bool> has_forced_{false};
  MPI_Comm agree_comm_ = MPI_COMM_NULL;
  struct SignatureHash {
    size_t operator()(const CallSignature& s) const;
  };
  std::unordered_map<CallSignature, std::unique_ptr<SignatureAgreements>, SignatureHash>
      signatures_;
  CallSignature last_key_;  ///< the last signature() asked for, and its agreements
  SignatureAgreements* last_signature_ = nullptr;
};

/// The context of `comm`. With `create`, it is created if needed: collective over `comm`
/// (blocking) the first time, so all ranks must call it at the same point, and only from
/// a blocking collective: starting a non-blocking one must stay a local operation.
/// Returns nullptr when there is none (yet) or MPI refuses; the call then passes through.
CommContext* comm_context(MPI_Comm comm, bool create);

/// Keyval management, for the runtime: create at start, and free every live context
/// (deleting the attribute from its communicator) at stop.
void comm_contexts_start();
void comm_contexts_stop();
/// Contexts alive now (for tests and diagnostics).
size_t comm_contexts_live();

}  // namespace streamcoll
