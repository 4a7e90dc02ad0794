// Stream-ordered vs classic MPI_Allreduce on GPU buffers: what attaching a CUDA stream to
// the communicator (streamcoll/streamext.h) buys, per call, from 8 B to 64 MiB.
//
//   stream_latency [--min-bytes 8] [--max-bytes 64M] [--factor 4] [--iters 1000]
//                  [--warmup 100] [--batch 100] [--single 50]
//
// MPI_Allreduce(MPI_FLOAT, MPI_SUM), device buffers, out of place, at every size from
// --min-bytes multiplying by --factor, and at --max-bytes (K/M/G suffixes are binary;
// sizes are rounded down to whole floats): by default 8, 32, ..., 32M and 64M B. Each
// size is measured in two modes, in one run:
//
//   stream   a CUDA stream is attached to the communicator (streamcoll_comm_attach_stream):
//            the call enqueues the operation on the stream and returns.
//            host us/call  time for MPI_Allreduce itself to return (the enqueue cost),
//                          every call timed, calls back to back in batches of --batch;
//                          min/median/max over all timed calls.
//                          GOAL: median < 10 us at 8 B.
//            e2e us/call   per batch: time from the first call until cudaStreamSynchronize
//                          after the last returns, divided by the batch; median of batches.
//            single us     one call + cudaStreamSynchronize, median of --single samples.
//   classic  no stream attached (a second duplicate of MPI_COMM_WORLD): every call is
//            cudaStreamSynchronize(S) + MPI_Allreduce, the CUDA-aware MPI pattern; host
//            us/call is the whole pair, so it is also the end-to-end time per call.
//
// Baseline without streamcoll's GPU routes: run with STREAMCOLL_ROUTE=allreduce:pmpi (set in
// the environment; the attached stream is then synchronised before each call, inside
// streamcoll). Without streamcoll at all (no LD_PRELOAD) the stream mode is skipped.
//
// Calls per measurement: --iters and --warmup at sizes up to 1 MiB, scaled down by
// size above it (at least 20 timed calls and 5 warm-up calls). Ranks are lined up with
// PMPI_Barrier before every batch and single call; times are rank 0's. Every size and
// mode is validated, against sums computed on the host from the per-rank inputs, element
// by element: the measured calls' result (the receive buffer is poisoned before them),
// and one more call whose input upload, output poisoning and result copy-back are all
// enqueued on the stream around it (this one checks stream order; in classic mode the
// host synchronises before it). A wrong result fails the run (exit 1). The "calls"
// column counts warm-up, timed, single and that last call; the route column is what
// streamcoll_get_stats (found with dlsym; STREAMCOLL_STATS=1) counted for them (device
// memory allreduce), "n/a" when streamcoll is not loaded.
//
// Without a usable GPU it prints one "SKIP: no usable GPU (...)" line and exits 0.
#include <dlfcn.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
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

struct Options {
  unsigned long long min_bytes = 8, max_bytes = 64ull << 20, factor = 4;
  int iters = 1000, warmup = 100, batch = 100, single = 50;
};

bool parse_bytes(const char* s, unsigned long long* out) {
  char* end = nullptr;
  unsigned long long v = std::strtoull(s, &end, 10);
  if (end == s) return false;
  switch (*end) {
    case 'K': case 'k': v <<= 10; ++end; break;
    case 'M': case 'm': v <<= 20; ++end; break;
    case 'G': case 'g': v <<= 30; ++end; break;
    default: break;
  }
  if (*end == 'B' || *end == 'b') ++end;
  *out = v;
  return *end == '\0';
}

bool parse_int(const char* s, int* out) {
  char* end = nullptr;
  long v = std::strtol(s, &end, 10);
  if (end == s || *end != '\0' || v < 1 || v > 100000000) return false;
  *out = static_cast<int>(v);
  return true;
}

#if STREAMCOLL_HAVE_CUDA

void cuda_ok(cudaError_t e, const char* what, int line) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "stream_latency: %s failed (line %d): %s\n", what, line,
               cudaGetErrorString(e));
  MPI_Abort(MPI_COMM_WORLD, 1);
}
#define CUDA_OK(call) cuda_ok((call), #call, __LINE__)

using GetStats = int (*)(const char*, const char*, const char*, streamcoll_stat_t*);
// The routes' names, from the streamcoll loaded here (none without it).
const std::vector<std::string>& routes() {
  static const std::vector<std::string> names = bench::route_names();
  return names;
}

// streamcoll's device-memory allreduce counters, one per route (0 when unknown).
struct RouteCounts {
  std::vector<unsigned long long> calls = std::vector<unsigned long long>(routes().size(), 0);
};
RouteCounts route_counts(GetStats get) {
  RouteCounts c;
  for (size_t i = 0; get && i < routes().size(); ++i) {
    streamcoll_stat_t s{};
    if (get("allreduce", routes()[i].c_str(), "device", &s) == 0) c.calls[i] = s.calls;
  }
  return c;
}
// "nccl", or "nccl:98,pmpi:2" when calls took several routes; "n/a" without streamcoll,
// "-" when nothing was counted (STREAMCOLL_STATS not set).
std::string route_name(GetStats get, const RouteCounts& before, const RouteCounts& after,
                       unsigned long long calls_made) {
  if (!get) return "n/a";
  std::string out;
  unsigned long long total = 0;
  int used = 0;
  for (size_t i = 0; i < routes().size(); ++i) used += after.calls[i] > before.calls[i];
  for (size_t i = 0; i < routes().size(); ++i) {
    const unsigned long long d = after.calls[i] - before.calls[i];
    if (!d) continue;
    total += d;
    if (!out.empty()) out += ",";
    out += routes()[i];
    if (used > 1) out += ":" + std::to_string(d);
  }
  if (total == 0) return "-";
  if (total != calls_made)
    out += " (counted " + std::to_string(total) + " of " + std::to_string(calls_made) + ")";
  return out;
}

// Rank r's input element i at measurement `salt`: small integers, so sums are exact.
inline float input(size_t i, int r, unsigned salt) {
  return static_cast<float>((i + static_cast<size_t>(r) * 7 + salt) % 17 + static_cast<size_t>(r) + 1);
}

struct Result {
  std::vector<double> host;  // us per call, every timed call
  std::vector<double> e2e;   // us per call, per batch
  std::vector<double> single;
  unsigned long long calls = 0;
};

struct Bench {
  Options opt;
  int rank = 0, size = 1;
  cudaStream_t s = nullptr;
  MPI_Comm comm_stream = MPI_COMM_NULL, comm_classic = MPI_COMM_NULL;
  float *send = nullptr, *recv = nullptr, *host = nullptr;  // host: pinned, max size
  std::vector<float> want;
  GetStats get = nullptr;

  void call(MPI_Comm comm, int count) {
    const int rc = MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, comm);
    if (rc != MPI_SUCCESS) {
      std::fprintf(stderr, "stream_latency: MPI_Allreduce returned %d\n", rc);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }

  // One mode at one size: warm-up, batches (each call timed), single calls.
  Result measure(bool stream, int count, int iters, int warmup) {
    MPI_Comm comm = stream ? comm_stream : comm_classic;
    Result res;
    for (int i = 0; i < warmup; ++i) {
      if (!stream) CUDA_OK(cudaStreamSynchronize(s));
      call(comm, count);
    }
    CUDA_OK(cudaStreamSynchronize(s));
    res.calls += static_cast<unsigned long long>(warmup);
    res.host.reserve(static_cast<size_t>(iters));
    for (int done = 0; done < iters;) {
      const int b = std::min(opt.batch, iters - done);
      PMPI_Barrier(MPI_COMM_WORLD);
      const double t0 = now_us();
      for (int i = 0; i < b; ++i) {
        const double c0 = now_us();
        if (!stream) CUDA_OK(cudaStreamSynchronize(s));
        call(comm, count);
        res.host.push_back(now_us() - c0);
      }
      CUDA_OK(cudaStreamSynchronize(s));
      res.e2e.push_back((now_us() - t0) / b);
      done += b;
    }
    res.calls += static_cast<unsigned long long>(iters);
    const int singles = std::min(opt.single, iters);
    for (int i = 0; i < singles; ++i) {
      PMPI_Barrier(MPI_COMM_WORLD);
      const double t0 = now_us();
      if (!stream) CUDA_OK(cudaStreamSynchronize(s));
      call(comm, count);
      CUDA_OK(cudaStreamSynchronize(s));
      res.single.push_back(now_us() - t0);
    }
    res.calls += static_cast<unsigned long long>(singles);
    return res;
  }

  // Fills the pinned buffer with this rank's input for `salt` and `want` with the sums.
  void inputs(int count, unsigned salt) {
    const size_t n = static_cast<size_t>(count);
    for (size_t i = 0; i < n; ++i) {
      host[i] = input(i, rank, salt);
      float sum = 0;
      for (int r = 0; r < size; ++r) sum += input(i, r, salt);
      want[i] = sum;
    }
  }

  // Uploads the input for `salt` and poisons recv (NaN), synchronised: before measuring.
  void prepare(int count, unsigned salt) {
    inputs(count, salt);
    const size_t bytes = static_cast<size_t>(count) * sizeof(float);
    CUDA_OK(cudaMemcpyAsync(send, host, bytes, cudaMemcpyHostToDevice, s));
    CUDA_OK(cudaMemsetAsync(recv, 0xff, bytes, s));
    CUDA_OK(cudaStreamSynchronize(s));
  }

  // True when `host` holds the expected sums on every rank; reports the first difference.
  bool compare(int count, unsigned long long bytes, const char* mode, const char* what) {
    int ok = 1;
    for (size_t i = 0; i < static_cast<size_t>(count); ++i)
      if (!(host[i] == want[i])) {
        std::fprintf(stderr,
                     "stream_latency: rank %d: WRONG RESULT (%s) at %llu B, mode %s, element "
                     "%zu: %g, expected %g\n",
                     rank, what, bytes, mode, i, static_cast<double>(host[i]),
                     static_cast<double>(want[i]));
        ok = 0;
        break;
      }
    return all_min(ok) != 0;
  }

  // The measured calls' result, then one more call checked for stream order: its input
  // is uploaded and its output poisoned on the stream just before it, its result copied
  // back on the stream just after it; the host synchronises before the call only in
  // classic mode. A stream-mode call that did not wait for earlier work on the stream,
  // or that later work did not wait for, reads or leaves the wrong data.
  bool validate(bool stream, int count, unsigned long long bytes, unsigned salt) {
    const char* mode = stream ? "stream" : "classic";
    const size_t n = static_cast<size_t>(count) * sizeof(float);
    CUDA_OK(cudaMemcpyAsync(host, recv, n, cudaMemcpyDeviceToHost, s));
    CUDA_OK(cudaStreamSynchronize(s));
    if (!compare(count, bytes, mode, "measured calls")) return false;
    inputs(count, salt);
    CUDA_OK(cudaMemcpyAsync(send, host, n, cudaMemcpyHostToDevice, s));
    CUDA_OK(cudaMemsetAsync(recv, 0xff, n, s));
    if (!stream) CUDA_OK(cudaStreamSynchronize(s));
    call(stream ? comm_stream : comm_classic, count);
    CUDA_OK(cudaMemcpyAsync(host, recv, n, cudaMemcpyDeviceToHost, s));
    CUDA_OK(cudaStreamSynchronize(s));
    return compare(count, bytes, mode, "stream-order probe");
  }
};

// "" when this rank can use a GPU (selected: rank % devices), else why not.
std::string gpu_unusable(int rank) {
  int ndev = 0;
  cudaError_t e = cudaGetDeviceCount(&ndev);
  if (e != cudaSuccess) return std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
  if (ndev == 0) return "cudaGetDeviceCount: 0 devices";
  if ((e = cudaSetDevice(rank % ndev)) != cudaSuccess || (e = cudaFree(nullptr)) != cudaSuccess)
    return std::string("device ") + std::to_string(rank % ndev) + ": " + cudaGetErrorString(e);
  return "";
}
#endif

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    bool ok = v != nullptr;
    if (a == "--min-bytes" && ok) ok = parse_bytes(v, &opt.min_bytes);
    else if (a == "--max-bytes" && ok) ok = parse_bytes(v, &opt.max_bytes);
    else if (a == "--factor" && ok) ok = parse_bytes(v, &opt.factor) && opt.factor >= 2;
    else if (a == "--iters" && ok) ok = parse_int(v, &opt.iters);
    else if (a == "--warmup" && ok) ok = parse_int(v, &opt.warmup);
    else if (a == "--batch" && ok) ok = parse_int(v, &opt.batch);
    else if (a == "--single" && ok) ok = parse_int(v, &opt.single);
    else ok = false;
    if (!ok) {
      if (rank == 0)
        std::fprintf(stderr,
                     "stream_latency: bad argument '%s'\nusage: stream_latency [--min-bytes 8] "
                     "[--max-bytes 64M] [--factor 4] [--iters 1000] [--warmup 100] "
                     "[--batch 100] [--single 50]\n",
                     a.c_str());
      MPI_Finalize();
      return 2;
    }
    ++i;
  }
  opt.min_bytes = std::max<unsigned long long>(opt.min_bytes / 4 * 4, 4);
  opt.max_bytes = std::min<unsigned long long>(opt.max_bytes, 1ull << 30) / 4 * 4;  // int count

#if !STREAMCOLL_HAVE_CUDA
  if (rank == 0) std::printf("SKIP: no usable GPU (built without the CUDA toolkit)\n");
  MPI_Finalize();
  return 0;
#else
  const std::string why = gpu_unusable(rank);
  if (!all_min(why.empty())) {
    if (rank == 0)
      std::printf("SKIP: no usable GPU (%s)\n",
                  why.empty() ? "another rank has none" : why.c_str());
    MPI_Finalize();
    return 0;
  }

  Bench b;
  b.opt = opt;
  b.rank = rank;
  b.size = size;
  b.get = reinterpret_cast<GetStats>(dlsym(RTLD_DEFAULT, "streamcoll_get_stats"));
  const size_t max_count = static_cast<size_t>(opt.max_bytes / 4);
  CUDA_OK(cudaStreamCreateWithFlags(&b.s, cudaStreamNonBlocking));
  CUDA_OK(cudaMalloc(&b.send, max_count * sizeof(float)));
  CUDA_OK(cudaMalloc(&b.recv, max_count * sizeof(float)));
  CUDA_OK(cudaMallocHost(&b.host, max_count * sizeof(float)));
  b.want.resize(max_count);
  MPI_Comm_dup(MPI_COMM_WORLD, &b.comm_stream);
  MPI_Comm_dup(MPI_COMM_WORLD, &b.comm_classic);
  const int attach_rc = streamcoll_comm_attach_stream(b.comm_stream, b.s);
  const bool attached = all_min(attach_rc == MPI_SUCCESS) != 0;
  if (!attached && attach_rc == MPI_SUCCESS) streamcoll_comm_detach_stream(b.comm_stream);

  if (rank == 0) {
    std::string cmd;
    for (int i = 0; i < argc; ++i) cmd += (i ? " " : "") + quote(argv[i]);
    std::printf("# stream_latency: MPI_Allreduce(MPI_FLOAT, MPI_SUM), device buffers, out of "
                "place; times are rank 0's, in microseconds\n");
    std::printf("# command: %s\n", cmd.c_str());
    char hostname[256] = "?";
    gethostname(hostname, sizeof hostname - 1);
    int dev = 0, drv = 0, rt = 0;
    cudaGetDevice(&dev);
    cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rt);
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, dev);
    char mpiver[MPI_MAX_LIBRARY_VERSION_STRING] = "";
    int len = 0;
    MPI_Get_library_version(mpiver, &len);
    std::string mpi1(mpiver);
    mpi1 = mpi1.substr(0, mpi1.find('\n'));
    std::printf("# ranks: %d on %s; GPU (rank 0): %s, cc %d.%d; CUDA driver %d.%d, runtime "
                "%d.%d; MPI: %s\n",
                size, hostname, prop.name, prop.major, prop.minor, drv / 1000, drv % 1000 / 10,
                rt / 1000, rt % 1000 / 10, mpi1.c_str());
    auto version = reinterpret_cast<const char* (*)()>(dlsym(RTLD_DEFAULT, "streamcoll_version"));
    const char* preload = std::getenv("LD_PRELOAD");
    std::printf("# streamcoll: %s; LD_PRELOAD=%s\n", version ? version() : "not loaded",
                preload ? preload : "(unset)");
    std::string env;
    for (char** e = environ; *e; ++e)
      if (!std::strncmp(*e, "STREAMCOLL_", 11) || !std::strncmp(*e, "NCCL_", 5) ||
          !std::strncmp(*e, "CUDA_VISIBLE_DEVICES=", 21))
        env += std::string(env.empty() ? "" : " ") + quote(*e);
    std::printf("# environment: %s\n", env.empty() ? "(no STREAMCOLL_*, NCCL_* set)" : env.c_str());
    std::printf("# options: --min-bytes %llu --max-bytes %llu --factor %llu --iters %d "
                "--warmup %d --batch %d --single %d\n",
                opt.min_bytes, opt.max_bytes, opt.factor, opt.iters, opt.warmup, opt.batch,
                opt.single);
    if (attached)
      std::printf("# stream attribute: attached (streamcoll_comm_attach_stream: MPI_SUCCESS)\n");
    else
      std::printf("# stream attribute: NOT taken (%s): stream mode skipped\n",
                  attach_rc == STREAMCOLL_ERR_ABSENT
                      ? "STREAMCOLL_ERR_ABSENT: streamcoll not loaded, disabled, or no stream "
                        "support"
                      : attach_rc == MPI_SUCCESS ? "not attached on every rank"
                                                 : "MPI error from MPI_Comm_set_attr");
    std::printf("# route: streamcoll_get_stats for the mode's calls (allreduce, device memory); "
                "n/a: streamcoll not loaded; -: nothing counted (STREAMCOLL_STATS=1 unset)\n");
    std::printf("# %10s %-8s %10s %10s %10s %12s %12s %7s  %s\n", "bytes", "mode", "host min",
                "host med", "host max", "e2e/call", "single+sync", "calls", "route");
  }

  // First use of each communicator (streamcoll's layout discovery, NCCL set-up) outside
  // the measurements.
  b.prepare(1, 0);
  for (MPI_Comm c : {b.comm_stream, b.comm_classic}) {
    b.call(c, 1);
    CUDA_OK(cudaStreamSynchronize(b.s));
  }

  int failed = 0;
  double goal_med = -1;
  unsigned salt = 1;
  for (unsigned long long bytes = opt.min_bytes; bytes <= opt.max_bytes && !failed;
       bytes = bytes == opt.max_bytes            ? opt.max_bytes + 1
               : bytes > opt.max_bytes / opt.factor ? opt.max_bytes
                                                    : bytes * opt.factor) {
    const int count = static_cast<int>(bytes / 4);
    const double scale = bytes <= (1u << 20) ? 1.0 : static_cast<double>(1u << 20) / bytes;
    const int iters = std::max(std::min(opt.iters, 20), static_cast<int>(opt.iters * scale));
    const int warmup = std::max(std::min(opt.warmup, 5), static_cast<int>(opt.warmup * scale));
    for (int m = 0; m < 2 && !failed; ++m) {
      const bool stream = m == 0;
      if (stream && !attached) continue;
      const char* mode = stream ? "stream" : "classic";
      b.prepare(count, salt++);
      const RouteCounts before = route_counts(b.get);
      Result r = b.measure(stream, count, iters, warmup);
      const bool ok = b.validate(stream, count, bytes, salt++);
      ++r.calls;  // the probe
      const RouteCounts after = route_counts(b.get);
      if (!ok) {
        failed = 1;
        if (rank == 0) std::printf("FAIL: wrong result at %llu B, mode %s\n", bytes, mode);
        break;
      }
      if (rank == 0) {
        const double med = percentile(r.host, 0.5);
        if (stream && bytes == 8) goal_med = med;
        std::printf("  %10llu %-8s %10.2f %10.2f %10.2f %12.2f %12.2f %7llu  %s\n", bytes, mode,
                    percentile(r.host, 0), med, percentile(r.host, 1), percentile(r.e2e, 0.5),
                    percentile(r.single, 0.5), r.calls,
                    route_name(b.get, before, after, r.calls).c_str());
        std::fflush(stdout);
      }
    }
  }
  if (rank == 0 && !failed) {
    if (goal_med >= 0)
      std::printf("# goal: stream host us/call at 8 B, median < 10 us: %.2f us, %s\n", goal_med,
                  goal_med < 10 ? "met" : "NOT met");
    std::printf("# all results verified\n");
  }

  if (attached) streamcoll_comm_detach_stream(b.comm_stream);
  MPI_Comm_free(&b.comm_stream);
  MPI_Comm_free(&b.comm_classic);
  cudaFreeHost(b.host);
  cudaFree(b.recv);
  cudaFree(b.send);
  cudaStreamDestroy(b.s);
  MPI_Finalize();
  return failed ? 1 : 0;
#endif
}
