// The persistent collectives: MPI_<coll>_init (Open MPI 4.1: MPIX_<coll>_init), MPI_Start,
// MPI_Startall, and the table of streamcoll's persistent requests (shim/persistent.hpp:
// what the handle is, and how the wait/test family treats it).
//
//   MPI_Allreduce_init(...)   pass_through(): nothing can route it here -> the MPI's init
//     plan_persistent()        screened, agreed, routed and set up once
//                              (shim/dispatch_persistent.cpp)
//       no plan                -> the MPI's init; its starts are the MPI's own
//       the pmpi route         -> the MPI's init; the plan kept for its starts (the order
//                                 after this rank's stream, or the staged non-blocking form)
//       a route                -> a stand-in request, the plan kept
//   MPI_Start(handle)          not in the table -> the MPI's MPI_Start
//                              active -> MPI_ERR_REQUEST (starting an active request is
//                              erroneous)
//                              otherwise start_persistent(): no decision, no agreement
//   MPI_Startall               each of streamcoll's requests as MPI_Start, the others in
//                              one MPI_Startall (MPI lets Startall start them in any order)
// Thread safety: as MPI's (a request is started, waited for and freed by one thread at a
// time); the table is locked, never across a start's route.
#include "shim/persistent.hpp"

#include <mpi.h>

#include <mutex>
#include <unordered_map>

#include "base/log.hpp"
#include "core/next_mpi.hpp"
#include "shim/dispatch.hpp"
#include "shim/export.hpp"

namespace streamcoll::persistent {

std::atomic<int> g_planned{0};
std::atomic<int> g_active{0};

namespace {

struct Entry {
  PlanPtr plan;
  MPI_Comm comm = MPI_COMM_NULL;      ///< where misuse is raised
  MPI_Request inner = MPI_REQUEST_NULL;  ///< the running operation's request, while active
  bool active = false;
};

std::mutex g_mu;
std::unordered_map<MPI_Request, Entry> g_table;

// A request error raised as the MPI raises one for a request (MPI_ERR_REQUEST through the
// error handler of the request's communicator).
int misuse(MPI_Comm comm, const char* what) {
  log_error("%s", what);
  PMPI_Comm_call_errhandler(comm, MPI_ERR_REQUEST);
  return MPI_ERR_REQUEST;
}

// MPI_Start of one of streamcoll's requests (`e`, found under the lock, held in `lock`).
int start_planned(MPI_Request* handle, Entry& e, std::unique_lock<std::mutex>& lock) {
  if (e.active)
    return misuse(e.comm, "MPI_Start of a persistent collective request that is still active "
                          "(complete it with MPI_Wait or MPI_Test first)");
  // Claimed: a free or a second start of it now errs. (A plan on the MPI's own request
  // stays active only where its start was recorded into a CUDA graph: the MPI's request
  // keeps its own state otherwise, and *inner stays null.)
  e.active = true;
  PlanPtr plan = e.plan;
  lock.unlock();
  MPI_Request inner = MPI_REQUEST_NULL;
  const int rc = start_persistent(plan, handle, &inner);
  lock.lock();
  auto it = g_table.find(*handle);
  if (it == g_table.end()) return rc;  // (freed by another thread meanwhile: erroneous)
  if (inner == MPI_REQUEST_NULL) {
    it->second.active = false;  // complete at once, or never started
  } else {
    it->second.inner = inner;
    g_active.fetch_add(1, std::memory_order_release);
  }
  return rc;
}

int start(MPI_Request* handle) {
  std::unique_lock<std::mutex> lock(g_mu);
  auto it = g_table.find(*handle);
  if (it == g_table.end()) {
    lock.unlock();
    return SC_NEXT(MPI_Start)(handle);
  }
  return start_planned(handle, it->second, lock);
}

#if STREAMCOLL_HAVE_PCOLL
// MPICH 4.0's own persistent allgather gives wrong results from its second start on at 2
// and 4 ranks (each rank receives the peers' data of an earlier start; seen with MPICH
// 4.0 alone, a 30-line program). Its starts run as MPI_Iallgather on every rank instead: a
// fact of the MPI library, equal on every rank. Later versions are not known here, and
// keep the MPI's own request.
#if defined(MPICH_NUMVERSION) && MPICH_NUMVERSION < 40100000
constexpr bool kMpiAllgatherInitWrong = true;
#else
constexpr bool kMpiAllgatherInitWrong = false;
#endif

// A persistent collective's init: planned (shim/dispatch_persistent.cpp), then the request
// made: the MPI's own (`mpi_init`) where the starts use it or nothing is planned, else the
// stand-in.
template <class MpiInit>
int init(CollArgs a, MPI_Request* request, MpiInit mpi_init) {
  if (request == nullptr) return mpi_init();  // the MPI raises it
  a.request = request;
  int rc = MPI_SUCCESS;
  const bool avoid = kMpiAllgatherInitWrong && a.coll == Coll::allgather;
  PlanPtr plan = plan_persistent(a, avoid, &rc);
  if (rc != MPI_SUCCESS) return rc;
  if (!plan) return mpi_init();
  rc = plan_uses_mpi_request(*plan)
           ? mpi_init()
           : PMPI_Recv_init(nullptr, 0, MPI_BYTE, MPI_PROC_NULL, 0, a.comm, request);
  if (rc != MPI_SUCCESS) return rc;  // (the plan goes; the MPI raised the error)
  {
    std::lock_guard<std::mutex> lock(g_mu);
    Entry& e = g_table[*request];
    e.plan = std::move(plan);
    e.comm = a.comm;
  }
  g_planned.fetch_add(1, std::memory_order_release);
  return MPI_SUCCESS;
}

CollArgs args(Coll c, const void* s, void* r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm comm) {
  CollArgs a;
  a.coll = c;
  a.sendbuf = s;
  a.recvbuf = r;
  a.count = n;
  a.datatype = t;
  a.op = op;
  a.comm = comm;
  return a;
}

CollArgs gather_args(Coll c, const void* s, int sn, MPI_Datatype st, void* r, int rn,
                     MPI_Datatype rt, MPI_Comm comm) {
  CollArgs a;
  a.coll = c;
  a.sendbuf = s;
  a.sendcount = sn;
  a.sendtype = st;
  a.recvbuf = r;
  a.recvcount = rn;
  a.recvtype = rt;
  a.comm = comm;
  return a;
}
#endif

}  // namespace

MPI_Request running(MPI_Request handle) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_table.find(handle);
  return it != g_table.end() && it->second.active ? it->second.inner : MPI_REQUEST_NULL;
}

void finished(MPI_Request handle) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_table.find(handle);
  if (it == g_table.end() || !it->second.active) return;
  it->second.active = false;
  it->second.inner = MPI_REQUEST_NULL;
  g_active.fetch_sub(1, std::memory_order_release);
}

Substituted::Substituted(int n, const MPI_Request* requests) {
  if (!any_active() || n <= 0 || requests == nullptr) return;
  std::lock_guard<std::mutex> lock(g_mu);
  for (int i = 0; i < n; ++i) {
    auto it = g_table.find(requests[i]);
    if (it == g_table.end() || !it->second.active || it->second.inner == MPI_REQUEST_NULL)
      continue;
    if (v_.empty()) v_.assign(requests, requests + n);
    v_[i] = it->second.inner;
    subs_.emplace_back(i, requests[i]);
  }
}

void Substituted::restore(MPI_Request* requests) {
  size_t k = 0;
  for (size_t i = 0; i < v_.size(); ++i) {
    if (k < subs_.size() && subs_[k].first == static_cast<int>(i)) {
      if (v_[i] == MPI_REQUEST_NULL) finished(subs_[k].second);
      requests[i] = subs_[k++].second;
      continue;
    }
    requests[i] = v_[i];
  }
}

bool free_request(MPI_Request* handle, int* rc) {
  std::unique_lock<std::mutex> lock(g_mu);
  auto it = g_table.find(*handle);
  if (it == g_table.end()) return false;
  if (it->second.active) {
    const MPI_Comm comm = it->second.comm;
    lock.unlock();
    *rc = misuse(comm, "MPI_Request_free of an active persistent collective request "
                       "(complete it with MPI_Wait or MPI_Test first)");
    return true;
  }
  if (plan_uses_mpi_request(*it->second.plan)) {
    // The MPI's own request, whose state the MPI keeps: freed (or refused) by the MPI first.
    lock.unlock();
    const MPI_Request h = *handle;
    if ((*rc = SC_NEXT(MPI_Request_free)(handle)) != MPI_SUCCESS) return true;
    lock.lock();
    it = g_table.find(h);
    if (it == g_table.end()) return true;
  }
  const bool stand_in = !plan_uses_mpi_request(*it->second.plan);
  PlanPtr plan = std::move(it->second.plan);
  g_table.erase(it);
  g_planned.fetch_sub(1, std::memory_order_release);
  lock.unlock();
  plan.reset();  // (a graph that captured a start may hold it still)
  *rc = stand_in ? SC_NEXT(MPI_Request_free)(handle) : MPI_SUCCESS;
  return true;
}

}  // namespace streamcoll::persistent

namespace pers = streamcoll::persistent;

SC_EXPORT int MPI_Start(MPI_Request* request) {
  if (!pers::any_planned() || request == nullptr) return SC_NEXT(MPI_Start)(request);
  return pers::start(request);
}

SC_EXPORT int MPI_Startall(int count, MPI_Request requests[]) {
  if (!pers::any_planned() || requests == nullptr || count <= 0)
    return SC_NEXT(MPI_Startall)(count, requests);
  std::vector<MPI_Request> others;
  int rc = MPI_SUCCESS;
  for (int i = 0; i < count; ++i) {
    std::unique_lock<std::mutex> lock(pers::g_mu);
    auto it = pers::g_table.find(requests[i]);
    if (it == pers::g_table.end()) {
      others.push_back(requests[i]);
      continue;
    }
    const int r = pers::start_planned(&requests[i], it->second, lock);
    if (rc == MPI_SUCCESS) rc = r;
  }
  if (!others.empty()) {
    // (MPI_Startall does not change the handles it starts)
    const int r = SC_NEXT(MPI_Startall)(static_cast<int>(others.size()), others.data());
    if (rc == MPI_SUCCESS) rc = r;
  }
  return rc;
}

#if STREAMCOLL_HAVE_PCOLL
using streamcoll::Coll;
using streamcoll::gather_counts;
using streamcoll::pass_through;

// Each init: the pass-through fast path (nothing can route the collective here: the MPI's
// init, nothing kept), else planned.
SC_EXPORT int SC_PCOLL(Allreduce_init)(const void* s, void* r, int n, MPI_Datatype t, MPI_Op op,
                                       MPI_Comm c, MPI_Info info, MPI_Request* q) {
  auto mpi = [&] { return SC_NEXT(SC_PCOLL(Allreduce_init))(s, r, n, t, op, c, info, q); };
  if (pass_through(Coll::allreduce, c, s, r, n)) return mpi();
  return pers::init(pers::args(Coll::allreduce, s, r, n, t, op, c), q, mpi);
}
SC_EXPORT int SC_PCOLL(Reduce_init)(const void* s, void* r, int n, MPI_Datatype t, MPI_Op op,
                                    int root, MPI_Comm c, MPI_Info info, MPI_Request* q) {
  auto mpi = [&] { return SC_NEXT(SC_PCOLL(Reduce_init))(s, r, n, t, op, root, c, info, q); };
  if (pass_through(Coll::reduce, c, s, r, n)) return mpi();
  streamcoll::CollArgs a = pers::args(Coll::reduce, s, r, n, t, op, c);
  a.root = root;
  return pers::init(a, q, mpi);
}
SC_EXPORT int SC_PCOLL(Bcast_init)(void* b, int n, MPI_Datatype t, int root, MPI_Comm c,
                                   MPI_Info info, MPI_Request* q) {
  auto mpi = [&] { return SC_NEXT(SC_PCOLL(Bcast_init))(b, n, t, root, c, info, q); };
  if (pass_through(Coll::bcast, c, b, b, n)) return mpi();
  streamcoll::CollArgs a = pers::args(Coll::bcast, nullptr, b, n, t, MPI_OP_NULL, c);
  a.root = root;
  return pers::init(a, q, mpi);
}
SC_EXPORT int SC_PCOLL(Allgather_init)(const void* s, int sn, MPI_Datatype st, void* r, int rn,
                                       MPI_Datatype rt, MPI_Comm c, MPI_Info info,
                                       MPI_Request* q) {
  auto mpi = [&] { return SC_NEXT(SC_PCOLL(Allgather_init))(s, sn, st, r, rn, rt, c, info, q); };
  if (!pers::kMpiAllgatherInitWrong && pass_through(Coll::allgather, c, s, r, gather_counts(s, sn, rn)))
    return mpi();
  return pers::init(pers::gather_args(Coll::allgather, s, sn, st, r, rn, rt, c), q, mpi);
}
SC_EXPORT int SC_PCOLL(Allgatherv_init)(const void* s, int sn, MPI_Datatype st, void* r,
                                        const int rcs[], const int displs[], MPI_Datatype rt,
                                        MPI_Comm c, MPI_Info info, MPI_Request* q) {
  auto mpi = [&] {
    return SC_NEXT(SC_PCOLL(Allgatherv_init))(s, sn, st, r, rcs, displs, rt, c, info, q);
  };
  streamcoll::CollArgs a = pers::gather_args(Coll::allgatherv, s, sn, st, r, 0, rt, c);
  a.recvcounts = rcs;
  a.displs = displs;
  return pers::init(a, q, mpi);
}
SC_EXPORT int SC_PCOLL(Reduce_scatter_block_init)(const void* s, void* r, int n, MPI_Datatype t,
                                                  MPI_Op op, MPI_Comm c, MPI_Info info,
                                                  MPI_Request* q) {
  auto mpi = [&] {
    return SC_NEXT(SC_PCOLL(Reduce_scatter_block_init))(s, r, n, t, op, c, info, q);
  };
  if (pass_through(Coll::reduce_scatter_block, c, s, r, n)) return mpi();
  return pers::init(pers::args(Coll::reduce_scatter_block, s, r, n, t, op, c), q, mpi);
}
SC_EXPORT int SC_PCOLL(Reduce_scatter_init)(const void* s, void* r, const int rcs[],
                                            MPI_Datatype t, MPI_Op op, MPI_Comm c, MPI_Info info,
                                            MPI_Request* q) {
  auto mpi = [&] { return SC_NEXT(SC_PCOLL(Reduce_scatter_init))(s, r, rcs, t, op, c, info, q); };
  streamcoll::CollArgs a = pers::args(Coll::reduce_scatter, s, r, 0, t, op, c);
  a.recvcounts = rcs;
  return pers::init(a, q, mpi);
}
SC_EXPORT int SC_PCOLL(Alltoall_init)(const void* s, int sn, MPI_Datatype st, void* r, int rn,
                                      MPI_Datatype rt, MPI_Comm c, MPI_Info info,
                                      MPI_Request* q) {
  auto mpi = [&] { return SC_NEXT(SC_PCOLL(Alltoall_init))(s, sn, st, r, rn, rt, c, info, q); };
  if (pass_through(Coll::alltoall, c, s, r, gather_counts(s, sn, rn))) return mpi();
  return pers::init(pers::gather_args(Coll::alltoall, s, sn, st, r, rn, rt, c), q, mpi);
}
SC_EXPORT int SC_PCOLL(Barrier_init)(MPI_Comm c, MPI_Info info, MPI_Request* q) {
  auto mpi = [&] { return SC_NEXT(SC_PCOLL(Barrier_init))(c, info, q); };
  if (pass_through(Coll::barrier, c, &c, &c, 0)) return mpi();
  streamcoll::CollArgs a;
  a.coll = Coll::barrier;
  a.comm = c;
  return pers::init(a, q, mpi);
}
#endif
