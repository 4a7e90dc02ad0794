// The pure parts of core/topology.hpp: factor lists, imposed hierarchies and the layout
// built from per-rank group keys. Expected layouts are computed here independently: by
// formulas for the regular placements, and by a recursive partition (groups taken in
// order of their lowest rank) for random ones. No MPI messages.
#include "core/topology.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

using namespace streamcoll;
using namespace streamcoll::topo;

namespace {

using Keys = std::vector<std::vector<std::string>>;
using Names = std::vector<std::string>;

/// Every ordered list of factors >= 2 whose product is n ({} for n = 1).
std::vector<std::vector<int>> factorizations(int n) {
  if (n == 1) return {{}};
  std::vector<std::vector<int>> out;
  for (int f = 2; f <= n; ++f) {
    if (n % f) continue;
    for (auto rest : factorizations(n / f)) {
      rest.insert(rest.begin(), f);
      out.push_back(rest);
    }
  }
  return out;
}

/// The expected order of ranks: partition `members` by keys[l] (parts in order of their
/// lowest rank), recurse inward, ranks in order at the bottom.
std::vector<int> expected_order(const Keys& keys, std::vector<int> members, int l) {
  std::sort(members.begin(), members.end());
  if (l < 0) return members;
  std::vector<std::string> part_key;
  std::vector<std::vector<int>> parts;
  for (int r : members) {
    auto it = std::find(part_key.begin(), part_key.end(), keys[l][r]);
    if (it == part_key.end()) {
      part_key.push_back(keys[l][r]);
      parts.push_back({r});
    } else {
      parts[it - part_key.begin()].push_back(r);
    }
  }
  std::vector<int> out;
  for (const auto& p : parts) {
    auto sub = expected_order(keys, p, l - 1);
    out.insert(out.end(), sub.begin(), sub.end());
  }
  return out;
}

/// Whether ranks a and b share the level-l group (equal keys at levels l..L-1).
bool same_group(const Keys& keys, size_t l, int a, int b) {
  for (size_t k = l; k < keys.size(); ++k)
    if (keys[k][a] != keys[k][b]) return false;
  return true;
}

/// Checks rank_at / position_of / coord against each other: inverse permutations, and
/// the coordinates are the mixed-radix digits of the position.
void check_consistent(const Hierarchy& h, int ranks) {
  REQUIRE(h.ranks() == ranks);
  REQUIRE(static_cast<int>(h.position_of.size()) == ranks);
  REQUIRE(h.levels() >= 1);
  REQUIRE(h.names.size() == h.factors.size());
  long long product = 1;
  for (int f : h.factors) {
    CHECK(f >= 1);
    product *= f;
  }
  CHECK(product == ranks);
  if (ranks > 1)
    for (int f : h.factors) CHECK(f >= 2);  // levels of factor 1 are dropped
  std::vector<bool> seen(ranks, false);
  for (int p = 0; p < ranks; ++p) {
    const int r = h.rank_at[p];
    REQUIRE(r >= 0);
    REQUIRE(r < ranks);
    CHECK(!seen[r]);
    seen[r] = true;
    CHECK(h.position_of[r] == p);
  }
  for (int r = 0; r < ranks; ++r) {
    int pos = 0, radix = 1;
    for (int l = 0; l < h.levels(); ++l) {
      const int c = h.coord(r, l);
      CHECK(c >= 0);
      CHECK(c < h.factors[l]);
      pos += c * radix;
      radix *= h.factors[l];
    }
    CHECK(pos == h.position_of[r]);
  }
}

/// Full check of a from_keys result against the keys: the brute-force order, and every
/// key group a contiguous, aligned block of positions.
void check_layout(const Hierarchy& h, const Keys& keys) {
  const int n = static_cast<int>(keys[0].size());
  check_consistent(h, n);
  std::vector<int> all(n);
  std::iota(all.begin(), all.end(), 0);
  CHECK(h.rank_at == expected_order(keys, all, static_cast<int>(keys.size()) - 1));
  for (size_t l = 0; l < keys.size(); ++l) {
    int group_size = 0;
    for (int r = 0; r < n; ++r) group_size += same_group(keys, l, 0, r);
    for (int a = 0; a < n; ++a)
      for (int b = 0; b < n; ++b)
        CHECK(same_group(keys, l, a, b) ==
              (h.position_of[a] / group_size == h.position_of[b] / group_size));
  }
}

/// The keys of one rank list: keys[l][r] = f(l, r).
template <typename F>
Keys make_keys(int levels, int n, F f) {
  Keys k(levels, std::vector<std::string>(n));
  for (int l = 0; l < levels; ++l)
    for (int r = 0; r < n; ++r) k[l][r] = f(l, r);
  return k;
}

}  // namespace

TEST_CASE("topology: parse_factors reads lists of factors") {
  CHECK(parse_factors("2x2x2") == std::vector<int>{2, 2, 2});
  CHECK(parse_factors("4x12") == std::vector<int>{4, 12});
  CHECK(parse_factors("7") == std::vector<int>{7});
  CHECK(parse_factors("1") == std::vector<int>{1});
  CHECK(parse_factors("1x8x1") == std::vector<int>{1, 8, 1});
  CHECK(parse_factors("16x03") == std::vector<int>{16, 3});
  CHECK(parse_factors("1048576") == std::vector<int>{1 << 20});
  CHECK(parse_factors("32767x65536") == std::vector<int>{32767, 65536});  // 2^31 - 2^16
}

TEST_CASE("topology: parse_factors rejects malformed lists") {
  for (const char* bad :
       {"", "x", "2x", "x2", "2xx2", "0", "0x2", "2x0", "00", "2 x2", " 2", "2 ", "a", "2xa",
        "2x-1", "-2", "+2", "2.0", "2,2", "1048577", "99999999999999999999", "2147483648",
        "32768x65536", "65536x65536", "2x2x2x2x2x2x2x2x2x2x2x2x2x2x2x2x2x2x2x2x2x2x2x2x2x2x2x"
                                     "2x2x2x2"}) {
    CAPTURE(bad);
    CHECK_FALSE(parse_factors(bad).has_value());
  }
  // 2^30 is still within int.
  CHECK(parse_factors("1024x1024x1024") == std::vector<int>{1024, 1024, 1024});
}

TEST_CASE("topology: impose gives the identity layout for every factorization of 1..64") {
  int cases = 0;
  for (int n = 1; n <= 64; ++n) {
    for (const auto& f : factorizations(n)) {
      CAPTURE(n);
      std::string why;
      auto h = impose(f, n, &why);
      REQUIRE(h.has_value());
      ++cases;
      const std::vector<int> want = f.empty() ? std::vector<int>{1} : f;
      CHECK(h->factors == want);
      CHECK(h->names == std::vector<std::string>(want.size(), "imposed"));
      check_consistent(*h, n);
      for (int r = 0; r < n; ++r) {
        CHECK(h->rank_at[r] == r);
        int rest = r;
        for (int l = 0; l < h->levels(); ++l) {
          CHECK(h->coord(r, l) == rest % want[l]);
          rest /= want[l];
        }
      }
    }
  }
  CHECK(cases == 1 + 1 + 1 + 2 + 1 + 3 + 1 + 4 + 2 + 3 + 1 + 8 + 1 + 3 + 3 + 8 + 1 + 8 + 1 + 8 +
                     3 + 3 + 1 + 20 + 2 + 3 + 4 + 8 + 1 + 13 + 1 + 16 + 3 + 3 + 3 + 26 + 1 + 3 +
                     3 + 20 + 1 + 13 + 1 + 8 + 8 + 3 + 1 + 48 + 2 + 8 + 3 + 8 + 1 + 20 + 3 + 20 +
                     3 + 3 + 1 + 44 + 1 + 3 + 8 + 32);
}

TEST_CASE("topology: impose rejects factors whose product is not the size") {
  std::string why;
  CHECK_FALSE(impose({2, 3}, 5, &why).has_value());
  CHECK(why.find('5') != std::string::npos);
  CHECK(why.find("2x3") != std::string::npos);
  why.clear();
  CHECK_FALSE(impose({2, 2, 2}, 16, &why).has_value());
  CHECK_FALSE(why.empty());
  CHECK_FALSE(impose({}, 2, &why).has_value());
  CHECK_FALSE(impose({4, 0}, 0, &why).has_value());
  CHECK_FALSE(impose({2, -1}, -2, &why).has_value());
  CHECK_FALSE(impose({-2, -1}, 2, &why).has_value());
  CHECK_FALSE(impose({65536, 65536}, 0, &why).has_value());  // product overflows int
  CHECK_FALSE(impose({65536, 65536, 2}, 0, &why).has_value());
  CHECK(impose({2, 3}, 6, nullptr).has_value());
  CHECK_FALSE(impose({2, 3}, 7, nullptr).has_value());  // no reason asked for
}

TEST_CASE("topology: impose drops levels of factor 1") {
  auto h = impose({1, 4, 1, 2, 1}, 8, nullptr);
  REQUIRE(h.has_value());
  CHECK(h->factors == std::vector<int>{4, 2});
  CHECK(h->coord(5, 0) == 1);
  CHECK(h->coord(5, 1) == 1);
  CHECK(h->coord(3, 1) == 0);
  h = impose({1, 1, 1}, 1, nullptr);
  REQUIRE(h.has_value());
  CHECK(h->factors == std::vector<int>{1});
  CHECK(h->rank_at == std::vector<int>{0});
  h = impose({}, 1, nullptr);
  REQUIRE(h.has_value());
  CHECK(h->factors == std::vector<int>{1});
  h = impose({1, 6}, 6, nullptr);
  REQUIRE(h.has_value());
  CHECK(h->factors == std::vector<int>{6});
  CHECK(h->describe() == "6 (imposed)");
}

TEST_CASE("topology: describe lists factors and level names") {
  auto h = impose({2, 2, 2}, 8, nullptr);
  REQUIRE(h.has_value());
  CHECK(h->describe() == "2x2x2 (imposed x imposed x imposed)");
  // 3 nodes of 2 NUMA domains of 2 ranks, ranks in order.
  Keys k = make_keys(2, 12, [](int l, int r) {
    return l == 0 ? std::to_string(r % 4 / 2) : std::to_string(r / 4);
  });
  auto d = from_keys(k, {"numa", "node"}, nullptr);
  REQUIRE(d.has_value());
  CHECK(d->describe() == "2x2x3 (numa x node x nodes)");
  // 12 nodes of 4 ranks.
  k = make_keys(1, 48, [](int, int r) { return "n" + std::to_string(r / 4); });
  d = from_keys(k, {"node"}, nullptr);
  REQUIRE(d.has_value());
  CHECK(d->describe() == "4x12 (node x nodes)");
  // One node of 8 ranks in 4 NUMA domains.
  k = make_keys(2, 8, [](int l, int r) { return l == 0 ? std::to_string(r / 2) : "0"; });
  d = from_keys(k, {"numa", "node"}, nullptr);
  REQUIRE(d.has_value());
  CHECK(d->describe() == "2x4 (numa x node)");
}

TEST_CASE("topology: from_keys with round-robin node placement") {
  for (int per_node = 1; per_node <= 8; ++per_node) {
    const int n = 4 * per_node;
    CAPTURE(per_node);
    Keys k = make_keys(1, n, [](int, int r) { return "node" + std::to_string(r % 4); });
    std::string why;
    auto h = from_keys(k, {"node"}, &why);
    REQUIRE_MESSAGE(h.has_value(), why);
    check_layout(*h, k);
    if (per_node == 1) {
      CHECK(h->factors == std::vector<int>{4});
      CHECK(h->names == Names{"nodes"});
    } else {
      CHECK(h->factors == std::vector<int>{per_node, 4});
      CHECK(h->names == Names{"node", "nodes"});
    }
    // Node j holds ranks j, j+4, ...: positions j*per_node .. (j+1)*per_node-1.
    for (int pos = 0; pos < n; ++pos)
      CHECK(h->rank_at[pos] == (pos % per_node) * 4 + pos / per_node);
    if (per_node > 1)
      for (int r = 0; r < n; ++r) {
        CHECK(h->coord(r, 0) == r / 4);
        CHECK(h->coord(r, 1) == r % 4);
      }
  }
}

TEST_CASE("topology: from_keys numa x node") {
  // 3 nodes of 4 ranks (node = r / 4); NUMA domain (r % 4) / 2 with the same names "0",
  // "1" on every node.
  Keys k = make_keys(2, 12, [](int l, int r) {
    return l == 0 ? std::to_string(r % 4 / 2) : "host" + std::to_string(r / 4);
  });
  auto h = from_keys(k, {"numa", "node"}, nullptr);
  REQUIRE(h.has_value());
  check_layout(*h, k);
  CHECK(h->factors == std::vector<int>{2, 2, 3});
  CHECK(h->names == Names{"numa", "node", "nodes"});
  for (int r = 0; r < 12; ++r) {
    CHECK(h->rank_at[r] == r);
    CHECK(h->coord(r, 0) == r % 2);
    CHECK(h->coord(r, 1) == r % 4 / 2);
    CHECK(h->coord(r, 2) == r / 4);
  }

  // The NUMA domains interleaved (r % 2): node 0 is {0, 2} then {1, 3}.
  k = make_keys(2, 12, [](int l, int r) {
    return l == 0 ? std::to_string(r % 2) : "host" + std::to_string(r / 4);
  });
  h = from_keys(k, {"numa", "node"}, nullptr);
  REQUIRE(h.has_value());
  check_layout(*h, k);
  CHECK(h->factors == std::vector<int>{2, 2, 3});
  CHECK(h->rank_at == std::vector<int>{0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11});
  CHECK(h->coord(2, 0) == 1);
  CHECK(h->coord(1, 1) == 1);
  CHECK(h->coord(9, 2) == 2);
}

TEST_CASE("topology: from_keys with switch groups above the node") {
  // 8 nodes of 2 ranks, rank r on node r % 8; nodes 2s and 2s+1 on switch "sw(3-s)" (the
  // names do not follow the rank order).
  const int n = 16;
  Keys k = make_keys(2, n, [](int l, int r) {
    const int node = r % 8;
    return l == 0 ? std::to_string(node) : "sw" + std::to_string(3 - node / 2);
  });
  std::string why;
  auto h = from_keys(k, {"node", "group1"}, &why);
  REQUIRE_MESSAGE(h.has_value(), why);
  check_layout(*h, k);
  CHECK(h->factors == std::vector<int>{2, 2, 4});
  CHECK(h->names == Names{"node", "group1", "group1s"});
  CHECK(h->describe() == "2x2x4 (node x group1 x group1s)");
  for (int pos = 0; pos < n; ++pos) {
    const int c0 = pos % 2, c1 = pos / 2 % 2, c2 = pos / 4;
    CHECK(h->rank_at[pos] == (2 * c2 + c1) + 8 * c0);
  }
  for (int r = 0; r < n; ++r) {
    CHECK(h->coord(r, 0) == r / 8);
    CHECK(h->coord(r, 1) == r % 8 % 2);
    CHECK(h->coord(r, 2) == r % 8 / 2);
  }

  // Every switch with one node: the group level does not split and is dropped.
  k = make_keys(2, 8, [](int l, int r) {
    return l == 0 ? std::to_string(r / 2) : "sw" + std::to_string(r / 2);
  });
  h = from_keys(k, {"node", "group1"}, &why);
  REQUIRE_MESSAGE(h.has_value(), why);
  check_layout(*h, k);
  CHECK(h->factors == std::vector<int>{2, 4});
  CHECK(h->names == Names{"node", "group1s"});
}

TEST_CASE("topology: from_keys rejects non-uniform levels with the reason") {
  std::string why;
  // Nodes of 4 and 3 ranks.
  Keys k = make_keys(1, 7, [](int, int r) { return r < 4 ? "a" : "b"; });
  CHECK_FALSE(from_keys(k, {"node"}, &why).has_value());
  CHECK(why.find("node sizes differ: 4 and 3") != std::string::npos);

  // Uniform nodes, NUMA domains of 3 and 1 ranks.
  k = make_keys(2, 8, [](int l, int r) {
    return l == 0 ? (r % 4 < 3 ? "0" : "1") : std::to_string(r / 4);
  });
  why.clear();
  CHECK_FALSE(from_keys(k, {"numa", "node"}, &why).has_value());
  CHECK(why.find("numa sizes differ: 3 and 1") != std::string::npos);

  // One node in 2 NUMA domains, the other in one.
  k = make_keys(2, 8, [](int l, int r) {
    return l == 0 ? (r < 4 ? std::to_string(r / 2) : "0") : std::to_string(r / 4);
  });
  why.clear();
  CHECK_FALSE(from_keys(k, {"numa", "node"}, &why).has_value());
  CHECK(why.find("numa sizes differ: 2 and 4") != std::string::npos);

  // Uniform nodes of 2, switches of 2 and 1 nodes.
  k = make_keys(2, 6, [](int l, int r) {
    return l == 0 ? std::to_string(r / 2) : (r < 4 ? "swA" : "swB");
  });
  why.clear();
  CHECK_FALSE(from_keys(k, {"node", "group1"}, &why).has_value());
  CHECK(why.find("group1 sizes differ: 4 and 2") != std::string::npos);

  // Malformed input.
  why.clear();
  CHECK_FALSE(from_keys({}, {}, &why).has_value());
  CHECK_FALSE(why.empty());
  why.clear();
  CHECK_FALSE(from_keys({{"a", "a"}}, {"node", "group1"}, &why).has_value());
  CHECK_FALSE(why.empty());
  why.clear();
  CHECK_FALSE(from_keys({{"a", "a"}, {"x"}}, {"node", "group1"}, &why).has_value());
  CHECK_FALSE(why.empty());
  CHECK_FALSE(from_keys({{}}, {"node"}, &why).has_value());
}

TEST_CASE("topology: from_keys on one node gives one level of all ranks") {
  Keys k = make_keys(1, 6, [](int, int) { return "7"; });
  auto h = from_keys(k, {"node"}, nullptr);
  REQUIRE(h.has_value());
  check_layout(*h, k);
  CHECK(h->factors == std::vector<int>{6});
  CHECK(h->names == Names{"node"});
  for (int r = 0; r < 6; ++r) CHECK(h->coord(r, 0) == r);

  // With NUMA keys that do not split it.
  k = make_keys(2, 6, [](int, int) { return "0"; });
  h = from_keys(k, {"numa", "node"}, nullptr);
  REQUIRE(h.has_value());
  CHECK(h->factors == std::vector<int>{6});

  // One rank.
  k = make_keys(2, 1, [](int, int) { return "0"; });
  h = from_keys(k, {"numa", "node"}, nullptr);
  REQUIRE(h.has_value());
  check_consistent(*h, 1);
  CHECK(h->factors == std::vector<int>{1});
  CHECK(h->rank_at == std::vector<int>{0});
}

TEST_CASE("topology: equal NUMA keys on different nodes are different groups") {
  // 2 nodes of 2 ranks, placed round-robin; every rank's NUMA key is "0".
  Keys k = make_keys(2, 4, [](int l, int r) { return l == 0 ? "0" : std::to_string(r % 2); });
  auto h = from_keys(k, {"numa", "node"}, nullptr);
  REQUIRE(h.has_value());
  check_layout(*h, k);
  CHECK(h->factors == std::vector<int>{2, 2});  // 2 per NUMA domain, 2 nodes (not 4x1)
  CHECK(h->rank_at == std::vector<int>{0, 2, 1, 3});

  // 2 nodes with NUMA keys "0","1" each: 4 groups of 2, not 2 groups of 4.
  k = make_keys(2, 8, [](int l, int r) {
    return l == 0 ? std::to_string(r % 4 / 2) : std::to_string(r / 4);
  });
  h = from_keys(k, {"numa", "node"}, nullptr);
  REQUIRE(h.has_value());
  check_layout(*h, k);
  CHECK(h->factors == std::vector<int>{2, 2, 2});
  // Ranks 0 and 4 share the NUMA name but not the group.
  CHECK(h->position_of[0] / 2 != h->position_of[4] / 2);

  // A switch key equal to a node key ("0") is unrelated to it.
  k = make_keys(2, 4, [](int l, int r) { return l == 0 ? std::to_string(r / 2) : "0"; });
  h = from_keys(k, {"node", "group1"}, nullptr);
  REQUIRE(h.has_value());
  CHECK(h->factors == std::vector<int>{2, 2});
  CHECK(h->names == Names{"node", "group1"});
}

TEST_CASE("topology: from_keys matches a brute-force layout on random hierarchies") {
  std::mt19937 rng(12345);
  int built = 0;
  for (int iter = 0; iter < 400; ++iter) {
    const int L = 1 + static_cast<int>(rng() % 3);
    std::vector<int> f(L + 1);
    int n = 1;
    for (int& x : f) {
      x = 1 + static_cast<int>(rng() % 4);
      n *= x;
    }
    // Group g of level l (by position) holds positions [g*span_l, (g+1)*span_l).
    std::vector<int> span(L);
    for (int l = 0, s = 1; l < L; ++l) span[l] = s *= f[l];
    std::vector<int> rank_of(n);  // position -> rank, shuffled
    std::iota(rank_of.begin(), rank_of.end(), 0);
    std::shuffle(rank_of.begin(), rank_of.end(), rng);
    const bool local_names = rng() % 2;  // names repeat across parents
    Keys k(L, std::vector<std::string>(n));
    for (int pos = 0; pos < n; ++pos)
      for (int l = 0; l < L; ++l) {
        const int g = pos / span[l];
        const int label = local_names ? g % f[l + 1] : (g * 7919) % 10007;
        k[l][rank_of[pos]] = "k" + std::to_string(label);
      }
    CAPTURE(iter);
    std::string why;
    Names names;
    for (int l = 0; l < L; ++l) names.push_back(std::string(1, static_cast<char>('a' + l)));
    auto h = from_keys(k, names, &why);
    REQUIRE_MESSAGE(h.has_value(), why);
    ++built;
    check_layout(*h, k);
    std::vector<int> want_f;
    Names want_n;
    names.push_back(names.back() + "s");
    for (int l = 0; l <= L; ++l)
      if (f[l] > 1) {
        want_f.push_back(f[l]);
        want_n.push_back(names[l]);
      }
    if (want_f.empty()) {
      want_f = {1};
      want_n = {names.back()};
    }
    CHECK(h->factors == want_f);
    CHECK(h->names == want_n);
  }
  CHECK(built == 400);
}
