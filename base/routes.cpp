#include "base/routes.hpp"

namespace streamcoll {

const std::vector<RouteInfo>& route_table() {
  // The block counts route nvgroup's kernels take (its `blocks=`, and blueconnect's for
  // its levels on nvgroup).
  static const std::vector<std::string_view> kBlockCounts = {"1", "2", "4", "8", "16", "32", "64", "128"};
  // Never destroyed: a name may be asked for from an exit handler after static destructors.
  static const std::vector<RouteInfo>* const table = new std::vector<RouteInfo>{
#define ROUTE(id, needs, ...) {RouteId::id, #id, __VA_ARGS__},
#include "base/routes.def"
#undef ROUTE
  };
  return *table;
}

std::string_view name(RouteId r) { return route_info(r).name; }

std::optional<RouteId> parse_route(std::string_view s) {
  for (const RouteInfo& r : route_table())
    if (r.name == s) return r.id;
  return std::nullopt;
}

}  // namespace streamcoll
