// collectives_check: runs every MPI collective that streamcoll intercepts, blocking and
// non-blocking, over the predefined datatypes and the reduction ops MPI defines for them
// (MPI-4.0 section 6.9.2), and checks each result against values computed here, never
// against another MPI call.
//
// Every rank's input is a pure function of (op, rank, element index, call number), so any
// rank can compute what every other rank contributed and fold the expected result itself.
// Inputs stay small where arithmetic happens (sums add integers in [-3, 3], PROD multiplies
// factors of modulus 1/2, 1 or 2 with only ranks 0-3 contributing other than units,
// floating values are small multiples of 1/4 or 1/8), so results are exact for every type
// and for any number of ranks up to 40. Where the MPI library itself has a known defect
// (find_mpi_defects), the affected inputs are narrowed and rank 0 says so on stderr.
//
// With STREAMCOLL_EXPECT_INTERCEPT=1 the program also proves that streamcoll saw each call:
// streamcoll_get_stats (found with dlsym) must count exactly one more call of exactly that
// collective, and one more in total, per call. Without it, the program needs no streamcoll
// at all. Run it with 1 to 4 ranks (or more); rank 0 prints "N passed, N failed".
//
// Build:  mpicxx -std=c++17 -O2 -I include tests/mpi/collectives_check.cpp -ldl
#define OMPI_SKIP_MPICXX 1  // the C API only, not the deprecated C++ bindings
#define MPICH_SKIP_MPICXX 1
#include <dlfcn.h>
#include <mpi.h>

#include <cctype>
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
#include "value_model.hpp"

namespace {

// ------------------------------------------------------------------------ reduction ops

struct OpDesc {
  MPI_Op handle;
  const char* name;
};

const OpDesc& describe(Op op) {
  static const OpDesc table[] = {
      {MPI_MAX, "MPI_MAX"},   {MPI_MIN, "MPI_MIN"},       {MPI_SUM, "MPI_SUM"},
      {MPI_PROD, "MPI_PROD"}, {MPI_LAND, "MPI_LAND"},     {MPI_LOR, "MPI_LOR"},
      {MPI_LXOR, "MPI_LXOR"}, {MPI_BAND, "MPI_BAND"},     {MPI_BOR, "MPI_BOR"},
      {MPI_BXOR, "MPI_BXOR"}, {MPI_MAXLOC, "MPI_MAXLOC"}, {MPI_MINLOC, "MPI_MINLOC"},
      {MPI_OP_NULL, "-"},
  };
  return table[static_cast<int>(op)];
}

// MPI's groups of basic datatypes (MPI-4.0 section 6.9.2), and the ops defined on each.
enum class Cls { integer, floating, complex, logical, byte, multi_language, pair };

std::vector<Op> ops_for(Cls c) {
  switch (c) {
    case Cls::integer:
      return {Op::max, Op::min,  Op::sum,  Op::prod, Op::land,
              Op::lor, Op::lxor, Op::band, Op::bor,  Op::bxor};
    case Cls::floating:
      return {Op::max, Op::min, Op::sum, Op::prod};
    case Cls::complex:
      return {Op::sum, Op::prod};
    case Cls::logical:
      return {Op::land, Op::lor, Op::lxor};
    case Cls::byte:
      return {Op::band, Op::bor, Op::bxor};
    case Cls::multi_language:
      return {Op::max, Op::min, Op::sum, Op::prod, Op::band, Op::bor, Op::bxor};
    case Cls::pair:
      return {Op::maxloc, Op::minloc};
  }
  return {};
}

// ---------------------------------------------------------------------- datatype table

struct TypeDesc {
  MPI_Datatype handle;
  const char* name;
  Cls cls;
  Kernel k;
  bool is_unsigned;  // an unsigned integer type
};

const std::vector<TypeDesc>& all_types() {
#define TYPE(handle, ctype, cls) \
  TypeDesc { handle, #handle, Cls::cls, kernel_of<ctype>(), std::is_unsigned_v<ctype> }
  static const std::vector<TypeDesc> types = {
      TYPE(MPI_SIGNED_CHAR, signed char, integer),
      TYPE(MPI_UNSIGNED_CHAR, unsigned char, integer),
      TYPE(MPI_SHORT, short, integer),
      TYPE(MPI_UNSIGNED_SHORT, unsigned short, integer),
      TYPE(MPI_INT, int, integer),
      TYPE(MPI_UNSIGNED, unsigned, integer),
      TYPE(MPI_LONG, long, integer),
      TYPE(MPI_UNSIGNED_LONG, unsigned long, integer),
      TYPE(MPI_LONG_LONG, long long, integer),
      TYPE(MPI_UNSIGNED_LONG_LONG, unsigned long long, integer),
      TYPE(MPI_INT8_T, int8_t, integer),
      TYPE(MPI_INT16_T, int16_t, integer),
      TYPE(MPI_INT32_T, int32_t, integer),
      TYPE(MPI_INT64_T, int64_t, integer),
      TYPE(MPI_UINT8_T, uint8_t, integer),
      TYPE(MPI_UINT16_T, uint16_t, integer),
      TYPE(MPI_UINT32_T, uint32_t, integer),
      TYPE(MPI_UINT64_T, uint64_t, integer),
      TYPE(MPI_FLOAT, float, floating),
      TYPE(MPI_DOUBLE, double, floating),
      TYPE(MPI_LONG_DOUBLE, long double, floating),
      TYPE(MPI_C_FLOAT_COMPLEX, std::complex<float>, complex),
      TYPE(MPI_C_DOUBLE_COMPLEX, std::complex<double>, complex),
      TYPE(MPI_C_LONG_DOUBLE_COMPLEX, std::complex<long double>, complex),
      TYPE(MPI_C_BOOL, bool, logical),
      TYPE(MPI_BYTE, unsigned char, byte),
      TYPE(MPI_AINT, MPI_Aint, multi_language),
      TYPE(MPI_OFFSET, MPI_Offset, multi_language),
      TYPE(MPI_COUNT, MPI_Count, multi_language),
      TYPE(MPI_FLOAT_INT, Pair<float>, pair),
      TYPE(MPI_DOUBLE_INT, Pair<double>, pair),
      TYPE(MPI_LONG_INT, Pair<long>, pair),
      TYPE(MPI_2INT, Pair<int>, pair),
      TYPE(MPI_SHORT_INT, Pair<short>, pair),
      TYPE(MPI_LONG_DOUBLE_INT, Pair<long double>, pair),
  };
#undef TYPE
  return types;
}

const TypeDesc& type_named(const char* name) {
  for (const TypeDesc& t : all_types())
    if (std::strcmp(t.name, name) == 0) return t;
  std::fprintf(stderr, "collectives_check: no datatype %s in the table\n", name);
  std::abort();
}

// Defects of the MPI library under test (not of streamcoll) that the inputs step around:
// for these (datatype, op) pairs MAX and MIN see only values in [0, 100], where a signed
// and an unsigned reading agree. Everything else about those calls is still checked.
struct MpiDefect {
  const char* type;
  Op op;
  const char* why;
};
std::vector<MpiDefect> g_defects;
// MPICH 4.0 and 4.1 crash on a blocking MPI_Reduce with MPI_IN_PLACE at a root other than
// 0 (pmodels/mpich#6540): such a root passes its input in a send buffer instead.
bool g_no_in_place_reduce_off_rank0 = false;
// MPICH 4.0's MPI_Allgatherv on one rank copies the block to displacement 0 whatever
// displs says (pmodels/mpich#6374): one-rank calls place it at 0.
bool g_allgatherv_one_rank_at_0 = false;
// MPICH 4.0's MPI_Alltoall in place on the pair types (MPI_DOUBLE_INT...: padded, extent >
// size) fails with "message truncated" or moves the wrong elements; its MPI_Reduce_scatter
// in place, with a rank's count 0 between others, stops on an internal assertion
// (overlapping memcpy) at large sizes: those calls are not run in place.
bool g_no_in_place_pairs = false;
bool g_no_in_place_reduce_scatter = false;

void find_mpi_defects() {
  char lib[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  int len = 0;
  if (MPI_Get_library_version(lib, &len) != MPI_SUCCESS) return;
  if (int major = 0, minor = 0; mpich_version(lib, &major, &minor)) {
    if (major == 4 && minor <= 1) {
      g_no_in_place_reduce_off_rank0 = true;
      g_allgatherv_one_rank_at_0 = g_no_in_place_pairs = g_no_in_place_reduce_scatter =
          minor == 0;
    }
  }
  if (mpich_unsigned_minmax_as_signed(lib)) {
    for (const TypeDesc& t : all_types())
      if (t.is_unsigned && t.cls == Cls::integer)
        for (Op op : {Op::max, Op::min})
          g_defects.push_back({t.name, op, "MPICH 4.0 reduces unsigned integers as signed"});
    return;
  }
  int major = 0, minor = 0, release = 0;
  if (std::sscanf(lib, "Open MPI v%d.%d.%d", &major, &minor, &release) < 2) return;
  const int version = major * 10000 + minor * 100 + release;
  // ompi/op/op.c maps MPI_OFFSET to its uint64 functions, so negative offsets compare as
  // huge ones.
  for (Op op : {Op::max, Op::min})
    g_defects.push_back({"MPI_OFFSET", op, "Open MPI reduces MPI_OFFSET as unsigned"});
  // Open MPI 4.1.2-4.1.4 (and 4.0.x alike) reduce MPI_UNSIGNED_LONG as signed long
  // (open-mpi/ompi issues 10525 and 10648, fixed in 4.1.5).
  if (version < 40105)
    for (Op op : {Op::max, Op::min})
      g_defects.push_back(
          {"MPI_UNSIGNED_LONG", op, "Open MPI before 4.1.5 reduces MPI_UNSIGNED_LONG as signed"});
}

bool tame_inputs(const TypeDesc& t, Op op) {
  for (const MpiDefect& d : g_defects)
    if (d.op == op && std::strcmp(d.type, t.name) == 0) return true;
  return false;
}

// ------------------------------------------------------------------- buffers, comms

struct Comm {
  MPI_Comm handle;
  std::string name;
  int rank, size;
};

// Elements written after each receive region, which must keep their sentinel values.
constexpr size_t kGuard = 3;

// ----------------------------------------------------------------- results and reports

// How one call was made, for the failure report.
struct CallInfo {
  std::string call;  // "MPI_Iallreduce"
  std::string how;   // "blocking", or how the request was completed
  const Comm* comm = nullptr;
  const TypeDesc* type = nullptr;
  Op op = Op::none;
  long count = -1;     // elements per rank or per block; -1: not applicable
  std::string counts;  // the per-rank counts of the v-variants
  int root = -1;
  bool in_place = false;
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
                         "] comm=" + (c.comm ? c.comm->name : "-") +
                         " type=" + (c.type ? c.type->name : "-") + " op=" + describe(c.op).name +
                         " count=" + (c.count >= 0 ? std::to_string(c.count) : "-");
      if (!c.counts.empty()) line += " counts=" + c.counts;
      line += " root=" + (c.root >= 0 ? std::to_string(c.root) : "-");
      line += std::string(" in_place=") + (c.in_place ? "yes" : "no") + ": " + what + "\n";
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
  int rank_ = 0;
  int printed_ = 0;
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

// ------------------------------------------------------------ interception (statistics)

using GetStats = int (*)(const char*, const char*, const char*, streamcoll_stat_t*);

struct Interception {
  bool expected = false;     // STREAMCOLL_EXPECT_INTERCEPT=1
  GetStats get = nullptr;    // streamcoll_get_stats, when loaded
  long long baseline = 0;    // the total counter before the first call
  long long calls_made = 0;  // collective calls this process has made since

  bool active() const { return expected && get != nullptr; }
  // The call counter for one collective name (nullptr: all), or -1 if the query fails.
  long long calls(const char* coll) const {
    streamcoll_stat_t s{0, 0, 0.0};
    if (get(coll, nullptr, nullptr, &s) != 0) return -1;
    return static_cast<long long>(s.calls);
  }
};

Interception g_intercept;

// Wraps one collective call: the counter of exactly that collective, and the total over
// all of them, must each go up by one.
class StatProbe {
 public:
  explicit StatProbe(const char* coll) : coll_(coll) {
    if (!g_intercept.active()) return;
    one_ = g_intercept.calls(coll);
    all_ = g_intercept.calls(nullptr);
  }
  void verify(const CallInfo& c) const {
    ++g_intercept.calls_made;
    if (!g_intercept.active()) return;
    const long long one = g_intercept.calls(coll_), all = g_intercept.calls(nullptr);
    const char* hint = all == 0 ? " (no call counted yet: is STREAMCOLL_STATS=1 set?)" : "";
    g_tally.check(one_ >= 0 && one - one_ == 1, c, [&] {
      return "streamcoll_get_stats(\"" + std::string(coll_) + "\") went from " +
             std::to_string(one_) + " to " + std::to_string(one) + ", expected +1" + hint;
    });
    g_tally.check(all_ >= 0 && all - all_ == 1, c, [&] {
      return "streamcoll_get_stats(all) went from " + std::to_string(all_) + " to " +
             std::to_string(all) + ", expected +1";
    });
  }

 private:
  const char* coll_;
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

// A collective call with its buffers and the result it must produce. The buffers live
// here, so a Pending must outlive its request.
struct Pending {
  std::string name;  // the blocking call's name, "MPI_Allreduce"
  CallInfo info;
  const char* stat_name = "";  // the blocking name; "i" + it for the non-blocking call
  const Kernel* k = nullptr;
  Buffer send, recv, want;  // want: what recv must hold in [0, check_end)
  Buffer send_copy;         // the send buffer as filled, when it must stay unchanged
  size_t check_end = 0;
  std::vector<int> counts, displs;
  // Makes the call: blocking if `req` is null, else the non-blocking one.
  std::function<int(MPI_Request* req)> call;
  MPI_Request req = MPI_REQUEST_NULL;
  bool started = false;

  // Remembers the send buffer, and initialises `want` as recv currently is.
  void snapshot() {
    if (send.size() > 0) {
      send_copy = Buffer(send.size(), k->size);
      std::memcpy(send_copy.data(), send.data(), send.bytes());
    }
    want = Buffer(recv.size(), k->size);
    std::memcpy(want.data(), recv.data(), recv.bytes());
  }
};

using PendingPtr = std::unique_ptr<Pending>;

// The call number: the same sequence on every rank of a communicator. Each test phase
// starts from its own value, since the halves of the split communicator make different
// numbers of calls.
uint64_t g_salt = 0;
std::vector<std::pair<const char*, double>> g_phases;  // name and start time of each phase

void begin_phase(const char* name) {
  g_phases.emplace_back(name, MPI_Wtime());
  g_salt = static_cast<uint64_t>(g_phases.size()) << 32;
}

int g_rotation = 0;  // picks the completion method of the next non-blocking call

// MPI_Allreduce -> MPI_Iallreduce
std::string nonblocking_name(const std::string& name) {
  return "MPI_I" + std::string(1, static_cast<char>(std::tolower(name[4]))) + name.substr(5);
}

// Issues the call (non-blocking: only starts it) and checks its return code and statistics.
void start(Pending& p, bool nonblocking) {
  const std::string stat = (nonblocking ? "i" : "") + std::string(p.stat_name);
  p.info.call = nonblocking ? nonblocking_name(p.name) : p.name;
  StatProbe probe(stat.c_str());
  const int rc = p.call(nonblocking ? &p.req : nullptr);
  probe.verify(p.info);
  p.started = check_rc(rc, p.info, p.info.call.c_str());
}

// Checks the received data, the sentinels around it, and that the send buffer is unchanged.
void verify(Pending& p) {
  if (!p.started) return;
  const size_t bad = p.k->mismatch(p.recv.data(), p.want.data(), 0, p.check_end);
  g_tally.check(bad == p.check_end, p.info, [&] {
    return "element " + std::to_string(bad) + ": expected " + p.k->show(p.want.data(), bad) +
           ", got " + p.k->show(p.recv.data(), bad);
  });
  if (p.send_copy.size() > 0) {
    const bool same_send = std::memcmp(p.send.data(), p.send_copy.data(), p.send.bytes()) == 0;
    g_tally.check(same_send, p.info, [] { return std::string("the send buffer was modified"); });
  }
}

// Runs one call to the end: blocking, or non-blocking completed the way `how` says.
void run(Pending& p, bool nonblocking, Completion how) {
  p.info.how = nonblocking ? describe(how) : "blocking";
  start(p, nonblocking);
  if (nonblocking && p.started) {
    std::vector<MPI_Request> one{p.req};
    complete(one, how, p.info);
    p.req = one[0];
  }
  verify(p);
}

// ------------------------------------------------------------- the collective families

// Fills `n` elements at `dst` with what `rank` contributes from global element `first`.
void fill(const TypeDesc& t, void* dst, size_t n, Op op, int rank, uint64_t first, uint64_t salt) {
  t.k.fill(dst, n, op, rank, first, salt, tame_inputs(t, op));
}
// The reduction over `nranks` ranks of the elements from global element `first` on.
void fill_reduced(const TypeDesc& t, void* dst, size_t n, Op op, int nranks, uint64_t first,
                  uint64_t salt) {
  t.k.reduce(dst, n, op, nranks, first, salt, tame_inputs(t, op));
}
// The sentinel a rank writes into receive buffers before a call.
void fill_sentinel(const TypeDesc& t, Buffer& b, int rank, uint64_t salt) {
  t.k.fill(b.data(), b.size(), Op::none, -1 - rank, 0, salt ^ 0x5e47111e1ull, false);
}

PendingPtr new_pending(const char* call, const char* stat, const Comm& c, const TypeDesc* t, Op op,
                       long count, int root, bool in_place) {
  auto p = std::make_unique<Pending>();
  p->name = call;
  p->info.call = call;
  p->info.comm = &c;
  p->info.type = t;
  p->info.op = op;
  p->info.count = count;
  p->info.root = root;
  p->info.in_place = in_place;
  p->stat_name = stat;
  static const Kernel kNone = kernel_of<unsigned char>();
  p->k = t ? &t->k : &kNone;
  return p;
}

std::string join(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

// Per-rank counts for the v-variants: uneven, and zero on every rank r with r % 3 == 1.
std::vector<int> uneven_counts(int base, int size) {
  std::vector<int> counts(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r)
    counts[r] = base == 0 || r % 3 == 1 ? 0 : static_cast<int>(base + r);
  return counts;
}

PendingPtr make_allreduce(const Comm& c, const TypeDesc& t, Op op, int n, bool in_place) {
  PendingPtr p = new_pending("MPI_Allreduce", "allreduce", c, &t, op, n, -1, in_place);
  const uint64_t salt = ++g_salt;
  p->recv = Buffer(n + kGuard, t.k.size);
  fill_sentinel(t, p->recv, c.rank, salt);
  if (in_place) {
    fill(t, p->recv.data(), n, op, c.rank, 0, salt);
  } else {
    p->send = Buffer(n, t.k.size);
    fill(t, p->send.data(), n, op, c.rank, 0, salt);
  }
  p->snapshot();
  fill_reduced(t, p->want.data(), n, op, c.size, 0, salt);
  p->check_end = n + kGuard;
  Pending* q = p.get();
  p->call = [q, &c, &t, op, n, in_place](MPI_Request* r) {
    const void* s = in_place ? MPI_IN_PLACE : q->send.data();
    const MPI_Op o = describe(op).handle;
    return r ? MPI_Iallreduce(s, q->recv.data(), n, t.handle, o, c.handle, r)
             : MPI_Allreduce(s, q->recv.data(), n, t.handle, o, c.handle);
  };
  return p;
}

// Non-roots pass a null receive buffer (it is not significant there), and their own data
// even in the in-place variant: only the root may use MPI_IN_PLACE.
PendingPtr make_reduce(const Comm& c, const TypeDesc& t, Op op, int n, int root, bool in_place) {
  if (g_no_in_place_reduce_off_rank0 && root != 0) in_place = false;
  PendingPtr p = new_pending("MPI_Reduce", "reduce", c, &t, op, n, root, in_place);
  const uint64_t salt = ++g_salt;
  const bool is_root = c.rank == root;
  if (is_root) {
    p->recv = Buffer(n + kGuard, t.k.size);
    fill_sentinel(t, p->recv, c.rank, salt);
  }
  if (is_root && in_place) {
    fill(t, p->recv.data(), n, op, c.rank, 0, salt);
  } else {
    p->send = Buffer(n, t.k.size);
    fill(t, p->send.data(), n, op, c.rank, 0, salt);
  }
  p->snapshot();
  if (is_root) {
    fill_reduced(t, p->want.data(), n, op, c.size, 0, salt);
    p->check_end = n + kGuard;
  }
  Pending* q = p.get();
  p->call = [q, &c, &t, op, n, root, is_root, in_place](MPI_Request* r) {
    const void* s = is_root && in_place ? MPI_IN_PLACE : q->send.data();
    void* d = is_root ? q->recv.data() : nullptr;
    const MPI_Op o = describe(op).handle;
    return r ? MPI_Ireduce(s, d, n, t.handle, o, root, c.handle, r)
             : MPI_Reduce(s, d, n, t.handle, o, root, c.handle);
  };
  return p;
}

// In place, the whole input sits in the receive buffer and only the first block of the
// result is defined afterwards.
// Buffers of a reduce-scatter: `total` input elements, `mine` of them come back to this
// rank (in place: at the start of the input buffer; otherwise into a guarded buffer).
void scatter_buffers(Pending& p, const Comm& c, const TypeDesc& t, Op op, size_t total,
                     size_t mine, bool in_place, uint64_t salt) {
  if (in_place) {
    p.recv = Buffer(total, t.k.size);
    fill(t, p.recv.data(), total, op, c.rank, 0, salt);
    p.check_end = mine;
  } else {
    p.send = Buffer(total, t.k.size);
    fill(t, p.send.data(), total, op, c.rank, 0, salt);
    p.recv = Buffer(mine + kGuard, t.k.size);
    fill_sentinel(t, p.recv, c.rank, salt);
    p.check_end = mine + kGuard;
  }
  p.snapshot();
}

PendingPtr make_reduce_scatter_block(const Comm& c, const TypeDesc& t, Op op, int blk,
                                     bool in_place) {
  PendingPtr p =
      new_pending("MPI_Reduce_scatter_block", "reduce_scatter_block", c, &t, op, blk, -1, in_place);
  const uint64_t salt = ++g_salt;
  scatter_buffers(*p, c, t, op, static_cast<size_t>(blk) * c.size, blk, in_place, salt);
  fill_reduced(t, p->want.data(), blk, op, c.size, static_cast<uint64_t>(blk) * c.rank, salt);
  Pending* q = p.get();
  p->call = [q, &c, &t, op, blk, in_place](MPI_Request* r) {
    const void* s = in_place ? MPI_IN_PLACE : q->send.data();
    const MPI_Op o = describe(op).handle;
    return r ? MPI_Ireduce_scatter_block(s, q->recv.data(), blk, t.handle, o, c.handle, r)
             : MPI_Reduce_scatter_block(s, q->recv.data(), blk, t.handle, o, c.handle);
  };
  return p;
}

PendingPtr make_reduce_scatter(const Comm& c, const TypeDesc& t, Op op, int base, bool in_place) {
  if (g_no_in_place_reduce_scatter) in_place = false;
  PendingPtr p = new_pending("MPI_Reduce_scatter", "reduce_scatter", c, &t, op, base, -1, in_place);
  const uint64_t salt = ++g_salt;
  p->counts = uneven_counts(base, c.size);
  p->info.counts = join(p->counts);
  size_t total = 0, mine = 0;
  for (int r = 0; r < c.size; ++r) {
    if (r == c.rank) mine = total;
    total += p->counts[r];
  }
  const size_t n = p->counts[c.rank];
  scatter_buffers(*p, c, t, op, total, n, in_place, salt);
  fill_reduced(t, p->want.data(), n, op, c.size, mine, salt);
  Pending* q = p.get();
  p->call = [q, &c, &t, op, in_place](MPI_Request* r) {
    const void* s = in_place ? MPI_IN_PLACE : q->send.data();
    const MPI_Op o = describe(op).handle;
    return r ? MPI_Ireduce_scatter(s, q->recv.data(), q->counts.data(), t.handle, o, c.handle, r)
             : MPI_Reduce_scatter(s, q->recv.data(), q->counts.data(), t.handle, o, c.handle);
  };
  return p;
}

PendingPtr make_bcast(const Comm& c, const TypeDesc& t, int n, int root) {
  PendingPtr p = new_pending("MPI_Bcast", "bcast", c, &t, Op::none, n, root, false);
  const uint64_t salt = ++g_salt;
  p->recv = Buffer(n + kGuard, t.k.size);
  fill_sentinel(t, p->recv, c.rank, salt);
  if (c.rank == root) fill(t, p->recv.data(), n, Op::none, root, 0, salt);
  p->snapshot();
  fill(t, p->want.data(), n, Op::none, root, 0, salt);
  p->check_end = n + kGuard;
  Pending* q = p.get();
  p->call = [q, &c, &t, n, root](MPI_Request* r) {
    return r ? MPI_Ibcast(q->recv.data(), n, t.handle, root, c.handle, r)
             : MPI_Bcast(q->recv.data(), n, t.handle, root, c.handle);
  };
  return p;
}

// In place, the send count and type are ignored by MPI: they are passed as 0 and
// MPI_DATATYPE_NULL.
PendingPtr make_allgather(const Comm& c, const TypeDesc& t, int blk, bool in_place) {
  PendingPtr p = new_pending("MPI_Allgather", "allgather", c, &t, Op::none, blk, -1, in_place);
  const uint64_t salt = ++g_salt;
  const size_t total = static_cast<size_t>(blk) * c.size;
  p->recv = Buffer(total + kGuard, t.k.size);
  fill_sentinel(t, p->recv, c.rank, salt);
  if (in_place) {
    fill(t, p->recv.at(blk * c.rank), blk, Op::none, c.rank, 0, salt);
  } else {
    p->send = Buffer(blk, t.k.size);
    fill(t, p->send.data(), blk, Op::none, c.rank, 0, salt);
  }
  p->snapshot();
  for (int r = 0; r < c.size; ++r) fill(t, p->want.at(blk * r), blk, Op::none, r, 0, salt);
  p->check_end = total + kGuard;
  Pending* q = p.get();
  p->call = [q, &c, &t, blk, in_place](MPI_Request* r) {
    const void* s = in_place ? MPI_IN_PLACE : q->send.data();
    const int sn = in_place ? 0 : static_cast<int>(blk);
    const MPI_Datatype st = in_place ? MPI_DATATYPE_NULL : t.handle;
    return r ? MPI_Iallgather(s, sn, st, q->recv.data(), blk, t.handle, c.handle, r)
             : MPI_Allgather(s, sn, st, q->recv.data(), blk, t.handle, c.handle);
  };
  return p;
}

// Blocks land in reverse rank order with gaps between them; the gaps keep their sentinels.
PendingPtr make_allgatherv(const Comm& c, const TypeDesc& t, int base, bool in_place) {
  PendingPtr p = new_pending("MPI_Allgatherv", "allgatherv", c, &t, Op::none, base, -1, in_place);
  const uint64_t salt = ++g_salt;
  p->counts = uneven_counts(base, c.size);
  p->displs.assign(c.size, 0);
  size_t end = g_allgatherv_one_rank_at_0 && c.size == 1 ? 0 : 1;  // a gap before the first block
  for (int r = c.size - 1; r >= 0; --r) {
    p->displs[r] = static_cast<int>(end);
    end += p->counts[r] + 1 + r % 2;
  }
  p->info.counts = join(p->counts) + " displs=" + join(p->displs);
  p->recv = Buffer(end + kGuard, t.k.size);
  fill_sentinel(t, p->recv, c.rank, salt);
  const size_t n = p->counts[c.rank];
  if (in_place) {
    fill(t, p->recv.at(p->displs[c.rank]), n, Op::none, c.rank, 0, salt);
  } else {
    p->send = Buffer(n, t.k.size);
    fill(t, p->send.data(), n, Op::none, c.rank, 0, salt);
  }
  p->snapshot();
  for (int r = 0; r < c.size; ++r)
    fill(t, p->want.at(p->displs[r]), p->counts[r], Op::none, r, 0, salt);
  p->check_end = end + kGuard;
  Pending* q = p.get();
  p->call = [q, &c, &t, n, in_place](MPI_Request* r) {
    const void* s = in_place ? MPI_IN_PLACE : q->send.data();
    const int sn = in_place ? 0 : static_cast<int>(n);
    const MPI_Datatype st = in_place ? MPI_DATATYPE_NULL : t.handle;
    return r ? MPI_Iallgatherv(s, sn, st, q->recv.data(), q->counts.data(), q->displs.data(),
                               t.handle, c.handle, r)
             : MPI_Allgatherv(s, sn, st, q->recv.data(), q->counts.data(), q->displs.data(),
                              t.handle, c.handle);
  };
  return p;
}

// Rank s sends element k of block d as global element d * blk + k of its input.
PendingPtr make_alltoall(const Comm& c, const TypeDesc& t, int blk, bool in_place) {
  if (g_no_in_place_pairs && t.cls == Cls::pair) in_place = false;
  PendingPtr p = new_pending("MPI_Alltoall", "alltoall", c, &t, Op::none, blk, -1, in_place);
  const uint64_t salt = ++g_salt;
  const size_t total = static_cast<size_t>(blk) * c.size;
  p->recv = Buffer(total + kGuard, t.k.size);
  fill_sentinel(t, p->recv, c.rank, salt);
  if (in_place) {
    fill(t, p->recv.data(), total, Op::none, c.rank, 0, salt);
  } else {
    p->send = Buffer(total, t.k.size);
    fill(t, p->send.data(), total, Op::none, c.rank, 0, salt);
  }
  p->snapshot();
  for (int s = 0; s < c.size; ++s)
    fill(t, p->want.at(blk * s), blk, Op::none, s, static_cast<uint64_t>(blk) * c.rank, salt);
  p->check_end = total + kGuard;
  Pending* q = p.get();
  p->call = [q, &c, &t, blk, in_place](MPI_Request* r) {
    const void* s = in_place ? MPI_IN_PLACE : q->send.data();
    const int sn = in_place ? 0 : static_cast<int>(blk);
    const MPI_Datatype st = in_place ? MPI_DATATYPE_NULL : t.handle;
    return r ? MPI_Ialltoall(s, sn, st, q->recv.data(), blk, t.handle, c.handle, r)
             : MPI_Alltoall(s, sn, st, q->recv.data(), blk, t.handle, c.handle);
  };
  return p;
}

PendingPtr make_barrier(const Comm& c) {
  PendingPtr p = new_pending("MPI_Barrier", "barrier", c, nullptr, Op::none, -1, -1, false);
  ++g_salt;
  p->snapshot();
  p->call = [&c](MPI_Request* r) { return r ? MPI_Ibarrier(c.handle, r) : MPI_Barrier(c.handle); };
  return p;
}

// ------------------------------------------------------------------------- test plans

// Which variants of a call to run: every combination of in place, blocking and root, or
// (for the large count) one combination per call, rotating so that all of them occur.
enum class Variants { all, rotate };

struct Variant {
  bool in_place, nonblocking;
  int root;
};

// `cursor`: the rotation position of one call site, advanced the same way on every rank.
std::vector<Variant> variants(Variants v, int& cursor, const std::vector<int>& roots,
                              bool has_in_place) {
  std::vector<Variant> all;
  for (int root : roots)
    for (int ip = 0; ip < (has_in_place ? 2 : 1); ++ip)
      for (int nb = 0; nb < 2; ++nb) all.push_back(Variant{ip == 1, nb == 1, root});
  if (v == Variants::all) return all;
  return {all[static_cast<size_t>(cursor++) % all.size()]};
}

void run_variant(PendingPtr p, const Variant& v) {
  const Completion how = static_cast<Completion>(g_rotation++ % kNumCompletions);
  run(*p, v.nonblocking, how);
}

std::vector<int> all_roots(const Comm& c) {
  std::vector<int> r;
  for (int i = 0; i < c.size; ++i) r.push_back(i);
  return r;
}

// The reduction family: allreduce and reduce on n elements, reduce_scatter_block and
// reduce_scatter with blocks of `blk` elements per rank.
void test_reductions(const Comm& c, const TypeDesc& t, Op op, int n, int blk, Variants vs,
                     const std::vector<int>& roots) {
  static int cursor[4];
  for (const Variant& v : variants(vs, cursor[0], {-1}, true))
    run_variant(make_allreduce(c, t, op, n, v.in_place), v);
  for (const Variant& v : variants(vs, cursor[1], roots, true))
    run_variant(make_reduce(c, t, op, n, v.root, v.in_place), v);
  for (const Variant& v : variants(vs, cursor[2], {-1}, true))
    run_variant(make_reduce_scatter_block(c, t, op, blk, v.in_place), v);
  for (const Variant& v : variants(vs, cursor[3], {-1}, true))
    run_variant(make_reduce_scatter(c, t, op, blk, v.in_place), v);
}

// The data-movement family: bcast of n elements; allgather, allgatherv and alltoall with
// blocks of `blk` elements per rank.
void test_movement(const Comm& c, const TypeDesc& t, int n, int blk, Variants vs,
                   const std::vector<int>& roots) {
  static int cursor[4];
  for (const Variant& v : variants(vs, cursor[0], roots, false))
    run_variant(make_bcast(c, t, n, v.root), v);
  for (const Variant& v : variants(vs, cursor[1], {-1}, true))
    run_variant(make_allgather(c, t, blk, v.in_place), v);
  for (const Variant& v : variants(vs, cursor[2], {-1}, true))
    run_variant(make_allgatherv(c, t, blk, v.in_place), v);
  for (const Variant& v : variants(vs, cursor[3], {-1}, true))
    run_variant(make_alltoall(c, t, blk, v.in_place), v);
}

// Every datatype x every op it supports x every variant and root, for small counts.
void test_matrix(const Comm& c, const std::vector<const TypeDesc*>& types,
                 const std::vector<int>& counts) {
  for (int n : counts)
    for (const TypeDesc* t : types) {
      for (Op op : ops_for(t->cls)) test_reductions(c, *t, op, n, n, Variants::all, all_roots(c));
      test_movement(c, *t, n, n, Variants::all, all_roots(c));
    }
}

// The large count: every datatype with one op (a different one from type to type), the
// variants rotating over in place or not, blocking or not and roots 0 and last; then every
// op on MPI_INT and MPI_2INT with all those variants. The per-rank blocks of the scatter
// and gather calls hold n / size elements, so that each buffer holds about n.
void test_large(const Comm& c, int n) {
  const std::vector<int> roots = {0, c.size - 1};
  const int blk = n / c.size;
  size_t i = 0;
  for (const TypeDesc& t : all_types()) {
    const std::vector<Op> ops = ops_for(t.cls);
    const Op op = ops[i++ % ops.size()];
    test_reductions(c, t, op, n, blk, Variants::rotate, roots);
    test_movement(c, t, n, blk, Variants::rotate, roots);
  }
  for (const char* name : {"MPI_INT", "MPI_2INT"}) {
    const TypeDesc& t = type_named(name);
    for (Op op : ops_for(t.cls)) test_reductions(c, t, op, n, blk, Variants::all, roots);
  }
}

// MPI lets a buffer that holds no data be a null pointer: every buffer of a call with
// count 0, the receive buffer of a rank whose reduce_scatter block is empty, the send
// buffer of a rank that contributes nothing to allgatherv.
void test_null_buffers(const Comm& c) {
  const TypeDesc& t = type_named("MPI_INT");
  const MPI_Datatype dt = t.handle;
  const MPI_Comm h = c.handle;
  const std::vector<int> zeros(static_cast<size_t>(c.size), 0);
  const int* z = zeros.data();
  struct Entry {
    const char* call;
    const char* stat;
    Op op;
    int root;
    std::function<int(MPI_Request*)> fn;
  };
  const Entry entries[] = {
      {"MPI_Allreduce", "allreduce", Op::sum, -1,
       [&](MPI_Request* r) {
         return r ? MPI_Iallreduce(nullptr, nullptr, 0, dt, MPI_SUM, h, r)
                  : MPI_Allreduce(nullptr, nullptr, 0, dt, MPI_SUM, h);
       }},
      {"MPI_Reduce", "reduce", Op::sum, 0,
       [&](MPI_Request* r) {
         return r ? MPI_Ireduce(nullptr, nullptr, 0, dt, MPI_SUM, 0, h, r)
                  : MPI_Reduce(nullptr, nullptr, 0, dt, MPI_SUM, 0, h);
       }},
      {"MPI_Bcast", "bcast", Op::none, 0,
       [&](MPI_Request* r) {
         return r ? MPI_Ibcast(nullptr, 0, dt, 0, h, r) : MPI_Bcast(nullptr, 0, dt, 0, h);
       }},
      {"MPI_Allgather", "allgather", Op::none, -1,
       [&](MPI_Request* r) {
         return r ? MPI_Iallgather(nullptr, 0, dt, nullptr, 0, dt, h, r)
                  : MPI_Allgather(nullptr, 0, dt, nullptr, 0, dt, h);
       }},
      {"MPI_Allgatherv", "allgatherv", Op::none, -1,
       [&](MPI_Request* r) {
         return r ? MPI_Iallgatherv(nullptr, 0, dt, nullptr, z, z, dt, h, r)
                  : MPI_Allgatherv(nullptr, 0, dt, nullptr, z, z, dt, h);
       }},
      {"MPI_Reduce_scatter_block", "reduce_scatter_block", Op::sum, -1,
       [&](MPI_Request* r) {
         return r ? MPI_Ireduce_scatter_block(nullptr, nullptr, 0, dt, MPI_SUM, h, r)
                  : MPI_Reduce_scatter_block(nullptr, nullptr, 0, dt, MPI_SUM, h);
       }},
      {"MPI_Reduce_scatter", "reduce_scatter", Op::sum, -1,
       [&](MPI_Request* r) {
         return r ? MPI_Ireduce_scatter(nullptr, nullptr, z, dt, MPI_SUM, h, r)
                  : MPI_Reduce_scatter(nullptr, nullptr, z, dt, MPI_SUM, h);
       }},
      {"MPI_Alltoall", "alltoall", Op::none, -1,
       [&](MPI_Request* r) {
         return r ? MPI_Ialltoall(nullptr, 0, dt, nullptr, 0, dt, h, r)
                  : MPI_Alltoall(nullptr, 0, dt, nullptr, 0, dt, h);
       }},
  };
  for (const Entry& e : entries)
    for (bool nb : {false, true}) {
      PendingPtr p = new_pending(e.call, e.stat, c, &t, e.op, 0, e.root, false);
      p->info.counts = "0 (null buffers)";
      p->call = e.fn;
      p->snapshot();
      run(*p, nb, static_cast<Completion>(g_rotation++ % kNumCompletions));
    }

  // Uneven counts give rank 1 an empty block; the other ranks' results are checked as usual.
  for (bool nb : {false, true}) {
    PendingPtr rs = make_reduce_scatter(c, t, Op::sum, 7, false);
    if (rs->counts[c.rank] == 0) {
      Pending* q = rs.get();
      q->info.counts += " (null recvbuf here)";
      q->call = [q, h, dt](MPI_Request* r) {
        return r ? MPI_Ireduce_scatter(q->send.data(), nullptr, q->counts.data(), dt, MPI_SUM, h, r)
                 : MPI_Reduce_scatter(q->send.data(), nullptr, q->counts.data(), dt, MPI_SUM, h);
      };
    }
    run(*rs, nb, static_cast<Completion>(g_rotation++ % kNumCompletions));

    PendingPtr ag = make_allgatherv(c, t, 7, false);
    if (ag->counts[c.rank] == 0) {
      Pending* q = ag.get();
      q->info.counts += " (null sendbuf here)";
      q->call = [q, h, dt](MPI_Request* r) {
        return r ? MPI_Iallgatherv(nullptr, 0, dt, q->recv.data(), q->counts.data(),
                                   q->displs.data(), dt, h, r)
                 : MPI_Allgatherv(nullptr, 0, dt, q->recv.data(), q->counts.data(),
                                  q->displs.data(), dt, h);
      };
    }
    run(*ag, nb, static_cast<Completion>(g_rotation++ % kNumCompletions));
  }
}

// Waiting on a barrier must take as long as the last rank takes to arrive.
void test_barrier_blocks(const Comm& c) {
  constexpr double kDelay = 0.2, kMinWait = 0.1;
  const int late = c.size - 1;
  PendingPtr sync = make_barrier(c);
  run(*sync, false, Completion::wait);
  PendingPtr p = make_barrier(c);
  if (c.rank == late) std::this_thread::sleep_for(std::chrono::duration<double>(kDelay));
  const double t0 = MPI_Wtime();
  run(*p, false, Completion::wait);
  const double waited = MPI_Wtime() - t0;
  if (c.rank != late)
    g_tally.check(waited >= kMinWait, p->info, [&] {
      return "left the barrier after " + std::to_string(waited) + " s while rank " +
             std::to_string(late) + " entered it " + std::to_string(kDelay) + " s late";
    });
}

// MPI_Ibarrier must not complete before every rank has called it: the last rank enters
// only after every other rank has tested its request and found it incomplete. Starting it
// must not wait for the other ranks either: if the others' tokens do not arrive in time,
// the last rank reports that and enters anyway, so a blocking start fails the check
// instead of hanging the run.
void test_ibarrier_waits(const Comm& c) {
  constexpr double kPatience = 5.0;  // seconds
  const int late = c.size - 1, tag = 71;
  PendingPtr p = make_barrier(c);
  p->info.call = nonblocking_name(p->name);
  p->info.how = "MPI_Test, then MPI_Wait";
  if (c.rank != late) {
    const double t0 = MPI_Wtime();
    start(*p, true);
    const double took = MPI_Wtime() - t0;
    g_tally.check(took < kPatience, p->info, [&] {
      return "starting it took " + std::to_string(took) + " s: it waited for comm rank " +
             std::to_string(late);
    });
    if (p->started && took < kPatience) {
      int flag = 0;
      if (check_rc(MPI_Test(&p->req, &flag, MPI_STATUS_IGNORE), p->info, "MPI_Test"))
        g_tally.check(!flag, p->info,
                      [] { return std::string("completed before the last rank entered"); });
    }
    int token = c.rank;
    check_rc(MPI_Send(&token, 1, MPI_INT, late, tag, c.handle), p->info, "MPI_Send");
  } else {
    std::vector<int> tokens(static_cast<size_t>(late), -1);
    std::vector<MPI_Request> recvs(static_cast<size_t>(late), MPI_REQUEST_NULL);
    for (int r = 0; r < late; ++r)
      check_rc(MPI_Irecv(&tokens[r], 1, MPI_INT, r, tag, c.handle, &recvs[r]), p->info,
               "MPI_Irecv");
    int arrived = 0;
    const double t0 = MPI_Wtime();
    while (!arrived && MPI_Wtime() - t0 < kPatience) {
      if (!check_rc(MPI_Testall(late, recvs.data(), &arrived, MPI_STATUSES_IGNORE), p->info,
                    "MPI_Testall"))
        break;
      if (!arrived) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    g_tally.check(arrived, p->info, [&] {
      return "after " + std::to_string(kPatience) + " s the other ranks still had not returned " +
             "from starting MPI_Ibarrier, which must not wait for comm rank " +
             std::to_string(late);
    });
    start(*p, true);
    if (!arrived)
      check_rc(MPI_Waitall(late, recvs.data(), MPI_STATUSES_IGNORE), p->info, "MPI_Waitall");
    for (int r = 0; r < late; ++r)
      g_tally.check(tokens[r] == r, p->info, [&] {
        return "token " + std::to_string(tokens[r]) + " from rank " + std::to_string(r);
      });
  }
  if (!p->started) return;
  check_rc(MPI_Wait(&p->req, MPI_STATUS_IGNORE), p->info, "MPI_Wait");
  g_tally.check(p->req == MPI_REQUEST_NULL, p->info,
                [] { return std::string("request not freed by MPI_Wait"); });
}

// A ring exchange in flight alongside the collectives: receive from the left neighbour.
struct RingTransfer {
  const Comm* comm;
  int tag;
  std::vector<int> out, in;
  CallInfo info;

  RingTransfer(const Comm& c, int tag_, size_t n, uint64_t salt)
      : comm(&c), tag(tag_), out(n), in(n, -1) {
    for (size_t k = 0; k < n; ++k) out[k] = input<int>(Op::none, c.rank, k, salt);
    info.call = "MPI_Isend/MPI_Irecv";
    info.comm = &c;
    info.count = static_cast<long>(n);
  }
  int right() const { return (comm->rank + 1) % comm->size; }
  int left() const { return (comm->rank + comm->size - 1) % comm->size; }
  void verify(uint64_t salt) {
    for (size_t k = 0; k < in.size(); ++k) {
      const int want = input<int>(Op::none, left(), k, salt);
      if (in[k] != want) {
        g_tally.fail(info, "element " + std::to_string(k) + " from rank " + std::to_string(left()) +
                               ": expected " + std::to_string(want) + ", got " +
                               std::to_string(in[k]));
        return;
      }
    }
    g_tally.pass();
  }
};

// Several collectives in flight at once, on all three communicators and twice on the same
// one, mixed with point-to-point requests, completed together in one request array.
void test_mixed(const Comm& world, const Comm& dup, const Comm& split) {
  for (int m = 0; m < kNumCompletions; ++m) {
    const Completion how = static_cast<Completion>(m);
    const uint64_t salt = ++g_salt;
    RingTransfer ring_world(world, 100 + m, 1000, salt), ring_dup(dup, 200 + m, 7, salt);
    std::vector<MPI_Request> reqs;
    std::vector<PendingPtr> colls;
    CallInfo all;
    all.call = "mixed request array";
    all.how = describe(how);
    all.comm = &world;

    auto issue = [&](PendingPtr p) {
      p->info.how = std::string(describe(how)) + ", mixed array";
      start(*p, true);
      if (p->started) reqs.push_back(p->req);
      colls.push_back(std::move(p));
    };
    auto post_recv = [&](RingTransfer& t) {
      reqs.emplace_back();
      const int rc = MPI_Irecv(t.in.data(), static_cast<int>(t.in.size()), MPI_INT, t.left(), t.tag,
                               t.comm->handle, &reqs.back());
      if (!check_rc(rc, t.info, "MPI_Irecv")) reqs.pop_back();
    };
    auto post_send = [&](RingTransfer& t) {
      reqs.emplace_back();
      const int rc = MPI_Isend(t.out.data(), static_cast<int>(t.out.size()), MPI_INT, t.right(),
                               t.tag, t.comm->handle, &reqs.back());
      if (!check_rc(rc, t.info, "MPI_Isend")) reqs.pop_back();
    };

    const long long before = g_intercept.active() ? g_intercept.calls(nullptr) : 0;
    const int last = world.size - 1;
    post_recv(ring_world);
    issue(make_allreduce(world, type_named("MPI_INT"), Op::sum, 1000, false));
    issue(make_bcast(dup, type_named("MPI_DOUBLE"), 7, dup.size - 1));
    issue(make_allgatherv(split, type_named("MPI_C_DOUBLE_COMPLEX"), 7, m % 2 == 0));
    post_send(ring_world);
    issue(make_reduce(world, type_named("MPI_2INT"), Op::maxloc, 7, m % world.size, m % 2 == 1));
    post_recv(ring_dup);
    issue(make_alltoall(dup, type_named("MPI_UINT16_T"), 7, m % 2 == 0));
    issue(make_barrier(split));
    issue(make_reduce_scatter(world, type_named("MPI_FLOAT"), Op::sum, 7, m % 2 == 1));
    issue(make_allreduce(world, type_named("MPI_LONG"), Op::bxor, 1000, true));
    post_send(ring_dup);
    issue(make_reduce_scatter_block(dup, type_named("MPI_C_BOOL"), Op::lor, 7, false));
    issue(make_allgather(split, type_named("MPI_DOUBLE"), 7, true));
    issue(make_reduce(split, type_named("MPI_LONG_DOUBLE"), Op::prod, 7, split.size - 1, false));
    issue(make_barrier(world));
    issue(make_reduce(dup, type_named("MPI_INT64_T"), Op::min, 1000, last, false));

    complete(reqs, how, all);
    for (PendingPtr& p : colls) verify(*p);
    ring_world.verify(salt);
    ring_dup.verify(salt);
    if (g_intercept.active()) {  // completing requests and point-to-point count nothing
      const long long after = g_intercept.calls(nullptr);
      const long long issued = static_cast<long long>(colls.size());
      g_tally.check(after - before == issued, all, [&] {
        return "streamcoll_get_stats(all) went up by " + std::to_string(after - before) + " over " +
               std::to_string(issued) + " collective calls";
      });
    }
  }
}

// ------------------------------------------------------------------------------ main

// The pair and complex C layouts must match MPI's: size and extent of each datatype.
void check_layouts() {
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

void find_streamcoll() {
  const char* env = std::getenv("STREAMCOLL_EXPECT_INTERCEPT");
  g_intercept.expected = env && std::strcmp(env, "1") == 0;
  g_intercept.get = reinterpret_cast<GetStats>(dlsym(RTLD_DEFAULT, "streamcoll_get_stats"));
  if (!g_intercept.expected) return;
  CallInfo info;
  info.call = "dlsym(streamcoll_get_stats)";
  info.how = "STREAMCOLL_EXPECT_INTERCEPT=1";
  g_tally.check(g_intercept.get != nullptr, info, [] {
    return std::string("streamcoll is not loaded in this process (no streamcoll_get_stats)");
  });
  if (g_intercept.active()) g_intercept.baseline = g_intercept.calls(nullptr);
}

// Over the whole run, streamcoll must have counted exactly the collective calls made: none
// for communicator management, request completion or point-to-point calls.
void check_total_count() {
  if (!g_intercept.active()) return;
  CallInfo info;
  info.call = "whole run";
  info.how = "streamcoll_get_stats(all)";
  const long long counted = g_intercept.calls(nullptr) - g_intercept.baseline;
  g_tally.check(counted == g_intercept.calls_made, info, [&] {
    return "counted " + std::to_string(counted) + " calls, this rank made " +
           std::to_string(g_intercept.calls_made);
  });
}

// The pass and fail counts of all ranks, by point-to-point messages to rank 0 (no
// collective, so the verdict does not depend on what is being tested). Returns whether
// any rank failed, on every rank.
bool report(const Comm& world, double seconds) {
  constexpr int kTag = 9001;
  long long mine[2] = {g_tally.passed(), g_tally.failed()};
  int any_failed = 0;
  if (world.rank == 0) {
    long long sum[2] = {mine[0], mine[1]};
    for (int r = 1; r < world.size; ++r) {
      long long theirs[2] = {0, 1};
      if (MPI_Recv(theirs, 2, MPI_LONG_LONG, r, kTag, world.handle, MPI_STATUS_IGNORE) !=
          MPI_SUCCESS)
        theirs[1] += 1;
      sum[0] += theirs[0];
      sum[1] += theirs[1];
    }
    any_failed = sum[1] != 0;
    std::printf("%lld passed, %lld failed\n", sum[0], sum[1]);
    std::fflush(stdout);
    std::string phases;
    for (size_t i = 0; i + 1 < g_phases.size(); ++i) {
      char part[64];
      std::snprintf(part, sizeof part, "%s%s %.1f s", i ? ", " : "", g_phases[i].first,
                    g_phases[i + 1].second - g_phases[i].second);
      phases += part;
    }
    std::fprintf(stderr, "collectives_check: %d ranks, %.1f s (%s)\n", world.size, seconds,
                 phases.c_str());
    for (int r = 1; r < world.size; ++r)
      if (MPI_Send(&any_failed, 1, MPI_INT, r, kTag, world.handle) != MPI_SUCCESS) any_failed = 1;
  } else {
    if (MPI_Send(mine, 2, MPI_LONG_LONG, 0, kTag, world.handle) != MPI_SUCCESS ||
        MPI_Recv(&any_failed, 1, MPI_INT, 0, kTag, world.handle, MPI_STATUS_IGNORE) != MPI_SUCCESS)
      any_failed = 1;
  }
  return any_failed != 0 || g_tally.failed() != 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (MPI_Init(&argc, &argv) != MPI_SUCCESS) {
    std::fprintf(stderr, "collectives_check: MPI_Init failed\n");
    return 1;
  }
  const double t0 = MPI_Wtime();
  Comm world{MPI_COMM_WORLD, "world", 0, 1};
  CallInfo setup;
  setup.call = "setup";
  setup.how = "-";
  setup.comm = &world;
  // The default handler aborts, so a failure here ends the job with MPI's own message.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  check_rc(MPI_Comm_rank(MPI_COMM_WORLD, &world.rank), setup, "MPI_Comm_rank");
  check_rc(MPI_Comm_size(MPI_COMM_WORLD, &world.size), setup, "MPI_Comm_size");
  g_tally.init(world.rank);
  find_streamcoll();
  find_mpi_defects();
  if (world.rank == 0) {
    // One line per defect: the types it narrows (MAX and MIN alike).
    std::vector<std::string> whys, types;
    for (const MpiDefect& d : g_defects) {
      size_t i = 0;
      while (i < whys.size() && whys[i] != d.why) ++i;
      if (i == whys.size()) whys.push_back(d.why), types.emplace_back();
      if (types[i].find(d.type) == std::string::npos) types[i] += (types[i].empty() ? "" : " ") + std::string(d.type);
    }
    for (size_t i = 0; i < whys.size(); ++i)
      std::fprintf(stderr, "collectives_check: note: MAX and MIN of %s get inputs in [0, 100] only: %s\n",
                   types[i].c_str(), whys[i].c_str());
    if (g_no_in_place_reduce_off_rank0)
      std::fprintf(stderr, "collectives_check: note: MPI_Reduce at roots other than 0 is not run in "
                           "place (MPICH 4.0/4.1 crash on it: pmodels/mpich#6540)\n");
    if (g_no_in_place_pairs)
      std::fprintf(stderr, "collectives_check: note: MPI_Alltoall of the pair types is not run "
                           "in place (MPICH 4.0 truncates or misplaces them)\n");
    if (g_no_in_place_reduce_scatter)
      std::fprintf(stderr, "collectives_check: note: MPI_Reduce_scatter is not run in place "
                           "(MPICH 4.0 stops on an internal assertion)\n");
    if (g_allgatherv_one_rank_at_0)
      std::fprintf(stderr, "collectives_check: note: MPI_Allgatherv on one rank puts its block at "
                           "displacement 0 (MPICH 4.0 ignores displs there: pmodels/mpich#6374)\n");
  }
  check_layouts();

  // A duplicate of world, and the ranks of each parity in reverse order.
  Comm dup{MPI_COMM_NULL, "dup(world)", 0, 1};
  Comm split{MPI_COMM_NULL, world.rank % 2 ? "split(odd, reversed)" : "split(even, reversed)", 0,
             1};
  const bool ok =
      check_rc(MPI_Comm_dup(MPI_COMM_WORLD, &dup.handle), setup, "MPI_Comm_dup") &&
      check_rc(MPI_Comm_split(MPI_COMM_WORLD, world.rank % 2, -world.rank, &split.handle), setup,
               "MPI_Comm_split") &&
      check_rc(MPI_Comm_rank(dup.handle, &dup.rank), setup, "MPI_Comm_rank(dup)") &&
      check_rc(MPI_Comm_size(dup.handle, &dup.size), setup, "MPI_Comm_size(dup)") &&
      check_rc(MPI_Comm_rank(split.handle, &split.rank), setup, "MPI_Comm_rank(split)") &&
      check_rc(MPI_Comm_size(split.handle, &split.size), setup, "MPI_Comm_size(split)");
  if (ok) {
    std::vector<const TypeDesc*> every, some;
    for (const TypeDesc& t : all_types()) every.push_back(&t);
    for (const char* name : {"MPI_INT", "MPI_UINT8_T", "MPI_DOUBLE", "MPI_C_DOUBLE_COMPLEX",
                             "MPI_C_BOOL", "MPI_2INT", "MPI_LONG_DOUBLE_INT"})
      some.push_back(&type_named(name));

    begin_phase("world matrix");
    test_matrix(world, every, {0, 1, 7, 1000});
    begin_phase("1 Mi");
    test_large(world, 1 << 20);
    begin_phase("dup");
    test_matrix(dup, some, {0, 7, 1000});
    begin_phase("split");
    test_matrix(split, some, {0, 1, 7});
    begin_phase("mixed requests");
    test_mixed(world, dup, split);
    begin_phase("null buffers");
    test_null_buffers(world);
    test_null_buffers(split);
    begin_phase("barriers");
    for (const Comm* c : {&world, &dup, &split}) {
      test_barrier_blocks(*c);
      test_ibarrier_waits(*c);
    }
    check_rc(MPI_Comm_free(&split.handle), setup, "MPI_Comm_free(split)");
    check_rc(MPI_Comm_free(&dup.handle), setup, "MPI_Comm_free(dup)");
  }
  begin_phase("end");
  check_total_count();

  bool failed = report(world, MPI_Wtime() - t0);
  if (MPI_Finalize() != MPI_SUCCESS) {
    std::fprintf(stderr, "collectives_check: rank %d: MPI_Finalize failed\n", world.rank);
    failed = true;
  }
  return failed ? 1 : 0;
}
