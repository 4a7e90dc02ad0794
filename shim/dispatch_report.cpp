// What a routed call reports, when asked to: why it took its route (STREAMCOLL_DEBUG=info,
// explain_once), what its NVTX range and timeline record say (trace_routed), and its
// statistics (STREAMCOLL_STATS: record_call, streamcoll_last_route's text).
#include <mpi.h>

#include <mutex>
#include <string>
#include <unordered_set>

#include "base/log.hpp"
#include "core/comm_context.hpp"
#include "core/runtime.hpp"
#include "core/stats.hpp"
#include "core/trace.hpp"
#include "shim/capture.hpp"
#include "shim/dispatch.hpp"
#include "shim/dispatch_decision.hpp"

namespace streamcoll {
namespace dispatch_detail {

void explain_once(const CollArgs& a, const Decision& d) {
  int size_class = 0;
  for (uint64_t b = d.bytes; b > 1; b >>= 2) ++size_class;
  const uint64_t key = static_cast<uint64_t>(a.coll) | uint64_t{a.nonblocking} << 8 |
                       static_cast<uint64_t>(d.route) << 9 | static_cast<uint64_t>(d.env.mem) << 17 |
                       uint64_t{d.env.has_stream} << 25 | static_cast<uint64_t>(size_class) << 26;
  // A call decided without a communicator context (no rule can route its collective
  // here: straight to the MPI) is explained once per process.
  static std::mutex no_ctx_mu;
  static std::unordered_set<uint64_t> no_ctx;
  {
    std::lock_guard<std::mutex> lock(d.ctx ? d.ctx->explained_mu : no_ctx_mu);
    if (!(d.ctx ? d.ctx->explained : no_ctx).insert(key).second) return;
  }
  int size = d.ctx ? d.ctx->size : 0;
  if (!size) PMPI_Comm_size(a.comm, &size);
  SC_INFO("%s of %llu B on %s memory%s, %d ranks: %s (%s)", call_name(a.coll, a.nonblocking).c_str(),
          static_cast<unsigned long long>(d.bytes), std::string(name(d.env.mem)).c_str(),
          d.env.has_stream ? " with a stream" : "", size, std::string(name(d.route)).c_str(),
          !d.why.empty() ? d.why.c_str()
          : d.ctx        ? "the first matching rule"
                         : "no rule of the table can route this collective here");
}

void trace_routed(trace::Call& t, const CollArgs& a, const Decision& d) {
  const bool gpu = d.env.mem == MemKind::device || d.env.mem == MemKind::managed ||
                   d.env.mem == MemKind::mixed;
  const trace::Mode mode = !gpu                   ? trace::Mode::host
                           : capture::replaying() ? trace::Mode::captured
                           : d.env.has_stream     ? trace::Mode::stream
                                                  : trace::Mode::classic;
  int size = d.ctx ? d.ctx->size : 0;
  if (!size) PMPI_Comm_size(a.comm, &size);
  t.routed(d.route, d.env.mem, mode, d.bytes, size, d.env.has_stream ? d.env.stream : nullptr);
}

}  // namespace dispatch_detail

using dispatch_detail::now_ns;

uint64_t stats_clock() { return now_ns(); }

void record_call(Coll c, bool nonblocking, RouteId route, MemKind mem, uint64_t bytes,
                 uint64_t t0, const config::RouteChoice* choice) {
  Runtime::get().stats().record(c, nonblocking, route, mem, bytes, now_ns() - t0);
  // The route with its parameters, for streamcoll_last_route (statistics only: the
  // string costs a little per call).
  std::string& last = last_route_text();
  last = name(route);
  if (choice && choice->route == route)  // (pmpi's only parameter: fuse=)
    for (const auto& [k, v] : choice->params) last += " " + k + "=" + v;
}

std::string& last_route_text() {
  thread_local std::string text;
  return text;
}

}  // namespace streamcoll
