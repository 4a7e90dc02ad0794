// sc_tune: tuning tables from sc_bench measurements (config/table_builder.hpp), and the
// check that a table routes calls as written. Calls no MPI; scripts/autotune.sh drives it.
//
//   sc_tune table [--tie 0.05] [--out FILE] [--no-fallback] CSV...
//       Reads sc_bench CSV files (config/bench_csv.hpp), takes every valid row of a forced
//       route whose calls went to that route (rows of routes that declined, wrong results
//       and spec "table" are left out and counted, per reason), picks the fastest route
//       per (shape, ranks, bytes) by median latency (ties within --tie go to the simpler
//       route), merges them into rules and writes the table (stdout without --out), with
//       the embedded default table as the fallback unless --no-fallback. Rows of bursts
//       (sc_bench --burst) decide fuse= (config/table_builder.hpp, rule 4). Prints, per
//       shape, the winners as a map: a row per rank count, a letter per size; and the
//       bursts per point, fastest unfused and fused.
//
//   sc_tune check --table FILE [--measured CSV]... CSV...
//       Loads FILE with the library's parser (a malformed table fails the check), then:
//       - every row of the trailing CSV files with spec "table" (a sc_bench run with
//         nothing forced, under STREAMCOLL_TUNING_FILE=FILE) must have taken the route
//         the table names for its call (the first matching rule; none: pmpi), with the
//         rule's parameters where the row has them (its "rule" column), and be valid;
//       - with --measured, every measured point must be routed by the table to its
//         winner (the same choice `table` makes, with --tie).
//       Prints each mismatch and a summary; exit 1 on any mismatch.
//
// Exit status: 0 success, 1 a failed check or no usable rows, 2 bad usage or input.
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "config/bench_csv.hpp"
#include "config/table_builder.hpp"
#include "config/tuning_table.hpp"

using namespace streamcoll;
using namespace streamcoll::config;

namespace {

void usage(FILE* f) {
  std::fprintf(f,
      "usage: sc_tune table [--tie 0.05] [--out FILE] [--no-fallback] CSV...\n"
      "       sc_tune check --table FILE [--measured CSV]... CSV...\n"
      "  table  the fastest route per point of sc_bench CSV files, as a tuning table\n"
      "  check  a table loads and routes sc_bench's 'table' rows (and, with --measured,\n"
      "         every measured point) as written\n");
}

bool read_file(const std::string& path, std::string* text) {
  std::ifstream in(path);
  if (!in) return false;
  std::stringstream s;
  s << in.rdbuf();
  *text = s.str();
  return true;
}

bool read_rows(const std::vector<std::string>& files, std::vector<BenchRow>* rows) {
  for (const auto& f : files) {
    std::string text, err;
    if (!read_file(f, &text)) {
      std::fprintf(stderr, "sc_tune: cannot read %s\n", f.c_str());
      return false;
    }
    if (!parse_bench_csv(text, f, rows, &err)) {
      std::fprintf(stderr, "sc_tune: %s\n", err.c_str());
      return false;
    }
  }
  return true;
}

std::string size_text(uint64_t b) {
  const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && b % 1024 == 0 && u < 4) {
    b /= 1024;
    ++u;
  }
  return std::to_string(b) + " " + unit[u];
}

std::string shape_text(const Measurement& m) {
  return std::string(name(m.coll)) + ", " + std::string(name(m.mem)) + " memory, " +
         (m.stream < 0 ? "stream any" : m.stream ? "stream attached" : "no stream") + ", " +
         (m.nodes > 1 ? "more than one node" : "one node");
}

// The measurements usable for a table, with the reasons the others were left out.
std::vector<Measurement> usable(const std::vector<BenchRow>& rows, bool report) {
  std::vector<Measurement> out;
  std::map<std::string, int> reasons;
  for (const auto& r : rows) {
    Measurement m;
    std::string why;
    if (to_measurement(r, &m, &why)) {
      out.push_back(std::move(m));
    } else if (r.spec != "table") {
      ++reasons[why];
    }
  }
  if (report)
    for (const auto& [why, n] : reasons)
      std::fprintf(stderr, "sc_tune: %d row%s left out: %s\n", n, n == 1 ? "" : "s", why.c_str());
  return out;
}

// Points grouped with their candidates, in order.
std::map<PointKey, std::vector<Measurement>> group(const std::vector<Measurement>& ms) {
  std::map<PointKey, std::vector<Measurement>> g;
  for (const auto& m : ms) g[point_key(m)].push_back(m);
  return g;
}

// The burst measurements (sc_bench --burst) per point: the fastest unfused and fused
// candidates and their ratio, and whether fusion wins there (rule 4).
void print_bursts(const std::vector<Measurement>& ms, const FusionPicks& fusion) {
  std::map<PointKey, std::vector<Measurement>> bursts;
  for (const auto& m : ms)
    if (m.burst > 0) bursts[point_key(m)].push_back(m);
  if (bursts.empty()) return;
  std::printf("# bursts of MPI_Iallreduce (us per call): ranks, size, fastest unfused, "
              "fastest fused, unfused/fused, fused in the table\n");
  for (const auto& [key, cands] : bursts) {
    const Measurement* best[2] = {nullptr, nullptr};  // unfused, fused
    for (const auto& c : cands) {
      const Measurement*& b = best[route_param(c.route, "fuse").empty() ? 0 : 1];
      if (!b || c.seconds < b->seconds) b = &c;
    }
    auto cell = [](const Measurement* m) {
      if (!m) return std::string("-");
      char t[32];
      std::snprintf(t, sizeof t, "%.3f", m->seconds * 1e6);
      return std::string(t) + " [" + m->route + "]";
    };
    const Measurement& any = cands.front();
    std::printf("#   %s, %d ranks, %s: %s %s", shape_text(any).c_str(), any.ranks,
                size_text(any.bytes).c_str(), cell(best[0]).c_str(), cell(best[1]).c_str());
    if (best[0] && best[1]) std::printf(" %.2fx", best[0]->seconds / best[1]->seconds);
    const std::string f = fusion.fuse_at(any);
    std::printf(" %s\n", f.empty() ? "no" : ("fuse=" + f).c_str());
  }
}

// Single calls and bursts apart (the table builder's rules 1 and 4).
std::vector<Measurement> singles(const std::vector<Measurement>& ms) {
  std::vector<Measurement> out;
  for (const auto& m : ms)
    if (m.burst == 0) out.push_back(m);
  return out;
}

void print_maps(const std::vector<Measurement>& ms, const BuildOptions& opt) {
  const FusionPicks fusion(ms, opt);
  // shape -> ranks -> bytes -> winner (with fuse= where bursts were faster fused)
  std::map<std::tuple<int, int, int, int>, std::map<int, std::map<uint64_t, std::string>>> maps;
  std::map<std::tuple<int, int, int, int>, Measurement> sample;
  for (const auto& [key, cands] : group(singles(ms))) {
    const Measurement& w = cands[static_cast<size_t>(pick_winner(cands, opt))];
    auto shape = std::make_tuple(std::get<0>(key), std::get<1>(key), std::get<2>(key),
                                 std::get<3>(key));
    maps[shape][w.ranks][w.bytes] = fusion.route_for(w);
    sample.emplace(shape, w);
  }
  print_bursts(ms, fusion);
  for (const auto& [shape, by_ranks] : maps) {
    std::map<std::string, char> letter;
    std::set<uint64_t> sizes;
    for (const auto& [r, by_bytes] : by_ranks)
      for (const auto& [b, route] : by_bytes) {
        sizes.insert(b);
        if (!letter.count(route)) letter[route] = static_cast<char>('A' + letter.size() % 26);
      }
    std::printf("# fastest route: %s (rows: ranks; columns: %s to %s)\n",
                shape_text(sample.at(shape)).c_str(), size_text(*sizes.begin()).c_str(),
                size_text(*sizes.rbegin()).c_str());
    for (const auto& [r, by_bytes] : by_ranks) {
      std::printf("#   %5d  ", r);
      for (uint64_t b : sizes) {
        auto it = by_bytes.find(b);
        std::putchar(it == by_bytes.end() ? '.' : letter.at(it->second));
      }
      std::putchar('\n');
    }
    for (const auto& [route, c] : letter) std::printf("#   %c = %s\n", c, route.c_str());
  }
}

int cmd_table(int argc, char** argv) {
  BuildOptions opt;
  std::string out_path;
  bool fallback = true;
  std::vector<std::string> files;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--tie" && i + 1 < argc) {
      char* end = nullptr;
      opt.tie = std::strtod(argv[++i], &end);
      if (*end || !(opt.tie >= 0 && opt.tie < 1)) {
        std::fprintf(stderr, "sc_tune: --tie takes a fraction in [0, 1), got '%s'\n", argv[i]);
        return 2;
      }
    } else if (a == "--out" && i + 1 < argc) {
      out_path = argv[++i];
    } else if (a == "--no-fallback") {
      fallback = false;
    } else if (a.rfind("--", 0) == 0) {
      std::fprintf(stderr, "sc_tune table: unknown option '%s'\n", a.c_str());
      usage(stderr);
      return 2;
    } else {
      files.push_back(a);
    }
  }
  if (files.empty()) {
    usage(stderr);
    return 2;
  }
  std::vector<BenchRow> rows;
  if (!read_rows(files, &rows)) return 2;
  auto ms = usable(rows, true);
  if (ms.empty()) {
    std::fprintf(stderr, "sc_tune: no usable measurements in %zu rows\n", rows.size());
    return 1;
  }
  int skipped = 0;
  std::string why;
  auto rules = build_rules(ms, opt, &skipped, &why);
  if (skipped)
    std::fprintf(stderr, "sc_tune: %d measurement%s left out (first: %s)\n", skipped,
                 skipped == 1 ? "" : "s", why.c_str());

  std::set<std::string> routes;
  for (const auto& m : ms) routes.insert(m.route);
  std::string header = "streamcoll tuning table, written by sc_tune from sc_bench measurements";
  char date[32];
  std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  header += "\n" + std::string(date) + "; fastest median latency per point, ties within " +
            std::to_string(static_cast<int>(opt.tie * 100 + 0.5)) + " % to the simpler route";
  header += "\nfrom:";
  for (const auto& f : files) header += " " + f;
  header += "\ncandidates:";
  for (const auto& r : routes) header += " [" + r + "]";
  int bursts = 0;
  for (const auto& m : ms) bursts += m.burst > 0;
  if (bursts)
    header += "\nfuse= where bursts of MPI_Iallreduce were faster fused (" +
              std::to_string(bursts) + " of the measurements are bursts)";
  header += "\n" + std::to_string(ms.size()) + " measurements -> " +
            std::to_string(rules.size()) + " rules; load with STREAMCOLL_TUNING_FILE=<this file>";
  std::string text = write_table(rules, header, fallback ? default_table_text() : "");

  std::optional<ParseError> err;
  TuningTable::parse(text, "written table", &err);
  if (err) {  // cannot happen unless the builder is wrong; never write a bad table
    std::fprintf(stderr, "sc_tune: internal error, the written table does not parse: %s\n",
                 err->to_string().c_str());
    return 1;
  }
  print_maps(ms, opt);
  if (out_path.empty()) {
    std::fputs(text.c_str(), stdout);
  } else {
    std::ofstream out(out_path);
    out << text;
    if (!out) {
      std::fprintf(stderr, "sc_tune: cannot write %s\n", out_path.c_str());
      return 2;
    }
    std::printf("%zu rules from %zu measurements written to %s\n", rules.size(), ms.size(),
                out_path.c_str());
  }
  return 0;
}

std::string route_text(const Rule* r) {
  if (!r) return "pmpi";
  std::string s(name(r->choice.route));
  for (const auto& [k, v] : r->choice.params) s += " " + k + "=" + v;
  return s;
}

int cmd_check(int argc, char** argv) {
  std::string table_path;
  std::vector<std::string> measured, files;
  BuildOptions opt;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--table" && i + 1 < argc) table_path = argv[++i];
    else if (a == "--measured" && i + 1 < argc) measured.push_back(argv[++i]);
    else if (a == "--tie" && i + 1 < argc) opt.tie = std::atof(argv[++i]);
    else if (a.rfind("--", 0) == 0) {
      std::fprintf(stderr, "sc_tune check: unknown option '%s'\n", a.c_str());
      usage(stderr);
      return 2;
    } else {
      files.push_back(a);
    }
  }
  if (table_path.empty() || (files.empty() && measured.empty())) {
    usage(stderr);
    return 2;
  }
  std::string text;
  if (!read_file(table_path, &text)) {
    std::fprintf(stderr, "sc_tune: cannot read %s\n", table_path.c_str());
    return 2;
  }
  std::optional<ParseError> err;
  TuningTable table = TuningTable::parse(text, table_path, &err);
  if (err) {
    std::printf("FAIL: %s\n", err->to_string().c_str());
    return 1;
  }
  int bad = 0, checked = 0;
  if (!measured.empty()) {
    std::vector<BenchRow> rows;
    if (!read_rows(measured, &rows)) return 2;
    const auto ms = usable(rows, false);
    const FusionPicks fusion(ms, opt);
    for (const auto& [key, cands] : group(singles(ms))) {
      Measurement w = cands[static_cast<size_t>(pick_winner(cands, opt))];
      w.route = fusion.route_for(w);  // fuse= where the bursts were faster fused
      CallKey k;
      k.coll = w.coll;
      k.bytes = w.bytes;
      k.ranks = w.ranks;
      k.nodes = w.nodes;
      k.ppn = (w.ranks + w.nodes - 1) / w.nodes;
      k.mem = w.mem;
      k.stream = w.stream == 1;
      std::string got = route_text(table.match(k));
      ++checked;
      if (got != w.route) {
        ++bad;
        std::printf("FAIL: %s, %d ranks, %s: measured winner '%s', the table says '%s'\n",
                    shape_text(w).c_str(), w.ranks, size_text(w.bytes).c_str(),
                    w.route.c_str(), got.c_str());
      }
    }
    std::printf("measured points: %d checked, %d routed to their winner\n", checked,
                checked - bad);
    if (checked == 0) {
      std::printf("FAIL: no usable measured points in the --measured files\n");
      ++bad;
    }
  }
  int calls = 0, calls_bad = 0, with_params = 0;
  if (!files.empty()) {
    std::vector<BenchRow> rows;
    if (!read_rows(files, &rows)) return 2;
    for (const auto& r : rows) {
      if (r.spec != "table") continue;
      ++calls;
      auto coll = parse_coll(r.coll);
      auto mem = parse_mem(r.mem);
      if (!coll || !mem) {
        ++calls_bad;
        std::printf("FAIL: row of unknown collective or memory '%s' '%s'\n", r.coll.c_str(),
                    r.mem.c_str());
        continue;
      }
      CallKey k;
      k.coll = *coll;
      k.bytes = r.bytes;
      k.ranks = r.ranks;
      k.nodes = r.nodes;
      k.ppn = r.ppn;
      k.mem = *mem;
      k.stream = r.stream == 1;
      const Rule* rule = table.match(k);
      // The route family from the statistics, and, where sc_bench could read it
      // (streamcoll_last_route), the parameters too: which ht algorithm ran.
      const std::string want_family(rule ? name(rule->choice.route) : "pmpi");
      const std::string want = route_text(rule);
      const bool params_known = r.rule != "-";
      if (params_known) ++with_params;
      if (!r.valid || r.taken != want_family || (params_known && r.rule != want)) {
        ++calls_bad;
        std::printf("FAIL: %s %s, %d ranks, %s: the table says %s (%s), the calls went to %s%s\n",
                    r.coll.c_str(), r.mem.c_str(), r.ranks, size_text(r.bytes).c_str(),
                    want.c_str(), rule ? rule->origin.c_str() : "no rule",
                    params_known ? r.rule.c_str() : r.taken.c_str(),
                    r.valid ? "" : ", and the results were wrong");
      }
    }
    if (calls == 0) {
      std::printf("FAIL: no rows with spec 'table' in the files to check\n");
      ++calls_bad;
    }
    std::printf("table-routed sizes: %d checked, %d took the table's route (%d of them "
                "compared with its parameters)\n",
                calls, calls - calls_bad, with_params);
  }
  return bad || calls_bad ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  std::string cmd = argv[1];
  if (cmd == "table") return cmd_table(argc - 2, argv + 2);
  if (cmd == "check") return cmd_check(argc - 2, argv + 2);
  if (cmd == "--help" || cmd == "-h") {
    usage(stdout);
    return 0;
  }
  std::fprintf(stderr, "sc_tune: unknown command '%s'\n", cmd.c_str());
  usage(stderr);
  return 2;
}
