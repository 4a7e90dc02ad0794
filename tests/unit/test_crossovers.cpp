// config/crossovers.hpp: where the cheaper of two routes changes.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "config/crossovers.hpp"

using namespace streamcoll::config;

namespace {

// Sizes from 4 B to 16 MiB, `steps` points per doubling.
std::vector<double> grid(int steps) {
  std::vector<double> g;
  for (double x = 2; x <= 24 + 1e-9; x += 1.0 / steps) g.push_back(std::exp2(x));
  return g;
}

std::vector<double> linear(const std::vector<double>& n, double alpha, double beta) {
  std::vector<double> t;
  for (double b : n) t.push_back(alpha + b * beta);
  return t;
}

}  // namespace

TEST_CASE("two alpha-beta lines cross where alpha + n beta are equal") {
  // a: small alpha, large beta (latency-bound winner); b: the reverse.
  const double aa = 10e-6, ba = 1e-9, ab = 100e-6, bb = 1e-10;
  const double exact = (ab - aa) / (ba - bb);  // 100000 B
  for (int steps : {1, 8}) {
    const auto n = grid(steps);
    const auto c = crossovers(n, linear(n, aa, ba), linear(n, ab, bb), 0);
    REQUIRE(c.size() == 1);
    CHECK(c[0].a_below);
    // Interpolation in log size between grid points: within one grid step.
    CHECK(std::fabs(std::log2(c[0].bytes / exact)) <= 1.0 / steps);
  }
  // Swapped arguments: the same size, the other direction.
  const auto n = grid(8);
  const auto c = crossovers(n, linear(n, ab, bb), linear(n, aa, ba), 0);
  REQUIRE(c.size() == 1);
  CHECK_FALSE(c[0].a_below);
}

TEST_CASE("no crossover when one route is cheaper everywhere, or they tie") {
  const auto n = grid(2);
  CHECK(crossovers(n, linear(n, 1e-6, 1e-10), linear(n, 2e-6, 2e-10), 0).empty());
  CHECK(crossovers(n, linear(n, 1e-6, 1e-10), linear(n, 1e-6, 1e-10), 0).empty());
}

TEST_CASE("noise within the tie does not count as crossings") {
  // a cheaper by 30 % at small sizes, alternating +-3 % in the middle, b cheaper by 30 % at
  // large sizes: one crossover, inside the tied middle.
  std::vector<double> n, a, b;
  for (int i = 0; i < 20; ++i) {
    n.push_back(std::exp2(2 + i));
    b.push_back(1.0);
    if (i < 6) a.push_back(0.7);
    else if (i < 14) a.push_back(i % 2 ? 1.03 : 0.97);
    else a.push_back(1.3);
  }
  const auto noisy = crossovers(n, a, b, 0);
  CHECK(noisy.size() > 1);  // without a tie, every alternation counts
  const auto c = crossovers(n, a, b, 0.05);
  REQUIRE(c.size() == 1);
  CHECK(c[0].a_below);
  CHECK(c[0].bytes > n[5]);
  CHECK(c[0].bytes < n[14]);
  // Where ln(a/b) reaches 0 on the line between sizes 5 (ln 0.7) and 14 (ln 1.3).
  const double f = std::log(0.7) / (std::log(0.7) - std::log(1.3));
  CHECK(std::log2(c[0].bytes) == doctest::Approx(std::log2(n[5]) + f * 9));
}

TEST_CASE("missing times are skipped") {
  const std::vector<double> n = {4, 8, 16, 32};
  const std::vector<double> a = {1, 0, NAN, 3};
  const std::vector<double> b = {2, 2, 2, 2};
  const auto c = crossovers(n, a, b, 0);
  REQUIRE(c.size() == 1);
  CHECK(c[0].a_below);
  CHECK(c[0].bytes > 4);
  CHECK(c[0].bytes < 32);
}

TEST_CASE("matching pairs each measured crossover with the nearest predicted one") {
  const std::vector<Crossover> pred = {{1000, true}, {64000, false}, {500000, true}};
  const std::vector<Crossover> meas = {{1500, true}, {300000, true}};
  const auto m = match_crossovers(pred, meas);
  REQUIRE(m.size() == 3);
  CHECK(m[0].predicted == 1000);
  CHECK(m[0].measured == 1500);
  CHECK(m[0].ratio() == doctest::Approx(1000.0 / 1500));
  CHECK(m[1].predicted == 64000);  // a direction measured nowhere: alone
  CHECK(m[1].measured == 0);
  CHECK(m[1].ratio() == 0);
  CHECK(m[2].predicted == 500000);
  CHECK(m[2].measured == 300000);
  // A measured crossover with nothing of its direction predicted stays alone.
  const auto lone = match_crossovers({}, meas);
  REQUIRE(lone.size() == 2);
  CHECK(lone[0].predicted == 0);
  CHECK(lone[1].measured == 300000);
}
