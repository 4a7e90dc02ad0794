// MPI_Init, MPI_Init_thread, MPI_Finalize, and the library's C API.
#include <mpi.h>

#include <string_view>

#include "core/runtime.hpp"
#include "shim/export.hpp"
#include "streamcoll/streamcoll.h"

using streamcoll::Runtime;

SC_EXPORT int MPI_Init(int* argc, char*** argv) {
  int rc = PMPI_Init(argc, argv);
  if (rc == MPI_SUCCESS) Runtime::get().start();
  return rc;
}

SC_EXPORT int MPI_Init_thread(int* argc, char*** argv, int required, int* provided) {
  int rc = PMPI_Init_thread(argc, argv, required, provided);
  if (rc == MPI_SUCCESS) Runtime::get().start();
  return rc;
}

SC_EXPORT int MPI_Finalize(void) {
  Runtime::get().stop();
  return PMPI_Finalize();
}

SC_EXPORT const char* streamcoll_version(void) { return STREAMCOLL_VERSION; }

SC_EXPORT int streamcoll_get_stats(const char* collective, const char* route,
                                   const char* memory, streamcoll_stat_t* out) {
  using namespace streamcoll;
  if (!out) return -1;
  int coll = -1, nb = -1, r = -1, m = -1;
  if (collective) {
    std::string_view c = collective;
    if (auto k = parse_coll(c)) {
      coll = static_cast<int>(*k), nb = 0;
    } else if (!c.empty() && c[0] == 'i' && parse_coll(c.substr(1))) {
      coll = static_cast<int>(*parse_coll(c.substr(1))), nb = 1;
    } else {
      return -1;
    }
  }
  if (route) {
    auto k = parse_route(route);
    if (!k) return -1;
    r = static_cast<int>(*k);
  }
  if (memory) {
    auto k = parse_mem(memory);
    if (!k) return -1;
    m = static_cast<int>(*k);
  }
  streamcoll_stat_t sum{0, 0, 0.0};
  Stats& stats = Runtime::get().stats();
  for (int ci = 0; ci < kNumColls; ++ci)
    for (int ni = 0; ni < 2; ++ni)
      for (int ri = 0; ri < kNumRoutes; ++ri)
        for (int mi = 0; mi < kNumMemKinds; ++mi) {
          if ((coll >= 0 && ci != coll) || (nb >= 0 && ni != nb) || (r >= 0 && ri != r) ||
              (m >= 0 && mi != m))
            continue;
          StatCell& cell = stats.cell(static_cast<Coll>(ci), ni, static_cast<RouteId>(ri),
                                      static_cast<MemKind>(mi));
          sum.calls += cell.calls.load(std::memory_order_relaxed);
          sum.bytes += cell.bytes.load(std::memory_order_relaxed);
          sum.seconds += static_cast<double>(cell.ns.load(std::memory_order_relaxed)) / 1e9;
        }
  *out = sum;
  return 0;
}
