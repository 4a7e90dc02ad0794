// The host time of a stream-ordered collective (a stream attached to the communicator
// with streamcoll_comm_attach_stream, device buffers) when a peer is late: the extension's
// promise is that the call returns once the operation is enqueued, so rank 0's host time
// must not depend on the others' arrival (docs/design.md, "Safety rules": decisions from earlier
// agreements). Each round: the last rank sleeps --late-ms (0 in the reference rounds)
// before its call, every rank makes one call, rank 0 timing it, then synchronises the
// stream (which waits for the late rank on the GPU side and realigns the ranks). The
// signature's first call (which agrees at once) is a warm-up, not counted.
//
//   stream_skew [--bytes 4096] [--rounds 20] [--late-ms 300] [--csv FILE]
//               [--coll allreduce|bcast|allgather]
//
// --coll: MPI_Allreduce (MPI_SUM; the default), MPI_Bcast from rank 0, or MPI_Allgather of
// --bytes per rank, all of MPI_FLOAT; every result checked.
// The route is the table's (STREAMCOLL_ROUTE forces one: scripts/bench-agreement.sh runs
// nccl and ht). Uses the CUDA driver API through dlopen("libcuda.so.1"), so the fake
// driver of tests/fake (LD_LIBRARY_PATH) stands in for a GPU; a real driver where one is.
// Prints, per kind of round, the median and largest host time on rank 0 (ms), and the
// route the calls took (streamcoll's statistics). Exit 77 without a usable driver.
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
#include <cuda.h>

#include "bench_util.hpp"
#include "streamcoll/streamcoll.h"
#include "streamcoll/streamext.h"

#define SKEW_STR2(x) #x
#define SKEW_STR(x) SKEW_STR2(x)  // the header's versioned symbol name (cuMemAlloc_v2, ...)

namespace {

struct Driver {
  decltype(&::cuInit) init = nullptr;
  decltype(&::cuDeviceGet) device_get = nullptr;
  decltype(&::cuDevicePrimaryCtxRetain) retain = nullptr;
  decltype(&::cuCtxPushCurrent) push = nullptr;
  decltype(&::cuStreamCreate) stream_create = nullptr;
  decltype(&::cuStreamSynchronize) stream_sync = nullptr;
  decltype(&::cuStreamDestroy) stream_destroy = nullptr;
  decltype(&::cuMemAlloc) alloc = nullptr;
  decltype(&::cuMemFree) free = nullptr;
  decltype(&::cuMemcpyAsync) copy = nullptr;

  bool load() {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!lib) return false;
    auto sym = [lib](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      return fn != nullptr;
    };
    return sym(init, SKEW_STR(cuInit)) && sym(device_get, SKEW_STR(cuDeviceGet)) &&
           sym(retain, SKEW_STR(cuDevicePrimaryCtxRetain)) &&
           sym(push, SKEW_STR(cuCtxPushCurrent)) && sym(stream_create, SKEW_STR(cuStreamCreate)) &&
           sym(stream_sync, SKEW_STR(cuStreamSynchronize)) &&
           sym(stream_destroy, SKEW_STR(cuStreamDestroy)) && sym(alloc, SKEW_STR(cuMemAlloc)) &&
           sym(free, SKEW_STR(cuMemFree)) && sym(copy, SKEW_STR(cuMemcpyAsync)) &&
           init(0) == CUDA_SUCCESS;
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  size_t bytes = 4096;
  int rounds = 20;
  double late_ms = 300;
  std::string csv, coll = "allreduce";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--bytes") bytes = std::strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--rounds") rounds = std::atoi(argv[i + 1]);
    else if (a == "--late-ms") late_ms = std::atof(argv[i + 1]);
    else if (a == "--csv") csv = argv[i + 1];
    else if (a == "--coll") coll = argv[i + 1];
  }
  if (coll != "allreduce" && coll != "bcast" && coll != "allgather") {
    if (rank == 0) std::fprintf(stderr, "stream_skew: --coll allreduce, bcast or allgather\n");
    MPI_Finalize();
    return 2;
  }
  const bool gather = coll == "allgather";
  Driver d;
  int ok = d.load() ? 1 : 0, all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all) {
    if (rank == 0) std::printf("stream_skew: SKIP: no usable libcuda.so.1\n");
    MPI_Finalize();
    return 77;
  }
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  CUstream stream = nullptr;
  d.device_get(&dev, 0);
  d.retain(&ctx, dev);
  d.push(ctx);
  d.stream_create(&stream, CU_STREAM_NON_BLOCKING);
  const size_t n = std::max<size_t>(1, bytes / sizeof(float));
  CUdeviceptr send = 0, recv = 0;
  d.alloc(&send, n * sizeof(float));
  const size_t rn = gather ? n * static_cast<size_t>(size) : n;  // received floats
  d.alloc(&recv, rn * sizeof(float));
  std::vector<float> ones(n, 1.0f), zeros(n, 0.0f), out(rn, 0.0f);
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  streamcoll_comm_attach_stream(comm, stream);
  auto call = [&]() {
    // The input (a bcast's others: their buffer cleared, for the call to write).
    const bool cleared = coll == "bcast" && rank != 0;
    d.copy(coll == "bcast" ? recv : send,
           reinterpret_cast<CUdeviceptr>(cleared ? zeros.data() : ones.data()),
           n * sizeof(float), stream);
    const auto t0 = std::chrono::steady_clock::now();
    auto* sb = reinterpret_cast<void*>(send);
    auto* rb = reinterpret_cast<void*>(recv);
    const int count = static_cast<int>(n);
    if (coll == "bcast") MPI_Bcast(rb, count, MPI_FLOAT, 0, comm);
    else if (gather) MPI_Allgather(sb, count, MPI_FLOAT, rb, count, MPI_FLOAT, comm);
    else MPI_Allreduce(sb, rb, count, MPI_FLOAT, MPI_SUM, comm);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    d.copy(reinterpret_cast<CUdeviceptr>(out.data()), recv, rn * sizeof(float), stream);
    d.stream_sync(stream);
    return ms;
  };
  call();  // the signature's first call: agrees at once
  std::vector<double> on_time, late;
  bool right = true;
  for (int r = 0; r < 2 * rounds; ++r) {
    const bool is_late = r % 2 == 1;
    if (is_late && rank == size - 1 && size > 1) usleep(static_cast<useconds_t>(late_ms * 1000));
    const double ms = call();
    (is_late ? late : on_time).push_back(ms);
    const float want = coll == "allreduce" ? static_cast<float>(size) : 1.0f;
    for (float v : out) right = right && v == want;
  }
  // The route the calls took: streamcoll's statistics (STREAMCOLL_STATS=1), if loaded.
  using GetStats = int (*)(const char*, const char*, const char*, streamcoll_stat_t*);
  const auto get = reinterpret_cast<GetStats>(dlsym(RTLD_DEFAULT, "streamcoll_get_stats"));
  // The route that counted the most of them (the first call of a signature may differ).
  std::string route = get ? "?" : "none (streamcoll not loaded)";
  unsigned long long most = 0;
  for (const std::string& r : bench::route_names()) {
    streamcoll_stat_t st{};
    if (get && get(coll.c_str(), r.c_str(), "device", &st) == 0 && st.calls > most) route = r, most = st.calls;
  }
  int mine = right ? 1 : 0, every = 0;
  MPI_Allreduce(&mine, &every, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (rank == 0) {
    std::printf("# stream_skew: %d ranks, %zu B MPI_%s on device memory with an attached "
                "stream, route %s; rank 0's host time per call (ms), %d rounds each; the last rank "
                "%.0f ms late in the late rounds; results %s\n",
                size, bytes, coll == "bcast" ? "Bcast" : gather ? "Allgather" : "Allreduce",
                route.c_str(), rounds, late_ms, every ? "right" : "WRONG");
    std::printf("%-10s %12s %12s\n", "rounds", "median_ms", "max_ms");
    std::printf("%-10s %12.3f %12.3f\n", "on-time", median(on_time),
                *std::max_element(on_time.begin(), on_time.end()));
    std::printf("%-10s %12.3f %12.3f\n", "late", median(late), *std::max_element(late.begin(), late.end()));
    if (!csv.empty())
      if (FILE* f = std::fopen(csv.c_str(), "w")) {
        std::fprintf(f, "ranks,bytes,route,late_ms,rounds,on_time_median_ms,on_time_max_ms,late_median_ms,late_max_ms\n");
        std::fprintf(f, "%d,%zu,%s,%.0f,%d,%.4f,%.4f,%.4f,%.4f\n", size, bytes, route.c_str(), late_ms,
                     rounds, median(on_time), *std::max_element(on_time.begin(), on_time.end()),
                     median(late), *std::max_element(late.begin(), late.end()));
        std::fclose(f);
      }
  }
  streamcoll_comm_detach_stream(comm);
  MPI_Comm_free(&comm);
  d.free(send);
  d.free(recv);
  d.stream_destroy(stream);
  MPI_Finalize();
  return every ? 0 : 1;
}

#else
int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) std::printf("stream_skew: SKIP: built without the CUDA headers\n");
  MPI_Finalize();
  return 77;
}
#endif
