// Small helpers the benchmark programs share (sc_bench, stream_latency, ht_latency):
// a clock, agreement on a flag across ranks, shell quoting for the command lines they
// print, and the routes' names. Header-only; plain MPI and the standard library.
#pragma once

#include <dlfcn.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

namespace bench {

/// Microseconds on the steady clock.
inline double now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

/// All ranks agree on a flag: its minimum over MPI_COMM_WORLD (PMPI_, so streamcoll's
/// statistics do not count it). Collective.
inline int all_min(int v) {
  int r = 0;
  PMPI_Allreduce(&v, &r, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return r;
}

/// `s` as one shell word: as it is when it has no special characters, else in single
/// quotes.
inline std::string quote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                        "0123456789_-+=/.,:@%") == std::string::npos)
    return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

/// The q-quantile (0..1) of v, nearest rank; 0 for an empty v.
inline double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

/// The routes' names in streamcoll's order ("pmpi", "nccl", ...), asked of the streamcoll
/// loaded in this process (streamcoll_route_name, found with dlsym), so that no benchmark
/// keeps its own list; empty when streamcoll is not loaded.
inline std::vector<std::string> route_names() {
  using RouteName = const char* (*)(int);
  std::vector<std::string> names;
  auto fn = reinterpret_cast<RouteName>(dlsym(RTLD_DEFAULT, "streamcoll_route_name"));
  for (int i = 0; fn && fn(i); ++i) names.emplace_back(fn(i));
  return names;
}

}  // namespace bench
