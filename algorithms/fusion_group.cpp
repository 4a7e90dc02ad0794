// Fusion: closing a group (algorithms/fusion.hpp, AGREEMENT and MEMORY): the calls at the
// head of the queue packed, the agreement on how many the group holds, the recovery of a
// group packed for route nccl that goes to the host, and the queue's step, which unpacks
// the fused messages that are done.
#include <mpi.h>

#include <climits>
#include <cstring>

#include "algorithms/fusion_queue.hpp"
#if STREAMCOLL_HAVE_NCCL
#include "algorithms/nccl.hpp"
#endif
#include "base/log.hpp"
#include "core/cuda_driver.hpp"
#include "core/host_staging.hpp"
#include "core/progress.hpp"
#include "core/requests.hpp"

namespace streamcoll::fusion {
namespace {

using detail::g_agreements;
using detail::now_ns;

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

size_t Queue::head_run(bool* complete) const {
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

size_t Queue::ready_prefix(size_t n) {
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

void Queue::start_agreement(size_t n) {
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

bool Queue::device_ends(const void* p, bool gpu, const Group& g) {
  return gpu && cuda::device_of(p) == g.dev_device;
}

std::vector<Member*> Queue::on_agreed() {
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

void Queue::fail_group(Group& g, int err, std::vector<Member*>* done) {
  for (Member* m : g.members) {
    if (m->error_ == MPI_SUCCESS) m->error_ = err;
    done->push_back(m);
  }
}

void Queue::start_recovery(std::unique_ptr<Group> g) {
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

bool Queue::step() {
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

}  // namespace streamcoll::fusion
