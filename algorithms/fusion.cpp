// Fusion of small MPI_Iallreduce calls: the protocol is in fusion.hpp. Here: its entry
// points (open, start, poke, the counts), the waits and tests of its requests, and the
// task that steps a queue on the progress thread; the queue itself is in fusion_queue.hpp
// (closing a group: fusion_group.cpp; the fused message's route: fusion_route.cpp).
#include "algorithms/fusion.hpp"

#include <atomic>
#include <memory>
#include <mutex>

#include "algorithms/fusion_queue.hpp"
#include "algorithms/ht.hpp"
#include "algorithms/route.hpp"
#include "base/log.hpp"
#include "config/tuning_table.hpp"
#include "core/comm_context.hpp"
#include "core/cuda_driver.hpp"
#include "core/progress.hpp"
#include "core/requests.hpp"
#include "core/runtime.hpp"
#include "core/service.hpp"

namespace streamcoll::fusion {

namespace detail {

std::atomic<uint64_t> g_calls{0}, g_messages{0}, g_agreements{0};
std::atomic<uint64_t> g_on_route[kNumRoutes] = {};  // fused messages per route
std::atomic<uint64_t> g_gpu_packed{0};  // fused messages packed in GPU memory

}  // namespace detail

using detail::g_agreements;
using detail::g_calls;
using detail::g_gpu_packed;
using detail::g_messages;
using detail::g_on_route;
using detail::now_ns;

namespace {

// The least time between two steps that waits and tests make (a wait polls every request
// of its array in turn; the progress thread steps regardless).
constexpr uint64_t kStepGapNs = 1000;

bool on_gpu(const void* p) {
  const MemKind k = cuda::classify(p);
  return k == MemKind::device || k == MemKind::managed;
}

}  // namespace

Queue::~Queue() {
  if (comm != MPI_COMM_NULL) PMPI_Comm_free(&comm);
}

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
