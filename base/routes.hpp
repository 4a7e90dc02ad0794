// The routes, each registered once: its identity here (id, name, what it is, the tuning
// table's parameters it takes), its instance in algorithms/registry.cpp (one row: the
// factory and what it stops and frees at shutdown). Every list of route names (the table
// parser, STREAMCOLL_ROUTE, the statistics, streamcoll-info, the benchmarks through
// streamcoll_route_name(), the plotting scripts through scripts/route_names.py) is
// derived from route_table().
//
// A new route: add its RouteId below (the order is the table builder's simplicity order,
// config/table_builder.hpp), its row in route_table() (base/routes.cpp), its file under
// algorithms/ and its row in algorithms/registry.cpp (docs/design.md, "Adding a route").
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace streamcoll {

/// A route: the algorithm family that carries out a call. Row i of route_table() is
/// RouteId i (checked by a unit test).
enum class RouteId : uint8_t {
  pmpi,         ///< the real PMPI_ call
  nccl,         ///< NCCL on the communicator's NCCL communicator
  ht,           ///< host-transfer (Aluminum V-B.2)
  blueconnect,  ///< hierarchical reduce-scatter/all-gather (BlueConnect section 3)
  nvgroup,      ///< NVLink-group cooperative kernels (NV-Group section 4)
  ccube,        ///< pipelined tree (C-Cube section III)
  self,         ///< a communicator of one rank: a local copy, on the GPU
};
inline constexpr int kNumRoutes = 7;

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
