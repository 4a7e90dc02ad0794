// Per-process call statistics: calls, bytes and host time per (collective, blocking or
// not, route, memory kind). Recorded only when STREAMCOLL_STATS=1, so the pass-through
// path pays nothing otherwise. Lock-free (relaxed atomics): any thread may record.
#pragma once

#include <mpi.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <string>

#include "base/types.hpp"

namespace streamcoll {

struct StatCell {
  std::atomic<uint64_t> calls{0};
  std::atomic<uint64_t> bytes{0};
  std::atomic<uint64_t> ns{0};  ///< host time spent inside the call
};

class Stats {
 public:
  void record(Coll c, bool nonblocking, RouteId r, MemKind m, uint64_t bytes, uint64_t ns) {
    StatCell& s = cell(c, nonblocking, r, m);
    s.calls.fetch_add(1, std::memory_order_relaxed);
    s.bytes.fetch_add(bytes, std::memory_order_relaxed);
    s.ns.fetch_add(ns, std::memory_order_relaxed);
  }
  StatCell& cell(Coll c, bool nonblocking, RouteId r, MemKind m) {
    return cells_[index(c, nonblocking, r, m)];
  }
  static constexpr size_t index(Coll c, bool nb, RouteId r, MemKind m) {
    return ((static_cast<size_t>(c) * 2 + nb) * kNumRoutes + static_cast<size_t>(r)) *
               kNumMemKinds + static_cast<size_t>(m);
  }
  static constexpr size_t kCells = kNumColls * 2 * kNumRoutes * kNumMemKinds;

  /// Sums this process's counters over all ranks of `comm` (collective) and returns the
  /// table on rank 0 of comm, "" elsewhere.
  std::string report(MPI_Comm comm);

 private:
  std::array<StatCell, kCells> cells_{};
};

/// "iallreduce" for the non-blocking form, "allreduce" otherwise.
std::string call_name(Coll c, bool nonblocking);

}  // namespace streamcoll
