// Route ht (host transfer, Aluminum sec. V-B.2) against its parts and its rivals:
// MPI_Allreduce(MPI_FLOAT, MPI_SUM) on device buffers, 1 to 262144 floats (4 B to 1 MiB,
// powers of two), all in one run, routes switched per communicator with
// streamcoll_comm_set_route on duplicates of MPI_COMM_WORLD.
//
//   ht_latency [--min-count 1] [--max-count 262144] [--iters 200] [--warmup 20]
//
// Columns (microseconds, median over --iters calls after --warmup; rank 0's clock; ranks
// lined up with PMPI_Barrier before every call):
//   d2h        cudaMemcpyAsync device -> pinned host on a stream + cudaStreamSynchronize
//   h2d        cudaMemcpyAsync pinned host -> device + cudaStreamSynchronize
//   host       PMPI_Allreduce on pinned host buffers (the MPI itself)
//   sum        d2h + h2d + host: the parts of a host-transfer allreduce
//   baseline   what an application does by hand: cudaStreamSynchronize, cudaMemcpy D2H
//              into pinned memory, PMPI_Allreduce in place, cudaMemcpy H2D
//   nccl       route nccl, classic (cudaStreamSynchronize + MPI_Allreduce); "-" when the
//              route declines (ranks sharing a GPU: NCCL refuses that; see the note)
//   ht:ALGO    route ht with algo=rd|rabenseifner|ring|mpi, classic (no stream attached:
//              cudaStreamSynchronize + MPI_Allreduce, the call returns with the result)
//   hts:ALGO   the same with a stream attached: MPI_Allreduce + cudaStreamSynchronize
// and a second table with the goals, per size:
//   best ht    the fastest ht column (classic or stream) and its time
//   /sum       best ht / sum            GOAL: <= 1.3
//   /baseline  best ht / baseline       GOAL: < 1 up to 64 KiB
//   block:ALGO host time of the stream-attached MPI_Allreduce call itself (it only
//              enqueues: the host does not wait for the GPU or the network)
// then every number again as CSV lines ("csv,bytes,column,median_us,min_us,max_us").
//
// Every measurement is validated: the receive buffer is poisoned (NaN) before it and must
// hold the sums computed on the host afterwards; the route each mode's calls took is
// checked with streamcoll_get_stats (ht columns must run on ht; nccl may decline). A
// wrong result or a wrong route: "FAIL: ..." and exit 1.
// Needs streamcoll (LD_PRELOAD; scripts/bench-ht.sh) with STREAMCOLL_STATS=1; without a
// usable GPU: one "SKIP: no usable GPU (...)" line, exit 77.
#include <dlfcn.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
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
  long min_count = 1, max_count = 262144;
  int iters = 200, warmup = 20;
};

bool parse_long(const char* s, long* out, long lo, long hi) {
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  if (end == s || *end != '\0' || v < lo || v > hi) return false;
  *out = v;
  return true;
}

#if STREAMCOLL_HAVE_CUDA
const char* const kAlgos[] = {"rd", "rabenseifner", "ring", "mpi"};
constexpr int kNumAlgos = 4;
// The routes' names, from the streamcoll loaded here (none without it).
const std::vector<std::string>& routes() {
  static const std::vector<std::string> names = bench::route_names();
  return names;
}

using GetStats = int (*)(const char*, const char*, const char*, streamcoll_stat_t*);
using SetRoute = int (*)(MPI_Comm, const char*);

void cuda_ok(cudaError_t e, const char* what, int line) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "ht_latency: %s failed (line %d): %s\n", what, line, cudaGetErrorString(e));
  MPI_Abort(MPI_COMM_WORLD, 1);
}
#define CUDA_OK(call) cuda_ok((call), #call, __LINE__)

void mpi_ok(int rc, const char* what, int line) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING] = "";
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  std::fprintf(stderr, "ht_latency: %s failed (line %d): %s\n", what, line, msg);
  MPI_Abort(MPI_COMM_WORLD, 1);
}
#define MPI_OK(call) mpi_ok((call), #call, __LINE__)

// Rank r's element i at measurement `salt`: small integers, exact float sums.
inline float input(size_t i, int r, unsigned salt) {
  return static_cast<float>((i * 3 + static_cast<size_t>(r) * 7 + salt) % 19 + static_cast<size_t>(r) + 1);
}

struct Sample {
  std::vector<double> t;      // us per call
  std::vector<double> block;  // us in the call itself (stream-attached ht)
  double med() const { return percentile(t, 0.5); }
};

// Device-memory allreduce calls per route, this process.
std::vector<unsigned long long> route_calls(GetStats get) {
  std::vector<unsigned long long> c(routes().size(), 0);
  for (size_t i = 0; i < routes().size(); ++i) {
    streamcoll_stat_t s{};
    if (get("allreduce", routes()[i].c_str(), "device", &s) == 0) c[i] = s.calls;
  }
  return c;
}
// "ht", or "pmpi:3,ht:217" when several took calls; "-" when none was counted.
std::string routes_taken(const std::vector<unsigned long long>& a, const std::vector<unsigned long long>& b) {
  std::string out;
  int used = 0;
  for (size_t i = 0; i < routes().size(); ++i) used += b[i] != a[i];
  for (size_t i = 0; i < routes().size(); ++i)
    if (b[i] != a[i]) {
      out += (out.empty() ? "" : ",") + routes()[i];
      if (used > 1) out += ":" + std::to_string(b[i] - a[i]);
    }
  return out.empty() ? "-" : out;
}

struct Bench {
  Options opt;
  int rank = 0, size = 1;
  cudaStream_t s = nullptr;
  float *d_send = nullptr, *d_recv = nullptr;   // device
  float *h_send = nullptr, *h_recv = nullptr;   // pinned
  std::vector<float> in, want, got;
  GetStats get = nullptr;
  SetRoute set_route = nullptr;
  MPI_Comm nccl = MPI_COMM_NULL;
  MPI_Comm ht[kNumAlgos] = {}, hts[kNumAlgos] = {};
  bool nccl_ok = true;
  std::string nccl_note;
  int failed = 0;

  void fail(const std::string& why) {
    if (rank == 0 || !failed) std::printf("FAIL: rank %d: %s\n", rank, why.c_str());
    std::fflush(stdout);
    failed = 1;
  }

  void inputs(size_t n, unsigned salt) {
    for (size_t i = 0; i < n; ++i) {
      in[i] = input(i, rank, salt);
      float sum = 0;
      for (int r = 0; r < size; ++r) sum += input(i, r, salt);
      want[i] = sum;
    }
  }

  // Device input uploaded, device and pinned receive buffers poisoned; synchronised.
  void prepare(size_t n, unsigned salt) {
    inputs(n, salt);
    CUDA_OK(cudaMemcpy(d_send, in.data(), n * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(d_recv, 0xff, n * 4));
    std::memcpy(h_send, in.data(), n * 4);
    std::memset(h_recv, 0xff, n * 4);
    CUDA_OK(cudaDeviceSynchronize());
  }

  bool check(const float* got_p, const float* want_p, size_t n, const std::string& what) {
    int ok = 1;
    for (size_t i = 0; i < n; ++i)
      if (!(got_p[i] == want_p[i])) {
        fail("WRONG RESULT: " + what + ": element " + std::to_string(i) + " is " +
             std::to_string(got_p[i]) + ", expected " + std::to_string(want_p[i]));
        ok = 0;
        break;
      }
    if (!all_min(ok)) failed = 1;
    return !failed;
  }
  bool check_device(size_t n, const std::string& what) {
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(got.data(), d_recv, n * 4, cudaMemcpyDeviceToHost));
    return check(got.data(), want.data(), n, what);
  }

  // Warm-up, then `iters` timed calls of fn, each after a barrier.
  Sample time(const std::function<void(Sample*)>& fn) {
    Sample sm;
    Sample scratch;
    for (int i = 0; i < opt.warmup; ++i) fn(&scratch);
    for (int i = 0; i < opt.iters; ++i) {
      PMPI_Barrier(MPI_COMM_WORLD);
      const double t0 = now_us();
      fn(&sm);
      sm.t.push_back(now_us() - t0);
    }
    return sm;
  }

  Sample d2h(size_t n) {
    Sample r = time([&](Sample*) {
      CUDA_OK(cudaMemcpyAsync(h_recv, d_send, n * 4, cudaMemcpyDeviceToHost, s));
      CUDA_OK(cudaStreamSynchronize(s));
    });
    check(h_recv, in.data(), n, "d2h copy");
    return r;
  }
  Sample h2d(size_t n) {
    Sample r = time([&](Sample*) {
      CUDA_OK(cudaMemcpyAsync(d_recv, h_send, n * 4, cudaMemcpyHostToDevice, s));
      CUDA_OK(cudaStreamSynchronize(s));
    });
    CUDA_OK(cudaMemcpy(got.data(), d_recv, n * 4, cudaMemcpyDeviceToHost));
    check(got.data(), in.data(), n, "h2d copy");
    return r;
  }
  Sample host(size_t n) {
    std::memset(h_recv, 0xff, n * 4);
    Sample r = time([&](Sample*) {
      MPI_OK(PMPI_Allreduce(h_send, h_recv, static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
    });
    check(h_recv, want.data(), n, "host PMPI_Allreduce on pinned memory");
    return r;
  }
  Sample baseline(size_t n) {
    Sample r = time([&](Sample*) {
      CUDA_OK(cudaStreamSynchronize(s));
      CUDA_OK(cudaMemcpy(h_recv, d_send, n * 4, cudaMemcpyDeviceToHost));
      MPI_OK(PMPI_Allreduce(MPI_IN_PLACE, h_recv, static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
      CUDA_OK(cudaMemcpy(d_recv, h_recv, n * 4, cudaMemcpyHostToDevice));
    });
    check_device(n, "baseline (sync, D2H, PMPI_Allreduce, H2D)");
    return r;
  }
  // Classic: the application synchronises its stream, then calls.
  Sample classic(MPI_Comm comm, size_t n) {
    return time([&](Sample*) {
      CUDA_OK(cudaStreamSynchronize(s));
      MPI_OK(MPI_Allreduce(d_send, d_recv, static_cast<int>(n), MPI_FLOAT, MPI_SUM, comm));
    });
  }
  // Stream attached: the call enqueues; the host then waits for the stream.
  Sample stream(MPI_Comm comm, size_t n) {
    return time([&](Sample* sm) {
      const double t0 = now_us();
      MPI_OK(MPI_Allreduce(d_send, d_recv, static_cast<int>(n), MPI_FLOAT, MPI_SUM, comm));
      sm->block.push_back(now_us() - t0);
      CUDA_OK(cudaStreamSynchronize(s));
    });
  }

  // One routed column: poisoned output, timed calls, result and route checked.
  Sample routed(MPI_Comm comm, bool attached, size_t n, const char* want_route, const std::string& what) {
    CUDA_OK(cudaMemset(d_recv, 0xff, n * 4));
    CUDA_OK(cudaDeviceSynchronize());
    const auto before = route_calls(get);
    Sample r = attached ? stream(comm, n) : classic(comm, n);
    const std::string took = routes_taken(before, route_calls(get));
    check_device(n, what);
    int ok = took == want_route;
    if (!all_min(ok)) fail(what + ": the calls ran on " + took + ", not " + want_route);
    return r;
  }
};

// "" when this rank can use a GPU (rank % devices), else why not.
std::string gpu_unusable(int rank) {
  int ndev = 0;
  cudaError_t e = cudaGetDeviceCount(&ndev);
  if (e != cudaSuccess) return std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
  if (ndev == 0) return "cudaGetDeviceCount: 0 devices";
  if ((e = cudaSetDevice(rank % ndev)) != cudaSuccess || (e = cudaFree(nullptr)) != cudaSuccess)
    return "device " + std::to_string(rank % ndev) + ": " + cudaGetErrorString(e);
  return "";
}

void header(const Bench& b, int argc, char** argv) {
  std::string cmd;
  for (int i = 0; i < argc; ++i) cmd += (i ? " " : "") + quote(argv[i]);
  std::printf("# ht_latency: MPI_Allreduce(MPI_FLOAT, MPI_SUM), device buffers, out of place; "
              "median microseconds, rank 0's clock\n");
  std::printf("# command: %s\n", cmd.c_str());
  char hostname[256] = "?";
  gethostname(hostname, sizeof hostname - 1);
  int dev = 0, drv = 0, rt = 0, ndev = 0;
  cudaGetDevice(&dev);
  cudaGetDeviceCount(&ndev);
  cudaDriverGetVersion(&drv);
  cudaRuntimeGetVersion(&rt);
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, dev);
  char mpiver[MPI_MAX_LIBRARY_VERSION_STRING] = "";
  int len = 0;
  MPI_Get_library_version(mpiver, &len);
  std::string mpi1(mpiver);
  mpi1 = mpi1.substr(0, mpi1.find('\n'));
  std::printf("# ranks: %d on %s; %d GPU(s) visible, rank r uses GPU r %% %d: %s, cc %d.%d; CUDA "
              "driver %d.%d, runtime %d.%d; MPI: %s\n",
              b.size, hostname, ndev, ndev, prop.name, prop.major, prop.minor, drv / 1000,
              drv % 1000 / 10, rt / 1000, rt % 1000 / 10, mpi1.c_str());
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
  std::printf("# options: --min-count %ld --max-count %ld --iters %d --warmup %d\n", b.opt.min_count,
              b.opt.max_count, b.opt.iters, b.opt.warmup);
}
#endif

}  // namespace

int main(int argc, char** argv) {
  // Routes with a progress thread (ht, blueconnect) need MPI_THREAD_MULTIPLE, which the
  // table cannot show streamcoll at MPI_Init when they are forced per communicator.
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    bool ok = v != nullptr;
    long x = 0;
    if (a == "--min-count" && ok) ok = parse_long(v, &opt.min_count, 1, 1 << 28);
    else if (a == "--max-count" && ok) ok = parse_long(v, &opt.max_count, 1, 1 << 28);
    else if (a == "--iters" && ok) {
      ok = parse_long(v, &x, 1, 1000000);
      opt.iters = static_cast<int>(x);
    } else if (a == "--warmup" && ok) {
      ok = parse_long(v, &x, 0, 1000000);
      opt.warmup = static_cast<int>(x);
    } else {
      ok = false;
    }
    if (!ok) {
      if (rank == 0)
        std::fprintf(stderr, "ht_latency: bad argument '%s'\nusage: ht_latency [--min-count 1] "
                     "[--max-count 262144] [--iters 200] [--warmup 20]\n", a.c_str());
      MPI_Finalize();
      return 2;
    }
    ++i;
  }

#if !STREAMCOLL_HAVE_CUDA
  if (rank == 0) std::printf("SKIP: no usable GPU (built without the CUDA toolkit)\n");
  MPI_Finalize();
  return 77;
#else
  const std::string why = gpu_unusable(rank);
  if (!all_min(why.empty())) {
    if (rank == 0)
      std::printf("SKIP: no usable GPU (%s)\n", why.empty() ? "another rank has none" : why.c_str());
    MPI_Finalize();
    return 77;
  }
  Bench b;
  b.opt = opt;
  b.rank = rank;
  b.size = size;
  b.get = reinterpret_cast<GetStats>(dlsym(RTLD_DEFAULT, "streamcoll_get_stats"));
  b.set_route = reinterpret_cast<SetRoute>(dlsym(RTLD_DEFAULT, "streamcoll_comm_set_route"));
  const char* stats = std::getenv("STREAMCOLL_STATS");
  std::string missing;
  if (!b.get || !b.set_route)
    missing = "streamcoll is not loaded (run under LD_PRELOAD=libstreamcoll.so: scripts/bench-ht.sh)";
  else if (!stats || std::strcmp(stats, "1") != 0)
    missing = "STREAMCOLL_STATS=1 is not set: the routes cannot be checked";
  if (!all_min(missing.empty())) {
    if (rank == 0) std::printf("FAIL: %s\n", missing.empty() ? "another rank lacks streamcoll" : missing.c_str());
    MPI_Finalize();
    return 2;
  }

  const size_t max_n = static_cast<size_t>(opt.max_count);
  CUDA_OK(cudaStreamCreateWithFlags(&b.s, cudaStreamNonBlocking));
  CUDA_OK(cudaMalloc(&b.d_send, max_n * 4));
  CUDA_OK(cudaMalloc(&b.d_recv, max_n * 4));
  CUDA_OK(cudaMallocHost(&b.h_send, max_n * 4));
  CUDA_OK(cudaMallocHost(&b.h_recv, max_n * 4));
  b.in.resize(max_n);
  b.want.resize(max_n);
  b.got.resize(max_n);

  // One duplicate per column, its route forced (collective: same order on every rank).
  auto make = [&](const std::string& spec, bool attach) {
    MPI_Comm c = MPI_COMM_NULL;
    MPI_OK(MPI_Comm_dup(MPI_COMM_WORLD, &c));
    const int rc = b.set_route(c, spec.c_str());
    if (!all_min(rc == MPI_SUCCESS)) {
      if (rank == 0) std::printf("FAIL: streamcoll_comm_set_route(\"%s\") returned %d\n", spec.c_str(), rc);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (attach && !all_min(streamcoll_comm_attach_stream(c, b.s) == MPI_SUCCESS)) {
      if (rank == 0) std::printf("FAIL: streamcoll_comm_attach_stream failed\n");
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    return c;
  };
  b.nccl = make("allreduce:nccl", false);
  for (int a = 0; a < kNumAlgos; ++a) {
    b.ht[a] = make(std::string("allreduce:ht:algo=") + kAlgos[a], false);
    b.hts[a] = make(std::string("allreduce:ht:algo=") + kAlgos[a], true);
  }

  if (rank == 0) header(b, argc, argv);

  // First calls (layout discovery, NCCL and ht set-up) outside the measurements; which
  // route nccl's communicator really takes.
  b.prepare(1, 0);
  {
    const auto before = route_calls(b.get);
    MPI_OK(MPI_Allreduce(b.d_send, b.d_recv, 1, MPI_FLOAT, MPI_SUM, b.nccl));
    CUDA_OK(cudaDeviceSynchronize());
    const std::string took = routes_taken(before, route_calls(b.get));
    b.nccl_ok = all_min(took == "nccl") != 0;
    if (!b.nccl_ok)
      b.nccl_note = "nccl column skipped: the route declined (the call ran on " + took +
                    (size > 1 ? "; ranks sharing one GPU, which NCCL refuses)" : ")");
  }
  for (int a = 0; a < kNumAlgos; ++a)
    for (MPI_Comm c : {b.ht[a], b.hts[a]}) {
      MPI_OK(MPI_Allreduce(b.d_send, b.d_recv, 1, MPI_FLOAT, MPI_SUM, c));
      CUDA_OK(cudaDeviceSynchronize());
    }
  if (rank == 0 && !b.nccl_note.empty()) std::printf("# note: %s\n", b.nccl_note.c_str());

  struct Row {
    unsigned long long bytes;
    Sample d2h, h2d, host, base, nccl, ht[kNumAlgos], hts[kNumAlgos];
  };
  std::vector<Row> rows;
  unsigned salt = 1;
  for (long count = opt.min_count; count <= opt.max_count && !b.failed; count *= 2) {
    const size_t n = static_cast<size_t>(count);
    Row r;
    r.bytes = n * 4;
    const std::string at = " at " + std::to_string(r.bytes) + " B";
    b.prepare(n, salt++);
    r.d2h = b.d2h(n);
    r.h2d = b.h2d(n);
    r.host = b.host(n);
    r.base = b.baseline(n);
    if (b.nccl_ok) r.nccl = b.routed(b.nccl, false, n, "nccl", "nccl" + at);
    for (int a = 0; a < kNumAlgos && !b.failed; ++a) {
      r.ht[a] = b.routed(b.ht[a], false, n, "ht", std::string("ht algo=") + kAlgos[a] + at);
      r.hts[a] = b.routed(b.hts[a], true, n, "ht", std::string("ht algo=") + kAlgos[a] + ", stream" + at);
    }
    if (b.failed) break;
    rows.push_back(std::move(r));
    if (rank == 0) {
      std::fprintf(stderr, "ht_latency: %llu B done\n", rows.back().bytes);
      std::fflush(stderr);
    }
  }

  if (rank == 0 && !rows.empty()) {
    std::printf("\n# latency, median us per call (d2h/h2d: copy + stream sync; host: PMPI_Allreduce "
                "on pinned memory; sum = d2h + h2d + host; ht: classic; hts: stream attached, call + sync)\n");
    std::printf("# %9s %8s %8s %8s %8s %9s %8s", "bytes", "d2h", "h2d", "host", "sum", "baseline", "nccl");
    for (const char* a : kAlgos) std::printf(" %9s", (std::string("ht:") + (a[1] == 'a' ? "rab" : a)).c_str());
    for (const char* a : kAlgos) std::printf(" %9s", (std::string("hts:") + (a[1] == 'a' ? "rab" : a)).c_str());
    std::printf("\n");
    for (const Row& r : rows) {
      const double sum = r.d2h.med() + r.h2d.med() + r.host.med();
      std::printf("  %9llu %8.2f %8.2f %8.2f %8.2f %9.2f", r.bytes, r.d2h.med(), r.h2d.med(), r.host.med(),
                  sum, r.base.med());
      if (b.nccl_ok) std::printf(" %8.2f", r.nccl.med());
      else std::printf(" %8s", "-");
      for (int a = 0; a < kNumAlgos; ++a) std::printf(" %9.2f", r.ht[a].med());
      for (int a = 0; a < kNumAlgos; ++a) std::printf(" %9.2f", r.hts[a].med());
      std::printf("\n");
    }

    std::printf("\n# goals: best ht (classic or stream) / sum <= 1.3; best ht / baseline < 1 up to 65536 B;"
                " block: host time of the stream-attached call itself, median us\n");
    std::printf("# %9s %-17s %9s %8s %10s %6s", "bytes", "best ht", "us", "/sum", "/baseline", "goals");
    for (const char* a : kAlgos) std::printf(" %9s", (std::string("block:") + (a[1] == 'a' ? "rab" : a)).c_str());
    std::printf("\n");
    int sum_met = 0, base_met = 0, base_sizes = 0;
    for (const Row& r : rows) {
      const double sum = r.d2h.med() + r.h2d.med() + r.host.med();
      double best = 1e300;
      std::string which;
      for (int a = 0; a < kNumAlgos; ++a) {
        if (r.ht[a].med() < best) best = r.ht[a].med(), which = std::string("ht:") + kAlgos[a];
        if (r.hts[a].med() < best) best = r.hts[a].med(), which = std::string("hts:") + kAlgos[a];
      }
      const double rs = best / sum, rb = best / r.base.med();
      const bool ok_sum = rs <= 1.3, in_base = r.bytes <= 65536, ok_base = rb < 1.0;
      sum_met += ok_sum;
      base_sizes += in_base;
      base_met += in_base && ok_base;
      std::printf("  %9llu %-17s %9.2f %8.3f %10.3f %3s%3s", r.bytes, which.c_str(), best, rs, rb,
                  ok_sum ? "s" : "-", in_base ? (ok_base ? "b" : "-") : " ");
      for (int a = 0; a < kNumAlgos; ++a) std::printf(" %9.2f", percentile(r.hts[a].block, 0.5));
      std::printf("\n");
    }
    std::printf("# goals column: s = best/sum <= 1.3 met, b = best/baseline < 1 met (sizes <= 64 KiB)\n");
    std::printf("# goal ht <= 1.3 x (d2h + h2d + host): met at %d of %zu sizes\n", sum_met, rows.size());
    std::printf("# goal ht faster than the baseline up to 64 KiB: met at %d of %d sizes\n", base_met, base_sizes);

    std::printf("\n# csv,bytes,column,median_us,min_us,max_us\n");
    auto csv = [](unsigned long long bytes, const std::string& col, const std::vector<double>& v) {
      if (v.empty()) return;
      std::printf("csv,%llu,%s,%.3f,%.3f,%.3f\n", bytes, col.c_str(), percentile(v, 0.5),
                  percentile(v, 0), percentile(v, 1));
    };
    for (const Row& r : rows) {
      csv(r.bytes, "d2h", r.d2h.t);
      csv(r.bytes, "h2d", r.h2d.t);
      csv(r.bytes, "host", r.host.t);
      csv(r.bytes, "baseline", r.base.t);
      if (b.nccl_ok) csv(r.bytes, "nccl", r.nccl.t);
      for (int a = 0; a < kNumAlgos; ++a) {
        csv(r.bytes, std::string("ht:") + kAlgos[a], r.ht[a].t);
        csv(r.bytes, std::string("hts:") + kAlgos[a], r.hts[a].t);
        csv(r.bytes, std::string("block:") + kAlgos[a], r.hts[a].block);
      }
    }
  }
  if (rank == 0) {
    if (!b.failed) std::printf("# all results verified; every ht column ran on route ht\n");
    if (!b.nccl_note.empty()) std::printf("# note: %s\n", b.nccl_note.c_str());
  }

  for (int a = 0; a < kNumAlgos; ++a) {
    streamcoll_comm_detach_stream(b.hts[a]);
    MPI_Comm_free(&b.ht[a]);
    MPI_Comm_free(&b.hts[a]);
  }
  MPI_Comm_free(&b.nccl);
  cudaFreeHost(b.h_send);
  cudaFreeHost(b.h_recv);
  cudaFree(b.d_send);
  cudaFree(b.d_recv);
  cudaStreamDestroy(b.s);
  const int failed = all_min(!b.failed) ? 0 : 1;
  MPI_Finalize();
  return failed;
#endif
}
