// Which routes this build carries. A route joins by adding its factory here.
#include "algorithms/route.hpp"

namespace streamcoll {

Route* pmpi_route();
Route* ht_route();
Route* blueconnect_route();
void ht_shutdown();
#if STREAMCOLL_HAVE_NVGROUP
Route* nvgroup_route();
void nvgroup_release();
#endif
#if STREAMCOLL_HAVE_NCCL
Route* nccl_route();
Route* ccube_route();
void nccl_shutdown();
void nccl_release();
#endif

Route* find_route(RouteId id) {
  switch (id) {
    case RouteId::pmpi: return pmpi_route();
    case RouteId::ht: return ht_route();
    case RouteId::blueconnect: return blueconnect_route();
#if STREAMCOLL_HAVE_NCCL
    case RouteId::nccl: return nccl_route();
#endif
#if STREAMCOLL_HAVE_NVGROUP
    case RouteId::nvgroup: return nvgroup_route();
#endif
#if STREAMCOLL_HAVE_NCCL && STREAMCOLL_HAVE_NVGROUP
    case RouteId::ccube: return ccube_route();  // NCCL point-to-point + the kernels
#endif
    default: return nullptr;  // not in this build
  }
}

void routes_shutdown() {
#if STREAMCOLL_HAVE_NCCL
  nccl_shutdown();
#endif
  ht_shutdown();
}

void routes_release() {
#if STREAMCOLL_HAVE_NCCL
  nccl_release();
#endif
#if STREAMCOLL_HAVE_NVGROUP
  nvgroup_release();
#endif
}

}  // namespace streamcoll
