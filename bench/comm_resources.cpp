// What streamcoll's NCCL communicators cost a program that makes many MPI communicators
// (issue 54): GPU memory against the number of communicators, the set-up time of the
// first and the last, and what a communicator constructor costs through streamcoll
// against PMPI_, with and without a parent that has an NCCL communicator.
//
//   comm_resources [--comms 40] [--reps 200] [--bytes 4096]
//
// Run under mpirun with streamcoll preloaded (scripts/bench-comm-resources.sh). Phases, on
// GPU buffers (the CUDA driver API through dlopen: the fake driver of tests/fake stands
// in for a GPU, a real driver where one is):
//   ctor-no-parent  MPI_Comm_dup + MPI_Comm_free against PMPI_Comm_dup + PMPI_Comm_free,
//                   --reps each, before any GPU collective (no NCCL communicator anywhere)
//   first           the first GPU MPI_Allreduce on MPI_COMM_WORLD (its NCCL set-up)
//   ctor-parent     the same constructor pair once world has an NCCL communicator
//                   (MPI_Comm_dup splits it; PMPI_Comm_dup does not)
//   dup K           K = 1..--comms duplicates of world alive at once, one allreduce each:
//                   the time of the K-th one's first allreduce (set-up included) and the
//                   GPU memory in use (cuMemGetInfo total - free) and streamcoll's figure
//   idup K          the same with MPI_Comm_idup (not derived: ncclCommInitRank each),
//                   until the budget turns them away
// Rank 0 prints one line per measurement; times are the maximum over ranks (a collective
// constructor is as slow as its slowest rank). Exit 77 without a usable driver.
#include <dlfcn.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#if STREAMCOLL_HAVE_CUDA
#include <cuda.h>

#include "streamcoll/streamcoll.h"

#define CR_STR2(x) #x
#define CR_STR(x) CR_STR2(x)  // the header's versioned symbol name (cuMemAlloc_v2, ...)

namespace {

struct Driver {
  decltype(&::cuInit) init = nullptr;
  decltype(&::cuDeviceGet) device_get = nullptr;
  decltype(&::cuDevicePrimaryCtxRetain) retain = nullptr;
  decltype(&::cuCtxPushCurrent) push = nullptr;
  decltype(&::cuMemAlloc) alloc = nullptr;
  decltype(&::cuMemFree) free = nullptr;
  decltype(&::cuMemGetInfo) info = nullptr;

  bool load() {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!lib) return false;
    auto sym = [lib](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      return fn != nullptr;
    };
    return sym(init, CR_STR(cuInit)) && sym(device_get, CR_STR(cuDeviceGet)) &&
           sym(retain, CR_STR(cuDevicePrimaryCtxRetain)) && sym(push, CR_STR(cuCtxPushCurrent)) &&
           sym(alloc, CR_STR(cuMemAlloc)) && sym(free, CR_STR(cuMemFree)) &&
           sym(info, CR_STR(cuMemGetInfo)) && init(0) == CUDA_SUCCESS;
  }
};
Driver drv;

double now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double max_over_ranks(double v) {
  double m = 0;
  PMPI_Allreduce(&v, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return m;
}

int g_rank = 0;

using Counts = void (*)(unsigned long long*, unsigned long long*, unsigned long long*,
                        unsigned long long*, unsigned long long*, unsigned long long*);
Counts g_counts = nullptr;

struct Nccl {
  unsigned long long own = 0, shared = 0, live = 0, refused = 0, bytes = 0, peak = 0;
};
Nccl counts() {
  Nccl n;
  if (g_counts) g_counts(&n.own, &n.shared, &n.live, &n.refused, &n.bytes, &n.peak);
  return n;
}

double used_mib() {
  size_t free = 0, total = 0;
  drv.info(&free, &total);
  return static_cast<double>(total - free) / 1048576.0;
}

// The mean time (us) of `reps` constructor + free pairs, through streamcoll or PMPI_.
double ctor_pair_us(int reps, bool pmpi) {
  double t0 = now_us();
  for (int i = 0; i < reps; ++i) {
    MPI_Comm c;
    if (pmpi) {
      PMPI_Comm_dup(MPI_COMM_WORLD, &c);
      PMPI_Comm_free(&c);
    } else {
      MPI_Comm_dup(MPI_COMM_WORLD, &c);
      MPI_Comm_free(&c);
    }
  }
  return max_over_ranks((now_us() - t0) / reps);
}

void ctor_line(const char* phase, int reps) {
  // Interleaved, twice each, so that drift favours neither.
  double via = 0, direct = 0;
  for (int k = 0; k < 2; ++k) {
    direct += ctor_pair_us(reps, true);
    via += ctor_pair_us(reps, false);
  }
  via /= 2, direct /= 2;
  if (g_rank == 0)
    std::printf("%-14s dup+free: PMPI_ %.2f us, through streamcoll %.2f us: %+.2f us added "
                "(ratio %.3f)\n", phase, direct, via, via - direct, direct > 0 ? via / direct : 0);
}

double allreduce_us(MPI_Comm c, void* buf, int count) {
  const double t0 = now_us();
  MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, c);
  return max_over_ranks(now_us() - t0);
}

void growth(const char* what, bool idup, int comms, void* buf, int count) {
  std::vector<MPI_Comm> live;
  for (int k = 1; k <= comms; ++k) {
    MPI_Comm c;
    const double t0 = now_us();
    if (idup) {
      MPI_Request r;
      MPI_Comm_idup(MPI_COMM_WORLD, &c, &r);
      MPI_Wait(&r, MPI_STATUS_IGNORE);
    } else {
      MPI_Comm_dup(MPI_COMM_WORLD, &c);
    }
    const double ctor = max_over_ranks(now_us() - t0);
    const double first = allreduce_us(c, buf, count);
    live.push_back(c);
    const Nccl n = counts();
    const double used = used_mib();
    if (g_rank == 0 && (k <= 3 || k % 10 == 0 || k == comms))
      std::printf("%-5s %3d  ctor %9.1f us  first allreduce %9.1f us  GPU used %9.1f MiB  "
                  "streamcoll's NCCL %9.1f MiB  own %llu shared %llu refused %llu\n",
                  what, k, ctor, first, used, static_cast<double>(n.bytes) / 1048576.0, n.own,
                  n.shared, n.refused);
  }
  for (MPI_Comm& c : live) MPI_Comm_free(&c);
}

}  // namespace

int main(int argc, char** argv) {
  int comms = 40, reps = 200, bytes = 4096;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--comms")) comms = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--bytes")) bytes = std::atoi(argv[i + 1]);
  }
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  int ok = drv.load() ? 1 : 0, all = 0;
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  CUdeviceptr buf = 0;
  ok = ok && drv.device_get(&dev, 0) == CUDA_SUCCESS && drv.retain(&ctx, dev) == CUDA_SUCCESS &&
       drv.push(ctx) == CUDA_SUCCESS && drv.alloc(&buf, static_cast<size_t>(bytes)) == CUDA_SUCCESS;
  PMPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all) {
    if (g_rank == 0) std::printf("SKIP: no usable CUDA driver\n");
    MPI_Finalize();
    return 77;
  }
  g_counts = reinterpret_cast<Counts>(dlsym(RTLD_DEFAULT, "streamcoll_nccl_counts"));
  void* p = reinterpret_cast<void*>(buf);
  const int count = bytes / 4;
  if (g_rank == 0)
    std::printf("# comm_resources: %d comms, %d reps, %d B allreduce; streamcoll %s\n", comms,
                reps, bytes, g_counts ? "loaded" : "NOT loaded");
  ctor_line("ctor-no-parent", reps);
  const double first = allreduce_us(MPI_COMM_WORLD, p, count);
  if (g_rank == 0)
    std::printf("first          world's first GPU allreduce %.1f us; GPU used %.1f MiB; "
                "streamcoll's NCCL %.1f MiB\n", first, used_mib(),
                static_cast<double>(counts().bytes) / 1048576.0);
  ctor_line("ctor-parent", reps);
  growth("dup", false, comms, p, count);
  growth("idup", true, comms, p, count);
  drv.free(buf);
  MPI_Finalize();
  return 0;
}

#else  // built without the CUDA headers
int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) std::printf("SKIP: built without the CUDA headers\n");
  MPI_Finalize();
  return 77;
}
#endif
