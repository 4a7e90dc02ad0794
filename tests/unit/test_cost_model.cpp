// The α-β-γ allreduce models (config/cost_model.hpp) against closed forms worked out
// by hand here, and their structural properties (BlueConnect on one level is a flat
// algorithm, equal links give the flat ring's bandwidth term, costs grow with n, best()
// picks latency-bound and bandwidth-bound winners). No MPI.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "config/cost_model.hpp"

using namespace streamcoll::model;

namespace {

// Round numbers so the hand-computed values are easy to read.
constexpr double kA = 1e-6;    // α, s
constexpr double kB = 1e-9;    // β, s/byte (1 GB/s)
constexpr double kG = 1e-10;   // γ, s/byte
constexpr double kN = 1e6;     // bytes

doctest::Approx approx(double v) { return doctest::Approx(v).epsilon(1e-12); }

Hierarchy uniform(std::vector<int> f, double a = kA, double b = kB) {
  Hierarchy h;
  h.factors = f;
  h.links.assign(f.size(), LinkLevel{a, b, 0});
  return h;
}

/// 4 GPUs per node (NVLink-like, cheap), nodes over a slower NIC that a node's 4 GPUs
/// share (4e-10 s/B each when all send) and one GPU alone uses at half its rate (2e-10).
constexpr double kSolo1 = 2e-10;
Hierarchy two_levels(int nodes) {
  Hierarchy h;
  h.factors = {4, nodes};
  h.links = {LinkLevel{1e-6, 1e-11, 0}, LinkLevel{5e-6, 4e-10, kSolo1}};
  return h;
}

double sum_stages(const Breakdown& b) {
  double t = 0;
  for (const StageCost& s : b.stages) t += s.cost.total();
  return t;
}

}  // namespace

TEST_CASE("cost model: bandwidth helper and option parsing") {
  CHECK(beta_from_gbps(50) == approx(2e-11));
  CHECK(beta_from_gbps(0) == 0);
  const LinkLevel l = link_gbps(2e-6, 50, 100);
  CHECK(l.alpha == approx(2e-6));
  CHECK(l.beta == approx(2e-11));
  CHECK(l.solo() == approx(1e-11));
  CHECK(LinkLevel{1, 3, 0}.solo() == 3);

  auto lv = parse_level("2e-6:50");
  REQUIRE(lv);
  CHECK(lv->alpha == approx(2e-6));
  CHECK(lv->beta == approx(2e-11));
  CHECK(lv->solo() == approx(2e-11));
  lv = parse_level("5e-6:6.25:12.5");
  REQUIRE(lv);
  CHECK(lv->beta == approx(1.6e-10));
  CHECK(lv->solo() == approx(8e-11));
  for (const char* bad : {"", "2e-6", "2e-6:", ":50", "x:50", "2e-6:0", "-1:50", "1:2:0",
                          "1:2:3:4", "1:2x"}) {
    CAPTURE(bad);
    CHECK_FALSE(parse_level(bad));
  }
}

TEST_CASE("cost model: crossed_level") {
  const std::vector<int> f = {4, 48};
  CHECK(crossed_level(f, 5, 5) == -1);
  CHECK(crossed_level(f, 0, 1) == 0);
  CHECK(crossed_level(f, 3, 4) == 1);
  CHECK(crossed_level(f, 0, 191) == 1);
  const std::vector<int> g = {2, 3, 4};
  CHECK(crossed_level(g, 0, 1) == 0);
  CHECK(crossed_level(g, 1, 2) == 1);
  CHECK(crossed_level(g, 5, 6) == 2);
  CHECK(crossed_level(g, 6, 11) == 1);
  CHECK(is_pow2(1));
  CHECK(is_pow2(64));
  CHECK_FALSE(is_pow2(48));
  CHECK(floor_log2(48) == 5);
  CHECK(ceil_log2(48) == 6);
  CHECK(ceil_log2(4) == 2);
  CHECK(ceil_log2(1) == 0);
}

TEST_CASE("cost model: flat ring closed forms") {
  SUBCASE("p = 4: 6α + 1.5nβ (+ 0.75nγ)") {
    const Breakdown b = ring_allreduce(uniform({4}), kN, Machine{0});
    CHECK(b.error.empty());
    CHECK(b.algo == Algorithm::ring);
    CHECK(b.seconds() == approx(6 * kA + 1.5 * kN * kB));
    CHECK(b.total.latency == approx(6 * kA));
    CHECK(b.total.bandwidth == approx(1.5 * kN * kB));
    const Breakdown g = ring_allreduce(uniform({4}), kN, Machine{kG});
    CHECK(g.total.reduction == approx(0.75 * kN * kG));
    CHECK(g.seconds() == approx(6 * kA + 1.5 * kN * kB + 0.75 * kN * kG));
  }
  SUBCASE("slowest crossed link: α max, outer β at its solo value") {
    // 4x2: 8 ranks, 14 steps of n/8; α* = 5e-6, β* = max(1e-11, solo 2e-10).
    const Breakdown b = ring_allreduce(two_levels(2), kN, Machine{0});
    CHECK(b.total.latency == approx(14 * 5e-6));
    CHECK(b.total.bandwidth == approx(2.0 * 7 / 8 * kN * kSolo1));
    // A level with one member is not crossed: 4x1 is a ring on level 0 alone.
    const Breakdown one = ring_allreduce(two_levels(1), kN, Machine{0});
    CHECK(one.total.latency == approx(6 * 1e-6));
    CHECK(one.total.bandwidth == approx(1.5 * kN * 1e-11));
  }
}

TEST_CASE("cost model: recursive doubling closed forms") {
  const Machine m{kG};
  // p = 8: lg p·(α + nβ + nγ)
  CHECK(recursive_doubling_allreduce(uniform({8}), kN, m).seconds() ==
        approx(3 * (kA + kN * kB + kN * kG)));
  // p = 6: pre (α+nβ+nγ) + 2 steps (α+nβ+nγ) + post (α+nβ) = 4α + 4nβ + 3nγ
  const Breakdown b6 = recursive_doubling_allreduce(uniform({6}), kN, m);
  CHECK(b6.stages.size() == 4);
  CHECK(b6.total.latency == approx(4 * kA));
  CHECK(b6.total.bandwidth == approx(4 * kN * kB));
  CHECK(b6.total.reduction == approx(3 * kN * kG));
  // 2x4, cheap level 0, dear level 1: step d=1 stays inside the pairs, d=2 and d=4 cross.
  Hierarchy h;
  h.factors = {2, 4};
  h.links = {LinkLevel{1e-6, 1e-11, 0}, LinkLevel{9e-6, 3e-10, 1e-12}};
  const Breakdown b = recursive_doubling_allreduce(h, kN, Machine{0});
  REQUIRE(b.stages.size() == 3);
  CHECK(b.stages[0].level == 0);
  CHECK(b.stages[1].level == 1);
  CHECK(b.seconds() == approx((1e-6 + kN * 1e-11) + 2 * (9e-6 + kN * 3e-10)));
}

TEST_CASE("cost model: Rabenseifner closed forms") {
  const Machine m{kG};
  // p = 8: 2 lg p·α + 2(p-1)/p·nβ + (p-1)/p·nγ
  const Breakdown b8 = rabenseifner_allreduce(uniform({8}), kN, m);
  CHECK(b8.total.latency == approx(6 * kA));
  CHECK(b8.total.bandwidth == approx(1.75 * kN * kB));
  CHECK(b8.total.reduction == approx(0.875 * kN * kG));
  // p = 6 (p' = 4): (2 lg p' + 2)α + (2 + 2(p'-1)/p')nβ + (1 + (p'-1)/p')nγ
  const Breakdown b6 = rabenseifner_allreduce(uniform({6}), kN, m);
  CHECK(b6.total.latency == approx(6 * kA));
  CHECK(b6.total.bandwidth == approx(3.5 * kN * kB));
  CHECK(b6.total.reduction == approx(1.75 * kN * kG));
  // 2x4 as above: the halving starts at distance 4 (n/2 bytes, level 1), then 2 (n/4,
  // level 1), then 1 (n/8, level 0); the doubling mirrors it.
  Hierarchy h;
  h.factors = {2, 4};
  h.links = {LinkLevel{1e-6, 1e-11, 0}, LinkLevel{9e-6, 3e-10, 0}};
  const Breakdown b = rabenseifner_allreduce(h, kN, Machine{0});
  REQUIRE(b.stages.size() == 6);
  CHECK(b.stages[0].level == 1);
  CHECK(b.stages[2].level == 0);
  const double one_way = (9e-6 + kN / 2 * 3e-10) + (9e-6 + kN / 4 * 3e-10) + (1e-6 + kN / 8 * 1e-11);
  CHECK(b.seconds() == approx(2 * one_way));
}

TEST_CASE("cost model: two-level closed forms") {
  const Machine m{kG};
  const Hierarchy h = two_levels(48);
  const double a0 = 1e-6, b0 = 1e-11, a1 = 5e-6, b1solo = kSolo1;
  SUBCASE("pipelined reduce, ring among leaders at the solo β, pipelined broadcast") {
    const Breakdown b = two_level_allreduce(h, kN, m);
    CHECK(b.algo == Algorithm::two_level);
    REQUIRE(b.stages.size() == 4);  // reduce, leaders' reduce-scatter and all-gather, bcast
    CHECK(b.stages.front().what == "reduce");
    CHECK(b.stages.back().what == "broadcast");
    CHECK(b.stages[1].level == 1);
    CHECK(b.stages[1].group == 48);
    const double expect = 2 * 3 * a0 + 2 * kN * b0 + kN * kG +             // intra
                          2 * 47 * a1 + 2.0 * 47 / 48 * kN * b1solo +     // leaders' ring
                          47.0 / 48 * kN * kG;
    CHECK(b.seconds() == approx(expect));
    CHECK(sum_stages(b) == approx(expect));
  }
  SUBCASE("binomial intra-node reduce and broadcast") {
    TwoLevelOptions o;
    o.intra = IntraAlgo::binomial;
    const Breakdown b = two_level_allreduce(h, kN, m, o);
    const double expect = 2 * 2 * (a0 + kN * b0) + 2 * kN * kG + 2 * 47 * a1 +
                          2.0 * 47 / 48 * kN * b1solo + 47.0 / 48 * kN * kG;
    CHECK(b.seconds() == approx(expect));
  }
  SUBCASE("leaders' allreduce by recursive doubling on 2x4 nodes") {
    TwoLevelOptions o;
    o.inter = Algorithm::recursive_doubling;
    const Breakdown b = two_level_allreduce(two_levels(8), kN, m, o);
    const double expect = 6 * a0 + 2 * kN * b0 + kN * kG + 3 * (a1 + kN * b1solo + kN * kG);
    CHECK(b.seconds() == approx(expect));
    o.inter = Algorithm::blueconnect;
    CHECK_FALSE(two_level_allreduce(two_levels(8), kN, m, o).error.empty());
  }
  SUBCASE("degenerate hierarchies") {
    // One level: reduce + broadcast only.
    CHECK(two_level_allreduce(uniform({4}), kN, m).seconds() ==
          approx(6 * kA + 2 * kN * kB + kN * kG));
    // One rank per node: the leaders' ring is the flat ring.
    CHECK(two_level_allreduce(uniform({1, 8}), kN, m).seconds() ==
          approx(ring_allreduce(uniform({1, 8}), kN, m).seconds()));
  }
}

TEST_CASE("cost model: BlueConnect on one level is a flat algorithm") {
  const Machine m{kG};
  // A non-power-of-two factor runs a ring stage: BlueConnect = flat ring.
  for (int p : {3, 6, 12}) {
    CAPTURE(p);
    CHECK(blueconnect_allreduce(uniform({p}), kN, m).seconds() ==
          approx(ring_allreduce(uniform({p}), kN, m).seconds()));
  }
  // A power of two: ring stages on request = flat ring; by default halving/doubling =
  // Rabenseifner.
  CHECK(blueconnect_allreduce(uniform({8}), kN, m, StageAlgo::ring).seconds() ==
        approx(ring_allreduce(uniform({8}), kN, m).seconds()));
  const Breakdown hd = blueconnect_allreduce(uniform({8}), kN, m);
  CHECK(hd.total.latency == approx(6 * kA));
  CHECK(hd.seconds() == approx(rabenseifner_allreduce(uniform({8}), kN, m).seconds()));
  REQUIRE(hd.stages.size() == 2);
  CHECK(hd.stages[0].how == "halving");
  CHECK(hd.stages[1].how == "doubling");
}

TEST_CASE("cost model: BlueConnect on equal links") {
  const Machine m{kG};
  const Hierarchy h = uniform({4, 3, 5});  // p = 60
  const Breakdown bc = blueconnect_allreduce(h, kN, m, StageAlgo::ring);
  const Breakdown ring = ring_allreduce(h, kN, m);
  // Bandwidth: 2n·Σ(p_i-1)/P_i·β telescopes to the flat ring's 2(p-1)/p·nβ.
  CHECK(bc.total.bandwidth == approx(ring.total.bandwidth));
  CHECK(bc.total.bandwidth == approx(2.0 * 59 / 60 * kN * kB));
  // Latency: 2Σ(p_i-1)α instead of 2(p-1)α.
  CHECK(bc.total.latency == approx(2 * (3 + 2 + 4) * kA));
  CHECK(ring.total.latency == approx(2 * 59 * kA));
  CHECK(bc.total.reduction == approx(59.0 / 60 * kN * kG));
  // Stages: RS 0, 1, 2 then AG 2, 1, 0; stage i on n/(p0..p_{i-1}) bytes.
  REQUIRE(bc.stages.size() == 6);
  const int levels[6] = {0, 1, 2, 2, 1, 0};
  const double segs[6] = {kN, kN / 4, kN / 12, kN / 12, kN / 4, kN};
  for (int i = 0; i < 6; ++i) {
    CAPTURE(i);
    CHECK(bc.stages[i].level == levels[i]);
    CHECK(bc.stages[i].bytes == approx(segs[i]));
    CHECK(bc.stages[i].what == (i < 3 ? "reduce-scatter" : "all-gather"));
  }
  CHECK(bc.stages[1].cost.bandwidth == approx(2.0 / 3 * kN / 4 * kB));
  CHECK(bc.stages[1].cost.latency == approx(2 * kA));
  // Factors of 1 add no stage.
  CHECK(blueconnect_allreduce(uniform({4, 1, 3, 1, 5}), kN, m, StageAlgo::ring).seconds() ==
        approx(bc.seconds()));
}

TEST_CASE("cost model: BlueConnect on distinct links, by hand") {
  const Machine m{kG};
  const Hierarchy h = two_levels(48);
  const double a0 = 1e-6, b0 = 1e-11, a1 = 5e-6, b1 = 4e-10;  // stages use shared β
  // Default: p0 = 4 by halving/doubling (lg 4 = 2 steps), p1 = 48 by ring.
  const Breakdown b = blueconnect_allreduce(h, kN, m);
  CHECK(b.total.latency == approx(2 * 2 * a0 + 2 * 47 * a1));
  CHECK(b.total.bandwidth == approx(2 * 0.75 * kN * b0 + 2.0 * 47 / 48 * (kN / 4) * b1));
  CHECK(b.total.reduction == approx(191.0 / 192 * kN * kG));
  CHECK(b.seconds() == approx(sum_stages(b)));
  const Breakdown r = blueconnect_allreduce(h, kN, m, StageAlgo::ring);
  CHECK(r.total.latency == approx(2 * 3 * a0 + 2 * 47 * a1));
  CHECK(r.total.bandwidth == approx(b.total.bandwidth));
}

TEST_CASE("cost model: degenerate and invalid input") {
  const Machine m{kG};
  for (const ModelEntry& e : models()) {
    CAPTURE(name(e.algo));
    CHECK(e.fn(uniform({1}), kN, m).seconds() == 0);
    CHECK(e.fn(uniform({1, 1}), kN, m).stages.empty());
    CHECK(e.fn(uniform({4, 8}), 0, m).seconds() == 0);
    CHECK(std::isinf(e.fn(Hierarchy{}, kN, m).seconds()));
    CHECK(std::isinf(e.fn(uniform({4}), -1, m).seconds()));
  }
  Hierarchy h = uniform({4, 8});
  CHECK(check(h).empty());
  h.links.pop_back();
  CHECK(check(h).find("one link level per hierarchy level") != std::string::npos);
  h = uniform({4, 0});
  CHECK_FALSE(check(h).empty());
  h = uniform({4, 8}, -1e-6);
  CHECK_FALSE(check(h).empty());
  h = uniform({4, 8}, 1e-6, NAN);
  CHECK_FALSE(check(h).empty());
  CHECK_FALSE(check(uniform({4096, 4096, 4096})).empty());
  const Breakdown bad = best(Hierarchy{}, kN, m);
  CHECK_FALSE(bad.error.empty());
  CHECK(std::isinf(bad.seconds()));
}

TEST_CASE("cost model: stages add up and costs grow with n") {
  const Machine m{4e-12};
  for (int nodes : {48, 16, 3}) {
    const Hierarchy h = two_levels(nodes);
    for (const ModelEntry& e : models()) {
      CAPTURE(nodes);
      CAPTURE(name(e.algo));
      double prev = 0;
      for (double n = 1; n <= double(1 << 30); n *= 2) {
        const Breakdown b = e.fn(h, n, m);
        CHECK(b.algo == e.algo);
        CHECK(b.seconds() == approx(sum_stages(b)));
        CHECK(b.seconds() > prev);
        prev = b.seconds();
      }
      CHECK(evaluate(e.algo, h, 1e6, m).seconds() == approx(e.fn(h, 1e6, m).seconds()));
    }
  }
}

TEST_CASE("cost model: best() at tiny and huge n") {
  const Machine m{4e-12};
  const Hierarchy h = two_levels(48);
  auto min_of_all = [&](double n) {
    double t = INFINITY;
    for (const ModelEntry& e : models()) t = std::min(t, e.fn(h, n, m).seconds());
    return t;
  };
  // 4 bytes: latency only; recursive doubling needs 9 message start-ups (pre, 7 steps,
  // post), the others 16 or more.
  const Breakdown tiny = best(h, 4, m);
  CHECK(tiny.algo == Algorithm::recursive_doubling);
  CHECK(tiny.seconds() == approx(min_of_all(4)));
  CHECK(tiny.stages.size() == 9);
  // 1 GiB: bandwidth only; BlueConnect and NV-Group move the fewest bytes over the dear
  // level, and NV-Group hides its NVLink stages behind the ring by pipelining chunks.
  const Breakdown huge = best(h, double(1 << 30), m);
  CHECK(huge.algo == Algorithm::nvgroup);
  CHECK(huge.seconds() == approx(min_of_all(double(1 << 30))));
  for (const ModelEntry& e : models()) {
    if (e.algo == Algorithm::nvgroup || e.algo == Algorithm::blueconnect) continue;
    CAPTURE(name(e.algo));
    CHECK(blueconnect_allreduce(h, double(1 << 30), m).seconds() <
          e.fn(h, double(1 << 30), m).seconds());
  }
  // Equal in exact arithmetic, apart by rounding: a tie, won by the catalogue's first.
  CHECK(cheaper(1.0, 2.0));
  CHECK_FALSE(cheaper(2.0, 1.0));
  CHECK_FALSE(cheaper(1.0 - 1e-15, 1.0));
  // One level of 8: BlueConnect is Rabenseifner (a tie, the catalogue's first would
  // win), but NV-Group, taking the level as one NVLink group, needs 2 start-ups, not 6.
  const double rab = rabenseifner_allreduce(uniform({8}), double(1 << 30), Machine{kG}).seconds();
  const double bc8 = blueconnect_allreduce(uniform({8}), double(1 << 30), Machine{kG}).seconds();
  CHECK_FALSE(cheaper(rab, bc8));
  CHECK_FALSE(cheaper(bc8, rab));
  CHECK(best(uniform({8}), double(1 << 30), Machine{kG}).algo == Algorithm::nvgroup);
  // With one rank per node and equal links there is nothing to decompose: the flat
  // ring's bandwidth term ties BlueConnect's, and ring is first in the catalogue.
  const Hierarchy flat = uniform({1, 6});
  CHECK(best(flat, double(1 << 30), Machine{0}).algo == Algorithm::ring);
}

TEST_CASE("cost model: binary and double binary tree closed forms") {
  CHECK(name(Algorithm::binary_tree) == "tree");
  CHECK(name(Algorithm::double_binary_tree) == "double-tree");
  SUBCASE("p = 8, one level: height 3") {
    // Binary: 2·3α + 4nβ + 2nγ; double: 2·3α + 2nβ + nγ (each tree carries n/2).
    const Breakdown t = binary_tree_allreduce(uniform({8}), kN, Machine{kG});
    CHECK(t.error.empty());
    CHECK(t.algo == Algorithm::binary_tree);
    CHECK(t.total.latency == approx(6 * kA));
    CHECK(t.total.bandwidth == approx(4 * kN * kB));
    CHECK(t.total.reduction == approx(2 * kN * kG));
    CHECK(t.seconds() == approx(6 * kA + 4 * kN * kB + 2 * kN * kG));
    REQUIRE(t.stages.size() == 2);
    CHECK(t.stages[0].what == "reduce");
    CHECK(t.stages[1].what == "broadcast");
    CHECK(t.stages[1].cost.reduction == 0);
    const Breakdown d = double_binary_tree_allreduce(uniform({8}), kN, Machine{kG});
    CHECK(d.algo == Algorithm::double_binary_tree);
    CHECK(d.seconds() == approx(6 * kA + 2 * kN * kB + kN * kG));
    CHECK(d.total.latency == approx(6 * kA));
  }
  SUBCASE("p = 6: height ⌊lg 6⌋ = 2") {
    const Breakdown d = double_binary_tree_allreduce(uniform({6}), kN, Machine{0});
    CHECK(d.total.latency == approx(4 * kA));
    CHECK(d.total.bandwidth == approx(2 * kN * kB));
  }
  SUBCASE("two levels: slowest α, outer β at its solo value") {
    // 4x2 = 8 ranks: α* = 5e-6, β* = max(1e-11, solo 2e-10).
    const Breakdown d = double_binary_tree_allreduce(two_levels(2), kN, Machine{0});
    CHECK(d.seconds() == approx(6 * 5e-6 + 2 * kN * kSolo1));
    const Breakdown t = binary_tree_allreduce(two_levels(2), kN, Machine{0});
    CHECK(t.seconds() == approx(6 * 5e-6 + 4 * kN * kSolo1));
  }
  SUBCASE("monotone in n and p; double never dearer than single") {
    const Machine m{kG};
    for (ModelFn f : {binary_tree_allreduce, double_binary_tree_allreduce}) {
      double prev_p = 0;
      for (int p = 2; p <= 1024; p *= 2) {
        const double t = f(uniform({p}), kN, m).seconds();
        CHECK(t > prev_p);
        prev_p = t;
      }
    }
    for (double n = 1; n <= 1e9; n *= 10) {
      CHECK(double_binary_tree_allreduce(two_levels(48), n, m).seconds() <
            binary_tree_allreduce(two_levels(48), n, m).seconds());
    }
  }
}

TEST_CASE("cost model: host-transfer is two copies plus the host allreduce") {
  CHECK(name(Algorithm::host_transfer) == "host-transfer");
  // Defaults: 10 µs and 12 GB/s; Machine{g} keeps them.
  CHECK(Machine{kG}.copy_alpha == approx(10e-6));
  CHECK(Machine{kG}.copy_beta == approx(1.0 / 12e9));
  const Machine m{kG, 5e-6, 1e-10};
  const double copy_a = 5e-6, copy_b = 1e-10;
  SUBCASE("p = 8 by hand: rd for small n, Rabenseifner for large") {
    // rd: 3(α + nβ + nγ); Rabenseifner: 6α + 1.75nβ + 0.875nγ.
    const double small = 1e3, large = 1e6;
    const Breakdown s = host_transfer_allreduce(uniform({8}), small, m);
    CHECK(s.algo == Algorithm::host_transfer);
    CHECK(s.seconds() == approx(2 * (copy_a + small * copy_b) +
                                3 * (kA + small * kB + small * kG)));
    const Breakdown l = host_transfer_allreduce(uniform({8}), large, m);
    CHECK(l.seconds() == approx(2 * (copy_a + large * copy_b) + 6 * kA + 1.75 * large * kB +
                                0.875 * large * kG));
    REQUIRE(l.stages.size() == 2 + 6);
    CHECK(l.stages.front().what == "d2h copy");
    CHECK(l.stages.back().what == "h2d copy");
    CHECK(l.stages[1].what == "host reduce-scatter");
    CHECK(s.stages[1].what == "host exchange");
  }
  SUBCASE("equals copies + min(rd, Rabenseifner) on a two-level machine") {
    const Hierarchy h = two_levels(48);
    for (double n = 1; n <= double(1 << 30); n *= 4) {
      CAPTURE(n);
      const double host = std::min(recursive_doubling_allreduce(h, n, m).seconds(),
                                   rabenseifner_allreduce(h, n, m).seconds());
      const Breakdown b = host_transfer_allreduce(h, n, m);
      CHECK(b.seconds() == approx(2 * (copy_a + n * copy_b) + host));
      CHECK(b.seconds() == approx(sum_stages(b)));
    }
  }
  SUBCASE("bad copy parameters are rejected") {
    CHECK(std::isinf(host_transfer_allreduce(uniform({8}), kN, Machine{kG, -1, 0}).seconds()));
    CHECK(std::isinf(host_transfer_allreduce(uniform({8}), kN, Machine{kG, 0, NAN}).seconds()));
  }
}

TEST_CASE("cost model: crossover sizes") {
  const Machine m0{0};
  SUBCASE("double tree vs ring, p = 8, γ = 0: (p-1-lg p)·p·α/β = 32 α/β") {
    // ring 14α + 1.75nβ, double tree 6α + 2nβ: equal at n = 8α/(0.25β) = 32000 bytes.
    const auto x = crossover(Algorithm::double_binary_tree, Algorithm::ring, uniform({8}), m0);
    REQUIRE(x);
    CHECK(*x == doctest::Approx(32 * kA / kB).epsilon(1e-6));
    CHECK(cheaper(evaluate(Algorithm::double_binary_tree, uniform({8}), *x * 0.999, m0).seconds(),
                  evaluate(Algorithm::ring, uniform({8}), *x * 0.999, m0).seconds()));
    CHECK_FALSE(cheaper(evaluate(Algorithm::double_binary_tree, uniform({8}), *x * 1.001, m0).seconds(),
                        evaluate(Algorithm::ring, uniform({8}), *x * 1.001, m0).seconds()));
    // The ModelFn form agrees.
    const auto y = crossover(double_binary_tree_allreduce, ring_allreduce, uniform({8}), m0);
    REQUIRE(y);
    CHECK(*y == doctest::Approx(*x).epsilon(1e-12));
  }
  SUBCASE("rd vs Rabenseifner, p = 8, γ = 0: 3α + 3nβ = 6α + 1.75nβ at n = 2.4 α/β") {
    const auto x = crossover(Algorithm::recursive_doubling, Algorithm::rabenseifner,
                             uniform({8}), m0);
    REQUIRE(x);
    CHECK(*x == doctest::Approx(2.4 * kA / kB).epsilon(1e-6));
  }
  SUBCASE("no crossover in range, or bad input") {
    // The ring is not cheaper than the double tree at 1 byte.
    CHECK_FALSE(crossover(Algorithm::ring, Algorithm::double_binary_tree, uniform({8}), m0));
    // Still cheaper at hi.
    CHECK_FALSE(crossover(Algorithm::double_binary_tree, Algorithm::ring, uniform({8}), m0, 1,
                          1e4));
    CHECK_FALSE(crossover(Algorithm::double_binary_tree, Algorithm::ring, uniform({8}), m0, 0,
                          1e9));
    CHECK_FALSE(crossover(Algorithm::double_binary_tree, Algorithm::ring, uniform({8}), m0, 1e9,
                          1));
    CHECK_FALSE(crossover(Algorithm::double_binary_tree, Algorithm::ring, Hierarchy{}, m0));
    CHECK_FALSE(crossover(nullptr, ring_allreduce, uniform({8}), m0));
  }
}

TEST_CASE("cost model: NV-Group closed forms") {
  CHECK(name(Algorithm::nvgroup) == "nvgroup");
  const Machine m{kG};
  SUBCASE("one group of 4: 2α + 1.5nβ + 0.75nγ (ring: 6α)") {
    const Breakdown b = nvgroup_allreduce(uniform({4}), kN, m);
    CHECK(b.error.empty());
    CHECK(b.algo == Algorithm::nvgroup);
    CHECK(b.total.latency == approx(2 * kA));
    CHECK(b.total.bandwidth == approx(1.5 * kN * kB));
    CHECK(b.total.reduction == approx(0.75 * kN * kG));
    REQUIRE(b.stages.size() == 2);
    CHECK(b.stages[0].what == "load-reduce");
    CHECK(b.stages[1].what == "store");
    CHECK(b.stages[1].cost.reduction == 0);
    // One resource: chunking only adds start-ups, so the best count is 1.
    NVGroupOptions four;
    four.chunks = 4;
    CHECK(nvgroup_allreduce(uniform({4}), kN, m, four).seconds() ==
          approx(8 * kA + 1.5 * kN * kB + 0.75 * kN * kG));
  }
  SUBCASE("all links at once: the a2a β") {
    Hierarchy h = uniform({4});
    h.links[0].beta_a2a = kB / 3;  // three peers, a link to each
    CHECK(h.links[0].a2a() == approx(kB / 3));
    CHECK(LinkLevel{1, 2, 0, 0}.a2a() == 2);
    const Breakdown b = nvgroup_allreduce(h, kN, m);
    CHECK(b.total.bandwidth == approx(0.5 * kN * kB));
    // The ring and the other models ignore it.
    CHECK(ring_allreduce(h, kN, m).seconds() == approx(ring_allreduce(uniform({4}), kN, m).seconds()));
  }
  SUBCASE("4x48, one chunk: load-reduce + ring of the slices at the shared β + store") {
    const Hierarchy h = two_levels(48);
    const double a0 = 1e-6, b0 = 1e-11, a1 = 5e-6, b1 = 4e-10;  // shared β on level 1
    NVGroupOptions one;
    one.chunks = 1;
    const Breakdown b = nvgroup_allreduce(h, kN, m, one);
    const double rs = a0 + 0.75 * kN * b0 + 0.75 * kN * kG;
    const double ring = 2 * 47 * a1 + 2.0 * 47 / 48 * (kN / 4) * b1 + 47.0 / 48 * (kN / 4) * kG;
    const double st = a0 + 0.75 * kN * b0;
    CHECK(b.seconds() == approx(rs + ring + st));
    CHECK(b.seconds() == approx(sum_stages(b)));
    REQUIRE(b.stages.size() == 4);
    CHECK(b.stages[1].what == "reduce-scatter");
    CHECK(b.stages[1].level == 1);
    CHECK(b.stages[1].group == 48);
    CHECK(b.stages[1].bytes == approx(kN / 4));
    // The same bytes as BlueConnect's stages, fewer start-ups on level 0 (2 instead of
    // 2 lg 4 = 4).
    const Breakdown bc = blueconnect_allreduce(h, kN, m);
    CHECK(bc.seconds() - b.seconds() == approx(2 * a0));
  }
  SUBCASE("4x48, four chunks: the ring is the bottleneck") {
    const Hierarchy h = two_levels(48);
    const double a0 = 1e-6, b0 = 1e-11, a1 = 5e-6, b1 = 4e-10;
    NVGroupOptions four;
    four.chunks = 4;
    const double c = kN / 4;
    const double rs = a0 + 0.75 * c * b0 + 0.75 * c * kG;
    const double ring = 2 * 47 * a1 + 2.0 * 47 / 48 * (c / 4) * b1 + 47.0 / 48 * (c / 4) * kG;
    const double st = a0 + 0.75 * c * b0;
    REQUIRE(ring > rs + st);
    const Breakdown b = nvgroup_allreduce(h, kN, m, four);
    CHECK(b.seconds() == approx(rs + ring + st + 3 * ring));
    CHECK(b.seconds() == approx(sum_stages(b)));
    REQUIRE(b.stages.size() == 5);
    CHECK(b.stages[4].what == "pipeline");
    CHECK(b.stages[4].level == 1);
    CHECK(b.stages[4].cost.latency == approx(3 * 2 * 47 * a1));
  }
  SUBCASE("NVLink-bound chunks: the bottleneck is load-reduce + store") {
    // Level 0 slow, level 1 fast: 2x2 with α 0, β0 = 1e-9, β1 = 1e-12.
    Hierarchy h;
    h.factors = {2, 2};
    h.links = {LinkLevel{0, 1e-9, 0, 0}, LinkLevel{0, 1e-12, 0, 0}};
    NVGroupOptions two;
    two.chunks = 2;
    const double c = kN / 2;
    const double nv = 2 * 0.5 * c * 1e-9;           // load-reduce + store, γ = 0
    const double ring = 2 * 0.5 * (c / 2) * 1e-12;  // ring of 2 groups on c/2
    const Breakdown b = nvgroup_allreduce(h, kN, Machine{0}, two);
    CHECK(b.seconds() == approx(nv + ring + nv));
    CHECK(b.stages.back().level == 0);
  }
  SUBCASE("best chunk count: the cheapest power of two, and it helps for big vectors") {
    const Hierarchy h = two_levels(48);
    const double n = double(1 << 30);
    const Breakdown best_b = nvgroup_allreduce(h, n, m);
    double lowest = INFINITY;
    for (int c = 1; c <= NVGroupOptions::kMaxChunks; c *= 2) {
      NVGroupOptions o;
      o.chunks = c;
      lowest = std::min(lowest, nvgroup_allreduce(h, n, m, o).seconds());
    }
    CHECK(best_b.seconds() == approx(lowest));
    NVGroupOptions one;
    one.chunks = 1;
    CHECK(best_b.seconds() < nvgroup_allreduce(h, n, m, one).seconds());
    CHECK(best_b.stages.back().what == "pipeline");
    // Small vectors: one chunk (each chunk pays the ring's start-ups).
    CHECK(nvgroup_allreduce(h, 64, m).stages.back().what == "store");
  }
  SUBCASE("one GPU per group: the ring across groups alone") {
    CHECK(nvgroup_allreduce(uniform({1, 8}), kN, m).seconds() ==
          approx(14 * kA + 1.75 * kN * kB + 0.875 * kN * kG));
    CHECK(nvgroup_allreduce(uniform({1, 8}), kN, m).seconds() ==
          approx(ring_allreduce(uniform({1, 8}), kN, m).seconds()));
  }
  SUBCASE("bad chunk counts are rejected") {
    NVGroupOptions o;
    o.chunks = -1;
    CHECK(std::isinf(nvgroup_allreduce(uniform({4, 2}), kN, m, o).seconds()));
    o.chunks = NVGroupOptions::kMaxChunks + 1;
    CHECK_FALSE(nvgroup_allreduce(uniform({4, 2}), kN, m, o).error.empty());
  }
}

TEST_CASE("cost model: crossover of two time functions") {
  // rd vs Rabenseifner on p = 8 as above (2.4 α/β), through crossover_times.
  const Hierarchy h = uniform({8});
  const Machine m0{0};
  const auto x = crossover_times(
      [&](double n) { return recursive_doubling_allreduce(h, n, m0).seconds(); },
      [&](double n) { return rabenseifner_allreduce(h, n, m0).seconds(); });
  REQUIRE(x);
  CHECK(*x == doctest::Approx(2.4 * kA / kB).epsilon(1e-6));
  // Different hierarchies per side: rd on links twice as slow crosses at half the size.
  const Hierarchy slow = uniform({8}, kA, 2 * kB);
  const auto y = crossover_times(
      [&](double n) { return recursive_doubling_allreduce(slow, n, m0).seconds(); },
      [&](double n) { return rabenseifner_allreduce(h, n, m0).seconds(); });
  REQUIRE(y);
  // 3α + 6nβ = 6α + 1.75nβ at n = 3α / 4.25β.
  CHECK(*y == doctest::Approx(3 / 4.25 * kA / kB).epsilon(1e-6));
  CHECK_FALSE(crossover_times(nullptr, [](double) { return 1.0; }));
  CHECK_FALSE(crossover_times([](double) { return NAN; }, [](double) { return 1.0; }));
  // a rejected size inside the range (not at its ends; the bisection passes 1024) also
  // gives no crossover
  CHECK_FALSE(crossover_times([](double n) { return n > 1000.5 && n < 1100 ? NAN : n; },
                              [](double) { return 1000.0; }));
  CHECK(crossover_times([](double n) { return n; }, [](double) { return 1000.0; }));
}

TEST_CASE("human_bytes: binary units, decimals only when not whole") {
  using streamcoll::model::human_bytes;
  CHECK(human_bytes(4) == "4 B");
  CHECK(human_bytes(1023) == "1023 B");
  CHECK(human_bytes(1024) == "1 KiB");
  CHECK(human_bytes(1536, 2) == "1.50 KiB");
  CHECK(human_bytes(102228128) == "97.5 MiB");
  CHECK(human_bytes(102228128, 2) == "97.49 MiB");
  CHECK(human_bytes(1ull << 30) == "1 GiB");
  CHECK(human_bytes(1ull << 50) == "1024 TiB");
}

TEST_CASE("cost model: ccube, the overlapped pipelined tree") {
  const Machine m{kG};
  const double n = 1 << 20;
  // One node of 8: depth lg 8 = 3, two children per parent, c + 2·3 - 1 rounds.
  for (int c : {1, 4, 64}) {
    const Breakdown b = ccube_allreduce(uniform({8}), n, m, CcubeOptions{c});
    REQUIRE(b.error.empty());
    const double chunk = n / c;
    CHECK(b.seconds() == doctest::Approx((c + 5) * (kA + 3 * chunk * kB + 2 * chunk * kG)));
  }
  // 4 nodes of 4, one link level each (the outer slower): depth 2 + 2, a leader reduces
  // 2 + 2 children, the rounds as long as the outer level's.
  Hierarchy h = uniform({4, 4});
  h.links[1] = LinkLevel{10 * kA, 10 * kB};
  const Breakdown b = ccube_allreduce(h, n, m, CcubeOptions{16});
  const double chunk = n / 16;
  CHECK(b.seconds() == doctest::Approx((16 + 7) * (10 * kA + 3 * chunk * 10 * kB + 4 * chunk * kG)));
  // The best chunk count is no worse than any fixed one, and more chunks pay off with size.
  int best_small = 0, best_large = 0;
  for (double bytes : {4096.0, double(1 << 26)}) {
    const Breakdown best = ccube_allreduce(h, bytes, m);
    for (int c = 1; c <= CcubeOptions::kMaxChunks; c *= 2)
      CHECK(best.seconds() <= ccube_allreduce(h, bytes, m, CcubeOptions{c}).seconds() * (1 + 1e-12));
    const std::string how = best.stages.at(0).how;
    (bytes < 1e5 ? best_small : best_large) = std::stoi(how);
  }
  CHECK(best_small < best_large);
  CHECK_FALSE(ccube_allreduce(h, n, m, CcubeOptions{-1}).error.empty());
  CHECK(ccube_allreduce(uniform({1}), n, m).seconds() == 0);
  CHECK(name(Algorithm::ccube) == "ccube");
}
