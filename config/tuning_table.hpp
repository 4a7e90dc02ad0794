// The tuning table: human-readable rules that map a call to a route.
//
// One rule per line, whitespace-separated, '#' starts a comment:
//
//   # collective  bytes    ranks  nodes  ppn  memory  stream  route  [key=value ...]
//   allreduce     0-32K    64-    *      *    device  *       ht     algo=rd
//   *             *        *      *      *    *       *       pmpi
//
//   collective  a collective name (allreduce, reduce, bcast, allgather, allgatherv,
//               reduce_scatter, reduce_scatter_block, alltoall, barrier), a
//               comma-separated list of them, or '*'. Non-blocking calls use the name of
//               their blocking form.
//   bytes       message size in bytes (see CallKey::bytes), as N, A-B (inclusive), A-
//               (A and up) or '*'. Sizes take binary suffixes K, M, G (KiB, MiB, GiB).
//   ranks       communicator size, same range syntax.
//   nodes       number of nodes the communicator spans, same range syntax.
//   ppn         largest number of ranks of the communicator on one node, same syntax.
//   memory      host, pinned, device, managed, a comma-separated list, or '*'.
//   stream      yes (communicator carries a stream attribute), no, or '*'.
//   route       pmpi, nccl, ht, blueconnect, nvgroup, ccube.
//   key=value   route parameters; each route accepts its own keys (base/routes.hpp: RouteInfo::params),
//               and every route fuse=SIZE: MPI_Iallreduce calls of the rule are fused
//               into messages of up to SIZE bytes (algorithms/fusion.hpp; Horovod's tensor
//               fusion), on host memory, or GPU memory staged through the host.
//
// The first rule that matches wins; a call that matches no rule goes to pmpi. When the
// winning rule's route declines the call (or is not in this build), the next matching rule
// is tried, and so on; rules forced by STREAMCOLL_ROUTE are the exception: a forced route
// that declines sends the call to pmpi.
// Parsing is pure and thread-compatible; a parsed table is immutable and may be read by
// any number of threads.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/types.hpp"

namespace streamcoll::config {

/// An inclusive range of unsigned values; the default covers everything.
struct Range {
  uint64_t lo = 0;
  uint64_t hi = std::numeric_limits<uint64_t>::max();
  bool contains(uint64_t v) const { return lo <= v && v <= hi; }
};

/// What a rule is matched against. Every field must be equal on all ranks of the
/// communicator, so that all ranks choose the same route.
struct CallKey {
  Coll coll = Coll::allreduce;
  /// Bytes of the call's largest buffer on one rank: count*size for allreduce, reduce
  /// and bcast; the whole receive buffer for allgather(v) and the whole send buffer for
  /// reduce_scatter(_block) and alltoall (the nccl-tests convention); 0 for barrier.
  uint64_t bytes = 0;
  int ranks = 1;
  int nodes = 1;
  int ppn = 1;
  MemKind mem = MemKind::host;
  bool stream = false;
};

/// A route and its parameters, as written in the table.
struct RouteChoice {
  RouteId route = RouteId::pmpi;
  std::vector<std::pair<std::string, std::string>> params;
  /// The value of parameter `key`, if given.
  std::optional<std::string_view> param(std::string_view key) const;
};

struct Rule {
  uint32_t colls = 0;  ///< bit i set: Coll(i) matches
  Range bytes, ranks, nodes, ppn;
  uint32_t mems = 0;   ///< bit i set: MemKind(i) matches
  int stream = -1;     ///< -1 any, 0 no, 1 yes
  RouteChoice choice;
  std::string origin;  ///< "file:line" or "STREAMCOLL_ROUTE", for messages
  /// A forced route (STREAMCOLL_ROUTE, streamcoll_comm_set_route: parse_forced): when its
  /// route declines a call, the call goes to pmpi, not to the table's next rule.
  bool forced = false;
  bool matches(const CallKey& k) const;
  /// The rule as a table line ("allreduce,bcast 0-64K * * * device * ht algo=rd"), which
  /// parses back to the same rule.
  std::string to_string() const;
};

struct ParseError {
  std::string source;
  int line = 0;  ///< 1-based; 0 when the error is not tied to a line
  std::string reason;
  std::string to_string() const;
};

class TuningTable {
 public:
  /// Parses a whole table. `source` names it in messages (a path, or "<default>").
  static TuningTable parse(std::string_view text, std::string_view source,
                           std::optional<ParseError>* error);
  /// Parses STREAMCOLL_ROUTE: "allreduce:nccl,bcast:pmpi,reduce:ht:algo=ring".
  /// Each entry forces a route for one collective ('*' for all), whatever the size,
  /// memory or communicator. Returns rules to put in front of a table.
  static std::vector<Rule> parse_forced(std::string_view spec, std::optional<ParseError>* error);

  /// Puts `rules` before the existing rules (they win).
  void prepend(std::vector<Rule> rules);

  /// The first matching rule, or nullptr (meaning pmpi). With `after` (a rule of this
  /// table): the first matching rule after it, for when `after`'s route declined the call.
  const Rule* match(const CallKey& key, const Rule* after = nullptr) const;

  /// False when no rule can send a call of collective `c` on memory `m` to a route other
  /// than pmpi; the shim then passes such calls through without looking further.
  bool may_leave_pmpi(Coll c, MemKind m) const {
    return routed_[static_cast<int>(c)] >> static_cast<int>(m) & 1u;
  }
  /// may_leave_pmpi for some memory kind.
  bool may_leave_pmpi_any(Coll c) const { return routed_[static_cast<int>(c)] != 0; }
  /// may_leave_pmpi for host or pinned memory.
  bool routes_host(Coll c) const {
    return may_leave_pmpi(c, MemKind::host) || may_leave_pmpi(c, MemKind::pinned);
  }

  const std::vector<Rule>& rules() const { return rules_; }
  /// Whether some rule for allreduce has fuse= (MPI_Iallreduce calls may be fused).
  bool fuses() const { return fuses_; }

  /// Whether some rule sends calls to a route that runs streamcoll's progress thread
  /// (ht; blueconnect's MPI_I* on host memory): on host or pinned memory, or, when
  /// `gpu_node`, on GPU memory (ht); or some rule fuses MPI_Iallreduce (fuses()).
  bool uses_progress_thread(bool gpu_node) const;

 private:
  void index();
  std::vector<Rule> rules_;
  uint32_t routed_[kNumColls] = {};  ///< per collective, bit per MemKind
  bool fuses_ = false;
};

/// The table compiled into the library, used when no file is given or a file is bad.
std::string_view default_table_text();

/// Parameter keys a route accepts, with the allowed values, are its RouteInfo::params
/// (base/routes.hpp); unknown keys and values are rejected at parse time.
/// The routes' reference table (Markdown; docs/reference.md, "Routes"): per route its
/// name, what it is and the `key=value` parameters it takes, from route_table().
std::string routes_markdown();

/// "4K" -> 4096, "1MiB" -> 1048576, "7" -> 7. Rejects anything else.
std::optional<uint64_t> parse_size(std::string_view s);
/// "*", "N", "A-B", "A-" -> Range.
std::optional<Range> parse_range(std::string_view s);

/// The rules a call of `key` is offered to, in order, by the dispatcher and by fusion
/// alike (first match wins; a route that declines hands the call on): a forced rule
/// (STREAMCOLL_ROUTE, streamcoll_comm_set_route) alone, and a forced rule that declines
/// ends the walk; else the table's matching rules in order. A rule of route pmpi ends the
/// walk (the MPI takes every call); so does the end of the table: the call goes to pmpi.
/// The table's first matches may come from a cache (`cached`, `count` of them; `overflow`:
/// more may follow, found with TuningTable::match). Not thread-safe; the table must
/// outlive the walk.
class RuleWalk {
 public:
  RuleWalk(const TuningTable& table, const Rule* forced, const CallKey& key,
           const Rule* const* cached = nullptr, int count = 0, bool overflow = false);
  /// The rule to offer the call to, or null: the walk is over (pmpi).
  const Rule* rule() const { return rule_; }
  /// The current rule's route declined the call: the next rule, or null (pmpi).
  const Rule* next();

 private:
  const TuningTable& table_;
  const CallKey& key_;
  const Rule* const* cached_;
  const Rule* rule_ = nullptr;
  int count_, at_ = 0;
  bool overflow_, beyond_;  // beyond_: past cached_, walking the table from rule_
};

/// A call as a person writes it, for `streamcoll-info --explain`: words in any order,
/// "allreduce 8 device 64 ranks 8 nodes stream": a collective name, a size in bytes (the
/// CallKey convention; "4K", "1M"), a memory kind (default host), "N ranks" (default 1),
/// "N nodes" (default 1; ppn = ranks / nodes), "stream" or "classic" (default). Fills
/// *key; false with *error saying which word is wrong.
bool parse_call(std::string_view text, CallKey* key, std::string* error);

/// What the table does with a call of `key`: the rules it is offered to in order
/// (RuleWalk), each with its origin and whether its route is in this build (`built`),
/// and the answer: the first rule whose route is built, unless that route declines the
/// call at run time (each route's reasons: docs/guide.md), then the next one; pmpi when
/// the walk ends. One line per rule, then "-> ROUTE". Pure but for `built`.
std::string explain(const TuningTable& table, const CallKey& key,
                    bool (*built)(RouteId id));

}  // namespace streamcoll::config
