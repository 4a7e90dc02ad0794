// stub: a route that exists only in the test build of tests/tools/stub_route.sh, which
// copies the source tree, adds this file as algorithms/stub.cpp and its row to
// base/routes.def, and nothing else: that the build carries it and the dispatcher sends
// it calls is what "adding a route is one file plus one row" (docs/design.md, "Adding a
// route") means. It takes blocking classic MPI_Allreduce calls and runs them as the MPI's
// own call on host copies of this rank's buffers (core/host_staging: the copies ordered
// after the application's streams, a lost input told to every rank), and counts them.
#include <atomic>
#include <cstdio>

#include "algorithms/route.hpp"
#include "core/host_staging.hpp"

namespace streamcoll {
namespace {

std::atomic<long> g_calls{0};

class StubRoute final : public Route {
 public:
  RouteId id() const override { return RouteId::stub; }
  bool accepts(const CollArgs& a, CommContext&, const config::RouteChoice&,
               const CallEnv& agreed) override {
    return a.coll == Coll::allreduce && !a.nonblocking && !agreed.agreed_stream;
  }
  int run(const CollArgs& a, CommContext&, const config::RouteChoice&, const CallEnv&) override {
    g_calls.fetch_add(1, std::memory_order_relaxed);
    return host_staging::run(a, host_staging::Outcomes::exchanged, MPI_SUCCESS, nullptr);
  }
};

Route* stub_route() {
  static StubRoute r;
  return &r;
}

// At shutdown (its entry's hook, called by routes_shutdown): how many calls it carried,
// which the test reads.
void stub_shutdown() { std::fprintf(stderr, "route stub carried %ld call(s)\n", g_calls.load()); }

}  // namespace

extern const RouteEntry stub_entry = {stub_route, stub_shutdown};

}  // namespace streamcoll
