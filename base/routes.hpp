// The routes' identities: RouteId and the route table (name, what it is, the tuning
// table's parameters it takes), both made from the rows of base/routes.def, where each
// route is registered once. Every list of route names (the table parser, STREAMCOLL_ROUTE,
// the statistics, streamcoll-info, the benchmarks through streamcoll_route_name(), the
// plotting scripts through scripts/route_names.py) is derived from route_table(); the
// instances are algorithms/registry.cpp's (docs/design.md, "Adding a route").
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace streamcoll {

/// A route: the algorithm family that carries out a call. Row i of route_table() is
/// RouteId i (checked by a unit test).
enum class RouteId : uint8_t {
#define ROUTE(id, ...) id,
#include "base/routes.def"
#undef ROUTE
};
inline constexpr int kNumRoutes = 0
#define ROUTE(id, ...) +1
#include "base/routes.def"
#undef ROUTE
    ;

/// One parameter a route takes in the tuning table (`key=value`), besides `fuse=` that
/// every route takes (algorithms/fusion.hpp).
struct ParamSpec {
  std::string_view key;
  std::vector<std::string_view> values;  ///< empty: see `kind`
  std::string_view kind;                 ///< "size" (a byte size), "hierarchy" (AxBx...),
                                         ///< "list" (values joined by '/'), "" (one value)
};

/// A route's identity.
struct RouteInfo {
  RouteId id;
  std::string_view name;     ///< as the tuning table, STREAMCOLL_ROUTE and the statistics spell it
  std::string_view summary;  ///< one line: what it is, and its source (paper, section)
  std::vector<ParamSpec> params;
};

/// Every route, in RouteId order. Thread-safe (built once, never changed).
const std::vector<RouteInfo>& route_table();
inline const RouteInfo& route_info(RouteId r) { return route_table()[static_cast<size_t>(r)]; }

std::string_view name(RouteId r);
std::optional<RouteId> parse_route(std::string_view s);

}  // namespace streamcoll
