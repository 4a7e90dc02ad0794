// The link hierarchy of a communicator (base/hierarchy.hpp): factor lists and the pure
// layout from per-rank group keys. Discovery is core/topology.cpp.
//
// Level names. from_keys gets L key levels (innermost first) and builds L+1 levels: level
// l < L is the stage inside one group of keys[l] and is named names[l]; its factor is the
// number of children of such a group (ranks for l = 0, groups of keys[l-1] otherwise).
// The last level is the stage across the outermost groups, inside the whole
// communicator, named by the outermost name in the plural. So keys {numa, node} with
// names {"numa", "node"} on 3 nodes of 2 NUMA domains of 2 ranks give
// "2x2x3 (numa x node x nodes)": 2 ranks per NUMA domain, 2 NUMA domains per node,
// 3 nodes. Levels of factor 1 are dropped with their names: one node of 8 ranks in 4 NUMA
// domains is "2x4 (numa x node)", 12 nodes of 4 ranks without NUMA split "4x12 (node x
// nodes)".
#include "base/hierarchy.hpp"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdio>
#include <cstring>
#include <map>
#include <numeric>
#include <set>
#include <utility>

namespace streamcoll::topo {

namespace {

constexpr int64_t kMaxFactor = int64_t{1} << 20;

void set_why(std::string* why, std::string s) {
  if (why) *why = std::move(s);
}

std::string top_name(const std::vector<std::string>& names) {
  return names.empty() ? std::string("ranks") : names.back() + "s";
}

/// Drops levels of factor 1 from (factors, names); keeps one level when none is left.
void drop_ones(std::vector<int>* factors, std::vector<std::string>* names,
               const std::string& all_name) {
  std::vector<int> f;
  std::vector<std::string> n;
  int ranks = 1;
  for (size_t i = 0; i < factors->size(); ++i) {
    ranks *= (*factors)[i];
    if ((*factors)[i] == 1) continue;
    f.push_back((*factors)[i]);
    n.push_back((*names)[i]);
  }
  if (f.empty()) {
    f.push_back(ranks);
    n.push_back(all_name);
  }
  *factors = std::move(f);
  *names = std::move(n);
}

}  // namespace

// ---- Hierarchy ---------------------------------------------------------------------------

int Hierarchy::coord(int rank, int level) const {
  int pos = position_of[rank];
  for (int l = 0; l < level; ++l) pos /= factors[l];
  return pos % factors[level];
}

std::string Hierarchy::describe() const {
  std::string f, n;
  for (int l = 0; l < levels(); ++l) {
    if (l) {
      f += "x";
      n += " x ";
    }
    f += std::to_string(factors[l]);
    n += names[l];
  }
  return f + " (" + n + ")";
}

// ---- factors -------------------------------------------------------------------------------

std::optional<std::vector<int>> parse_factors(std::string_view s) {
  std::vector<int> out;
  int64_t product = 1;
  size_t i = 0;
  for (;;) {
    size_t j = i;
    int64_t v = 0;
    while (j < s.size() && s[j] >= '0' && s[j] <= '9') {
      v = v * 10 + (s[j] - '0');
      if (v > kMaxFactor) return std::nullopt;
      ++j;
    }
    if (j == i || v < 1) return std::nullopt;  // no digits, or 0
    product *= v;
    if (product > INT_MAX) return std::nullopt;
    out.push_back(static_cast<int>(v));
    if (j == s.size()) return out;
    if (s[j] != 'x') return std::nullopt;
    i = j + 1;
  }
}

std::optional<Hierarchy> impose(const std::vector<int>& factors, int ranks, std::string* why) {
  if (ranks < 1) {
    set_why(why, "a hierarchy needs at least one rank");
    return std::nullopt;
  }
  int64_t product = 1;
  std::string text;
  for (size_t i = 0; i < factors.size(); ++i) {
    text += (i ? "x" : "") + std::to_string(factors[i]);
    if (factors[i] < 1 || factors[i] > kMaxFactor) {
      set_why(why, "factor " + std::to_string(factors[i]) + " is out of range");
      return std::nullopt;
    }
    product *= factors[i];
    if (product > INT_MAX) break;
  }
  if (product != ranks) {
    set_why(why, "the factors " + (text.empty() ? std::string("(none)") : text) +
                     " do not multiply to the " + std::to_string(ranks) + " ranks");
    return std::nullopt;
  }
  Hierarchy h;
  h.factors = factors;
  h.names.assign(factors.size(), "imposed");
  drop_ones(&h.factors, &h.names, "imposed");
  h.rank_at.resize(ranks);
  std::iota(h.rank_at.begin(), h.rank_at.end(), 0);
  h.position_of = h.rank_at;
  return h;
}

// ---- from_keys -----------------------------------------------------------------------------

std::optional<Hierarchy> from_keys(const std::vector<std::vector<std::string>>& keys,
                                   const std::vector<std::string>& names, std::string* why) {
  const size_t L = keys.size();
  if (L == 0 || names.size() != L) {
    set_why(why, L == 0 ? "no key levels" : "one name per key level is needed");
    return std::nullopt;
  }
  const int n = static_cast<int>(keys[0].size());
  if (n < 1) {
    set_why(why, "a hierarchy needs at least one rank");
    return std::nullopt;
  }
  for (size_t l = 0; l < L; ++l)
    if (static_cast<int>(keys[l].size()) != n) {
      set_why(why, names[l] + " keys: " + std::to_string(keys[l].size()) + " for " +
                       std::to_string(n) + " ranks");
      return std::nullopt;
    }

  // gid[l][r]: the level-l group of rank r, identified by (its parent group, keys[l][r]),
  // i.e. by keys[l..L-1][r]. Ids are given in order of the groups' lowest ranks.
  std::vector<std::vector<int>> gid(L + 1, std::vector<int>(n, 0));  // gid[L]: the whole
  std::vector<int> ngroups(L + 1, 1);
  std::vector<std::vector<int>> lowest(L + 1, std::vector<int>{0});  // per group: lowest rank
  for (size_t l = L; l-- > 0;) {
    std::map<std::pair<int, std::string_view>, int> ids;
    lowest[l].clear();
    for (int r = 0; r < n; ++r) {
      auto [it, added] =
          ids.emplace(std::make_pair(gid[l + 1][r], std::string_view(keys[l][r])),
                      static_cast<int>(ids.size()));
      if (added) lowest[l].push_back(r);
      gid[l][r] = it->second;
    }
    ngroups[l] = static_cast<int>(ids.size());
  }

  // children[l][g]: ranks (l = 0) or level-(l-1) groups in group g of level l; sizes[l][g]:
  // its ranks. Level L is the whole communicator.
  std::vector<std::vector<int>> children(L + 1), sizes(L + 1);
  for (size_t l = 0; l <= L; ++l) {
    children[l].assign(ngroups[l], 0);
    sizes[l].assign(ngroups[l], 0);
    for (int r = 0; r < n; ++r) ++sizes[l][gid[l][r]];
  }
  for (int r = 0; r < n; ++r) ++children[0][gid[0][r]];
  for (size_t l = 1; l <= L; ++l)
    for (int g = 0; g < ngroups[l - 1]; ++g) ++children[l][gid[l][lowest[l - 1][g]]];

  std::vector<int> factors(L + 1);
  std::vector<std::string> level_names(names);
  level_names.push_back(top_name(names));
  for (size_t l = 0; l <= L; ++l) {
    factors[l] = children[l][0];
    for (int g = 1; g < ngroups[l]; ++g) {
      if (children[l][g] == factors[l]) continue;
      // Levels inside are uniform (checked first), so the rank counts differ too.
      const std::string& what = names[l];
      set_why(why, what + " sizes differ: " + std::to_string(sizes[l][0]) + " and " +
                       std::to_string(sizes[l][g]) + " ranks (the " + what + " of rank " +
                       std::to_string(lowest[l][0]) + " and the " + what + " of rank " +
                       std::to_string(lowest[l][g]) + ")");
      return std::nullopt;
    }
  }

  Hierarchy h;
  h.rank_at.resize(n);
  std::iota(h.rank_at.begin(), h.rank_at.end(), 0);
  std::sort(h.rank_at.begin(), h.rank_at.end(), [&](int a, int b) {
    for (size_t l = L; l-- > 0;)
      if (gid[l][a] != gid[l][b]) return gid[l][a] < gid[l][b];
    return a < b;
  });
  h.position_of.resize(n);
  for (int p = 0; p < n; ++p) h.position_of[h.rank_at[p]] = p;
  h.factors = std::move(factors);
  h.names = std::move(level_names);
  drop_ones(&h.factors, &h.names, top_name(names));
  return h;
}

}  // namespace streamcoll::topo
