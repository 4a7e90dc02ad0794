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
void nccl_derive(CommContext& parent, MPI_Comm child);
void nccl_resources(ResourceCounts* c);
#endif
#if STREAMCOLL_HAVE_NVGROUP
Route* nvgroup_route();
void nvgroup_release();
#endif
#if STREAMCOLL_HAVE_NCCL && STREAMCOLL_HAVE_NVGROUP
Route* ccube_route();
#endif
#if STREAMCOLL_HAVE_CUDA
Route* self_route();
#endif

namespace {

struct Registration {
  RouteId id;
  Route* (*instance)();  ///< the route (one per process), or nullptr where it cannot run here
  void (*shutdown)();    ///< stops its background threads (Runtime::stop, before contexts go)
  void (*release)();     ///< frees what outlives communicators (after every context is gone)
  /// At a communicator constructor (collective over the parent): derives the child's
  /// state from the parent's (routes_derive), or nullptr.
  void (*derive)(CommContext& parent, MPI_Comm child) = nullptr;
};

// In RouteId order, which is also the order of shutdown and release.
constexpr Registration kRoutes[] = {
    {RouteId::pmpi, pmpi_route, nullptr, nullptr},
#if STREAMCOLL_HAVE_NCCL
    {RouteId::nccl, nccl_route, nccl_shutdown, nccl_release, nccl_derive},
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
#if STREAMCOLL_HAVE_CUDA
    {RouteId::self, self_route, nullptr, nullptr},  // one rank: copies, nothing kept
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

void routes_derive(CommContext& parent, MPI_Comm child) {
  for (const Registration& r : kRoutes)
    if (r.derive) r.derive(parent, child);
}

ResourceCounts routes_resources() {
  ResourceCounts c;
#if STREAMCOLL_HAVE_NCCL
  nccl_resources(&c);
#endif
  return c;
}

void routes_release() {
  for (const Registration& r : kRoutes)
    if (r.release) r.release();
}

}  // namespace streamcoll
