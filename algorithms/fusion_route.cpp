// Fusion: the fused message's route (algorithms/fusion.hpp, ROUTE): route nccl for a
// group on GPU memory where the rules and every rank allow it, else the table's route ht,
// else the MPI's MPI_Iallreduce; and its start once the group is agreed.
#include <mpi.h>

#include "algorithms/fusion_queue.hpp"
#include "algorithms/route.hpp"
#include "base/log.hpp"
#include "config/tuning_table.hpp"
#include "core/runtime.hpp"

namespace streamcoll::fusion {

using detail::g_gpu_packed;
using detail::g_messages;
using detail::g_on_route;
using detail::now_ns;

const config::Rule* Queue::fused_route(const Member& h, uint64_t bytes) const {
  const config::CallKey key{Coll::allreduce, bytes, size, nodes, ppn, MemKind::host, false};
  config::RuleWalk walk(Runtime::get().table(), h.forced ? h.forced->match(key) : nullptr, key);
  for (const config::Rule* r = walk.rule(); r; r = walk.next())
    if (r->choice.route == RouteId::ht && ht_ctx) return r;
  return nullptr;
}

const config::Rule* Queue::nccl_rule(const Member& h, uint64_t bytes) const {
  if (!nccl_ctx || (h.agreed_mem != MemKind::device && h.agreed_mem != MemKind::managed))
    return nullptr;
  const config::CallKey key{Coll::allreduce, bytes, size, nodes, ppn, MemKind::device, false};
  const config::Rule* r =
      config::RuleWalk(Runtime::get().table(), h.forced ? h.forced->match(key) : nullptr, key).rule();
  return r && r->choice.route == RouteId::nccl ? r : nullptr;
}

const config::Rule* Queue::nccl_pack_rule(const Member& h) {
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

CollArgs Queue::fused_args(const Member& h, uint64_t count, void* buf, MPI_Request* req) const {
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

bool Queue::nccl_usable_here() const {
  if (!nccl_ctx) return false;
  Route* nccl = find_route(RouteId::nccl);
  CollArgs a;
  a.coll = Coll::allreduce;
  a.nonblocking = true;
  a.comm = comm;
  return nccl && nccl->able_here(a, *nccl_ctx, CallEnv{});
}

int Queue::start_fused(Group& g, const Member& h, uint64_t count, uint64_t size_bytes) {
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

std::vector<Member*> Queue::launch(std::unique_ptr<Group> g) {
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

}  // namespace streamcoll::fusion
