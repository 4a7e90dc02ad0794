// host_routes: the host-transfer route (ht) on host buffers, end to end with real MPI
// processes. Every collective the route carries (MPI_Allreduce, MPI_Reduce, MPI_Bcast,
// MPI_Allgather, MPI_Reduce_scatter_block, blocking and MPI_I*) runs with each of the
// route's algorithms (rd, rabenseifner, ring, mpi) over the predefined datatypes and the
// reduction ops MPI defines for them (MPI-4.0 section 6.9.2), in place and not, roots 0
// and size - 1, counts 1, 7, size, 1000 (and 40000 for a few types).
//
// Every result is checked twice: against values computed here by plain loops over what
// each rank contributed, and against the real MPI's own answer, computed in this process
// by calling the PMPI_ entry point (which streamcoll does not intercept) on copies of the
// same buffers just before the call under test. Nothing but the result may be written:
// receive buffers carry sentinels after the result (on non-root ranks of MPI_Reduce, in the
// whole buffer) that must survive, an in-place MPI_Reduce_scatter_block must leave the
// blocks after its result as they were, and send buffers must come back unchanged. MPI_Reduce
// also runs with recvbuf = NULL off the root.
//
// Routing. Each algorithm gets its own duplicate of MPI_COMM_WORLD, routed with
// streamcoll_comm_set_route(dup, "*:ht:algo=ALGO"), so one run covers all four; the odd and
// even halves of world (split, reversed) get one algorithm per collective; world itself is
// not routed (the control: its calls go to pmpi). With --routes=env the program sets no
// route: STREAMCOLL_ROUTE (e.g. "*:ht:algo=ring") routes world and split.
// With STREAMCOLL_EXPECT_INTERCEPT=1 (tests/mpi/run.sh sets it with STREAMCOLL_STATS=1 in
// preload and linked modes) streamcoll_get_stats must show each call on its route:
// ("allreduce", "ht", "host") +1 for a blocking call on a routed communicator,
// ("iallreduce", ...) for MPI_Iallreduce, ("...", "pmpi") for count 0, for types and
// collectives the route does not carry (pair types, MPI_Allgatherv, MPI_Alltoall,
// MPI_Reduce_scatter) and for unrouted communicators; the total +1 per call.
// --expect-route=pmpi expects every call on pmpi (STREAMCOLL_THREAD_MULTIPLE=0: the route
// is off). Without streamcoll (plain mode) the routing is not checked, the results are.
//
// Also: 8 batches of 64 MPI_I* collectives in flight at once across the routed
// communicators, mixed in one request array with MPI_Isend/MPI_Irecv, each batch completed
// with another completion call (MPI_Waitall, MPI_Waitany, MPI_Testall, MPI_Waitsome,
// MPI_Testsome, MPI_Wait, MPI_Test, MPI_Testany); blocking calls while MPI_I* calls are in
// flight on the same communicators; with --thread=multiple, three threads calling
// collectives at once, each on its own communicator; the thread level (MPI_Init_thread's
// `provided` and MPI_Query_thread equal the level asked for, --thread=LEVEL, default
// funneled); the progress thread "sc-progress" (present after the first MPI_I* call on the
// route, absent after MPI_Finalize, absent when the route is off); streamcoll_comm_set_route's
// errors (MPI_COMM_NULL, a spec that does not parse) and clearing a route ("").
// MPI_Request_free is not used: MPI-4.0 section 6.12 makes freeing a non-blocking
// collective's request erroneous.
//
// --route=blueconnect runs the same checks on route blueconnect
// (algorithms/blueconnect.cpp), which carries MPI_Allreduce, MPI_Reduce_scatter_block and
// MPI_Allgather (and their MPI_I* forms) only: MPI_Reduce and MPI_Bcast join the
// collectives expected on pmpi. The duplicates of world get specs
// "*:blueconnect:hierarchy=H:backend=B[:algo=ring]" with H running over every ordered
// factorization of the size into factors >= 2 (4: 2x2, 4; 6: 2x3, 3x2, 6; 8: 2x2x2, 2x4,
// 4x2, 8), crossed with backends (sched, mpi, one per level mixed such as sched/mpi or
// mpi/sched/sched) and algo=ring, at most 8 duplicates (the list goes to stderr). The even
// half of world gets one spec per carried collective with a hierarchy of its size; the odd
// half gets specs the route must decline (a hierarchy that does not multiply to its size, a
// backend list of the wrong length): its calls go to pmpi. What each spec routes comes from
// a model of the route's documented rules (bc_label below), for STREAMCOLL_ROUTE too.
// Each routed communicator is warmed up with one blocking call of each carried collective
// (the route sets itself up, and creates the mpi backend's sub-communicators, only at a
// blocking call); the phase "MPI_I* before a blocking call" checks that rule itself on a
// fresh duplicate. The route takes MPI_I* calls only under MPI_THREAD_MULTIPLE:
// --expect-route=blocking expects its blocking calls on the route and MPI_I* on pmpi
// (STREAMCOLL_THREAD_MULTIPLE=0).
//
// Inputs are exact under any reduction order (see collectives_check.cpp, whose input model
// this follows). --density=N runs N variants (count, in place, root, blocking or not) of each
// (collective, algorithm, datatype, op); by default all of them on 1 rank, 8 on 2 to
// 4 ranks, 4 beyond (then variants rotate over the datatypes, so all occur).
// Rank 0 prints "N passed, N failed"; the exit code is nonzero on any failure.
//
// Build:  mpicxx -std=c++17 -O2 -I include tests/mpi/host_routes.cpp -ldl
#define OMPI_SKIP_MPICXX 1  // the C API only
#define MPICH_SKIP_MPICXX 1
#include <dirent.h>
#include <dlfcn.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <complex>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "harness.hpp"
#include "streamcoll/streamcoll.h"
#include "type_table.hpp"
#include "value_model.hpp"

namespace {


bool mpich_reduce_in_place_broken() {
  static const bool broken = [] {
    char lib[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
    int len = 0, major = 0, minor = 0;
    MPI_Get_library_version(lib, &len);
    return mpich_version(lib, &major, &minor) && major == 4 && minor <= 1;
  }();
  return broken;
}

// ------------------------------------------------------------------- buffers, comms

// The collectives: the first five are the ones the route carries.
enum class Coll { allreduce, reduce, bcast, allgather, rsb, allgatherv, alltoall, reduce_scatter };
constexpr int kCarried = 5;
const char* stat_name(Coll c) {
  static const char* n[] = {
      "allreduce",  "reduce",   "bcast",         "allgather", "reduce_scatter_block",
      "allgatherv", "alltoall", "reduce_scatter"};
  return n[static_cast<int>(c)];
}
const char* call_name(Coll c, bool nb) {
  static const char* b[] = {"MPI_Allreduce",
                            "MPI_Reduce",
                            "MPI_Bcast",
                            "MPI_Allgather",
                            "MPI_Reduce_scatter_block",
                            "MPI_Allgatherv",
                            "MPI_Alltoall",
                            "MPI_Reduce_scatter"};
  static const char* i[] = {"MPI_Iallreduce",
                            "MPI_Ireduce",
                            "MPI_Ibcast",
                            "MPI_Iallgather",
                            "MPI_Ireduce_scatter_block",
                            "MPI_Iallgatherv",
                            "MPI_Ialltoall",
                            "MPI_Ireduce_scatter"};
  return (nb ? i : b)[static_cast<int>(c)];
}
bool takes_op(Coll c) {
  return c == Coll::allreduce || c == Coll::reduce || c == Coll::rsb || c == Coll::reduce_scatter;
}

struct Comm {
  MPI_Comm handle = MPI_COMM_NULL;
  std::string name;
  int rank = 0, size = 1;
  std::string algo[kCarried];  // per carried collective: the ht algorithm (blueconnect: the
                               // spec's parameters); "" = not routed
  bool routed(Coll c) const {
    return static_cast<int>(c) < kCarried && !algo[static_cast<int>(c)].empty();
  }
  std::string algo_of(Coll c) const {
    return static_cast<int>(c) < kCarried && !algo[static_cast<int>(c)].empty()
               ? algo[static_cast<int>(c)]
               : "-";
  }
};

constexpr size_t kGuard = 3;  // sentinel elements after each receive region

// ----------------------------------------------------------------- results and reports

struct CallInfo {
  std::string call;  // "MPI_Iallreduce"
  std::string how;   // "blocking", or how the request was completed
  const Comm* comm = nullptr;
  std::string algo = "-";
  const TypeDesc* type = nullptr;
  Op op = Op::none;
  long count = -1;
  int root = -1;
  bool in_place = false;
  std::string note;  // more about the call, e.g. " recvbuf=NULL"
};

class Tally {
 public:
  void init(int world_rank) { rank_ = world_rank; }
  void pass() { ++passed_; }
  void fail(const CallInfo& c, const std::string& what) {
    ++failed_;
    if (printed_ < kMaxPrinted) {
      ++printed_;
      std::string line = "FAIL rank " + std::to_string(rank_) + ": " + c.call + " [" + c.how +
                         "] comm=" + (c.comm ? c.comm->name : "-") + " algo=" + c.algo +
                         " type=" + (c.type ? c.type->name : "-") + " op=" + name_of(c.op) +
                         " count=" + (c.count >= 0 ? std::to_string(c.count) : "-") +
                         " root=" + (c.root >= 0 ? std::to_string(c.root) : "-") +
                         " in_place=" + (c.in_place ? "yes" : "no") + c.note +
                         (c.comm ? " comm_rank=" + std::to_string(c.comm->rank) : "") + ": " +
                         what + "\n";
      std::fputs(line.c_str(), stderr);
    } else if (printed_ == kMaxPrinted) {
      ++printed_;
      std::fprintf(stderr, "FAIL rank %d: further failures on this rank are not shown\n", rank_);
    }
  }
  void check(bool ok, const CallInfo& c, const std::function<std::string()>& what) {
    if (ok)
      pass();
    else
      fail(c, what());
  }
  long long passed() const { return passed_; }
  long long failed() const { return failed_; }

 private:
  static constexpr int kMaxPrinted = 20;
  int rank_ = 0, printed_ = 0;
  long long passed_ = 0, failed_ = 0;
};

Tally g_tally;

std::string mpi_error(int rc) {
  char s[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS) return "error " + std::to_string(rc);
  return "error " + std::to_string(rc) + " (" + std::string(s, static_cast<size_t>(len)) + ")";
}

bool check_rc(int rc, const CallInfo& c, const char* what) {
  g_tally.check(rc == MPI_SUCCESS, c,
                [&] { return std::string(what) + " returned " + mpi_error(rc); });
  return rc == MPI_SUCCESS;
}

// ------------------------------------------------------------ streamcoll, found at run time

using GetStats = int (*)(const char*, const char*, const char*, streamcoll_stat_t*);
using SetRoute = int (*)(MPI_Comm, const char*);

// --expect-route: the route (ht or blueconnect, as --route says), pmpi for every call, or
// the route for blocking calls only (blueconnect without MPI_THREAD_MULTIPLE).
enum class Expect { route, pmpi, blocking };

struct Streamcoll {
  bool expected = false;  // STREAMCOLL_EXPECT_INTERCEPT=1
  GetStats get = nullptr;
  SetRoute set_route = nullptr;
  Expect expect = Expect::route;
  const char* route = "ht";  // --route: the route under test, as the statistics name it
  bool env_routes = false;   // --routes=env
  long long baseline = 0, calls_made = 0;

  bool loaded() const { return get != nullptr; }
  bool active() const { return expected && get != nullptr; }
  bool blueconnect() const { return std::strcmp(route, "blueconnect") == 0; }
  long long calls(const char* coll, const char* route, const char* mem) const {
    streamcoll_stat_t s{0, 0, 0.0};
    if (get(coll, route, mem, &s) != 0) return -1;
    return static_cast<long long>(s.calls);
  }
};

Streamcoll g_sc;

// Whether a blocking call is counted under the route under test (else under pmpi) ...
bool goes_to_route(const Comm& c, Coll coll, const TypeDesc* t, long count) {
  return g_sc.expect != Expect::pmpi && c.routed(coll) && count > 0 && t && t->routable();
}
// ... given that its blocking form would be (`routed`) and whether it is MPI_I* (`nb`).
bool on_route(bool routed, bool nb) { return routed && !(nb && g_sc.expect == Expect::blocking); }

// One call's counters: its collective on its route +1, and the total +1.
class StatProbe {
 public:
  StatProbe(const std::string& stat, bool routed) : stat_(stat), routed_(routed) {
    if (!g_sc.active()) return;
    one_ = g_sc.calls(stat_.c_str(), route(), mem());
    all_ = g_sc.calls(nullptr, nullptr, nullptr);
  }
  void verify(const CallInfo& c) const {
    ++g_sc.calls_made;
    if (!g_sc.active()) return;
    const long long one = g_sc.calls(stat_.c_str(), route(), mem());
    const long long all = g_sc.calls(nullptr, nullptr, nullptr);
    g_tally.check(one_ >= 0 && one - one_ == 1, c, [&] {
      return "streamcoll_get_stats(\"" + stat_ + "\", \"" + route() + "\", " +
             (mem() ? "\"host\"" : "NULL") + ") went from " + std::to_string(one_) + " to " +
             std::to_string(one) + ", expected +1" +
             (all == all_ + 1 ? " (the call was counted elsewhere)" : "");
    });
    g_tally.check(all_ >= 0 && all - all_ == 1, c, [&] {
      return "streamcoll_get_stats(all) went from " + std::to_string(all_) + " to " +
             std::to_string(all) + ", expected +1";
    });
  }

 private:
  const char* route() const { return routed_ ? g_sc.route : "pmpi"; }
  const char* mem() const { return routed_ ? "host" : nullptr; }
  std::string stat_;
  bool routed_;
  long long one_ = 0, all_ = 0;
};

// ------------------------------------------------------------------ completing requests

void complete(std::vector<MPI_Request>& reqs, Completion how, const CallInfo& c) {
  int rc = MPI_SUCCESS;
  const std::string problem = complete_requests(reqs, how, &rc);
  if (!check_rc(rc, c, describe(how))) return;
  g_tally.check(problem.empty(), c, [&] { return std::string(describe(how)) + ": " + problem; });
}

// ------------------------------------------------------------------ one collective call

// A call with its buffers, the result computed here (`want`) and the real MPI's (`ref`).
struct Pending {
  Coll coll = Coll::allreduce;
  CallInfo info;
  const Kernel* k = nullptr;
  bool routed = false;      // the blocking call is counted under the route (else pmpi)
  Buffer send, recv, want;  // want: what recv must hold in [0, check_end)
  Buffer send_copy;         // send as filled: must come back unchanged
  Buffer ref_send, ref_recv;
  size_t check_end = 0;
  size_t data_end = SIZE_MAX;  // where what the call must leave alone begins (sentinels;
                               // in-place MPI_Reduce_scatter_block: the other input blocks)
  std::vector<int> counts, displs;
  // The call under test (blocking when req is null) and the same call through PMPI_.
  std::function<int(MPI_Request* req)> call;
  std::function<int(void* send, void* recv)> pmpi_call;
  MPI_Request req = MPI_REQUEST_NULL;
  bool started = false, ref_ok = false;

  // Remembers the buffers as filled; `want` starts as recv is (sentinels included).
  void snapshot() {
    if (send.size() > 0) send_copy = send.copy();
    want = recv.copy();
    ref_send = send.copy();
    ref_recv = recv.copy();
  }
};
using PendingPtr = std::unique_ptr<Pending>;

uint64_t g_salt = 0;
std::vector<std::pair<std::string, double>> g_phases;

void begin_phase(const std::string& name) {
  g_phases.emplace_back(name, MPI_Wtime());
  g_salt = static_cast<uint64_t>(g_phases.size()) << 32;
}

int g_rotation = 0;

void fill(const TypeDesc& t, void* dst, size_t n, Op op, int rank, uint64_t first, uint64_t salt) {
  t.k.fill(dst, n, op, rank, first, salt, tame_inputs(t, op));
}
void fill_reduced(const TypeDesc& t, void* dst, size_t n, Op op, int nranks, uint64_t first,
                  uint64_t salt) {
  t.k.reduce(dst, n, op, nranks, first, salt, tame_inputs(t, op));
}
void fill_sentinel(const TypeDesc& t, Buffer& b, int rank, uint64_t salt) {
  t.k.fill(b.data(), b.size(), Op::none, -1 - rank, 0, salt ^ 0x5e47111e1ull, false);
}

struct Case {
  Coll coll;
  const TypeDesc* type;
  Op op;
  long count;  // elements per rank (per block for allgather, reduce_scatter_block)
  int root;    // reduce and bcast; -1 otherwise
  bool in_place;
  bool null_recv = false;  // reduce: ranks other than the root pass recvbuf = NULL
};

// Builds the buffers, the expected result and the two calls of one case on one comm.
PendingPtr make(const Comm& c, const Case& cs) {
  auto p = std::make_unique<Pending>();
  const TypeDesc& t = *cs.type;
  p->coll = cs.coll;
  p->k = &t.k;
  p->routed = goes_to_route(c, cs.coll, &t, cs.count);
  p->info.call = call_name(cs.coll, false);
  p->info.comm = &c;
  p->info.algo = c.algo_of(cs.coll);
  p->info.type = &t;
  p->info.op = cs.op;
  p->info.count = cs.count;
  p->info.root = cs.root;
  p->info.in_place = cs.in_place;
  const uint64_t salt = ++g_salt;
  const size_t n = static_cast<size_t>(cs.count), sz = static_cast<size_t>(c.size);
  const Op op = cs.op;
  const int me = c.rank, root = cs.root;
  // MPICH 4.0/4.1 crash on a blocking in-place MPI_Reduce at a root other than 0 (the
  // pmpi reference, and the MPI's own path: pmodels/mpich#6540): not in place there.
  const bool ip = cs.in_place &&
                  !(cs.coll == Coll::reduce && cs.root != 0 && mpich_reduce_in_place_broken());
  const MPI_Datatype dt = t.handle;
  const MPI_Op mop = handle_of(op);
  const MPI_Comm h = c.handle;
  const int cnt = static_cast<int>(cs.count);
  Pending* q = p.get();
  switch (cs.coll) {
    case Coll::allreduce:
      p->recv = Buffer(n + kGuard, t.k.size);
      fill_sentinel(t, p->recv, me, salt);
      if (ip) {
        fill(t, p->recv.data(), n, op, me, 0, salt);
      } else {
        p->send = Buffer(n, t.k.size);
        fill(t, p->send.data(), n, op, me, 0, salt);
      }
      p->snapshot();
      fill_reduced(t, p->want.data(), n, op, c.size, 0, salt);
      p->check_end = n + kGuard;
      p->call = [q, ip, cnt, dt, mop, h](MPI_Request* r) {
        const void* s = ip ? MPI_IN_PLACE : q->send.data();
        return r ? MPI_Iallreduce(s, q->recv.data(), cnt, dt, mop, h, r)
                 : MPI_Allreduce(s, q->recv.data(), cnt, dt, mop, h);
      };
      p->pmpi_call = [ip, cnt, dt, mop, h](void* s, void* d) {
        return PMPI_Allreduce(ip ? MPI_IN_PLACE : s, d, cnt, dt, mop, h);
      };
      break;
    case Coll::reduce: {
      // Every rank passes a receive buffer full of sentinels; off the root it must stay so.
      const bool is_root = me == root;
      p->recv = Buffer(n + kGuard, t.k.size);
      fill_sentinel(t, p->recv, me, salt);
      if (is_root && ip) {
        fill(t, p->recv.data(), n, op, me, 0, salt);
      } else {
        p->send = Buffer(n, t.k.size);
        fill(t, p->send.data(), n, op, me, 0, salt);
      }
      p->snapshot();
      if (is_root) fill_reduced(t, p->want.data(), n, op, c.size, 0, salt);
      p->check_end = n + kGuard;
      const bool use_ip = is_root && ip;
      // recvbuf is significant at the root only: off the root it may be NULL.
      const bool null_recv = cs.null_recv && !is_root;
      if (null_recv) p->info.note = " recvbuf=NULL";
      p->call = [q, use_ip, null_recv, cnt, dt, mop, root, h](MPI_Request* r) {
        const void* s = use_ip ? MPI_IN_PLACE : q->send.data();
        void* d = null_recv ? nullptr : q->recv.data();
        return r ? MPI_Ireduce(s, d, cnt, dt, mop, root, h, r)
                 : MPI_Reduce(s, d, cnt, dt, mop, root, h);
      };
      p->pmpi_call = [use_ip, null_recv, cnt, dt, mop, root, h](void* s, void* d) {
        return PMPI_Reduce(use_ip ? MPI_IN_PLACE : s, null_recv ? nullptr : d, cnt, dt, mop, root,
                           h);
      };
      break;
    }
    case Coll::bcast:
      p->recv = Buffer(n + kGuard, t.k.size);
      fill_sentinel(t, p->recv, me, salt);
      if (me == root) fill(t, p->recv.data(), n, Op::none, root, 0, salt);
      p->snapshot();
      fill(t, p->want.data(), n, Op::none, root, 0, salt);
      p->check_end = n + kGuard;
      p->call = [q, cnt, dt, root, h](MPI_Request* r) {
        return r ? MPI_Ibcast(q->recv.data(), cnt, dt, root, h, r)
                 : MPI_Bcast(q->recv.data(), cnt, dt, root, h);
      };
      p->pmpi_call = [cnt, dt, root, h](void*, void* d) { return PMPI_Bcast(d, cnt, dt, root, h); };
      break;
    case Coll::allgather:
      // In place, the send count and type are ignored: 0 and MPI_DATATYPE_NULL.
      p->recv = Buffer(n * sz + kGuard, t.k.size);
      fill_sentinel(t, p->recv, me, salt);
      if (ip) {
        fill(t, p->recv.at(n * me), n, Op::none, me, 0, salt);
      } else {
        p->send = Buffer(n, t.k.size);
        fill(t, p->send.data(), n, Op::none, me, 0, salt);
      }
      p->snapshot();
      for (int r = 0; r < c.size; ++r) fill(t, p->want.at(n * r), n, Op::none, r, 0, salt);
      p->check_end = n * sz + kGuard;
      p->call = [q, ip, cnt, dt, h](MPI_Request* r) {
        const void* s = ip ? MPI_IN_PLACE : q->send.data();
        const int sn = ip ? 0 : cnt;
        const MPI_Datatype st = ip ? MPI_DATATYPE_NULL : dt;
        return r ? MPI_Iallgather(s, sn, st, q->recv.data(), cnt, dt, h, r)
                 : MPI_Allgather(s, sn, st, q->recv.data(), cnt, dt, h);
      };
      p->pmpi_call = [ip, cnt, dt, h](void* s, void* d) {
        return ip ? PMPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, d, cnt, dt, h)
                  : PMPI_Allgather(s, cnt, dt, d, cnt, dt, h);
      };
      break;
    case Coll::rsb:
      // In place the input is the whole receive buffer; the result replaces its first block
      // and nothing else is written (MPI-4.0 section 6.10.1): the other blocks keep this
      // rank's input, and the sentinels after them survive.
      if (ip) {
        p->recv = Buffer(n * sz + kGuard, t.k.size);
        fill_sentinel(t, p->recv, me, salt);
        fill(t, p->recv.data(), n * sz, op, me, 0, salt);
        p->check_end = n * sz + kGuard;
      } else {
        p->send = Buffer(n * sz, t.k.size);
        fill(t, p->send.data(), n * sz, op, me, 0, salt);
        p->recv = Buffer(n + kGuard, t.k.size);
        fill_sentinel(t, p->recv, me, salt);
        p->check_end = n + kGuard;
      }
      p->snapshot();
      fill_reduced(t, p->want.data(), n, op, c.size, n * me, salt);
      p->call = [q, ip, cnt, dt, mop, h](MPI_Request* r) {
        const void* s = ip ? MPI_IN_PLACE : q->send.data();
        return r ? MPI_Ireduce_scatter_block(s, q->recv.data(), cnt, dt, mop, h, r)
                 : MPI_Reduce_scatter_block(s, q->recv.data(), cnt, dt, mop, h);
      };
      p->pmpi_call = [ip, cnt, dt, mop, h](void* s, void* d) {
        return PMPI_Reduce_scatter_block(ip ? MPI_IN_PLACE : s, d, cnt, dt, mop, h);
      };
      break;
    case Coll::allgatherv: {  // rank r contributes count + r elements, blocks back to back
      p->counts.resize(sz);
      p->displs.resize(sz);
      size_t total = 0;
      for (int r = 0; r < c.size; ++r) {
        p->counts[r] = cnt == 0 ? 0 : cnt + r;
        p->displs[r] = static_cast<int>(total);
        total += static_cast<size_t>(p->counts[r]);
      }
      const size_t mine = static_cast<size_t>(p->counts[me]);
      p->recv = Buffer(total + kGuard, t.k.size);
      fill_sentinel(t, p->recv, me, salt);
      p->send = Buffer(mine, t.k.size);
      fill(t, p->send.data(), mine, Op::none, me, 0, salt);
      p->snapshot();
      for (int r = 0; r < c.size; ++r)
        fill(t, p->want.at(p->displs[r]), p->counts[r], Op::none, r, 0, salt);
      p->check_end = total + kGuard;
      const int sn = static_cast<int>(mine);
      p->call = [q, sn, dt, h](MPI_Request* r) {
        return r ? MPI_Iallgatherv(q->send.data(), sn, dt, q->recv.data(), q->counts.data(),
                                   q->displs.data(), dt, h, r)
                 : MPI_Allgatherv(q->send.data(), sn, dt, q->recv.data(), q->counts.data(),
                                  q->displs.data(), dt, h);
      };
      p->pmpi_call = [q, sn, dt, h](void* s, void* d) {
        return PMPI_Allgatherv(s, sn, dt, d, q->counts.data(), q->displs.data(), dt, h);
      };
      break;
    }
    case Coll::alltoall:  // rank s sends element k of block d as its element d * n + k
      p->send = Buffer(n * sz, t.k.size);
      fill(t, p->send.data(), n * sz, Op::none, me, 0, salt);
      p->recv = Buffer(n * sz + kGuard, t.k.size);
      fill_sentinel(t, p->recv, me, salt);
      p->snapshot();
      for (int s = 0; s < c.size; ++s) fill(t, p->want.at(n * s), n, Op::none, s, n * me, salt);
      p->check_end = n * sz + kGuard;
      p->call = [q, cnt, dt, h](MPI_Request* r) {
        return r ? MPI_Ialltoall(q->send.data(), cnt, dt, q->recv.data(), cnt, dt, h, r)
                 : MPI_Alltoall(q->send.data(), cnt, dt, q->recv.data(), cnt, dt, h);
      };
      p->pmpi_call = [cnt, dt, h](void* s, void* d) {
        return PMPI_Alltoall(s, cnt, dt, d, cnt, dt, h);
      };
      break;
    case Coll::reduce_scatter: {  // rank r gets count + r % 2 elements
      p->counts.resize(sz);
      size_t total = 0, first = 0;
      for (int r = 0; r < c.size; ++r) {
        p->counts[r] = cnt == 0 ? 0 : cnt + r % 2;
        if (r == me) first = total;
        total += static_cast<size_t>(p->counts[r]);
      }
      const size_t mine = static_cast<size_t>(p->counts[me]);
      p->send = Buffer(total, t.k.size);
      fill(t, p->send.data(), total, op, me, 0, salt);
      p->recv = Buffer(mine + kGuard, t.k.size);
      fill_sentinel(t, p->recv, me, salt);
      p->snapshot();
      fill_reduced(t, p->want.data(), mine, op, c.size, first, salt);
      p->check_end = mine + kGuard;
      p->call = [q, dt, mop, h](MPI_Request* r) {
        return r ? MPI_Ireduce_scatter(q->send.data(), q->recv.data(), q->counts.data(), dt, mop, h,
                                       r)
                 : MPI_Reduce_scatter(q->send.data(), q->recv.data(), q->counts.data(), dt, mop, h);
      };
      p->pmpi_call = [q, dt, mop, h](void* s, void* d) {
        return PMPI_Reduce_scatter(s, d, q->counts.data(), dt, mop, h);
      };
      break;
    }
  }
  if (p->check_end >= kGuard) p->data_end = p->check_end - kGuard;
  if (cs.coll == Coll::rsb && ip) p->data_end = n;  // past the result: input, then sentinels
  if (cs.coll == Coll::reduce && me != root) p->data_end = 0;  // all sentinels off the root
  return p;
}

// The real MPI's answer on copies of the buffers. Call it while nothing else is in flight
// on the communicator, in the same order on every rank.
void run_reference(Pending& p) {
  const int rc = p.pmpi_call(p.ref_send.data(), p.ref_recv.data());
  CallInfo info = p.info;
  info.call = std::string("P") + call_name(p.coll, false);
  info.how = "reference";
  p.ref_ok = check_rc(rc, info, info.call.c_str());
}

void start(Pending& p, bool nb) {
  p.info.call = call_name(p.coll, nb);
  StatProbe probe((nb ? "i" : "") + std::string(stat_name(p.coll)), on_route(p.routed, nb));
  const int rc = p.call(nb ? &p.req : nullptr);
  probe.verify(p.info);
  p.started = check_rc(rc, p.info, p.info.call.c_str());
}

// The result against the values computed here and against the real MPI's; the send buffer.
void verify(Pending& p) {
  if (!p.started) return;
  const size_t bad = p.k->mismatch(p.recv.data(), p.want.data(), 0, p.check_end);
  g_tally.check(bad == p.check_end, p.info, [&] {
    return "index " + std::to_string(bad) + " of " + std::to_string(p.check_end) + ": got " +
           p.k->show(p.recv.data(), bad) + ", expected " + p.k->show(p.want.data(), bad) +
           (bad >= p.data_end ? " (written past the result, where the call must leave the "
                                "buffer as the caller filled it)"
                              : "");
  });
  if (p.ref_ok) {
    const size_t diff = p.k->mismatch(p.recv.data(), p.ref_recv.data(), 0, p.check_end);
    g_tally.check(diff == p.check_end, p.info, [&] {
      return "index " + std::to_string(diff) + ": got " + p.k->show(p.recv.data(), diff) +
             ", but PMPI (the real MPI) gives " + p.k->show(p.ref_recv.data(), diff) +
             " (computed here: " + p.k->show(p.want.data(), diff) + ")";
    });
  }
  if (p.send_copy.size() > 0) {
    // By value: the padding of long double and the pair types is not data.
    const size_t n = p.send.size();
    const size_t changed = p.k->mismatch(p.send.data(), p.send_copy.data(), 0, n);
    g_tally.check(changed == n, p.info, [&] {
      return "the send buffer was modified: index " + std::to_string(changed) + " is " +
             p.k->show(p.send.data(), changed) + ", was " + p.k->show(p.send_copy.data(), changed);
    });
  }
}

// One call from start to checks: blocking, or non-blocking completed as `how` says.
void run_one(Pending& p, bool nb, Completion how) {
  p.info.how = nb ? describe(how) : "blocking";
  run_reference(p);
  start(p, nb);
  if (nb && p.started) {
    std::vector<MPI_Request> one{p.req};
    complete(one, how, p.info);
    p.req = one[0];
  }
  verify(p);
}

void run_case(const Comm& c, const Case& cs, bool nb) {
  PendingPtr p = make(c, cs);
  run_one(*p, nb, static_cast<Completion>(g_rotation++ % kNumCompletions));
}

// ------------------------------------------------------------------------- test plans

struct Variant {
  long count;
  bool in_place;
  int root;
  bool nb;
};

// Every variant of a collective on `c`; blocking and non-blocking next to each other.
std::vector<Variant> variants(const Comm& c, Coll coll, const std::vector<long>& counts) {
  std::vector<int> roots{-1};
  if (coll == Coll::reduce || coll == Coll::bcast) {
    roots = {0};
    if (c.size > 1) roots.push_back(c.size - 1);
  }
  const int ips = coll == Coll::bcast ? 1 : 2;
  std::vector<Variant> v;
  for (long n : counts)
    for (int ip = 0; ip < ips; ++ip)
      for (int root : roots)
        for (int nb = 0; nb < 2; ++nb) v.push_back(Variant{n, ip == 1, root, nb == 1});
  return v;
}

int g_density = 0;  // variants per (collective, datatype, op); 0: all

// Each carried collective over `types` and every op of each: `g_density` variants each,
// starting at a position that moves with every (datatype, op), so all variants occur.
void test_matrix(const Comm& c, const std::vector<const TypeDesc*>& types,
                 const std::vector<long>& counts) {
  for (int ci = 0; ci < kCarried; ++ci) {
    const Coll coll = static_cast<Coll>(ci);
    const std::vector<Variant> all = variants(c, coll, counts);
    const size_t pairs = all.size() / 2;
    const size_t take = g_density <= 0 || static_cast<size_t>(g_density) >= all.size()
                            ? all.size()
                            : static_cast<size_t>(g_density);
    size_t combo = 0;
    for (const TypeDesc* t : types) {
      std::vector<Op> ops = takes_op(coll) ? ops_for(t->cls) : std::vector<Op>{Op::none};
      for (Op op : ops) {
        const size_t first = 2 * ((combo++ * 3) % pairs);
        for (size_t j = 0; j < take; ++j) {
          const Variant& v = all[(first + j) % all.size()];
          run_case(c, Case{coll, t, op, v.count, v.root, v.in_place}, v.nb);
        }
      }
    }
  }
}

// A few datatypes at a count large enough for the algorithms' chunking and pipelining.
void test_large(const Comm& c, long n) {
  struct Item {
    const char* type;
    Op op;
  };
  const Item items[] = {{"MPI_INT", Op::sum},
                        {"MPI_DOUBLE", Op::max},
                        {"MPI_UINT8_T", Op::bxor},
                        {"MPI_C_FLOAT_COMPLEX", Op::prod},
                        {"MPI_LONG_LONG", Op::min}};
  const long blk = n / c.size;
  int k = 0;
  for (const Item& it : items) {
    const TypeDesc& t = type_named(it.type);
    for (int nb = 0; nb < 2; ++nb) {
      const bool ip = (k++ % 2) == 1;
      run_case(c, Case{Coll::allreduce, &t, it.op, n, -1, ip}, nb);
      run_case(c, Case{Coll::reduce, &t, it.op, n, nb ? 0 : c.size - 1, ip}, nb);
      run_case(c, Case{Coll::rsb, &t, it.op, blk, -1, !ip}, nb);
    }
  }
  for (int nb = 0; nb < 2; ++nb) {
    run_case(c,
             Case{Coll::bcast, &type_named("MPI_DOUBLE"), Op::none, n, nb ? 0 : c.size - 1, false},
             nb);
    run_case(c, Case{Coll::allgather, &type_named("MPI_INT"), Op::none, blk, -1, nb == 1}, nb);
  }
}

// MPI_Reduce with recvbuf = NULL on every rank but the root (MPI-4.0 section 6.9.1: the
// receive buffer is significant at the root only), blocking and MPI_Ireduce, roots 0 and
// size - 1, in place at the root or not, counts that do and do not divide by the size.
void test_reduce_null_recv(const Comm& c) {
  struct Item {
    const char* type;
    Op op;
  };
  const Item items[] = {{"MPI_INT", Op::sum}, {"MPI_DOUBLE", Op::max}, {"MPI_UINT8_T", Op::bxor}};
  const long counts[] = {1, 7, c.size, 1000, 40000};
  int k = 0;
  for (long n : counts)
    for (int root : {0, c.size - 1})
      for (int nb = 0; nb < 2; ++nb) {
        const Item& it = items[k % 3];
        Case cs{Coll::reduce, &type_named(it.type), it.op, n, root, (k++ / 3) % 2 == 1};
        cs.null_recv = true;
        run_case(c, cs, nb);
      }
}

// Calls that must go to pmpi even on a routed communicator: count 0 (no data), pair types
// (not contiguous basic) are in the matrix; here, the collectives the route does not carry.
void test_pmpi_calls(const Comm& c) {
  const TypeDesc& i32 = type_named("MPI_INT");
  for (int nb = 0; nb < 2; ++nb) {
    for (int ci = 0; ci < kCarried; ++ci) {
      const Coll coll = static_cast<Coll>(ci);
      const bool root = coll == Coll::reduce || coll == Coll::bcast;
      run_case(
          c,
          Case{coll, &i32, takes_op(coll) ? Op::sum : Op::none, 0, root ? c.size - 1 : -1, nb == 1},
          nb);
    }
    run_case(c, Case{Coll::allgatherv, &i32, Op::none, 7, -1, false}, nb);
    run_case(c, Case{Coll::alltoall, &type_named("MPI_DOUBLE"), Op::none, 7, -1, false}, nb);
    run_case(c, Case{Coll::reduce_scatter, &i32, Op::bxor, 7, -1, false}, nb);
  }
}

// A ring exchange on a communicator, in flight alongside the collectives.
struct RingTransfer {
  const Comm* comm;
  int tag;
  std::vector<int> out, in;
  uint64_t salt;
  CallInfo info;
  RingTransfer(const Comm& c, int tag_, size_t n, uint64_t salt_)
      : comm(&c), tag(tag_), out(n), in(n, -1), salt(salt_) {
    for (size_t k = 0; k < n; ++k) out[k] = input<int>(Op::none, c.rank, k, salt, false);
    info.call = "MPI_Isend/MPI_Irecv";
    info.comm = &c;
    info.count = static_cast<long>(n);
  }
  int right() const { return (comm->rank + 1) % comm->size; }
  int left() const { return (comm->rank + comm->size - 1) % comm->size; }
  void verify() {
    for (size_t k = 0; k < in.size(); ++k) {
      const int want = input<int>(Op::none, left(), k, salt, false);
      if (in[k] != want) {
        g_tally.fail(info, "element " + std::to_string(k) + " from rank " + std::to_string(left()) +
                               ": got " + std::to_string(in[k]) + ", expected " +
                               std::to_string(want));
        return;
      }
    }
    g_tally.pass();
  }
};

// Batches of 64 MPI_I* collectives in flight at once over the routed communicators (mixed
// collectives, datatypes, sizes, in place, roots), with point-to-point requests in the
// same array; each batch completed with another completion call.
void test_concurrent(const std::vector<const Comm*>& comms, const Comm& world) {
  struct Kind {
    Coll coll;
    const char* type;
    Op op;
  };
  const Kind kinds[] = {
      {Coll::allreduce, "MPI_INT", Op::sum},
      {Coll::reduce, "MPI_DOUBLE", Op::max},
      {Coll::bcast, "MPI_C_DOUBLE_COMPLEX", Op::none},
      {Coll::allgather, "MPI_UINT16_T", Op::none},
      {Coll::rsb, "MPI_LONG", Op::bxor},
      {Coll::allreduce, "MPI_C_BOOL", Op::lor},
      {Coll::reduce, "MPI_LONG_DOUBLE", Op::prod},
      {Coll::rsb, "MPI_FLOAT", Op::sum},
      {Coll::allreduce, "MPI_UINT64_T", Op::band},
      {Coll::bcast, "MPI_CHAR", Op::none},
      {Coll::allgather, "MPI_INT64_T", Op::none},
  };
  constexpr int kBatch = 64;
  const Completion order[] = {Completion::waitall,  Completion::waitany,  Completion::testall,
                              Completion::waitsome, Completion::testsome, Completion::wait,
                              Completion::test,     Completion::testany};
  for (int b = 0; b < kNumCompletions; ++b) {
    const Completion how = order[b];
    const uint64_t salt = ++g_salt;
    CallInfo all;
    all.call = "64 collectives in flight";
    all.how = std::string(describe(how)) + ", mixed array";
    all.comm = &world;
    std::vector<PendingPtr> colls;
    for (int i = 0; i < kBatch; ++i) {
      const Comm& c = *comms[static_cast<size_t>(i + b) % comms.size()];
      const Kind& kd = kinds[static_cast<size_t>(i * 7 + b) % (sizeof kinds / sizeof kinds[0])];
      const long counts[] = {1, 7, c.size, 1000, 4000};
      const long n = counts[(i + 3 * b) % 5];
      const bool root = kd.coll == Coll::reduce || kd.coll == Coll::bcast;
      colls.push_back(make(c, Case{kd.coll, &type_named(kd.type), kd.op, n,
                                   root ? (i / 2) % c.size : -1, (i + b) % 3 == 0}));
      colls.back()->info.how = all.how;
    }
    // The real MPI's answers first, while nothing is in flight.
    for (PendingPtr& p : colls) run_reference(*p);
    RingTransfer ring_world(world, 300 + b, 1000, salt);
    RingTransfer ring_other(*comms[0], 400 + b, 7, salt);
    std::vector<MPI_Request> reqs;
    auto post = [&](RingTransfer& t, bool send) {
      reqs.emplace_back();
      const int rc = send ? MPI_Isend(t.out.data(), static_cast<int>(t.out.size()), MPI_INT,
                                      t.right(), t.tag, t.comm->handle, &reqs.back())
                          : MPI_Irecv(t.in.data(), static_cast<int>(t.in.size()), MPI_INT, t.left(),
                                      t.tag, t.comm->handle, &reqs.back());
      if (!check_rc(rc, t.info, send ? "MPI_Isend" : "MPI_Irecv")) reqs.pop_back();
    };
    post(ring_world, false);
    for (int i = 0; i < kBatch; ++i) {
      if (i == 10) post(ring_world, true);
      if (i == 20) post(ring_other, false);
      if (i == 50) post(ring_other, true);
      start(*colls[i], true);
      if (colls[i]->started) reqs.push_back(colls[i]->req);
    }
    complete(reqs, how, all);
    for (PendingPtr& p : colls) verify(*p);
    ring_world.verify();
    ring_other.verify();
  }
}

// Blocking calls while MPI_I* calls are in flight on the same communicator (and on the
// others): the route's blocking path and its progress thread must not mix up messages.
void test_blocking_amid_nonblocking(const std::vector<const Comm*>& comms) {
  const TypeDesc& i64 = type_named("MPI_INT64_T");
  const TypeDesc& dbl = type_named("MPI_DOUBLE");
  for (int round = 0; round < 2; ++round) {
    std::vector<PendingPtr> nb, blocking;
    for (const Comm* c : comms) {
      nb.push_back(make(*c, Case{Coll::allreduce, &i64, Op::sum, 1000, -1, round == 1}));
      nb.push_back(make(*c, Case{Coll::bcast, &dbl, Op::none, 1000, c->size - 1, false}));
      nb.push_back(make(*c, Case{Coll::rsb, &i64, Op::bxor, 100, -1, false}));
    }
    for (const Comm* c : comms) {
      blocking.push_back(make(*c, Case{Coll::allreduce, &dbl, Op::max, 1000, -1, false}));
      blocking.push_back(make(*c, Case{Coll::reduce, &i64, Op::prod, 7, 0, round == 0}));
      blocking.push_back(make(*c, Case{Coll::allgather, &i64, Op::none, 100, -1, round == 1}));
    }
    for (PendingPtr& p : nb) run_reference(*p);
    for (PendingPtr& p : blocking) run_reference(*p);
    std::vector<MPI_Request> reqs;
    for (PendingPtr& p : nb) {
      p->info.how = "in flight during blocking calls, then MPI_Waitall";
      start(*p, true);
      if (p->started) reqs.push_back(p->req);
    }
    for (PendingPtr& p : blocking) {
      p->info.how = "blocking, with MPI_I* calls in flight";
      start(*p, false);
    }
    CallInfo all;
    all.call = "MPI_I* calls around blocking ones";
    all.how = "MPI_Waitall";
    complete(reqs, Completion::waitall, all);
    for (PendingPtr& p : nb) verify(*p);
    for (PendingPtr& p : blocking) verify(*p);
  }
}

// With MPI_THREAD_MULTIPLE: threads of this process call collectives at the same time, each
// on its own communicator. The calls are built (and afterwards checked) on the main thread;
// the statistics are checked in sum, since the counters are per process.
void test_threads(const std::vector<const Comm*>& comms) {
  const size_t nthreads = comms.size() < 3 ? comms.size() : 3;
  constexpr int kCalls = 24;
  const TypeDesc* types[] = {&type_named("MPI_INT"), &type_named("MPI_DOUBLE"),
                             &type_named("MPI_UINT8_T"), &type_named("MPI_C_FLOAT_COMPLEX")};
  const Op ops[] = {Op::sum, Op::max, Op::bxor, Op::prod};
  std::vector<std::vector<PendingPtr>> work(nthreads);
  long long route_calls = 0;
  for (size_t t = 0; t < nthreads; ++t)
    for (int i = 0; i < kCalls; ++i) {
      const Comm& c = *comms[t];
      const Coll coll = static_cast<Coll>(i % kCarried);
      const int k = (i / kCarried) % 4;
      const bool root = coll == Coll::reduce || coll == Coll::bcast;
      work[t].push_back(make(c, Case{coll, types[k], takes_op(coll) ? ops[k] : Op::none,
                                     i % 3 == 0 ? 1000 : 7, root ? i % c.size : -1, i % 4 == 1}));
      PendingPtr& p = work[t].back();
      p->info.how = std::string(i % 2 ? "MPI_Wait" : "blocking") + ", " + std::to_string(nthreads) +
                    " threads at once";
      p->info.call = call_name(coll, i % 2 == 1);
      route_calls += on_route(p->routed, i % 2 == 1);
    }
  const long long route_before = g_sc.active() ? g_sc.calls(nullptr, g_sc.route, "host") : 0;
  const long long all_before = g_sc.active() ? g_sc.calls(nullptr, nullptr, nullptr) : 0;
  std::vector<std::vector<int>> rcs(nthreads);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < nthreads; ++t)
    threads.emplace_back([&, t] {
      for (size_t i = 0; i < work[t].size(); ++i) {
        Pending& p = *work[t][i];
        const bool nb = i % 2 == 1;
        rcs[t].push_back(p.pmpi_call(p.ref_send.data(), p.ref_recv.data()));
        int rc = p.call(nb ? &p.req : nullptr);
        if (rc == MPI_SUCCESS && nb) rc = MPI_Wait(&p.req, MPI_STATUS_IGNORE);
        rcs[t].push_back(rc);
      }
    });
  for (std::thread& th : threads) th.join();
  for (size_t t = 0; t < nthreads; ++t)
    for (size_t i = 0; i < work[t].size(); ++i) {
      Pending& p = *work[t][i];
      p.ref_ok = check_rc(rcs[t][2 * i], p.info, "the PMPI_ reference");
      p.started = check_rc(rcs[t][2 * i + 1], p.info, p.info.call.c_str());
      ++g_sc.calls_made;
      verify(p);
    }
  if (g_sc.active()) {
    CallInfo info;
    info.call = "collectives from " + std::to_string(nthreads) + " threads";
    info.how = "streamcoll_get_stats";
    const long long counted = g_sc.calls(nullptr, g_sc.route, "host") - route_before;
    const long long all = g_sc.calls(nullptr, nullptr, nullptr) - all_before;
    const long long made = static_cast<long long>(nthreads) * kCalls;
    g_tally.check(counted == route_calls && all == made, info, [&] {
      return std::string(g_sc.route) + " counted " + std::to_string(counted) + " (expected " +
             std::to_string(route_calls) + "), all routes " + std::to_string(all) + " (expected " +
             std::to_string(made) + ")";
    });
  }
}

// ------------------------------------------------------------------ threads and levels

// Whether a thread of this process is named `name` (/proc/self/task/*/comm).
bool thread_named(const char* name) {
  DIR* d = opendir("/proc/self/task");
  if (!d) return false;
  bool found = false;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    const std::string path = std::string("/proc/self/task/") + e->d_name + "/comm";
    if (FILE* f = std::fopen(path.c_str(), "r")) {
      char comm[64] = {0};
      if (std::fgets(comm, sizeof comm, f)) {
        comm[std::strcspn(comm, "\n")] = 0;
        found = found || std::strcmp(comm, name) == 0;
      }
      std::fclose(f);
    }
  }
  closedir(d);
  return found;
}

constexpr const char* kProgressThread = "sc-progress";

const char* level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
  }
  return "?";
}

// ------------------------------------------------------------ route blueconnect's specs

std::vector<std::string> split_text(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t from = 0;
  for (size_t at; (at = s.find(sep, from)) != std::string::npos; from = at + 1)
    out.push_back(s.substr(from, at - from));
  out.push_back(s.substr(from));
  return out;
}

// Every ordered factorization of n into factors >= 2 ("AxB.."): for 8, 2x2x2, 2x4, 4x2,
// 8; none for 1.
void factorize(int n, const std::string& prefix, std::vector<std::string>* out) {
  for (int f = 2; f <= n; ++f) {
    if (n % f != 0) continue;
    const std::string text = prefix + (prefix.empty() ? "" : "x") + std::to_string(f);
    if (f == n)
      out->push_back(text);
    else
      factorize(n / f, text, out);
  }
}
std::vector<std::string> factorizations(int n) {
  std::vector<std::string> out;
  factorize(n, "", &out);
  return out;
}
// The route's levels: the factors other than 1, and one level when all are 1.
int levels_of(const std::string& hierarchy) {
  int levels = 0;
  for (const std::string& f : split_text(hierarchy, 'x')) levels += std::atoi(f.c_str()) > 1;
  return std::max(levels, 1);
}

// One backend per level, innermost first: "sched/mpi" for two levels, "mpi/sched/sched"
// for three and more; `flip` reverses the list ("mpi/sched", "sched/sched/mpi").
std::string mixed_backends(int levels, bool flip) {
  std::vector<std::string> b(static_cast<size_t>(levels), "sched");
  b[levels == 2 ? 1 : 0] = "mpi";
  if (flip) std::reverse(b.begin(), b.end());
  std::string out;
  for (const std::string& x : b) out += (out.empty() ? "" : "/") + x;
  return out;
}

constexpr size_t kMaxBlueconnectDups = 8;

// The parameters of the duplicates of world: each factorization of the size with, in
// turn, a mixed backend list (one level: sched), sched, mpi and the other mixed list (one
// level: mpi), round by round over the factorizations, algo=ring on every second one, at
// most kMaxBlueconnectDups. 4 ranks: 2x2 sched/mpi, 4 sched ring, 2x2 sched, 4 mpi ring,
// 2x2 mpi, 2x2 mpi/sched ring.
std::vector<std::string> blueconnect_dup_params(int size) {
  std::vector<std::string> hs = factorizations(size);
  if (hs.empty()) hs.push_back("1");  // one rank
  std::vector<std::vector<std::string>> backends;
  for (const std::string& h : hs) {
    const int levels = levels_of(h);
    if (levels >= 2)
      backends.push_back(
          {mixed_backends(levels, false), "sched", "mpi", mixed_backends(levels, true)});
    else
      backends.push_back({"sched", "mpi"});
  }
  std::vector<std::string> out;
  for (size_t round = 0, added = 1; added && out.size() < kMaxBlueconnectDups; ++round) {
    added = 0;
    for (size_t i = 0; i < hs.size() && out.size() < kMaxBlueconnectDups; ++i) {
      if (round >= backends[i].size()) continue;
      const bool ring = out.size() % 2 == 1;
      out.push_back("hierarchy=" + hs[i] + ":backend=" + backends[i][round] +
                    (ring ? ":algo=ring" : ""));
      ++added;
    }
  }
  return out;
}

// The halves of world: the even half one spec per carried collective with a hierarchy of
// its size (the most levels), the rest ("*") on the route too, which declines it; the odd
// half (and a half of one rank, which has no factorization) specs the route must decline:
// hierarchies that do not multiply to its size, and a backend list longer than the levels.
std::string blueconnect_split_spec(int size, bool even) {
  const std::vector<std::string> hs = factorizations(size);
  const std::string bc = ":blueconnect:hierarchy=";
  if (even && !hs.empty()) {
    const std::string& h = hs[0];
    const int levels = levels_of(h);
    return "allreduce" + bc + h + ":backend=mpi,reduce_scatter_block" + bc + h +
           ":backend=" + (levels >= 2 ? mixed_backends(levels, false) : "sched") +
           ":algo=ring,allgather" + bc + h + ":backend=sched,*" + bc + h;
  }
  const std::string bad = "2x" + std::to_string(size);  // twice the size
  const std::string good = hs.empty() ? "1" : hs[0];
  std::string too_many = "sched";
  for (int l = 0; l < levels_of(good); ++l) too_many += "/sched";
  return "allreduce" + bc + bad + ",reduce_scatter_block" + bc + bad + ":backend=mpi,allgather" +
         bc + good + ":backend=" + too_many + ",*" + bc + bad;
}

// What route blueconnect does with a call of `coll` on `size` ranks routed by `spec`
// (STREAMCOLL_ROUTE syntax), by its documented rules (algorithms/blueconnect.cpp): the
// first entry naming the collective or '*' decides; the route carries allreduce,
// reduce_scatter_block and allgather; hierarchy= (else STREAMCOLL_HIERARCHY, else the
// discovered hierarchy, which one host must give) multiplies to the size; backend= is
// sched or mpi, one for all levels or one per level (levels_of).
// Returns the entry's parameters (the variant's label), "" when the call goes to pmpi.
std::string bc_label(const std::string& spec, Coll coll, int size) {
  if (coll != Coll::allreduce && coll != Coll::rsb && coll != Coll::allgather) return "";
  for (const std::string& entry : split_text(spec, ',')) {
    const std::vector<std::string> f = split_text(entry, ':');
    if (f.size() < 2 || (f[0] != "*" && f[0] != stat_name(coll))) continue;
    if (f[1] != "blueconnect") return "";
    std::string hierarchy, backend = "sched", params;
    if (const char* env = std::getenv("STREAMCOLL_HIERARCHY")) hierarchy = env;
    for (size_t i = 2; i < f.size(); ++i) {
      params += (i > 2 ? ":" : "") + f[i];
      const size_t eq = f[i].find('=');
      const std::string key = f[i].substr(0, eq);
      const std::string value = eq == std::string::npos ? "" : f[i].substr(eq + 1);
      if (key == "hierarchy") hierarchy = value;
      if (key == "backend") backend = value;
    }
    if (params.empty()) params = "blueconnect";
    if (hierarchy.empty()) return params;  // discovered
    long long product = 1;
    for (const std::string& x : split_text(hierarchy, 'x')) {
      const int v = std::atoi(x.c_str());
      if (v < 1) return "";
      product *= v;
    }
    if (product != size) return "";
    const std::vector<std::string> b = split_text(backend, '/');
    for (const std::string& x : b)
      if (x != "sched" && x != "mpi") return "";
    return b.size() == 1 || static_cast<int>(b.size()) == levels_of(hierarchy) ? params : "";
  }
  return "";
}

// ------------------------------------------------------------------------------ setup

bool setup_comm(Comm& c, MPI_Comm h, const std::string& name) {
  c.handle = h;
  c.name = name;
  CallInfo info;
  info.call = "setup " + name;
  return check_rc(MPI_Comm_rank(h, &c.rank), info, "MPI_Comm_rank") &&
         check_rc(MPI_Comm_size(h, &c.size), info, "MPI_Comm_size");
}

// Blocking calls that set a routed communicator up: one allreduce (ht); blueconnect, one
// of each collective it carries (the mpi backend's sub-communicators for each spec).
void warm_up(const Comm& c) {
  const TypeDesc& i32 = type_named("MPI_INT");
  run_case(c, Case{Coll::allreduce, &i32, Op::sum, 1, -1, false}, false);
  if (!g_sc.blueconnect()) return;
  run_case(c, Case{Coll::rsb, &i32, Op::sum, 1, -1, false}, false);
  run_case(c, Case{Coll::allgather, &i32, Op::none, 1, -1, false}, false);
}

void set_route(const Comm& c, const std::string& spec) {
  CallInfo info;
  info.call = "streamcoll_comm_set_route";
  info.how = "\"" + spec + "\"";
  info.comm = &c;
  if (g_sc.set_route) {
    const int rc = g_sc.set_route(c.handle, spec.c_str());
    check_rc(rc, info, info.call.c_str());
  } else if (g_sc.active()) {
    g_tally.fail(info, "streamcoll is loaded but does not export streamcoll_comm_set_route");
  }
}

// Sets the routes of `c` (api mode), and warms it up with blocking calls: the route
// takes a communicator's MPI_I* calls only after a blocking call on it.
void route(Comm& c, const std::string& spec, const std::string& algo_all,
           const std::vector<std::string>& per_coll) {
  for (int i = 0; i < kCarried; ++i) c.algo[i] = per_coll.empty() ? algo_all : per_coll[i];
  set_route(c, spec);
  warm_up(c);
}

// Route blueconnect: what each collective does on `c` under `spec` comes from bc_label.
void route_blueconnect(Comm& c, const std::string& spec) {
  std::vector<std::string> per_coll;
  for (int i = 0; i < kCarried; ++i)
    per_coll.push_back(bc_label(spec, static_cast<Coll>(i), c.size));
  route(c, spec, "", per_coll);
}

// Route blueconnect sets itself up on a communicator at its first blocking call, and
// creates the mpi backend's sub-communicators at the first blocking call that needs them;
// MPI_I* calls before that go to pmpi. On a fresh duplicate of world: MPI_Iallreduce
// (pmpi), MPI_Allreduce on backend sched, MPI_Iallreduce (the route), then MPI_Iallgather
// on backend mpi (pmpi: no sub-communicators yet), MPI_Allgather, MPI_Iallgather and
// MPI_Iallreduce (the route).
void test_nonblocking_first(const Comm& world) {
  CallInfo info;
  info.call = "MPI_Comm_dup";
  info.comm = &world;
  MPI_Comm h = MPI_COMM_NULL;
  Comm c;
  if (!check_rc(MPI_Comm_dup(world.handle, &h), info, "MPI_Comm_dup") ||
      !setup_comm(c, h, "dup(world) fresh"))
    return;
  const std::vector<std::string> hs = factorizations(c.size);
  const std::string hier = hs.empty() ? "1" : hs[0];
  const std::string spec = "allreduce:blueconnect:hierarchy=" + hier +
                           ":backend=sched,allgather:blueconnect:hierarchy=" + hier +
                           ":backend=mpi";
  set_route(c, spec);
  const TypeDesc& dbl = type_named("MPI_DOUBLE");
  const Case ar{Coll::allreduce, &dbl, Op::sum, 7, -1, false};
  const Case ag{Coll::allgather, &dbl, Op::none, 7, -1, false};
  const int iar = static_cast<int>(Coll::allreduce), iag = static_cast<int>(Coll::allgather);
  run_case(c, ar, true);  // no blocking call yet: pmpi
  c.algo[iar] = bc_label(spec, Coll::allreduce, c.size);
  run_case(c, ar, false);
  run_case(c, ar, true);
  run_case(c, ag, true);  // no sub-communicators yet: pmpi
  c.algo[iag] = bc_label(spec, Coll::allgather, c.size);
  run_case(c, ag, false);
  run_case(c, ag, true);
  run_case(c, ar, true);
  MPI_Comm_free(&c.handle);
}

// The C API's argument errors: local, so safe to call on any rank alone.
void test_api_errors(const Comm& world) {
  if (!g_sc.set_route) return;
  CallInfo info;
  info.call = "streamcoll_comm_set_route";
  info.comm = &world;
  info.how = "MPI_COMM_NULL";
  int rc = g_sc.set_route(MPI_COMM_NULL, "*:ht");
  g_tally.check(rc == MPI_ERR_COMM, info,
                [&] { return "returned " + std::to_string(rc) + ", expected MPI_ERR_COMM"; });
}

void layouts() {
  for (const TypeDesc& t : all_types()) {
    CallInfo info;
    info.call = "MPI_Type_get_extent";
    info.how = "layout";
    info.type = &t;
    MPI_Aint lb = 0, extent = 0;
    if (!check_rc(MPI_Type_get_extent(t.handle, &lb, &extent), info, "MPI_Type_get_extent"))
      continue;
    g_tally.check(lb == 0 && static_cast<size_t>(extent) == t.k.size, info, [&] {
      return "lb " + std::to_string(lb) + ", extent " + std::to_string(extent) +
             " but the C type has size " + std::to_string(t.k.size);
    });
  }
}

// Pass/fail counts of all ranks to rank 0 by point-to-point messages. Returns whether any
// rank failed, on every rank.
bool gather_verdict(const Comm& world, long long totals[2]) {
  constexpr int kTag = 9001;
  long long mine[2] = {g_tally.passed(), g_tally.failed()};
  int any_failed = 0;
  totals[0] = mine[0];
  totals[1] = mine[1];
  if (world.rank == 0) {
    for (int r = 1; r < world.size; ++r) {
      long long theirs[2] = {0, 1};
      if (MPI_Recv(theirs, 2, MPI_LONG_LONG, r, kTag, world.handle, MPI_STATUS_IGNORE) !=
          MPI_SUCCESS)
        theirs[1] += 1;
      totals[0] += theirs[0];
      totals[1] += theirs[1];
    }
    any_failed = totals[1] != 0;
    for (int r = 1; r < world.size; ++r)
      if (MPI_Send(&any_failed, 1, MPI_INT, r, kTag, world.handle) != MPI_SUCCESS) any_failed = 1;
  } else {
    if (MPI_Send(mine, 2, MPI_LONG_LONG, 0, kTag, world.handle) != MPI_SUCCESS ||
        MPI_Recv(&any_failed, 1, MPI_INT, 0, kTag, world.handle, MPI_STATUS_IGNORE) != MPI_SUCCESS)
      any_failed = 1;
  }
  return any_failed != 0;
}

int usage() {
  std::fprintf(stderr,
               "usage: host_routes [--thread=single|funneled|serialized|multiple] "
               "[--route=ht|blueconnect] [--expect-route=ht|blueconnect|blocking|pmpi] "
               "[--routes=api|env] [--density=N]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  int required = MPI_THREAD_FUNNELED;
  std::string expect_route;  // --expect-route=ROUTE: must be the route under test
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--thread=single")
      required = MPI_THREAD_SINGLE;
    else if (a == "--thread=funneled")
      required = MPI_THREAD_FUNNELED;
    else if (a == "--thread=serialized")
      required = MPI_THREAD_SERIALIZED;
    else if (a == "--thread=multiple")
      required = MPI_THREAD_MULTIPLE;
    else if (a == "--route=ht")
      g_sc.route = "ht";
    else if (a == "--route=blueconnect")
      g_sc.route = "blueconnect";
    else if (a == "--expect-route=ht" || a == "--expect-route=blueconnect")
      expect_route = a.substr(15);
    else if (a == "--expect-route=blocking")
      g_sc.expect = Expect::blocking;
    else if (a == "--expect-route=pmpi")
      g_sc.expect = Expect::pmpi;
    else if (a == "--routes=api")
      g_sc.env_routes = false;
    else if (a == "--routes=env")
      g_sc.env_routes = true;
    else if (a.rfind("--density=", 0) == 0)
      g_density = std::atoi(a.c_str() + 10);
    else
      return usage();
  }
  if (!expect_route.empty() && expect_route != g_sc.route) return usage();
  int provided = -1;
  if (MPI_Init_thread(&argc, &argv, required, &provided) != MPI_SUCCESS) {
    std::fprintf(stderr, "host_routes: MPI_Init_thread failed\n");
    return 1;
  }
  const double t0 = MPI_Wtime();
  Comm world;
  world.handle = MPI_COMM_WORLD;
  world.name = "world";
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &world.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world.size);
  g_tally.init(world.rank);
  if (g_density == 0 && world.size > 1) g_density = world.size <= 4 ? 8 : 4;

  CallInfo setup;
  setup.call = "setup";
  setup.how = "-";
  setup.comm = &world;

  // The thread level: what was asked for, both from MPI_Init_thread and MPI_Query_thread.
  {
    CallInfo info = setup;
    info.call = "MPI_Init_thread";
    info.how = level_name(required);
    g_tally.check(provided == required, info, [&] {
      return std::string("provided ") + level_name(provided) + ", asked for " +
             level_name(required);
    });
    int queried = -1;
    info.call = "MPI_Query_thread";
    if (check_rc(MPI_Query_thread(&queried), info, "MPI_Query_thread"))
      g_tally.check(queried == provided, info, [&] {
        return std::string("says ") + level_name(queried) + ", MPI_Init_thread said " +
               level_name(provided);
      });
    int is_main = 0;
    info.call = "MPI_Is_thread_main";
    if (check_rc(MPI_Is_thread_main(&is_main), info, "MPI_Is_thread_main"))
      g_tally.check(is_main != 0, info, [] { return std::string("false on the main thread"); });
  }

  // streamcoll, when it is in this process.
  {
    const char* env = std::getenv("STREAMCOLL_EXPECT_INTERCEPT");
    g_sc.expected = env && std::strcmp(env, "1") == 0;
    g_sc.get = reinterpret_cast<GetStats>(dlsym(RTLD_DEFAULT, "streamcoll_get_stats"));
    g_sc.set_route = reinterpret_cast<SetRoute>(dlsym(RTLD_DEFAULT, "streamcoll_comm_set_route"));
    if (g_sc.expected) {
      CallInfo info = setup;
      info.call = "dlsym(streamcoll_get_stats)";
      g_tally.check(g_sc.get != nullptr, info, [] {
        return std::string("streamcoll is not loaded (no streamcoll_get_stats)");
      });
    }
    if (g_sc.active()) g_sc.baseline = g_sc.calls(nullptr, nullptr, nullptr);
    if (world.rank == 0)
      std::fprintf(
          stderr,
          "host_routes: %d ranks, %s, streamcoll %s, routes by %s, expecting %s, density %d\n",
          world.size, level_name(required),
          g_sc.loaded() ? (g_sc.set_route ? "loaded" : "loaded without comm_set_route") : "absent",
          g_sc.env_routes ? "STREAMCOLL_ROUTE" : "streamcoll_comm_set_route",
          !g_sc.active()                    ? "no statistics"
          : g_sc.expect == Expect::route    ? g_sc.route
          : g_sc.expect == Expect::blocking ? "blocking calls routed, MPI_I* on pmpi"
                                            : "pmpi",
          g_density);
  }
  layouts();
  test_api_errors(world);

  // Communicators and their routes: ht, a duplicate per algorithm; blueconnect, per
  // hierarchy and backend (blueconnect_dup_params).
  // ccube: its default chunk (one chunk below 256 KiB), and 1000 bytes (a chunk count that
  // grows with the size, chunks not a whole number of 8-byte elements, a short last one).
  const char* algos[] = {"rd", "rabenseifner", "ring", "mpi", "ccube", "ccube:chunk=1000"};
  std::vector<std::string> dup_specs, dup_labels;
  if (g_sc.blueconnect()) {
    for (const std::string& params : blueconnect_dup_params(world.size)) {
      dup_specs.push_back("*:blueconnect:" + params);
      dup_labels.push_back(params);
    }
  } else {
    for (const char* a : algos) {
      dup_specs.push_back(std::string("*:ht:algo=") + a);
      dup_labels.push_back(a);
    }
  }
  if (g_sc.blueconnect() && !g_sc.env_routes && world.rank == 0) {
    std::string list;
    for (const std::string& l : dup_labels) list += "\n  " + l;
    std::fprintf(stderr, "host_routes: %zu duplicates of world on route blueconnect:%s\n",
                 dup_labels.size(), list.c_str());
  }
  std::vector<Comm> dups(dup_specs.size());
  Comm split;
  std::vector<const Comm*> routed;
  MPI_Comm split_h = MPI_COMM_NULL;
  bool ok =
      check_rc(MPI_Comm_split(MPI_COMM_WORLD, world.rank % 2, -world.rank, &split_h), setup,
               "MPI_Comm_split") &&
      setup_comm(split, split_h, world.rank % 2 ? "split(odd, reversed)" : "split(even, reversed)");
  const std::vector<std::string> split_algos = {"rabenseifner", "rd", "ring", "mpi", "ring"};
  const std::string split_spec =
      "allreduce:ht:algo=rabenseifner,reduce:ht:algo=rd,bcast:ht:algo=ring,allgather:ht:algo=mpi,"
      "reduce_scatter_block:ht:algo=ring";
  if (ok && !g_sc.env_routes) {
    for (size_t a = 0; a < dups.size() && ok; ++a) {
      MPI_Comm h = MPI_COMM_NULL;
      ok = check_rc(MPI_Comm_dup(MPI_COMM_WORLD, &h), setup, "MPI_Comm_dup") &&
           setup_comm(dups[a], h, "dup(world) " + dup_labels[a]);
      if (ok && a == 0 && g_sc.set_route) {  // a spec that does not parse: nothing is set
        CallInfo info = setup;
        info.call = "streamcoll_comm_set_route";
        info.how = "\"*:nosuchroute\" (its reason goes to stderr)";
        info.comm = &dups[a];
        const int rc = g_sc.set_route(h, "*:nosuchroute");
        g_tally.check(rc == MPI_ERR_ARG, info,
                      [&] { return "returned " + std::to_string(rc) + ", expected MPI_ERR_ARG"; });
      }
      if (ok && g_sc.blueconnect())
        route_blueconnect(dups[a], dup_specs[a]);
      else if (ok)
        route(dups[a], dup_specs[a], dup_labels[a], {});
      routed.push_back(&dups[a]);
    }
    if (ok && g_sc.blueconnect()) {
      const std::string spec = blueconnect_split_spec(split.size, world.rank % 2 == 0);
      route_blueconnect(split, spec);
      if (world.rank < 2)  // the spec of each half, once
        std::fprintf(stderr, "host_routes: %s of %d ranks: \"%s\"%s\n", split.name.c_str(),
                     split.size, spec.c_str(), split.routed(Coll::allreduce) ? "" : " (declined)");
    } else if (ok) {
      route(split, split_spec, "", split_algos);
    }
    routed.push_back(&split);
  } else if (ok && g_sc.blueconnect()) {
    // STREAMCOLL_ROUTE routes every communicator; what it routes where comes from bc_label.
    const char* env = std::getenv("STREAMCOLL_ROUTE");
    for (int i = 0; i < kCarried; ++i) {
      world.algo[i] = bc_label(env ? env : "", static_cast<Coll>(i), world.size);
      split.algo[i] = bc_label(env ? env : "", static_cast<Coll>(i), split.size);
    }
    warm_up(world);
    warm_up(split);
    routed = {&world, &split};
  } else if (ok) {
    // STREAMCOLL_ROUTE routes every communicator; its text names the algorithm.
    const char* env = std::getenv("STREAMCOLL_ROUTE");
    std::string label = env ? env : "";
    const size_t at = label.find("algo=");
    label = at == std::string::npos ? "env" : label.substr(at + 5, label.find(',', at) - at - 5);
    for (int i = 0; i < kCarried; ++i) world.algo[i] = split.algo[i] = label;
    run_case(world, Case{Coll::allreduce, &type_named("MPI_INT"), Op::sum, 1, -1, false}, false);
    run_case(split, Case{Coll::allreduce, &type_named("MPI_INT"), Op::sum, 1, -1, false}, false);
    routed = {&world, &split};
  }

  if (ok) {
    std::vector<const TypeDesc*> every, some;
    for (const TypeDesc& t : all_types()) every.push_back(&t);
    for (const char* name :
         {"MPI_INT", "MPI_UINT8_T", "MPI_DOUBLE", "MPI_LONG_DOUBLE", "MPI_C_DOUBLE_COMPLEX",
          "MPI_C_BOOL", "MPI_BYTE", "MPI_OFFSET", "MPI_CHAR", "MPI_2INT"})
      some.push_back(&type_named(name));
    const std::vector<long> counts = {1, 7, world.size, 1000};

    // The progress thread: after the first MPI_I* call on the route, and only then.
    begin_phase("first MPI_I*");
    run_case(*routed[0], Case{Coll::allreduce, &type_named("MPI_DOUBLE"), Op::sum, 7, -1, false},
             true);
    if (g_sc.active()) {
      const bool want = g_sc.expect == Expect::route && routed[0]->routed(Coll::allreduce);
      CallInfo info = setup;
      info.call = "thread " + std::string(kProgressThread);
      info.how = "after the first MPI_Iallreduce";
      const bool present = thread_named(kProgressThread);
      g_tally.check(present == want, info, [&] {
        return std::string(present ? "present" : "absent") +
               " in /proc/self/task/*/comm, expected " +
               (want ? "present" : "absent (the route is off)");
      });
    }
    if (g_sc.blueconnect() && !g_sc.env_routes) {
      begin_phase("MPI_I* before a blocking call");
      test_nonblocking_first(world);
    }

    for (const Comm* c : routed) {
      begin_phase("matrix " + c->name);
      test_matrix(*c, c == &split ? some : every, counts);
      begin_phase("large " + c->name);
      test_large(*c, 40000);
      begin_phase("reduce, recvbuf NULL off the root, " + c->name);
      test_reduce_null_recv(*c);
      begin_phase("pmpi calls " + c->name);
      test_pmpi_calls(*c);
    }
    if (!g_sc.env_routes) {  // the control: world is not routed, its calls go to pmpi
      begin_phase("world (not routed)");
      test_matrix(
          world, {&type_named("MPI_INT"), &type_named("MPI_DOUBLE"), &type_named("MPI_2INT")}, {7});
    }
    begin_phase("concurrent");
    test_concurrent(routed, world);
    begin_phase("blocking amid MPI_I*");
    test_blocking_amid_nonblocking(routed);
    if (provided == MPI_THREAD_MULTIPLE && routed.size() > 1) {
      begin_phase("threads");
      test_threads(routed);
    }

    // Clearing the route sends the communicator's calls back to pmpi.
    if (!g_sc.env_routes && g_sc.set_route) {
      begin_phase("route cleared");
      Comm& c = dups[0];
      CallInfo info = setup;
      info.call = "streamcoll_comm_set_route";
      info.how = "\"\"";
      info.comm = &c;
      check_rc(g_sc.set_route(c.handle, ""), info, info.call.c_str());
      for (std::string& a : c.algo) a.clear();
      for (int nb = 0; nb < 2; ++nb)
        run_case(c, Case{Coll::allreduce, &type_named("MPI_INT"), Op::sum, 7, -1, nb == 1}, nb);
    }
    for (Comm& c : dups) MPI_Comm_free(&c.handle);
    MPI_Comm_free(&split.handle);
  }
  begin_phase("end");
  if (g_sc.active()) {  // streamcoll counted exactly the collective calls made
    CallInfo info = setup;
    info.call = "whole run";
    info.how = "streamcoll_get_stats(all)";
    const long long counted = g_sc.calls(nullptr, nullptr, nullptr) - g_sc.baseline;
    g_tally.check(counted == g_sc.calls_made, info, [&] {
      return "counted " + std::to_string(counted) + " calls, this rank made " +
             std::to_string(g_sc.calls_made);
    });
  }

  long long totals[2] = {0, 0};
  bool failed = gather_verdict(world, totals);
  const double seconds = MPI_Wtime() - t0;
  if (MPI_Finalize() != MPI_SUCCESS) {
    std::fprintf(stderr, "host_routes: rank %d: MPI_Finalize failed\n", world.rank);
    failed = true;
  }
  // After MPI_Finalize no progress thread may remain (allow it a moment to exit).
  bool lingering = thread_named(kProgressThread);
  for (int i = 0; i < 200 && lingering; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    lingering = thread_named(kProgressThread);
  }
  if (lingering) {
    std::fprintf(stderr, "FAIL rank %d: thread %s still exists 2 s after MPI_Finalize\n",
                 world.rank, kProgressThread);
    failed = true;
  }
  if (world.rank == 0) {
    // Rank 0's own check after MPI_Finalize is in the counts; other ranks report theirs.
    totals[lingering ? 1 : 0] += 1;
    std::printf("%lld passed, %lld failed\n", totals[0], totals[1]);
    std::fflush(stdout);
    std::string phases;
    for (size_t i = 0; i + 1 < g_phases.size(); ++i) {
      char part[160];
      std::snprintf(part, sizeof part, "%s%s %.1f s", i ? ", " : "", g_phases[i].first.c_str(),
                    g_phases[i + 1].second - g_phases[i].second);
      phases += part;
    }
    std::fprintf(stderr, "host_routes: %d ranks, %.1f s (%s)\n", world.size, seconds,
                 phases.c_str());
  }
  return failed ? 1 : 0;
}
