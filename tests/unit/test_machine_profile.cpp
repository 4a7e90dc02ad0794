// Machine profiles (config/machine_profile.hpp): TOML load and write, the errors, the
// hierarchy a GPU count gets, the shipped profiles, and the fit of α, β, γ and the copy
// parameters to rows generated from the models themselves (with and without noise).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "config/cost_model.hpp"
#include "config/machine_profile.hpp"

using namespace streamcoll;
using namespace streamcoll::config;

namespace {

const char* const kProfile = R"(# a test machine
name = "test"
description = "four GPUs a node"
gpus_per_node = 4
gamma = 3.3e-12
host_gamma = 1e-10
copy_alpha = 8e-6
copy_bandwidth = 50
nccl_call_alpha = 3.6e-6

[[level]]
name = "nvlink"
alpha = 0.4e-6
bandwidth = 75.0
a2a_bandwidth = 150.0
host_alpha = 0.5e-6
host_bandwidth = 10

[[level]]
name = "ib"
alpha = 1e-6
bandwidth = 6.25
solo_bandwidth = 12.5
host_alpha = 1.5e-6
)";

MachineProfile load_ok(const std::string& text) {
  std::string err;
  auto p = load_profile(text, "test.toml", &err);
  INFO(err);
  REQUIRE(p);
  return *p;
}

std::string load_err(const std::string& text) {
  std::string err;
  auto p = load_profile(text, "test.toml", &err);
  CHECK_FALSE(p);
  return err;
}

bool has(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

/// Deterministic noise in [-amp, amp].
struct Noise {
  uint64_t state = 88172645463325252ull;
  double next(double amp) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return amp * (2.0 * double(state % 1000001) / 1000000.0 - 1.0);
  }
};

BenchRow row(const char* algo, const char* mem, int ranks, int nodes, int ppn, uint64_t bytes,
             double seconds) {
  BenchRow r;
  r.coll = "allreduce";
  r.dtype = "float";
  r.op = "sum";
  r.mem = mem;
  r.ranks = ranks;
  r.nodes = nodes;
  r.ppn = ppn;
  r.spec = std::string("ht:algo=") + algo;
  r.route = std::string("ht algo=") + algo;
  r.taken = "ht";
  r.bytes = bytes;
  r.count = bytes / 4;
  r.iters = 10;
  r.min_us = r.median_us = r.max_us = seconds * 1e6;
  r.valid = true;
  return r;
}

model::Algorithm algo_of(const char* a) {
  const std::string s = a;
  return s == "ring" ? model::Algorithm::ring
         : s == "rd" ? model::Algorithm::recursive_doubling
                     : model::Algorithm::rabenseifner;
}

/// Host rows of the three algorithms on one level of p ranks, from the models, each call
/// paying `call` seconds once on top.
void add_rows(std::vector<BenchRow>* rows, int p, bool one_per_node, double alpha, double beta,
              double gamma, double noise, Noise* rng, double call = 0) {
  model::Hierarchy h;
  h.factors = {p};
  h.links = {model::LinkLevel{alpha, beta, 0, 0}};
  model::Machine m;
  m.gamma = gamma;
  for (const char* a : {"ring", "rd", "rabenseifner"}) {
    for (uint64_t n = 8; n <= (uint64_t{1} << 26); n *= 4) {
      const double t = call + model::evaluate(algo_of(a), h, double(n), m).seconds();
      rows->push_back(row(a, "host", p, one_per_node ? p : 1, one_per_node ? 1 : p, n,
                          t * (1 + rng->next(noise))));
    }
  }
}

}  // namespace

TEST_CASE("machine profile: load") {
  const MachineProfile p = load_ok(kProfile);
  CHECK(p.name == "test");
  CHECK(p.description == "four GPUs a node");
  CHECK(p.gpus_per_node == 4);
  CHECK(p.gamma == 3.3e-12);
  REQUIRE(p.host_gamma);
  CHECK(*p.host_gamma == 1e-10);
  CHECK(p.copy_alpha == 8e-6);
  CHECK(p.copy_gbps == 50);  // an integer is accepted for a number
  CHECK(p.nccl_call_alpha == 3.6e-6);
  REQUIRE(p.levels.size() == 2);
  CHECK(p.levels[0].name == "nvlink");
  CHECK(p.levels[0].alpha == 0.4e-6);
  CHECK(p.levels[0].gbps == 75);
  CHECK(p.levels[0].a2a_gbps == 150);
  CHECK(p.levels[0].solo_gbps == 0);
  REQUIRE(p.levels[0].host_alpha);
  CHECK(*p.levels[0].host_alpha == 0.5e-6);
  CHECK(p.levels[0].host_gbps == 10);
  CHECK(p.levels[1].solo_gbps == 12.5);
  CHECK(p.levels[1].host_gbps == 0);

  // Defaults: no host figures, the copy defaults of model::Machine.
  const MachineProfile d = load_ok("gpus_per_node = 2\ngamma = 0\n[[level]]\nalpha = 1e-6\n"
                                   "bandwidth = 10\n");
  CHECK_FALSE(d.host_gamma);
  CHECK(d.copy_alpha == model::Machine{}.copy_alpha);
  CHECK(model::beta_from_gbps(d.copy_gbps) == doctest::Approx(model::Machine{}.copy_beta));
  CHECK(d.levels[0].name.empty());
  CHECK(d.nccl_call_alpha == 0);
}

TEST_CASE("machine profile: write reads back") {
  const MachineProfile p = load_ok(kProfile);
  const std::string text = write_profile(p, "written by the test\nsecond line");
  CHECK(text.rfind("# written by the test\n# second line\n", 0) == 0);
  const MachineProfile q = load_ok(text);
  CHECK(q.name == p.name);
  CHECK(q.description == p.description);
  CHECK(q.gpus_per_node == p.gpus_per_node);
  CHECK(q.gamma == p.gamma);
  CHECK(q.host_gamma == p.host_gamma);
  CHECK(q.copy_alpha == p.copy_alpha);
  CHECK(q.copy_gbps == p.copy_gbps);
  CHECK(q.nccl_call_alpha == p.nccl_call_alpha);
  REQUIRE(q.levels.size() == p.levels.size());
  for (size_t i = 0; i < p.levels.size(); ++i) {
    CAPTURE(i);
    CHECK(q.levels[i].name == p.levels[i].name);
    CHECK(q.levels[i].alpha == p.levels[i].alpha);
    CHECK(q.levels[i].gbps == p.levels[i].gbps);
    CHECK(q.levels[i].solo_gbps == p.levels[i].solo_gbps);
    CHECK(q.levels[i].a2a_gbps == p.levels[i].a2a_gbps);
    CHECK(q.levels[i].host_alpha == p.levels[i].host_alpha);
    CHECK(q.levels[i].host_gbps == p.levels[i].host_gbps);
    CHECK(q.levels[i].host_solo_gbps == p.levels[i].host_solo_gbps);
    CHECK(q.levels[i].size == p.levels[i].size);
  }
  // Awkward values survive: digits that need all 17 places, strings with quotes.
  MachineProfile r = p;
  r.gamma = 1.0 / 3e11;
  r.levels[1].alpha = 0.1 + 0.2;
  r.name = "a \"quoted\" name\\";
  r.levels.insert(r.levels.begin() + 1, LevelProfile{"socket", 2e-6, 30, 0, 0, 2, {}, 0, 0});
  const MachineProfile s = load_ok(write_profile(r));
  CHECK(s.gamma == r.gamma);
  CHECK(s.levels[2].alpha == 0.1 + 0.2);
  CHECK(s.levels[1].size == 2);
  CHECK(s.name == r.name);
}

TEST_CASE("machine profile: errors name the key and the line") {
  std::string e = load_err("gamma = 1e-12\n[[level]]\nalpha = 1e-6\nbandwidth = 10\n");
  CHECK(has(e, "test.toml"));
  CHECK(has(e, "missing key 'gpus_per_node'"));
  e = load_err("gpus_per_node = 4\ngamma = 1e-12\n[[level]]\nalpha = 1e-6\nbandwidth = \"fast\"\n");
  CHECK(has(e, "test.toml:5"));
  CHECK(has(e, "level[0].bandwidth"));
  e = load_err("gpus_per_node = 4\ngamma = 1e-12\n[[level]]\nalpha = 1e-6\nbandwidth = -3\n");
  CHECK(has(e, ":5"));
  CHECK(has(e, "must be > 0"));
  e = load_err("gpus_per_node = 4\ngamma = 1e-12\nbogus = 1\n[[level]]\nalpha = 1\nbandwidth = 1\n");
  CHECK(has(e, "test.toml:3"));
  CHECK(has(e, "unknown key 'bogus'"));
  e = load_err("gpus_per_node = 4\ngamma = 1e-12\n[[level]]\nalpha = 1\nbandwith = 1\n");
  CHECK(has(e, "level[0]"));
  e = load_err("gpus_per_node = 4\ngamma = 1e-12\n[[level]\nalpha = 1\n");
  CHECK(has(e, "test.toml:3"));  // a TOML syntax error, with its line
  e = load_err("gpus_per_node = 0\ngamma = 1e-12\n[[level]]\nalpha = 1\nbandwidth = 1\n");
  CHECK(has(e, "gpus_per_node"));
  e = load_err("gpus_per_node = 2.5\ngamma = 1e-12\n[[level]]\nalpha = 1\nbandwidth = 1\n");
  CHECK(has(e, "must be an integer"));
  e = load_err("gpus_per_node = 4\ngamma = 1e-12\n");
  CHECK(has(e, "no [[level]]"));
  e = load_err("gpus_per_node = 4\ngamma = 1e-12\nlevel = 3\n");
  CHECK(has(e, "array of tables"));
  e = load_err("gpus_per_node = 4\ngamma = -1\n[[level]]\nalpha = 1\nbandwidth = 1\n");
  CHECK(has(e, "'gamma' must be >= 0"));
  e = load_err("gpus_per_node = 4\ngamma = inf\n[[level]]\nalpha = 1\nbandwidth = 1\n");
  CHECK(has(e, "finite"));
  e = load_err("gpus_per_node = 4\ngamma = 0\n[[level]]\nalpha = 1\nbandwidth = 1\n"
               "host_call_alpha = -1e-6\n");
  CHECK(has(e, "level[0].host_call_alpha"));
  CHECK(has(e, "must be >= 0"));
  // size: required on a middle level, refused elsewhere.
  const std::string three = "gpus_per_node = 4\ngamma = 0\n[[level]]\nalpha = 1\nbandwidth = 1\n"
                            "[[level]]\nalpha = 1\nbandwidth = 1\n[[level]]\nalpha = 1\n"
                            "bandwidth = 1\n";
  e = load_err(three);
  CHECK(has(e, "missing key 'level[1].size'"));
  e = load_err("gpus_per_node = 4\ngamma = 0\n[[level]]\nalpha = 1\nbandwidth = 1\nsize = 4\n");
  CHECK(has(e, "level[0].size"));
  std::string err;
  CHECK_FALSE(load_profile_file("/nonexistent/profile.toml", &err));
  CHECK(has(err, "cannot open"));
}

TEST_CASE("machine profile: hierarchy for a GPU count") {
  const MachineProfile p = load_ok(kProfile);
  std::string err;
  auto h = hierarchy(p, 2, ProfilePath::device, &err);
  REQUIRE(h);
  CHECK(h->factors == std::vector<int>{2});
  CHECK(h->links[0].alpha == 0.4e-6);
  CHECK(h->links[0].beta == doctest::Approx(1 / 75e9));
  CHECK(h->links[0].a2a() == doctest::Approx(1 / 150e9));
  h = hierarchy(p, 4, ProfilePath::device, &err);
  REQUIRE(h);
  CHECK(h->factors == std::vector<int>{4});
  h = hierarchy(p, 64, ProfilePath::device, &err);
  REQUIRE(h);
  CHECK(h->factors == std::vector<int>{4, 16});
  CHECK(h->links[1].beta == doctest::Approx(1 / 6.25e9));
  CHECK(h->links[1].solo() == doctest::Approx(1 / 12.5e9));
  CHECK(nodes_for(p, 64) == 16);
  CHECK(nodes_for(p, 2) == 1);
  // The host path: host figures where given, the device ones elsewhere.
  h = hierarchy(p, 64, ProfilePath::host, &err);
  REQUIRE(h);
  CHECK(h->links[0].alpha == 0.5e-6);
  CHECK(h->links[0].beta == doctest::Approx(1 / 10e9));
  CHECK(h->links[0].beta_a2a == 0);
  CHECK(h->links[1].alpha == 1.5e-6);
  CHECK(h->links[1].beta == doctest::Approx(1 / 6.25e9));
  CHECK(h->links[1].solo() == doctest::Approx(1 / 12.5e9));
  CHECK(machine(p, ProfilePath::host).gamma == 1e-10);
  CHECK(machine(p, ProfilePath::device).gamma == 3.3e-12);
  CHECK(machine(p, ProfilePath::device).copy_alpha == 8e-6);
  CHECK(machine(p, ProfilePath::device).copy_beta == doctest::Approx(1 / 50e9));
  // Not a whole number of nodes; nothing; one level only.
  CHECK_FALSE(hierarchy(p, 6, ProfilePath::device, &err));
  CHECK(has(err, "whole number of nodes"));
  CHECK_FALSE(hierarchy(p, 0, ProfilePath::device, &err));
  MachineProfile one = p;
  one.levels.pop_back();
  CHECK(hierarchy(one, 4, ProfilePath::device, &err));
  CHECK_FALSE(hierarchy(one, 8, ProfilePath::device, &err));
  CHECK(has(err, "at most 4 GPUs"));
  // Three levels: 18 nodes per switch.
  MachineProfile three = p;
  three.levels.insert(three.levels.begin() + 1, LevelProfile{"switch", 1e-6, 12.5, 0, 0, 18, {}, 0, 0});
  h = hierarchy(three, 4 * 18, ProfilePath::device, &err);
  REQUIRE(h);
  CHECK(h->factors == std::vector<int>{4, 18});
  h = hierarchy(three, 4 * 36, ProfilePath::device, &err);
  REQUIRE(h);
  CHECK(h->factors == std::vector<int>{4, 18, 2});
  CHECK(h->links[2].solo() == doctest::Approx(1 / 12.5e9));
  CHECK_FALSE(hierarchy(three, 4 * 20, ProfilePath::device, &err));
  CHECK(has(err, "level-1 groups of 18"));
}

TEST_CASE("machine profile: the shipped profiles load") {
  for (const char* f : {"sierra.toml", "minsky192.toml"}) {
    CAPTURE(f);
    std::string err;
    auto p = load_profile_file(std::string(STREAMCOLL_SOURCE_DIR) + "/bench/profiles/" + f, &err);
    INFO(err);
    REQUIRE(p);
    CHECK(p->levels.size() >= 2);
    auto h = hierarchy(*p, p->gpus_per_node * 16, ProfilePath::device, &err);
    CHECK(h);
  }
}

TEST_CASE("machine profile: non-negative least squares") {
  // y = 2·x0 + 3·x1 exactly.
  std::vector<std::vector<double>> x = {{1, 0, 1}, {0, 1, 2}, {1, 1, 0}, {2, 1, 1}};
  std::vector<double> y;
  for (const auto& r : x) y.push_back(2 * r[0] + 3 * r[1]);
  double ssr = -1;
  std::vector<double> th = nonneg_least_squares(x, y, 7u, &ssr);
  CHECK(th[0] == doctest::Approx(2));
  CHECK(th[1] == doctest::Approx(3));
  CHECK(th[2] == doctest::Approx(0).epsilon(1e-9));
  CHECK(ssr == doctest::Approx(0).epsilon(1e-12));
  // A negative true coefficient: clamped at 0, the others refitted.
  y.clear();
  for (const auto& r : x) y.push_back(2 * r[0] + 3 * r[1] - 1 * r[2]);
  th = nonneg_least_squares(x, y, 7u, &ssr);
  CHECK(th[2] == 0);
  CHECK(th[0] >= 0);
  CHECK(th[1] >= 0);
  CHECK(ssr > 0);
  // Fixed parameters stay 0.
  th = nonneg_least_squares(x, y, 1u, &ssr);
  CHECK(th[1] == 0);
  CHECK(th[2] == 0);
  // Collinear columns: β is preferred to γ.
  const std::vector<std::vector<double>> c = {{1, 2, 1}, {1, 4, 2}, {1, 8, 4}};
  const std::vector<double> yc = {1 + 2, 1 + 4, 1 + 8};
  th = nonneg_least_squares(c, yc, 7u, &ssr);
  CHECK(th[0] == doctest::Approx(1));
  CHECK(th[1] == doctest::Approx(1));
  CHECK(th[2] == 0);
  // Four unknowns: y = 0.5·x0 + 2·x2 + 4·x3; with x3 fixed at 0 the others absorb it.
  const std::vector<std::vector<double>> x4 = {
      {1, 0, 1, 1}, {0, 1, 2, 1}, {1, 1, 0, 1}, {2, 1, 1, 1}, {3, 0, 1, 1}, {1, 2, 5, 1}};
  std::vector<double> y4;
  for (const auto& r : x4) y4.push_back(0.5 * r[0] + 2 * r[2] + 4 * r[3]);
  th = nonneg_least_squares(x4, y4, 15u, &ssr);
  REQUIRE(th.size() == 4);
  CHECK(th[0] == doctest::Approx(0.5));
  CHECK(th[1] == doctest::Approx(0).epsilon(1e-9));
  CHECK(th[2] == doctest::Approx(2));
  CHECK(th[3] == doctest::Approx(4));
  CHECK(ssr == doctest::Approx(0).epsilon(1e-12));
  th = nonneg_least_squares(x4, y4, 7u, &ssr);
  CHECK(th[3] == 0);
  CHECK(ssr > 0.1);
}

TEST_CASE("machine profile: the fit recovers the model's parameters") {
  const double a0 = 2e-6, b0 = 1.0 / 8e9, g = 2e-10;   // one node: 8 GB/s, γ 0.2 ns/B
  const double a1 = 5e-6, b1 = 1.0 / 3e9;               // across nodes: 3 GB/s
  const double ca = 9e-6, cb = 1.0 / 20e9;              // copies: 20 GB/s
  SUBCASE("exact rows: exact parameters, no base") {
    std::vector<BenchRow> rows;
    Noise rng;
    add_rows(&rows, 4, false, a0, b0, g, 0, &rng);
    add_rows(&rows, 8, false, a0, b0, g, 0, &rng);
    add_rows(&rows, 8, true, a1, b1, g, 0, &rng);
    const FitResult r = fit_profile(rows, nullptr);
    REQUIRE(r.profile);
    CHECK(r.level0.fitted);
    CHECK(r.level0.rows == 2 * 3 * 12);  // 2 rank counts, 3 algorithms, 8 B..64 MiB
    CHECK(r.level0.alpha == doctest::Approx(a0).epsilon(1e-6));
    CHECK(r.level0.beta == doctest::Approx(b0).epsilon(1e-6));
    CHECK(r.level0.gamma == doctest::Approx(g).epsilon(1e-6));
    CHECK(r.level0.max_rel < 1e-9);
    CHECK(r.level0.algos == "ring,rd,rabenseifner");
    CHECK(r.level1.alpha == doctest::Approx(a1).epsilon(1e-6));
    CHECK(r.level1.beta == doctest::Approx(b1).epsilon(1e-6));
    CHECK_FALSE(r.level1.gamma_free);
    const MachineProfile& p = *r.profile;
    CHECK(p.gpus_per_node == 8);  // the largest ppn
    REQUIRE(p.levels.size() == 2);
    CHECK(p.levels[0].alpha == doctest::Approx(a0).epsilon(1e-6));
    CHECK(p.levels[0].gbps == doctest::Approx(8).epsilon(1e-6));
    CHECK(p.levels[1].gbps == doctest::Approx(3).epsilon(1e-6));
    CHECK(p.levels[1].solo_gbps == doctest::Approx(3).epsilon(1e-6));
    CHECK(p.gamma == doctest::Approx(g).epsilon(1e-6));
    CHECK_FALSE(r.copy.fitted);
    CHECK(check_profile(p).empty());
    // The written profile loads back.
    std::string err;
    CHECK(load_profile(write_profile(p), "fit", &err));
  }
  SUBCASE("3 % noise: within a few per cent; copies from device rows; into a base") {
    std::vector<BenchRow> rows;
    Noise rng;
    add_rows(&rows, 4, false, a0, b0, g, 0.03, &rng);
    add_rows(&rows, 8, true, a1, b1, g, 0.03, &rng);
    // Device rows: the host time plus two copies.
    const size_t host_rows = rows.size();
    for (size_t i = 0; i < host_rows; ++i) {
      BenchRow d = rows[i];
      d.mem = "device";
      const double t = d.median_us * 1e-6 + 2 * (ca + double(d.bytes) * cb);
      d.median_us = t * 1e6 * (1 + rng.next(0.01));
      rows.push_back(d);
    }
    // Rows the fit must skip.
    BenchRow other = rows[0];
    other.spec = "nccl";
    rows.push_back(other);
    other = rows[0];
    other.taken = "pmpi";
    rows.push_back(other);
    other = rows[0];
    other.valid = false;
    rows.push_back(other);
    other = rows[0];
    other.coll = "bcast";
    rows.push_back(other);

    const MachineProfile base = load_ok(kProfile);
    const FitResult r = fit_profile(rows, &base);
    REQUIRE(r.profile);
    CHECK(r.level0.alpha == doctest::Approx(a0).epsilon(0.15));
    CHECK(r.level0.beta == doctest::Approx(b0).epsilon(0.05));
    CHECK(r.level0.gamma == doctest::Approx(g).epsilon(0.10));
    CHECK(r.level0.median_rel < 0.03);
    CHECK(r.level0.max_rel < 0.06);
    CHECK(r.level1.alpha == doctest::Approx(a1).epsilon(0.15));
    CHECK(r.level1.beta == doctest::Approx(b1).epsilon(0.05));
    CHECK(r.copy.fitted);
    CHECK(r.copy.alpha == doctest::Approx(ca).epsilon(0.25));
    CHECK(r.copy.beta == doctest::Approx(cb).epsilon(0.05));
    // Into the base: host fields; the device figures stay.
    const MachineProfile& p = *r.profile;
    CHECK(p.name == "test");
    CHECK(p.levels[0].alpha == 0.4e-6);
    CHECK(p.levels[0].gbps == 75);
    REQUIRE(p.levels[0].host_alpha);
    CHECK(*p.levels[0].host_alpha == doctest::Approx(a0).epsilon(0.15));
    CHECK(p.levels[0].host_gbps == doctest::Approx(8).epsilon(0.05));
    CHECK(p.levels[1].host_solo_gbps == doctest::Approx(3).epsilon(0.05));
    REQUIRE(p.host_gamma);
    CHECK(*p.host_gamma == doctest::Approx(g).epsilon(0.10));
    CHECK(p.gamma == 3.3e-12);
    CHECK(p.copy_gbps == doctest::Approx(20).epsilon(0.05));
    bool skipped_note = false;
    for (const std::string& n : r.notes) skipped_note = skipped_note || has(n, "rows skipped");
    CHECK(skipped_note);
  }
  SUBCASE("a per-call cost: recovered apart from the per-step α, and written") {
    const double c0 = 3e-6, c1 = 40e-6;  // one node; across nodes (route ht's hand-off)
    std::vector<BenchRow> rows;
    Noise rng;
    add_rows(&rows, 4, false, a0, b0, g, 0, &rng, c0);
    add_rows(&rows, 8, true, a1, b1, g, 0, &rng, c1);
    const FitResult r = fit_profile(rows, nullptr);
    REQUIRE(r.profile);
    CHECK(r.level0.call_alpha == doctest::Approx(c0).epsilon(1e-6));
    CHECK(r.level0.alpha == doctest::Approx(a0).epsilon(1e-6));
    CHECK(r.level0.gamma == doctest::Approx(g).epsilon(1e-6));
    CHECK(r.level1.call_alpha == doctest::Approx(c1).epsilon(1e-6));
    CHECK(r.level1.alpha == doctest::Approx(a1).epsilon(1e-6));
    CHECK(r.level1.beta == doctest::Approx(b1).epsilon(1e-6));
    CHECK(r.level1.max_rel < 1e-9);
    const MachineProfile& p = *r.profile;
    REQUIRE(p.levels.size() == 2);
    CHECK(p.levels[0].host_call_alpha == doctest::Approx(c0).epsilon(1e-6));
    CHECK(p.levels[1].host_call_alpha == doctest::Approx(c1).epsilon(1e-6));
    std::string err;
    const auto back = load_profile(write_profile(p), "fit", &err);
    REQUIRE(back);
    CHECK(back->levels[1].host_call_alpha == p.levels[1].host_call_alpha);
    // Without a per-call cost in the rows it comes out 0 (the exact rows above).
    std::vector<BenchRow> plain;
    add_rows(&plain, 8, true, a1, b1, g, 0, &rng);
    CHECK(fit_profile(plain, nullptr).level1.call_alpha == doctest::Approx(0).epsilon(1e-12));
  }
  SUBCASE("one algorithm only: β and γ are proportional, γ comes out 0") {
    std::vector<BenchRow> rows;
    Noise rng;
    add_rows(&rows, 4, false, a0, b0, 0, 0, &rng);
    std::vector<BenchRow> ring;
    for (const BenchRow& r : rows) {
      if (r.spec == "ht:algo=ring") ring.push_back(r);
    }
    const FitResult r = fit_profile(ring, nullptr);
    REQUIRE(r.profile);
    CHECK(r.level0.beta == doctest::Approx(b0).epsilon(1e-6));
    CHECK(r.level0.gamma == 0);
    CHECK_FALSE(r.level1.fitted);
    CHECK(r.profile->levels.size() == 1);
  }
  SUBCASE("nothing to fit") {
    std::vector<BenchRow> rows = {row("rd", "device", 4, 1, 4, 1024, 1e-5)};
    const FitResult r = fit_profile(rows, nullptr);
    CHECK_FALSE(r.profile);
    CHECK_FALSE(r.notes.empty());
  }
}
