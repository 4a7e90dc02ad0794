#include "config/tuning_table.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>

#include "base/hierarchy.hpp"

namespace streamcoll::config {
namespace {

constexpr uint32_t kAllColls = (1u << kNumColls) - 1;
// 'mixed' calls never reach a route other than pmpi, so '*' leaves it out.
constexpr uint32_t kAllMems = (1u << kNumMemKinds) - 1 - (1u << static_cast<int>(MemKind::mixed));

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    if (i == s.size() || s[i] == sep) {
      out.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  }
  return out;
}

std::vector<std::string_view> fields(std::string_view s) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
    size_t j = i;
    while (j < s.size() && !std::isspace(static_cast<unsigned char>(s[j]))) ++j;
    if (j > i) out.push_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

std::string join(const std::vector<std::string_view>& v) {
  std::string s;
  for (auto x : v) {
    if (!s.empty()) s += '|';
    s += x;
  }
  return s;
}

// Returns an error message, or "" when (key, value) is valid for route r.
std::string check_param(RouteId r, std::string_view key, std::string_view value) {
  // Every route takes fuse= (algorithms/fusion.hpp): its MPI_Iallreduce calls may be fused.
  if (key == "fuse") {
    auto v = parse_size(value);
    return v && *v > 0 ? "" : "'fuse' needs a byte size above 0 (the largest fused "
                             "message), got '" + std::string(value) + "'";
  }
  for (const ParamSpec& p : route_info(r).params) {
    if (p.key != key) continue;
    if (p.kind == "size") {
      return parse_size(value) ? "" : "'" + std::string(key) + "' needs a byte size, got '" +
                                          std::string(value) + "'";
    }
    if (p.kind == "hierarchy") {
      return topo::parse_factors(value) ? ""
                                         : "'" + std::string(key) +
                                               "' needs factors like 2x4, got '" +
                                               std::string(value) + "'";
    }
    if (p.kind == "list") {  // one value, or one per level: a/b/c
      bool ok = true;
      for (auto v : split(value, '/'))
        ok = ok && std::find(p.values.begin(), p.values.end(), v) != p.values.end();
      return ok ? "" : "'" + std::string(key) + "' takes " + join(p.values) +
                           " or a '/'-separated list of them, got '" + std::string(value) + "'";
    }
    if (std::find(p.values.begin(), p.values.end(), value) != p.values.end()) return "";
    return "'" + std::string(key) + "' must be one of " + join(p.values) + ", got '" +
           std::string(value) + "'";
  }
  std::vector<std::string_view> keys;
  for (const ParamSpec& p : route_info(r).params) keys.push_back(p.key);
  keys.push_back("fuse");
  return "route '" + std::string(name(r)) + "' takes no parameter '" + std::string(key) + "'" +
         (keys.empty() ? std::string(" (it takes none)") : " (it takes " + join(keys) + ")");
}

// Parses "route key=value ..." tokens into a RouteChoice; returns an error or "".
std::string parse_choice(std::string_view route, const std::vector<std::string_view>& params,
                         RouteChoice* out) {
  auto r = parse_route(route);
  if (!r) return "unknown route '" + std::string(route) + "'";
  out->route = *r;
  for (auto p : params) {
    auto eq = p.find('=');
    if (eq == std::string_view::npos || eq == 0)
      return "route parameter '" + std::string(p) + "' is not key=value";
    auto key = p.substr(0, eq), value = p.substr(eq + 1);
    if (auto err = check_param(*r, key, value); !err.empty()) return err;
    out->params.emplace_back(std::string(key), std::string(value));
  }
  return "";
}

std::string parse_colls(std::string_view s, uint32_t* mask) {
  if (s == "*") {
    *mask = kAllColls;
    return "";
  }
  *mask = 0;
  for (auto c : split(s, ',')) {
    auto coll = parse_coll(c);
    if (!coll) return "unknown collective '" + std::string(c) + "'";
    *mask |= 1u << static_cast<int>(*coll);
  }
  return "";
}

std::string parse_mems(std::string_view s, uint32_t* mask) {
  if (s == "*") {
    *mask = kAllMems;
    return "";
  }
  *mask = 0;
  for (auto m : split(s, ',')) {
    auto kind = parse_mem(m);
    if (!kind || *kind == MemKind::mixed)
      return "unknown memory kind '" + std::string(m) + "' (host|pinned|device|managed|*)";
    *mask |= 1u << static_cast<int>(*kind);
  }
  return "";
}

}  // namespace

std::optional<std::string_view> RouteChoice::param(std::string_view key) const {
  for (const auto& [k, v] : params)
    if (k == key) return std::string_view(v);
  return std::nullopt;
}

bool Rule::matches(const CallKey& k) const {
  return (colls >> static_cast<int>(k.coll) & 1u) && bytes.contains(k.bytes) &&
         ranks.contains(static_cast<uint64_t>(k.ranks)) &&
         nodes.contains(static_cast<uint64_t>(k.nodes)) &&
         ppn.contains(static_cast<uint64_t>(k.ppn)) && (mems >> static_cast<int>(k.mem) & 1u) &&
         (stream < 0 || stream == static_cast<int>(k.stream));
}

std::string ParseError::to_string() const {
  std::string s = source;
  if (line > 0) s += ":" + std::to_string(line);
  return s + ": " + reason;
}

std::optional<uint64_t> parse_size(std::string_view s) {
  uint64_t n = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
  if (ec != std::errc() || ptr == s.data()) return std::nullopt;
  std::string_view suffix(ptr, static_cast<size_t>(s.data() + s.size() - ptr));
  int shift = 0;
  if (suffix.empty()) shift = 0;
  else if (suffix == "K" || suffix == "KiB" || suffix == "k") shift = 10;
  else if (suffix == "M" || suffix == "MiB") shift = 20;
  else if (suffix == "G" || suffix == "GiB") shift = 30;
  else return std::nullopt;
  if (shift && n > (std::numeric_limits<uint64_t>::max() >> shift)) return std::nullopt;
  return n << shift;
}

std::optional<Range> parse_range(std::string_view s) {
  if (s == "*") return Range{};
  auto dash = s.find('-');
  if (dash == std::string_view::npos) {
    auto v = parse_size(s);
    if (!v) return std::nullopt;
    return Range{*v, *v};
  }
  auto lo = parse_size(s.substr(0, dash));
  if (!lo) return std::nullopt;
  auto rest = s.substr(dash + 1);
  if (rest.empty()) return Range{*lo, std::numeric_limits<uint64_t>::max()};
  auto hi = parse_size(rest);
  if (!hi || *hi < *lo) return std::nullopt;
  return Range{*lo, *hi};
}

std::string routes_markdown() {
  std::string t = "| route | what it is | parameters |\n|---|---|---|\n";
  for (const RouteInfo& r : route_table()) {
    std::string params;
    for (const ParamSpec& p : r.params) {
      std::string v = p.kind == "size" ? "SIZE" : p.kind == "hierarchy" ? "AxB..." : join(p.values);
      if (p.kind == "list") v += "[/...]";
      for (size_t i = v.find('|'); i != std::string::npos; i = v.find('|', i + 2)) v.insert(i, "\\");
      params += (params.empty() ? "`" : ", `") + std::string(p.key) + "=" + v + "`";
    }
    params += (params.empty() ? "`" : ", `") + std::string("fuse=SIZE`");
    t += "| `" + std::string(r.name) + "` | " + std::string(r.summary) + " | " + params + " |\n";
  }
  return t;
}

std::string Rule::to_string() const {
  auto list = [](uint32_t mask, uint32_t all, int n, auto name_of) {
    if (mask == all) return std::string("*");
    std::string out;
    for (int i = 0; i < n; ++i)
      if (mask >> i & 1u) out += (out.empty() ? "" : ",") + std::string(name_of(i));
    return out;
  };
  auto range = [](const Range& r) {
    const uint64_t top = std::numeric_limits<uint64_t>::max();
    if (r.lo == 0 && r.hi == top) return std::string("*");
    if (r.hi == top) return std::to_string(r.lo) + "-";
    if (r.lo == r.hi) return std::to_string(r.lo);
    return std::to_string(r.lo) + "-" + std::to_string(r.hi);
  };
  std::string out = list(colls, kAllColls, kNumColls, [](int i) { return name(static_cast<Coll>(i)); });
  for (const Range* r : {&bytes, &ranks, &nodes, &ppn}) out += " " + range(*r);
  out += " " + list(mems, kAllMems, kNumMemKinds, [](int i) { return name(static_cast<MemKind>(i)); });
  out += stream < 0 ? " *" : stream ? " yes" : " no";
  out += " " + std::string(name(choice.route));
  for (const auto& [k, v] : choice.params) out += " " + k + "=" + v;
  return out;
}

TuningTable TuningTable::parse(std::string_view text, std::string_view source,
                               std::optional<ParseError>* error) {
  TuningTable t;
  int lineno = 0;
  for (auto raw : split(text, '\n')) {
    ++lineno;
    auto line = raw.substr(0, raw.find('#'));
    auto f = fields(trim(line));
    if (f.empty()) continue;
    auto fail = [&](std::string reason) {
      if (error) *error = ParseError{std::string(source), lineno, std::move(reason)};
      return TuningTable{};
    };
    if (f.size() < 8)
      return fail("expected 8 columns (collective bytes ranks nodes ppn memory stream route), got " +
                  std::to_string(f.size()));
    Rule r;
    if (auto e = parse_colls(f[0], &r.colls); !e.empty()) return fail(e);
    const char* what[] = {"bytes", "ranks", "nodes", "ppn"};
    Range* dst[] = {&r.bytes, &r.ranks, &r.nodes, &r.ppn};
    for (int i = 0; i < 4; ++i) {
      auto range = parse_range(f[1 + i]);
      if (!range)
        return fail(std::string("bad ") + what[i] + " range '" + std::string(f[1 + i]) +
                    "' (use N, A-B, A- or *)");
      *dst[i] = *range;
    }
    if (auto e = parse_mems(f[5], &r.mems); !e.empty()) return fail(e);
    if (f[6] == "*") r.stream = -1;
    else if (f[6] == "yes") r.stream = 1;
    else if (f[6] == "no") r.stream = 0;
    else return fail("stream must be yes, no or *, got '" + std::string(f[6]) + "'");
    std::vector<std::string_view> params(f.begin() + 8, f.end());
    if (auto e = parse_choice(f[7], params, &r.choice); !e.empty()) return fail(e);
    r.origin = std::string(source) + ":" + std::to_string(lineno);
    t.rules_.push_back(std::move(r));
  }
  t.index();
  return t;
}

std::vector<Rule> TuningTable::parse_forced(std::string_view spec,
                                            std::optional<ParseError>* error) {
  std::vector<Rule> out;
  for (auto entry : split(spec, ',')) {
    entry = trim(entry);
    if (entry.empty()) continue;
    auto parts = split(entry, ':');
    auto fail = [&](std::string reason) {
      if (error)
        *error = ParseError{"STREAMCOLL_ROUTE", 0,
                            "'" + std::string(entry) + "': " + std::move(reason)};
      return std::vector<Rule>{};
    };
    if (parts.size() < 2) return fail("expected collective:route[:key=value...]");
    Rule r;
    if (auto e = parse_colls(parts[0], &r.colls); !e.empty()) return fail(e);
    r.mems = kAllMems;
    std::vector<std::string_view> params(parts.begin() + 2, parts.end());
    if (auto e = parse_choice(parts[1], params, &r.choice); !e.empty()) return fail(e);
    r.origin = "STREAMCOLL_ROUTE";
    r.forced = true;
    out.push_back(std::move(r));
  }
  return out;
}

void TuningTable::prepend(std::vector<Rule> rules) {
  rules.insert(rules.end(), std::make_move_iterator(rules_.begin()),
               std::make_move_iterator(rules_.end()));
  rules_ = std::move(rules);
  index();
}

bool TuningTable::uses_progress_thread(bool gpu_node) const {
  const uint32_t host = 1u << static_cast<int>(MemKind::host) | 1u << static_cast<int>(MemKind::pinned);
  const uint32_t gpu = 1u << static_cast<int>(MemKind::device) | 1u << static_cast<int>(MemKind::managed);
  for (const Rule& r : rules_) {
    if (r.choice.route == RouteId::ht && ((r.mems & host) || (gpu_node && (r.mems & gpu))))
      return true;
    if (r.choice.route == RouteId::blueconnect && (r.mems & host)) return true;
  }
  return fuses_;  // fusion's agreements and fused calls run on the progress thread
}

const Rule* TuningTable::match(const CallKey& key, const Rule* after) const {
  size_t i = 0;
  if (after) {
    if (after < rules_.data() || after >= rules_.data() + rules_.size()) return nullptr;
    i = static_cast<size_t>(after - rules_.data()) + 1;
  }
  for (; i < rules_.size(); ++i)
    if (rules_[i].matches(key)) return &rules_[i];
  return nullptr;
}

RuleWalk::RuleWalk(const TuningTable& table, const Rule* forced, const CallKey& key,
                   const Rule* const* cached, int count, bool overflow)
    : table_(table), key_(key), cached_(cached), count_(count), overflow_(overflow),
      beyond_(cached == nullptr) {
  if (forced)
    rule_ = forced;
  else if (beyond_)
    rule_ = table.match(key);
  else
    rule_ = count > 0 ? cached[0] : overflow ? table.match(key) : nullptr;
  if (!forced && !beyond_ && count == 0) beyond_ = true;
}

const Rule* RuleWalk::next() {
  if (!rule_ || rule_->forced || rule_->choice.route == RouteId::pmpi) return rule_ = nullptr;
  if (!beyond_ && at_ + 1 < count_) return rule_ = cached_[++at_];
  if (beyond_ || overflow_) {
    beyond_ = true;
    return rule_ = table_.match(key_, rule_);
  }
  return rule_ = nullptr;
}

void TuningTable::index() {
  // A call can leave pmpi only if some rule that can match it names another route.
  // (Earlier rules may shadow that rule; being conservative here only costs the fast
  // path, never correctness.)
  for (uint32_t& m : routed_) m = 0;
  fuses_ = false;
  for (const Rule& r : rules_) {
    if (r.choice.param("fuse") && (r.colls >> static_cast<int>(Coll::allreduce) & 1u)) {
      // MPI_Iallreduce calls may be fused (algorithms/fusion.hpp), whatever the route
      fuses_ = true;
      routed_[static_cast<int>(Coll::allreduce)] |= r.mems;
    }
    if (r.choice.route == RouteId::pmpi) continue;
    for (int c = 0; c < kNumColls; ++c)
      if (r.colls >> c & 1u) routed_[c] |= r.mems;
  }
}

bool parse_call(std::string_view text, CallKey* key, std::string* error) {
  CallKey k;
  std::vector<std::string_view> w;
  for (size_t i = 0; i < text.size();) {
    while (i < text.size() && (text[i] == ' ' || text[i] == ',' || text[i] == '\t')) ++i;
    size_t j = i;
    while (j < text.size() && text[j] != ' ' && text[j] != ',' && text[j] != '\t') ++j;
    if (j > i) w.push_back(text.substr(i, j - i));
    i = j;
  }
  bool have_coll = false, have_bytes = false, have_nodes = false;
  for (size_t i = 0; i < w.size(); ++i) {
    const bool counted = i + 1 < w.size() && (w[i + 1] == "ranks" || w[i + 1] == "rank" ||
                                              w[i + 1] == "nodes" || w[i + 1] == "node");
    if (auto c = parse_coll(w[i]); c && !have_coll) {
      k.coll = *c;
      have_coll = true;
    } else if (auto m = parse_mem(w[i])) {
      k.mem = *m;
    } else if (w[i] == "stream" || w[i] == "classic") {
      k.stream = w[i] == "stream";
    } else if (auto n = parse_size(w[i]); n && counted) {
      if (*n < 1 || *n > (1u << 30)) return *error = "a count of ranks or nodes out of range", false;
      (w[i + 1][0] == 'r' ? k.ranks : k.nodes) = static_cast<int>(*n);
      have_nodes = have_nodes || w[i + 1][0] == 'n';
      ++i;
    } else if (n && !have_bytes) {
      k.bytes = *n;
      have_bytes = true;
    } else {
      return *error = "'" + std::string(w[i]) + "' is not a collective, a size, a memory kind, "
                      "N ranks, N nodes, stream or classic", false;
    }
  }
  if (!have_coll) return *error = "no collective named (allreduce, bcast, ...)", false;
  if (!have_nodes) k.nodes = 1;
  if (k.nodes > k.ranks) return *error = "more nodes than ranks", false;
  k.ppn = (k.ranks + k.nodes - 1) / k.nodes;
  *key = k;
  return true;
}

std::string explain(const TuningTable& table, const CallKey& key, bool (*built)(RouteId id)) {
  std::string out;
  const Rule* answer = nullptr;
  RuleWalk walk(table, nullptr, key);
  for (const Rule* r = walk.rule(); r; r = walk.next()) {
    const bool here = built(r->choice.route);
    out += "  " + r->origin + ": " + r->to_string() +
           (here ? "" : "   (route not in this build: next rule)") +
           (r->forced ? "   (forced: if the route declines, pmpi)" : "") + "\n";
    if (here && !answer) answer = r;
  }
  if (out.empty()) out = "  no rule matches\n";
  const std::string route = answer ? std::string(name(answer->choice.route)) : "pmpi";
  out += "-> " + route;
  if (answer && answer->choice.route != RouteId::pmpi)
    out += " (unless it declines the call at run time: then the next rule listed, or pmpi)";
  return out + "\n";
}

}  // namespace streamcoll::config
