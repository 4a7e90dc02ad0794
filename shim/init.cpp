// MPI_Init, MPI_Init_thread, MPI_Finalize, MPI_Error_string, and the library's C API.
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "algorithms/fusion.hpp"
#include "algorithms/route.hpp"
#include "base/log.hpp"
#include "config/env.hpp"
#include "config/tuning_table.hpp"
#include "core/agreement.hpp"
#include "core/comm_context.hpp"
#include "core/errors.hpp"
#include "core/next_mpi.hpp"
#include "core/runtime.hpp"
#include "shim/capture.hpp"
#include "shim/dispatch.hpp"
#include "shim/steady.hpp"
#include "shim/export.hpp"
#include "streamcoll/streamcoll.h"
#include "streamext/stream_attr.hpp"

using streamcoll::Runtime;

// The thread level. streamcoll's progress thread (routes ht, blueconnect) calls MPI
// concurrently with the application, so MPI_Init and MPI_Init_thread ask the MPI for
// MPI_THREAD_MULTIPLE where such a route can be used (Runtime::wants_thread_multiple:
// STREAMCOLL_THREAD_MULTIPLE, the effective table). The application is told the level it asked for,
// or less if that is all the MPI gives (MPI-4.0 section 11.2.1 lets `provided` differ
// from what the MPI could do), and MPI_Query_thread answers the same.
namespace {

// What the runtime (core) stops at MPI_Finalize from the layers above it: the routes'
// threads and state, the stream attribute's. Set when the library loads.
// STREAMCOLL_STATS: the NCCL communicators made (summed over ranks) and the GPU memory
// they held (the most on one process), on rank 0.
std::string resources_report(MPI_Comm comm) {
  const streamcoll::ResourceCounts c = streamcoll::routes_resources();
  uint64_t sums[3] = {c.nccl_own, c.nccl_shared, c.nccl_refused}, sum[3] = {0, 0, 0};
  uint64_t peaks[1] = {c.nccl_peak_bytes}, peak[1] = {0};
  int rank = 0;
  PMPI_Comm_rank(comm, &rank);
  PMPI_Reduce(sums, sum, 3, MPI_UINT64_T, MPI_SUM, 0, comm);
  PMPI_Reduce(peaks, peak, 1, MPI_UINT64_T, MPI_MAX, 0, comm);
  if (rank != 0) return "";
  char line[320];
  std::snprintf(line, sizeof line,
                "streamcoll resources: NCCL communicators made %llu with resources of their "
                "own, %llu split sharing a parent's, %llu turned away by the budget (summed over "
                "ranks); GPU memory they took: at most %.1f MiB on one process\n",
                static_cast<unsigned long long>(sum[0]), static_cast<unsigned long long>(sum[1]),
                static_cast<unsigned long long>(sum[2]), static_cast<double>(peak[0]) / 1048576.0);
  return line;
}

[[maybe_unused]] const bool g_stop_hooks = [] {
  Runtime::get().set_stop_hooks({streamcoll::routes_shutdown, streamcoll::routes_release,
                                 streamcoll::streamext::stop, resources_report});
  return true;
}();
}  // namespace

namespace {

// `plain`: the application called MPI_Init. The next MPI_Init (a PMPI tool's after
// streamcoll, or the MPI's: core/next_mpi.hpp) gets it as it was, unless streamcoll must
// ask for MPI_THREAD_MULTIPLE: then the next MPI_Init_thread does.
int init_thread(int* argc, char*** argv, int required, int* provided, bool plain) {
  // Beneath streamcoll's Fortran MPI_INIT (MPICH's binding calls C): that wrapper asks for
  // the thread level and starts streamcoll itself.
  if (streamcoll::g_in_binding)
    return plain ? SC_NEXT(MPI_Init)(argc, argv) : SC_NEXT(MPI_Init_thread)(argc, argv, required, provided);
  const int ask = streamcoll::Runtime::wants_thread_multiple()
                      ? std::max(required, static_cast<int>(MPI_THREAD_MULTIPLE))
                      : required;
  int got = MPI_THREAD_SINGLE;
  int rc;
  if (plain && ask == required) {
    rc = SC_NEXT(MPI_Init)(argc, argv);
    if (rc == MPI_SUCCESS) PMPI_Query_thread(&got);
  } else {
    rc = SC_NEXT(MPI_Init_thread)(argc, argv, ask, &got);
  }
  if (rc != MPI_SUCCESS) return rc;
  const int told = std::min(required, got);
  streamcoll::set_application_thread_level(told);
  if (provided) *provided = told;
  Runtime::get().start();
  return rc;
}
}  // namespace

SC_EXPORT int MPI_Init(int* argc, char*** argv) {
  // MPI_Init gives MPI_THREAD_SINGLE (MPI-4.0 section 11.2.1).
  return init_thread(argc, argv, MPI_THREAD_SINGLE, nullptr, true);
}

SC_EXPORT int MPI_Init_thread(int* argc, char*** argv, int required, int* provided) {
  return init_thread(argc, argv, required, provided, false);
}

SC_EXPORT int MPI_Query_thread(int* provided) {
  const int level = streamcoll::application_thread_level();
  if (level < 0 || provided == nullptr) return SC_NEXT(MPI_Query_thread)(provided);
  int initialized = 0;
  PMPI_Initialized(&initialized);
  if (!initialized) return SC_NEXT(MPI_Query_thread)(provided);  // the MPI reports the error
  *provided = level;
  return MPI_SUCCESS;
}

// streamcoll's own error codes under an MPI that cannot give their strings back
// (core/errors.hpp); every other code goes on unchanged.
SC_EXPORT int MPI_Error_string(int code, char* text, int* len) {
  if (const char* own = streamcoll::lost_error_string(code); own && text && len) {
    std::snprintf(text, MPI_MAX_ERROR_STRING, "%s", own);
    *len = static_cast<int>(std::strlen(text));
    return MPI_SUCCESS;
  }
  return SC_NEXT(MPI_Error_string)(code, text, len);
}

SC_EXPORT int MPI_Finalize(void) {
  if (!streamcoll::g_in_binding) {
    streamcoll::capture::stop();  // replayed calls still queued are made first
    Runtime::get().stop();
  }
  return SC_NEXT(MPI_Finalize)();
}

SC_EXPORT int streamcoll_comm_set_route(MPI_Comm comm, const char* spec) {
  using namespace streamcoll;
  Runtime& rt = Runtime::get();
  if (!rt.active()) return MPI_ERR_OTHER;
  if (comm == MPI_COMM_NULL) return MPI_ERR_COMM;
  int inter = 0;
  if (PMPI_Comm_test_inter(comm, &inter) != MPI_SUCCESS || inter) return MPI_ERR_COMM;
  std::shared_ptr<config::TuningTable> table;
  uint32_t colls = 0;
  if (spec && *spec) {
    std::optional<config::ParseError> err;
    auto rules = config::TuningTable::parse_forced(spec, &err);
    if (err) {
      err->source = "streamcoll_comm_set_route";
      log_error("%s", err->to_string().c_str());
      return MPI_ERR_ARG;
    }
    for (const config::Rule& r : rules) colls |= r.colls;
    table = std::make_shared<config::TuningTable>();
    table->prepend(std::move(rules));
  }
  CommContext* ctx = comm_context(comm, true);  // collective the first time
  if (!ctx) return MPI_ERR_OTHER;
  ctx->set_forced_routes(std::move(table));
  if (colls) rt.add_forced_routes(colls);
  return MPI_SUCCESS;
}

SC_EXPORT const char* streamcoll_version(void) { return STREAMCOLL_VERSION; }

SC_EXPORT const char* streamcoll_route_name(int index) {
  const auto& routes = streamcoll::route_table();
  // The names are literals (string_view over a NUL-terminated string): data() is a C string.
  return index >= 0 && index < static_cast<int>(routes.size()) ? routes[index].name.data() : nullptr;
}

SC_EXPORT void streamcoll_fusion_counts(unsigned long long* calls, unsigned long long* messages,
                                        unsigned long long* agreements) {
  const streamcoll::fusion::Counts c = streamcoll::fusion::process_counts();
  if (calls) *calls = c.calls;
  if (messages) *messages = c.messages;
  if (agreements) *agreements = c.agreements;
}

SC_EXPORT unsigned long long streamcoll_steady_calls(void) { return streamcoll::steady::calls(); }

SC_EXPORT void streamcoll_nccl_counts(unsigned long long* own, unsigned long long* shared,
                                      unsigned long long* live, unsigned long long* refused,
                                      unsigned long long* gpu_bytes,
                                      unsigned long long* peak_gpu_bytes) {
  const streamcoll::ResourceCounts c = streamcoll::routes_resources();
  if (own) *own = c.nccl_own;
  if (shared) *shared = c.nccl_shared;
  if (live) *live = c.nccl_live;
  if (refused) *refused = c.nccl_refused;
  if (gpu_bytes) *gpu_bytes = c.nccl_bytes;
  if (peak_gpu_bytes) *peak_gpu_bytes = c.nccl_peak_bytes;
}

SC_EXPORT void streamcoll_capture_counts(unsigned long long* lanes_started,
                                         unsigned long long* lanes_live,
                                         unsigned long long* replayed,
                                         unsigned long long* skipped) {
  const streamcoll::capture::Counts c = streamcoll::capture::counts();
  if (lanes_started) *lanes_started = c.lanes_started;
  if (lanes_live) *lanes_live = c.lanes_live;
  if (replayed) *replayed = c.replayed;
  if (skipped) *skipped = c.skipped;
}

SC_EXPORT void streamcoll_agreement_counts(unsigned long long* blocking,
                                           unsigned long long* refreshes,
                                           unsigned long long* waited) {
  const streamcoll::AgreementCounts c = streamcoll::agreement_counts();
  if (blocking) *blocking = c.blocking;
  if (refreshes) *refreshes = c.refreshes;
  if (waited) *waited = c.waited;
}

SC_EXPORT unsigned long long streamcoll_fusion_messages_on(const char* route) {
  if (!route) return 0;
  const auto id = streamcoll::parse_route(route);
  return id ? streamcoll::fusion::process_messages_on(*id) : 0;
}

SC_EXPORT unsigned long long streamcoll_fusion_messages_packed_on_gpu(void) {
  return streamcoll::fusion::process_messages_packed_on_gpu();
}

SC_EXPORT int streamcoll_last_route(char* buf, int len) {
  using namespace streamcoll;
  if (!buf || len <= 0 || !Runtime::get().stats_on()) return -1;
  const std::string& text = last_route_text();
  if (text.empty()) return -1;
  const size_t n = std::min(text.size(), static_cast<size_t>(len) - 1);
  std::memcpy(buf, text.data(), n);
  buf[n] = '\0';
  return static_cast<int>(text.size());
}

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
