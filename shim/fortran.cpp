// The Fortran bindings (mpif.h and `use mpi`). Open MPI's and MPICH's Fortran wrappers
// call PMPI_ directly, so a PMPI tool sees Fortran calls only if it intercepts the
// Fortran symbols itself. Each wrapper converts the handles (MPI_*_f2c) and the
// sentinels (MPI_IN_PLACE, MPI_BOTTOM) and hands the dispatcher the C call, with the
// MPI's own Fortran binding and the caller's original arguments beside it. The call is
// routed exactly like the C call (a Fortran rank and a C rank take the same route: the
// binding is no fact of the decision): a route runs it on the converted C arguments, and
// its return code becomes ierr, its C request the Fortran one (MPI_Request_c2f); the
// pmpi route runs the MPI's binding itself, so that Fortran handles, MPI_IN_PLACE,
// MPI_BOTTOM and ierr behave exactly as without streamcoll.
// The wait/test family, MPI_REQUEST_GET_STATUS and MPI_REQUEST_FREE are bound too, so
// that streamcoll's own requests (core/requests.hpp) get their turn when Fortran waits
// for them: with no owned request alive, the real binding unchanged; otherwise the same
// polling as the C wrappers (shim/requests.cpp) on the requests converted with
// MPI_Request_f2c, and then the real binding with the caller's arguments, which turns
// statuses (MPI_STATUS_IGNORE, MPI_STATUSES_IGNORE), LOGICAL flags, 1-based indices and
// ierr into Fortran exactly as without streamcoll.
// Persistent collectives: MPICH's Fortran MPI_*_INIT and MPI_START reach the C wrappers
// (shim/persistent.cpp); Open MPI 4.1 has no Fortran binding of its MPIX_*_init, but a
// persistent request a C library made may be started, waited for and freed from Fortran:
// MPI_START and MPI_STARTALL are bound (streamcoll's requests started by the C wrappers),
// and the wait/test family hands the MPI an active persistent request's running operation
// in its place, as in C (FSubstituted).
// `use mpi_f08` callers (Open MPI's mpi_*_f08 symbols): the same wrappers. Open MPI's
// f08 handles are one INTEGER (TYPE(MPI_Comm) and the rest hold MPI_VAL, passed by
// reference like an INTEGER handle), its TYPE(MPI_Status) has the layout of the mpif.h
// status array, and its f08 and mpif.h bindings share MPI_IN_PLACE, MPI_BOTTOM and the
// status sentinels, so each f08 entry point runs the mpif.h wrapper (and so the MPI's
// mpif.h binding, which its f08 binding calls too); the optional ierror, absent, is a
// null pointer, replaced by a local one. MPICH's f08 bindings are not covered.
#include <dlfcn.h>
#include <mpi.h>

#include <algorithm>
#include <cctype>
#include <string>
#include <tuple>
#include <vector>

#include "base/log.hpp"
#include "config/env.hpp"
#include "core/requests.hpp"
#include "core/runtime.hpp"
#include "shim/dispatch.hpp"
#include "shim/export.hpp"
#include "shim/persistent.hpp"

using streamcoll::Coll;
using streamcoll::CollArgs;
using streamcoll::FortranCall;
using F = MPI_Fint;

static_assert(sizeof(MPI_Fint) == sizeof(int), "recvcounts/displs are passed as int arrays");

namespace {

// The MPI library's own Fortran binding `base` (e.g. "pmpi_allreduce"), in whichever
// of the usual name manglings it exports.
void* resolve(const char* base) {
  std::string b = base, upper = base;
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (const std::string& name : {b + "_", b + "__", b, upper})
    if (void* p = dlsym(RTLD_DEFAULT, name.c_str())) return p;
  streamcoll::log_error("Fortran binding %s not found in the MPI library; aborting", base);
  PMPI_Abort(MPI_COMM_WORLD, MPI_ERR_INTERN);
  return nullptr;
}

// Fortran's MPI_IN_PLACE and MPI_BOTTOM are addresses of special variables; map them to
// the C constants so that the dispatcher sees the call as MPI defines it.
struct Sentinels {
  const void* in_place[5] = {};
  const void* bottom[5] = {};
  Sentinels() {
    int i = 0, j = 0;
    // Open MPI: the variables themselves.
    for (const char* n : {"mpi_fortran_in_place_", "mpi_fortran_in_place", "mpi_fortran_in_place__",
                          "MPI_FORTRAN_IN_PLACE"})
      if (void* p = dlsym(RTLD_DEFAULT, n); p && i < 4) in_place[i++] = p;
    for (const char* n : {"mpi_fortran_bottom_", "mpi_fortran_bottom", "mpi_fortran_bottom__",
                          "MPI_FORTRAN_BOTTOM"})
      if (void* p = dlsym(RTLD_DEFAULT, n); p && j < 4) bottom[j++] = p;
    // MPICH: a C variable holding the address, set when Fortran initialises MPI.
    if (auto* p = static_cast<void**>(dlsym(RTLD_DEFAULT, "MPIR_F_MPI_IN_PLACE")); p && *p)
      in_place[i++] = *p;
    if (auto* p = static_cast<void**>(dlsym(RTLD_DEFAULT, "MPIR_F_MPI_BOTTOM")); p && *p)
      bottom[j++] = *p;
  }
};

const void* c_buf(const void* p) {
  static const Sentinels s;
  for (const void* x : s.in_place)
    if (x && p == x) return MPI_IN_PLACE;
  for (const void* x : s.bottom)
    if (x && p == x) return MPI_BOTTOM;
  return p;
}
void* c_buf(void* p) { return const_cast<void*>(c_buf(static_cast<const void*>(p))); }

// Inside the MPI's own Fortran binding (shim/dispatch.hpp: g_in_binding).
struct BindingScope {
  BindingScope() { ++streamcoll::g_in_binding; }
  ~BindingScope() { --streamcoll::g_in_binding; }
  BindingScope(const BindingScope&) = delete;
  BindingScope& operator=(const BindingScope&) = delete;
};

// The real Fortran call with its arguments, run by the pmpi route.
template <class... A>
struct Real final : FortranCall {
  using Fn = void (*)(A...);
  Real(Fn fn, F* ierr, A... args) : FortranCall{&invoke}, fn_(fn), args_(args...), ierr_(ierr) {}
  static int invoke(const FortranCall* self) {
    const Real* r = static_cast<const Real*>(self);
    BindingScope scope;
    std::apply(r->fn_, r->args_);
    return *r->ierr_;
  }
  Fn fn_;
  std::tuple<A...> args_;
  F* ierr_;
};

// The MPI's Fortran binding `base`: called, it runs inside a BindingScope; `.fn` is the
// bare function (Real calls it in one).
template <class Fn>
struct Bound {
  Fn fn;
  template <class... X>
  void operator()(X... x) const {
    BindingScope scope;
    fn(x...);
  }
};
template <class Fn>
Bound<Fn> real(const char* base) {
  return Bound<Fn>{reinterpret_cast<Fn>(resolve(base))};
}

// Dispatches a call made through the Fortran bindings, routed as the C call would be. A
// route other than pmpi runs it on its C arguments (handles and MPI_IN_PLACE converted
// above): its return code is ierr, and a non-blocking call's C request becomes the
// Fortran one. On pmpi the MPI's binding ran and set ierr and the request itself.
void run(CollArgs& a, FortranCall& call, F* ierr, MPI_Request* scratch,
         F* freq = nullptr) {
  call.request = freq;
  a.fortran = &call;
  if (a.nonblocking) {
    *scratch = MPI_REQUEST_NULL;
    a.request = scratch;
  }
  int rc = streamcoll::dispatch(a);
  if (a.nonblocking && freq && *scratch != MPI_REQUEST_NULL) {
    *freq = PMPI_Request_c2f(*scratch);
    *ierr = rc;
    return;
  }
  // A blocking call that a route ran on its C arguments (one decided from its signature's
  // earlier agreement: shim/dispatch.cpp) sets no ierr itself; the MPI's binding set the
  // value dispatch returns. A non-blocking one that the binding ran set it already.
  if (!a.nonblocking || rc != MPI_SUCCESS) *ierr = rc;
}

CollArgs reduction(Coll c, void* s, void* r, F count, F type, F op, F comm, bool nb) {
  CollArgs a;
  a.coll = c;
  a.nonblocking = nb;
  a.sendbuf = c_buf(s);
  a.recvbuf = c_buf(r);
  a.count = count;
  a.datatype = PMPI_Type_f2c(type);
  a.op = PMPI_Op_f2c(op);
  a.comm = PMPI_Comm_f2c(comm);
  return a;
}

CollArgs gather_like(Coll c, void* s, F sc, F st, void* r, F rc, F rt, F comm, bool nb) {
  CollArgs a;
  a.coll = c;
  a.nonblocking = nb;
  a.sendbuf = c_buf(s);
  a.sendcount = sc;
  a.sendtype = PMPI_Type_f2c(st);
  a.recvbuf = c_buf(r);
  a.recvcount = rc;
  a.recvtype = PMPI_Type_f2c(rt);
  a.comm = PMPI_Comm_f2c(comm);
  return a;
}

// MPI_INIT, MPI_INIT_THREAD, MPI_QUERY_THREAD: the thread level as for C (shim/init.cpp).
// Open MPI's and MPICH's Fortran MPI_THREAD_* values equal their C values.
void init_thread(F* required, F* provided, F* ierr) {
  static const auto fn = real<void (*)(F*, F*, F*)>("pmpi_init_thread");
  F ask = streamcoll::Runtime::wants_thread_multiple() ? std::max<F>(*required, MPI_THREAD_MULTIPLE)
                                                     : *required;
  F got = MPI_THREAD_SINGLE;
  fn(&ask, &got, ierr);
  if (*ierr != MPI_SUCCESS) return;
  *provided = std::min(*required, got);
  streamcoll::set_application_thread_level(*provided);
  streamcoll::Runtime::get().start();
}
void init(F* ierr) {
  F required = MPI_THREAD_SINGLE, provided = 0;
  init_thread(&required, &provided, ierr);
}
void query_thread(F* provided, F* ierr) {
  const int level = streamcoll::application_thread_level();
  int initialized = 0;
  PMPI_Initialized(&initialized);
  if (level < 0 || !initialized) {
    static const auto fn = real<void (*)(F*, F*)>("pmpi_query_thread");
    fn(provided, ierr);
    return;
  }
  *provided = level;
  *ierr = MPI_SUCCESS;
}

// One implementation per call; the macro below exports it under the four usual names.
void allreduce(void* s, void* r, F* n, F* t, F* op, F* comm, F* ierr) {
  static const auto fn = real<void (*)(void*, void*, F*, F*, F*, F*, F*)>("pmpi_allreduce");
  Real call(fn.fn, ierr, s, r, n, t, op, comm, ierr);
  CollArgs a = reduction(Coll::allreduce, s, r, *n, *t, *op, *comm, false);
  run(a, call, ierr, nullptr);
}
void iallreduce(void* s, void* r, F* n, F* t, F* op, F* comm, F* req, F* ierr) {
  static const auto fn = real<void (*)(void*, void*, F*, F*, F*, F*, F*, F*)>("pmpi_iallreduce");
  Real call(fn.fn, ierr, s, r, n, t, op, comm, req, ierr);
  CollArgs a = reduction(Coll::allreduce, s, r, *n, *t, *op, *comm, true);
  MPI_Request scratch;
  run(a, call, ierr, &scratch, req);
}
void reduce(void* s, void* r, F* n, F* t, F* op, F* root, F* comm, F* ierr) {
  static const auto fn = real<void (*)(void*, void*, F*, F*, F*, F*, F*, F*)>("pmpi_reduce");
  Real call(fn.fn, ierr, s, r, n, t, op, root, comm, ierr);
  CollArgs a = reduction(Coll::reduce, s, r, *n, *t, *op, *comm, false);
  a.root = *root;
  run(a, call, ierr, nullptr);
}
void ireduce(void* s, void* r, F* n, F* t, F* op, F* root, F* comm, F* req, F* ierr) {
  static const auto fn = real<void (*)(void*, void*, F*, F*, F*, F*, F*, F*, F*)>("pmpi_ireduce");
  Real call(fn.fn, ierr, s, r, n, t, op, root, comm, req, ierr);
  CollArgs a = reduction(Coll::reduce, s, r, *n, *t, *op, *comm, true);
  a.root = *root;
  MPI_Request scratch;
  run(a, call, ierr, &scratch, req);
}
void bcast(void* b, F* n, F* t, F* root, F* comm, F* ierr) {
  static const auto fn = real<void (*)(void*, F*, F*, F*, F*, F*)>("pmpi_bcast");
  Real call(fn.fn, ierr, b, n, t, root, comm, ierr);
  CollArgs a = reduction(Coll::bcast, nullptr, b, *n, *t, PMPI_Op_c2f(MPI_OP_NULL), *comm, false);
  a.root = *root;
  run(a, call, ierr, nullptr);
}
void ibcast(void* b, F* n, F* t, F* root, F* comm, F* req, F* ierr) {
  static const auto fn = real<void (*)(void*, F*, F*, F*, F*, F*, F*)>("pmpi_ibcast");
  Real call(fn.fn, ierr, b, n, t, root, comm, req, ierr);
  CollArgs a = reduction(Coll::bcast, nullptr, b, *n, *t, PMPI_Op_c2f(MPI_OP_NULL), *comm, true);
  a.root = *root;
  MPI_Request scratch;
  run(a, call, ierr, &scratch, req);
}
void allgather(void* s, F* sc, F* st, void* r, F* rc, F* rt, F* comm, F* ierr) {
  static const auto fn = real<void (*)(void*, F*, F*, void*, F*, F*, F*, F*)>("pmpi_allgather");
  Real call(fn.fn, ierr, s, sc, st, r, rc, rt, comm, ierr);
  CollArgs a = gather_like(Coll::allgather, s, *sc, *st, r, *rc, *rt, *comm, false);
  run(a, call, ierr, nullptr);
}
void iallgather(void* s, F* sc, F* st, void* r, F* rc, F* rt, F* comm, F* req, F* ierr) {
  static const auto fn =
      real<void (*)(void*, F*, F*, void*, F*, F*, F*, F*, F*)>("pmpi_iallgather");
  Real call(fn.fn, ierr, s, sc, st, r, rc, rt, comm, req, ierr);
  CollArgs a = gather_like(Coll::allgather, s, *sc, *st, r, *rc, *rt, *comm, true);
  MPI_Request scratch;
  run(a, call, ierr, &scratch, req);
}
void allgatherv(void* s, F* sc, F* st, void* r, F* rcs, F* ds, F* rt, F* comm, F* ierr) {
  static const auto fn =
      real<void (*)(void*, F*, F*, void*, F*, F*, F*, F*, F*)>("pmpi_allgatherv");
  Real call(fn.fn, ierr, s, sc, st, r, rcs, ds, rt, comm, ierr);
  CollArgs a = gather_like(Coll::allgatherv, s, *sc, *st, r, 0, *rt, *comm, false);
  a.recvcounts = rcs;
  a.displs = ds;
  run(a, call, ierr, nullptr);
}
void iallgatherv(void* s, F* sc, F* st, void* r, F* rcs, F* ds, F* rt, F* comm, F* req,
                 F* ierr) {
  static const auto fn =
      real<void (*)(void*, F*, F*, void*, F*, F*, F*, F*, F*, F*)>("pmpi_iallgatherv");
  Real call(fn.fn, ierr, s, sc, st, r, rcs, ds, rt, comm, req, ierr);
  CollArgs a = gather_like(Coll::allgatherv, s, *sc, *st, r, 0, *rt, *comm, true);
  a.recvcounts = rcs;
  a.displs = ds;
  MPI_Request scratch;
  run(a, call, ierr, &scratch, req);
}
void reduce_scatter_block(void* s, void* r, F* n, F* t, F* op, F* comm, F* ierr) {
  static const auto fn =
      real<void (*)(void*, void*, F*, F*, F*, F*, F*)>("pmpi_reduce_scatter_block");
  Real call(fn.fn, ierr, s, r, n, t, op, comm, ierr);
  CollArgs a = reduction(Coll::reduce_scatter_block, s, r, *n, *t, *op, *comm, false);
  run(a, call, ierr, nullptr);
}
void ireduce_scatter_block(void* s, void* r, F* n, F* t, F* op, F* comm, F* req, F* ierr) {
  static const auto fn =
      real<void (*)(void*, void*, F*, F*, F*, F*, F*, F*)>("pmpi_ireduce_scatter_block");
  Real call(fn.fn, ierr, s, r, n, t, op, comm, req, ierr);
  CollArgs a = reduction(Coll::reduce_scatter_block, s, r, *n, *t, *op, *comm, true);
  MPI_Request scratch;
  run(a, call, ierr, &scratch, req);
}
void reduce_scatter(void* s, void* r, F* rcs, F* t, F* op, F* comm, F* ierr) {
  static const auto fn =
      real<void (*)(void*, void*, F*, F*, F*, F*, F*)>("pmpi_reduce_scatter");
  Real call(fn.fn, ierr, s, r, rcs, t, op, comm, ierr);
  CollArgs a = reduction(Coll::reduce_scatter, s, r, 0, *t, *op, *comm, false);
  a.recvcounts = rcs;
  run(a, call, ierr, nullptr);
}
void ireduce_scatter(void* s, void* r, F* rcs, F* t, F* op, F* comm, F* req, F* ierr) {
  static const auto fn =
      real<void (*)(void*, void*, F*, F*, F*, F*, F*, F*)>("pmpi_ireduce_scatter");
  Real call(fn.fn, ierr, s, r, rcs, t, op, comm, req, ierr);
  CollArgs a = reduction(Coll::reduce_scatter, s, r, 0, *t, *op, *comm, true);
  a.recvcounts = rcs;
  MPI_Request scratch;
  run(a, call, ierr, &scratch, req);
}
void alltoall(void* s, F* sc, F* st, void* r, F* rc, F* rt, F* comm, F* ierr) {
  static const auto fn = real<void (*)(void*, F*, F*, void*, F*, F*, F*, F*)>("pmpi_alltoall");
  Real call(fn.fn, ierr, s, sc, st, r, rc, rt, comm, ierr);
  CollArgs a = gather_like(Coll::alltoall, s, *sc, *st, r, *rc, *rt, *comm, false);
  run(a, call, ierr, nullptr);
}
void ialltoall(void* s, F* sc, F* st, void* r, F* rc, F* rt, F* comm, F* req, F* ierr) {
  static const auto fn =
      real<void (*)(void*, F*, F*, void*, F*, F*, F*, F*, F*)>("pmpi_ialltoall");
  Real call(fn.fn, ierr, s, sc, st, r, rc, rt, comm, req, ierr);
  CollArgs a = gather_like(Coll::alltoall, s, *sc, *st, r, *rc, *rt, *comm, true);
  MPI_Request scratch;
  run(a, call, ierr, &scratch, req);
}
void barrier(F* comm, F* ierr) {
  static const auto fn = real<void (*)(F*, F*)>("pmpi_barrier");
  Real call(fn.fn, ierr, comm, ierr);
  CollArgs a;
  a.coll = Coll::barrier;
  a.comm = PMPI_Comm_f2c(*comm);
  run(a, call, ierr, nullptr);
}
void ibarrier(F* comm, F* req, F* ierr) {
  static const auto fn = real<void (*)(F*, F*, F*)>("pmpi_ibarrier");
  Real call(fn.fn, ierr, comm, req, ierr);
  CollArgs a;
  a.coll = Coll::barrier;
  a.nonblocking = true;
  a.comm = PMPI_Comm_f2c(*comm);
  MPI_Request scratch;
  run(a, call, ierr, &scratch, req);
}

// ---- completion: the wait/test family, MPI_REQUEST_GET_STATUS, MPI_REQUEST_FREE ----------

namespace req = streamcoll::requests;
namespace pers = streamcoll::persistent;

std::vector<MPI_Request> c_requests(F n, const F* f) {
  std::vector<MPI_Request> c(static_cast<size_t>(n));
  for (F i = 0; i < n; ++i) c[static_cast<size_t>(i)] = PMPI_Request_f2c(f[i]);
  return c;
}

// The owned requests among f[0, n), and the C handles they were found in.
struct FOwned {
  std::vector<MPI_Request> c;
  std::vector<req::Owned> owned;
};
bool find_owned(F n, const F* f, FOwned* out) {
  if (!req::any_owned() || f == nullptr || n <= 0) return false;
  out->c = c_requests(n, f);
  out->owned = req::find(static_cast<int>(n), out->c.data());
  return !out->owned.empty();
}

// f with the owned requests replaced by the Fortran MPI_REQUEST_NULL.
std::vector<F> f_ordinary(F n, const F* f, const std::vector<req::Owned>& owned) {
  std::vector<F> v(f, f + n);
  for (const req::Owned& o : owned) v[static_cast<size_t>(o.index)] = PMPI_Request_c2f(MPI_REQUEST_NULL);
  return v;
}
void f_write_back(const std::vector<F>& ordinary, const std::vector<req::Owned>& owned, F* f) {
  size_t k = 0;
  for (size_t i = 0; i < ordinary.size(); ++i) {
    if (k < owned.size() && owned[k].index == static_cast<int>(i)) {
      ++k;
      continue;
    }
    f[i] = ordinary[i];
  }
}

// f[0, n) as the MPI is to see it: each active persistent request of streamcoll's replaced
// by its running operation's request; restore() gives the caller its persistent handles
// back, inactive where the operation's request completed (as Substituted in C:
// shim/persistent.hpp). MPICH's bindings would reach the C wrappers, which substitute; Open
// MPI's call PMPI_ directly, so the Fortran wrappers substitute first, alike for both.
class FSubstituted {
 public:
  FSubstituted(F n, F* f) : f_(f) {
    if (!pers::any_active() || f == nullptr || n <= 0) return;
    for (F i = 0; i < n; ++i) {
      const MPI_Request r = pers::running(PMPI_Request_f2c(f[i]));
      if (r == MPI_REQUEST_NULL) continue;
      if (v_.empty()) v_.assign(f, f + n);
      v_[static_cast<size_t>(i)] = PMPI_Request_c2f(r);
      subs_.emplace_back(static_cast<size_t>(i), f[i]);
    }
  }
  bool any() const { return !subs_.empty(); }
  F* data() { return v_.data(); }
  void restore() {
    const F null = PMPI_Request_c2f(MPI_REQUEST_NULL);
    size_t k = 0;
    for (size_t i = 0; i < v_.size(); ++i) {
      if (k < subs_.size() && subs_[k].first == i) {
        if (v_[i] == null) pers::finished(PMPI_Request_f2c(subs_[k].second));
        f_[i] = subs_[k++].second;
      } else {
        f_[i] = v_[i];
      }
    }
  }

 private:
  F* f_;
  std::vector<F> v_;
  std::vector<std::pair<size_t, F>> subs_;  // (position, persistent handle)
};

// MPI_START and MPI_STARTALL: streamcoll's persistent requests started by its C wrappers
// (shim/persistent.cpp), which start any other request with the MPI's MPI_Start.
void req_start(F* request, F* ierr) {
  static const auto fn = real<void (*)(F*, F*)>("pmpi_start");
  if (!pers::any_planned()) return fn(request, ierr);
  MPI_Request c = PMPI_Request_f2c(*request);
  *ierr = MPI_Start(&c);
}
void req_startall(F* count, F* requests, F* ierr) {
  static const auto fn = real<void (*)(F*, F*, F*)>("pmpi_startall");
  if (!pers::any_planned() || requests == nullptr || *count <= 0) return fn(count, requests, ierr);
  std::vector<MPI_Request> c = c_requests(*count, requests);
  *ierr = MPI_Startall(*count, c.data());  // (starting changes no handle)
}

void one_owned(F* request, bool wait) {
  if (!req::any_owned()) return;
  MPI_Request c = PMPI_Request_f2c(*request);
  if (streamcoll::OwnedRequest* op = req::peek(c)) {
    if (wait)
      req::complete_one(op);
    else
      op->advance();
  }
}

void req_wait(F* request, F* status, F* ierr) {
  static const auto fn = real<void (*)(F*, F*, F*)>("pmpi_wait");
  if (FSubstituted s(1, request); s.any()) return req_wait(s.data(), status, ierr), s.restore();
  one_owned(request, true);
  fn(request, status, ierr);
}
void req_test(F* request, F* flag, F* status, F* ierr) {
  static const auto fn = real<void (*)(F*, F*, F*, F*)>("pmpi_test");
  if (FSubstituted s(1, request); s.any()) return req_test(s.data(), flag, status, ierr), s.restore();
  one_owned(request, false);
  fn(request, flag, status, ierr);
}
void req_get_status(F* request, F* flag, F* status, F* ierr) {
  static const auto fn = real<void (*)(F*, F*, F*, F*)>("pmpi_request_get_status");
  if (FSubstituted s(1, request); s.any()) return req_get_status(s.data(), flag, status, ierr);
  one_owned(request, false);
  fn(request, flag, status, ierr);
}
void req_free(F* request, F* ierr) {
  static const auto fn = real<void (*)(F*, F*)>("pmpi_request_free");
  if (pers::any_planned()) {  // one of streamcoll's persistent requests: as in C
    MPI_Request c = PMPI_Request_f2c(*request);
    if (int rc; pers::free_request(&c, &rc)) {
      *ierr = rc;
      if (rc == MPI_SUCCESS) *request = PMPI_Request_c2f(c);
      return;
    }
  }
  if (req::any_owned()) {
    MPI_Request c = PMPI_Request_f2c(*request);
    if (streamcoll::OwnedRequest* op = req::peek(c)) {
      req::complete_one(op);  // as for MPI_Request_free in C (shim/requests.cpp)
      op->on_free();
    }
  }
  fn(request, ierr);
}
void req_waitall(F* count, F* requests, F* statuses, F* ierr) {
  static const auto fn = real<void (*)(F*, F*, F*, F*)>("pmpi_waitall");
  if (FSubstituted s(*count, requests); s.any())
    return req_waitall(count, s.data(), statuses, ierr), s.restore();
  FOwned o;
  if (find_owned(*count, requests, &o)) req::complete_all(o.owned);
  fn(count, requests, statuses, ierr);
}
void req_testall(F* count, F* requests, F* flag, F* statuses, F* ierr) {
  static const auto fn = real<void (*)(F*, F*, F*, F*, F*)>("pmpi_testall");
  if (FSubstituted s(*count, requests); s.any())
    return req_testall(count, s.data(), flag, statuses, ierr), s.restore();
  FOwned o;
  if (find_owned(*count, requests, &o))
    for (const req::Owned& x : o.owned) x.op->advance();
  fn(count, requests, flag, statuses, ierr);
}
void req_testany(F* count, F* requests, F* index, F* flag, F* status, F* ierr) {
  static const auto fn = real<void (*)(F*, F*, F*, F*, F*, F*)>("pmpi_testany");
  if (FSubstituted s(*count, requests); s.any())
    return req_testany(count, s.data(), index, flag, status, ierr), s.restore();
  FOwned o;
  if (find_owned(*count, requests, &o))
    for (const req::Owned& x : o.owned) x.op->advance();
  fn(count, requests, index, flag, status, ierr);
}
void req_testsome(F* incount, F* requests, F* outcount, F* indices, F* statuses, F* ierr) {
  static const auto fn = real<void (*)(F*, F*, F*, F*, F*, F*)>("pmpi_testsome");
  if (FSubstituted s(*incount, requests); s.any())
    return req_testsome(incount, s.data(), outcount, indices, statuses, ierr), s.restore();
  FOwned o;
  if (find_owned(*incount, requests, &o))
    for (const req::Owned& x : o.owned) x.op->advance();
  fn(incount, requests, outcount, indices, statuses, ierr);
}
// As MPI_Waitany in C: poll until an owned request is complete (then the wait form), or
// until the test form on the ordinary requests alone finds one complete (its answer).
void req_waitany(F* count, F* requests, F* index, F* status, F* ierr) {
  static const auto wait = real<void (*)(F*, F*, F*, F*, F*)>("pmpi_waitany");
  static const auto test = real<void (*)(F*, F*, F*, F*, F*, F*)>("pmpi_testany");
  if (FSubstituted s(*count, requests); s.any())
    return req_waitany(count, s.data(), index, status, ierr), s.restore();
  FOwned o;
  if (!find_owned(*count, requests, &o)) return wait(count, requests, index, status, ierr);
  std::vector<F> ordinary = f_ordinary(*count, requests, o.owned);
  bool ordinary_active = true;
  for (req::Backoff b;; b.pause()) {
    if (req::poll(o.owned) > 0) return wait(count, requests, index, status, ierr);
    if (!ordinary_active) continue;
    F flag = 0;  // a LOGICAL: .false. is 0 for every compiler; .true. is not 0
    test(count, ordinary.data(), index, &flag, status, ierr);
    // With the flag set, a 1-based index, or none active: MPI_UNDEFINED, which MPICH
    // before 4.1.1 answers as MPI_UNDEFINED + 1 (pmodels/mpich#6402), so "not an index".
    if (*ierr != MPI_SUCCESS || (flag != 0 && *index >= 1)) {
      f_write_back(ordinary, o.owned, requests);
      return;
    }
    if (flag != 0) ordinary_active = false;  // no ordinary request is active
  }
}
// As MPI_Waitsome in C. (The MPI's Fortran binding of MPI_TESTSOME passes C statuses
// even for MPI_STATUSES_IGNORE, so generalized requests' errors are seen as in a wait.)
void req_waitsome(F* incount, F* requests, F* outcount, F* indices, F* statuses, F* ierr) {
  static const auto wait = real<void (*)(F*, F*, F*, F*, F*, F*)>("pmpi_waitsome");
  static const auto test = real<void (*)(F*, F*, F*, F*, F*, F*)>("pmpi_testsome");
  if (FSubstituted s(*incount, requests); s.any())
    return req_waitsome(incount, s.data(), outcount, indices, statuses, ierr), s.restore();
  FOwned o;
  if (!find_owned(*incount, requests, &o))
    return wait(incount, requests, outcount, indices, statuses, ierr);
  std::vector<F> ordinary = f_ordinary(*incount, requests, o.owned);
  bool ordinary_active = true;
  for (req::Backoff b;; b.pause()) {
    if (req::poll(o.owned) > 0)
      return wait(incount, requests, outcount, indices, statuses, ierr);
    if (!ordinary_active) continue;
    test(incount, ordinary.data(), outcount, indices, statuses, ierr);
    if (*ierr != MPI_SUCCESS || (*outcount != MPI_UNDEFINED && *outcount > 0)) {
      f_write_back(ordinary, o.owned, requests);
      return;
    }
    if (*outcount == MPI_UNDEFINED) ordinary_active = false;
  }
}

}  // namespace

// Exports `impl` as name_, name__, name and NAME (the manglings Fortran compilers use).
#define SC_FORTRAN(lower, UPPER, impl, params, args) \
  SC_EXPORT void lower##_ params { impl args; }     \
  SC_EXPORT void lower##__ params { impl args; }    \
  SC_EXPORT void lower params { impl args; }        \
  SC_EXPORT void UPPER params { impl args; }

// `use mpi_f08` (see the file comment): name_f08_ (gfortran) and the other manglings; the
// optional ierror (the last argument) may be absent (null).
template <class... A>
struct F08 {
  void (*impl)(A...);
  void operator()(A... args) const {
    F local = MPI_SUCCESS;
    std::tuple<A...> t(args...);
    F*& ierr = std::get<sizeof...(A) - 1>(t);
    if (!ierr) ierr = &local;
    std::apply(impl, t);
  }
};
template <class... A>
F08<A...> f08(void (*impl)(A...)) {
  return F08<A...>{impl};
}
#define SC_FORTRAN_F08(lower, UPPER, impl, params, args)            \
  SC_EXPORT void lower##_f08_ params { f08(&impl) args; }           \
  SC_EXPORT void lower##_f08__ params { f08(&impl) args; }          \
  SC_EXPORT void lower##_f08 params { f08(&impl) args; }            \
  SC_EXPORT void UPPER##_F08 params { f08(&impl) args; }
// Both bindings of one call.
#define SC_FORTRAN_BOTH(lower, UPPER, impl, params, args) \
  SC_FORTRAN(lower, UPPER, impl, params, args)            \
  SC_FORTRAN_F08(lower, UPPER, impl, params, args)

#define P6 (void* a, void* b, F* c, F* d, F* e, F* f, F* g)
#define A6 (a, b, c, d, e, f, g)
#define P7 (void* a, void* b, F* c, F* d, F* e, F* f, F* g, F* h)
#define A7 (a, b, c, d, e, f, g, h)
#define P8 (void* a, void* b, F* c, F* d, F* e, F* f, F* g, F* h, F* i)
#define A8 (a, b, c, d, e, f, g, h, i)
#define PG (void* a, F* b, F* c, void* d, F* e, F* f, F* g, F* h)
#define AG (a, b, c, d, e, f, g, h)
#define PGI (void* a, F* b, F* c, void* d, F* e, F* f, F* g, F* h, F* i)
#define AGI (a, b, c, d, e, f, g, h, i)
#define PGV (void* a, F* b, F* c, void* d, F* e, F* f, F* g, F* h, F* i)
#define PGVI (void* a, F* b, F* c, void* d, F* e, F* f, F* g, F* h, F* i, F* j)
#define AGVI (a, b, c, d, e, f, g, h, i, j)

SC_FORTRAN_BOTH(mpi_init, MPI_INIT, init, (F* a), (a))
SC_FORTRAN_BOTH(mpi_init_thread, MPI_INIT_THREAD, init_thread, (F* a, F* b, F* c), (a, b, c))
SC_FORTRAN_BOTH(mpi_query_thread, MPI_QUERY_THREAD, query_thread, (F* a, F* b), (a, b))
SC_FORTRAN_BOTH(mpi_allreduce, MPI_ALLREDUCE, allreduce, P6, A6)
SC_FORTRAN_BOTH(mpi_iallreduce, MPI_IALLREDUCE, iallreduce, P7, A7)
SC_FORTRAN_BOTH(mpi_reduce, MPI_REDUCE, reduce, P7, A7)
SC_FORTRAN_BOTH(mpi_ireduce, MPI_IREDUCE, ireduce, P8, A8)
SC_FORTRAN_BOTH(mpi_bcast, MPI_BCAST, bcast, (void* a, F* b, F* c, F* d, F* e, F* f),
           (a, b, c, d, e, f))
SC_FORTRAN_BOTH(mpi_ibcast, MPI_IBCAST, ibcast, (void* a, F* b, F* c, F* d, F* e, F* f, F* g),
           (a, b, c, d, e, f, g))
SC_FORTRAN_BOTH(mpi_allgather, MPI_ALLGATHER, allgather, PG, AG)
SC_FORTRAN_BOTH(mpi_iallgather, MPI_IALLGATHER, iallgather, PGI, AGI)
SC_FORTRAN_BOTH(mpi_allgatherv, MPI_ALLGATHERV, allgatherv, PGV, AGI)
SC_FORTRAN_BOTH(mpi_iallgatherv, MPI_IALLGATHERV, iallgatherv, PGVI, AGVI)
SC_FORTRAN_BOTH(mpi_reduce_scatter_block, MPI_REDUCE_SCATTER_BLOCK, reduce_scatter_block, P6, A6)
SC_FORTRAN_BOTH(mpi_ireduce_scatter_block, MPI_IREDUCE_SCATTER_BLOCK, ireduce_scatter_block, P7, A7)
SC_FORTRAN_BOTH(mpi_reduce_scatter, MPI_REDUCE_SCATTER, reduce_scatter, P6, A6)
SC_FORTRAN_BOTH(mpi_ireduce_scatter, MPI_IREDUCE_SCATTER, ireduce_scatter, P7, A7)
SC_FORTRAN_BOTH(mpi_alltoall, MPI_ALLTOALL, alltoall, PG, AG)
SC_FORTRAN_BOTH(mpi_ialltoall, MPI_IALLTOALL, ialltoall, PGI, AGI)
SC_FORTRAN_BOTH(mpi_barrier, MPI_BARRIER, barrier, (F* a, F* b), (a, b))
SC_FORTRAN_BOTH(mpi_ibarrier, MPI_IBARRIER, ibarrier, (F* a, F* b, F* c), (a, b, c))
SC_FORTRAN_BOTH(mpi_start, MPI_START, req_start, (F* a, F* b), (a, b))
SC_FORTRAN_BOTH(mpi_startall, MPI_STARTALL, req_startall, (F* a, F* b, F* c), (a, b, c))
SC_FORTRAN_BOTH(mpi_wait, MPI_WAIT, req_wait, (F* a, F* b, F* c), (a, b, c))
SC_FORTRAN_BOTH(mpi_test, MPI_TEST, req_test, (F* a, F* b, F* c, F* d), (a, b, c, d))
SC_FORTRAN_BOTH(mpi_request_get_status, MPI_REQUEST_GET_STATUS, req_get_status,
           (F* a, F* b, F* c, F* d), (a, b, c, d))
SC_FORTRAN_BOTH(mpi_request_free, MPI_REQUEST_FREE, req_free, (F* a, F* b), (a, b))
SC_FORTRAN_BOTH(mpi_waitall, MPI_WAITALL, req_waitall, (F* a, F* b, F* c, F* d), (a, b, c, d))
SC_FORTRAN_BOTH(mpi_testall, MPI_TESTALL, req_testall, (F* a, F* b, F* c, F* d, F* e), (a, b, c, d, e))
SC_FORTRAN_BOTH(mpi_waitany, MPI_WAITANY, req_waitany, (F* a, F* b, F* c, F* d, F* e), (a, b, c, d, e))
SC_FORTRAN_BOTH(mpi_testany, MPI_TESTANY, req_testany, (F* a, F* b, F* c, F* d, F* e, F* f),
           (a, b, c, d, e, f))
SC_FORTRAN_BOTH(mpi_waitsome, MPI_WAITSOME, req_waitsome, (F* a, F* b, F* c, F* d, F* e, F* f),
           (a, b, c, d, e, f))
SC_FORTRAN_BOTH(mpi_testsome, MPI_TESTSOME, req_testsome, (F* a, F* b, F* c, F* d, F* e, F* f),
           (a, b, c, d, e, f))
