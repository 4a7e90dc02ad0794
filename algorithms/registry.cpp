// Which routes this build carries. A route joins by adding its factory here.
#include "algorithms/route.hpp"

namespace streamcoll {

Route* pmpi_route();
#if STREAMCOLL_HAVE_NCCL
Route* nccl_route();
#endif

Route* find_route(RouteId id) {
  switch (id) {
    case RouteId::pmpi: return pmpi_route();
#if STREAMCOLL_HAVE_NCCL
    case RouteId::nccl: return nccl_route();
#endif
    default: return nullptr;  // not in this build
  }
}

}  // namespace streamcoll
