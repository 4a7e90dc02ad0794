// STREAMCOLL_CHECK: every rank of a communicator must choose the same route and see the
// same memory kind for a call, or the job deadlocks or computes garbage. The check adds
// one allreduce of (x, -x) with MPI_MAX per call, which yields the largest and smallest
// choice over the ranks, and aborts the job with a message when they differ.
//
// Blocking calls are checked at once with PMPI_Allreduce. Starting a non-blocking
// collective must stay a local operation, so for those the check is a PMPI_Iallreduce,
// verified later: polled at every checked call, waited for at the next blocking checked
// call on the communicator, when the communicator is freed and at MPI_Finalize. It runs on
// the communicator's private duplicate (CommContext::agreement_comm; all ranks insert it at
// the same point of their call sequence, so it matches), never on the application's
// communicator: a program may free that right after the call's MPI_Wait, and Open MPI 4.1
// then went on progressing the check's schedule on the freed communicator (a crash in
// mca_pml_ob1_isend). Thread-safe.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "base/types.hpp"

namespace streamcoll {

/// Checks (or starts checking) that all ranks of `comm` chose `route` on `mem` for this
/// call. `rank` is this rank in `comm`. `private_comm`: the communicator's private
/// duplicate, where a non-blocking call's check runs (MPI_COMM_NULL: none was made, the
/// call is not checked; a blocking call waits there for the earlier non-blocking checks).
/// Aborts on disagreement.
void check_agreement(MPI_Comm comm, MPI_Comm private_comm, Coll coll, bool nonblocking,
                     RouteId route, MemKind mem, int rank);

/// What one rank knows of a call that other ranks may see differently (MPI lets ranks
/// pass different memory kinds and describe the same type signature with different
/// datatypes, and each rank has its own GPU).
struct LocalFacts {
  MemKind mem = MemKind::host;  ///< kind of this rank's significant buffers (or mixed)
  bool ineligible = false;      ///< no route but pmpi can take this rank's arguments
  bool stream = false;          ///< this rank's communicator carries a stream attribute
  uint32_t unable = 0;          ///< bit per RouteId: the route cannot run here (local check)
};

/// The facts of a call agreed over the communicator: equal on every rank.
struct AgreedFacts {
  bool valid = false;           ///< set by agree_call (false: never agreed)
  bool routable = false;        ///< every rank can take a route other than pmpi
  MemKind mem = MemKind::host;  ///< the kind every rank passes (mixed when they differ)
  /// Every rank passed host or pinned memory (no rank staged a GPU buffer); false where the
  /// agreement failed.
  bool host_only = false;
  bool stream = false;          ///< every rank's communicator carries a stream
  uint32_t unable = 0;          ///< bit per RouteId: some rank cannot run the route
  const char* why = "";         ///< when !routable: the reason, for the log
};

/// Agrees on `mine` over `comm` (`size` ranks): one PMPI_Allreduce (MPI_BOR) of eight
/// ints, none when size == 1. Collective and blocking: call it only at a point every
/// rank of `comm` reaches (a blocking collective that every rank routes the same way).
/// On an MPI failure the result is not routable (the MPI raises its own error in the
/// call that follows).
AgreedFacts agree_call(MPI_Comm comm, int size, const LocalFacts& mine);

/// What MPI requires every rank to pass alike in a blocking call, so that "the n-th call
/// of this signature on this communicator" is the same call on every rank (MPI orders a
/// communicator's blocking collectives alike everywhere). `op`: 1 + the OpKind of a
/// predefined op, else 0 (handles of user ops may be reused differently per rank); the
/// datatype is left out (ranks may describe one type signature differently): its size is
/// in `bytes`.
struct CallSignature {
  Coll coll = Coll::barrier;
  uint64_t bytes = 0;
  int root = -1;
  int op = 0;
  bool operator==(const CallSignature& o) const {
    return coll == o.coll && bytes == o.bytes && root == o.root && op == o.op;
  }
};

/// The agreements of one signature's blocking calls on a communicator, taken off the
/// critical path. Call 1 agrees at once (agree_call). While the calls of the signature
/// are cacheable (the dispatcher's word: routed to pmpi, which takes any buffer a rank
/// passes, or to a route that adapts locally to any buffer, so a rank whose own facts
/// differ adapts), call n >= 2 decides from the agreement started at the newest refresh
/// call j <= n - kRunAhead (waiting for it only while some rank has not started call j:
/// a rank runs at most kRunAhead calls of the signature ahead of the slowest), or from
/// the last blocking agreement; refresh calls start a non-blocking agreement
/// (PMPI_Iallreduce, on CommContext::agreement_comm) of their own facts.
///
/// The refresh schedule backs off while the facts stand: calls 2, 3, 5, 9, ..., 65
/// (1 + 2^k), then a gap that doubles from kRefreshEvery at each refresh whose adopted
/// facts were the ones in force, up to kRefreshMax (129, 257, 513, 1025, then every
/// 1024th call), and falls back to kRefreshEvery after a refresh found them changed (or
/// failed, or a call agreed at once: the next refresh then comes at most kRefreshEvery
/// calls later); while the calls leave pmpi, every kRefreshRouted-th call refreshes too.
/// A change of memory kind (or of a route's ability on a rank) is thus seen at most
/// kRefreshMax + kRunAhead calls later (kRefreshRouted + kRunAhead off pmpi). Seeing it
/// late costs only speed: cacheable calls go where any rank's buffers are taken. Otherwise
/// (the last call was not cacheable) every call agrees at once, as call 1; so does a call
/// whose adopted facts would route it where it is not cacheable. Everything here depends
/// on the call count and on agreed facts alone, so it is equal on every rank. Not
/// thread-safe: a communicator's blocking calls are ordered by the program.
class SignatureAgreements {
 public:
  static constexpr uint64_t kRunAhead = 4;
  static constexpr uint64_t kRefreshEvery = 64;
  static constexpr uint64_t kRefreshMax = 1024;
  static constexpr uint64_t kRefreshRouted = 8;
  static constexpr int kInts = 9;  ///< LocalFacts as exchanged (agreement.cpp)

  SignatureAgreements() = default;
  SignatureAgreements(const SignatureAgreements&) = delete;
  SignatureAgreements& operator=(const SignatureAgreements&) = delete;
  ~SignatureAgreements();  // waits for the pending refreshes

  /// Counts a call of the signature; true when it must agree at once (agree()), false
  /// when it decides from earlier agreements (adopt()).
  bool begin_call();
  /// This call's agreement, blocking (agree_call), after the pending ones.
  const AgreedFacts& agree(MPI_Comm comm, int size, const LocalFacts& mine);
  /// The facts this call decides from (without agree()).
  const AgreedFacts& adopt();
  /// Whether this call starts a refresh (then call refresh() with its facts).
  bool refreshes() const;
  void refresh(MPI_Comm comm, int size, const LocalFacts& mine);
  /// What the call decided: whether the next may decide from earlier agreements
  /// (`cacheable`), whether it left pmpi (refreshes come more often then), and whether the
  /// next calls may repeat its decision on the steady path (`steady`: the dispatcher's
  /// word, shim/steady.hpp) until a refresh is due to start or to be adopted.
  void decided(bool cacheable, bool routed, bool steady = false);

  /// The steady path (shim/steady.hpp): counts the next call of the signature as one that
  /// decides exactly as the last one did, when nothing it would decide from can have
  /// changed since: the last call said `steady`, and the next call neither starts a
  /// refresh nor adopts one. False, counting nothing, otherwise: that call takes the full
  /// decision (begin_call). Equal on every rank: from the call count and agreed facts.
  bool steady_call() {
    if (calls_ + 1 >= steady_until_) return false;
    ++calls_;
    return true;
  }
  /// Whether the last call's decision said `steady` (decided()).
  bool steady() const { return steady_until_ != 0; }
  /// The facts the last call decided from (adopted or agreed).
  const AgreedFacts& facts() const { return facts_; }

  /// Waits for the pending refreshes (collective: every rank started the same ones),
  /// before their communicator is freed.
  void finish() { drain(); }

  uint64_t calls() const { return calls_; }
  uint64_t started() const { return started_; }  ///< refreshes started
  uint64_t waited() const { return waited_; }    ///< adopted refreshes not done when needed
  uint64_t next_refresh() const { return next_refresh_; }  ///< the next scheduled refresh call

 private:
  struct Pending {
    uint64_t at = 0;  // the call that started it
    int in[kInts] = {}, out[kInts] = {};
    MPI_Request req = MPI_REQUEST_NULL;
    bool failed = false;  // the MPI refused to start or complete it
  };
  void drain();  // waits for every pending refresh (all ranks started the same ones)
  void schedule();  // at a scheduled refresh call: the one after it
  void unsettled();  // the facts changed (or were agreed at once): refresh again soon
  uint64_t calls_ = 0;
  bool cached_ = false;
  bool routed_ = false;
  bool due_ = false;     // this call is a scheduled refresh call
  bool stable_ = false;  // the last adopted refresh found the facts in force
  uint64_t next_refresh_ = 2;
  uint64_t gap_ = kRefreshEvery / 2;  // the schedule's gap once past call 1 + kRefreshEvery
  uint64_t steady_until_ = 0;  // the first call the steady path leaves to the full decision
  AgreedFacts facts_;
  std::vector<std::unique_ptr<Pending>> pending_;  // oldest first
  uint64_t started_ = 0, waited_ = 0;
};

/// Process-wide counts of streamcoll's own agreement collectives so far: blocking
/// agreements (agree_call, a PMPI_Allreduce each where the communicator has more than one
/// rank), refreshes started (a PMPI_Iallreduce each) and refreshes that were not done
/// when a call needed them (the call waited for a peer). Thread-safe.
struct AgreementCounts {
  uint64_t blocking = 0, refreshes = 0, waited = 0;
};
AgreementCounts agreement_counts();

/// STREAMCOLL_CHECK, before anything collective of streamcoll's own: verifies that every
/// rank sees the same rank-invariant inputs of a blocking call (collective, bytes, root,
/// whether it may leave pmpi), after the earlier checks on `private_comm` (as
/// check_agreement). Aborts the job with a message on a divergence.
void check_inputs(MPI_Comm comm, MPI_Comm private_comm, Coll coll, uint64_t bytes, int root,
                  bool candidate, int rank);

/// Waits for every pending non-blocking check (`private_comm` MPI_COMM_NULL), or for those
/// on `private_comm` before it is freed (CommContext::finish_agreements). Collective over
/// the communicators that have one pending (every rank started the same ones); called
/// from Runtime::stop() at MPI_Finalize and from a context's end.
void finish_agreement_checks(MPI_Comm private_comm = MPI_COMM_NULL);

}  // namespace streamcoll
