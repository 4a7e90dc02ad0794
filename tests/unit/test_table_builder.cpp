// The table builder (config/table_builder.hpp) and sc_bench's CSV (config/bench_csv.hpp).
// Every built table is written, parsed back with the library's own parser and matched
// against the points it was built from: the route a call gets must be the winner of its
// point, computed here separately from the measurements.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "config/bench_csv.hpp"
#include "config/table_builder.hpp"
#include "config/tuning_table.hpp"

using namespace streamcoll;
using namespace streamcoll::config;

namespace {

Measurement pt(int ranks, uint64_t bytes, std::string route, double us, int nodes = 1,
               MemKind mem = MemKind::host, int stream = 0, Coll coll = Coll::allreduce) {
  Measurement m;
  m.coll = coll;
  m.mem = mem;
  m.stream = stream;
  m.ranks = ranks;
  m.nodes = nodes;
  m.bytes = bytes;
  m.route = std::move(route);
  m.seconds = us * 1e-6;
  return m;
}

TuningTable load(const std::string& text) {
  std::optional<ParseError> err;
  TuningTable t = TuningTable::parse(text, "built", &err);
  REQUIRE_MESSAGE(!err, (err ? err->to_string() : "") << "\n" << text);
  return t;
}

CallKey key_of(const Measurement& m, uint64_t bytes, int ranks) {
  CallKey k;
  k.coll = m.coll;
  k.bytes = bytes;
  k.ranks = ranks;
  k.nodes = m.nodes;
  k.ppn = std::max(1, ranks / m.nodes);
  k.mem = m.mem;
  k.stream = m.stream == 1;
  return k;
}

// The route text a parsed rule carries, rebuilt: "ht algo=rd".
std::string route_text(const Rule* r) {
  if (!r) return "<none>";
  std::string s(name(r->choice.route));
  for (const auto& [k, v] : r->choice.params) s += " " + k + "=" + v;
  return s;
}

std::string routed(const TuningTable& t, const Measurement& m, uint64_t bytes, int ranks) {
  return route_text(t.match(key_of(m, bytes, ranks)));
}

// The winner of a point, computed without the builder: the fastest time, then among the
// routes within the margin the one with the lowest (family rank, parameter count), the
// first seen on equal footing.
std::string expected_winner(const std::vector<Measurement>& c, double tie) {
  static const char* order[] = {"pmpi", "nccl", "ht", "blueconnect", "nvgroup", "ccube"};
  auto family_rank = [](const std::string& r) {
    std::string f = r.substr(0, r.find(' '));
    for (int i = 0; i < 6; ++i)
      if (f == order[i]) return i;
    return 6;
  };
  auto params = [](const std::string& r) {
    return static_cast<int>(std::count(r.begin(), r.end(), '='));
  };
  double fastest = std::numeric_limits<double>::infinity();
  for (const auto& m : c) fastest = std::min(fastest, m.seconds);
  const Measurement* best = nullptr;
  for (const auto& m : c) {
    if (m.seconds > fastest * (1 + tie) * (1 + 1e-12)) continue;
    if (!best || std::make_pair(family_rank(m.route), params(m.route)) <
                     std::make_pair(family_rank(best->route), params(best->route)))
      best = &m;
  }
  return best->route;
}

}  // namespace

TEST_CASE("simplicity: route family first, then the number of parameters") {
  CHECK(simplicity("pmpi") < simplicity("nccl"));
  CHECK(simplicity("nccl") < simplicity("ht"));
  CHECK(simplicity("ht") < simplicity("ht algo=rd"));
  CHECK(simplicity("ht algo=rd chunk=4K") > simplicity("ht algo=ring"));
  CHECK(simplicity("ht algo=ring chunk=4K") < simplicity("blueconnect"));
  CHECK(simplicity("blueconnect hierarchy=2x2") < simplicity("nvgroup"));
  CHECK(simplicity("nvgroup") < simplicity("ccube"));
  CHECK(simplicity("ccube") < simplicity("bogus"));
  CHECK(simplicity("ht algo=rd") == 201);
}

TEST_CASE("the winner: fastest, ties within the margin go to the simpler route") {
  BuildOptions opt;  // 5 %
  std::vector<Measurement> c = {pt(2, 8, "ht algo=rd", 10.0), pt(2, 8, "pmpi", 20.0)};
  CHECK(pick_winner(c, opt) == 0);
  c[1].seconds = 10.4e-6;  // within 5 % of 10: a tie, pmpi is simpler
  CHECK(pick_winner(c, opt) == 1);
  c[1].seconds = 10.6e-6;  // 6 % slower: no tie
  CHECK(pick_winner(c, opt) == 0);
  opt.tie = 0.1;
  CHECK(pick_winner(c, opt) == 1);
  opt.tie = 0;
  c[1].seconds = 10e-6;  // exactly equal still ties
  CHECK(pick_winner(c, opt) == 1);
  // equal simplicity: the first seen keeps it
  std::vector<Measurement> d = {pt(2, 8, "ht algo=ring", 10.0), pt(2, 8, "ht algo=rd", 10.0)};
  CHECK(pick_winner(d, BuildOptions{}) == 0);
  std::swap(d[0], d[1]);
  CHECK(pick_winner(d, BuildOptions{}) == 0);
  // a simpler route outside the margin does not win
  std::vector<Measurement> e = {pt(2, 8, "blueconnect hierarchy=2x1", 1.0),
                                pt(2, 8, "ht algo=rd", 1.2), pt(2, 8, "pmpi", 1.5)};
  CHECK(pick_winner(e, BuildOptions{}) == 0);
  CHECK(pick_winner({}, BuildOptions{}) == -1);
}

TEST_CASE("one rank count: byte ranges split at the geometric midpoint") {
  // ht wins at 4..64 B, pmpi from 256 B: the boundary is floor(sqrt(64*256)) = 128.
  std::vector<Measurement> pts;
  for (uint64_t b : {4, 16, 64, 256, 1024}) {
    bool small = b <= 64;
    pts.push_back(pt(4, b, "pmpi", small ? 20 : 10));
    pts.push_back(pt(4, b, "ht algo=rd", small ? 10 : 20));
  }
  auto rules = build_rules(pts, BuildOptions{});
  REQUIRE(rules.size() == 2);
  CHECK(rules[0].route == "ht algo=rd");
  CHECK(rules[0].bytes.lo == 0);
  CHECK(rules[0].bytes.hi == 128);
  CHECK(rules[1].route == "pmpi");
  CHECK(rules[1].bytes.lo == 129);
  CHECK(rules[1].bytes.hi == std::numeric_limits<uint64_t>::max());
  CHECK(rules[0].ranks.lo == 4);
  CHECK(rules[0].ranks.hi == std::numeric_limits<uint64_t>::max());
  CHECK_FALSE(rules[0].multi_node);

  auto text = write_table(rules, "test table\nsecond line", "");
  CHECK(text.find("# test table\n# second line\n") == 0);
  CHECK(text.find("allreduce     0-128  4-     1      *    host,pinned  no      ht algo=rd\n") !=
        std::string::npos);
  auto t = load(text);
  REQUIRE(t.rules().size() == 2);
  const Measurement& m = pts[0];
  CHECK(routed(t, m, 0, 4) == "ht algo=rd");
  CHECK(routed(t, m, 128, 4) == "ht algo=rd");
  CHECK(routed(t, m, 129, 4) == "pmpi");
  CHECK(routed(t, m, 1ull << 40, 4) == "pmpi");
  CHECK(routed(t, m, 8, 3) == "<none>");   // below the smallest measured rank count
  CHECK(routed(t, m, 8, 100) == "ht algo=rd");
  auto pinned = m;  // host rules cover pinned host memory
  pinned.mem = MemKind::pinned;
  CHECK(routed(t, pinned, 8, 4) == "ht algo=rd");
  CHECK(routed(t, pinned, 129, 4) == "pmpi");
  auto dev = m;
  dev.mem = MemKind::device;
  CHECK(routed(t, dev, 8, 4) == "<none>");  // another shape
  auto str = m;
  str.stream = 1;
  CHECK(routed(t, str, 8, 4) == "<none>");
  auto multi = m;
  multi.nodes = 2;
  CHECK(routed(t, multi, 8, 4) == "<none>");
}

TEST_CASE("rank counts with equal maps merge; unequal or separated ones do not") {
  std::vector<Measurement> pts;
  auto add = [&](int ranks, uint64_t cross) {  // ht below `cross`, pmpi from it
    for (uint64_t b = 4; b <= 4096; b *= 4) {
      pts.push_back(pt(ranks, b, "pmpi", b < cross ? 9 : 5));
      pts.push_back(pt(ranks, b, "ht algo=rd", b < cross ? 5 : 9));
    }
  };
  add(2, 256);
  add(4, 256);
  add(8, 1024);
  add(16, 256);
  auto rules = build_rules(pts, BuildOptions{});
  REQUIRE(rules.size() == 6);
  CHECK(rules[0].ranks.lo == 2);
  CHECK(rules[0].ranks.hi == 7);
  CHECK(rules[1].ranks.hi == 7);
  CHECK(rules[2].ranks.lo == 8);
  CHECK(rules[2].ranks.hi == 15);
  CHECK(rules[4].ranks.lo == 16);
  CHECK(rules[4].ranks.hi == std::numeric_limits<uint64_t>::max());
  CHECK(rules[0].bytes.hi == 128);  // sqrt(64 * 256)
  CHECK(rules[2].bytes.hi == 512);  // sqrt(256 * 1024)
  auto t = load(write_table(rules, ""));
  const Measurement& m = pts[0];
  CHECK(routed(t, m, 200, 3) == "pmpi");
  CHECK(routed(t, m, 200, 7) == "pmpi");
  CHECK(routed(t, m, 200, 8) == "ht algo=rd");
  CHECK(routed(t, m, 200, 15) == "ht algo=rd");
  CHECK(routed(t, m, 200, 16) == "pmpi");
  // below every measured count: the fallback (the default table: host -> pmpi)
  CHECK(routed(t, m, 8, 1) == "pmpi");
  CHECK(t.match(key_of(m, 8, 1))->origin.find("built:") == 0);
}

TEST_CASE("shapes stay apart: collective, memory, stream, one node or more") {
  std::vector<Measurement> pts = {
      pt(4, 64, "ht algo=rd", 1, 1, MemKind::host, 0),
      pt(4, 64, "pmpi", 2, 1, MemKind::host, 0),
      pt(4, 64, "ht algo=rd", 2, 1, MemKind::device, 1),
      pt(4, 64, "nccl", 1, 1, MemKind::device, 1),
      pt(4, 64, "ht algo=ring", 1, 1, MemKind::device, 0),
      pt(4, 64, "nccl", 2, 1, MemKind::device, 0),
      pt(4, 64, "ht algo=rabenseifner", 1, 2, MemKind::host, 0),
      pt(4, 64, "pmpi", 2, 2, MemKind::host, 0),
      pt(4, 64, "ht algo=ring", 1, 1, MemKind::host, 0, Coll::reduce_scatter_block),
      pt(4, 64, "pmpi", 2, 1, MemKind::host, 0, Coll::reduce_scatter_block),
      pt(4, 64, "blueconnect hierarchy=2x2", 1, 2, MemKind::device, -1),
      pt(4, 64, "nccl", 2, 2, MemKind::device, -1),
  };
  auto rules = build_rules(pts, BuildOptions{});
  REQUIRE(rules.size() == 6);
  auto t = load(write_table(rules, "", ""));
  for (size_t i = 0; i < pts.size(); i += 2) {
    std::vector<Measurement> c(pts.begin() + static_cast<long>(i),
                               pts.begin() + static_cast<long>(i) + 2);
    CAPTURE(i);
    CHECK(routed(t, pts[i], 64, 4) == expected_winner(c, 0.05));
  }
  // stream -1 (a model): both with and without the attribute
  auto any = pts[10];
  any.stream = 0;
  CHECK(routed(t, any, 64, 4) == "blueconnect hierarchy=2x2");
  // the written columns
  auto text = write_table(rules, "", "");
  CHECK(text.find("reduce_scatter_block") != std::string::npos);
  CHECK(text.find(" 2-  ") != std::string::npos);
  CHECK(text.find(" yes ") != std::string::npos);
}

TEST_CASE("rules for one stream mode come before rules for either") {
  // a model's prediction (stream -1) and a measurement without the attribute
  std::vector<Measurement> pts = {pt(8, 64, "blueconnect", 1, 2, MemKind::device, -1),
                                  pt(8, 64, "nccl", 2, 2, MemKind::device, -1),
                                  pt(8, 64, "ht algo=rd", 1, 2, MemKind::device, 0),
                                  pt(8, 64, "nccl", 2, 2, MemKind::device, 0)};
  auto rules = build_rules(pts, BuildOptions{});
  REQUIRE(rules.size() == 2);
  CHECK(rules[0].stream == 0);
  CHECK(rules[1].stream == -1);
  auto t = load(write_table(rules, "", ""));
  auto without = pts[2];
  CHECK(routed(t, without, 64, 8) == "ht algo=rd");
  auto with = pts[2];
  with.stream = 1;
  CHECK(routed(t, with, 64, 8) == "blueconnect");
}

TEST_CASE("bad points are skipped and counted, with the first reason") {
  std::vector<Measurement> pts = {pt(2, 8, "pmpi", 1), pt(2, 8, "warp", 0.5),
                                  pt(2, 8, "ht algo=fast", 0.5), pt(2, 8, "ht", NAN),
                                  pt(2, 8, "ht", -1), pt(2, 8, "warp", 0.1), pt(2, 8, "", 0.1)};
  int skipped = 0;
  std::string why;
  auto rules = build_rules(pts, BuildOptions{}, &skipped, &why);
  CHECK(skipped == 6);
  CHECK(why.find("unknown route 'warp'") != std::string::npos);
  REQUIRE(rules.size() == 1);
  CHECK(rules[0].route == "pmpi");
  CHECK(check_route("ht algo=rd chunk=64K") == "");
  CHECK(check_route("ht algo=fast").find("'algo' must be one of") != std::string::npos);
  CHECK(check_route("blueconnect hierarchy=2x2 backend=sched/mpi") == "");
  CHECK(check_route("") != "");
}

TEST_CASE("written tables keep the fallback and range syntax the parser reads") {
  std::vector<Measurement> pts;
  for (uint64_t b = 4; b <= (1ull << 30); b *= 2) {
    pts.push_back(pt(8, b, "pmpi", b < (1 << 20) ? 3 : 1, 2, MemKind::device));
    pts.push_back(pt(8, b, "nccl", 2, 2, MemKind::device));
  }
  auto rules = build_rules(pts, BuildOptions{});
  REQUIRE(rules.size() == 2);
  CHECK(rules[0].bytes.hi == 741455);  // floor(sqrt(512K * 1M))
  auto text = write_table(rules, "from a test");
  CHECK(text.find("741455-") == std::string::npos);
  CHECK(text.find("741456-") != std::string::npos);
  CHECK(text.find("# fallback") != std::string::npos);
  auto t = load(text);
  CHECK(t.rules().size() == 2 + load(std::string(default_table_text())).rules().size());
  // the fallback answers for what was not measured: device bcast -> nccl (default table)
  auto b = pts[0];
  b.coll = Coll::bcast;
  CHECK(routed(t, b, 8, 8) == "nccl");
  // whole binary sizes get suffixes
  std::vector<Measurement> q = {pt(2, 1024, "pmpi", 1), pt(2, 4096, "ht", 1),
                                pt(2, 4096, "pmpi", 2), pt(2, 1024, "ht", 2)};
  auto text2 = write_table(build_rules(q, BuildOptions{}), "", "");
  CHECK(text2.find("0-2K ") != std::string::npos);
  CHECK(text2.find("2049-  ") != std::string::npos);
  // rank ranges are written as plain numbers
  std::vector<Measurement> r = {pt(1024, 8, "pmpi", 1), pt(2048, 8, "ht", 1),
                                pt(2048, 8, "pmpi", 2)};
  auto text3 = write_table(build_rules(r, BuildOptions{}), "", "");
  CHECK(text3.find(" 1024-2047 ") != std::string::npos);
  CHECK(text3.find(" 2048- ") != std::string::npos);
}

TEST_CASE("random measurements: the loaded table routes every point to its winner") {
  std::mt19937_64 rng(20261121);
  const std::vector<std::string> routes = {"pmpi",       "nccl",           "ht",
                                           "ht algo=rd", "ht algo=ring",   "blueconnect",
                                           "ht algo=rabenseifner", "blueconnect hierarchy=2x2"};
  int checked = 0;
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<Measurement> pts;
    std::vector<std::vector<Measurement>> groups;
    std::vector<int> rank_counts;
    for (int r = 2; r <= 64; r *= 2)  // distinct counts: 2|3, 4|5, 8|9, ...
      if (rng() % 2) rank_counts.push_back(r + static_cast<int>(rng() % 2));
    if (rank_counts.empty()) rank_counts.push_back(3);
    const double tie = (rng() % 3) * 0.05;
    const int nroutes = 1 + static_cast<int>(rng() % 4);
    std::vector<std::string> rs(routes);
    std::shuffle(rs.begin(), rs.end(), rng);
    rs.resize(static_cast<size_t>(nroutes));
    for (int shape = 0; shape < 4; ++shape) {
      MemKind mem = shape & 1 ? MemKind::device : MemKind::host;
      int nodes = shape & 2 ? 2 : 1;
      for (int ranks : rank_counts) {
        // few distinct time levels, so ties and equal maps across rank counts happen
        const int pattern = static_cast<int>(rng() % 3);
        for (uint64_t b = 4; b <= (1u << 20); b *= 2 + (rng() % 3)) {
          std::vector<Measurement> c;
          for (const auto& r : rs) {
            double us = pattern == 0 ? 1.0 + static_cast<double>(rng() % 4) * 0.03
                                     : 1.0 + static_cast<double>(rng() % 3);
            c.push_back(pt(ranks, b, r, us, nodes, mem, shape % 3 == 0 ? 0 : 1));
          }
          pts.insert(pts.end(), c.begin(), c.end());
          groups.push_back(std::move(c));
        }
      }
    }
    BuildOptions opt;
    opt.tie = tie;
    int skipped = -1;
    auto rules = build_rules(pts, opt, &skipped);
    CHECK(skipped == 0);
    auto t = load(write_table(rules, "random", ""));
    for (const auto& c : groups) {
      const Measurement& m = c.front();
      // every measured point routes to its winner
      std::string got = routed(t, m, m.bytes, m.ranks);
      std::string want = expected_winner(c, tie);
      if (got != want) {
        CAPTURE(trial);
        CAPTURE(m.ranks);
        CAPTURE(m.bytes);
        CHECK(got == want);
      }
      ++checked;
    }
    // at most one rule per (shape, rank group, byte range): no two adjacent rules of the
    // same rank range and shape route alike
    for (size_t i = 1; i < rules.size(); ++i) {
      const auto& a = rules[i - 1];
      const auto& b = rules[i];
      if (a.coll == b.coll && a.mem == b.mem && a.stream == b.stream &&
          a.multi_node == b.multi_node && a.ranks.lo == b.ranks.lo) {
        CHECK(a.route != b.route);
        CHECK(a.bytes.hi + 1 == b.bytes.lo);
      }
    }
  }
  CHECK(checked > 5000);
}

TEST_CASE("fusion: fuse= where the fastest burst is fused, byte ranges split there") {
  // Single calls: ht wins at 4..64 B, pmpi from 256 B (boundary 128), at 2 and 4 ranks.
  // Bursts: at 4 ranks fused is faster at 4..16 and at 256 B (not at 64 B); at 2 ranks
  // never by more than the tie margin (4 % faster: unfused, the simpler, wins).
  std::vector<Measurement> pts;
  auto burst = [](int ranks, uint64_t b, std::string route, double us) {
    Measurement m = pt(ranks, b, std::move(route), us);
    m.burst = 100;
    return m;
  };
  for (int ranks : {2, 4})
    for (uint64_t b : {4, 16, 64, 256, 1024}) {
      const bool small = b <= 64;
      pts.push_back(pt(ranks, b, "pmpi", small ? 20 : 10));
      pts.push_back(pt(ranks, b, "ht algo=rd", small ? 10 : 20));
      // burst times far below the single calls: they must not compete with them
      pts.push_back(burst(ranks, b, "pmpi", 2));
      pts.push_back(burst(ranks, b, "ht algo=rd", 3));
      const bool fused_wins = ranks == 4 && (b <= 16 || b == 256);
      pts.push_back(burst(ranks, b, "pmpi fuse=64M", fused_wins ? 1 : ranks == 2 ? 1.92 : 4));
    }
  auto rules = build_rules(pts, BuildOptions{});
  auto t = load(write_table(rules, "", ""));
  const Measurement& m = pts[0];
  // 2 ranks: as without bursts
  CHECK(routed(t, m, 4, 2) == "ht algo=rd");
  CHECK(routed(t, m, 128, 2) == "ht algo=rd");
  CHECK(routed(t, m, 129, 2) == "pmpi");
  CHECK(routed(t, m, 4096, 2) == "pmpi");
  // 4 ranks: the single-call winner with fuse=64M where the fused burst won
  CHECK(routed(t, m, 4, 4) == "ht algo=rd fuse=64M");
  CHECK(routed(t, m, 32, 4) == "ht algo=rd fuse=64M");  // floor(sqrt(16*64)) = 32
  CHECK(routed(t, m, 33, 4) == "ht algo=rd");
  CHECK(routed(t, m, 128, 4) == "ht algo=rd");
  CHECK(routed(t, m, 129, 4) == "pmpi fuse=64M");
  CHECK(routed(t, m, 512, 4) == "pmpi fuse=64M");  // floor(sqrt(256*1024)) = 512
  CHECK(routed(t, m, 513, 4) == "pmpi");
  CHECK(routed(t, m, 1ull << 30, 4) == "pmpi");
  // 8 ranks: from the 4-rank rules
  CHECK(routed(t, m, 4, 8) == "ht algo=rd fuse=64M");

  // Only bursts of allreduce fuse; a point without bursts does not; fuse_at and route_for.
  FusionPicks picks(pts, BuildOptions{});
  CHECK(picks.fuse_at(pt(4, 16, "x", 1)) == "64M");
  CHECK(picks.fuse_at(pt(4, 64, "x", 1)).empty());
  CHECK(picks.fuse_at(pt(4, 32, "x", 1)).empty());  // not measured
  CHECK(picks.fuse_at(pt(4, 16, "x", 1, 2)).empty());  // another node class
  CHECK(picks.route_for(pt(4, 16, "pmpi", 1)) == "pmpi fuse=64M");
  CHECK(picks.route_for(pt(4, 16, "pmpi fuse=1K", 1)) == "pmpi fuse=1K");  // kept
  std::vector<Measurement> bcast = {pt(4, 16, "pmpi", 2, 1, MemKind::host, 0, Coll::bcast),
                                    pt(4, 16, "pmpi fuse=64M", 1, 1, MemKind::host, 0, Coll::bcast)};
  for (auto& b : bcast) b.burst = 100;
  CHECK(FusionPicks(bcast, BuildOptions{}).empty());
  CHECK(route_param("ht algo=rd fuse=64M", "fuse") == "64M");
  CHECK(route_param("ht algo=rd fuse=64M", "algo") == "rd");
  CHECK(route_param("ht  algo=rd", "alg").empty());
  CHECK(route_param("pmpi", "fuse").empty());
}

TEST_CASE("sc_bench CSV: columns by name, appended headers, errors with the line") {
  std::string header(bench_csv_header());
  std::string row =
      "allreduce,float,sum,host,0,4,1,4,ht:algo=rd,ht algo=rd,ht,1024,256,100,"
      "10.5,12.25,30,12,0.0835,0.1253,1,ht algo=rd,0";
  std::vector<BenchRow> rows;
  std::string err;
  REQUIRE(parse_bench_csv(header + "\n" + row + "\n" + header + "\n" + row + "\n", "a.csv",
                          &rows, &err));
  REQUIRE(rows.size() == 2);
  const BenchRow& r = rows[0];
  CHECK(r.coll == "allreduce");
  CHECK(r.ranks == 4);
  CHECK(r.spec == "ht:algo=rd");
  CHECK(r.route == "ht algo=rd");
  CHECK(r.bytes == 1024);
  CHECK(r.rule == "ht algo=rd");
  CHECK(r.median_us == doctest::Approx(12.25));
  CHECK(r.valid);

  Measurement m;
  std::string why;
  REQUIRE(to_measurement(r, &m, &why));
  CHECK(m.seconds == doctest::Approx(12.25e-6));
  CHECK(m.route == "ht algo=rd");
  CHECK(m.mem == MemKind::host);
  CHECK(m.stream == 0);

  BenchRow declined = r;
  declined.taken = "pmpi";
  CHECK_FALSE(to_measurement(declined, &m, &why));
  CHECK(why.find("declined") != std::string::npos);
  BenchRow unknown = r;
  unknown.taken = "-";
  CHECK(to_measurement(unknown, &m, &why));
  BenchRow other_algo = r;  // the statistics say ht, but another algorithm ran
  other_algo.rule = "ht algo=ring";
  CHECK_FALSE(to_measurement(other_algo, &m, &why));
  CHECK(why.find("went to ht algo=ring") != std::string::npos);
  BenchRow wrong = r;
  wrong.valid = false;
  CHECK_FALSE(to_measurement(wrong, &m, &why));
  BenchRow table = r;
  table.spec = "table";
  CHECK_FALSE(to_measurement(table, &m, &why));

  // columns in another order, one extra
  rows.clear();
  REQUIRE(parse_bench_csv("extra," + header + "\nx," + row + "\n", "b.csv", &rows, &err));
  CHECK(rows.at(0).busbw == doctest::Approx(0.1253));

  // files from before the rule column: it is optional, "-" when absent
  rows.clear();
  const std::string old_header = header.substr(0, header.rfind(",rule"));
  REQUIRE(parse_bench_csv(old_header + "\n" + row.substr(0, row.rfind(",ht algo=rd")) + "\n",
                          "o.csv", &rows, &err));
  CHECK(rows.at(0).rule == "-");
  CHECK(rows.at(0).burst == 0);
  CHECK(rows.at(0).valid);
  // an empty rule field reads as unknown
  rows.clear();
  REQUIRE(parse_bench_csv(header + "\n" + row.substr(0, row.rfind(",ht algo=rd") + 1) + ",0\n",
                          "e.csv", &rows, &err));
  CHECK(rows.at(0).rule == "-");
  // bursts (sc_bench --burst): the count carried into the measurement; not negative
  rows.clear();
  const std::string burst_row = row.substr(0, row.rfind(',')) + ",100";
  REQUIRE(parse_bench_csv(header + "\n" + burst_row + "\n", "u.csv", &rows, &err));
  CHECK(rows.at(0).burst == 100);
  REQUIRE(to_measurement(rows.at(0), &m, &why));
  CHECK(m.burst == 100);
  rows.clear();
  CHECK_FALSE(parse_bench_csv(header + "\n" + row.substr(0, row.rfind(',')) + ",-1\n", "n.csv",
                              &rows, &err));
  // a column named twice
  rows.clear();
  CHECK_FALSE(parse_bench_csv(header + ",spec\n" + row + ",x\n", "t.csv", &rows, &err));
  CHECK(err == "t.csv:1: column 'spec' appears twice");

  rows.clear();
  CHECK_FALSE(parse_bench_csv("coll,bytes\nallreduce,4\n", "c.csv", &rows, &err));
  CHECK(err.find("c.csv:1: no column 'dtype'") == 0);
  std::string bad = row;
  bad.replace(bad.find("1024"), 4, "10x4");
  CHECK_FALSE(parse_bench_csv(header + "\n" + row + "\n" + bad + "\n", "d.csv", &rows, &err));
  CHECK(err.find("d.csv:3:") == 0);
  CHECK_FALSE(parse_bench_csv("", "e.csv", &rows, &err));
  CHECK(err == "e.csv: no header line");
}
