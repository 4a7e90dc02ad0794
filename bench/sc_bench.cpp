// sc_bench: one MPI collective over a sweep of sizes, on every route asked for, in the
// manner of the OSU micro-benchmarks and nccl-tests; every result is checked.
//
//   sc_bench [--coll allreduce|reduce|bcast|allgather|reduce_scatter_block|alltoall]
//            [--dtype float|double|int8|uint8|int32|uint32|int64|uint64]
//            [--op sum|prod|max|min] [--mem host|device] [--stream]
//            [-b|--min-bytes 4] [-e|--max-bytes 1G] [-f|--factor 2]
//            [-w|--warmup 5] [-n|--iters 100] [--min-iters 5]
//            [--route SPEC]... [--order interleaved|sequential]
//            [--csv FILE [--append]] [--json FILE] [--progress | --quiet] [--help]
// Options take their value as the next argument or after '=' (--coll=bcast).
//
// What is measured
//   --coll     the collective (default allreduce); reduce and bcast use root 0.
//   --dtype    the element type (default float; MPI_FLOAT, MPI_DOUBLE, MPI_INT8_T,
//              MPI_UINT8_T, MPI_INT32_T, MPI_UINT32_T, MPI_INT64_T, MPI_UINT64_T).
//   --op       the reduction (default sum; allreduce, reduce, reduce_scatter_block only,
//              ignored by the others, whose op column says "none").
//   --mem      host (malloc) or device (cudaMalloc) buffers, out of place (bcast: one buffer).
//   --stream   device only: a CUDA stream is attached to every route's communicator
//              (streamcoll_comm_attach_stream, streamcoll/streamext.h), so the calls are
//              stream-ordered; needs streamcoll loaded.
// Sizes: from --min-bytes, times --factor, up to --max-bytes (K, M, G: KiB, MiB, GiB). A
// size is the nccl-tests "size", the tuning table's CallKey::bytes: count x type size for
// allreduce, reduce and bcast; the whole receive buffer for allgather; the whole send
// buffer for reduce_scatter_block and alltoall (count per rank = size / type size / ranks).
// Counts are rounded down to whole elements; sizes that give less than one element per
// rank, or the same rounded size as the size before, are skipped.
//
// Routes (--route SPEC, repeatable; a comma-separated list works too): each spec runs on
// its own private duplicate of MPI_COMM_WORLD on which
// streamcoll_comm_set_route(dup, "<coll>:SPEC") forces it. SPEC is that function's syntax
// without the collective: pmpi, nccl, ht:algo=rd, blueconnect:hierarchy=2x2:backend=sched,
// ... The spec "table" (the default) forces nothing: the tuning table in effect decides
// (STREAMCOLL_TUNING_FILE, STREAMCOLL_ROUTE, the embedded default). Without streamcoll
// loaded only "table" runs; any other spec is an error (exit 2), as is a spec
// streamcoll_comm_set_route rejects.
//
// Order (--order): how the routes take turns. Comparing routes (the autotuner does) wants
// the machine's drift and noise to hit them alike, which interleaving does.
//   interleaved  (the default) sizes outer: per size, every route's warm-up calls (below)
//                in turn, then the timed iterations in rounds: in round r every route
//                makes one call, in turn from route r mod R (R routes), as
//                bench/hier_latency does.
//   sequential   routes outer: each route over all sizes, then the next route.
// Both make the same calls per route and size, with the same checks.
//
// Method, per route and size: the inputs are written and the receive buffer is poisoned;
// then --warmup calls (the first is checked), then the timed iterations (interleaved: in
// rounds with the other routes' iterations). Each iteration:
// PMPI_Barrier(MPI_COMM_WORLD), then on every rank the time of
//   host buffers     the call;
//   device, classic  cudaStreamSynchronize of the stream the inputs were written on, then
//                    the call (the CUDA-aware MPI pattern);
//   device, --stream the call, then cudaStreamSynchronize(stream) (completion).
// The iteration's latency is the largest over the ranks (per-iteration times are reduced
// with PMPI_Allreduce(MAX) at the end of the size). Reported: min, median and max of that
// over the iterations; host_us, the median (of the slowest rank) of the time the calling
// thread spent inside the MPI call itself (with --stream: the enqueue cost; otherwise the
// whole call); algbw = size / median (GB/s, 1e9 B/s); busbw = algbw x nccl-tests' bus
// factor (allreduce 2(n-1)/n; reduce_scatter_block, allgather, alltoall (n-1)/n; bcast,
// reduce 1). Iterations: --iters up to 64 KiB, then scaled down by the size, at least
// --min-iters; warm-up calls likewise, at least min(--warmup, 2) (and at least 1: the
// first warm-up call is the checked one). The first calls on a route's communicator
// (NCCL communicator set-up, layout discovery) are warm-up calls of the smallest size.
// The bench's own collectives are PMPI_ calls, so streamcoll counts only measured calls.
//
// Checks: inputs are small integers computed from (rank, element), so every result is
// exact in every type and order of reduction (sums stay below the type's exact range;
// prod uses +-1 and one 2 per element; max/min and the data-moving collectives use
// values up to 126 or 65520). The result of the first warm-up call and of the last timed
// call (the receive buffer is poisoned again before it, outside the timing; interleaved:
// before every route's last call, and its result checked before the next route's call,
// as the routes share the buffers) are compared element by element with values computed
// on the host (device buffers: copied back with cudaMemcpy). A wrong element prints
//   FAIL: allreduce 1024 B ht:algo=rd element 17: got nan expected 12 (rank 1, first call)
// and the row's check says FAIL; the run goes on and exits 1 at the end. --check all checks
// every timed call the same way (poisoned before, compared after, outside the timing).
//
// Route taken: sc_bench sets STREAMCOLL_STATS=1 before MPI_Init (setenv without
// overwriting, so STREAMCOLL_STATS=0 in the environment turns it off; streamcoll reads it
// when MPI_Init starts it). The calls each route got are read with streamcoll_get_stats
// (found with dlsym) before the first warm-up call and after the last timed call of each
// route and size (interleaved: before and after the route's warm-up calls and each of its
// timed calls, outside the timing, the differences summed, so that calls of the other
// routes in between are not counted: the counters are per route name, and ht:algo=rd and
// ht:algo=ring both count as "ht"); "taken" is the route that got them all on every
// rank, "mixed" when more than one did, "-" when unknown (streamcoll not loaded,
// statistics off). A forced route that declines (its calls go to pmpi) is not a failure:
// the row says so, and a note after the route's table lists the sizes. The CSV's and
// JSON's "rule" is what streamcoll_last_route says rank 0's last timed call of the route
// and size took, parameters included ("ht algo=rd"; "-" unknown): with nothing forced it
// shows which rule of the tuning table ran. Statistics cost two clock reads per call, and
// with them rank 0 prints streamcoll's statistics table at MPI_Finalize.
//
// Output (rank 0): stdout has the run's header (with the order), then per route a table
//   size(B) count iters min_us median_us max_us host_us algbw busbw taken check
// under header lines naming coll, dtype, op, mem, stream, ranks, nodes (distinct
// MPI_COMM_TYPE_SHARED groups), ppn (most ranks on one node) and the spec; interleaved,
// the tables come after the last size (FAIL lines as they happen, before them).
//   --csv FILE   the CSV of config/bench_csv.hpp: its header, one row per (route, size),
//                written as they are measured (interleaved: size by size, the routes of a
//                size in the order of the specs; sequential: route by route). dtype and
//                op are the MPI names without the prefix, lower case: float, int32_t,
//                sum; op "none" for bcast, allgather, alltoall. --append adds the rows to
//                an existing file (the header is written only if the file is new or
//                empty; another header is an error).
//   --json FILE  the same data, written at the end: {"meta":{...},"results":[{...},...]},
//                the columns common to all rows (and the order) in meta, the others per
//                result, route by route.
// Progress (rank 0, stderr): on a terminal one line, rewritten per size, such as
//   [3 routes, interleaved] allreduce 1 MiB (12/29)
//   [route 2/3 ht:algo=rd] allreduce 1 MiB (12/29)          (sequential)
// otherwise a line per size that took more than 2 s (--progress: every size); --quiet:
// none.
//
// Device buffers on the pmpi route need a CUDA-aware MPI, or streamcoll loaded (it stages
// them through host memory for an MPI that is not CUDA-aware).
//
// Exit status: 0; 1 when a result was wrong or a call failed; 2 for a bad option or a
// route that cannot be forced (--help: usage, 0); 77 with --mem device and no usable GPU
// on some rank (one "SKIP: no usable GPU (...)" line), or a build without the CUDA toolkit.
// Wrapper: scripts/bench-coll.sh NP [options] (preloads streamcoll).
#include <dlfcn.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <type_traits>
#include <vector>

#if STREAMCOLL_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include "bench_util.hpp"
#include "streamcoll/streamcoll.h"
#include "streamcoll/streamext.h"

extern char** environ;

namespace {

using bench::all_min;
using bench::now_us;
using bench::percentile;
using bench::quote;

using GetStats = int (*)(const char*, const char*, const char*, streamcoll_stat_t*);
using LastRoute = int (*)(char*, int);
using SetRoute = int (*)(MPI_Comm, const char*);
using Version = const char* (*)();

// The routes' names, from the streamcoll loaded here (none without it).
const std::vector<std::string>& routes() {
  static const std::vector<std::string> names = bench::route_names();
  return names;
}
size_t num_routes() { return routes().size(); }
constexpr uint64_t kFullItersUpTo = 64 << 10;  // --iters and --warmup apply up to this size
constexpr int kMaxFailLines = 20;             // FAIL lines per rank before going quiet

// ---------------------------------------------------------------------------------------
// Collectives, types, ops

enum class Coll { allreduce, reduce, bcast, allgather, reduce_scatter_block, alltoall };
const Coll kColls[] = {Coll::allreduce, Coll::reduce, Coll::bcast,
                       Coll::allgather, Coll::reduce_scatter_block, Coll::alltoall};

const char* coll_name(Coll c) {
  switch (c) {
    case Coll::allreduce: return "allreduce";
    case Coll::reduce: return "reduce";
    case Coll::bcast: return "bcast";
    case Coll::allgather: return "allgather";
    case Coll::reduce_scatter_block: return "reduce_scatter_block";
    case Coll::alltoall: return "alltoall";
  }
  return "?";
}

bool reduces(Coll c) {
  return c == Coll::allreduce || c == Coll::reduce || c == Coll::reduce_scatter_block;
}

// nccl-tests' bus bandwidth factor.
double bus_factor(Coll c, int n) {
  switch (c) {
    case Coll::allreduce: return 2.0 * (n - 1) / n;
    case Coll::reduce_scatter_block:
    case Coll::allgather:
    case Coll::alltoall: return static_cast<double>(n - 1) / n;
    case Coll::bcast:
    case Coll::reduce: return 1.0;
  }
  return 1.0;
}

enum class Op { sum, prod, max, min };
const Op kOps[] = {Op::sum, Op::prod, Op::max, Op::min};

const char* op_name(Op o) {
  switch (o) {
    case Op::sum: return "sum";
    case Op::prod: return "prod";
    case Op::max: return "max";
    case Op::min: return "min";
  }
  return "?";
}

MPI_Op mpi_op(Op o) {
  switch (o) {
    case Op::sum: return MPI_SUM;
    case Op::prod: return MPI_PROD;
    case Op::max: return MPI_MAX;
    case Op::min: return MPI_MIN;
  }
  return MPI_OP_NULL;
}

enum class DType { f32, f64, i8, u8, i32, u32, i64, u64 };
struct TypeInfo {
  DType t;
  const char* opt;    // --dtype name
  const char* mpi;    // MPI name without the prefix, lower case (the CSV's dtype)
  int size;
  bool is_float, is_signed;
};
const TypeInfo kTypes[] = {
    {DType::f32, "float", "float", 4, true, true},
    {DType::f64, "double", "double", 8, true, true},
    {DType::i8, "int8", "int8_t", 1, false, true},
    {DType::u8, "uint8", "uint8_t", 1, false, false},
    {DType::i32, "int32", "int32_t", 4, false, true},
    {DType::u32, "uint32", "uint32_t", 4, false, false},
    {DType::i64, "int64", "int64_t", 8, false, true},
    {DType::u64, "uint64", "uint64_t", 8, false, false},
};

const TypeInfo& type_info(DType t) {
  for (const TypeInfo& ti : kTypes)
    if (ti.t == t) return ti;
  return kTypes[0];
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i8: return MPI_INT8_T;
    case DType::u8: return MPI_UINT8_T;
    case DType::i32: return MPI_INT32_T;
    case DType::u32: return MPI_UINT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::u64: return MPI_UINT64_T;
  }
  return MPI_DATATYPE_NULL;
}

// Calls f with a value of the C++ type of `t` (f is a generic lambda).
template <typename F>
void with_type(DType t, F&& f) {
  switch (t) {
    case DType::f32: f(float{}); break;
    case DType::f64: f(double{}); break;
    case DType::i8: f(int8_t{}); break;
    case DType::u8: f(uint8_t{}); break;
    case DType::i32: f(int32_t{}); break;
    case DType::u32: f(uint32_t{}); break;
    case DType::i64: f(int64_t{}); break;
    case DType::u64: f(uint64_t{}); break;
  }
}

// ---------------------------------------------------------------------------------------
// The value model: rank r's input element i (an index into the collective's whole data,
// see Bench::fill) is a small integer, so that every result is exact in every type and
// does not depend on the order of the reduction.
//   sum       ((7i + 13r) mod k) - offset, k chosen so that p terms stay below 127 (8-bit
//             types), 2^24 (float) or 2^30 (others); offset k/2 for signed types.
//   prod      +-1 (signed types; sign from (3i + 5r) mod 7), and 2 on rank i mod p: the
//             product's magnitude is 2 at most.
//   max, min and the data-moving collectives: ((7i + 13r) mod k) - offset with k = 127
//             (8-bit) or 65521 (others).
// The poison written into receive buffers (0xff bytes: NaN in floats; 0x80 bytes in
// integers) is never a possible result.
struct Model {
  bool prod = false, is_signed = false;
  Op op = Op::sum;
  int p = 1;
  uint64_t k = 31;
  int64_t offset = 0;

  Model(Coll c, Op o, const TypeInfo& ti, int ranks) : op(o), p(ranks) {
    is_signed = ti.is_signed;
    const bool reduction = reduces(c);
    if (!reduction) op = Op::max;  // unused; "spread" values below
    prod = reduction && op == Op::prod;
    if (reduction && op == Op::sum) {
      const uint64_t maxsum = ti.size == 1 ? 127 : ti.is_float && ti.size == 4 ? (1u << 24) : (1u << 30);
      k = std::max<uint64_t>(1, std::min<uint64_t>(31, maxsum / static_cast<uint64_t>(p) + 1));
    } else {
      k = ti.size == 1 ? 127 : 65521;
    }
    offset = is_signed ? static_cast<int64_t>(k / 2) : 0;
  }

  int64_t input(uint64_t i, int r) const {
    const uint64_t ur = static_cast<uint64_t>(r);
    if (prod) {
      int64_t v = i % static_cast<uint64_t>(p) == ur ? 2 : 1;
      if (is_signed && (i % 7 * 3 + ur % 7 * 5) % 7 < 3) v = -v;
      return v;
    }
    return static_cast<int64_t>((i % k * 7 + ur % k * 13) % k) - offset;
  }

  // The reduction over all ranks of element i.
  int64_t reduced(uint64_t i) const {
    int64_t acc = input(i, 0);
    for (int r = 1; r < p; ++r) {
      const int64_t v = input(i, r);
      switch (op) {
        case Op::sum: acc += v; break;
        case Op::prod: acc *= v; break;
        case Op::max: acc = std::max(acc, v); break;
        case Op::min: acc = std::min(acc, v); break;
      }
    }
    return acc;
  }
};

// Writes value(i) for i < n into buf, as elements of type t.
template <typename F>
void fill_elems(DType t, void* buf, size_t n, F value) {
  with_type(t, [&](auto tag) {
    using T = decltype(tag);
    T* b = static_cast<T*>(buf);
    for (size_t i = 0; i < n; ++i) b[i] = static_cast<T>(value(i));
  });
}

// The first i < n where buf[i] != want(i) (n when none); *got and *expected describe it.
template <typename F>
size_t first_mismatch(DType t, const void* buf, size_t n, F want, std::string* got,
                      std::string* expected) {
  size_t bad = n;
  with_type(t, [&](auto tag) {
    using T = decltype(tag);
    const T* b = static_cast<const T*>(buf);
    for (size_t i = 0; i < n; ++i) {
      const int64_t w = want(i);
      // Every expected value is a small integer, exact as a double in every type.
      if (!(static_cast<double>(b[i]) == static_cast<double>(w))) {
        char g[48];
        if (std::is_floating_point<T>::value)
          std::snprintf(g, sizeof g, "%g", static_cast<double>(b[i]));
        else if (std::is_signed<T>::value)
          std::snprintf(g, sizeof g, "%lld", static_cast<long long>(b[i]));
        else
          std::snprintf(g, sizeof g, "%llu", static_cast<unsigned long long>(b[i]));
        *got = g;
        *expected = std::to_string(w);
        bad = i;
        return;
      }
    }
  });
  return bad;
}

// ---------------------------------------------------------------------------------------
// Small helpers

// "4", "64K", "1M", "1G", "2GiB", "512KB": binary suffixes.
bool parse_bytes(const char* s, uint64_t* out) {
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(s, &end, 10);
  if (end == s || errno || *s == '-') return false;
  int shift = 0;
  switch (*end) {
    case 'K': case 'k': shift = 10; ++end; break;
    case 'M': case 'm': shift = 20; ++end; break;
    case 'G': case 'g': shift = 30; ++end; break;
    default: break;
  }
  if (shift && (*end == 'i' || *end == 'I')) ++end;
  if (*end == 'B' || *end == 'b') ++end;
  if (*end != '\0' || v > (~0ull >> shift)) return false;
  *out = v << shift;
  return true;
}

bool parse_int(const char* s, int lo, int* out) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(s, &end, 10);
  if (end == s || *end != '\0' || errno || v < lo || v > 100000000) return false;
  *out = static_cast<int>(v);
  return true;
}

// 1 MiB, 4 B, 1.5 KiB.
std::string human(uint64_t b) {
  static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, v == std::floor(v) ? "%.0f %s" : "%.3g %s", v, units[u]);
  return buf;
}

std::string json_string(const std::string& s) {
  std::string o = "\"";
  for (char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      o += '\\';
      o += static_cast<char>(c);
    } else if (c < 0x20) {
      char u[8];
      std::snprintf(u, sizeof u, "\\u%04x", c);
      o += u;
    } else {
      o += static_cast<char>(c);
    }
  }
  return o + "\"";
}

// JSON numbers as the CSV writes them: times in microseconds with 3 decimals,
// bandwidths with 6 significant digits.
std::string json_number(double v, const char* format = "%.6g") {
  if (!std::isfinite(v)) return "null";
  char b[48];
  std::snprintf(b, sizeof b, format, v);
  return b;
}
std::string json_us(double v) { return json_number(v, "%.3f"); }

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size();
  return m % 2 ? v[m / 2] : 0.5 * (v[m / 2 - 1] + v[m / 2]);
}

// "ht:algo=rd" -> "ht algo=rd" (the tuning table's syntax); "table" stays.
std::string table_syntax(const std::string& spec) {
  std::string r = spec;
  std::replace(r.begin(), r.end(), ':', ' ');
  return r;
}

std::string route_of(const std::string& spec) { return spec.substr(0, spec.find(':')); }

#if STREAMCOLL_HAVE_CUDA
void cuda_ok(cudaError_t e, const char* what, int line) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "sc_bench: %s failed (line %d): %s\n", what, line, cudaGetErrorString(e));
  MPI_Abort(MPI_COMM_WORLD, 1);
}
#define CUDA_OK(call) cuda_ok((call), #call, __LINE__)

// "" when this rank can use a GPU (local rank modulo the devices), else why not.
std::string gpu_unusable(int local_rank) {
  int ndev = 0;
  cudaError_t e = cudaGetDeviceCount(&ndev);
  if (e != cudaSuccess) return std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
  if (ndev == 0) return "cudaGetDeviceCount: 0 devices";
  const int dev = local_rank % ndev;
  if ((e = cudaSetDevice(dev)) != cudaSuccess || (e = cudaFree(nullptr)) != cudaSuccess)
    return "device " + std::to_string(dev) + ": " + cudaGetErrorString(e);
  return "";
}
#endif

// ---------------------------------------------------------------------------------------
// Options

struct Options {
  Coll coll = Coll::allreduce;
  DType dtype = DType::f32;
  Op op = Op::sum;
  bool device = false, stream = false;
  bool interleaved = true;  // --order
  bool check_all = false;   // --check all: every timed call, not only the last
  uint64_t min_bytes = 4, max_bytes = 1ull << 30, factor = 2;
  int warmup = 5, iters = 100, min_iters = 5;
  int burst = 0;            // --burst N: N MPI_Iallreduce, then MPI_Waitall, per call
  std::vector<std::string> specs;
  std::string csv, json;
  bool append = false, progress = false, quiet = false;
};

const char kUsage[] =
    "usage: sc_bench [--coll allreduce|reduce|bcast|allgather|reduce_scatter_block|alltoall]\n"
    "                [--dtype float|double|int8|uint8|int32|uint32|int64|uint64]\n"
    "                [--op sum|prod|max|min] [--mem host|device] [--stream]\n"
    "                [-b|--min-bytes 4] [-e|--max-bytes 1G] [-f|--factor 2]\n"
    "                [-w|--warmup 5] [-n|--iters 100] [--min-iters 5]\n"
    "                [--route SPEC]... [--order interleaved|sequential] [--check last|all]\n"
    "                [--burst N]\n"
    "                [--csv FILE [--append]] [--json FILE] [--progress | --quiet] [--help]\n"
    "  --route SPEC   force a route with streamcoll_comm_set_route(dup, \"<coll>:SPEC\"):\n"
    "                 pmpi, nccl, ht:algo=rd|rabenseifner|ring|mpi,\n"
    "                 blueconnect:hierarchy=2x2:backend=sched, ...; \"table\" (the default)\n"
    "                 forces nothing. Repeat it (or give a comma-separated list) to run\n"
    "                 several routes in turn.\n"
    "  --order O      interleaved (default): per size, every route's warm-up, then the\n"
    "                 timed iterations in rounds, one call per route each, the first\n"
    "                 route rotating (drift and noise hit the routes alike); sequential:\n"
    "                 each route over all sizes, then the next.\n"
    "  --check C      last (default): the first warm-up call and the last timed call of\n"
    "                 every route and size are checked; all: every timed call as well\n"
    "                 (the buffer poisoned before and compared after each, outside the\n"
    "                 timing; slower sweeps, and the poisoning touches the caches).\n"
    "  --burst N      allreduce only: each timed call is N MPI_Iallreduce of the size (own\n"
    "                 receive buffers, one send buffer) and one MPI_Waitall; times are\n"
    "                 per MPI_Iallreduce (the burst's time / N). For fusion (fuse=);\n"
    "                 with --stream the calls are stream-ordered (the latency ends at\n"
    "                 the stream's synchronisation after MPI_Waitall).\n"
    "                 --csv rows carry N in their burst column (0 otherwise).\n"
    "  sizes: nccl-tests convention (allgather: receive buffer; reduce_scatter_block and\n"
    "  alltoall: send buffer); suffixes K, M, G are binary. --iters applies up to 64 KiB,\n"
    "  then it is scaled down by the size, never below --min-iters.\n"
    "  Run it under mpirun with LD_PRELOAD=libstreamcoll.so (scripts/bench-coll.sh NP ...).\n"
    "  Exit: 0 ok, 1 wrong result, 2 bad option, 77 --mem device without a usable GPU.\n";

// 0: run; 1: --help; 2: error (*err says why).
int parse_options(int argc, char** argv, Options* o, std::string* err) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i], val;
    bool has_val = false;
    if (a.compare(0, 2, "--") == 0 && a.find('=') != std::string::npos) {
      val = a.substr(a.find('=') + 1);
      a = a.substr(0, a.find('='));
      has_val = true;
    }
    auto flag = [&](const char* name) {
      if (a != name) return false;
      if (has_val) *err = "option " + a + " takes no value";
      return true;
    };
    // The option's value: after '=' or the next argument. False (and *err) when absent.
    auto value = [&](const char* name, const char* alias = nullptr) {
      if (a != name && !(alias && a == alias)) return false;
      if (!has_val) {
        if (i + 1 >= argc) {
          *err = "option " + a + " needs a value";
          return true;
        }
        val = argv[++i];
        has_val = true;
      }
      return true;
    };
    auto bad = [&](const char* what) { *err = "bad " + std::string(what) + " '" + val + "'"; };

    if (flag("--help") || flag("-h")) {
      if (!err->empty()) return 2;
      return 1;
    } else if (flag("--stream")) {
      o->stream = true;
    } else if (flag("--append")) {
      o->append = true;
    } else if (flag("--progress")) {
      o->progress = true;
    } else if (flag("--quiet")) {
      o->quiet = true;
    } else if (value("--coll")) {
      if (!err->empty()) return 2;
      bool found = false;
      for (Coll c : kColls)
        if (val == coll_name(c)) o->coll = c, found = true;
      if (!found) bad("--coll");
    } else if (value("--dtype")) {
      if (!err->empty()) return 2;
      bool found = false;
      for (const TypeInfo& t : kTypes)
        if (val == t.opt || val == t.mpi) o->dtype = t.t, found = true;
      if (!found) bad("--dtype");
    } else if (value("--op")) {
      if (!err->empty()) return 2;
      bool found = false;
      for (Op op : kOps)
        if (val == op_name(op)) o->op = op, found = true;
      if (!found) bad("--op");
    } else if (value("--mem")) {
      if (!err->empty()) return 2;
      if (val == "host") o->device = false;
      else if (val == "device") o->device = true;
      else bad("--mem");
    } else if (value("--min-bytes", "-b")) {
      if (err->empty() && !parse_bytes(val.c_str(), &o->min_bytes)) bad("size");
    } else if (value("--max-bytes", "-e")) {
      if (err->empty() && !parse_bytes(val.c_str(), &o->max_bytes)) bad("size");
    } else if (value("--factor", "-f")) {
      if (err->empty() && (!parse_bytes(val.c_str(), &o->factor) || o->factor < 2))
        bad("--factor (an integer >= 2)");
    } else if (value("--warmup", "-w")) {
      if (err->empty() && !parse_int(val.c_str(), 1, &o->warmup)) bad("--warmup (at least 1)");
    } else if (value("--iters", "-n")) {
      if (err->empty() && !parse_int(val.c_str(), 1, &o->iters)) bad("--iters (at least 1)");
    } else if (value("--min-iters")) {
      if (err->empty() && !parse_int(val.c_str(), 1, &o->min_iters))
        bad("--min-iters (at least 1)");
    } else if (value("--route")) {
      if (!err->empty()) return 2;
      size_t start = 0;
      for (size_t k = 0; k <= val.size(); ++k)
        if (k == val.size() || val[k] == ',') {
          if (k > start) o->specs.push_back(val.substr(start, k - start));
          start = k + 1;
        }
      if (val.find_first_not_of(", ") == std::string::npos) bad("--route");
    } else if (value("--burst")) {
      if (err->empty() && !parse_int(val.c_str(), 1, &o->burst)) bad("--burst (at least 1)");
    } else if (value("--order")) {
      if (!err->empty()) return 2;
      if (val == "interleaved") o->interleaved = true;
      else if (val == "sequential") o->interleaved = false;
      else bad("--order");
    } else if (value("--check")) {
      if (!err->empty()) return 2;
      if (val == "last") o->check_all = false;
      else if (val == "all") o->check_all = true;
      else bad("--check");
    } else if (value("--csv")) {
      if (err->empty()) o->csv = val;
    } else if (value("--json")) {
      if (err->empty()) o->json = val;
    } else {
      *err = "unknown option '" + std::string(argv[i]) + "'";
    }
    if (!err->empty()) return 2;
  }
  for (const std::string& s : o->specs)
    if (s.find_first_of(" \t\"") != std::string::npos || s.front() == ':')
      return *err = "bad route spec '" + s + "'", 2;
  if (o->specs.empty()) o->specs.push_back("table");
  if (o->min_bytes == 0) o->min_bytes = 1;
  if (o->min_bytes > o->max_bytes) return *err = "--min-bytes is above --max-bytes", 2;
  if (o->stream && !o->device) return *err = "--stream needs --mem device", 2;
  if (o->append && o->csv.empty()) return *err = "--append needs --csv FILE", 2;
  if (o->burst && o->coll != Coll::allreduce) return *err = "--burst needs --coll allreduce", 2;
  return 0;
}

// ---------------------------------------------------------------------------------------
// The benchmark

// One size of the sweep.
struct Point {
  uint64_t bytes = 0;   // CallKey::bytes
  int count = 0;        // the count argument of the call
  size_t send_elems = 0, recv_elems = 0;
};

std::vector<Point> sweep(const Options& o, int p, std::vector<std::string>* notes) {
  const uint64_t ts = static_cast<uint64_t>(type_info(o.dtype).size);
  const uint64_t up = static_cast<uint64_t>(p);
  std::vector<Point> out;
  for (uint64_t b = o.min_bytes;; b *= o.factor) {
    uint64_t count;  // the call's count
    Point pt;
    switch (o.coll) {
      case Coll::allreduce:
      case Coll::reduce:
      case Coll::bcast:
        count = b / ts;
        pt.bytes = count * ts;
        pt.send_elems = o.coll == Coll::bcast ? 0 : count;
        pt.recv_elems = count;
        break;
      default:
        count = b / ts / up;
        pt.bytes = count * ts * up;
        pt.send_elems = o.coll == Coll::allgather ? count : count * up;
        pt.recv_elems = o.coll == Coll::reduce_scatter_block ? count : count * up;
        break;
    }
    if (count > static_cast<uint64_t>(INT_MAX)) {
      notes->push_back("size " + std::to_string(b) + " B skipped: its count does not fit an int");
    } else if (count > 0 && (out.empty() || out.back().bytes != pt.bytes)) {
      pt.count = static_cast<int>(count);
      out.push_back(pt);
    }
    if (b > o.max_bytes / o.factor) break;
  }
  return out;
}

struct Row {
  std::string spec, route, taken;
  std::string rule = "-";  // the route with its parameters the last timed call took
  uint64_t bytes = 0, count = 0;
  int iters = 0;
  double min_us = 0, median_us = 0, max_us = 0, host_us = 0, algbw = 0, busbw = 0;
  bool valid = false;
};

struct Bench {
  Options opt;
  TypeInfo ti = kTypes[0];
  MPI_Datatype type = MPI_DATATYPE_NULL;
  MPI_Op op = MPI_OP_NULL;
  int rank = 0, size = 1, nodes = 1, ppn = 1;
  GetStats get = nullptr;
  LastRoute last_route = nullptr;
  bool stats_on = false;
  std::vector<MPI_Comm> comms;  // one per spec

  void* send = nullptr;  // the call's buffers (device memory with --mem device)
  void* recv = nullptr;
  void* stage = nullptr;  // device: host memory for writing inputs and reading results
  size_t send_cap = 0, recv_cap = 0;
#if STREAMCOLL_HAVE_CUDA
  cudaStream_t s = nullptr;
#endif

  int fail_lines = 0;
  bool row_bad = false;  // this rank saw a wrong result or a failed call in this row
  int failed = 0;        // ... in any row

  FILE* csv = nullptr;       // rank 0
  std::vector<Row> rows;     // rank 0, for --json and the summary

  // --- memory -------------------------------------------------------------------------
  bool allocate() {
    const size_t send_bytes = std::max<size_t>(send_cap, 1), recv_bytes = std::max<size_t>(recv_cap, 1);
    if (!opt.device) {
      send = std::malloc(send_bytes);
      recv = std::malloc(recv_bytes);
      return send && recv;
    }
#if STREAMCOLL_HAVE_CUDA
    if (cudaMalloc(&send, send_bytes) != cudaSuccess) return false;
    if (cudaMalloc(&recv, recv_bytes) != cudaSuccess) return false;
    if (cudaMallocHost(&stage, std::max(send_bytes, recv_bytes)) != cudaSuccess) return false;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return true;
#else
    return false;
#endif
  }

  void release() {
    if (!opt.device) {
      std::free(send);
      std::free(recv);
      return;
    }
#if STREAMCOLL_HAVE_CUDA
    cudaFree(send);
    cudaFree(recv);
    cudaFreeHost(stage);
    if (s) cudaStreamDestroy(s);
#endif
  }

  // Writes n elements value(i) into buffer dst (send or recv).
  template <typename F>
  void write(void* dst, size_t n, F value) {
    if (!opt.device) {
      fill_elems(ti.t, dst, n, value);
      return;
    }
#if STREAMCOLL_HAVE_CUDA
    fill_elems(ti.t, stage, n, value);
    CUDA_OK(cudaMemcpyAsync(dst, stage, n * static_cast<size_t>(ti.size), cudaMemcpyHostToDevice, s));
    CUDA_OK(cudaStreamSynchronize(s));
#endif
  }

  // The receive buffer's first n elements, readable by the host.
  const void* read_recv(size_t n) {
    if (!opt.device) return recv;
    (void)n;
#if STREAMCOLL_HAVE_CUDA
    CUDA_OK(cudaMemcpy(stage, recv, n * static_cast<size_t>(ti.size), cudaMemcpyDeviceToHost));
#endif
    return stage;
  }

  // Poison in the receive buffer (not the root's bcast buffer: it holds the input).
  void poison(const Point& pt) {
    if (opt.coll == Coll::bcast && rank == 0) return;
    const int byte = ti.is_float ? 0xff : 0x80;
    const size_t n = pt.recv_elems * static_cast<size_t>(ti.size) *
                     static_cast<size_t>(std::max(opt.burst, 1));  // --burst: every slice
    if (!opt.device) {
      std::memset(recv, byte, n);
      return;
    }
#if STREAMCOLL_HAVE_CUDA
    CUDA_OK(cudaMemsetAsync(recv, byte, n, s));
    CUDA_OK(cudaStreamSynchronize(s));
#endif
  }

  // --- inputs and checks ----------------------------------------------------------------
  // Index of element j of the collective's data (see Model): what rank `rank` sends.
  void fill(const Model& m, const Point& pt) {
    const uint64_t n = static_cast<uint64_t>(pt.count), p = static_cast<uint64_t>(size);
    const uint64_t r = static_cast<uint64_t>(rank);
    switch (opt.coll) {
      case Coll::allreduce:
      case Coll::reduce:
      case Coll::reduce_scatter_block:  // element j of the p*n vector; rank r keeps block r
        write(send, pt.send_elems, [&](size_t i) { return m.input(i, rank); });
        break;
      case Coll::bcast:
        if (rank == 0) write(recv, pt.recv_elems, [&](size_t i) { return m.input(i, 0); });
        break;
      case Coll::allgather:  // rank r's block is elements r*n .. r*n+n-1 of the result
        write(send, pt.send_elems, [&](size_t i) { return m.input(r * n + i, rank); });
        break;
      case Coll::alltoall:  // rank r's send buffer is elements r*p*n .. of a p*p*n vector
        write(send, pt.send_elems, [&](size_t i) { return m.input(r * p * n + i, rank); });
        break;
    }
  }

  // Compares the receive buffer with the model; prints the first wrong element. `when`:
  // "first call", "a timed call" or "last call". True when right (or not significant on this rank).
  bool check(const Model& m, const Point& pt, const std::string& spec, const char* when) {
    if (opt.coll == Coll::reduce && rank != 0) return true;
    const uint64_t n = static_cast<uint64_t>(pt.count), p = static_cast<uint64_t>(size);
    const uint64_t r = static_cast<uint64_t>(rank);
    const void* got = read_recv(pt.recv_elems * static_cast<size_t>(std::max(opt.burst, 1)));
    std::string g, w;
    size_t bad = pt.recv_elems;
    switch (opt.coll) {
      case Coll::allreduce:
      case Coll::reduce:
        bad = first_mismatch(ti.t, got, pt.recv_elems, [&](size_t i) { return m.reduced(i); }, &g, &w);
        break;
      case Coll::reduce_scatter_block:
        bad = first_mismatch(ti.t, got, pt.recv_elems,
                             [&](size_t i) { return m.reduced(r * n + i); }, &g, &w);
        break;
      case Coll::bcast:
        bad = first_mismatch(ti.t, got, pt.recv_elems, [&](size_t i) { return m.input(i, 0); }, &g, &w);
        break;
      case Coll::allgather:
        bad = first_mismatch(ti.t, got, pt.recv_elems,
                             [&](size_t j) { return m.input(j, static_cast<int>(j / n)); }, &g, &w);
        break;
      case Coll::alltoall:  // block s of rank r's result: block r of rank s's send buffer
        bad = first_mismatch(ti.t, got, pt.recv_elems,
                             [&](size_t j) {
                               const uint64_t src = j / n;
                               return m.input(src * p * n + r * n + j % n, static_cast<int>(src));
                             },
                             &g, &w);
        break;
    }
    if (bad == pt.recv_elems) {
      // --burst: every call of the burst must have the first one's (checked) result
      const size_t slice = pt.recv_elems * static_cast<size_t>(ti.size);
      for (int j = 1; j < opt.burst; ++j)
        if (std::memcmp(static_cast<const char*>(got) + static_cast<size_t>(j) * slice, got, slice)) {
          report("FAIL: allreduce " + std::to_string(pt.bytes) + " B " + spec + " burst call " +
                 std::to_string(j) + " differs from call 0 (rank " + std::to_string(rank) + ", " +
                 when + ")");
          return false;
        }
      return true;
    }
    report("FAIL: " + std::string(coll_name(opt.coll)) + " " + std::to_string(pt.bytes) + " B " +
           spec + " element " + std::to_string(bad) + ": got " + g + " expected " + w + " (rank " +
           std::to_string(rank) + ", " + when + ")");
    return false;
  }

  void report(const std::string& line) {
    row_bad = true;
    failed = 1;
    if (fail_lines < kMaxFailLines)
      std::printf("%s\n", line.c_str());
    else if (fail_lines == kMaxFailLines)
      std::printf("FAIL: rank %d: further FAIL lines of this rank are not printed\n", rank);
    ++fail_lines;
    std::fflush(stdout);
  }

  // --- calls ----------------------------------------------------------------------------
  int call(MPI_Comm comm, int count) {
    if (opt.burst) {  // N MPI_Iallreduce into consecutive slices of recv, one MPI_Waitall
      std::vector<MPI_Request> reqs(static_cast<size_t>(opt.burst), MPI_REQUEST_NULL);
      const size_t slice = static_cast<size_t>(count) * static_cast<size_t>(ti.size);
      for (int j = 0; j < opt.burst; ++j)
        if (int rc = MPI_Iallreduce(send, static_cast<char*>(recv) + static_cast<size_t>(j) * slice,
                                    count, type, op, comm, &reqs[static_cast<size_t>(j)]);
            rc != MPI_SUCCESS) {
          MPI_Waitall(j, reqs.data(), MPI_STATUSES_IGNORE);
          return rc;
        }
      return MPI_Waitall(opt.burst, reqs.data(), MPI_STATUSES_IGNORE);
    }
    switch (opt.coll) {
      case Coll::allreduce: return MPI_Allreduce(send, recv, count, type, op, comm);
      case Coll::reduce: return MPI_Reduce(send, recv, count, type, op, 0, comm);
      case Coll::bcast: return MPI_Bcast(recv, count, type, 0, comm);
      case Coll::allgather: return MPI_Allgather(send, count, type, recv, count, type, comm);
      case Coll::reduce_scatter_block:
        return MPI_Reduce_scatter_block(send, recv, count, type, op, comm);
      case Coll::alltoall: return MPI_Alltoall(send, count, type, recv, count, type, comm);
    }
    return MPI_ERR_OTHER;
  }

  // One call after PMPI_Barrier: *lat the latency (device classic: synchronise the input
  // stream, then the call; --stream: the call, then synchronise the stream), *host the
  // time inside the call.
  void timed_call(MPI_Comm comm, const Point& pt, const std::string& spec, double* lat,
                  double* host) {
    PMPI_Barrier(MPI_COMM_WORLD);
    const double t0 = now_us();
#if STREAMCOLL_HAVE_CUDA
    if (opt.device && !opt.stream) CUDA_OK(cudaStreamSynchronize(s));
#endif
    const double c0 = now_us();
    const int rc = call(comm, pt.count);
    const double c1 = now_us();
#if STREAMCOLL_HAVE_CUDA
    if (opt.stream) CUDA_OK(cudaStreamSynchronize(s));
#endif
    const double t1 = now_us();
    *lat = t1 - t0;
    *host = c1 - c0;
    if (opt.burst) {  // per MPI_Iallreduce of the burst
      *lat /= opt.burst;
      *host /= opt.burst;
    }
    if (rc != MPI_SUCCESS) {
      char msg[MPI_MAX_ERROR_STRING] = "";
      int len = 0;
      MPI_Error_string(rc, msg, &len);
      report("FAIL: " + std::string(coll_name(opt.coll)) + " " + std::to_string(pt.bytes) + " B " +
             spec + ": the call returned " + msg + " (rank " + std::to_string(rank) + ")");
    }
  }

  // This process's calls of the collective per route (0 where unknown).
  using Counts = std::vector<unsigned long long>;
  Counts route_calls() {
    Counts c(num_routes(), 0);
    for (size_t i = 0; get && stats_on && i < num_routes(); ++i) {
      streamcoll_stat_t st{};
      if (get(opt.burst ? "iallreduce" : coll_name(opt.coll), routes()[i].c_str(),
              opt.device ? "device" : "host", &st) == 0)
        c[i] = st.calls;
    }
    return c;
  }

  int iters_for(uint64_t bytes) const {
    if (bytes <= kFullItersUpTo) return opt.iters;
    const double scale = static_cast<double>(kFullItersUpTo) / static_cast<double>(bytes);
    return std::max(std::min(opt.min_iters, opt.iters), static_cast<int>(opt.iters * scale));
  }
  int warmup_for(uint64_t bytes) const {
    if (bytes <= kFullItersUpTo) return opt.warmup;
    const double scale = static_cast<double>(kFullItersUpTo) / static_cast<double>(bytes);
    return std::max(std::min(opt.warmup, 2), static_cast<int>(opt.warmup * scale));
  }

  // The per-iteration record of one route at one size on this rank: latencies, then host
  // times, then [bad, used route 0..], reduced over the ranks with MAX by row().
  static std::vector<double> record(int iters) {
    return std::vector<double>(2 * static_cast<size_t>(iters) + 1 + num_routes(), 0.0);
  }

  // Route k's warm-up at one size: inputs written, receive buffer poisoned, the first call
  // checked, then the other warm-up calls. Adds the calls each route name got to *used.
  void warm_up(size_t k, const Model& m, const Point& pt, Counts* used) {
    const std::string& spec = opt.specs[k];
    double lat = 0, host = 0;
    // --burst: one blocking MPI_Allreduce of the size first. MPI_Iallreduce calls are
    // routed from what the last blocking call agreed, and a route that sets itself up
    // collectively (ht) does so only at a blocking call that it routes: as in an
    // application that calls both, the burst then finds it set up.
    if (opt.burst) MPI_Allreduce(send, recv, pt.count, type, op, comms[k]);
    fill(m, pt);
    poison(pt);
    const Counts before = route_calls();
    timed_call(comms[k], pt, spec, &lat, &host);  // the first warm-up call, checked
    check(m, pt, spec, "first call");
    for (int w = 1, warmup = warmup_for(pt.bytes); w < warmup; ++w)
      timed_call(comms[k], pt, spec, &lat, &host);
    const Counts after = route_calls();
    for (size_t i = 0; i < num_routes(); ++i) (*used)[i] += after[i] - before[i];
  }

  // Route k's row at one size from this rank's record t (see record(); bad and the used
  // routes filled in): reduced over the ranks (collective), the row on rank 0.
  Row row(size_t k, const Point& pt, std::vector<double>& t) {
    const std::string& spec = opt.specs[k];
    const size_t ni = (t.size() - 1 - num_routes()) / 2;
    std::vector<double> tmax(t.size(), 0.0);
    PMPI_Allreduce(t.data(), tmax.data(), static_cast<int>(t.size()), MPI_DOUBLE, MPI_MAX,
                   MPI_COMM_WORLD);

    Row row;
    row.spec = spec;
    row.route = table_syntax(spec);
    row.bytes = pt.bytes;
    row.count = static_cast<uint64_t>(pt.count);
    row.iters = static_cast<int>(ni);
    std::vector<double> l(tmax.begin(), tmax.begin() + static_cast<long>(ni));
    std::vector<double> h(tmax.begin() + static_cast<long>(ni), tmax.begin() + static_cast<long>(2 * ni));
    std::sort(l.begin(), l.end());
    row.min_us = l.front();
    row.max_us = l.back();
    row.median_us = median_of(l);
    row.host_us = median_of(h);
    row.algbw = row.median_us > 0 ? static_cast<double>(pt.bytes) / (row.median_us * 1e-6) / 1e9 : 0;
    row.busbw = row.algbw * bus_factor(opt.coll, size);
    row.valid = tmax[2 * ni] == 0;
    if (!row.valid) failed = 1;
    int used = 0;
    size_t which = 0;
    for (size_t i = 0; i < num_routes(); ++i)
      if (tmax[2 * ni + 1 + i] > 0) ++used, which = i;
    row.taken = used == 0 ? "-" : used > 1 ? "mixed" : routes()[which];
    return row;
  }

  // --order sequential: one route at one size, on every rank; the row on rank 0.
  Row measure(size_t k, const Point& pt) {
    const std::string& spec = opt.specs[k];
    MPI_Comm comm = comms[k];
    const Model m(opt.coll, opt.op, ti, size);
    const int iters = iters_for(pt.bytes);
    row_bad = false;

    Counts used(num_routes(), 0);
    warm_up(k, m, pt, &used);
    const Counts before = route_calls();
    const size_t ni = static_cast<size_t>(iters);
    std::vector<double> t = record(iters);
    for (size_t it = 0; it < ni; ++it) {
      const bool checked = opt.check_all || it + 1 == ni;
      if (checked) poison(pt);  // the checked call must write the whole result again
      timed_call(comm, pt, spec, &t[it], &t[ni + it]);
      if (checked && it + 1 < ni) check(m, pt, spec, "a timed call");
    }
    const std::string rule = last_rule();
    check(m, pt, spec, "last call");
    const Counts after = route_calls();
    t[2 * ni] = row_bad ? 1 : 0;
    for (size_t i = 0; i < num_routes(); ++i)
      t[2 * ni + 1 + i] = used[i] + (after[i] - before[i]) > 0;
    Row r = row(k, pt, t);
    r.rule = rule;
    return r;
  }

  // streamcoll_last_route after this rank's last call: "ht algo=rd"; "-" unknown.
  std::string last_rule() const {
    char buf[256];
    if (!last_route || last_route(buf, sizeof buf) < 0) return "-";
    return buf;
  }

  // --order interleaved: every route at one size, on every rank; the rows (in the order of
  // the specs) on rank 0. Each route's warm-up in turn, then the timed iterations in
  // rounds: in round r the routes make one call each, in turn from route r mod R. The
  // receive buffer is shared, so it is poisoned before every route's last call and
  // checked right after it. The statistics are read around each route's own calls only
  // (the counters are per route name: ht:algo=rd and ht:algo=ring both count as "ht"),
  // and the differences summed per route.
  std::vector<Row> measure_interleaved(const Point& pt) {
    const size_t nr = opt.specs.size();
    const Model m(opt.coll, opt.op, ti, size);
    const int iters = iters_for(pt.bytes);
    const size_t ni = static_cast<size_t>(iters);
    std::vector<std::vector<double>> t(nr, record(iters));
    std::vector<Counts> used(nr, Counts(num_routes(), 0));
    std::vector<char> bad(nr, 0);  // this rank saw a wrong result or a failed call
    std::vector<std::string> rule(nr, "-");

    for (size_t k = 0; k < nr; ++k) {
      row_bad = false;
      warm_up(k, m, pt, &used[k]);
      bad[k] = row_bad;
    }
    for (size_t it = 0; it < ni; ++it) {
      const bool last = it + 1 == ni;
      for (size_t q = 0; q < nr; ++q) {
        const size_t k = (it + q) % nr;
        const std::string& spec = opt.specs[k];
        row_bad = false;
        const bool checked = last || opt.check_all;
        if (checked) poison(pt);  // the buffer holds another route's result, or this one's
        const Counts before = route_calls();
        timed_call(comms[k], pt, spec, &t[k][it], &t[k][ni + it]);
        const Counts after = route_calls();
        if (last) rule[k] = last_rule();
        if (checked) check(m, pt, spec, last ? "last call" : "a timed call");
        for (size_t i = 0; i < num_routes(); ++i) used[k][i] += after[i] - before[i];
        if (row_bad) bad[k] = 1;
      }
    }

    std::vector<Row> rows;
    for (size_t k = 0; k < nr; ++k) {
      t[k][2 * ni] = bad[k] ? 1 : 0;
      for (size_t i = 0; i < num_routes(); ++i) t[k][2 * ni + 1 + i] = used[k][i] > 0;
      rows.push_back(row(k, pt, t[k]));
      rows.back().rule = rule[k];
    }
    return rows;
  }
};

// ---------------------------------------------------------------------------------------
// Output (rank 0)

const char kCsvHeader[] =
    "coll,dtype,op,mem,stream,ranks,nodes,ppn,spec,route,taken,bytes,count,iters,"
    "min_us,median_us,max_us,host_us,algbw_GBps,busbw_GBps,valid,rule,burst";

struct Output {
  const Bench* b = nullptr;
  const char* op = "none";  // op column

  void csv_row(FILE* f, const Row& r) const {
    const Options& o = b->opt;
    std::fprintf(f, "%s,%s,%s,%s,%d,%d,%d,%d,%s,%s,%s,%llu,%llu,%d,%.3f,%.3f,%.3f,%.3f,%.6g,%.6g,%d,%s,%d\n",
                 coll_name(o.coll), b->ti.mpi, op, o.device ? "device" : "host", o.stream ? 1 : 0,
                 b->size, b->nodes, b->ppn, r.spec.c_str(), r.route.c_str(), r.taken.c_str(),
                 static_cast<unsigned long long>(r.bytes), static_cast<unsigned long long>(r.count),
                 r.iters, r.min_us, r.median_us, r.max_us, r.host_us, r.algbw, r.busbw,
                 r.valid ? 1 : 0, r.rule.c_str(), o.burst);
    std::fflush(f);
  }

  void table_header(size_t k) const {
    const Options& o = b->opt;
    const std::string& spec = o.specs[k];
    std::printf("\n# %s  dtype %s  op %s  mem %s  stream %d  ranks %d  nodes %d  ppn %d\n",
                coll_name(o.coll), b->ti.opt, op, o.device ? "device" : "host", o.stream ? 1 : 0,
                b->size, b->nodes, b->ppn);
    if (o.burst)
      std::printf("# burst %d: each call is %d MPI_Iallreduce and one MPI_Waitall; times per "
                  "MPI_Iallreduce\n", o.burst, o.burst);
    if (spec == "table")
      std::printf("# route %zu/%zu: table (nothing forced: the tuning table in effect decides)\n",
                  k + 1, o.specs.size());
    else
      std::printf("# route %zu/%zu: %s (streamcoll_comm_set_route(dup, \"%s:%s\"))\n", k + 1,
                  o.specs.size(), spec.c_str(), coll_name(o.coll), spec.c_str());
    std::printf("%12s %11s %6s %11s %11s %11s %11s %9s %9s  %-11s %s\n", "size(B)", "count",
                "iters", "min_us", "median_us", "max_us", "host_us", "algbw", "busbw", "taken",
                "check");
  }

  void table_row(const Row& r) const {
    std::printf("%12llu %11llu %6d %11.2f %11.2f %11.2f %11.2f %9.4f %9.4f  %-11s %s\n",
                static_cast<unsigned long long>(r.bytes), static_cast<unsigned long long>(r.count),
                r.iters, r.min_us, r.median_us, r.max_us, r.host_us, r.algbw, r.busbw,
                r.taken.c_str(), r.valid ? "ok" : "FAIL");
    std::fflush(stdout);
  }

  bool write_json(const std::string& path, const std::string& command, const char* version,
                  const std::string& mpi, const std::string& hostname, const std::string& date) const {
    FILE* f = std::fopen(path.c_str(), "w");
    if (!f) return false;
    const Options& o = b->opt;
    std::string specs;
    for (const std::string& s : o.specs) specs += (specs.empty() ? "" : ", ") + json_string(s);
    std::fprintf(f, "{\n  \"meta\": {\n");
    std::fprintf(f, "    \"coll\": %s, \"dtype\": %s, \"op\": %s, \"mem\": %s, \"stream\": %d,\n",
                 json_string(coll_name(o.coll)).c_str(), json_string(b->ti.mpi).c_str(),
                 json_string(op).c_str(), json_string(o.device ? "device" : "host").c_str(),
                 o.stream ? 1 : 0);
    std::fprintf(f, "    \"ranks\": %d, \"nodes\": %d, \"ppn\": %d, \"burst\": %d,\n", b->size,
                 b->nodes, b->ppn, o.burst);
    std::fprintf(f, "    \"specs\": [%s],\n", specs.c_str());
    std::fprintf(f,
                 "    \"min_bytes\": %llu, \"max_bytes\": %llu, \"factor\": %llu, \"warmup\": %d, "
                 "\"iters\": %d, \"min_iters\": %d, \"order\": %s,\n",
                 static_cast<unsigned long long>(o.min_bytes),
                 static_cast<unsigned long long>(o.max_bytes),
                 static_cast<unsigned long long>(o.factor), o.warmup, o.iters, o.min_iters,
                 json_string(o.interleaved ? "interleaved" : "sequential").c_str());
    std::fprintf(f, "    \"statistics\": %s, \"streamcoll\": %s,\n", b->stats_on ? "true" : "false",
                 version ? json_string(version).c_str() : "null");
    std::fprintf(f, "    \"mpi\": %s, \"host\": %s, \"date\": %s,\n", json_string(mpi).c_str(),
                 json_string(hostname).c_str(), json_string(date).c_str());
    std::fprintf(f, "    \"command\": %s\n  },\n  \"results\": [", json_string(command).c_str());
    for (size_t i = 0; i < b->rows.size(); ++i) {
      const Row& r = b->rows[i];
      std::fprintf(f,
                   "%s\n    {\"spec\": %s, \"route\": %s, \"taken\": %s, \"bytes\": %llu, "
                   "\"count\": %llu, \"iters\": %d, \"min_us\": %s, \"median_us\": %s, "
                   "\"max_us\": %s, \"host_us\": %s, \"algbw_GBps\": %s, \"busbw_GBps\": %s, "
                   "\"valid\": %s, \"rule\": %s}",
                   i ? "," : "", json_string(r.spec).c_str(), json_string(r.route).c_str(),
                   json_string(r.taken).c_str(), static_cast<unsigned long long>(r.bytes),
                   static_cast<unsigned long long>(r.count), r.iters, json_us(r.min_us).c_str(),
                   json_us(r.median_us).c_str(), json_us(r.max_us).c_str(),
                   json_us(r.host_us).c_str(), json_number(r.algbw).c_str(),
                   json_number(r.busbw).c_str(), r.valid ? "true" : "false",
                   json_string(r.rule).c_str());
    }
    std::fprintf(f, "\n  ]\n}\n");
    return std::fclose(f) == 0;
  }
};

// Opens --csv FILE on rank 0 (appending with --append). Empty string, or why not.
std::string open_csv(const Options& o, FILE** out) {
  bool header = true;
  if (o.append) {
    if (FILE* f = std::fopen(o.csv.c_str(), "r")) {
      char line[4096] = "";
      if (std::fgets(line, sizeof line, f)) {
        std::string first(line);
        while (!first.empty() && (first.back() == '\n' || first.back() == '\r')) first.pop_back();
        if (first != kCsvHeader) {
          std::fclose(f);
          return o.csv + " does not start with sc_bench's CSV header; not appending to it";
        }
        header = false;
      }
      std::fclose(f);
    }
  }
  *out = std::fopen(o.csv.c_str(), o.append ? "a" : "w");
  if (!*out) return "cannot write " + o.csv + ": " + std::strerror(errno);
  if (header) std::fprintf(*out, "%s\n", kCsvHeader);
  std::fflush(*out);
  return "";
}

// The run's progress on stderr (rank 0): a rewritten line on a terminal, else a line per
// slow size (every size with --progress).
struct Progress {
  bool on = false, tty = false, every = false;
  void show(const std::string& what) const {
    if (on && tty) std::fprintf(stderr, "\r%s\033[K", what.c_str());
  }
  void clear() const {
    if (on && tty) std::fprintf(stderr, "\r\033[K");
  }
  void done(const std::string& what, double seconds) const {
    if (on && !tty && (every || seconds > 2.0))
      std::fprintf(stderr, "%s: %.1f s\n", what.c_str(), seconds);
  }
};

// Leaves MPI with `code` on every rank (after freeing the communicators).
int finish(Bench& b, int code) {
  for (MPI_Comm& c : b.comms)
    if (c != MPI_COMM_NULL) PMPI_Comm_free(&c);
  MPI_Finalize();
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  // streamcoll reads its settings when MPI_Init starts it: statistics on unless the
  // environment says otherwise, so that the route each call took is known.
  const bool stats_in_env = std::getenv("STREAMCOLL_STATS") != nullptr;
  setenv("STREAMCOLL_STATS", "1", 0);
  // Routes with a progress thread (ht, blueconnect) need MPI_THREAD_MULTIPLE, which the
  // table cannot show streamcoll at MPI_Init when they are forced per communicator.
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  Bench b;
  MPI_Comm_rank(MPI_COMM_WORLD, &b.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &b.size);
  const int rank = b.rank;

  std::string err;
  const int parsed = parse_options(argc, argv, &b.opt, &err);
  if (parsed != 0) {
    if (rank == 0) {
      if (parsed == 1)
        std::printf("%s", kUsage);
      else
        std::fprintf(stderr, "sc_bench: %s\n%s", err.c_str(), kUsage);
    }
    return finish(b, parsed == 1 ? 0 : 2);
  }
  Options& opt = b.opt;
  b.ti = type_info(opt.dtype);
  b.type = mpi_type(opt.dtype);
  b.op = mpi_op(opt.op);
  Output out{&b, reduces(opt.coll) ? op_name(opt.op) : "none"};

  // streamcoll, found at run time.
  b.get = reinterpret_cast<GetStats>(dlsym(RTLD_DEFAULT, "streamcoll_get_stats"));
  b.last_route = reinterpret_cast<LastRoute>(dlsym(RTLD_DEFAULT, "streamcoll_last_route"));
  auto set_route = reinterpret_cast<SetRoute>(dlsym(RTLD_DEFAULT, "streamcoll_comm_set_route"));
  auto version_fn = reinterpret_cast<Version>(dlsym(RTLD_DEFAULT, "streamcoll_version"));
  const char* version = version_fn ? version_fn() : nullptr;
  for (const std::string& spec : opt.specs)
    if (spec != "table" && !set_route) {
      if (rank == 0)
        std::fprintf(stderr,
                     "sc_bench: --route %s needs streamcoll (streamcoll_comm_set_route not "
                     "found): run with LD_PRELOAD=libstreamcoll.so (scripts/bench-coll.sh), or "
                     "use --route table\n",
                     spec.c_str());
      return finish(b, 2);
    }
  if (opt.stream && !streamcoll_stream_available()) {
    if (rank == 0)
      std::fprintf(stderr, "sc_bench: --stream needs streamcoll loaded and enabled (the stream "
                           "attribute is not available)\n");
    return finish(b, 2);
  }

  // Layout: nodes = MPI_COMM_TYPE_SHARED groups, ppn = the largest.
  MPI_Comm local;
  PMPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
  int local_rank = 0, local_size = 1;
  PMPI_Comm_rank(local, &local_rank);
  PMPI_Comm_size(local, &local_size);
  PMPI_Comm_free(&local);
  const int leader = local_rank == 0;
  PMPI_Allreduce(&leader, &b.nodes, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  PMPI_Allreduce(&local_size, &b.ppn, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);

  // One private communicator per route, the route forced on it.
  for (const std::string& spec : opt.specs) {
    MPI_Comm c = MPI_COMM_NULL;
    PMPI_Comm_dup(MPI_COMM_WORLD, &c);
    b.comms.push_back(c);
    if (spec == "table") continue;
    const std::string full = std::string(coll_name(opt.coll)) + ":" + spec;
    const int rc = set_route(c, full.c_str());
    if (!all_min(rc == MPI_SUCCESS)) {
      if (rank == 0)
        std::fprintf(stderr, "sc_bench: streamcoll_comm_set_route(dup, \"%s\") failed (%d)%s\n",
                     full.c_str(), rc,
                     rc == MPI_ERR_ARG ? ": the spec does not parse (reason above)"
                     : rc == MPI_ERR_OTHER ? ": streamcoll is disabled" : "");
      return finish(b, 2);
    }
  }

  // --burst: MPI_Iallreduce calls are routed from the facts the ranks agreed at the last
  // blocking call on the communicator (shim/dispatch.cpp), and fusion's queue is made there:
  // one MPI_Allreduce per route's communicator first (the bench's own calls are PMPI_).
  if (opt.burst)
    for (MPI_Comm c : b.comms) {
      int one = 1, sum = 0;
      MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, c);
    }

  // Device buffers need a GPU on every rank.
  if (opt.device) {
#if STREAMCOLL_HAVE_CUDA
    const std::string why = gpu_unusable(local_rank);
    if (!all_min(why.empty())) {
      if (rank == 0)
        std::printf("SKIP: no usable GPU (%s)\n", why.empty() ? "another rank has none" : why.c_str());
      return finish(b, 77);
    }
#else
    if (rank == 0) std::printf("SKIP: no usable GPU (built without the CUDA toolkit)\n");
    return finish(b, 77);
#endif
  }

  // Sizes and buffers.
  std::vector<std::string> notes;
  const std::vector<Point> points = sweep(opt, b.size, &notes);
  for (const Point& pt : points) {
    b.send_cap = std::max(b.send_cap, pt.send_elems * static_cast<size_t>(b.ti.size));
    b.recv_cap = std::max(b.recv_cap, pt.recv_elems * static_cast<size_t>(b.ti.size) *
                                          static_cast<size_t>(std::max(b.opt.burst, 1)));
  }
  if (!all_min(b.allocate())) {
    if (rank == 0)
      std::fprintf(stderr, "sc_bench: cannot allocate %s + %s of %s memory on some rank: lower "
                           "--max-bytes\n",
                   human(b.send_cap).c_str(), human(b.recv_cap).c_str(),
                   opt.device ? "device" : "host");
    return finish(b, 2);
  }
#if STREAMCOLL_HAVE_CUDA
  if (opt.stream) {
    for (MPI_Comm c : b.comms) {
      const int rc = streamcoll_comm_attach_stream(c, b.s);
      if (!all_min(rc == MPI_SUCCESS)) {
        if (rank == 0) std::fprintf(stderr, "sc_bench: streamcoll_comm_attach_stream failed (%d)\n", rc);
        b.release();
        return finish(b, 2);
      }
    }
  }
#endif

  // Output files (rank 0); every rank learns whether they opened.
  int files_ok = 1;
  if (rank == 0) {
    if (!opt.csv.empty()) err = open_csv(opt, &b.csv);
    if (err.empty() && !opt.json.empty()) {
      FILE* f = std::fopen(opt.json.c_str(), "a");  // writable? (written at the end)
      if (!f) err = "cannot write " + opt.json + ": " + std::strerror(errno);
      else std::fclose(f);
    }
    if (!err.empty()) {
      std::fprintf(stderr, "sc_bench: %s\n", err.c_str());
      files_ok = 0;
    }
  }
  PMPI_Bcast(&files_ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (!files_ok) {
    b.release();
    return finish(b, 2);
  }

  // Statistics on? One call on a private duplicate must count.
  if (b.get) {
    MPI_Comm probe;
    PMPI_Comm_dup(MPI_COMM_WORLD, &probe);
    streamcoll_stat_t s0{}, s1{};
    b.get(nullptr, nullptr, nullptr, &s0);
    int x = 1, y = 0;
    MPI_Allreduce(&x, &y, 1, MPI_INT, MPI_SUM, probe);
    b.get(nullptr, nullptr, nullptr, &s1);
    PMPI_Comm_free(&probe);
    b.stats_on = all_min(s1.calls > s0.calls) != 0;
  }

  // The run's header.
  std::string command, mpi, hostname = "?", date;
  for (int i = 0; i < argc; ++i) command += (i ? " " : "") + quote(argv[i]);
  {
    char v[MPI_MAX_LIBRARY_VERSION_STRING] = "";
    int len = 0;
    MPI_Get_library_version(v, &len);
    mpi = v;
    mpi = mpi.substr(0, mpi.find('\n'));
    while (!mpi.empty() && (mpi.back() == ',' || mpi.back() == ' ')) mpi.pop_back();
    char h[256] = "";
    if (gethostname(h, sizeof h - 1) == 0) hostname = h;
    char d[32] = "";
    const std::time_t now = std::time(nullptr);
    std::strftime(d, sizeof d, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    date = d;
  }
  if (rank == 0) {
    std::printf("# sc_bench: %s\n", command.c_str());
    std::printf("# %d ranks, %d node(s), at most %d per node; %s; MPI: %s; %s\n", b.size, b.nodes,
                b.ppn, hostname.c_str(), mpi.c_str(), date.c_str());
    const char* preload = std::getenv("LD_PRELOAD");
    std::printf("# streamcoll: %s; LD_PRELOAD=%s\n", version ? version : "not loaded",
                preload ? preload : "(unset)");
    std::string env;
    for (char** e = environ; *e; ++e)
      if (!std::strncmp(*e, "STREAMCOLL_", 11) || !std::strncmp(*e, "NCCL_", 5) ||
          !std::strncmp(*e, "CUDA_VISIBLE_DEVICES=", 21))
        env += std::string(env.empty() ? "" : " ") + quote(*e) +
               (!stats_in_env && !std::strncmp(*e, "STREAMCOLL_STATS=", 17) ? " (set by sc_bench)" : "");
    std::printf("# environment: %s\n", env.empty() ? "(no STREAMCOLL_*, NCCL_* set)" : env.c_str());
    std::printf("# sizes %s .. %s (x%llu, %zu sizes; %s); --iters %d up to %s, then scaled "
                "down by size, at least %d; --warmup %d (scaled likewise)\n",
                human(opt.min_bytes).c_str(), human(opt.max_bytes).c_str(),
                static_cast<unsigned long long>(opt.factor), points.size(),
                opt.coll == Coll::allgather ? "size = receive buffer"
                : opt.coll == Coll::reduce_scatter_block || opt.coll == Coll::alltoall
                    ? "size = send buffer"
                    : "size = count x type size",
                opt.iters, human(kFullItersUpTo).c_str(), std::min(opt.min_iters, opt.iters),
                opt.warmup);
    std::printf("# latency: PMPI_Barrier, then the call%s; slowest rank per iteration; "
                "min/median/max over iterations; host_us: median time inside the call; "
                "algbw = size/median (GB/s); busbw = algbw x %.4g\n",
                !opt.device ? "" : opt.stream ? " + cudaStreamSynchronize(stream)"
                                              : " (after cudaStreamSynchronize of the inputs)",
                bus_factor(opt.coll, b.size));
    if (opt.interleaved && opt.specs.size() > 1)
      std::printf("# order: interleaved: per size, each route's warm-up, then the timed "
                  "iterations in rounds, one call per route each, round r from route r mod %zu; "
                  "the tables follow the last size\n",
                  opt.specs.size());
    else if (opt.interleaved)
      std::printf("# order: interleaved (one route: the calls of sequential); the table follows "
                  "the last size\n");
    else
      std::printf("# order: sequential: each route over all sizes, then the next route\n");
    std::printf("# taken: %s\n",
                !b.get ? "- (streamcoll not loaded)"
                : b.stats_on ? "from streamcoll_get_stats (STREAMCOLL_STATS=1)"
                             : "- (streamcoll counts nothing: STREAMCOLL_STATS=0 or "
                               "STREAMCOLL_DISABLE=1)");
    for (const std::string& n : notes) std::printf("# note: %s\n", n.c_str());
    if (points.empty()) std::printf("# no size gives one element per rank: nothing to run\n");
    std::fflush(stdout);
  }

  Progress progress;
  progress.on = rank == 0 && !opt.quiet;
  progress.tty = isatty(STDERR_FILENO) != 0;
  progress.every = opt.progress;

  // Rank 0: a measured row into the table (printed), the JSON rows and the counts.
  int bad_rows = 0;
  std::vector<std::string> declined;  // sizes where the forced route did not take the calls
  auto add_row = [&](size_t k, const Row& row) {
    out.table_row(row);
    if (!row.valid) ++bad_rows;
    if (opt.specs[k] != "table" && row.taken != "-" && row.taken != route_of(opt.specs[k]))
      declined.push_back(human(row.bytes) + (row.taken == "mixed" ? " (mixed)" : ""));
    b.rows.push_back(row);
  };
  // Rank 0: after a route's table, the note on the sizes it declined.
  auto end_table = [&](size_t k) {
    const std::string& spec = opt.specs[k];
    if (!declined.empty()) {
      std::string list;
      for (size_t i = 0; i < declined.size() && i < 8; ++i) list += (i ? ", " : "") + declined[i];
      if (declined.size() > 8) list += ", ...";
      std::printf("# note: route %s did not take the calls at %s (%s): it declined them, and "
                  "they went where 'taken' says\n",
                  route_of(spec).c_str(),
                  declined.size() == points.size()
                      ? "any size"
                      : (std::to_string(declined.size()) + " of " + std::to_string(points.size()) +
                         " sizes").c_str(),
                  list.c_str());
    }
    declined.clear();
    std::fflush(stdout);
  };
  auto size_what = [&](size_t j) {
    return std::string(coll_name(opt.coll)) + " " + human(points[j].bytes) + " (" +
           std::to_string(j + 1) + "/" + std::to_string(points.size()) + ")";
  };

  if (!opt.interleaved) {
    for (size_t k = 0; k < opt.specs.size() && !points.empty(); ++k) {
      if (rank == 0) out.table_header(k);
      for (size_t j = 0; j < points.size(); ++j) {
        const std::string what = "[route " + std::to_string(k + 1) + "/" +
                                 std::to_string(opt.specs.size()) + " " + opt.specs[k] + "] " +
                                 size_what(j);
        progress.show(what);
        const double t0 = now_us();
        Row row = b.measure(k, points[j]);
        if (rank != 0) continue;
        progress.clear();
        progress.done(what, (now_us() - t0) * 1e-6);
        if (b.csv) out.csv_row(b.csv, row);
        add_row(k, row);
      }
      if (rank == 0) end_table(k);
    }
  } else {
    // Every route per size; the tables (one per route, as above) after the last size.
    std::vector<std::vector<Row>> by_route(opt.specs.size());
    for (size_t j = 0; j < points.size(); ++j) {
      const std::string what = "[" + std::to_string(opt.specs.size()) + " route" +
                               (opt.specs.size() > 1 ? "s" : "") + ", interleaved] " +
                               size_what(j);
      progress.show(what);
      const double t0 = now_us();
      const std::vector<Row> rows = b.measure_interleaved(points[j]);
      if (rank != 0) continue;
      progress.clear();
      progress.done(what, (now_us() - t0) * 1e-6);
      for (size_t k = 0; k < rows.size(); ++k) {
        if (b.csv) out.csv_row(b.csv, rows[k]);
        by_route[k].push_back(rows[k]);
      }
    }
    for (size_t k = 0; k < opt.specs.size() && !points.empty() && rank == 0; ++k) {
      out.table_header(k);
      for (const Row& row : by_route[k]) add_row(k, row);
      end_table(k);
    }
  }
  progress.clear();

  if (b.csv) std::fclose(b.csv);
  int json_ok = 1;
  if (rank == 0 && !opt.json.empty() &&
      !out.write_json(opt.json, command, version, mpi, hostname, date)) {
    std::fprintf(stderr, "sc_bench: cannot write %s\n", opt.json.c_str());
    json_ok = 0;
  }
  const int all_ok = all_min(!b.failed);
  // --burst: what fusion did (streamcoll_fusion_counts), rank 0's count over all routes
  using FusionCounts = void (*)(unsigned long long*, unsigned long long*, unsigned long long*);
  if (auto counts = reinterpret_cast<FusionCounts>(dlsym(RTLD_DEFAULT, "streamcoll_fusion_counts"));
      counts && opt.burst && rank == 0) {
    unsigned long long calls = 0, messages = 0, agreements = 0;
    counts(&calls, &messages, &agreements);
    std::printf("\n# fusion (rank 0, all routes): %llu MPI_Iallreduce fused into %llu messages "
                "(%llu agreements)\n", calls, messages, agreements);
  }
  if (rank == 0) {
    if (all_ok)
      std::printf("\n# every result checked (%s of every route and size): ok\n",
                  opt.check_all ? "the first warm-up call and every timed call"
                                : "first and last call");
    else
      std::printf("\nFAIL: %d of %zu rows had a wrong result or a failed call (FAIL lines above)\n",
                  bad_rows, b.rows.size());
    std::fflush(stdout);
  }
#if STREAMCOLL_HAVE_CUDA
  if (opt.stream)
    for (MPI_Comm c : b.comms) streamcoll_comm_detach_stream(c);
#endif
  b.release();
  return finish(b, !all_ok ? 1 : json_ok ? 0 : 2);
}
