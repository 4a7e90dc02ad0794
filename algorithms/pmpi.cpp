// pmpi: the real MPI call, unchanged. The fallback for everything, and the route for
// host buffers in the default table. Cost: whatever the MPI library's own algorithm costs.
#include "algorithms/route.hpp"
#include "core/pmpi_call.hpp"

namespace streamcoll {

namespace {
class PmpiRoute final : public Route {
 public:
  RouteId id() const override { return RouteId::pmpi; }
  bool accepts(const CollArgs&, CommContext&, const config::RouteChoice&,
               const CallEnv&) override {
    return true;
  }
  // Stream semantics for pmpi (the stream synchronised first) are the dispatcher's.
  int run(const CollArgs& a, CommContext&, const config::RouteChoice&, const CallEnv&) override {
    return run_pmpi(a);
  }
};
}  // namespace

Route* pmpi_route() {
  static PmpiRoute r;
  return &r;
}

extern const RouteEntry pmpi_entry = {pmpi_route};

}  // namespace streamcoll
