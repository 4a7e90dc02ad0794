// Pass-through overhead of the shim on host-buffer MPI_Allreduce, measured in one run:
// the same process alternates batches through MPI_Allreduce (the shim, when it is
// loaded or linked) and PMPI_Allreduce (the MPI library directly), so both see the same
// machine state. Reports, per size, the median over batches of the mean latency per call,
// their ratio, and what the shim adds per call in nanoseconds (shim - direct).
//
//   passthrough_latency [--min 8] [--max 1M] [--iters 2000] [--batches 21] [--csv FILE]
//                       [--cuda] [--assert-kinds VALUE] [--coll allreduce|bcast|allgather|reduce]
//                       [--loop batches|tight] [--via both|shim|direct]
//
// Sizes are bytes of MPI_FLOAT data, powers of two from --min to --max. With --loop
// batches (the default) each batch is preceded by a barrier; with --loop tight only the
// first batch of a size is (the calls run back to back, as in an application's loop).
// Batches alternate shim/direct and start with a different one at each size. --via shim
// or direct: every call goes that way (no alternation; the other column reads 0): for
// counting instructions per call (scripts/decision-cost.sh) and for runs compared across
// processes. Rank 0's timings are reported.
// --cuda: the program loads the CUDA driver first (dlopen libcuda.so.1, cuInit), as every
// CUDA program does: streamcoll then classifies buffers and agrees on what ranks see
// (docs/design.md, "Safety rules"); its own collectives per shim call (streamcoll_agreement_counts:
// blocking agreements and refreshes) are reported per size. The fake driver of
// tests/fake stands in for a real one on a machine without a GPU (LD_LIBRARY_PATH).
// --assert-kinds VALUE: the calls run on a duplicate of MPI_COMM_WORLD made with
// MPI_Comm_dup_with_info and mpi_assert_memory_alloc_kinds=VALUE ("system": the program
// asserts host memory only; MPI 4.1 sec. 11.4.3), for both paths.
// --coll: the collective timed (default allreduce: MPI_SUM; reduce: MPI_SUM to rank 0; bcast
// from rank 0; allgather of BYTES per rank; persistent: a persistent allreduce, MPI_SUM,
// made per size with MPI_Allreduce_init (Open MPI: MPIX_) through the shim and with the
// PMPI_ init directly, each call MPI_Start + MPI_Wait on its own request); every result is
// checked after each size.
#include <dlfcn.h>
#include <mpi.h>
#if defined(OPEN_MPI) && OPEN_MPI
#include <mpi-ext.h>
#define PCOLL(name) MPIX_##name
#define PPCOLL(name) PMPIX_##name
#else
#define PCOLL(name) MPI_##name
#define PPCOLL(name) PMPI_##name
#endif

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

uint64_t parse_bytes(const char* s) {
  char* end = nullptr;
  uint64_t v = std::strtoull(s, &end, 10);
  if (*end == 'K') v <<= 10;
  if (*end == 'M') v <<= 20;
  return v;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  uint64_t min_bytes = 8, max_bytes = 1 << 20;
  int iters = 2000, batches = 21;
  std::string csv;
  bool cuda = false;
  std::string kinds, coll = "allreduce", loop = "batches", via = "both";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--cuda") {
      cuda = true;
      continue;
    }
    if (i + 1 >= argc) break;
    const char* v = argv[++i];
    if (a == "--min") min_bytes = parse_bytes(v);
    else if (a == "--max") max_bytes = parse_bytes(v);
    else if (a == "--iters") iters = std::atoi(v);
    else if (a == "--batches") batches = std::atoi(v);
    else if (a == "--csv") csv = v;
    else if (a == "--assert-kinds") kinds = v;
    else if (a == "--coll") coll = v;
    else if (a == "--loop") loop = v;
    else if (a == "--via") via = v;
  }
  if ((loop != "batches" && loop != "tight") || (via != "both" && via != "shim" && via != "direct")) {
    if (rank == 0) std::fprintf(stderr, "--loop: batches or tight; --via: both, shim or direct\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  if (coll != "allreduce" && coll != "bcast" && coll != "allgather" && coll != "reduce" &&
      coll != "persistent") {
    if (rank == 0) std::fprintf(stderr, "--coll: allreduce, reduce, bcast, allgather or persistent\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  if (cuda) {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    auto init = lib ? reinterpret_cast<int (*)(unsigned)>(dlsym(lib, "cuInit")) : nullptr;
    if (!init || init(0) != 0) {
      std::fprintf(stderr, "--cuda: no usable libcuda.so.1 (%s)\n", lib ? "cuInit failed" : dlerror());
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }
  MPI_Comm comm = MPI_COMM_WORLD;
  if (!kinds.empty()) {
    MPI_Info info;
    MPI_Info_create(&info);
    MPI_Info_set(info, "mpi_assert_memory_alloc_kinds", kinds.c_str());
    MPI_Comm_dup_with_info(MPI_COMM_WORLD, info, &comm);
    MPI_Info_free(&info);
  }
  using Counts = void (*)(unsigned long long*, unsigned long long*, unsigned long long*);
  auto counts = reinterpret_cast<Counts>(dlsym(RTLD_DEFAULT, "streamcoll_agreement_counts"));
  auto own_collectives = [&] {
    unsigned long long blocking = 0, refreshes = 0;
    if (counts) counts(&blocking, &refreshes, nullptr);
    return blocking + refreshes;
  };
  auto version = reinterpret_cast<const char* (*)()>(dlsym(RTLD_DEFAULT, "streamcoll_version"));
  if (rank == 0)
    std::printf("# MPI_%s (%sMPI_FLOAT, host buffers), %d ranks, %d iterations x "
                "%d batches (%s loop, via %s); shim: %s; CUDA driver %s%s%s\n"
                "# %10s %14s %14s %10s %10s %14s\n",
                coll == "allreduce" ? "Allreduce" : coll == "reduce" ? "Reduce"
                : coll == "bcast"   ? "Bcast"     : coll == "persistent" ? "Allreduce_init+Start+Wait" : "Allgather",
                coll == "allreduce" || coll == "persistent" ? "MPI_SUM, " : coll == "reduce" ? "MPI_SUM to rank 0, "
                : coll == "bcast"   ? "from rank 0, " : "",
                size, iters, batches, loop.c_str(), via.c_str(), version ? version() : "NOT LOADED",
                cuda ? "loaded" : "not loaded", kinds.empty() ? "" : "; asserted kinds: ",
                kinds.c_str(), "bytes", "shim us", "direct us", "ratio", "added ns",
                "own coll/call");
  FILE* out = csv.empty() || rank != 0 ? nullptr : std::fopen(csv.c_str(), "w");
  if (out) std::fprintf(out, "bytes,shim_us,direct_us,ratio,added_ns,own_per_call\n");

  std::vector<float> send(max_bytes / sizeof(float) + 1, 1.0f),
      recv(send.size() * static_cast<size_t>(coll == "allgather" ? size : 1));
  // The call timed, through streamcoll (MPI_) or straight to the MPI (PMPI_); the
  // collective chosen once (no string compare per call on either path).
  enum class Which { allreduce, reduce, bcast, allgather, persistent };
  const Which which = coll == "bcast" ? Which::bcast : coll == "allgather" ? Which::allgather
                      : coll == "reduce" ? Which::reduce : coll == "persistent" ? Which::persistent
                      : Which::allreduce;
  MPI_Request shim_req = MPI_REQUEST_NULL, direct_req = MPI_REQUEST_NULL;  // persistent
  auto call = [&](bool via_shim, int) {
    MPI_Request* r = via_shim ? &shim_req : &direct_req;
    (via_shim ? MPI_Start : PMPI_Start)(r);
    (via_shim ? MPI_Wait : PMPI_Wait)(r, MPI_STATUS_IGNORE);
  };
  auto blocking = [&](bool via_shim, int count) {
    if (which == Which::bcast) {
      if (rank == 0) std::fill(recv.begin(), recv.begin() + count, 1.0f);
      (via_shim ? MPI_Bcast : PMPI_Bcast)(recv.data(), count, MPI_FLOAT, 0, comm);
    } else if (which == Which::allgather) {
      (via_shim ? MPI_Allgather : PMPI_Allgather)(send.data(), count, MPI_FLOAT, recv.data(),
                                                 count, MPI_FLOAT, comm);
    } else if (which == Which::reduce) {
      (via_shim ? MPI_Reduce : PMPI_Reduce)(send.data(), recv.data(), count, MPI_FLOAT, MPI_SUM,
                                           0, comm);
    } else {
      (via_shim ? MPI_Allreduce : PMPI_Allreduce)(send.data(), recv.data(), count, MPI_FLOAT,
                                                 MPI_SUM, comm);
    }
  };
  unsigned long long shim_calls = 0;  // (scripts/decision-cost.sh divides by it)
  auto timed = [&](bool via_shim, int count) {
    shim_calls += via_shim;
    if (which == Which::persistent) call(via_shim, count);
    else blocking(via_shim, count);
  };
  int flip = 0;
  for (uint64_t bytes = min_bytes; bytes <= max_bytes; bytes *= 2) {
    const int count = static_cast<int>(bytes / sizeof(float));
    if (which == Which::persistent) {
      PCOLL(Allreduce_init)(send.data(), recv.data(), count, MPI_FLOAT, MPI_SUM, comm,
                            MPI_INFO_NULL, &shim_req);
      PPCOLL(Allreduce_init)(send.data(), recv.data(), count, MPI_FLOAT, MPI_SUM, comm,
                             MPI_INFO_NULL, &direct_req);
    }
    // Fewer iterations for large messages, same number of batches.
    const int n = std::max(10, static_cast<int>(iters *
                                                 (bytes <= 4096 ? 1.0 : 4096.0 / bytes)));
    for (int w = 0; w < n; ++w) {  // warm-up both paths
      if (via != "direct") timed(true, count);
      if (via != "shim") timed(false, count);
    }
    std::vector<double> shim, direct;
    const unsigned long long own0 = own_collectives();
    for (int b = 0; b < 2 * batches; ++b) {
      const bool via_shim = via == "both" ? (b + flip) % 2 == 0 : via == "shim";
      if (loop == "batches" || b == 0) PMPI_Barrier(comm);
      double t0 = MPI_Wtime();
      for (int i = 0; i < n; ++i) timed(via_shim, count);
      double us = (MPI_Wtime() - t0) * 1e6 / n;
      (via_shim ? shim : direct).push_back(us);
    }
    flip ^= 1;
    // Checked after a shim call whose output was cleared first.
    std::fill(recv.begin(), recv.end(), 0.0f);
    timed(via != "direct", count);
    if (which == Which::persistent) {
      MPI_Request_free(&shim_req);
      PMPI_Request_free(&direct_req);
    }
    const float want = coll == "allreduce" || coll == "reduce" || coll == "persistent"
                           ? static_cast<float>(size) : 1.0f;
    const size_t filled = coll == "reduce" && rank != 0
                              ? 0
                              : static_cast<size_t>(count) * (coll == "allgather" ? size : 1);
    for (size_t i = 0; i < filled; ++i)
      if (recv[i] != want) {
        std::fprintf(stderr, "wrong %s result %g at %zu (expected %g)\n", coll.c_str(), recv[i],
                     i, want);
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
    // streamcoll's own collectives per timed shim call (the barriers are the MPI's own)
    const double own = shim.empty() ? 0.0
                       : static_cast<double>(own_collectives() - own0) /
                             (static_cast<double>(n) * static_cast<double>(shim.size()));
    if (rank == 0) {
      const double s = shim.empty() ? 0.0 : median(shim), d = direct.empty() ? 0.0 : median(direct);
      const double ratio = s > 0 && d > 0 ? s / d : 0.0, added = s > 0 && d > 0 ? (s - d) * 1e3 : 0.0;
      std::printf("  %10llu %14.3f %14.3f %10.4f %10.1f %14.4f\n",
                  static_cast<unsigned long long>(bytes), s, d, ratio, added, own);
      if (out)
        std::fprintf(out, "%llu,%.4f,%.4f,%.5f,%.2f,%.5f\n", static_cast<unsigned long long>(bytes),
                     s, d, ratio, added, own);
    }
  }
  if (out) std::fclose(out);
  if (rank == 0) std::printf("# calls through the shim: %llu\n", shim_calls);
  if (comm != MPI_COMM_WORLD) MPI_Comm_free(&comm);
  MPI_Finalize();
  return 0;
}
