#include "core/stats.hpp"

#include <cstdio>
#include <vector>

namespace streamcoll {

std::string call_name(Coll c, bool nonblocking) {
  return (nonblocking ? "i" : "") + std::string(name(c));
}

std::string Stats::report(MPI_Comm comm) {
  // calls, bytes and ns summed over ranks, ns also as the maximum over ranks.
  std::vector<uint64_t> local(3 * kCells), sum(3 * kCells), max(kCells);
  for (size_t i = 0; i < kCells; ++i) {
    local[3 * i] = cells_[i].calls.load(std::memory_order_relaxed);
    local[3 * i + 1] = cells_[i].bytes.load(std::memory_order_relaxed);
    local[3 * i + 2] = cells_[i].ns.load(std::memory_order_relaxed);
  }
  std::vector<uint64_t> local_ns(kCells);
  for (size_t i = 0; i < kCells; ++i) local_ns[i] = local[3 * i + 2];
  int rank = 0, size = 1;
  PMPI_Comm_rank(comm, &rank);
  PMPI_Comm_size(comm, &size);
  PMPI_Reduce(local.data(), sum.data(), static_cast<int>(local.size()), MPI_UINT64_T, MPI_SUM, 0,
              comm);
  PMPI_Reduce(local_ns.data(), max.data(), static_cast<int>(kCells), MPI_UINT64_T, MPI_MAX, 0,
              comm);
  if (rank != 0) return "";

  std::string out;
  char line[256];
  std::snprintf(line, sizeof line,
                "streamcoll statistics (%d ranks; calls and bytes summed over ranks, time per "
                "call averaged over ranks)\n",
                size);
  out += line;
  std::snprintf(line, sizeof line, "%-24s %-12s %-8s %12s %16s %14s %14s\n", "collective",
                "route", "memory", "calls", "bytes", "avg us/call", "max rank s");
  out += line;
  bool any = false;
  for (int c = 0; c < kNumColls; ++c)
    for (int nb = 0; nb < 2; ++nb)
      for (int r = 0; r < kNumRoutes; ++r)
        for (int m = 0; m < kNumMemKinds; ++m) {
          size_t i = index(static_cast<Coll>(c), nb, static_cast<RouteId>(r),
                           static_cast<MemKind>(m));
          uint64_t calls = sum[3 * i];
          if (calls == 0) continue;
          any = true;
          double avg_us = static_cast<double>(sum[3 * i + 2]) / 1e3 / static_cast<double>(calls);
          std::snprintf(line, sizeof line, "%-24s %-12s %-8s %12llu %16llu %14.2f %14.6f\n",
                        call_name(static_cast<Coll>(c), nb).c_str(),
                        std::string(name(static_cast<RouteId>(r))).c_str(),
                        std::string(name(static_cast<MemKind>(m))).c_str(),
                        static_cast<unsigned long long>(calls),
                        static_cast<unsigned long long>(sum[3 * i + 1]), avg_us,
                        static_cast<double>(max[i]) / 1e9);
          out += line;
        }
  if (!any) out += "(no collective calls)\n";
  return out;
}

}  // namespace streamcoll
