// Pass-through overhead of the shim on host-buffer MPI_Allreduce, measured in one run:
// the same process alternates batches through MPI_Allreduce (the shim, when it is
// loaded or linked) and PMPI_Allreduce (the MPI library directly), so both see the same
// machine state. Reports, per size, the median over batches of the mean latency per call.
//
//   passthrough_latency [--min 8] [--max 1M] [--iters 2000] [--batches 21] [--csv FILE]
//
// Sizes are bytes of MPI_FLOAT data, powers of two from --min to --max. Each batch is
// preceded by a barrier; batches alternate shim/direct and start with a different one
// at each size. Rank 0's timings are reported.
#include <dlfcn.h>
#include <mpi.h>

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
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--min") min_bytes = parse_bytes(argv[i + 1]);
    else if (a == "--max") max_bytes = parse_bytes(argv[i + 1]);
    else if (a == "--iters") iters = std::atoi(argv[i + 1]);
    else if (a == "--batches") batches = std::atoi(argv[i + 1]);
    else if (a == "--csv") csv = argv[i + 1];
  }
  auto version = reinterpret_cast<const char* (*)()>(dlsym(RTLD_DEFAULT, "streamcoll_version"));
  if (rank == 0)
    std::printf("# MPI_Allreduce (MPI_SUM, MPI_FLOAT, host buffers), %d ranks, %d iterations x "
                "%d batches; shim: %s\n# %10s %14s %14s %10s\n",
                size, iters, batches, version ? version() : "NOT LOADED", "bytes",
                "shim us", "direct us", "ratio");
  FILE* out = csv.empty() || rank != 0 ? nullptr : std::fopen(csv.c_str(), "w");
  if (out) std::fprintf(out, "bytes,shim_us,direct_us,ratio\n");

  std::vector<float> send(max_bytes / sizeof(float) + 1, 1.0f), recv(send.size());
  int flip = 0;
  for (uint64_t bytes = min_bytes; bytes <= max_bytes; bytes *= 2) {
    const int count = static_cast<int>(bytes / sizeof(float));
    // Fewer iterations for large messages, same number of batches.
    const int n = std::max(10, static_cast<int>(iters *
                                                 (bytes <= 4096 ? 1.0 : 4096.0 / bytes)));
    for (int w = 0; w < n; ++w) {  // warm-up both paths
      MPI_Allreduce(send.data(), recv.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      PMPI_Allreduce(send.data(), recv.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
    std::vector<double> shim, direct;
    for (int b = 0; b < 2 * batches; ++b) {
      const bool via_shim = (b + flip) % 2 == 0;
      PMPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      if (via_shim)
        for (int i = 0; i < n; ++i)
          MPI_Allreduce(send.data(), recv.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      else
        for (int i = 0; i < n; ++i)
          PMPI_Allreduce(send.data(), recv.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      double us = (MPI_Wtime() - t0) * 1e6 / n;
      (via_shim ? shim : direct).push_back(us);
    }
    flip ^= 1;
    if (recv[0] != static_cast<float>(size)) {
      std::fprintf(stderr, "wrong allreduce result %g (expected %d)\n", recv[0], size);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (rank == 0) {
      double s = median(shim), d = median(direct);
      std::printf("  %10llu %14.3f %14.3f %10.4f\n", static_cast<unsigned long long>(bytes), s, d,
                  s / d);
      if (out) std::fprintf(out, "%llu,%.4f,%.4f,%.5f\n", static_cast<unsigned long long>(bytes), s, d, s / d);
    }
  }
  if (out) std::fclose(out);
  MPI_Finalize();
  return 0;
}
