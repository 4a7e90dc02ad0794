// What the fake-driver route tests (nccl_route.cpp, ht_route.cpp, bc_route.cpp) share:
// pass/fail counting, the fakes' helpers and streamcoll's C API found with dlsym (the
// programs are plain MPI + dl, streamcoll preloaded), counters and statistics, and the
// value model: datatypes, ops, per-rank inputs and their reductions computed on the host.
// Included by one translation unit per program.
#pragma once

#include <dlfcn.h>
#include <mpi.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "fake_api.h"
#include "streamcoll/streamcoll.h"

namespace {

// ---- results ------------------------------------------------------------------------------

int g_pass = 0, g_fail = 0, g_rank = 0, g_size = 1;

inline bool check(bool ok, const std::string& what) {
  if (ok) {
    ++g_pass;
  } else {
    ++g_fail;
    if (g_fail <= 50) std::fprintf(stderr, "[rank %d] FAIL: %s\n", g_rank, what.c_str());
    if (g_fail == 50) std::fprintf(stderr, "[rank %d] (further failures not shown)\n", g_rank);
  }
  return ok;
}

// ---- the fakes and streamcoll, through dlsym ----------------------------------------------

struct Api {
  fake_cuda_malloc_fn malloc = nullptr;
  fake_cuda_malloc_device_fn malloc_device = nullptr;
  fake_cuda_malloc_managed_fn malloc_managed = nullptr;
  fake_cuda_malloc_pinned_fn malloc_pinned = nullptr;
  fake_cuda_free_fn free = nullptr;
  fake_cuda_runtime_init_fn runtime_init = nullptr;
  fake_cuda_runtime_fini_fn runtime_fini = nullptr;
  fake_cuda_stream_create_fn stream_create = nullptr;
  fake_cuda_stream_destroy_fn stream_destroy = nullptr;
  fake_cuda_stream_sync_fn stream_sync = nullptr;
  fake_cuda_pending_fn pending = nullptr;
  fake_cuda_enqueue_copy_fn enqueue_copy = nullptr;
  fake_cuda_enqueue_wait_fn enqueue_wait = nullptr;
  fake_cuda_host_access_fn host_access = nullptr;
  fake_cuda_deferred_fn deferred = nullptr;
  fake_cuda_counter_fn cuda_counter = nullptr;
  fake_cuda_sync_count_fn sync_count = nullptr;
  fake_nccl_calls_fn nccl_calls = nullptr;      // with the fake NCCL only
  fake_nccl_counter_fn nccl_counter = nullptr;  // with the fake NCCL only
  int (*get_stats)(const char*, const char*, const char*, streamcoll_stat_t*) = nullptr;
  int (*set_route)(MPI_Comm, const char*) = nullptr;
};
Api api;

template <class F>
inline bool sym(void* h, F& fn, const char* name) {
  fn = reinterpret_cast<F>(dlsym(h, name));
  if (!fn) std::fprintf(stderr, "[rank %d] %s not found\n", g_rank, name);
  return fn != nullptr;
}

/// Finds the fake driver's helpers (libcuda.so.1 must be the fake), with need_nccl the
/// fake NCCL's (STREAMCOLL_NCCL_LIB), and streamcoll's C API. False, with a message, when
/// something is missing.
inline bool load_api(bool need_nccl) {
  void* cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!cu) {
    std::fprintf(stderr, "[rank %d] libcuda.so.1: %s\n", g_rank, dlerror());
    return false;
  }
  bool ok = sym(cu, api.malloc, "fake_cuda_malloc") &&  // else: not the fake driver
            sym(cu, api.malloc_device, "fake_cuda_malloc_device") &&
            sym(cu, api.malloc_managed, "fake_cuda_malloc_managed") &&
            sym(cu, api.malloc_pinned, "fake_cuda_malloc_pinned") &&
            sym(cu, api.free, "fake_cuda_free") &&
            sym(cu, api.runtime_init, "fake_cuda_runtime_init") &&
            sym(cu, api.runtime_fini, "fake_cuda_runtime_fini") &&
            sym(cu, api.stream_create, "fake_cuda_stream_create") &&
            sym(cu, api.stream_destroy, "fake_cuda_stream_destroy") &&
            sym(cu, api.stream_sync, "fake_cuda_stream_sync") &&
            sym(cu, api.pending, "fake_cuda_pending") &&
            sym(cu, api.enqueue_copy, "fake_cuda_enqueue_copy") &&
            sym(cu, api.enqueue_wait, "fake_cuda_enqueue_wait") &&
            sym(cu, api.host_access, "fake_cuda_host_access") &&
            sym(cu, api.deferred, "fake_cuda_deferred") &&
            sym(cu, api.cuda_counter, "fake_cuda_counter") &&
            sym(cu, api.sync_count, "fake_cuda_sync_count");
  if (need_nccl) {
    const char* path = std::getenv("STREAMCOLL_NCCL_LIB");
    void* nc = path ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : nullptr;
    if (!nc) {
      std::fprintf(stderr, "[rank %d] STREAMCOLL_NCCL_LIB=%s: not loadable\n", g_rank,
                   path ? path : "(unset)");
      return false;
    }
    ok = ok && sym(nc, api.nccl_calls, "fake_nccl_calls") &&
         sym(nc, api.nccl_counter, "fake_nccl_counter");
  }
  return ok && sym(RTLD_DEFAULT, api.get_stats, "streamcoll_get_stats") &&
         sym(RTLD_DEFAULT, api.set_route, "streamcoll_comm_set_route");
}

/// The gate: a test holds a stream with its own host wait (fake_cuda_enqueue_wait), to
/// prove that a call does not wait for the stream; arm() opens it after a while, so that
/// a call that waits fails the test instead of hanging it.

class StreamGate {
 public:
  StreamGate() : flag_(static_cast<uint32_t*>(api.malloc_pinned(64))) {}
  ~StreamGate() { api.free(flag_); }
  // The stream stops here until open().
  bool close(struct CUstream_st* s) {
    __atomic_store_n(flag_, 0u, __ATOMIC_RELEASE);
    opened_by_watchdog_ = false;
    return api.enqueue_wait(s, flag_, 1) == 0;
  }
  void open() { __atomic_store_n(flag_, 1u, __ATOMIC_RELEASE); }
  // A thread that opens the gate after `seconds` unless disarm() comes first.
  void arm(double seconds) {
    armed_ = true;
    watchdog_ = std::thread([this, seconds] {
      const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
      while (armed_.load() && std::chrono::steady_clock::now() < end)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (armed_.load()) {
        opened_by_watchdog_ = true;
        open();
      }
    });
  }
  // True when the watchdog had to open it (the program was waiting for the stream).
  bool disarm() {
    armed_ = false;
    if (watchdog_.joinable()) watchdog_.join();
    return opened_by_watchdog_.load();
  }

 private:
  uint32_t* flag_;
  std::atomic<bool> armed_{false}, opened_by_watchdog_{false};
  std::thread watchdog_;
};

/// The fake driver's / fake NCCL's counter `name` (0 without the fake NCCL).
inline unsigned long long cu(const char* name) { return api.cuda_counter(name); }
inline unsigned long long nc(const char* name) { return api.nccl_counter ? api.nccl_counter(name) : 0; }

/// A stream's pending work, to tell later whether a call left work of its own pending there
/// (stream semantics: enqueued, the host not waiting). With deferred work the fake GPU also
/// runs, on its own, work queued for FAKE_CUDA_GPU_PROGRESS_MS (fake_cuda.cpp): where it did
/// between the two looks, the look cannot tell and holds (counter gpu_progress_executed).
struct PendingLook {
  CUstream_st* stream;
  int pending;
  unsigned long long gpu_ran;
};
inline PendingLook look_pending(CUstream_st* stream) {
  return {stream, api.pending(stream), cu("gpu_progress_executed")};
}
/// More work pending on the stream than at `before` (or the GPU ran some on its own since).
inline bool more_pending(const PendingLook& before) {
  return api.pending(before.stream) > before.pending ||
         cu("gpu_progress_executed") != before.gpu_ran;
}
/// At least as much pending, and some (or the GPU ran some on its own since).
inline bool still_pending(const PendingLook& before) {
  return (api.pending(before.stream) >= before.pending && api.pending(before.stream) > 0) ||
         cu("gpu_progress_executed") != before.gpu_ran;
}

/// streamcoll_get_stats' call count (null arguments: any), ~0 on error.
inline unsigned long long stat_calls(const char* coll, const char* route, const char* mem) {
  streamcoll_stat_t s{};
  if (api.get_stats(coll, route, mem, &s) != 0) return ~0ull;
  return s.calls;
}
inline unsigned long long stat_calls(const std::string& coll, const char* route, const char* mem) {
  return stat_calls(coll.c_str(), route, mem);
}

/// Whether `cond` holds now or within `seconds` (streamcoll's watchdog thread may hold the
/// last reference to a communicator's NCCL state for a moment, and abort asynchronously).
template <class F>
inline bool eventually(F cond, double seconds = 5) {
  for (int i = 0; i < static_cast<int>(seconds * 100); ++i) {
    if (cond()) return true;
    usleep(10000);
  }
  return cond();
}

// ---- datatypes, ops and reference values --------------------------------------------------

// Every C type a test may reduce or move; each test lists the MPI datatypes it covers.
enum class Tag { i8, u8, sc, uc, i16, shrt, ushrt, int_, uns, lng, ulng, ll, ull, i32, u32,
                 i64, u64, flt, dbl, byte };

struct TypeCase {
  const char* name;
  MPI_Datatype type;
  Tag tag;
};

/// Calls f with a value of the C type of `t`.
template <class F>
void with_type(Tag t, F&& f) {
  switch (t) {
    case Tag::i8: f(int8_t{}); break;
    case Tag::u8: f(uint8_t{}); break;
    case Tag::sc: f(static_cast<signed char>(0)); break;
    case Tag::uc: f(static_cast<unsigned char>(0)); break;
    case Tag::i16: f(int16_t{}); break;
    case Tag::shrt: f(short{}); break;
    case Tag::ushrt: f(static_cast<unsigned short>(0)); break;
    case Tag::int_: f(int{}); break;
    case Tag::uns: f(unsigned{}); break;
    case Tag::lng: f(long{}); break;
    case Tag::ulng: f(static_cast<unsigned long>(0)); break;
    case Tag::ll: f(static_cast<long long>(0)); break;
    case Tag::ull: f(static_cast<unsigned long long>(0)); break;
    case Tag::i32: f(int32_t{}); break;
    case Tag::u32: f(uint32_t{}); break;
    case Tag::i64: f(int64_t{}); break;
    case Tag::u64: f(uint64_t{}); break;
    case Tag::flt: f(float{}); break;
    case Tag::dbl: f(double{}); break;
    case Tag::byte: f(uint8_t{}); break;
  }
}

enum class Op { sum, prod, min, max, band };
struct OpCase {
  const char* name;
  MPI_Op op;
  Op kind;
};

/// The MPICH version of the MPI in use (major, minor); false for any other MPI.
/// (Callable before MPI_Init.)
inline bool mpich_version(int* major, int* minor) {
  char lib[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  int len = 0;
  if (MPI_Get_library_version(lib, &len) != MPI_SUCCESS) return false;
  const char* v = std::strstr(lib, "MPICH Version:");
  return v && std::sscanf(v + std::strlen("MPICH Version:"), " %d.%d", major, minor) == 2;
}

/// Whether the MPI reduces unsigned integers as signed in MAX and MIN: MPICH 4.0
/// (pmodels/mpich#6083). Routes pmpi and ht with algo=mpi hand the reduction to it, so
/// there the inputs below keep the top bit clear.
inline bool mpi_minmax_unsigned_as_signed() {
  static const bool broken = [] {
    int major = 0, minor = 0;
    return mpich_version(&major, &minor) && major == 4 && minor == 0;
  }();
  return broken;
}

/// Whether the MPI crashes on a blocking MPI_Reduce with MPI_IN_PLACE at a root other than
/// 0 (MPICH 4.0 and 4.1: pmodels/mpich#6540). streamcoll passes such a call on host
/// memory to it unchanged, so tests leave it out there.
inline bool mpi_in_place_reduce_off_root0_crashes() {
  static const bool broken = [] {
    int major = 0, minor = 0;
    return mpich_version(&major, &minor) && major == 4 && minor <= 1;
  }();
  return broken;
}

/// Rank `rank`'s element i: values whose reductions over up to 8 ranks are exact and in
/// range for every type, in any order (products of 8-bit types wrap, the same in every
/// order), with high parts that a 32-bit (or 8-bit) mistake would lose; unsigned values
/// with the top bit set for min/max (a signed comparison would order them first; not
/// under an MPI that makes that mistake itself); full bit patterns for BAND.
template <class T>
T gen(int rank, size_t i, Op op, unsigned salt) {
  constexpr bool is_signed = std::is_signed<T>::value;
  double unit = 0;  // the high part's unit
  if (std::is_floating_point<T>::value) unit = sizeof(T) == 8 ? 8589934592.0 : 1024.0;
  else if (sizeof(T) == 8) unit = 8589934592.0;
  else if (sizeof(T) == 4) unit = 1048576.0;
  const size_t r = static_cast<size_t>(rank);
  long long v = 0;
  switch (op) {
    case Op::prod: {
      const size_t k = (i * 5 + r * 3 + salt) % 3;
      v = k == 0 ? 1 : k == 1 ? 2 : (is_signed ? -1 : 1);
      return static_cast<T>(v);
    }
    case Op::sum:
      v = static_cast<long long>((i * 7 + r * 13 + salt) % 21) - (is_signed ? 10 : 0);
      return static_cast<T>(static_cast<double>(v) + unit * static_cast<double>((i + r) % 5));
    case Op::band:
      if constexpr (std::is_integral<T>::value) {
        uint64_t h = (i + 1) * 0x9E3779B97F4A7C15ull ^ (r + salt + 1) * 0xBF58476D1CE4E5B9ull;
        h ^= h >> 29;
        return static_cast<T>(h | (i % 7 == 0 ? ~uint64_t{0} >> 1 : 0));
      }
      [[fallthrough]];
    case Op::min:
    case Op::max: {
      v = static_cast<long long>((i * 37 + r * 101 + salt) % 200) - (is_signed ? 100 : 0);
      if constexpr (std::is_integral<T>::value && !is_signed && sizeof(T) == 1)
        if (mpi_minmax_unsigned_as_signed()) v %= 128;  // 8 bits: below the top bit too
      const double hi = static_cast<double>((i * 3 + r * 7 + salt) % 5) - (is_signed ? 2.0 : 0.0);
      T x = static_cast<T>(static_cast<double>(v) + unit * hi);
      if constexpr (std::is_integral<T>::value && !is_signed)
        if ((i + r + salt) % 3 == 0 && !mpi_minmax_unsigned_as_signed())
          x = static_cast<T>(x | (T{1} << (8 * sizeof(T) - 1)));
      return x;
    }
  }
  return T{};
}

template <class T>
T apply(Op op, T a, T b) {
  switch (op) {
    case Op::sum: return static_cast<T>(a + b);
    case Op::prod: return static_cast<T>(a * b);
    case Op::min: return b < a ? b : a;
    case Op::max: return a < b ? b : a;
    case Op::band:
      if constexpr (std::is_integral<T>::value) return static_cast<T>(a & b);
      return a;
  }
  return a;
}

template <class T>
std::vector<char> bytes_of(const std::vector<T>& v) {
  std::vector<char> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

/// Rank r's values at indices [0, n).
template <class T>
std::vector<T> inputs(int r, size_t n, Op op, unsigned salt) {
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = gen<T>(r, i, op, salt);
  return v;
}

/// The reduction over ranks 0..size-1, in rank order.
template <class T>
std::vector<T> reduced(int size, size_t n, Op op, unsigned salt) {
  std::vector<T> v = inputs<T>(0, n, op, salt);
  for (int r = 1; r < size; ++r)
    for (size_t i = 0; i < n; ++i) v[i] = apply(op, v[i], gen<T>(r, i, op, salt));
  return v;
}

/// Bytes for the byte movers (bcast, allgather, alltoall): rank's bytes [offset,
/// offset + bytes) of an endless pattern, for any datatype by its size.
inline std::vector<char> pattern(int rank, size_t offset, size_t bytes, unsigned salt) {
  std::vector<char> b(bytes);
  for (size_t i = 0; i < bytes; ++i) {
    const size_t j = offset + i;
    b[i] = static_cast<char>((rank + 1) * 131 + j * 7 + salt * 13 + (j >> 8));
  }
  return b;
}

/// The number of nodes (MPI_COMM_TYPE_SHARED groups) MPI_COMM_WORLD spans: more than one
/// on the test cluster (scripts/cluster.sh). Collective over MPI_COMM_WORLD.
inline int job_nodes() {
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
  int local_rank = 0, nodes = 0;
  MPI_Comm_rank(local, &local_rank);
  const int leader = local_rank == 0 ? 1 : 0;
  MPI_Allreduce(&leader, &nodes, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Comm_free(&local);
  return nodes;
}

inline int comm_rank(MPI_Comm c) {
  int r;
  MPI_Comm_rank(c, &r);
  return r;
}
inline int comm_size(MPI_Comm c) {
  int s;
  MPI_Comm_size(c, &s);
  return s;
}
inline int type_size(MPI_Datatype t) {
  int s = 0;
  MPI_Type_size(t, &s);
  return s;
}

}  // namespace
