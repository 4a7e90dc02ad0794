// Shared by the GPU tests of the NCCL route and the stream attribute (nccl_route.cpp,
// shared_gpu_fallback.cpp, stream_semantics.cpp). Plain MPI + CUDA runtime, public
// streamcoll headers only; the programs run under LD_PRELOAD=libstreamcoll.so.
//
//   - stopping early: skip_if (one "SKIP: reason" line, exit 77 on every rank) and
//     fail_if (one "FAIL: reason" line, exit 1 on every rank), both collective;
//   - what the machine offers: a usable GPU, streamcoll loaded with statistics on, an
//     NCCL library that loads, an MPI that takes device buffers itself;
//   - which route ran a call: streamcoll_get_stats before and after (RouteProbe);
//   - the collective cases: the datatypes and ops, each rank's input computed from
//     (seed, rank, index) so that any rank computes any other rank's input, the host
//     reference result, the MPI call itself, and the comparison;
//   - Tally: checks passed, failed and skipped, and the closing summary line;
//   - Kernels: kernels.fatbin (built by nvcc) loaded with cudaLibraryLoadFromFile.
#pragma once

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <mpi.h>
#if defined(OPEN_MPI) && OPEN_MPI && __has_include(<mpi-ext.h>)
#include <mpi-ext.h>  // MPIX_Query_cuda_support
#endif

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "streamcoll/streamcoll.h"
#include "streamcoll/streamext.h"

namespace gputest {

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int world_size() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

inline bool env_true(const char* name) {
  const char* v = std::getenv(name);
  if (!v) return false;
  const std::string s(v);
  return s == "1" || s == "yes" || s == "true" || s == "on";
}

// ---------------------------------------------------------------------------------------
// Errors that end the test at once (a CUDA or MPI call that must not fail).

inline void cuda_ok(cudaError_t e, const char* what, const char* file, int line) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "FAIL [rank %d] %s:%d: %s: %s\n", world_rank(), file, line, what,
               cudaGetErrorString(e));
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
}
#define GT_CUDA(call) ::gputest::cuda_ok((call), #call, __FILE__, __LINE__)

inline void mpi_ok(int rc, const char* what, const char* file, int line) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  std::fprintf(stderr, "FAIL [rank %d] %s:%d: %s: %s\n", world_rank(), file, line, what, msg);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
}
#define GT_MPI(call) ::gputest::mpi_ok((call), #call, __FILE__, __LINE__)

// ---------------------------------------------------------------------------------------
// Stopping early, the same way on every rank. Collective over MPI_COMM_WORLD (through
// PMPI_, so that nothing here shows in streamcoll's statistics): when any rank has a
// reason, the lowest such rank prints it, and every rank finalises and exits.

inline void stop_if(const std::string& reason, const char* tag, int code) {
  const int rank = world_rank(), size = world_size();
  int mine = reason.empty() ? size : rank, first = size;
  PMPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (first == size) return;
  if (rank == first) {
    std::printf("%s: %s\n", tag, reason.c_str());
    std::fflush(stdout);
  }
  MPI_Finalize();
  std::exit(code);
}
/// Exit 77 (meson's "skipped") on every rank when any rank gives a reason.
inline void skip_if(const std::string& reason) { stop_if(reason, "SKIP", 77); }
/// Exit 1 on every rank when any rank gives a reason.
inline void fail_if(const std::string& reason) { stop_if(reason, "FAIL", 1); }

// ---------------------------------------------------------------------------------------
// What the machine offers.

/// Empty when this process sees a GPU and can make device `device` current
/// (device < 0: rank-th device, which must exist); else why not.
inline std::string gpu_unusable_reason(int device) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess)
    return std::string("no usable GPU (cudaGetDeviceCount: ") + cudaGetErrorString(e) + ")";
  if (n == 0) return "no usable GPU (no CUDA device)";
  if (device < 0) {
    if (world_size() > n)
      return "needs one GPU per rank: " + std::to_string(world_size()) + " ranks, " +
             std::to_string(n) + " GPU(s)";
    device = world_rank();
  }
  cudaError_t s = cudaSetDevice(device);
  if (s == cudaSuccess) s = cudaFree(nullptr);  // creates the context
  if (s != cudaSuccess)
    return "GPU " + std::to_string(device) + " is not usable (" + cudaGetErrorString(s) + ")";
  return "";
}

using StatsFn = int (*)(const char*, const char*, const char*, streamcoll_stat_t*);
inline StatsFn stats_fn() {
  static const StatsFn f = reinterpret_cast<StatsFn>(dlsym(RTLD_DEFAULT, "streamcoll_get_stats"));
  return f;
}

/// streamcoll must be in the process, with statistics on (they tell which route ran) and
/// the stream keyval available. Run by run.sh in preload mode (STREAMCOLL_EXPECT_INTERCEPT=1)
/// that is a failure; anywhere else a skip.
inline void require_streamcoll() {
  std::string why;
  if (!stats_fn())
    why = "streamcoll is not loaded in this process (run under LD_PRELOAD=libstreamcoll.so)";
  else if (!env_true("STREAMCOLL_STATS"))
    why = "STREAMCOLL_STATS=1 is not set: the route a call took cannot be seen";
  else if (!streamcoll_stream_available())
    why = "streamcoll does not offer the stream attribute (streamcoll_get_stream_keyval)";
  if (env_true("STREAMCOLL_EXPECT_INTERCEPT"))
    fail_if(why);
  else
    skip_if(why);
}

/// Empty when the NCCL library streamcoll will open (STREAMCOLL_NCCL_LIB, else
/// libnccl.so.2) loads here; else why not. `version` gets e.g. "2.28.3".
inline std::string nccl_unavailable_reason(std::string* version = nullptr) {
  const char* env = std::getenv("STREAMCOLL_NCCL_LIB");
  const std::string lib = env && *env ? env : "libnccl.so.2";
  void* h = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* err = dlerror();
    return "NCCL cannot be loaded (" + std::string(err ? err : lib.c_str()) + ")";
  }
  using VersionFn = int (*)(int*);
  auto get_version = reinterpret_cast<VersionFn>(dlsym(h, "ncclGetVersion"));
  int v = 0;
  if (!get_version || get_version(&v) != 0) return lib + " has no working ncclGetVersion";
  if (version)
    *version = std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
               std::to_string(v % 100);
  return "";  // left open: streamcoll opens the same library
}

/// Whether calls that go to the real MPI (route pmpi, and every fallback to it) may
/// carry device buffers here. streamcoll stages them through host memory when the MPI is
/// not CUDA-aware (core/host_staging), so they may, unless STREAMCOLL_MPI_CUDA_AWARE=yes
/// tells streamcoll to hand an MPI that is not CUDA-aware the device pointers.
/// STREAMCOLL_TEST_PMPI_DEVICE=1/0 overrides the answer. Empty when yes; else why not.
inline std::string pmpi_device_unsupported_reason() {
  if (const char* v = std::getenv("STREAMCOLL_TEST_PMPI_DEVICE"))
    return env_true("STREAMCOLL_TEST_PMPI_DEVICE")
               ? ""
               : std::string("STREAMCOLL_TEST_PMPI_DEVICE=") + v +
                     ": the real MPI call is not to be given device buffers";
#if defined(OMPI_HAVE_MPI_EXT_CUDA) && OMPI_HAVE_MPI_EXT_CUDA
  const char* aware = std::getenv("STREAMCOLL_MPI_CUDA_AWARE");
  if (aware && (std::string(aware) == "yes" || std::string(aware) == "1") &&
      !MPIX_Query_cuda_support())
    return "STREAMCOLL_MPI_CUDA_AWARE=yes, but this Open MPI is not CUDA-aware "
           "(MPIX_Query_cuda_support() = 0): device buffers would crash the real MPI call";
#endif
  return "";
}

// ---------------------------------------------------------------------------------------
// Checks and the summary.

class Tally {
 public:
  explicit Tally(std::string test) : test_(std::move(test)) {}

  /// Counts one check; on failure prints one line (the first 40 per rank).
  bool check(bool ok, const char* fmt, ...) __attribute__((format(printf, 3, 4))) {
    if (ok) {
      ++passed_;
      return true;
    }
    ++failed_;
    if (failed_ <= 40) {
      char msg[1024];
      va_list ap;
      va_start(ap, fmt);
      std::vsnprintf(msg, sizeof msg, fmt, ap);
      va_end(ap);
      std::fprintf(stderr, "FAIL [rank %d] %s: %s\n", world_rank(), test_.c_str(), msg);
      std::fflush(stderr);
    } else if (failed_ == 41) {
      std::fprintf(stderr, "FAIL [rank %d] %s: (further failures counted, not printed)\n",
                   world_rank(), test_.c_str());
    }
    return false;
  }

  /// Counts `n` checks not run, and says why (rank 0, once per call).
  void skip(long n, const std::string& why) {
    skipped_ += n;
    if (world_rank() == 0) std::printf("note: %ld checks not run: %s\n", n, why.c_str());
  }

  /// Rank 0 prints one line, checks summed over ranks; finalises MPI; the exit code.
  int finish() {
    long mine[3] = {passed_, failed_, skipped_}, all[3] = {0, 0, 0};
    PMPI_Allreduce(mine, all, 3, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (world_rank() == 0) {
      std::printf("%s (%d ranks): %ld checks passed, %ld failed, %ld not run\n", test_.c_str(),
                  world_size(), all[0], all[1], all[2]);
      if (all[0] == 0 && all[1] == 0) std::printf("%s: FAIL: no check ran\n", test_.c_str());
      std::fflush(stdout);
    }
    MPI_Finalize();
    return all[1] == 0 && all[0] > 0 ? 0 : 1;
  }

 private:
  std::string test_;
  long passed_ = 0, failed_ = 0, skipped_ = 0;
};

inline double now_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// ---------------------------------------------------------------------------------------
// Which route ran a call: this process's streamcoll counters, before and after.

/// The routes' names, asked of the streamcoll loaded here (streamcoll_route_name); none
/// without it.
inline const std::vector<std::string>& route_names() {
  static const std::vector<std::string> names = [] {
    using RouteName = const char* (*)(int);
    std::vector<std::string> v;
    auto fn = reinterpret_cast<RouteName>(dlsym(RTLD_DEFAULT, "streamcoll_route_name"));
    for (int i = 0; fn && fn(i); ++i) v.emplace_back(fn(i));
    return v;
  }();
  return names;
}

inline unsigned long long stat_calls(const char* coll, const char* route, const char* memory) {
  streamcoll_stat_t s{};
  if (!stats_fn() || stats_fn()(coll, route, memory, &s) != 0) return 0;
  return s.calls;
}

/// Snapshot of the counters of one collective name ("allreduce", "iallreduce"): route()
/// names the route that counted exactly one more call on device memory since, or says
/// what was counted instead.
class RouteProbe {
 public:
  explicit RouteProbe(std::string coll) : coll_(std::move(coll)), before_(take()) {}

  std::string route() const {
    const std::vector<unsigned long long> after = take();
    const size_t n = route_names().size();
    std::string hit;
    int moved = 0;
    for (size_t r = 0; r < n; ++r)
      if (after[r] != before_[r]) {
        ++moved;
        hit = route_names()[r];
        if (after[r] - before_[r] != 1) hit += "(" + std::to_string(after[r] - before_[r]) + " calls)";
      }
    if (moved == 1) return hit;
    if (moved > 1) return "several routes";
    const unsigned long long other = after[n] - before_[n];
    return other ? "not counted on device memory (" + std::to_string(other) +
                       " call(s) counted on another memory kind)"
                 : "not counted at all";
  }

 private:
  // Per route its device-memory calls, then every call of the collective.
  std::vector<unsigned long long> take() const {
    std::vector<unsigned long long> out;
    for (const std::string& r : route_names()) out.push_back(stat_calls(coll_.c_str(), r.c_str(), "device"));
    out.push_back(stat_calls(coll_.c_str(), nullptr, nullptr));
    return out;
  }
  std::string coll_;
  std::vector<unsigned long long> before_;
};

// ---------------------------------------------------------------------------------------
// Datatypes and ops, with host reference arithmetic.

enum class Kind { i8, u8, i16, u16, i32, u32, i64, u64, f32, f64, opaque };

template <class T>
constexpr Kind int_kind() {
  static_assert(std::is_integral_v<T>, "integers only");
  if constexpr (sizeof(T) == 1) return std::is_signed_v<T> ? Kind::i8 : Kind::u8;
  if constexpr (sizeof(T) == 2) return std::is_signed_v<T> ? Kind::i16 : Kind::u16;
  if constexpr (sizeof(T) == 4) return std::is_signed_v<T> ? Kind::i32 : Kind::u32;
  return std::is_signed_v<T> ? Kind::i64 : Kind::u64;
}

/// Calls f(T{}) with the C type of `k` (not for Kind::opaque).
template <class F>
void with_ctype(Kind k, F&& f) {
  switch (k) {
    case Kind::i8: f(int8_t{}); break;
    case Kind::u8: f(uint8_t{}); break;
    case Kind::i16: f(int16_t{}); break;
    case Kind::u16: f(uint16_t{}); break;
    case Kind::i32: f(int32_t{}); break;
    case Kind::u32: f(uint32_t{}); break;
    case Kind::i64: f(int64_t{}); break;
    case Kind::u64: f(uint64_t{}); break;
    case Kind::f32: f(float{}); break;
    case Kind::f64: f(double{}); break;
    case Kind::opaque: std::abort();
  }
}

struct Type {
  MPI_Datatype dt;
  const char* name;
  Kind kind;  ///< the C type for reductions; opaque: moved as bytes only
  size_t size() const {
    int s = 0;
    MPI_Type_size(dt, &s);
    return static_cast<size_t>(s);
  }
};
#define GT_TYPE(dt, kind) ::gputest::Type{dt, #dt, kind}

/// The datatypes NCCL reduces (through streamcoll's mapping by size and signedness).
inline std::vector<Type> nccl_reduction_types() {
  return {GT_TYPE(MPI_INT8_T, Kind::i8),
          GT_TYPE(MPI_SIGNED_CHAR, Kind::i8),
          GT_TYPE(MPI_UINT8_T, Kind::u8),
          GT_TYPE(MPI_UNSIGNED_CHAR, Kind::u8),
          GT_TYPE(MPI_INT, int_kind<int>()),
          GT_TYPE(MPI_INT32_T, Kind::i32),
          GT_TYPE(MPI_UNSIGNED, int_kind<unsigned>()),
          GT_TYPE(MPI_UINT32_T, Kind::u32),
          GT_TYPE(MPI_LONG, int_kind<long>()),
          GT_TYPE(MPI_LONG_LONG, int_kind<long long>()),
          GT_TYPE(MPI_INT64_T, Kind::i64),
          GT_TYPE(MPI_UNSIGNED_LONG, int_kind<unsigned long>()),
          GT_TYPE(MPI_UNSIGNED_LONG_LONG, int_kind<unsigned long long>()),
          GT_TYPE(MPI_UINT64_T, Kind::u64),
          GT_TYPE(MPI_FLOAT, Kind::f32),
          GT_TYPE(MPI_DOUBLE, Kind::f64)};
}

/// Further predefined contiguous types, which bcast/allgather/alltoall move as bytes.
inline std::vector<Type> byte_moved_types() {
  return {GT_TYPE(MPI_BYTE, Kind::opaque), GT_TYPE(MPI_CHAR, Kind::opaque),
          GT_TYPE(MPI_SHORT, Kind::opaque), GT_TYPE(MPI_C_DOUBLE_COMPLEX, Kind::opaque),
          GT_TYPE(MPI_LONG_DOUBLE, Kind::opaque)};
}

enum class OpKind { sum, prod, min, max, band, bor, bxor };
struct Op {
  MPI_Op op;
  const char* name;
  OpKind kind;
};
#define GT_OP(op, kind) ::gputest::Op{op, #op, OpKind::kind}

inline std::vector<Op> nccl_ops() {
  return {GT_OP(MPI_SUM, sum), GT_OP(MPI_PROD, prod), GT_OP(MPI_MIN, min), GT_OP(MPI_MAX, max)};
}

template <class T>
T apply(OpKind op, T a, T b) {
  switch (op) {
    case OpKind::sum: return static_cast<T>(a + b);
    case OpKind::prod: return static_cast<T>(a * b);
    case OpKind::min: return b < a ? b : a;
    case OpKind::max: return a < b ? b : a;
    default: break;
  }
  if constexpr (std::is_integral_v<T>) {
    switch (op) {
      case OpKind::band: return static_cast<T>(a & b);
      case OpKind::bor: return static_cast<T>(a | b);
      case OpKind::bxor: return static_cast<T>(a ^ b);
      default: break;
    }
  }
  std::abort();
}

// ---------------------------------------------------------------------------------------
// Inputs: a pure function of (seed, rank, index), so every rank can compute every other
// rank's contribution and the expected result without communicating.

inline uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
inline uint64_t hash(uint64_t seed, int rank, uint64_t i) {
  return mix(seed * 0xD1B54A32D192ED03ull + static_cast<uint64_t>(rank) * 0xABC98388FB8FAC03ull + i);
}

/// Element i of `rank`'s reduction input: small values, so that sums and products over a
/// few ranks are exact in every type (float included) and never overflow an 8-bit type;
/// negative values for signed types; full bit patterns for the bitwise ops.
template <class T>
T value(OpKind op, uint64_t seed, int rank, uint64_t i) {
  const uint64_t h = hash(seed, rank, i);
  constexpr bool is_signed = std::is_signed_v<T> || std::is_floating_point_v<T>;
  switch (op) {
    case OpKind::prod: {
      static const int kSigned[4] = {-2, -1, 1, 2};
      return static_cast<T>(is_signed ? kSigned[h & 3] : 1 + static_cast<int>(h % 3));
    }
    case OpKind::band:
    case OpKind::bor:
    case OpKind::bxor:
      return static_cast<T>(h);
    default:
      return static_cast<T>(is_signed ? static_cast<int>(h % 17) - 8 : static_cast<int>(h % 17));
  }
}

/// Bytes [offset, offset + n) of `rank`'s input for a data-moving collective.
inline void fill_bytes(void* dst, size_t n, uint64_t seed, int rank, size_t offset) {
  auto* p = static_cast<unsigned char*>(dst);
  for (size_t j = 0; j < n;) {
    const size_t b = offset + j;
    const uint64_t h = hash(seed, rank, b / 8);
    for (size_t k = b % 8; k < 8 && j < n; ++k, ++j) p[j] = static_cast<unsigned char>(h >> (8 * k));
  }
}

/// Elements [first, first + n) of `rank`'s reduction input.
inline void fill_values(void* dst, const Type& t, OpKind op, uint64_t seed, int rank,
                        size_t first, size_t n) {
  with_ctype(t.kind, [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(dst);
    for (size_t i = 0; i < n; ++i) p[i] = value<T>(op, seed, rank, first + i);
  });
}

/// Elements [first, first + n) of the reduction over ranks 0..nranks-1 (rank order).
inline void fill_reduced(void* dst, const Type& t, OpKind op, uint64_t seed, int nranks,
                         size_t first, size_t n) {
  with_ctype(t.kind, [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(dst);
    for (size_t i = 0; i < n; ++i) {
      T acc = value<T>(op, seed, 0, first + i);
      for (int q = 1; q < nranks; ++q) acc = apply(op, acc, value<T>(op, seed, q, first + i));
      p[i] = acc;
    }
  });
}

// ---------------------------------------------------------------------------------------
// A collective case: the call, its buffers' contents before, the expected result.

enum class Coll { allreduce, reduce, bcast, allgather, reduce_scatter_block, alltoall };
inline const char* coll_name(Coll c) {
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
/// "Allreduce" as in MPI_Allreduce / MPI_Iallreduce.
inline const char* mpi_name(Coll c) {
  switch (c) {
    case Coll::allreduce: return "Allreduce";
    case Coll::reduce: return "Reduce";
    case Coll::bcast: return "Bcast";
    case Coll::allgather: return "Allgather";
    case Coll::reduce_scatter_block: return "Reduce_scatter_block";
    case Coll::alltoall: return "Alltoall";
  }
  return "?";
}
inline bool reduces(Coll c) {
  return c == Coll::allreduce || c == Coll::reduce || c == Coll::reduce_scatter_block;
}
/// MPI allows MPI_IN_PLACE for every one of these but bcast.
inline bool has_in_place(Coll c) { return c != Coll::bcast; }

struct Case {
  Coll coll;
  Type type;
  Op op;  ///< reductions only
  size_t n;  ///< count: per rank (recvcount for reduce_scatter_block, per-peer for alltoall)
  bool nonblocking = false;
  bool in_place = false;
  uint64_t seed = 0;

  /// "allreduce", or "iallreduce": the name streamcoll's statistics use.
  std::string stat_name() const { return (nonblocking ? "i" : "") + std::string(coll_name(coll)); }
  std::string describe() const {
    std::string name = mpi_name(coll);
    if (nonblocking) name[0] = static_cast<char>(std::tolower(name[0]));
    std::string s = std::string(nonblocking ? "MPI_I" : "MPI_") + name + " " + type.name;
    if (reduces(coll)) s += std::string(" ") + op.name;
    s += " n=" + std::to_string(n);
    if (in_place) s += " in place";
    return s;
  }
};

constexpr int kRoot = 0;
constexpr unsigned char kSentinel = 0xA5;  // receive buffers before the call

/// Bytes of the send and receive buffers the case needs on one rank.
inline size_t send_bytes(const Case& c, int nranks) {
  const size_t block = c.n * c.type.size();
  return (c.coll == Coll::alltoall || c.coll == Coll::reduce_scatter_block) ? nranks * block : block;
}
inline size_t recv_bytes(const Case& c, int nranks) {
  const size_t block = c.n * c.type.size();
  switch (c.coll) {
    case Coll::allgather:
    case Coll::alltoall: return nranks * block;
    case Coll::reduce_scatter_block: return c.in_place ? nranks * block : block;
    default: return block;
  }
}

/// This rank's contribution (the whole send buffer's worth) into `dst`.
inline void fill_input(void* dst, const Case& c, int rank, int nranks) {
  const size_t bytes = send_bytes(c, nranks);
  if (reduces(c.coll))
    fill_values(dst, c.type, c.op.kind, c.seed, rank, 0, bytes / c.type.size());
  else
    fill_bytes(dst, bytes, c.seed, rank, 0);
}

/// What the send and receive buffers hold just before the call, host images of
/// send_bytes / recv_bytes each. With MPI_IN_PLACE the input is in the receive buffer.
inline void prepare(const Case& c, int rank, int nranks, void* send, void* recv) {
  const size_t block = c.n * c.type.size();
  std::memset(recv, kSentinel, recv_bytes(c, nranks));
  std::memset(send, 0x5A, send_bytes(c, nranks));
  const bool root = rank == kRoot;
  switch (c.coll) {
    case Coll::bcast:  // one buffer: the root's data, the others' to be overwritten
      if (root) fill_input(recv, c, rank, nranks);
      break;
    case Coll::allgather:
      if (c.in_place)
        fill_input(static_cast<char*>(recv) + rank * block, c, rank, nranks);
      else
        fill_input(send, c, rank, nranks);
      break;
    case Coll::reduce:  // MPI_IN_PLACE at the root only; the others send as usual
      fill_input(c.in_place && root ? recv : send, c, rank, nranks);
      break;
    default:
      fill_input(c.in_place ? recv : send, c, rank, nranks);
      break;
  }
}

/// The expected receive buffer (its first `*check` bytes are defined) on `rank`.
inline void expected(const Case& c, int rank, int nranks, void* want, size_t* check) {
  const size_t block = c.n * c.type.size();
  *check = 0;
  switch (c.coll) {
    case Coll::reduce:
      if (rank != kRoot) return;  // the receive buffer is not significant
      [[fallthrough]];
    case Coll::allreduce:
      fill_reduced(want, c.type, c.op.kind, c.seed, nranks, 0, c.n);
      *check = block;
      return;
    case Coll::reduce_scatter_block:
      fill_reduced(want, c.type, c.op.kind, c.seed, nranks, rank * c.n, c.n);
      *check = block;
      return;
    case Coll::bcast:
      fill_bytes(want, block, c.seed, kRoot, 0);
      *check = block;
      return;
    case Coll::allgather:
      for (int q = 0; q < nranks; ++q)
        fill_bytes(static_cast<char*>(want) + q * block, block, c.seed, q, 0);
      *check = nranks * block;
      return;
    case Coll::alltoall:  // block q comes from rank q's send block `rank`
      for (int q = 0; q < nranks; ++q)
        fill_bytes(static_cast<char*>(want) + q * block, block, c.seed, q, rank * block);
      *check = nranks * block;
      return;
  }
}

/// Starts (nonblocking) or runs the case's MPI call on device buffers.
inline int issue(const Case& c, const void* send, void* recv, MPI_Comm comm, MPI_Request* req) {
  const int n = static_cast<int>(c.n);
  const MPI_Datatype dt = c.type.dt;
  const MPI_Op op = c.op.op;
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  const void* s = c.in_place ? MPI_IN_PLACE : send;
  const bool nb = c.nonblocking;
  switch (c.coll) {
    case Coll::allreduce:
      return nb ? MPI_Iallreduce(s, recv, n, dt, op, comm, req)
                : MPI_Allreduce(s, recv, n, dt, op, comm);
    case Coll::reduce:
      if (c.in_place && rank != kRoot) s = send;
      return nb ? MPI_Ireduce(s, recv, n, dt, op, kRoot, comm, req)
                : MPI_Reduce(s, recv, n, dt, op, kRoot, comm);
    case Coll::bcast:
      return nb ? MPI_Ibcast(recv, n, dt, kRoot, comm, req) : MPI_Bcast(recv, n, dt, kRoot, comm);
    case Coll::allgather:
      return nb ? MPI_Iallgather(s, n, dt, recv, n, dt, comm, req)
                : MPI_Allgather(s, n, dt, recv, n, dt, comm);
    case Coll::reduce_scatter_block:
      return nb ? MPI_Ireduce_scatter_block(s, recv, n, dt, op, comm, req)
                : MPI_Reduce_scatter_block(s, recv, n, dt, op, comm);
    case Coll::alltoall:
      return nb ? MPI_Ialltoall(s, n, dt, recv, n, dt, comm, req)
                : MPI_Alltoall(s, n, dt, recv, n, dt, comm);
  }
  return MPI_ERR_OTHER;
}

/// Compares `check` bytes of `got` with `want`: by value for reductions (so that -0 and
/// +0 agree), bytewise otherwise. Empty when equal; else the first difference.
inline std::string compare(const Case& c, const void* got, const void* want, size_t check) {
  char msg[256];
  if (!reduces(c.coll)) {
    const auto* g = static_cast<const unsigned char*>(got);
    const auto* w = static_cast<const unsigned char*>(want);
    for (size_t j = 0; j < check; ++j)
      if (g[j] != w[j]) {
        std::snprintf(msg, sizeof msg, "byte %zu (element %zu): got 0x%02x, want 0x%02x", j,
                      j / c.type.size(), g[j], w[j]);
        return msg;
      }
    return "";
  }
  std::string out;
  with_ctype(c.type.kind, [&](auto tag) {
    using T = decltype(tag);
    const T* g = static_cast<const T*>(got);
    const T* w = static_cast<const T*>(want);
    for (size_t i = 0; i < check / sizeof(T); ++i)
      if (!(g[i] == w[i])) {
        if constexpr (std::is_floating_point_v<T>)
          std::snprintf(msg, sizeof msg, "element %zu: got %g, want %g", i, double(g[i]), double(w[i]));
        else if constexpr (std::is_signed_v<T>)
          std::snprintf(msg, sizeof msg, "element %zu: got %lld, want %lld", i, (long long)g[i],
                        (long long)w[i]);
        else
          std::snprintf(msg, sizeof msg, "element %zu: got %llu, want %llu", i,
                        (unsigned long long)g[i], (unsigned long long)w[i]);
        out = msg;
        return;
      }
  });
  return out;
}

// ---------------------------------------------------------------------------------------
// Device and pinned host buffers for the cases, of a fixed capacity.

struct Buffers {
  explicit Buffers(size_t capacity) : bytes(capacity) {
    for (void** d : {&d_send, &d_recv, &d_stage_send, &d_stage_recv, &d_check})
      GT_CUDA(cudaMalloc(d, bytes));
    for (void** h : {&h_send, &h_recv, &h_out}) GT_CUDA(cudaMallocHost(h, bytes));
    want.resize(bytes);
  }
  ~Buffers() {
    for (void* d : {d_send, d_recv, d_stage_send, d_stage_recv, d_check}) cudaFree(d);
    for (void* h : {h_send, h_recv, h_out}) cudaFreeHost(h);
  }
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;

  size_t bytes;
  void *d_send = nullptr, *d_recv = nullptr;  // the collective's buffers (cudaMalloc)
  void *h_send = nullptr, *h_recv = nullptr;  // their contents before the call (pinned)
  void* h_out = nullptr;                      // the receive buffer after the call (pinned)
  void *d_stage_send = nullptr, *d_stage_recv = nullptr;  // inputs, for copy kernels
  void* d_check = nullptr;                    // where a kernel copies the result to
  std::vector<unsigned char> want;            // the expected receive buffer
};

/// Compares the receive buffer read back into h_out with the expected one: empty when
/// equal, else the first difference; nothing when no byte of it is defined (MPI_Reduce
/// away from the root).
inline std::optional<std::string> verify(Buffers& b, const Case& c, int rank, int nranks) {
  size_t check = 0;
  expected(c, rank, nranks, b.want.data(), &check);
  if (check == 0) return std::nullopt;
  return compare(c, b.h_out, b.want.data(), check);
}

/// Runs case c once on `comm` with device buffers and checks it in t: the inputs go to the
/// device in stream order on `stream` (no host synchronisation before the call), or, with
/// a null stream (classic semantics), synchronously with the device synchronised; the call
/// (a non-blocking one then MPI_Wait); the receive buffer back into b.h_out, in stream
/// order or, classic, right after the call returns. Checks: MPI_SUCCESS, that the call ran
/// on `want_route` (streamcoll's statistics), and the result. Messages name the case and
/// `where`.
inline void run_device_case(Tally& t, Buffers& b, const Case& c, MPI_Comm comm,
                            cudaStream_t stream, int rank, int nranks, const char* want_route,
                            const std::string& where) {
  const size_t sb = send_bytes(c, nranks), rb = recv_bytes(c, nranks);
  prepare(c, rank, nranks, b.h_send, b.h_recv);
  if (stream) {
    GT_CUDA(cudaMemcpyAsync(b.d_send, b.h_send, sb, cudaMemcpyHostToDevice, stream));
    GT_CUDA(cudaMemcpyAsync(b.d_recv, b.h_recv, rb, cudaMemcpyHostToDevice, stream));
  } else {
    GT_CUDA(cudaMemcpy(b.d_send, b.h_send, sb, cudaMemcpyHostToDevice));
    GT_CUDA(cudaMemcpy(b.d_recv, b.h_recv, rb, cudaMemcpyHostToDevice));
    GT_CUDA(cudaDeviceSynchronize());
  }
  RouteProbe probe(c.stat_name());
  MPI_Request req = MPI_REQUEST_NULL;
  int rc = issue(c, b.d_send, b.d_recv, comm, &req);
  if (rc == MPI_SUCCESS && c.nonblocking) rc = MPI_Wait(&req, MPI_STATUS_IGNORE);
  const std::string route = probe.route();
  if (stream) {
    GT_CUDA(cudaMemcpyAsync(b.h_out, b.d_recv, rb, cudaMemcpyDeviceToHost, stream));
    GT_CUDA(cudaStreamSynchronize(stream));
  } else {
    GT_CUDA(cudaMemcpy(b.h_out, b.d_recv, rb, cudaMemcpyDeviceToHost));
  }
  const std::string d = c.describe();
  t.check(rc == MPI_SUCCESS, "%s [%s]: returned %d", d.c_str(), where.c_str(), rc);
  t.check(route == want_route, "%s [%s]: ran on %s, expected %s", d.c_str(), where.c_str(),
          route.c_str(), want_route);
  if (const auto diff = verify(b, c, rank, nranks))
    t.check(diff->empty(), "%s [%s]: wrong result: %s", d.c_str(), where.c_str(), diff->c_str());
}

// ---------------------------------------------------------------------------------------
// Kernels from kernels.fatbin (STREAMCOLL_TEST_KERNELS names the file).

class Kernels {
 public:
  /// The fatbin's path, or null when the build had no nvcc (then no kernel tests).
  static const char* path() {
    const char* p = std::getenv("STREAMCOLL_TEST_KERNELS");
    return p && *p ? p : nullptr;
  }

  /// Empty when loaded; else why not.
  std::string load() {
    if (!path()) return "STREAMCOLL_TEST_KERNELS (the path of kernels.fatbin) is not set";
    cudaError_t e = cudaLibraryLoadFromFile(&lib_, path(), nullptr, nullptr, 0, nullptr, nullptr, 0);
    if (e == cudaSuccess) e = cudaLibraryGetKernel(&spin_, lib_, "sc_spin");
    if (e == cudaSuccess) e = cudaLibraryGetKernel(&copy_, lib_, "sc_copy");
    if (e != cudaSuccess)
      return std::string("cannot load the kernels from ") + path() + ": " + cudaGetErrorString(e);
    return "";
  }

  /// Holds `stream` for `ms` milliseconds of GPU time.
  void spin(cudaStream_t stream, double ms) const {
    unsigned long long ns = static_cast<unsigned long long>(ms * 1e6);
    void* args[] = {&ns};
    GT_CUDA(cudaLaunchKernel(reinterpret_cast<const void*>(spin_), dim3(1), dim3(32), args, 0,
                             stream));
  }

  /// dst <- src, `bytes` bytes, by a kernel on `stream`.
  void copy(cudaStream_t stream, void* dst, const void* src, size_t bytes) const {
    if (bytes == 0) return;
    unsigned long long n = bytes;
    const unsigned blocks = static_cast<unsigned>(std::min<size_t>((bytes + 255) / 256, 2048));
    void* args[] = {&dst, &src, &n};
    GT_CUDA(cudaLaunchKernel(reinterpret_cast<const void*>(copy_), dim3(blocks), dim3(256), args,
                             0, stream));
  }

 private:
  cudaLibrary_t lib_ = nullptr;
  cudaKernel_t spin_ = nullptr, copy_ = nullptr;
};

/// Loads the kernels, or stops: skip when the build had none, fail when they do not load.
inline void require_kernels(Kernels& k) {
  skip_if(Kernels::path() ? "" : "built without nvcc: no kernels (STREAMCOLL_TEST_KERNELS unset)");
  fail_if(k.load());
}

/// Makes the case's input arrive late, on `stream`: the host images (prepare) go to the
/// staging buffers and the real buffers are poisoned, synchronously; then on `stream` a
/// kernel spins `spin_ms` and copy kernels write the real buffers. Nothing waits for
/// the stream: a collective that does not wait for it reads the poison.
inline void enqueue_late_input(Buffers& b, const Kernels& k, const Case& c, int rank, int nranks,
                               cudaStream_t stream, double spin_ms) {
  const size_t sb = send_bytes(c, nranks), rb = recv_bytes(c, nranks);
  prepare(c, rank, nranks, b.h_send, b.h_recv);
  GT_CUDA(cudaMemcpy(b.d_stage_send, b.h_send, sb, cudaMemcpyHostToDevice));
  GT_CUDA(cudaMemcpy(b.d_stage_recv, b.h_recv, rb, cudaMemcpyHostToDevice));
  GT_CUDA(cudaMemset(b.d_send, 0xEE, sb));
  GT_CUDA(cudaMemset(b.d_recv, 0xEE, rb));
  GT_CUDA(cudaDeviceSynchronize());
  k.spin(stream, spin_ms);
  k.copy(stream, b.d_send, b.d_stage_send, sb);
  k.copy(stream, b.d_recv, b.d_stage_recv, rb);
}

/// Reads the receive buffer in stream order: on `stream` a kernel copies it to d_check,
/// then d_check goes to h_out; waits for the stream.
inline void read_on_stream(Buffers& b, const Kernels& k, const Case& c, int nranks,
                           cudaStream_t stream) {
  const size_t rb = recv_bytes(c, nranks);
  k.copy(stream, b.d_check, b.d_recv, rb);
  GT_CUDA(cudaMemcpyAsync(b.h_out, b.d_check, rb, cudaMemcpyDeviceToHost, stream));
  GT_CUDA(cudaStreamSynchronize(stream));
}

}  // namespace gputest
