// The link hierarchy of a communicator, for hierarchical routes (BlueConnect): its
// shape and the pure layout functions. Discovery (collective, hwloc, CUDA) is
// core/topology.hpp.
//
// A hierarchy is a list of levels, innermost first, each with a factor: 4x12 is 12 nodes
// of 4 ranks, 2x2x12 splits every node into 2 NUMA groups of 2 ranks. The product of the
// factors is the communicator size. Each rank has a position 0..size-1 whose mixed-radix
// digits (innermost digit first) are its coordinates: position = c0 + p0·(c1 + p1·(c2 ...)).
// Ranks that differ only in coordinate i share every level above i and form one group of
// level i (p_i ranks).
//
// Sources, innermost first:
//   numa   ranks of one node grouped by the NUMA node of their GPU (CUDA PCI bus id ->
//          hwloc) or, for ranks without a GPU, of their CPU binding; a level only when
//          every node splits evenly into two or more groups of two or more ranks
//   node   MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)
//   group  STREAMCOLL_NODE_GROUPS: ';'-separated POSIX extended regular expressions, one
//          per level above the node, innermost first, matched against the node's name
//          (MPI_Get_processor_name); the first parenthesised sub-expression (or the whole
//          match) names the node's switch, rack, ... A name that does not match is a
//          group of its own.
// STREAMCOLL_HIERARCHY (or the tuning table's hierarchy=) imposes factors instead, with
// the identity layout (position = rank), so any hierarchy can be tested on one machine.
//
// A hierarchy is uniform or it is not built: levels whose groups differ in size (a node
// with fewer ranks) make discovery fail with the reason, and the hierarchical route
// declines the call (it goes to a flat route, never hangs).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace streamcoll::topo {

struct Hierarchy {
  std::vector<int> factors;        ///< p0, p1, ... innermost first; product = ranks
  std::vector<std::string> names;  ///< one per level: "numa", "node", "group1", ..., "imposed"
  std::vector<int> rank_at;        ///< rank_at[position] = communicator rank
  std::vector<int> position_of;    ///< inverse of rank_at

  int ranks() const { return static_cast<int>(rank_at.size()); }
  int levels() const { return static_cast<int>(factors.size()); }
  /// Coordinate of `rank` at `level`.
  int coord(int rank, int level) const;
  /// "2x4 (numa x node)".
  std::string describe() const;
};

/// "2x2x2" -> {2, 2, 2}. Factors are >= 1; nullopt for anything else.
std::optional<std::vector<int>> parse_factors(std::string_view s);

/// The identity layout (position = rank) for `factors`, or nullopt with *why when their
/// product is not `ranks`. Levels of factor 1 are dropped (they have no stage).
std::optional<Hierarchy> impose(const std::vector<int>& factors, int ranks, std::string* why);

/// Pure core of discovery. keys[l][r]: the group of rank r at level l (innermost first),
/// where ranks with equal keys at levels l..L-1 share the level-l group (e.g. keys[0]
/// = NUMA node within the node, keys[1] = node id, keys[2] = switch name). A level is kept
/// only when it splits its parent groups into two or more children; the result is
/// uniform (every group of a level has the same number of children and ranks) or
/// nullopt with *why; when no level splits anything, one level of all ranks remains.
/// Positions order ranks by their groups, outermost level first, groups taken in the
/// order of their lowest rank, then by rank; so every group is a contiguous range of
/// positions. keys.size() == names.size(), every keys[l].size() == ranks.
std::optional<Hierarchy> from_keys(const std::vector<std::vector<std::string>>& keys,
                                   const std::vector<std::string>& names, std::string* why);

}  // namespace streamcoll::topo
