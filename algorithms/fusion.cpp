// Fusion of small MPI_Iallreduce calls: the protocol is in fusion.hpp.
#include "algorithms/fusion.hpp"

#include <time.h>

#include <atomic>
#include <climits>
#include <cstring>
#include <deque>
#include <mutex>
#include <vector>

#include "algorithms/ht.hpp"
#if STREAMCOLL_HAVE_NCCL
#include "algorithms/nccl.hpp"
#endif
#include "algorithms/route.hpp"
#include "base/log.hpp"
#include "config/tuning_table.hpp"
#include "core/comm_context.hpp"
#include "core/cuda_driver.hpp"
#include "core/host_staging.hpp"
#include "core/progress.hpp"
#include "core/requests.hpp"
#include "core/runtime.hpp"
#include "core/service.hpp"

namespace streamcoll::fusion {
namespace {

// GPU memory from route nccl for a message packed on the GPU (nccl_stage::device_buffer),
// or null.
std::shared_ptr<void> nccl_device_buffer(CommContext& ctx, uint64_t bytes, int* device) {
#if STREAMCOLL_HAVE_NCCL
  return nccl_stage::device_buffer(ctx, bytes, device);
#else
  (void)ctx, (void)bytes, (void)device;
  return nullptr;
#endif
}

uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

std::atomic<uint64_t> g_calls{0}, g_messages{0}, g_agreements{0};
std::atomic<uint64_t> g_on_route[kNumRoutes] = {};  // fused messages per route
std::atomic<uint64_t> g_gpu_packed{0};  // fused messages packed in GPU memory

// The least time between two steps that waits and tests make (a wait polls every request
// of its array in turn; the progress thread steps regardless).
constexpr uint64_t kStepGapNs = 1000;


bool on_gpu(const void* p) {
  const MemKind k = cuda::classify(p);
  return k == MemKind::device || k == MemKind::managed;
}

}  // namespace

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

namespace {

// The copies between the fused buffer and the members' buffers of one group: host
// buffers by memcpy at once, GPU buffers gathered and issued together (host_staging's
// backend: every copy queued on the per-thread stream, then one synchronisation per GPU).
// A copy per member, each synchronised, cost about 10 us apiece on an H200, so a burst of
// small calls on device buffers spent its time there (bench/results/gpu_h200_2026-11-27).
class Copies {
 public:
  // device_ends: both ends are GPU memory of the GPU that holds `gpu` (or managed), so
  // the batched-copy kernel may take the copy (host_staging::Copy::device_ends).
  void add(void* dst, const void* src, uint64_t bytes, bool gpu_side, const void* gpu,
           bool device_ends = false) {
    if (bytes == 0) return;
    if (!gpu_side) {
      std::memcpy(dst, src, bytes);
      return;
    }
    gpu_.push_back(host_staging::Copy{dst, src, bytes, gpu, device_ends});
  }
  // Runs the GPU copies; MPI_SUCCESS or an error code (then any of them may not have run).
  int run() {
    if (gpu_.empty()) return MPI_SUCCESS;
    host_staging::Backend* b = host_staging::gpu_backend();
    const int rc = b ? b->copy(gpu_.data(), gpu_.size()) : MPI_ERR_OTHER;
    gpu_.clear();
    return rc;
  }

 private:
  std::vector<host_staging::Copy> gpu_;
};

}  // namespace

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

  // The route of a fused message of `bytes` (CallKey convention) on host memory: the
  // rules in order (config::RuleWalk), as dispatch walks them for a call of that size (decided from the agreed group and rank-invariant state only, so
  // equal on every rank). Only pmpi and ht can start a fused message here (non-blocking,
  // host buffer, from the thread stepping the queue): a rule of another route goes on to
  // the next table rule, a forced one to pmpi, as a declining route does. (Groups on GPU
  // memory are offered to route nccl first: nccl_rule.)
  const config::Rule* fused_route(const Member& h, uint64_t bytes) const {
    const config::CallKey key{Coll::allreduce, bytes, size, nodes, ppn, MemKind::host, false};
    config::RuleWalk walk(Runtime::get().table(), h.forced ? h.forced->match(key) : nullptr, key);
    for (const config::Rule* r = walk.rule(); r; r = walk.next())
      if (r->choice.route == RouteId::ht && ht_ctx) return r;
    return nullptr;
  }

  // The rule that gives a fused message of `bytes` of h's group on GPU memory to route
  // nccl (the forced routes' rule for it, else the table's first), or null: none, or the
  // group is not on GPU memory, or route nccl is not set up for fused messages. From the
  // agreed group and rank-invariant state: equal on every rank.
  const config::Rule* nccl_rule(const Member& h, uint64_t bytes) const {
    if (!nccl_ctx || (h.agreed_mem != MemKind::device && h.agreed_mem != MemKind::managed))
      return nullptr;
    const config::CallKey key{Coll::allreduce, bytes, size, nodes, ppn, MemKind::device, false};
    const config::Rule* r =
        config::RuleWalk(Runtime::get().table(), h.forced ? h.forced->match(key) : nullptr, key).rule();
    return r && r->choice.route == RouteId::nccl ? r : nullptr;
  }

  // Whether the next group of h's run is packed for route nccl, and the rule that sends it
  // there: decided before the group is agreed (its size is not known yet), from facts
  // equal on every rank: route nccl set up for fused messages and usable on every rank
  // at the last agreement (nccl_ok_last), the run's agreed GPU memory, and the rules for
  // its smallest and largest group (one call, the fuse= limit), which must both say nccl
  // (a group packed for nccl goes there whatever its size), and route nccl taking its
  // type and op. Each rank then packs in GPU memory where it can have some, else in host
  // memory, which route nccl stages: only the route must be equal. Under mu.
  const config::Rule* nccl_pack_rule(const Member& h) {
    if (!nccl_ok_last) return nullptr;
    const config::Rule* r = nccl_rule(h, h.limit);
    if (!r || !nccl_rule(h, h.size_bytes)) return nullptr;
    Route* nccl = find_route(RouteId::nccl);
    CallEnv agreed;
    agreed.mem = agreed.agreed_mem = MemKind::device;
    agreed.fused = true;
    return nccl && nccl->accepts(fused_args(h, 0, nullptr, nullptr), *nccl_ctx, r->choice, agreed)
               ? r
               : nullptr;
  }

  // A fused message as a route takes it: an allreduce of count elements of h's type, in
  // place on `buf`, non-blocking, on the duplicate.
  CollArgs fused_args(const Member& h, uint64_t count, void* buf, MPI_Request* req) const {
    CollArgs a;
    a.coll = Coll::allreduce;
    a.nonblocking = true;
    a.sendbuf = MPI_IN_PLACE;
    a.recvbuf = buf;
    a.count = static_cast<int>(count);
    a.datatype = h.type;
    a.op = h.op;
    a.comm = comm;
    a.request = req;
    return a;
  }

  // Whether this rank can take part in a fused message on NCCL: set up, and its NCCL
  // communicator not aborted (a peer's failure notice, an asynchronous error). Local;
  // the agreement takes every rank's answer.
  bool nccl_usable_here() const {
    if (!nccl_ctx) return false;
    Route* nccl = find_route(RouteId::nccl);
    CollArgs a;
    a.coll = Coll::allreduce;
    a.nonblocking = true;
    a.comm = comm;
    return nccl && nccl->able_here(a, *nccl_ctx, CallEnv{});
  }

  // Starts the fused message of group g (count elements of h's type, size_bytes in the
  // CallKey convention) on its route.
  int start_fused(Group& g, const Member& h, uint64_t count, uint64_t size_bytes) {
    const CollArgs a = fused_args(h, count, g.buf, &g.req);
    // Route nccl: a group packed for it (every rank's NCCL communicator usable, on_agreed:
    // the rule found at packing), or one whose size the rules give to it where every rank
    // offered it.
    const config::Rule* rule = g.for_nccl ? g.pack_rule
                               : g.agreed[2] == 1 ? nccl_rule(h, size_bytes)
                                                  : nullptr;
    if (rule) {
      CallEnv agreed;  // what every rank decides from: GPU memory, a fused message
      agreed.mem = agreed.agreed_mem = MemKind::device;
      agreed.fused = true;
      Route* nccl = find_route(RouteId::nccl);
      // accepts() decides from the agreed set-up, the type and op alone: equal everywhere
      // (for a group packed for nccl, as it did at packing).
      if (nccl && nccl->accepts(a, *nccl_ctx, rule->choice, agreed)) {
        SC_TRACE("fusion: fused message of %llu B on route nccl (%s), packed in %s memory",
                 static_cast<unsigned long long>(size_bytes), rule->origin.c_str(),
                 g.dev ? "GPU" : "host");
        CallEnv here;  // GPU memory on route nccl's GPU; host memory: route nccl stages it
        here.agreed_mem = MemKind::device;
        here.fused = true;
        if (g.dev) {
          here.mem = MemKind::device;
          here.device = g.dev_device;
        }
        g.route = RouteId::nccl;
        return nccl->run(a, *nccl_ctx, rule->choice, here);
      }
      if (g.for_nccl) return MPI_ERR_OTHER;  // not reached: packing asked the same
    }
    if (const config::Rule* rule = fused_route(h, size_bytes)) {
      CallEnv env;  // host memory on every rank, no stream
      Route* ht = find_route(RouteId::ht);
      if (ht && ht->accepts(a, *ht_ctx, rule->choice, env)) {
        SC_TRACE("fusion: fused message of %llu B on route ht (%s)",
                 static_cast<unsigned long long>(size_bytes), rule->origin.c_str());
        g.route = RouteId::ht;
        return ht->run(a, *ht_ctx, rule->choice, env);
      }
      // accepts() decides from the agreed set-up alone: no rank takes ht here.
    }
    g.route = RouteId::pmpi;
    return PMPI_Iallreduce(MPI_IN_PLACE, g.buf, static_cast<int>(count), h.type, h.op,
                           comm, &g.req);
  }

  ~Queue() {
    if (comm != MPI_COMM_NULL) PMPI_Comm_free(&comm);
  }

  // The run at the head of `pending` (under mu): its length, and whether it is complete
  // (a later call that cannot join it is there already).
  size_t head_run(bool* complete) const {
    *complete = false;
    if (pending.empty()) return 0;
    const Member& h = *pending.front();
    uint64_t size = 0, count = 0;
    size_t n = 0;
    for (const Member* m : pending) {
      if (n > 0 && (m->type != h.type || m->op != h.op || m->limit != h.limit ||
                    m->forced != h.forced || m->agreed_mem != h.agreed_mem ||
                    size + m->size_bytes > h.limit ||
                    count + static_cast<uint64_t>(m->count) > static_cast<uint64_t>(INT_MAX))) {
        *complete = true;
        break;
      }
      size += m->size_bytes;
      count += static_cast<uint64_t>(m->count);
      ++n;
    }
    return n;
  }

  // Of the first n pending calls, how many in a row have their input at hand (a
  // stream-ordered call's copy in is done, or failed: then it is the call's own failure).
  // Under mu.
  size_t ready_prefix(size_t n) {
    for (size_t i = 0; i < n; ++i) {
      Member& m = *pending[i];
      if (!m.stage) continue;
      int rc = MPI_SUCCESS;
      const ht_stream::Stage::Input in = m.stage->input(&rc);
      if (in == ht_stream::Stage::Input::pending) return i;
      if (in == ht_stream::Stage::Input::failed && m.error_ == MPI_SUCCESS) m.error_ = rc;
    }
    return n;
  }

  // Packs the first n pending calls and starts the agreement on how many the group holds.
  // Under mu.
  void start_agreement(size_t n) {
    auto g = std::make_unique<Group>();
    uint64_t total = 0;
    for (size_t i = 0; i < n; ++i) total += pending[i]->bytes;
    g->pack_rule = nccl_pack_rule(*pending.front());
    g->for_nccl = g->pack_rule != nullptr;
    // Where it is packed is this rank's own choice: in GPU memory when it can have some,
    // unless a member is stream-ordered (its contribution is in pinned memory already,
    // and its result goes back there: host packing copies less).
    bool staged = false;
    for (size_t i = 0; i < n && !staged; ++i) staged = pending[i]->stage != nullptr;
    if (g->for_nccl && total > 0 && !staged)
      if (find_route(RouteId::nccl)) {
        g->dev = nccl_device_buffer(*nccl_ctx, total, &g->dev_device);
        if (g->dev) g->buf = static_cast<unsigned char*>(g->dev.get());
      }
    if (!g->dev) {
      const void* gpu = nullptr;  // a GPU buffer of the group's, if any
      for (size_t i = 0; i < n && !gpu; ++i)
        gpu = pending[i]->send_gpu ? pending[i]->send : pending[i]->recv_gpu ? pending[i]->recv : nullptr;
      g->allocate(total, gpu);
    }
    uint64_t off = 0;
    bool ok = true;
    Copies copies;
    for (size_t i = 0; i < n && ok; ++i) {
      const Member& m = *pending[i];
      // A call that failed on this rank at its start (own) fails its group everywhere too.
      ok = m.error_ == MPI_SUCCESS;
      if (ok && g->dev)
        copies.add(g->buf + off, m.send, m.bytes, true, g->buf, device_ends(m.send, m.send_gpu, *g));
      else if (ok)
        copies.add(g->buf + off, m.send, m.bytes, m.send_gpu, m.send);
      off += m.bytes;
    }
    // Run even when !ok: nothing queued may still be copying when the buffer goes.
    if (copies.run() != MPI_SUCCESS) ok = false;
    g->offered[0] = static_cast<int>(n);
    g->offered[1] = ok ? 1 : 0;
    const MemKind kind = pending.front()->agreed_mem;
    g->offered[2] = (kind == MemKind::device || kind == MemKind::managed) && nccl_usable_here();
    agreements.fetch_add(1, std::memory_order_relaxed);
    g_agreements.fetch_add(1, std::memory_order_relaxed);
    SC_TRACE("fusion: offering %zu calls (seq %llu..) at %llu us%s", n,
             static_cast<unsigned long long>(pending.front()->seq),
             static_cast<unsigned long long>(now_ns() / 1000),
             progress::on_engine_thread() ? " (progress thread)" : "");
    const int rc = PMPI_Iallreduce(g->offered, g->agreed, 3, MPI_INT, MPI_MIN, comm, &g->req);
    if (rc != MPI_SUCCESS) {
      // Without the agreement no rank can know the group: fail the calls this rank
      // offered (the others' agreement fails alike, or they report a peer failure).
      SC_WARN("fusion: the agreement's MPI_Iallreduce failed (%d); %zu calls fail", rc, n);
      g->agreed[0] = static_cast<int>(n);
      g->agreed[1] = -1;
      g->req = MPI_REQUEST_NULL;
    }
    agreeing = std::move(g);
  }

  // Whether a member's buffer p (on a GPU: gpu) and g's GPU memory are both on g's GPU,
  // so that the batched-copy kernel may copy between them.
  static bool device_ends(const void* p, bool gpu, const Group& g) {
    return gpu && cuda::device_of(p) == g.dev_device;
  }

  // The agreement is done: the group takes its calls and its fused message starts. Under
  // mu. Returns the calls to complete now (a failed group).
  std::vector<Member*> on_agreed() {
    std::unique_ptr<Group> g = std::move(agreeing);
    const size_t k = static_cast<size_t>(g->agreed[0]);
    g->members.assign(pending.begin(), pending.begin() + static_cast<long>(k));
    pending.erase(pending.begin(), pending.begin() + static_cast<long>(k));
    open_calls.store(pending.size(), std::memory_order_relaxed);
    std::vector<Member*> done;
    int err = MPI_SUCCESS;
    if (g->agreed[1] != 1) err = MPI_ERR_OTHER;  // a copy failed on some rank, or the agreement
    const MemKind kind = g->members.front()->agreed_mem;
    if (g->agreed[1] != -1 && (kind == MemKind::device || kind == MemKind::managed))
      nccl_ok_last = g->agreed[2] == 1;  // agreed: equal on every rank
    if (err == MPI_SUCCESS && g->for_nccl && g->agreed[2] != 1) {
      start_recovery(std::move(g));
      return done;
    }
    if (err == MPI_SUCCESS) return launch(std::move(g));
    fail_group(*g, err, &done);
    return done;
  }

  // The group's calls fail with err (a call's own failure stays its error).
  static void fail_group(Group& g, int err, std::vector<Member*>* done) {
    for (Member* m : g.members) {
      if (m->error_ == MPI_SUCCESS) m->error_ = err;
      done->push_back(m);
    }
  }

  // Starts the agreed group's fused message. Under mu. Returns the calls to complete now
  // (the message could not start).
  std::vector<Member*> launch(std::unique_ptr<Group> g) {
    std::vector<Member*> done;
    uint64_t count = 0, bytes = 0, size_bytes = 0;
    for (const Member* m : g->members) {
      count += static_cast<uint64_t>(m->count);
      bytes += m->bytes;
      size_bytes += m->size_bytes;
    }
    if (int err = start_fused(*g, *g->members.front(), count, size_bytes); err != MPI_SUCCESS) {
      fail_group(*g, err, &done);
      return done;
    }
    SC_TRACE("fusion: %zu calls agreed at %llu us; fused message of %llu B", g->members.size(),
             static_cast<unsigned long long>(now_ns() / 1000), static_cast<unsigned long long>(bytes));
    messages.fetch_add(1, std::memory_order_relaxed);
    g_messages.fetch_add(1, std::memory_order_relaxed);
    g_on_route[static_cast<int>(g->route)].fetch_add(1, std::memory_order_relaxed);
    if (g->dev) g_gpu_packed.fetch_add(1, std::memory_order_relaxed);
    fused.push_back(std::move(g));
    return done;
  }

  // A group packed for route nccl, which some rank can no longer use (its NCCL
  // communicator aborted after a failure, and the others not yet told when they packed):
  // every rank knows it from the agreement, and the group goes to the host routes instead.
  // A rank that packed it in GPU memory copies it to host memory first; that copy could
  // fail on this rank alone, so a second agreement (the MIN of every rank's ok) precedes
  // the fused message, and nothing else is started on the duplicate meanwhile, so the
  // order of its collectives stays the same on every rank. Under mu.
  void start_recovery(std::unique_ptr<Group> g) {
    SC_INFO("fusion: a group packed for route nccl goes to the host routes (some rank's "
            "NCCL communicator is no longer usable)");
    g->for_nccl = false;
    g->recover[0] = 1;
    if (g->dev) {
      uint64_t bytes = 0;
      for (const Member* m : g->members) bytes += m->bytes;
      std::shared_ptr<void> dev = std::move(g->dev);
      g->allocate(bytes, dev.get());
      Copies copies;
      copies.add(g->buf, dev.get(), bytes, true, dev.get());
      if (copies.run() != MPI_SUCCESS) g->recover[0] = 0;
    }
    g->req = MPI_REQUEST_NULL;
    agreements.fetch_add(1, std::memory_order_relaxed);
    g_agreements.fetch_add(1, std::memory_order_relaxed);
    if (PMPI_Iallreduce(&g->recover[0], &g->recover[1], 1, MPI_INT, MPI_MIN, comm, &g->req) !=
        MPI_SUCCESS) {
      SC_WARN("fusion: the second agreement's MPI_Iallreduce failed; the group's calls fail");
      g->recover[1] = -1;
      g->req = MPI_REQUEST_NULL;
    }
    recovering = std::move(g);
  }

  // One step, never blocking; true when the queue has nothing left (the progress thread's
  // task then ends). Another thread stepping now: nothing (false).
  bool step() {
    std::unique_lock<std::mutex> stepping(step_mu, std::try_to_lock);
    if (!stepping.owns_lock()) return false;
    stepped_ns.store(now_ns(), std::memory_order_relaxed);
    std::vector<Member*> done;
    bool idle = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      // Fused messages complete in order (MPI completes a communicator's collectives in
      // any order, but testing the oldest first is enough).
      while (!fused.empty()) {
        Group& g = *fused.front();
        // Routes nccl's and ht's requests are streamcoll's own: PMPI_Test does not poll
        // them, and their MPI request completes on the thread that advances them
        // (core/requests.hpp), here.
        if (OwnedRequest* o = requests::peek(g.req))
          if (!o->advance()) break;
        int flag = 0;
        const int rc = PMPI_Test(&g.req, &flag, MPI_STATUS_IGNORE);
        if (rc == MPI_SUCCESS && !flag) break;
        SC_TRACE("fusion: fused message of %zu calls done at %llu us", g.members.size(),
                 static_cast<unsigned long long>(now_ns() / 1000));
        uint64_t off = 0;
        Copies copies;
        for (Member* m : g.members) {
          if (rc != MPI_SUCCESS) m->error_ = rc;
          else if (g.dev)
            copies.add(m->recv, g.buf + off, m->bytes, true, g.buf, device_ends(m->recv, m->recv_gpu, g));
          else copies.add(m->recv, g.buf + off, m->bytes, m->recv_gpu, m->recv);
          off += m->bytes;
          done.push_back(m);
        }
        // A failed batch fails every call with a GPU receive buffer, or every call when the
        // fused buffer is in GPU memory (which of its copies ran is not known); the others
        // have their results.
        if (int c = copies.run(); c != MPI_SUCCESS)
          for (Member* m : g.members)
            if ((m->recv_gpu || g.dev) && m->bytes > 0 && m->error_ == MPI_SUCCESS) m->error_ = c;
        fused.pop_front();
      }
      if (recovering) {
        int flag = 1;
        if (recovering->req != MPI_REQUEST_NULL &&
            PMPI_Test(&recovering->req, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
          recovering->recover[1] = -1;
          flag = 1;
        }
        if (flag) {
          std::unique_ptr<Group> g = std::move(recovering);
          std::vector<Member*> failed;
          if (g->recover[1] == 1) failed = launch(std::move(g));
          else fail_group(*g, MPI_ERR_OTHER, &failed);
          done.insert(done.end(), failed.begin(), failed.end());
        }
      }
      if (agreeing) {
        int flag = 1;
        if (agreeing->req != MPI_REQUEST_NULL &&
            PMPI_Test(&agreeing->req, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
          agreeing->agreed[0] = agreeing->offered[0];
          agreeing->agreed[1] = -1;
          flag = 1;
        }
        if (flag) {
          std::vector<Member*> failed = on_agreed();
          done.insert(done.end(), failed.begin(), failed.end());
        }
      }
      bool awaiting_input = false;  // a group to close, its first call's input not in yet
      if (!agreeing && !recovering && !pending.empty()) {
        bool complete = false;
        const size_t n = head_run(&complete);
        if (complete || close_wanted() ||
            now_ns() - pending.front()->started_ns >= cycle_ns) {
          // Stream-ordered calls take part once their input is in pinned memory: a rank
          // offers those in a row that are (at least one; it closes nothing before).
          const size_t ready = ready_prefix(n);
          if (ready > 0) start_agreement(ready);
          else awaiting_input = true;
        }
      }
      idle = !agreeing && !recovering && fused.empty() && pending.empty();
      if (idle) task_active = false;
      // When the progress thread must step again: with only calls waiting for the cycle
      // time, when it ends (poke() wakes it earlier); with messages in flight, at once,
      // even while an application thread steps the queue too. (Leaving the polling to a
      // waiting application thread, whose waits back off to sleeps, stalled fused calls
      // over TCP for 0.2 to 2 s now and then: Open MPI's TCP BTL is progressed by its
      // event loop, which opal_progress runs only every so many calls; measured on the
      // test cluster, bench/results/fusion_2026-11-26.)
      idle_until.store(!idle && !agreeing && !recovering && fused.empty() && !awaiting_input
                           ? pending.front()->started_ns + cycle_ns
                           : 0,
                       std::memory_order_relaxed);
    }
    // Outside the lock: once complete, the application may free a request at any time.
    for (Member* m : done) m->retire(async_error.get());
    return idle;
  }
};

void Member::on_test() {
  if (completed()) return;
  std::shared_ptr<Queue> q = q_.lock();
  if (!q) return;
  q->close_to(seq);
  // A wait polls every request of its array in turn: one step per kStepGapNs is enough.
  const uint64_t now = now_ns();
  if (now - q->stepped_ns.load(std::memory_order_relaxed) >= kStepGapNs) q->step();
  // And the progress thread polls too while messages are in flight (it may sleep until
  // the cycle ends otherwise): this thread's wait backs off to sleeps, and Open MPI's TCP
  // transport, progressed by an event loop that opal_progress runs only every so many
  // calls, then stalled for tenths of seconds (bench/results/fusion_2026-11-26).
  progress::wake();
}

void StreamRequest::join() {
  if (joined_.exchange(true)) return;
  err_.store(join_->wait_on(app_), std::memory_order_release);
  if (std::shared_ptr<Queue> q = q_.lock()) {
    q->close_to(seq);
    progress::wake();  // the progress thread closes the group: this thread does not wait
  }
  complete();
}

namespace {

class QueueTask final : public progress::Task {
 public:
  explicit QueueTask(std::shared_ptr<Queue> q) : q_(std::move(q)) {}
  bool step() override { return q_->step(); }
  uint64_t idle_until_ns() const override {
    return q_->idle_until.load(std::memory_order_relaxed);
  }

 private:
  std::shared_ptr<Queue> q_;
};

}  // namespace

namespace {

// Whether some rule of `t` may route an allreduce to `route` (on GPU memory: gpu).
bool routes(const config::TuningTable* t, RouteId route, bool gpu = false) {
  if (!t) return false;
  const unsigned gpu_mems = 1u << static_cast<int>(MemKind::device) |
                            1u << static_cast<int>(MemKind::managed);
  for (const config::Rule& r : t->rules())
    if (r.choice.route == route && (r.colls >> static_cast<int>(Coll::allreduce) & 1u) &&
        (!gpu || (r.mems & gpu_mems)))
      return true;
  return false;
}

// A blocking allreduce of one int: the call routes set themselves up at (accepts() looks
// at the arguments' shape only, never at the buffers).
CollArgs set_up_call(MPI_Comm comm) {
  static int scratch[2];
  CollArgs a;
  a.coll = Coll::allreduce;
  a.sendbuf = &scratch[0];
  a.recvbuf = &scratch[1];
  a.count = 1;
  a.datatype = MPI_INT;
  a.op = MPI_SUM;
  a.comm = comm;
  return a;
}

}  // namespace

std::shared_ptr<Queue> open(const CommContext& ctx,
                            const std::shared_ptr<const config::TuningTable>& forced,
                            int device) {
  auto q = std::make_shared<Queue>();
  if (PMPI_Comm_dup(ctx.comm, &q->comm) != MPI_SUCCESS) {
    q->comm = MPI_COMM_NULL;
    SC_WARN("fusion: MPI_Comm_dup failed; MPI_Iallreduce calls on this communicator are "
            "not fused");
    return nullptr;
  }
  PMPI_Comm_set_errhandler(q->comm, MPI_ERRORS_RETURN);
  q->cycle_ns = Runtime::get().settings().fusion_cycle_us * 1000;
  q->size = ctx.size;
  q->async_error = ctx.async_error;
  q->nodes = ctx.nodes;
  q->ppn = ctx.ppn;
  // The routes for the fused messages are set up on the duplicate's own context where a
  // rule may ask for them. Both set-ups are collective (every rank is here, at the same
  // blocking call): a rank whose duplicate has no context (it could not be made) cannot
  // enter them, so every rank learns first whether all have one.
  Route* ht = find_route(RouteId::ht);
  Route* nccl = find_route(RouteId::nccl);
  const config::TuningTable* table = &Runtime::get().table();
  const bool want_ht = ht && (routes(table, RouteId::ht) || routes(forced.get(), RouteId::ht));
  // STREAMCOLL_FUSION_NCCL is a job-wide setting, equal on every rank.
  const bool want_nccl =
      nccl && Runtime::get().settings().fusion_nccl &&
      (routes(table, RouteId::nccl, true) || routes(forced.get(), RouteId::nccl, true));
  CommContext* dup = nullptr;
  if (want_ht || want_nccl) {
    dup = comm_context(q->comm, true);
    if (!service::all(dup != nullptr, q->comm)) {
      SC_INFO("fusion: no context for the queue's duplicate on some rank: fused messages "
              "run on route pmpi");
      dup = nullptr;
    }
  }
  // Route ht: kept only where its set-up worked on every rank.
  if (want_ht && dup) {
    const bool ok = ht->accepts(set_up_call(q->comm), *dup, config::RouteChoice{}, CallEnv{});
    if (service::all(ok, q->comm)) q->ht_ctx = dup;
    SC_INFO("fusion: route ht for fused messages %s",
            q->ht_ctx ? "set up" : "not available (some rank could not set it up)");
  }
  // Route nccl for fused messages on GPU memory: its set-up is all-or-nothing
  // (algorithms/nccl.cpp), and every rank reaches it alike: accepts() answers from the
  // call's shape and the duplicate's state before it.
  if (want_nccl && dup) {
    CallEnv env;
    env.mem = env.agreed_mem = MemKind::device;
    env.device = device;
    if (nccl->accepts(set_up_call(q->comm), *dup, config::RouteChoice{}, env)) q->nccl_ctx = dup;
    SC_INFO("fusion: route nccl for fused messages on GPU memory %s",
            q->nccl_ctx ? "set up" : "not available");
  }
  return q;
}

int start(Queue& q, const CollArgs& a, uint64_t limit, const CallEnv& env, int own,
          std::shared_ptr<const config::TuningTable> forced, int (*sync_stream)(void*)) {
  int size = 0;
  MPI_Aint lb = 0, extent = 0;
  if (PMPI_Type_size(a.datatype, &size) != MPI_SUCCESS ||
      PMPI_Type_get_extent(a.datatype, &lb, &extent) != MPI_SUCCESS)
    return MPI_ERR_TYPE;
  auto* m = new Member(q.weak_from_this());
  m->send = a.sendbuf == MPI_IN_PLACE ? a.recvbuf : a.sendbuf;
  m->recv = a.recvbuf;
  m->count = a.count;
  m->type = a.datatype;
  m->op = a.op;
  m->limit = limit;
  m->agreed_mem = env.agreed_mem;
  m->forced = std::move(forced);
  m->bytes = static_cast<uint64_t>(a.count) * static_cast<uint64_t>(extent);
  m->size_bytes = static_cast<uint64_t>(a.count) * static_cast<uint64_t>(size);
  m->started_ns = now_ns();
  // env.has_stream (the agreed facts have a stream, this rank's buffers are on a GPU):
  // stream-ordered, staged on streams (the host does not wait). Where staging cannot start and nothing of it will write
  // the buffers, the stream is synchronised and the call goes on as one without a stream.
  // Any other failure is the call's own: it still takes its part, as every rank's call
  // must, and its group fails on every rank (the agreement's ok flag).
  std::unique_ptr<ht_stream::Join> join;
  if (env.has_stream && m->bytes > 0 && own == MPI_SUCCESS) {
    bool untouched = true;
    own = ht_stream::start(q.streams, env.device, env.stream, m->send, m->recv, m->bytes,
                           q.async_error, &m->stage, &join, &untouched);
    if (own == MPI_SUCCESS) {
      m->send = m->recv = m->stage->buffer();
    } else if (untouched) {
      SC_INFO("fusion: a stream-ordered MPI_Iallreduce could not be staged on streams; "
              "synchronising the stream instead");
      own = sync_stream(env.stream);
    }
  }
  if (!m->stage && m->bytes > 0 && env.mem != MemKind::host && env.mem != MemKind::pinned) {
    m->send_gpu = on_gpu(m->send);
    m->recv_gpu = on_gpu(m->recv);
  }
  m->error_ = own;
  StreamRequest* sreq = nullptr;
  if (m->stage) {
    m->queue_owned = true;
    sreq = new StreamRequest(q.weak_from_this(), std::move(join), env.stream);
    if (int rc = start_request(sreq, a.request); rc != MPI_SUCCESS) {  // sreq deleted
      // No request to hand back: the call still takes its part, failed (as every rank's
      // call must: the others fuse it).
      own = m->error_ = rc;
      sreq = nullptr;
      *a.request = MPI_REQUEST_NULL;
    }
  } else if (int rc = start_request(m, a.request); rc != MPI_SUCCESS) {
    return rc;  // m deleted (as before stream-ordered calls: nothing started)
  }
  q.calls.fetch_add(1, std::memory_order_relaxed);
  g_calls.fetch_add(1, std::memory_order_relaxed);
  bool submit = false;
  uint64_t seq = 0;
  {
    std::lock_guard<std::mutex> lock(q.mu);
    seq = m->seq = ++q.next_seq;
    q.pending.push_back(m);
    q.open_calls.store(q.pending.size(), std::memory_order_relaxed);
    if (!q.task_active) submit = q.task_active = true;
  }
  if (sreq) sreq->seq = seq;  // m may be gone already (retired): use the copy
  if (submit)
    SC_TRACE("fusion: call seq %llu opens the queue's task at %llu us",
             static_cast<unsigned long long>(seq), static_cast<unsigned long long>(now_ns() / 1000));
  if (submit && !progress::submit(new QueueTask(q.shared_from_this()))) {
    // After MPI_Finalize began: nothing can run the group.
    SC_WARN("fusion: the progress thread is stopped; the call cannot complete");
    return MPI_ERR_OTHER;
  }
  return own;
}

void poke(Queue& q) {
  if (q.open_calls.load(std::memory_order_relaxed) != 0) {
    uint64_t last;
    {
      std::lock_guard<std::mutex> lock(q.mu);
      last = q.next_seq;
    }
    q.close_to(last);
    progress::wake();
  }
}

Counts counts(const Queue& q) {
  return {q.calls.load(), q.messages.load(), q.agreements.load()};
}

Counts process_counts() { return {g_calls.load(), g_messages.load(), g_agreements.load()}; }

uint64_t process_messages_on(RouteId route) {
  return g_on_route[static_cast<int>(route)].load(std::memory_order_relaxed);
}

uint64_t process_messages_packed_on_gpu() { return g_gpu_packed.load(std::memory_order_relaxed); }

}  // namespace streamcoll::fusion
