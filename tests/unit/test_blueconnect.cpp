// BlueConnect's decomposition (algorithms/blueconnect_plan.hpp), checked against a brute
// force computation of the same facts: the groups of every stage, the segments and their
// cuts, and the final blocks. The schedules that run the stages are simulated in
// test_schedule.cpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "algorithms/blueconnect_plan.hpp"
#include "core/topology.hpp"
#include "hierarchies.hpp"

using namespace streamcoll;
using testing::factorizations;
using testing::text;

namespace {

// Digits of a position, innermost first, by repeated division.
std::vector<int> digits(const std::vector<int>& f, int pos) {
  std::vector<int> d;
  for (int m : f) {
    d.push_back(pos % m);
    pos /= m;
  }
  return d;
}

// Checks every fact of the plans of all ranks for one hierarchy and count; returns "" or
// the first fault.
std::string check(const topo::Hierarchy& h, uint64_t count, bool ring_only) {
  const int p = h.ranks();
  std::vector<bc::Plan> plans;
  for (int r = 0; r < p; ++r) plans.push_back(bc::plan(h, r, count, ring_only));
  std::vector<int> cover(count, 0);
  for (int r = 0; r < p; ++r) {
    const bc::Plan& pl = plans[static_cast<size_t>(r)];
    const std::vector<int> d = digits(h.factors, h.position_of[static_cast<size_t>(r)]);
    if (pl.stages.size() != h.factors.size()) return "wrong number of stages";
    uint64_t off = 0, len = count;
    for (size_t i = 0; i < pl.stages.size(); ++i) {
      const bc::Stage& st = pl.stages[i];
      const int m = h.factors[i];
      const std::string at = "rank " + std::to_string(r) + " stage " + std::to_string(i) + ": ";
      // The group: every rank whose digits equal ours except digit i, by that digit.
      std::vector<int> want(static_cast<size_t>(m), -1);
      for (int q = 0; q < p; ++q) {
        std::vector<int> e = digits(h.factors, h.position_of[static_cast<size_t>(q)]);
        bool same = true;
        for (size_t j = 0; j < e.size(); ++j) same = same && (j == i || e[j] == d[j]);
        if (same) want[static_cast<size_t>(e[i])] = q;
      }
      if (st.ranks != want) return at + "wrong group";
      if (st.me != d[i] || st.ranks[static_cast<size_t>(st.me)] != r) return at + "wrong index";
      if (st.level != static_cast<int>(i)) return at + "wrong level";
      const bool pow2 = (m & (m - 1)) == 0;
      if ((st.algo == bc::StageAlgo::halving_doubling) != (pow2 && !ring_only))
        return at + "wrong algorithm";
      // The segment is the previous stage's own block; its cut is nearly even.
      if (st.seg_off != off || st.seg_len != len) return at + "wrong segment";
      if (st.bounds.size() != static_cast<size_t>(m) + 1 || st.bounds.front() != off ||
          st.bounds.back() != off + len)
        return at + "bounds do not span the segment";
      for (int j = 0; j < m; ++j) {
        const uint64_t want_len = len / static_cast<uint64_t>(m) +
                                  (static_cast<uint64_t>(j) < len % static_cast<uint64_t>(m) ? 1 : 0);
        if (st.block_len(j) != want_len) return at + "uneven cut";
      }
      // Every member of the group sees the same segment and cut.
      for (int q : st.ranks) {
        const bc::Stage& o = plans[static_cast<size_t>(q)].stages[i];
        if (o.bounds != st.bounds || o.ranks != st.ranks) return at + "group members disagree";
      }
      off = st.block_off(st.me);
      len = st.block_len(st.me);
    }
    if (pl.final_off != off || pl.final_len != len) return "rank " + std::to_string(r) + ": final block";
    uint64_t fo = 0, fl = 0;
    bc::final_block(h.factors, h.position_of[static_cast<size_t>(r)], count, &fo, &fl);
    if (fo != off || fl != len) return "final_block disagrees with plan";
    for (uint64_t j = off; j < off + len; ++j) ++cover[j];
  }
  for (uint64_t j = 0; j < count; ++j)
    if (cover[j] != 1)
      return "element " + std::to_string(j) + " owned by " + std::to_string(cover[j]) + " ranks";
  return "";
}

}  // namespace

TEST_CASE("blueconnect plan: every factorization of 1..64 ranks, three layouts") {
  int hierarchies = 0, failures = 0;
  for (int p = 1; p <= 64; ++p) {
    const std::vector<std::vector<int>> fs = factorizations(p);
    for (const auto& f : fs) {
      for (int shift : {-1, 0, 5}) {
        const topo::Hierarchy h = testing::layout(f, p, shift);
        ++hierarchies;
        for (uint64_t n : {uint64_t{0}, uint64_t{1}, uint64_t(p - 1), uint64_t(p), uint64_t(p + 1),
                           uint64_t(3 * p + 5), uint64_t{1000}}) {
          for (bool ring_only : {false, true}) {
            const std::string e = check(h, n, ring_only);
            if (!e.empty() && ++failures <= 8)
              FAIL_CHECK((text(f) + " shift " + std::to_string(shift) + " count " +
                          std::to_string(n) + ": " + e));
          }
        }
      }
    }
  }
  MESSAGE("blueconnect plan: " << hierarchies << " hierarchies checked, " << failures << " failed");
  CHECK(hierarchies > 1000);
  CHECK(failures == 0);
}

TEST_CASE("blueconnect plan: the paper's hierarchies") {
  for (auto f : {std::vector<int>{3, 2, 2}, {4, 6}, {16, 6}, {2, 2, 2}, {4, 48}, {6, 16}}) {
    const int p = std::accumulate(f.begin(), f.end(), 1, std::multiplies<int>());
    for (int shift : {-1, 7}) {
      const topo::Hierarchy h = testing::layout(f, p, shift);
      for (uint64_t n : {uint64_t{1}, uint64_t(p + 1), uint64_t{25'000'000 / 4 + 3}})
        CHECK_MESSAGE(check(h, n, false) == "", (text(f) + " count " + std::to_string(n)));
    }
  }
  // 3x2x2 (paper section 3): rank 5 = digits (2, 1, 0) reduce-scatters with ranks 3, 4, 5,
  // then within the block it owns with ranks 2 and 5, then with 5 and 11.
  const topo::Hierarchy h = testing::layout({3, 2, 2}, 12, -1);
  const bc::Plan pl = bc::plan(h, 5, 120);
  REQUIRE(pl.stages.size() == 3);
  CHECK(pl.stages[0].ranks == std::vector<int>{3, 4, 5});
  CHECK(pl.stages[1].ranks == std::vector<int>{2, 5});
  CHECK(pl.stages[2].ranks == std::vector<int>{5, 11});
  CHECK(pl.stages[0].algo == bc::StageAlgo::ring);
  CHECK(pl.stages[1].algo == bc::StageAlgo::halving_doubling);
  // 120 elements: block 2 of 3 = [80, 120), block 1 of 2 = [100, 120), block 0 = [100, 110).
  CHECK(pl.stages[1].seg_off == 80);
  CHECK(pl.stages[2].seg_off == 100);
  CHECK(pl.final_off == 100);
  CHECK(pl.final_len == 10);
}

TEST_CASE("blueconnect plan: tree slots") {
  for (int p = 1; p <= 64; ++p) {
    const std::vector<std::vector<int>> fs = factorizations(p);
    for (const auto& f0 : fs) {
      const std::vector<int> f = f0.empty() ? std::vector<int>{1} : f0;
      std::set<int> seen;
      for (int pos = 0; pos < p; ++pos) {
        const int slot = bc::tree_slot(f, pos);
        // Mixed radix with digit 0 most significant, computed the long way.
        const std::vector<int> d = digits(f, pos);
        int want = 0;
        for (size_t i = 0; i < f.size(); ++i) {
          int weight = 1;
          for (size_t j = i + 1; j < f.size(); ++j) weight *= f[j];
          want += d[i] * weight;
        }
        CHECK(slot == want);
        seen.insert(slot);
        // With p equal blocks of c elements, the rank's final block is exactly its slot.
        uint64_t off = 0, len = 0;
        bc::final_block(f, pos, static_cast<uint64_t>(p) * 3, &off, &len);
        CHECK(off == static_cast<uint64_t>(slot) * 3);
        CHECK(len == 3);
      }
      CHECK(seen.size() == static_cast<size_t>(p));
      CHECK((seen.empty() || (*seen.begin() == 0 && *seen.rbegin() == p - 1)));
    }
  }
  // 2x2: position 1 (digits 1,0) gets slot 2, position 2 (digits 0,1) slot 1.
  CHECK(bc::tree_slot({2, 2}, 1) == 2);
  CHECK(bc::tree_slot({2, 2}, 2) == 1);
}
