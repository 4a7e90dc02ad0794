// Fusion's queue of one communicator (algorithms/fusion.hpp: the protocol): the calls
// started (Member, StreamRequest), the groups being agreed and the fused messages in
// flight (Queue, Queue::Group). Internal to fusion: fusion.cpp (the entry points, the
// requests, the queue's task), fusion_group.cpp (closing a group: packing, the
// agreement, unpacking), fusion_route.cpp (the fused message's route and start).
#pragma once

#include <mpi.h>

#include <time.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "algorithms/fusion.hpp"
#include "algorithms/ht.hpp"
#include "algorithms/route.hpp"
#include "base/log.hpp"
#include "config/tuning_table.hpp"
#include "core/comm_context.hpp"
#include "core/host_staging.hpp"
#include "core/requests.hpp"

namespace streamcoll::fusion {
namespace detail {

inline uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// The process's counts (process_counts, process_messages_on, ...), defined in fusion.cpp.
extern std::atomic<uint64_t> g_calls, g_messages, g_agreements;
extern std::atomic<uint64_t> g_on_route[kNumRoutes];  // fused messages per route
extern std::atomic<uint64_t> g_gpu_packed;  // fused messages packed in GPU memory

}  // namespace detail

// One MPI_Iallreduce of a group, as the application started it.
class Member final : public ManagedRequest {
 public:
  explicit Member(std::weak_ptr<Queue> q) : q_(std::move(q)) {}

  // A wait or test on this request: the group that holds it should close now, and every
  // group before it (Queue::close_upto; the wrappers test again and again, so a call in a
  // later group gets its turn), and the waiting thread advances the queue itself when no
  // other thread is doing so: the progress thread need not be scheduled for the
  // agreement and the fused message to go on (an oversubscribed node).
  void on_test() override;
  void on_wait() override {
    for (requests::Backoff b; !completed(); b.pause()) {
      on_test();
      requests::progress();
    }
  }
  int error() const override { return error_; }

  const void* send = nullptr;  ///< where the contribution is (recv for MPI_IN_PLACE)
  void* recv = nullptr;
  int count = 0;
  MPI_Datatype type = MPI_DATATYPE_NULL;
  MPI_Op op = MPI_OP_NULL;
  uint64_t limit = 0;          ///< fuse= of the rule: part of the run's signature
  /// The memory kind agreed for the call (CallEnv::agreed_mem; equal on every rank): part
  /// of the run's signature, it routes the fused message (fusion.hpp, ROUTE).
  MemKind agreed_mem = MemKind::host;
  /// The communicator's forced routes at the call (streamcoll_comm_set_route; null: none):
  /// they and then the table route the fused message. Part of the run's signature (a
  /// set_route between two calls ends the run there, on every rank alike).
  std::shared_ptr<const config::TuningTable> forced;
  uint64_t bytes = 0;          ///< count * extent: what it takes in the fused buffer
  uint64_t size_bytes = 0;     ///< count * type size: what counts against `limit`
  bool send_gpu = false, recv_gpu = false;
  uint64_t started_ns = 0;
  int error_ = MPI_SUCCESS;
  uint64_t seq = 0;  ///< the queue's count of calls when it started (from 1; under mu)
  /// A stream-ordered call: its GPU buffers are staged on streams (route ht's staging,
  /// algorithms/ht.hpp); `send` and `recv` are the stage's pinned buffer, read once the
  /// copy in is done. Such a Member is not the application's request (a StreamRequest
  /// is) and the queue deletes it once its group is done.
  std::unique_ptr<ht_stream::Stage> stage;
  /// Not the application's request (a stream-ordered call's Member, or one whose request
  /// could not be made): the queue deletes it once its group is done.
  bool queue_owned = false;

  /// Its group is done (error_ says how): completes the request, or, for a
  /// stream-ordered call, lets its stream go on (a failure goes to `async_error`, for the
  /// communicator's next call to report) and deletes this. Outside the queue's locks.
  void retire(std::atomic<int>* async_error) {
    if (!queue_owned) {
      complete();
      return;
    }
    if (stage && error_ != MPI_SUCCESS && async_error) {
      SC_WARN("fusion: a stream-ordered MPI_Iallreduce failed (MPI error %d); the next call "
              "on the communicator reports it", error_);
      int none = MPI_SUCCESS;
      async_error->compare_exchange_strong(none, error_);
    }
    if (stage) stage->finish();
    delete this;
  }

 private:
  std::weak_ptr<Queue> q_;
};

// The request of a stream-ordered call (Member::stage): MPI_Wait and MPI_Test make the
// communicator's stream wait for the call's copy back and complete at once (the host does
// not wait); like a wait on any call, they close the call's group (the progress thread
// then takes it on). The Member stays with the queue until its group is done.
class StreamRequest final : public ManagedRequest {
 public:
  StreamRequest(std::weak_ptr<Queue> q, std::unique_ptr<ht_stream::Join> join, void* app)
      : q_(std::move(q)), join_(std::move(join)), app_(app) {}
  void on_test() override { join(); }
  void on_wait() override { join(); }
  void on_free() override { join(); }  // the stream must still wait for the result
  int error() const override { return err_.load(std::memory_order_acquire); }
  uint64_t seq = 0;  ///< its Member's (set before the application has the request)

 private:
  void join();
  std::weak_ptr<Queue> q_;
  std::unique_ptr<ht_stream::Join> join_;
  void* app_;
  std::atomic<bool> joined_{false};
  std::atomic<int> err_{MPI_SUCCESS};
};

struct Queue : std::enable_shared_from_this<Queue> {
  MPI_Comm comm = MPI_COMM_NULL;  ///< private duplicate: agreements and fused messages
  /// The duplicate's own context with route ht set up on it (made at open() where some
  /// rule may route an allreduce to ht, and agreed), or null: fused messages that the
  /// rules give to ht run there; its private communicators are the fused messages' alone,
  /// so their order is the group order on every rank.
  CommContext* ht_ctx = nullptr;
  /// The same context with route nccl set up on it (open(), STREAMCOLL_FUSION_NCCL), or
  /// null: fused messages on GPU memory that the rules give to nccl run there.
  CommContext* nccl_ctx = nullptr;
  /// Whether, at the last agreement of a group on GPU memory, every rank's NCCL
  /// communicator for fused messages was usable (at first: it was set up, on every rank
  /// alike). Agreed, so equal on every rank: groups are packed for route nccl, in GPU
  /// memory, only while it holds (nccl_pack_rule). Under mu.
  bool nccl_ok_last = true;
  int size = 1, nodes = 1, ppn = 1;  ///< the communicator's, for the fused message's CallKey
  /// The communicator context's (CommContext::async_error): a stream-ordered call's
  /// failure, found after the call returned, for the next call to report.
  std::shared_ptr<std::atomic<int>> async_error;
  /// The copy and hold streams of stream-ordered calls (Member::stage).
  ht_stream::Streams streams;
  uint64_t cycle_ns = 0;
  /// Calls up to this seq (Member::seq) are waited for or tested, or another call came:
  /// their groups close now. A close never reaches calls started after it.
  std::atomic<uint64_t> close_upto{0};
  uint64_t next_seq = 0;  ///< under mu: seq of the last call started
  void close_to(uint64_t seq) {
    uint64_t cur = close_upto.load(std::memory_order_relaxed);
    while (cur < seq && !close_upto.compare_exchange_weak(cur, seq, std::memory_order_acq_rel)) {}
  }
  bool close_wanted() const {  // under mu, pending not empty
    return close_upto.load(std::memory_order_acquire) >= pending.front()->seq;
  }

  std::mutex mu;
  std::deque<Member*> pending;  ///< started, in no agreed group yet (call order)
  std::atomic<size_t> open_calls{0};  ///< pending.size(), read without mu by poke()
  bool task_active = false;     ///< a Task steps this queue (under mu)

  // Under step_mu: the thread that steps the queue (the progress thread, or an application
  // thread waiting for one of its calls) starts the agreements and fused messages, so they
  // are started in group order, one thread at a time.
  std::mutex step_mu;
  std::atomic<uint64_t> stepped_ns{0};  ///< when the last step began
  std::atomic<uint64_t> idle_until{0};  ///< for the progress thread (Task::idle_until_ns)
  struct Group {
    std::vector<Member*> members;     ///< agreed (after the agreement)
    /// The packed contributions, then the result: GPU memory of route nccl's (`dev`) for
    /// a group packed for it, where it could be had; else pinned host memory from
    /// host_staging's cache when a member's buffer is on a GPU (the copies then run
    /// without the driver staging them again), else `own`.
    unsigned char* buf = nullptr;
    void* pinned = nullptr;
    std::vector<unsigned char> own;
    std::shared_ptr<void> dev;  ///< route nccl's nccl_stage::device_buffer, on GPU dev_device
    int dev_device = -1;
    /// Packed for route nccl (nccl_pack_rule, equal on every rank): its fused message
    /// goes there, or, where some rank's NCCL communicator is no longer usable, to the
    /// host after a second agreement (start_recovery).
    bool for_nccl = false;
    const config::Rule* pack_rule = nullptr;  ///< nccl_pack_rule's, where for_nccl
    Group() = default;
    Group(const Group&) = delete;
    Group& operator=(const Group&) = delete;
    ~Group() {
      if (pinned) host_staging::gpu_backend()->release(pinned);
    }
    void allocate(uint64_t bytes, const void* gpu) {
      if (gpu && bytes > 0)
        if (host_staging::Backend* b = host_staging::gpu_backend()) pinned = b->alloc(bytes, gpu);
      if (!pinned) own.resize(bytes);
      buf = pinned ? static_cast<unsigned char*>(pinned) : own.data();
    }
    MPI_Request req = MPI_REQUEST_NULL;
    /// This rank's count, ok flag, and whether its NCCL communicator for fused messages
    /// is usable (1) or not (0); agreed: their minimum over the ranks.
    int offered[3] = {0, 1, 0};
    int agreed[3] = {0, 0, 0};
    /// A group packed for nccl that goes to the host (start_recovery): this rank's ok,
    /// and every rank's (MIN).
    int recover[2] = {1, 0};
    RouteId route = RouteId::pmpi;    ///< the fused message's
  };
  std::unique_ptr<Group> agreeing;            ///< at most one agreement in flight
  std::unique_ptr<Group> recovering;          ///< or a second one (start_recovery)
  std::deque<std::unique_ptr<Group>> fused;   ///< fused messages in flight, in order

  std::atomic<uint64_t> calls{0}, messages{0}, agreements{0};

  // ---- the fused message's route and start (fusion_route.cpp) ----

  // The route of a fused message of `bytes` (CallKey convention) on host memory: the
  // rules in order (config::RuleWalk), as dispatch walks them for a call of that size (decided from the agreed group and rank-invariant state only, so
  // equal on every rank). Only pmpi and ht can start a fused message here (non-blocking,
  // host buffer, from the thread stepping the queue): a rule of another route goes on to
  // the next table rule, a forced one to pmpi, as a declining route does. (Groups on GPU
  // memory are offered to route nccl first: nccl_rule.)
  const config::Rule* fused_route(const Member& h, uint64_t bytes) const;

  // The rule that gives a fused message of `bytes` of h's group on GPU memory to route
  // nccl (the forced routes' rule for it, else the table's first), or null: none, or the
  // group is not on GPU memory, or route nccl is not set up for fused messages. From the
  // agreed group and rank-invariant state: equal on every rank.
  const config::Rule* nccl_rule(const Member& h, uint64_t bytes) const;

  // Whether the next group of h's run is packed for route nccl, and the rule that sends it
  // there: decided before the group is agreed (its size is not known yet), from facts
  // equal on every rank: route nccl set up for fused messages and usable on every rank
  // at the last agreement (nccl_ok_last), the run's agreed GPU memory, and the rules for
  // its smallest and largest group (one call, the fuse= limit), which must both say nccl
  // (a group packed for nccl goes there whatever its size), and route nccl taking its
  // type and op. Each rank then packs in GPU memory where it can have some, else in host
  // memory, which route nccl stages: only the route must be equal. Under mu.
  const config::Rule* nccl_pack_rule(const Member& h);

  // A fused message as a route takes it: an allreduce of count elements of h's type, in
  // place on `buf`, non-blocking, on the duplicate.
  CollArgs fused_args(const Member& h, uint64_t count, void* buf, MPI_Request* req) const;

  // Whether this rank can take part in a fused message on NCCL: set up, and its NCCL
  // communicator not aborted (a peer's failure notice, an asynchronous error). Local;
  // the agreement takes every rank's answer.
  bool nccl_usable_here() const;

  // Starts the fused message of group g (count elements of h's type, size_bytes in the
  // CallKey convention) on its route.
  int start_fused(Group& g, const Member& h, uint64_t count, uint64_t size_bytes);

  // Starts the agreed group's fused message. Under mu. Returns the calls to complete now
  // (the message could not start).
  std::vector<Member*> launch(std::unique_ptr<Group> g);

  ~Queue();  // (fusion.cpp)

  // ---- closing a group: packing, the agreement, unpacking (fusion_group.cpp) ----

  // The run at the head of `pending` (under mu): its length, and whether it is complete
  // (a later call that cannot join it is there already).
  size_t head_run(bool* complete) const;

  // Of the first n pending calls, how many in a row have their input at hand (a
  // stream-ordered call's copy in is done, or failed: then it is the call's own failure).
  // Under mu.
  size_t ready_prefix(size_t n);

  // Packs the first n pending calls and starts the agreement on how many the group holds.
  // Under mu.
  void start_agreement(size_t n);

  // Whether a member's buffer p (on a GPU: gpu) and g's GPU memory are both on g's GPU,
  // so that the batched-copy kernel may copy between them.
  static bool device_ends(const void* p, bool gpu, const Group& g);

  // The agreement is done: the group takes its calls and its fused message starts. Under
  // mu. Returns the calls to complete now (a failed group).
  std::vector<Member*> on_agreed();

  // The group's calls fail with err (a call's own failure stays its error).
  static void fail_group(Group& g, int err, std::vector<Member*>* done);

  // A group packed for route nccl, which some rank can no longer use (its NCCL
  // communicator aborted after a failure, and the others not yet told when they packed):
  // every rank knows it from the agreement, and the group goes to the host routes instead.
  // A rank that packed it in GPU memory copies it to host memory first; that copy could
  // fail on this rank alone, so a second agreement (the MIN of every rank's ok) precedes
  // the fused message, and nothing else is started on the duplicate meanwhile, so the
  // order of its collectives stays the same on every rank. Under mu.
  void start_recovery(std::unique_ptr<Group> g);

  // One step, never blocking; true when the queue has nothing left (the progress thread's
  // task then ends). Another thread stepping now: nothing (false).
  bool step();
};

}  // namespace streamcoll::fusion
