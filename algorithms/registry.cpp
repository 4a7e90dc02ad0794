// Which routes this build carries. A route joins by adding its factory here.
#include "algorithms/route.hpp"

namespace streamcoll {

Route* pmpi_route();

Route* find_route(RouteId id) {
  switch (id) {
    case RouteId::pmpi: return pmpi_route();
    default: return nullptr;  // not in this build
  }
}

}  // namespace streamcoll
