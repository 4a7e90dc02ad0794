// The steady path (shim/steady.hpp).
#include "shim/steady.hpp"

#include <memory>

#include "algorithms/fusion.hpp"
#include "base/log.hpp"
#include "core/datatypes.hpp"
#include "core/pmpi_call.hpp"
#include "core/runtime.hpp"
#include "core/trace.hpp"
#include "shim/dispatch.hpp"

namespace streamcoll::steady {

thread_local Table* t_table __attribute__((tls_model("initial-exec"))) = nullptr;

namespace {

std::atomic<uint64_t> g_exited_calls{0};  // the steady calls of threads that have exited

// Frees the thread's table at its exit.
struct Owner {
  std::unique_ptr<Table> table;
  ~Owner() {
    if (table) g_exited_calls.fetch_add(table->calls, std::memory_order_relaxed);
    t_table = nullptr;
  }
};
thread_local Owner t_owner;

// The key of `a`; false for calls the steady path never takes (their arguments hold
// arrays, or they must stay local).
bool key_of(const CollArgs& a, Key* k) {
  if (a.nonblocking) return false;
  switch (a.coll) {
    case Coll::allreduce:
    case Coll::reduce_scatter_block:
      *k = reduction_key(a.coll, a.comm, a.count, a.datatype, a.op, 0, a.sendbuf);
      return true;
    case Coll::reduce:
      *k = reduction_key(a.coll, a.comm, a.count, a.datatype, a.op, a.root, a.sendbuf);
      return true;
    case Coll::bcast:
      *k = reduction_key(a.coll, a.comm, a.count, a.datatype, MPI_OP_NULL, a.root, a.sendbuf);
      return true;
    case Coll::allgather:
    case Coll::alltoall:
      *k = gather_key(a.coll, a.comm, a.sendbuf, a.sendcount, a.sendtype, a.recvcount,
                      a.recvtype);
      return true;
    case Coll::barrier:
      *k = Key{};
      k->comm = a.comm;
      k->what = what_of(a.coll, 0, false);
      return true;
    case Coll::allgatherv:
    case Coll::reduce_scatter:
      return false;
  }
  return false;
}

}  // namespace

void detail::poke_fusion(CommContext& ctx) { fusion::poke(*ctx.fusion); }

bool allowed() {
  const Runtime& rt = Runtime::get();
  return !rt.check_on() && !trace::nvtx_on() && !trace::timeline_on() &&
         !log_enabled(LogLevel::info);
}

uint64_t calls() {
  return g_exited_calls.load(std::memory_order_relaxed) + (t_table ? t_table->calls : 0);
}

bool call(const CollArgs& a, int* rc) {
  if (!t_table) return false;
  Key k;
  if (!key_of(a, &k)) return false;
  const void* sendbuf = a.coll == Coll::bcast ? nullptr : a.sendbuf;
  Entry* e = find(k, sendbuf, a.recvbuf);
  if (!e || !take(*e, k)) return false;
  if (!e->stats) {
    *rc = run_pmpi(a);
    return true;
  }
  const uint64_t t0 = stats_clock();
  *rc = run_pmpi(a);
  record_call(a.coll, false, RouteId::pmpi, MemKind::host, e->bytes, t0, e->choice);
  return true;
}

void remember(const CollArgs& a, const Decided& d) {
  Key k;
  if (!key_of(a, &k)) return;
  if (!t_table) {
    if (!d.ctx) return;
    t_owner.table = std::make_unique<Table>();
    t_table = t_owner.table.get();
  }
  Entry& e = slot(*t_table, k);
  // Predefined datatypes and ops only: a derived datatype's or a user op's handle may be
  // freed and given to another one, which the key could not tell apart.
  const bool in_place = k.what & 1u;
  const bool predefined =
      (a.coll == Coll::barrier ||
       (find_type(k.rtype) && (in_place || k.stype == k.rtype || find_type(k.stype)))) &&
      (!takes_op(a.coll) || find_op(a.op));
  if (!d.ctx || !d.sig || !predefined) {
    if (e.key == k) e = Entry{};
    return;
  }
  e.key = k;
  e.generation = remembered_generation();
  e.ctx = d.ctx;
  e.sig = d.sig;
  e.late = d.ctx->async_error.get();
  e.buffers = d.buffers;
  e.fused = d.ctx->fusion != nullptr;
  e.stats = Runtime::get().stats_on();
  e.bytes = d.bytes;
  e.choice = d.choice;
}

}  // namespace streamcoll::steady
