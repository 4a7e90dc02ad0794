// Route blueconnect on GPU buffers (algorithms/blueconnect_gpu.cpp, run_gpu) end to end without
// a GPU: real MPI processes, streamcoll preloaded, the fake CUDA driver (libcuda.so.1 from
// fake_cuda.cpp, through LD_LIBRARY_PATH) and the fake NCCL (STREAMCOLL_NCCL_LIB), as in
// nccl_route.cpp, whose harness this follows. Each stage of a call is route nccl's
// reduce-scatter or all-gather on one level's sub-communicator, all on one stream.
//
//   bc_route MODE        (run under tests/mpi/run.sh preload; tests/fake/meson.build)
//   route   hierarchies forced per communicator (streamcoll_comm_set_route(dup,
//           "*:blueconnect:hierarchy=H:backend=nccl")), several routed communicators in
//           one run. 1 rank: 1 and 1x1 (one stage of one rank). 4 ranks: 2x2 and 4 on
//           duplicates of MPI_COMM_WORLD, 2x2 on a split with reversed keys (its rank r is
//           world rank p-1-r). 8 ranks: 2x2x2, 2x4, 4x2, 2x2x2 reversed, and two halves of
//           4 ranks (reversed keys) with 2x2, side by side. Multi-level hierarchies put the
//           blocks in tree order (blueconnect_plan.hpp), a permutation of rank order.
//           On each: the type x op grid (float, double, int, int32, int64, long, uint8,
//           int8, unsigned, uint64 x SUM, PROD, MIN, MAX) on MPI_Allreduce and
//           MPI_Reduce_scatter_block; then those two and MPI_Allgather at counts 1, 7, p,
//           1000, 4099 (not divisible by p: padded in scratch), in place and not, classic
//           (also with the input written on the legacy stream), attached stream, attached
//           legacy stream (0), types and ops rotating. Then: the communicators
//           interleaved; three calls on two communicators chained on one stream with no
//           synchronisation between them; MPI_Comm_free with work still pending; count 0
//           and a hierarchy spelt with factors 1; calls blueconnect must leave to pmpi
//           (MPI_I* forms, MPI_SHORT, host buffers, a hierarchy whose product is not the
//           size, backend mpi, host stages with a stream) and host stages it carries
//           (backends sched and nccl/sched, classic); a communicator whose first call is an
//           MPI_Allgather (the GPU set-up happens at whichever call comes first).
//   shared  as route (but the stream pipeline), with ranks sharing GPUs
//           (FAKE_CUDA_BUS_ID=same, or mod:2 where some levels' groups have distinct GPUs
//           and others not): route nccl declines a level, so blueconnect declines every
//           call of a rule with a level on NCCL and pmpi carries it, right, with no NCCL
//           operation run (backend=sched, host stages alone, it still carries).
//   env     STREAMCOLL_ROUTE (allreduce, reduce_scatter_block, allgather on blueconnect,
//           backend=nccl) on MPI_COMM_WORLD itself, 4 ranks, with MPI_Bcast on route nccl
//           (the default table) between them; the hierarchy from the rule's hierarchy=,
//           else STREAMCOLL_HIERARCHY, else discovered (its level count learnt from a
//           first call: one level of 4 on one node without NUMA levels).
//
// For every call: MPI_SUCCESS; counted on the expected route and memory "device"
// (streamcoll_get_stats); for blueconnect, one NCCL reduce-scatter per level and
// reduce-scatter stage, one all-gather per level and all-gather stage (but an allreduce's
// outermost level on NCCL: one NCCL allreduce of its segment, no other NCCL allreduce),
// and no call counted on route nccl (stages are not calls of their own); with a stream
// attached, no host wait (no cuStreamSynchronize, cuStreamQuery, cuEventQuery,
// cuEventSynchronize) and, with FAKE_CUDA_DEFER=1, work still pending on the stream after
// the call; the scratch memory given back once the stream ran; the results (and the
// untouched send buffers) against values computed here; no race seen by the fake driver
// (the host reads results only after it has seen the work complete). After freeing the
// communicators streamcoll's streams, events and contexts are back to what they were;
// after MPI_Finalize nothing of the driver's is left. Prints "N passed, N failed" on
// rank 0; exits nonzero on failure.
#include <dlfcn.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "fake_api.h"
#include "harness.hpp"
#include "streamcoll/streamcoll.h"
#include "streamcoll/streamext.h"

namespace {

bool g_defer = false;
bool g_shared = false;  // mode shared: ranks share GPUs, NCCL declines, blueconnect too

// ---- buffers ---------------------------------------------------------------------------------

// Fake device memory (or host memory), freed at scope end.
class Buf {
 public:
  explicit Buf(size_t bytes, bool host = false) : host_(host) {
    if (bytes == 0) return;
    p_ = host ? std::malloc(bytes) : api.malloc(bytes);
    if (!p_) MPI_Abort(MPI_COMM_WORLD, 2);
  }
  ~Buf() {
    if (p_) host_ ? std::free(p_) : api.free(p_);
  }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  void* get() const { return p_; }

 private:
  void* p_ = nullptr;
  bool host_ = false;
};

std::vector<char> garbage(size_t bytes) {
  std::vector<char> g(bytes);
  for (size_t i = 0; i < bytes; ++i) g[i] = static_cast<char>(0xA5 ^ (i * 29));
  return g;
}

// Receive buffers are kTail bytes longer than the call's result, and the call must leave
// those bytes (and, in place, the input it does not overwrite with the result) as they were.
constexpr size_t kTail = 64;

// `front` written over the start of `back`.
std::vector<char> over(const std::vector<char>& front, std::vector<char> back) {
  std::copy(front.begin(), front.begin() + static_cast<long>(std::min(front.size(), back.size())),
            back.begin());
  return back;
}

// ---- one call ------------------------------------------------------------------------------

enum StreamMode { classic, own_stream, legacy_stream };
const char* const kStreamNames[] = {"classic", "attached stream", "attached legacy stream"};

struct Variant {
  StreamMode s = classic;
  bool in_place = false;
  bool legacy_input = false;  // classic: the input written on the legacy stream, unsynchronised
  bool nb = false;            // MPI_I* + MPI_Wait
};
std::string describe(const Variant& v) {
  std::string s = kStreamNames[v.s];
  if (v.in_place) s += ", in place";
  if (v.legacy_input) s += ", input on the legacy stream";
  if (v.nb) s += ", MPI_I* + MPI_Wait";
  return s;
}

struct Io {
  void* dev;
  bool host;
  std::vector<char> in;      // written before the call (empty: not written)
  std::vector<char> expect;  // compared after the call, as a prefix (empty: not read)
};

// A routed communicator.
struct Comm {
  MPI_Comm comm = MPI_COMM_NULL;
  std::string name;  // for messages
  int levels = 0;    // of its hierarchy (factors > 1)
  int nccl_levels = -1;  // levels whose stages run on NCCL (-1: all of them)
  bool top_nccl = true;  // the outermost level runs on NCCL (an allreduce's: one allreduce)
  bool nccl_pairs_only = false;  // NCCL on level 0 alone, a level of 2 ranks (r, r^1)
};

struct Call {
  std::string label;
  std::string coll;  // statistics name of the blocking form
  const Comm* c = nullptr;
  Variant v;
  const char* route = "blueconnect";
  std::vector<Io> io;
  std::function<int(MPI_Request*)> issue;
};

streamcoll_stream_t g_stream = nullptr;

void run(Call& s) {
  // Shared GPUs: NCCL declines, and with it every rule with a level on NCCL (host stages
  // alone, backend=sched, need no NCCL: blueconnect still carries those).
  // FAKE_CUDA_BUS_ID=mod:2: ranks r and r^1 (a level-0 group of 2) have distinct GPUs.
  const char* bus = std::getenv("FAKE_CUDA_BUS_ID");
  const bool mod2 = bus && std::string(bus) == "mod:2";
  if (g_shared && s.c->nccl_levels != 0 && !(mod2 && s.c->nccl_pairs_only)) {
    if (std::strcmp(s.route, "blueconnect") == 0) s.route = "pmpi";
    s.v.legacy_input = false;  // the real MPI does not order itself after the legacy stream
  }
  const Variant& v = s.v;
  const std::string L = s.label + " on " + s.c->name + " [" + describe(v) + "]";
  const bool bc = std::strcmp(s.route, "blueconnect") == 0;
  const bool host = !s.io.empty() && s.io[0].host;
  streamcoll_stream_t stream = v.s == own_stream ? g_stream : nullptr;
  MPI_Comm comm = s.c->comm;

  for (Io& io : s.io) {
    if (io.in.empty()) continue;
    if (v.s != classic && !io.host)
      check(api.enqueue_copy(stream, io.dev, io.in.data(), io.in.size()) == 0, L + ": copy on the stream");
    else if (v.legacy_input)
      check(api.enqueue_copy(nullptr, io.dev, io.in.data(), io.in.size()) == 0, L + ": copy on the legacy stream");
    else {
      if (!io.host) check(api.host_access(io.dev, io.in.size(), 1) == 0, L + ": host write without a race");
      std::memcpy(io.dev, io.in.data(), io.in.size());
    }
  }
  if (v.s != classic) check(streamcoll_comm_attach_stream(comm, stream) == MPI_SUCCESS, L + ": attach");

  const std::string name = (v.nb ? "i" : "") + s.coll;
  const char* mem = host ? "host" : "device";
  const unsigned long long route0 = stat_calls(name.c_str(), s.route, mem);
  const unsigned long long all0 = stat_calls(name.c_str(), nullptr, nullptr);
  const unsigned long long bc0 = stat_calls(nullptr, "blueconnect", nullptr);
  const unsigned long long nccl0 = stat_calls(nullptr, "nccl", nullptr);
  const unsigned long long rs0 = nc("ncclReduceScatter"), ag0 = nc("ncclAllGather"),
                           ar0 = nc("ncclAllReduce");
  const unsigned long long sync0 = api.sync_count();
  const unsigned long long wait0 = cu("cuStreamQuery") + cu("cuEventQuery") + cu("cuEventSynchronize") + sync0;
  const PendingLook pending0 = look_pending(stream);

  MPI_Request req = MPI_REQUEST_NULL;
  const int rc = s.issue(v.nb ? &req : nullptr);
  check(rc == MPI_SUCCESS, L + ": returns MPI_SUCCESS (got " + std::to_string(rc) + ")");
  check(stat_calls(name.c_str(), s.route, mem) == route0 + 1 &&
            stat_calls(name.c_str(), nullptr, nullptr) == all0 + 1,
        L + ": counted as " + name + " on route " + s.route + ", " + mem + " memory");
  if (!bc) check(stat_calls(nullptr, "blueconnect", nullptr) == bc0, L + ": not on blueconnect");
  if (bc && v.s != classic) {
    check(cu("cuStreamQuery") + cu("cuEventQuery") + cu("cuEventSynchronize") + api.sync_count() == wait0,
          L + ": stream semantics: returned without the host waiting");
    if (g_defer) check(more_pending(pending0), L + ": stream semantics: enqueued, not yet run");
  }
  if (v.nb) check(MPI_Wait(&req, MPI_STATUS_IGNORE) == MPI_SUCCESS, L + ": MPI_Wait");
  if (bc) {
    const unsigned long long lv =
        static_cast<unsigned long long>(s.c->nccl_levels < 0 ? s.c->levels : s.c->nccl_levels);
    // An allreduce whose outermost level is on NCCL: that level's two stages are one
    // NCCL allreduce of the segment.
    const unsigned long long ar = s.coll == "allreduce" && s.c->top_nccl && lv > 0 ? 1 : 0;
    const unsigned long long rs = s.coll == "allgather" ? 0 : lv - ar, ag = s.coll == "reduce_scatter_block" ? 0 : lv - ar;
    check(nc("ncclReduceScatter") - rs0 == rs && nc("ncclAllGather") - ag0 == ag &&
              nc("ncclAllReduce") - ar0 == ar,
          L + ": stages: " + std::to_string(rs) + " NCCL reduce-scatters and " + std::to_string(ag) +
              " all-gathers and " + std::to_string(ar) + " allreduces (got " + std::to_string(nc("ncclReduceScatter") - rs0) + " and " +
              std::to_string(nc("ncclAllGather") - ag0) + ", " +
              std::to_string(nc("ncclAllReduce") - ar0) + " allreduces)");
    check(stat_calls(nullptr, "nccl", nullptr) == nccl0, L + ": stages not counted as calls on route nccl");
  }
  if (v.s != classic) {
    check(api.stream_sync(stream) == 0, L + ": synchronise the stream");
    check(streamcoll_comm_detach_stream(comm) == MPI_SUCCESS, L + ": detach");
  }
  if (bc) check(cu("live_async_allocs") == 0, L + ": the scratch memory is given back");
  for (size_t i = 0; i < s.io.size(); ++i) {
    const Io& io = s.io[i];
    if (io.expect.empty()) continue;
    if (!io.host)
      check(api.host_access(io.dev, io.expect.size(), 0) == 0, L + ": the host has seen the result complete");
    const char* got = static_cast<const char*>(io.dev);
    size_t bad = 0;
    while (bad < io.expect.size() && got[bad] == io.expect[bad]) ++bad;
    check(bad == io.expect.size(),
          L + ": buffer " + std::to_string(i) + " correct" +
              (bad < io.expect.size()
                   ? " (first wrong byte " + std::to_string(bad) + " of " + std::to_string(io.expect.size()) + ")"
                   : std::string()));
  }
  if (!bc && !host && v.s != classic)
    check(api.sync_count() > sync0, L + ": off blueconnect with a stream: the stream synchronised first");
}

// ---- datatypes, ops, reference values ----------------------------------------------------

const std::vector<TypeCase>& types() {
  static const std::vector<TypeCase> t = {
      {"MPI_FLOAT", MPI_FLOAT, Tag::flt},     {"MPI_DOUBLE", MPI_DOUBLE, Tag::dbl},
      {"MPI_INT", MPI_INT, Tag::int_},        {"MPI_INT32_T", MPI_INT32_T, Tag::i32},
      {"MPI_INT64_T", MPI_INT64_T, Tag::i64}, {"MPI_LONG", MPI_LONG, Tag::lng},
      {"MPI_UINT8_T", MPI_UINT8_T, Tag::u8},  {"MPI_INT8_T", MPI_INT8_T, Tag::i8},
      {"MPI_UNSIGNED", MPI_UNSIGNED, Tag::uns}, {"MPI_UINT64_T", MPI_UINT64_T, Tag::u64}};
  return t;
}

const OpCase kOps[] = {{"MPI_SUM", MPI_SUM, Op::sum}, {"MPI_PROD", MPI_PROD, Op::prod},
                       {"MPI_MIN", MPI_MIN, Op::min}, {"MPI_MAX", MPI_MAX, Op::max}};

std::string what(const char* coll, const char* type, const char* op, size_t count) {
  return std::string(coll) + " " + type + (op ? std::string(" ") + op : std::string()) + " count " +
         std::to_string(count);
}

// ---- the collectives ----------------------------------------------------------------------

template <class T>
void allreduce(const Comm& c, const TypeCase& t, const OpCase& op, size_t count, const Variant& v,
               unsigned salt, const char* route = "blueconnect", bool host = false) {
  const int me = comm_rank(c.comm), p = comm_size(c.comm);
  const size_t bytes = count * sizeof(T);
  auto in = bytes_of(inputs<T>(me, count, op.kind, salt));
  auto ref = bytes_of(reduced<T>(p, count, op.kind, salt));
  Buf send(v.in_place ? 0 : bytes, host), recv(bytes + kTail, host);
  const auto g = garbage(bytes + kTail);
  std::memcpy(recv.get(), g.data(), g.size());
  Call s;
  s.label = what("MPI_Allreduce", t.name, op.name, count);
  s.coll = "allreduce";
  s.c = &c;
  s.v = v;
  s.route = route;
  if (v.in_place) s.io = {{recv.get(), host, in, over(ref, g)}};
  else s.io = {{send.get(), host, in, in}, {recv.get(), host, {}, over(ref, g)}};
  const void* sb = v.in_place ? MPI_IN_PLACE : send.get();
  void* rb = recv.get();
  s.issue = [&](MPI_Request* r) {
    return r ? MPI_Iallreduce(sb, rb, static_cast<int>(count), t.type, op.op, c.comm, r)
             : MPI_Allreduce(sb, rb, static_cast<int>(count), t.type, op.op, c.comm);
  };
  run(s);
}

template <class T>
void reduce_scatter_block(const Comm& c, const TypeCase& t, const OpCase& op, size_t count,
                          const Variant& v, unsigned salt, const char* route = "blueconnect") {
  const int me = comm_rank(c.comm), p = comm_size(c.comm);
  const size_t total = count * static_cast<size_t>(p);
  auto in = bytes_of(inputs<T>(me, total, op.kind, salt));
  auto all = reduced<T>(p, total, op.kind, salt);
  auto ref = bytes_of(std::vector<T>(all.begin() + static_cast<long>(me * count),
                                     all.begin() + static_cast<long>((me + 1) * count)));
  const size_t rbytes = (v.in_place ? total : count) * sizeof(T) + kTail;
  Buf send(v.in_place ? 0 : total * sizeof(T)), recv(rbytes);
  const auto g = garbage(rbytes);
  std::memcpy(recv.get(), g.data(), rbytes);
  Call s;
  s.label = what("MPI_Reduce_scatter_block", t.name, op.name, count);
  s.coll = "reduce_scatter_block";
  s.c = &c;
  s.v = v;
  s.route = route;
  // In place the result is the first block; the other blocks keep their input.
  if (v.in_place) s.io = {{recv.get(), false, in, over(ref, over(in, g))}};
  else s.io = {{send.get(), false, in, in}, {recv.get(), false, {}, over(ref, g)}};
  const void* sb = v.in_place ? MPI_IN_PLACE : send.get();
  void* rb = recv.get();
  s.issue = [&](MPI_Request* r) {
    return r ? MPI_Ireduce_scatter_block(sb, rb, static_cast<int>(count), t.type, op.op, c.comm, r)
             : MPI_Reduce_scatter_block(sb, rb, static_cast<int>(count), t.type, op.op, c.comm);
  };
  run(s);
}

void allgather(const Comm& c, const TypeCase& t, size_t count, const Variant& v, unsigned salt,
               const char* route = "blueconnect") {
  const int me = comm_rank(c.comm), p = comm_size(c.comm);
  int ts = 0;
  MPI_Type_size(t.type, &ts);
  const size_t block = count * static_cast<size_t>(ts);
  auto mine = pattern(me, 0, block, salt);
  std::vector<char> all;
  for (int r = 0; r < p; ++r) {
    auto b = pattern(r, 0, block, salt);
    all.insert(all.end(), b.begin(), b.end());
  }
  Buf send(v.in_place ? 0 : block), recv(block * p + kTail);
  const auto g = garbage(block * p + kTail);
  std::memcpy(recv.get(), g.data(), g.size());
  Call s;
  s.label = what("MPI_Allgather", t.name, nullptr, count);
  s.coll = "allgather";
  s.c = &c;
  s.v = v;
  s.route = route;
  if (v.in_place) {
    auto in = garbage(block * p);  // the rank's own block in place, the rest anything
    std::memcpy(in.data() + me * block, mine.data(), block);
    s.io = {{recv.get(), false, in, over(all, g)}};
  } else {
    s.io = {{send.get(), false, mine, mine}, {recv.get(), false, {}, over(all, g)}};
  }
  const void* sb = v.in_place ? MPI_IN_PLACE : send.get();
  void* rb = recv.get();
  const int n = static_cast<int>(count);
  s.issue = [&](MPI_Request* r) {
    return r ? MPI_Iallgather(sb, n, t.type, rb, n, t.type, c.comm, r)
             : MPI_Allgather(sb, n, t.type, rb, n, t.type, c.comm);
  };
  run(s);
}

// ---- communicators and test groups --------------------------------------------------------

int levels_of(const std::string& h) {
  int n = 0;
  size_t start = 0;
  for (size_t i = 0; i <= h.size(); ++i)
    if (i == h.size() || h[i] == 'x') {
      n += std::atoi(h.substr(start, i - start).c_str()) > 1;
      start = i + 1;
    }
  return std::max(n, 1);  // all factors 1: one level of 1 (core/topology.cpp, drop_ones)
}

// A duplicate of `base` (consumed: freed if not MPI_COMM_WORLD) routed to blueconnect.
Comm routed(MPI_Comm base, const std::string& name, const std::string& hier,
            const std::string& backend = "nccl") {
  Comm c;
  MPI_Comm_dup(base, &c.comm);
  if (base != MPI_COMM_WORLD) MPI_Comm_free(&base);
  MPI_Comm_set_errhandler(c.comm, MPI_ERRORS_RETURN);
  c.name = name + " (" + hier + ")";
  c.levels = levels_of(hier);
  if (backend != "nccl") {  // one backend per level, or one for all
    int n = 0, items = 0;
    size_t start = 0;
    for (size_t i = 0; i <= backend.size(); ++i)
      if (i == backend.size() || backend[i] == '/') {
        ++items;
        n += backend.substr(start, i - start) == "nccl";
        start = i + 1;
      }
    c.nccl_levels = items == 1 ? (n ? c.levels : 0) : n;
    const size_t last = backend.rfind('/');
    c.top_nccl = backend.substr(last == std::string::npos ? 0 : last + 1) == "nccl";
    c.nccl_pairs_only = items > 1 && n == 1 && backend.compare(0, 5, "nccl/") == 0 &&
                        hier.compare(0, 2, "2x") == 0;
  }
  const std::string spec = "*:blueconnect:hierarchy=" + hier + ":backend=" + backend;
  check(api.set_route(c.comm, spec.c_str()) == MPI_SUCCESS, "streamcoll_comm_set_route(" + spec + ")");
  return c;
}

// Every collective x count x variant; types and ops rotate.
void matrix(const Comm& c, unsigned seed) {
  const int p = comm_size(c.comm);
  const size_t counts[] = {1, 7, static_cast<size_t>(p), 1000, 4099};
  const auto& ts = types();
  unsigned k = seed;
  for (int coll = 0; coll < 3; ++coll)
    for (size_t count : counts)
      for (int vi = 0; vi < 6; ++vi) {
        ++k;
        Variant v;
        v.s = static_cast<StreamMode>(vi % 3);
        v.in_place = vi >= 3;
        v.legacy_input = v.s == classic && k % 2 == 0;
        const TypeCase& t = ts[k % ts.size()];
        const OpCase& op = kOps[(k / ts.size()) % 4];
        if (coll == 2) {
          allgather(c, t, count, v, k);
          continue;
        }
        with_type(t.tag, [&](auto z) {
          using T = decltype(z);
          if (coll == 0) allreduce<T>(c, t, op, count, v, k);
          else reduce_scatter_block<T>(c, t, op, count, v, k);
        });
      }
}

// Every datatype x op, allreduce (a count not divisible by p) and reduce_scatter_block.
void type_op_grid(const Comm& c) {
  unsigned k = 500;
  for (const TypeCase& t : types())
    for (const OpCase& op : kOps)
      with_type(t.tag, [&](auto z) {
        using T = decltype(z);
        ++k;
        Variant v;
        v.s = static_cast<StreamMode>(k % 3);
        allreduce<T>(c, t, op, 7, v, k);
        reduce_scatter_block<T>(c, t, op, 5, v, k);
      });
}

// Calls the route must not take on a blueconnect communicator: they go to pmpi.
void declined(const Comm& c) {
  const TypeCase flt{"MPI_FLOAT", MPI_FLOAT, Tag::flt}, i64{"MPI_INT64_T", MPI_INT64_T, Tag::i64};
  unsigned k = 900;
  for (StreamMode sm : {classic, own_stream, legacy_stream})
    for (bool in_place : {false, true}) {
      Variant v;
      v.s = sm;
      v.in_place = in_place;
      v.nb = true;
      ++k;
      allreduce<float>(c, flt, kOps[k % 4], 1000, v, k, "pmpi");
      reduce_scatter_block<int64_t>(c, i64, kOps[(k + 1) % 4], 7, v, k, "pmpi");
      allgather(c, i64, 33, v, k, "pmpi");
    }
  // A datatype NCCL lacks; host buffers (no backend for them in this rule).
  allreduce<short>(c, {"MPI_SHORT", MPI_SHORT, Tag::shrt}, kOps[0], 100, Variant{}, 1, "pmpi");
  allreduce<double>(c, {"MPI_DOUBLE", MPI_DOUBLE, Tag::dbl}, kOps[0], 100, Variant{}, 2, "pmpi", true);
}

// Rules blueconnect declines for GPU buffers: a hierarchy whose product is not the size,
// backend mpi, and host stages (sched) with an attached stream. Host stages of classic
// calls it carries: the segment through pinned memory, the stage on the host.
void other_rules() {
  const TypeCase dbl{"MPI_DOUBLE", MPI_DOUBLE, Tag::dbl};
  const std::string bad = g_size == 1 ? "2" : g_size == 4 ? "2x3" : "3x3";
  const std::string half = g_size == 1 ? "1" : g_size == 4 ? "2x2" : "2x4";
  for (const auto& [hier, backend] :
       {std::pair<std::string, std::string>{bad, "nccl"}, {half, "nccl/sched"}, {half, "sched"}, {half, "mpi"}}) {
    if (levels_of(hier) == 1 && backend == "nccl/sched") continue;
    Comm c = routed(MPI_COMM_WORLD, "dup", hier, backend);
    unsigned k = 0;
    for (StreamMode sm : {classic, own_stream}) {
      Variant v;
      v.s = sm;
      ++k;
      const bool host_stages = hier == half && backend != "mpi" && backend != "nccl";
      const char* route = host_stages && sm == classic ? "blueconnect" : "pmpi";
      for (size_t n : {size_t{1000}, size_t{4099}})
        allreduce<double>(c, dbl, kOps[k % 4], n, v, k, route);
      reduce_scatter_block<double>(c, dbl, kOps[(k + 1) % 4], 7, v, k, route);
      allgather(c, dbl, 7, v, k, route);
      for (bool in_place : {false, true}) {
        v.in_place = in_place;
        allreduce<float>(c, {"MPI_FLOAT", MPI_FLOAT, Tag::flt}, kOps[(k + 2) % 4], 33, v, k, route);
        allgather(c, dbl, 5, v, k + 1, route);
      }
    }
    MPI_Comm_free(&c.comm);
  }
}

// The first call on a fresh blueconnect communicator is an MPI_Allgather: the route sets
// up its GPU path there, and it must carry that call and later ones.
void first_call_allgather(const std::string& hier) {
  Comm c = routed(MPI_COMM_WORLD, "dup, first call an allgather", hier);
  const TypeCase i32{"MPI_INT32_T", MPI_INT32_T, Tag::i32};
  allgather(c, i32, 1000, Variant{}, 1);
  allreduce<int32_t>(c, i32, kOps[0], 1000, Variant{}, 2);
  allgather(c, i32, 10, Variant{}, 3);
  MPI_Comm_free(&c.comm);
}

// Calls on two communicators enqueued on one attached stream, each reading what the one
// before wrote, with no synchronisation in between: Y = allreduce(X) on a, Y = allreduce(Y)
// in place on b, G = allgather of Y's first m elements on a. Then MPI_Comm_free of a
// routed communicator whose work is still pending on the stream.
void stream_pipeline(const Comm& a, const Comm& b, const std::string& hier) {
  const int me = comm_rank(a.comm), p = comm_size(a.comm);
  const size_t n = 4099, m = 7;
  auto x = inputs<double>(me, n, Op::sum, 31);
  auto y = reduced<double>(p, n, Op::sum, 31);
  for (double& e : y) e *= p;
  std::vector<double> g;
  for (int r = 0; r < p; ++r) g.insert(g.end(), y.begin(), y.begin() + m);
  Buf X(n * 8), Y(n * 8), G(m * p * 8);
  const std::string L = "stream pipeline on " + a.name + " and " + b.name;
  check(api.enqueue_copy(g_stream, X.get(), x.data(), n * 8) == 0, L + ": input on the stream");
  check(streamcoll_comm_attach_stream(a.comm, g_stream) == MPI_SUCCESS &&
            streamcoll_comm_attach_stream(b.comm, g_stream) == MPI_SUCCESS,
        L + ": attach");
  const unsigned long long sync0 = api.sync_count(), bc0 = stat_calls(nullptr, "blueconnect", "device");
  const PendingLook pending0 = look_pending(g_stream);
  check(MPI_Allreduce(X.get(), Y.get(), static_cast<int>(n), MPI_DOUBLE, MPI_SUM, a.comm) == MPI_SUCCESS &&
            MPI_Allreduce(MPI_IN_PLACE, Y.get(), static_cast<int>(n), MPI_DOUBLE, MPI_SUM, b.comm) == MPI_SUCCESS &&
            MPI_Allgather(Y.get(), static_cast<int>(m), MPI_DOUBLE, G.get(), static_cast<int>(m), MPI_DOUBLE,
                          a.comm) == MPI_SUCCESS,
        L + ": the calls return MPI_SUCCESS");
  check(stat_calls(nullptr, "blueconnect", "device") == bc0 + 3, L + ": three calls on blueconnect");
  check(api.sync_count() == sync0, L + ": no host wait");
  if (g_defer) {
    check(more_pending(pending0), L + ": all of it pending on the stream");
    if (p > 1) check(cu("live_async_allocs") > 0, L + ": the padded allreduces' scratch is still in use");
  }
  check(api.stream_sync(g_stream) == 0, L + ": synchronise");
  check(cu("live_async_allocs") == 0, L + ": scratch given back");
  check(api.host_access(Y.get(), n * 8, 0) == 0 && api.host_access(G.get(), m * p * 8, 0) == 0,
        L + ": no race");
  check(std::memcmp(Y.get(), y.data(), n * 8) == 0, L + ": Y correct");
  check(std::memcmp(G.get(), g.data(), g.size() * 8) == 0, L + ": G correct");
  streamcoll_comm_detach_stream(a.comm);
  streamcoll_comm_detach_stream(b.comm);

  // The communicator goes while its work is pending (on the attached stream, then on the
  // legacy stream attached).
  for (StreamMode sm : {own_stream, legacy_stream}) {
    Comm c = routed(MPI_COMM_WORLD, "dup, freed with work pending", hier);
    streamcoll_stream_t st = sm == own_stream ? g_stream : nullptr;
    const std::string F = std::string("MPI_Comm_free with work pending [") + kStreamNames[sm] + "]";
    std::memcpy(X.get(), x.data(), n * 8);  // the stream is idle: the host writes
    check(streamcoll_comm_attach_stream(c.comm, st) == MPI_SUCCESS, F + ": attach");
    check(MPI_Allreduce(X.get(), Y.get(), static_cast<int>(n), MPI_DOUBLE, MPI_SUM, c.comm) == MPI_SUCCESS,
          F + ": MPI_Allreduce");
    check(MPI_Allgather(MPI_IN_PLACE, static_cast<int>(m), MPI_DOUBLE, G.get(), static_cast<int>(m),
                        MPI_DOUBLE, c.comm) == MPI_SUCCESS, F + ": MPI_Allgather");
    check(MPI_Comm_free(&c.comm) == MPI_SUCCESS, F + ": MPI_Comm_free");
    check(api.stream_sync(st) == 0, F + ": synchronise");
    std::vector<double> want = reduced<double>(p, n, Op::sum, 31);
    check(api.host_access(Y.get(), n * 8, 0) == 0 && std::memcmp(Y.get(), want.data(), n * 8) == 0,
          F + ": the result");
  }
}

// Zero elements (MPI defines them: nothing moves) and a hierarchy spelt with factors 1.
void edge_cases(const std::string& hier) {
  Comm c = routed(MPI_COMM_WORLD, "dup", "1x" + hier + "x1");
  Buf a(64), b(64 * 8);
  for (StreamMode sm : {classic, own_stream}) {
    const std::string L = std::string("count 0 [") + kStreamNames[sm] + "]";
    if (sm != classic) streamcoll_comm_attach_stream(c.comm, g_stream);
    check(MPI_Allreduce(a.get(), b.get(), 0, MPI_FLOAT, MPI_SUM, c.comm) == MPI_SUCCESS &&
              MPI_Reduce_scatter_block(b.get(), a.get(), 0, MPI_INT, MPI_MAX, c.comm) == MPI_SUCCESS &&
              MPI_Allgather(a.get(), 0, MPI_DOUBLE, b.get(), 0, MPI_DOUBLE, c.comm) == MPI_SUCCESS &&
              MPI_Allreduce(MPI_IN_PLACE, b.get(), 0, MPI_INT64_T, MPI_MIN, c.comm) == MPI_SUCCESS,
          L + ": MPI_SUCCESS");
    if (sm != classic) {
      check(api.stream_sync(g_stream) == 0, L + ": synchronise");
      streamcoll_comm_detach_stream(c.comm);
    }
  }
  unsigned k = 40;
  for (int vi = 0; vi < 6; ++vi) {
    Variant v;
    v.s = static_cast<StreamMode>(vi % 3);
    v.in_place = vi >= 3;
    ++k;
    allreduce<int64_t>(c, types()[4], kOps[k % 4], 1001, v, k);
    reduce_scatter_block<uint8_t>(c, types()[6], kOps[(k + 1) % 4], 3, v, k);
    allgather(c, types()[0], 5, v, k);
  }
  MPI_Comm_free(&c.comm);
}

// Another route on the same communicator between blueconnect's calls: MPI_Bcast on
// route nccl (the default table), the communicator's own NCCL communicator beside the
// sub-communicators' ones.
void bcast_between(const Comm& c) {
  const int me = comm_rank(c.comm);
  const size_t bytes = 4096;
  for (StreamMode sm : {classic, own_stream}) {
    Buf buf(bytes);
    auto data = pattern(0, 0, bytes, 5);
    std::memcpy(buf.get(), me == 0 ? data.data() : garbage(bytes).data(), bytes);
    const std::string L = std::string("MPI_Bcast on ") + c.name + " [" + kStreamNames[sm] + "]";
    if (sm != classic) streamcoll_comm_attach_stream(c.comm, g_stream);
    const unsigned long long n0 = stat_calls("bcast", "nccl", "device");
    check(MPI_Bcast(buf.get(), static_cast<int>(bytes), MPI_BYTE, 0, c.comm) == MPI_SUCCESS, L + ": MPI_SUCCESS");
    check(stat_calls("bcast", "nccl", "device") == n0 + 1, L + ": on route nccl");
    if (sm != classic) {
      check(api.stream_sync(g_stream) == 0, L + ": synchronise");
      streamcoll_comm_detach_stream(c.comm);
    }
    check(api.host_access(buf.get(), bytes, 0) == 0 && std::memcmp(buf.get(), data.data(), bytes) == 0,
          L + ": result");
    allreduce<float>(c, types()[0], kOps[0], 1000, Variant{sm, false, false, false}, 77);
  }
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  const std::string mode = argc > 1 ? argv[1] : "route";
  const bool known = (mode == "route" && (g_size == 1 || g_size == 4 || g_size == 8)) ||
                     (mode == "shared" && (g_size == 4 || g_size == 8)) || (mode == "env" && g_size == 4);
  g_shared = mode == "shared";
  if (g_shared) {
    // GPUs are shared only by ranks of one node (streamcoll keys a GPU by host and PCI bus
    // id): FAKE_CUDA_BUS_ID=same shares where a node has 2 ranks or more, mod:K where it
    // has more than K. Where no node shares one (mod:2 on nodes of 2 ranks: the test
    // cluster's 2x2), nothing declines: the expectations of mode route hold.
    MPI_Comm local;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
    const int local_size = comm_size(local);
    MPI_Comm_free(&local);
    const char* bus = std::getenv("FAKE_CUDA_BUS_ID");
    const std::string b = bus ? bus : "";
    const int k = b.rfind("mod:", 0) == 0 ? std::atoi(b.c_str() + 4) : b == "same" ? 1 : 1 << 30;
    int here = local_size > k ? 1 : 0, any = 0;
    MPI_Allreduce(&here, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (!any) {
      g_shared = false;
      if (g_rank == 0)
        std::printf("bc_route: no node has ranks sharing a GPU (FAKE_CUDA_BUS_ID=%s, %d ranks "
                    "per node): the expectations of mode route\n", b.c_str(), local_size);
    }
  }
  int ok = known && load_api(true) ? 1 : 0, all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all_ok) {
    if (g_rank == 0)
      std::fprintf(stderr, "bc_route: mode '%s' on %d ranks is not a test (route: 4 or 8 ranks, env: 4), "
                   "or the fake CUDA/NCCL or streamcoll not loaded\n", mode.c_str(), g_size);
    MPI_Finalize();
    return 1;
  }
  g_defer = api.deferred() != 0;
  check(cu("cuInit") >= 1, "streamcoll opened the fake CUDA driver");
  check(api.runtime_init() == 0, "runtime init");
  g_stream = api.stream_create(1 /* CU_STREAM_NON_BLOCKING */);
  const unsigned long long races0 = cu("races");
  {
    // streamcoll's host staging (pmpi on device buffers) keeps the context until
    // MPI_Finalize: take it before the baseline of the leak check.
    Comm plain{MPI_COMM_NULL, "dup, not routed", 0};
    MPI_Comm_dup(MPI_COMM_WORLD, &plain.comm);
    allreduce<short>(plain, {"MPI_SHORT", MPI_SHORT, Tag::shrt}, kOps[0], 100, Variant{}, 1, "pmpi");
    MPI_Comm_free(&plain.comm);
  }
  const unsigned long long streams0 = cu("live_streams"), events0 = cu("live_events"),
                           refs0 = cu("ctx_refs");

  if (mode == "env") {
    // The hierarchy: STREAMCOLL_ROUTE's hierarchy=, else STREAMCOLL_HIERARCHY, else the
    // discovered one (one node: one level).
    std::string hier = "1";
    const std::string route = std::getenv("STREAMCOLL_ROUTE") ? std::getenv("STREAMCOLL_ROUTE") : "";
    const char* env_h = std::getenv("STREAMCOLL_HIERARCHY");
    if (size_t at = route.find("hierarchy="); at != std::string::npos)
      hier = route.substr(at + 10, route.find_first_of(":,", at) - at - 10);
    else if (env_h && *env_h)
      hier = env_h;
    const bool discovered = route.find("hierarchy=") == std::string::npos && !(env_h && *env_h);
    Comm world{MPI_COMM_WORLD, "MPI_COMM_WORLD (" + (discovered ? "discovered" : hier) + ")",
               levels_of(hier)};
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    if (discovered) {
      // How many levels discovery found here (one node: at least the node level; a NUMA
      // level where the machine has one): the reduce-scatter stages of a first call.
      const unsigned long long rs0 = nc("ncclReduceScatter"), ar0 = nc("ncclAllReduce");
      Buf x(1000 * 4);
      std::memset(x.get(), 0, 1000 * 4);
      check(MPI_Allreduce(MPI_IN_PLACE, x.get(), 1000, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD) == MPI_SUCCESS,
            "discovered hierarchy: a first MPI_Allreduce");
      // (The outermost level's stages are one NCCL allreduce.)
      world.levels = static_cast<int>(nc("ncclReduceScatter") - rs0 + nc("ncclAllReduce") - ar0);
      check(world.levels >= 1 && stat_calls("allreduce", "blueconnect", "device") == 1,
            "discovered hierarchy: the first call on blueconnect, in stages");
      if (g_rank == 0) std::printf("discovered hierarchy: %d level(s)\n", world.levels);
    }
    type_op_grid(world);
    bcast_between(world);
    matrix(world, 0);
    declined(world);
  } else {
    std::vector<Comm> comms;
    MPI_Comm rev, half;
    MPI_Comm_split(MPI_COMM_WORLD, 0, g_size - 1 - g_rank, &rev);
    if (g_size == 1) {  // no stage at all: the copies around them
      comms.push_back(routed(MPI_COMM_WORLD, "dup", "1"));
      comms.push_back(routed(MPI_COMM_WORLD, "dup", "1x1"));
      MPI_Comm_free(&rev);
    } else if (g_size == 4) {
      comms.push_back(routed(MPI_COMM_WORLD, "dup", "2x2"));
      comms.push_back(routed(MPI_COMM_WORLD, "dup", "4"));
      comms.push_back(routed(rev, "split, reversed", "2x2"));
    } else {
      MPI_Comm_split(MPI_COMM_WORLD, g_rank / 4, -g_rank, &half);
      comms.push_back(routed(MPI_COMM_WORLD, "dup", "2x2x2"));
      comms.push_back(routed(MPI_COMM_WORLD, "dup", "2x4"));
      comms.push_back(routed(MPI_COMM_WORLD, "dup", "4x2"));
      comms.push_back(routed(rev, "split, reversed", "2x2x2"));
      comms.push_back(routed(half, "half, reversed", "2x2"));
    }
    for (const Comm& c : comms) type_op_grid(c);
    for (size_t i = 0; i < comms.size(); ++i) matrix(comms[i], static_cast<unsigned>(i * 100));
    declined(comms[0]);
    // The communicators again, interleaved: each keeps its own sub-communicators.
    for (int round = 0; round < 2; ++round)
      for (size_t i = 0; i < comms.size(); ++i) {
        Variant v;
        v.s = static_cast<StreamMode>((i + round) % 3);
        allreduce<double>(comms[i], types()[1], kOps[round], 4099, v, static_cast<unsigned>(i));
      }
    const std::string two = g_size == 1 ? "1" : g_size == 4 ? "2x2" : "2x4";
    if (!g_shared) stream_pipeline(comms[0], comms[1], g_size == 1 ? "1" : g_size == 4 ? "2x2" : "4x2");
    edge_cases(two);
    other_rules();
    first_call_allgather(two);
    // Shared GPUs: NCCL ran nothing, but the level-0 stages of nccl/sched rules (other_rules)
    // where those groups have distinct GPUs (mod:2).
    const char* bus = std::getenv("FAKE_CUDA_BUS_ID");
    if (g_shared && !(bus && std::string(bus) == "mod:2"))
      check(nc("ncclReduceScatter") + nc("ncclAllGather") + nc("ncclAllReduce") == 0,
            "shared GPUs: NCCL ran no operation");
    if (g_shared)
      check(nc("ncclAllReduce") == 0, "shared GPUs: NCCL ran no allreduce (no level above 0)");
    check(nc("mismatches") == 0, "every rank ran the same NCCL operations");
    check(nc("errors") == 0, "the fake NCCL saw no bad argument");
    for (Comm& c : comms) MPI_Comm_free(&c.comm);
    // Left over: only idle NCCL communicators kept for reuse by communicators over the same
    // ranks (at most 8, each with its context and at most 3 streams); MPI_Finalize frees
    // them (checked below). Events belong to them too.
    (void)events0;
    check(eventually([&] {
            const unsigned long long kept = cu("ctx_refs") - refs0;
            return cu("ctx_refs") >= refs0 && kept <= 8 && cu("live_streams") >= streams0 &&
                   cu("live_streams") - streams0 <= 3 * kept;
          }),
          "MPI_Comm_free released streamcoll's streams (" + std::to_string(cu("live_streams")) + ", was " +
              std::to_string(streams0) + ") and contexts (" + std::to_string(cu("ctx_refs")) + ", was " +
              std::to_string(refs0) + ") but for at most 8 idle NCCL communicators'");
  }
  check(nc("mismatches") == 0 && nc("errors") == 0, "the fake NCCL saw no mismatch or bad argument");
  check(cu("races") == races0, "the fake driver saw no race");
  check(cu("errors") == 0, "the fake driver returned no error");

  api.stream_destroy(g_stream);
  api.runtime_fini();
  int counts[2] = {g_pass, g_fail}, total[2] = {0, 0};
  MPI_Reduce(counts, total, 2, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
  MPI_Finalize();
  bool clean = true;
  for (const char* gauge : {"ctx_refs", "live_streams", "live_events", "live_async_allocs", "live_allocs",
                            "live_host_allocs"})
    if (cu(gauge) != 0) {
      std::fprintf(stderr, "[rank %d] FAIL: after MPI_Finalize, %s = %llu (want 0)\n", g_rank, gauge, cu(gauge));
      clean = false;
    }
  if (g_rank == 0)
    std::printf("bc_route (%s, %d ranks%s): %d passed, %d failed\n", mode.c_str(), g_size,
                g_defer ? ", deferred stream work" : "", total[0], total[1]);
  return total[1] == 0 && g_fail == 0 && clean ? 0 : 1;
}
