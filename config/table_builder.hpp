// From timings to a tuning table: the fastest route per (collective, memory, stream,
// node class, ranks, bytes), as the fewest rules that route every timed point to its
// winner, written in the format config/tuning_table.hpp parses. The autotuner
// (scripts/autotune.sh, via build/bench/sc_tune) feeds it measurements from sc_bench;
// the scale model (sc_model predict) feeds it predicted times.
//
// Method (the Aluminum paper's Fig. 10 selection, made into rules):
//  1. Candidates are grouped by shape: collective, memory kind, stream attribute and node
//     class (one node, or more than one: intra-node and inter-node links differ in kind,
//     so their rules are kept apart). Within a shape, each (ranks, bytes) point has a
//     winner: among the candidates within `tie` (relative) of the fastest, the simplest
//     (simplicity(): pmpi, nccl, ht, blueconnect, nvgroup, ccube; then fewer parameters;
//     then the order the candidate was first seen in).
//  2. Per rank count, consecutive sizes with the same winner join into one byte range.
//     The boundary between two measured sizes a < b with different winners lies at
//     ⌊√(ab)⌋ (the geometric midpoint, since sweeps are geometric): the smaller size's
//     winner takes bytes up to it. The first range starts at 0, the last has no end.
//  3. Rank counts whose byte-range maps are equal and adjacent (no measured rank count
//     with another map between them) merge into one rank range. A range runs from its
//     first rank count to one below the next measured rank count; the first starts at
//     the smallest measured count, the last has no end. So a rank count between two
//     measured ones takes the smaller one's rules (where such a rule's route declines the
//     call, e.g. a hierarchy that does not fit, the library tries the next matching
//     rule), and one below every measured count falls through to the fallback rules.
//  4. Fusion (fuse=, algorithms/fusion.hpp; Horovod's tensor fusion): measurements of bursts
//     (Measurement::burst > 0: N MPI_Iallreduce and one MPI_Waitall, time per call) do not
//     compete with single calls. At each point they were taken, the fastest burst
//     candidate (rule 1) decides: when its route fuses (has fuse=), that point's winner of
//     rule 1 gets the same fuse= added (its MPI_Iallreduce calls are fused; its blocking
//     calls are not affected), so rule 2 splits byte ranges where fusion stops winning.
//     Points without burst measurements are not fused.
// The written table ends with the fallback (by default the library's embedded default
// table), so collectives and shapes that were not measured keep their usual routes.
//
// Thread safety: pure functions of their arguments.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "base/types.hpp"
#include "config/tuning_table.hpp"

namespace streamcoll::config {

/// One timed (or predicted) point: a candidate route on one call shape and size.
struct Measurement {
  Coll coll = Coll::allreduce;
  MemKind mem = MemKind::host;
  int stream = 0;       ///< 1 with the stream attribute, 0 without, -1 either (a model)
  int ranks = 1;        ///< communicator size
  int nodes = 1;        ///< nodes the communicator spans (only 1 vs more matters)
  uint64_t bytes = 0;   ///< CallKey::bytes convention (the nccl-tests "size")
  std::string route;    ///< table syntax: "ht algo=rd", "blueconnect hierarchy=4x2", "pmpi"
  double seconds = 0;   ///< the time to compare (a median latency); must be finite, > 0
  int burst = 0;        ///< 0: one call; N: per MPI_Iallreduce of bursts of N (rule 4)
};

struct BuildOptions {
  /// Candidates within this relative margin of the fastest tie (0.05: within 5 %).
  double tie = 0.05;
};

/// A rule as built (before writing): shape, ranges and the winning route.
struct BuiltRule {
  Coll coll = Coll::allreduce;
  MemKind mem = MemKind::host;
  int stream = -1;      ///< -1 any
  bool multi_node = false;
  Range ranks, bytes;
  std::string route;    ///< table syntax, as in Measurement::route
};

/// Lower is simpler: the route family's rank (pmpi 0, nccl 1, ht 2, blueconnect 3,
/// nvgroup 4, ccube 5, anything else 6) times 100 plus the number of parameters.
int simplicity(std::string_view route);

/// The winner of one point: the index into `candidates` (all of one shape, ranks and
/// bytes), per rule 1 above. -1 when the list is empty.
int pick_winner(const std::vector<Measurement>& candidates, const BuildOptions& opt);

/// A measurement's point: collective, memory, stream, more than one node, ranks, bytes
/// (the candidates of rule 1 share one).
using PointKey = std::tuple<int, int, int, bool, int, uint64_t>;
PointKey point_key(const Measurement& m);

/// Rule 4: the fuse= value (as written in the route, "64M") of the fastest burst
/// candidate at (shape, ranks, bytes) of `point`, among the burst measurements in
/// `points`; empty when it does not fuse or no burst was measured there.
class FusionPicks {
 public:
  FusionPicks(const std::vector<Measurement>& points, const BuildOptions& opt);
  std::string fuse_at(const Measurement& point) const;
  /// `winner`'s route with the fuse= of its point added (unchanged where none).
  std::string route_for(const Measurement& winner) const;
  bool empty() const { return fuse_.empty(); }

 private:
  std::map<PointKey, std::string> fuse_;
};

/// The value of parameter `key` in a route in table syntax ("pmpi fuse=64K" -> "64K"),
/// empty when it has none.
std::string route_param(std::string_view route, std::string_view key);

/// Rules 1-4: every measurement must have a parseable route (see check_route) and a
/// finite positive time; bad ones are skipped and counted in *skipped (if given), with
/// the first reason in *why. Rules come out ordered by shape (collective, memory,
/// stream: without, with, then either; node class), then ranks, then bytes, so a shape
/// measured with and without the stream attribute is not shadowed by a model's rules for
/// either.
std::vector<BuiltRule> build_rules(const std::vector<Measurement>& points,
                                   const BuildOptions& opt, int* skipped = nullptr,
                                   std::string* why = nullptr);

/// Empty when `route` ("ht algo=rd") is a route and parameters the table parser accepts;
/// otherwise the parser's reason.
std::string check_route(std::string_view route);

/// The table text: `header` lines (each prefixed "# "), the rules in aligned columns,
/// then `fallback` (a table text appended as it is; default: the embedded default table).
/// Rules of host memory are written for host and pinned memory: sc_bench measures
/// pageable buffers, and the host routes treat pinned ones alike. The result parses with
/// TuningTable::parse.
std::string write_table(const std::vector<BuiltRule>& rules, std::string_view header,
                        std::string_view fallback = default_table_text());

}  // namespace streamcoll::config
