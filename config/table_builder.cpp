#include "config/table_builder.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

namespace streamcoll::config {
namespace {

// The route's family (its first word) and its number of parameters.
std::pair<std::string_view, int> split_route(std::string_view route) {
  auto first = route.find_first_not_of(' ');
  if (first == std::string_view::npos) return {{}, 0};
  route.remove_prefix(first);
  auto end = route.find(' ');
  std::string_view family = route.substr(0, end);
  int params = 0;
  bool in_word = false;
  for (size_t i = family.size(); i < route.size(); ++i) {
    bool space = route[i] == ' ';
    if (!space && !in_word) ++params;
    in_word = !space;
  }
  return {family, params};
}

struct ShapeKey {
  Coll coll;
  MemKind mem;
  int stream;
  bool multi_node;
  // Rules for one stream mode come before those for either (-1), which would shadow
  // them: the first matching rule wins.
  int stream_order() const { return stream < 0 ? 2 : stream; }
  bool operator<(const ShapeKey& o) const {
    return std::make_tuple(coll, mem, stream_order(), multi_node) <
           std::make_tuple(o.coll, o.mem, o.stream_order(), o.multi_node);
  }
};

// One rank count's byte ranges: (upper bound of the range, route), ascending.
using ByteMap = std::vector<std::pair<uint64_t, std::string>>;

// `suffixes`: whole binary multiples as K, M, G (byte ranges); plain numbers otherwise
// (rank ranges).
std::string range_text(const Range& r, bool suffixes = true) {
  auto size = [suffixes](uint64_t v) {
    if (!suffixes) return std::to_string(v);
    if (v >= (1ull << 30) && v % (1ull << 30) == 0) return std::to_string(v >> 30) + "G";
    if (v >= (1ull << 20) && v % (1ull << 20) == 0) return std::to_string(v >> 20) + "M";
    if (v >= (1ull << 10) && v % (1ull << 10) == 0) return std::to_string(v >> 10) + "K";
    return std::to_string(v);
  };
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  if (r.lo == 0 && r.hi == max) return "*";
  if (r.hi == max) return size(r.lo) + "-";
  if (r.lo == r.hi) return size(r.lo);
  return size(r.lo) + "-" + size(r.hi);
}

}  // namespace

int simplicity(std::string_view route) {
  auto [family, params] = split_route(route);
  int rank = kNumRoutes;  // an unknown family: after every route
  if (auto r = parse_route(family)) rank = static_cast<int>(*r);
  return rank * 100 + params;
}

int pick_winner(const std::vector<Measurement>& candidates, const BuildOptions& opt) {
  if (candidates.empty()) return -1;
  double fastest = candidates[0].seconds;
  for (const auto& c : candidates) fastest = std::min(fastest, c.seconds);
  int best = -1;
  for (int i = 0; i < static_cast<int>(candidates.size()); ++i) {
    // (1e-12: times equal but for rounding tie even with a zero margin)
    if (candidates[i].seconds > fastest * (1 + opt.tie) * (1 + 1e-12)) continue;
    // Strictly simpler wins; on equal simplicity the first seen stays.
    if (best < 0 || simplicity(candidates[i].route) < simplicity(candidates[best].route))
      best = i;
  }
  return best;
}

std::string route_param(std::string_view route, std::string_view key) {
  size_t i = 0;
  while (i < route.size()) {
    while (i < route.size() && route[i] == ' ') ++i;
    size_t end = route.find(' ', i);
    if (end == std::string_view::npos) end = route.size();
    std::string_view word = route.substr(i, end - i);
    if (word.size() > key.size() && word.substr(0, key.size()) == key && word[key.size()] == '=')
      return std::string(word.substr(key.size() + 1));
    i = end;
  }
  return "";
}

PointKey point_key(const Measurement& m) {
  return {static_cast<int>(m.coll), static_cast<int>(m.mem), m.stream, m.nodes > 1, m.ranks,
          m.bytes};
}

FusionPicks::FusionPicks(const std::vector<Measurement>& points, const BuildOptions& opt) {
  std::map<PointKey, std::vector<Measurement>> bursts;
  for (const Measurement& m : points)
    if (m.burst > 0 && m.coll == Coll::allreduce) bursts[point_key(m)].push_back(m);
  for (const auto& [key, cands] : bursts) {
    std::string fuse = route_param(cands[static_cast<size_t>(pick_winner(cands, opt))].route,
                                   "fuse");
    if (!fuse.empty()) fuse_.emplace(key, std::move(fuse));
  }
}

std::string FusionPicks::fuse_at(const Measurement& point) const {
  auto it = fuse_.find(point_key(point));
  return it == fuse_.end() ? "" : it->second;
}

std::string FusionPicks::route_for(const Measurement& winner) const {
  std::string fuse = fuse_at(winner);
  if (fuse.empty() || !route_param(winner.route, "fuse").empty()) return winner.route;
  return winner.route + " fuse=" + fuse;
}

std::string check_route(std::string_view route) {
  std::optional<ParseError> err;
  std::string line = "* * * * * * * " + std::string(route);
  TuningTable::parse(line, "route", &err);
  if (!err) return split_route(route).first.empty() ? "empty route" : "";
  return err->reason;
}

std::vector<BuiltRule> build_rules(const std::vector<Measurement>& points,
                                   const BuildOptions& opt, int* skipped, std::string* why) {
  int bad = 0;
  std::string first_reason;
  auto reject = [&](std::string reason) {
    if (bad++ == 0) first_reason = std::move(reason);
  };
  // shape -> ranks -> bytes -> candidates, in the order first seen
  std::map<ShapeKey, std::map<int, std::map<uint64_t, std::vector<Measurement>>>> grid;
  std::vector<Measurement> bursts;  // rule 4
  std::map<std::string, bool> route_ok;
  for (const Measurement& m : points) {
    auto it = route_ok.find(m.route);
    if (it == route_ok.end()) {
      std::string err = check_route(m.route);
      it = route_ok.emplace(m.route, err.empty()).first;
      if (!err.empty()) {
        reject("route '" + m.route + "': " + err);
        continue;
      }
    }
    if (!it->second) {
      ++bad;
      continue;
    }
    if (!std::isfinite(m.seconds) || m.seconds <= 0) {
      reject("route '" + m.route + "' at " + std::to_string(m.bytes) +
             " B: time is not finite and positive");
      continue;
    }
    if (m.ranks < 1 || m.nodes < 1 || m.stream < -1 || m.stream > 1) {
      reject("route '" + m.route + "': bad ranks, nodes or stream");
      continue;
    }
    if (m.burst > 0) {
      bursts.push_back(m);
      continue;
    }
    ShapeKey key{m.coll, m.mem, m.stream, m.nodes > 1};
    grid[key][m.ranks][m.bytes].push_back(m);
  }
  if (skipped) *skipped = bad;
  if (why) *why = first_reason;
  const FusionPicks fusion(bursts, opt);

  std::vector<BuiltRule> out;
  for (const auto& [shape, by_ranks] : grid) {
    // Rule 2: per rank count, the byte map.
    std::vector<std::pair<int, ByteMap>> maps;
    for (const auto& [ranks, by_bytes] : by_ranks) {
      ByteMap bm;
      uint64_t prev = 0;
      bool first = true;
      for (const auto& [bytes, cands] : by_bytes) {
        const std::string win =
            fusion.route_for(cands[static_cast<size_t>(pick_winner(cands, opt))]);
        if (!first && bm.back().second != win) {
          // The boundary: the smaller size's winner takes up to the geometric midpoint.
          uint64_t mid = static_cast<uint64_t>(
              std::floor(std::sqrt(static_cast<double>(prev) * static_cast<double>(bytes))));
          mid = std::clamp(mid, prev, bytes - 1);
          bm.back().first = mid;
          bm.emplace_back(0, win);
        } else if (first) {
          bm.emplace_back(0, win);
        }
        first = false;
        prev = bytes;
      }
      bm.back().first = std::numeric_limits<uint64_t>::max();
      maps.emplace_back(ranks, std::move(bm));
    }
    // Rule 3: equal, adjacent byte maps merge into one rank range.
    for (size_t i = 0; i < maps.size();) {
      size_t j = i + 1;
      while (j < maps.size() && maps[j].second == maps[i].second) ++j;
      Range ranks{static_cast<uint64_t>(maps[i].first),
                  j < maps.size() ? static_cast<uint64_t>(maps[j].first) - 1
                                  : std::numeric_limits<uint64_t>::max()};
      uint64_t lo = 0;
      for (const auto& [hi, route] : maps[i].second) {
        BuiltRule r;
        r.coll = shape.coll;
        r.mem = shape.mem;
        r.stream = shape.stream;
        r.multi_node = shape.multi_node;
        r.ranks = ranks;
        r.bytes = Range{lo, hi};
        r.route = route;
        out.push_back(std::move(r));
        lo = hi + 1;
      }
      i = j;
    }
  }
  return out;
}

std::string write_table(const std::vector<BuiltRule>& rules, std::string_view header,
                        std::string_view fallback) {
  std::string out;
  size_t start = 0;
  while (start <= header.size() && !header.empty()) {
    size_t end = header.find('\n', start);
    if (end == std::string_view::npos) end = header.size();
    out += "# ";
    out += header.substr(start, end - start);
    out += '\n';
    start = end + 1;
  }
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"# collective", "bytes", "ranks", "nodes", "ppn", "memory", "stream", "route"});
  for (const BuiltRule& r : rules)
    rows.push_back({std::string(name(r.coll)), range_text(r.bytes), range_text(r.ranks, false),
                    r.multi_node ? "2-" : "1", "*",
                    // pageable host measurements stand for pinned host memory too
                    r.mem == MemKind::host ? "host,pinned" : std::string(name(r.mem)),
                    r.stream < 0 ? "*" : r.stream ? "yes" : "no", r.route});
  std::vector<size_t> width(8, 0);
  for (const auto& row : rows)
    for (size_t c = 0; c + 1 < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      line += row[c];
      if (c + 1 < row.size()) line += std::string(width[c] - row[c].size() + 2, ' ');
    }
    out += line + '\n';
  }
  if (!fallback.empty()) {
    out += "# fallback for everything not measured above\n";
    out += fallback;
    if (out.back() != '\n') out += '\n';
  }
  return out;
}

}  // namespace streamcoll::config
