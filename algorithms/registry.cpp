// Which routes this build carries: one row per route, its instance and what it stops and
// frees when the runtime stops. A route's identity (name, parameters) is its row in
// base/routes.cpp; its instance is its row here, and nothing else names it.
#include "algorithms/route.hpp"

namespace streamcoll {

Route* pmpi_route();
Route* ht_route();
void ht_shutdown();
Route* blueconnect_route();
void blueconnect_release();
#if STREAMCOLL_HAVE_NCCL
Route* nccl_route();
void nccl_shutdown();
void nccl_release();
#endif
#if STREAMCOLL_HAVE_NVGROUP
Route* nvgroup_route();
void nvgroup_release();
#endif
#if STREAMCOLL_HAVE_NCCL && STREAMCOLL_HAVE_NVGROUP
Route* ccube_route();
#endif

namespace {

struct Registration {
  RouteId id;
  Route* (*instance)();  ///< the route (one per process), or nullptr where it cannot run here
  void (*shutdown)();    ///< stops its background threads (Runtime::stop, before contexts go)
  void (*release)();     ///< frees what outlives communicators (after every context is gone)
};

// In RouteId order, which is also the order of shutdown and release.
constexpr Registration kRoutes[] = {
    {RouteId::pmpi, pmpi_route, nullptr, nullptr},
#if STREAMCOLL_HAVE_NCCL
    {RouteId::nccl, nccl_route, nccl_shutdown, nccl_release},
#endif
    {RouteId::ht, ht_route, ht_shutdown, nullptr},
    {RouteId::blueconnect, blueconnect_route, nullptr, blueconnect_release},
#if STREAMCOLL_HAVE_NVGROUP
    {RouteId::nvgroup, nvgroup_route, nullptr, nvgroup_release},
#endif
#if STREAMCOLL_HAVE_NCCL && STREAMCOLL_HAVE_NVGROUP
    {RouteId::ccube, ccube_route, nullptr, nullptr},  // NCCL point-to-point + the kernels;
                                                      // nccl's shutdown and release are its
#endif
};

const Registration* registration(RouteId id) {
  for (const Registration& r : kRoutes)
    if (r.id == id) return &r;
  return nullptr;
}

}  // namespace

Route* find_route(RouteId id) {
  const Registration* r = registration(id);
  return r ? r->instance() : nullptr;  // nullptr: not in this build
}

bool route_built(RouteId id) { return registration(id) != nullptr; }

void routes_shutdown() {
  for (const Registration& r : kRoutes)
    if (r.shutdown) r.shutdown();
}

void routes_release() {
  for (const Registration& r : kRoutes)
    if (r.release) r.release();
}

}  // namespace streamcoll
