// bc_model: prints the α-β-γ model (config/cost_model.hpp) of allreduce on a link
// hierarchy: flat ring, recursive doubling, Rabenseifner, the two-level scheme,
// BlueConnect, the binary and double binary trees and Aluminum's host-transfer (with the
// default device<->host copy of Machine: 10 µs, 12 GB/s), per message size, with BlueConnect's reduction of the two-level time, the
// sizes where BlueConnect is the cheapest, and the stages at the paper's message size.
// Linked with the core library (for topo::parse_factors); calls nothing from MPI:
//   ninja -C build bench/bc_model && build/bench/bc_model --hierarchy 4x48
//
// Presets (the machines of Cho et al., "BlueConnect", SysML 2019, evaluation). The paper's
// link parameters were not available to us, so these are documented plausible values:
//   192  4x48: 48 nodes of 4 GPUs (IBM S822LC "Minsky" class: P100, NVLink 1.0).
//        level 0  α 3 µs, 40 GB/s per GPU: two NVLink 1.0 bricks, 2 x 20 GB/s per direction.
//        level 1  α 5 µs, InfiniBand EDR, two adapters per node (one per socket): 25 GB/s a
//                 node, 6.25 GB/s per GPU when all 4 send; one GPU alone (a two-level
//                 leader, a flat ring's hop) drives its socket's adapter, 12.5 GB/s.
//        γ 4e-12 s/B: P100 HBM2 ~720 GB/s, a reduction moves 3 bytes per byte reduced.
//   96   6x16: 16 nodes of 6 GPUs (IBM AC922 class: V100, NVLink 2.0).
//        level 0  α 3 µs, 50 GB/s (two NVLink 2.0 bricks, 2 x 25 GB/s per direction).
//        level 1  α 5 µs, dual-rail EDR: 25/6 = 4.17 GB/s per GPU, 12.5 GB/s alone.
//        γ 3.3e-12 s/B: V100 HBM2 ~900 GB/s, 3 bytes moved per byte reduced.
// The paper's message size: ResNet-50's fp32 gradient, 25,557,032 parameters =
// 102,228,128 bytes (the 87 % claim is for ResNet-50 training on 192 GPUs).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "config/cost_model.hpp"
#include "core/topology.hpp"

using namespace streamcoll::model;

namespace {

constexpr double kResNet50Bytes = 25557032.0 * 4;

struct Options {
  std::string preset = "192";
  Hierarchy h;
  Machine m;
  std::vector<double> sizes;
  StageAlgo stage = StageAlgo::automatic;
  TwoLevelOptions two;
  double paper_bytes = kResNet50Bytes;
};

void usage(FILE* f) {
  std::fprintf(f,
      "usage: bc_model [--preset 192|96] [--hierarchy 4x48] [--level ALPHA:GBPS[:SOLO_GBPS]]...\n"
      "                [--gamma S_PER_BYTE] [--sizes MIN:MAX[:FACTOR] | --sizes N,N,...]\n"
      "                [--stage auto|ring] [--intra pipelined|binomial]\n"
      "                [--inter ring|rd|rabenseifner] [--paper-bytes N]\n"
      "  --preset      the paper's 192-GPU (4x48, default) or 96-GPU (6x16) machine\n"
      "  --hierarchy   factors innermost first (GPUs per node first)\n"
      "  --level       one per hierarchy level, innermost first: alpha in seconds, the\n"
      "                per-rank bandwidth in GB/s with all ranks of a node sending, and\n"
      "                optionally the bandwidth one rank gets alone (default: the same)\n"
      "  --gamma       reduction time, seconds per byte\n"
      "  --sizes       bytes per rank; suffixes K, M, G (binary); default 4:1G:4\n"
      "  --stage       BlueConnect stages: auto = halving/doubling for power-of-two\n"
      "                factors, ring otherwise (as implemented); ring = always ring\n"
      "  --intra       two-level intra-node reduce/broadcast (default pipelined)\n"
      "  --inter       two-level leaders' allreduce (default ring)\n"
      "  --paper-bytes the message size for the stage breakdown (default ResNet-50 fp32,\n"
      "                102228128)\n");
}

bool preset(const std::string& name, Options* o) {
  if (name == "192") {
    o->h.factors = {4, 48};
    o->h.links = {link_gbps(3e-6, 40), link_gbps(5e-6, 6.25, 12.5)};
    o->m.gamma = 4e-12;
  } else if (name == "96") {
    o->h.factors = {6, 16};
    o->h.links = {link_gbps(3e-6, 50), link_gbps(5e-6, 25.0 / 6, 12.5)};
    o->m.gamma = 3.3e-12;
  } else {
    return false;
  }
  o->preset = name;
  return true;
}

/// "1.5G", "64K", "102228128", "1e8" -> bytes; false on junk.
bool parse_bytes(std::string s, double* out) {
  if (s.empty()) return false;
  double mult = 1;
  switch (s.back()) {
    case 'k': case 'K': mult = 1024.0; break;
    case 'm': case 'M': mult = 1024.0 * 1024; break;
    case 'g': case 'G': mult = 1024.0 * 1024 * 1024; break;
    default: break;
  }
  if (mult != 1) s.pop_back();
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || !std::isfinite(v) || v <= 0) return false;
  *out = v * mult;
  return true;
}

bool parse_sizes(const std::string& spec, std::vector<double>* out) {
  out->clear();
  if (spec.find(',') != std::string::npos || spec.find(':') == std::string::npos) {
    size_t i = 0;
    while (i <= spec.size()) {
      const size_t j = std::min(spec.find(',', i), spec.size());
      double v;
      if (!parse_bytes(spec.substr(i, j - i), &v)) return false;
      out->push_back(v);
      i = j + 1;
    }
    return !out->empty();
  }
  const size_t c1 = spec.find(':'), c2 = spec.find(':', c1 + 1);
  double lo, hi, f = 4;
  if (!parse_bytes(spec.substr(0, c1), &lo)) return false;
  if (!parse_bytes(spec.substr(c1 + 1, c2 == std::string::npos ? std::string::npos : c2 - c1 - 1),
                   &hi)) {
    return false;
  }
  if (c2 != std::string::npos) {
    char* end = nullptr;
    const std::string t = spec.substr(c2 + 1);
    f = std::strtod(t.c_str(), &end);
    if (t.empty() || end != t.c_str() + t.size() || !(f > 1)) return false;
  }
  if (hi < lo) return false;
  for (double v = lo; v <= hi * (1 + 1e-12) && out->size() < 1000; v *= f) out->push_back(v);
  return true;
}

std::string human(double bytes) { return human_bytes(bytes, 1); }

double gbps(double beta) { return beta > 0 ? 1e-9 / beta : INFINITY; }

double reduction_pct(double two_level, double bc) {
  return two_level > 0 ? 100.0 * (two_level - bc) / two_level : 0.0;
}

Breakdown run(Algorithm a, const Options& o, double n) {
  switch (a) {
    case Algorithm::two_level: return two_level_allreduce(o.h, n, o.m, o.two);
    case Algorithm::blueconnect: return blueconnect_allreduce(o.h, n, o.m, o.stage);
    default: return evaluate(a, o.h, n, o.m);
  }
}

/// The model with these options that is cheapest (catalogue order on ties, see cheaper()).
Algorithm cheapest(const Options& o, double n, double* t) {
  Algorithm best_a = Algorithm::ring;
  *t = INFINITY;
  for (const ModelEntry& e : models()) {
    const double s = run(e.algo, o, n).seconds();
    if (std::isinf(*t) || cheaper(s, *t)) {
      *t = s;
      best_a = e.algo;
    }
  }
  return best_a;
}

/// Prints the size intervals (on a fine grid, 16 points per doubling, 1 B .. 16 GiB) where
/// pred(n) holds.
template <typename Pred>
void print_ranges(const char* what, Pred pred) {
  std::vector<std::pair<double, double>> ranges;
  bool in = false;
  double first = 0, last = 0;
  for (int k = 0; k <= 34 * 16; ++k) {
    const double n = std::pow(2.0, k / 16.0);
    if (pred(n)) {
      if (!in) first = n;
      in = true;
      last = n;
    } else if (in) {
      ranges.emplace_back(first, last);
      in = false;
    }
  }
  if (in) ranges.emplace_back(first, INFINITY);
  std::printf("%s:", what);
  if (ranges.empty()) std::printf(" none (1 B .. 16 GiB)");
  for (size_t i = 0; i < ranges.size(); ++i) {
    if (std::isinf(ranges[i].second)) {
      std::printf("%s >= %s", i ? "," : "", human(std::round(ranges[i].first)).c_str());
    } else {
      std::printf("%s %s .. %s", i ? "," : "", human(std::round(ranges[i].first)).c_str(),
                  human(std::round(ranges[i].second)).c_str());
    }
  }
  std::printf("\n");
}

void print_stages(const Breakdown& b) {
  std::printf("  %s: %.1f us (latency %.1f, bandwidth %.1f, reduction %.1f)\n",
              std::string(name(b.algo)).c_str(), b.seconds() * 1e6, b.total.latency * 1e6,
              b.total.bandwidth * 1e6, b.total.reduction * 1e6);
  for (const StageCost& s : b.stages) {
    std::printf("    %-24s %-10s level %d  %4d ranks  %12.0f B  %9.1f us"
                "  (lat %.1f, bw %.1f, red %.1f)\n",
                s.what.c_str(), s.how.c_str(), s.level, s.group, s.bytes, s.cost.total() * 1e6,
                s.cost.latency * 1e6, s.cost.bandwidth * 1e6, s.cost.reduction * 1e6);
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  preset("192", &o);
  std::vector<LinkLevel> levels;
  bool have_hierarchy = false, have_gamma = false;
  std::string sizes_spec = "4:1G:4";
  // The preset first, so that explicit options override it wherever they appear.
  for (int i = 1; i + 1 < argc; ++i) {
    if (!std::strcmp(argv[i], "--preset") && !preset(argv[i + 1], &o)) {
      std::fprintf(stderr, "bc_model: unknown preset '%s' (192 or 96)\n", argv[i + 1]);
      return 2;
    }
  }
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i], val;
    const size_t eq = arg.find('=');
    if (arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      val = arg.substr(eq + 1);
      arg.resize(eq);
    } else if (arg == "--help" || arg == "-h") {
      usage(stdout);
      return 0;
    } else if (i + 1 < argc) {
      val = argv[++i];
    } else {
      std::fprintf(stderr, "bc_model: %s needs a value\n", arg.c_str());
      usage(stderr);
      return 2;
    }
    bool ok = true;
    if (arg == "--preset") {
      ok = preset(val, &o);
    } else if (arg == "--hierarchy") {
      auto f = streamcoll::topo::parse_factors(val);
      ok = f.has_value();
      if (ok) o.h.factors = *f;
      have_hierarchy = true;
    } else if (arg == "--level") {
      auto l = parse_level(val);
      ok = l.has_value();
      if (ok) levels.push_back(*l);
    } else if (arg == "--gamma") {
      char* end = nullptr;
      o.m.gamma = std::strtod(val.c_str(), &end);
      ok = !val.empty() && end == val.c_str() + val.size() && std::isfinite(o.m.gamma) &&
           o.m.gamma >= 0;
      have_gamma = true;
    } else if (arg == "--sizes") {
      sizes_spec = val;
    } else if (arg == "--stage") {
      ok = val == "auto" || val == "ring";
      o.stage = val == "ring" ? StageAlgo::ring : StageAlgo::automatic;
    } else if (arg == "--intra") {
      ok = val == "pipelined" || val == "binomial";
      o.two.intra = val == "binomial" ? IntraAlgo::binomial : IntraAlgo::pipelined;
    } else if (arg == "--inter") {
      ok = val == "ring" || val == "rd" || val == "rabenseifner";
      o.two.inter = val == "rd"             ? Algorithm::recursive_doubling
                    : val == "rabenseifner" ? Algorithm::rabenseifner
                                            : Algorithm::ring;
    } else if (arg == "--paper-bytes") {
      ok = parse_bytes(val, &o.paper_bytes);
    } else {
      std::fprintf(stderr, "bc_model: unknown option %s\n", arg.c_str());
      usage(stderr);
      return 2;
    }
    if (!ok) {
      std::fprintf(stderr, "bc_model: bad value for %s: '%s'\n", arg.c_str(), val.c_str());
      return 2;
    }
  }
  if (!levels.empty()) o.h.links = levels;
  if (have_hierarchy && levels.empty() && o.h.links.size() != o.h.factors.size()) {
    std::fprintf(stderr, "bc_model: --hierarchy with %zu levels needs %zu --level options\n",
                 o.h.factors.size(), o.h.factors.size());
    return 2;
  }
  const std::string why = check(o.h);
  if (!why.empty()) {
    std::fprintf(stderr, "bc_model: %s\n", why.c_str());
    return 2;
  }
  if (!parse_sizes(sizes_spec, &o.sizes)) {
    std::fprintf(stderr, "bc_model: bad --sizes '%s'\n", sizes_spec.c_str());
    return 2;
  }
  const bool custom = have_hierarchy || !levels.empty() || have_gamma;

  // ---- the machine ----
  std::string fs;
  for (size_t i = 0; i < o.h.factors.size(); ++i) {
    fs += (i ? "x" : "") + std::to_string(o.h.factors[i]);
  }
  std::printf("# allreduce alpha-beta-gamma model (config/cost_model.hpp)\n");
  std::printf("# machine: %s%s\n", custom ? "custom, based on preset " : "preset ",
              o.preset.c_str());
  std::printf("# hierarchy %s = %d ranks (innermost level first)\n", fs.c_str(), o.h.ranks());
  for (int i = 0; i < o.h.levels(); ++i) {
    const LinkLevel& l = o.h.links[i];
    std::printf("# level %d: %2d ranks per group, alpha %.2f us, %.2f GB/s per rank"
                " (one rank alone: %.2f GB/s)\n",
                i, o.h.factors[i], l.alpha * 1e6, gbps(l.beta), gbps(l.solo()));
  }
  std::printf("# gamma %.3g s/B; blueconnect stages: %s; two-level: %s intra-node reduce and"
              " broadcast, %s among node leaders\n",
              o.m.gamma,
              o.stage == StageAlgo::ring ? "ring" : "halving/doubling for 2^k factors, ring otherwise",
              o.two.intra == IntraAlgo::binomial ? "binomial" : "pipelined",
              std::string(name(o.two.inter)).c_str());

  // ---- the table ----
  // One column per model in the catalogue (times in microseconds), then BlueConnect's
  // reduction of the two-level time and the cheapest model.
  std::printf("\n# allreduce time in microseconds per model; bc vs 2lvl = how much less time"
              " blueconnect takes than two-level\n");
  std::printf("%12s %10s", "bytes", "");
  // A column is as wide as its model's name, at least 12 ("host-transfer" is 13).
  auto width = [](Algorithm a) { return std::max(12, static_cast<int>(name(a).size())); };
  for (const ModelEntry& e : models()) {
    std::printf(" %*s", width(e.algo), std::string(name(e.algo)).c_str());
  }
  std::printf(" %11s  %s\n", "bc vs 2lvl", "best");
  for (double n : o.sizes) {
    std::printf("%12.0f %10s", n, human(n).c_str());
    for (const ModelEntry& e : models()) {
      std::printf(" %*.2f", width(e.algo), run(e.algo, o, n).seconds() * 1e6);
    }
    double tb;
    const Algorithm a = cheapest(o, n, &tb);
    std::printf(" %10.1f%%  %s\n",
                reduction_pct(run(Algorithm::two_level, o, n).seconds(),
                              run(Algorithm::blueconnect, o, n).seconds()),
                std::string(name(a)).c_str());
  }

  // ---- where BlueConnect wins ----
  std::printf("\n");
  print_ranges("blueconnect is the cheapest model", [&](double n) {
    double tb;
    return cheapest(o, n, &tb) == Algorithm::blueconnect;
  });
  print_ranges("blueconnect beats two-level", [&](double n) {
    return run(Algorithm::blueconnect, o, n).seconds() < run(Algorithm::two_level, o, n).seconds();
  });
  print_ranges("blueconnect beats the flat ring", [&](double n) {
    return run(Algorithm::blueconnect, o, n).seconds() < run(Algorithm::ring, o, n).seconds();
  });

  // ---- the paper's size ----
  const double n = o.paper_bytes;
  const Breakdown two = run(Algorithm::two_level, o, n), bc = run(Algorithm::blueconnect, o, n);
  double tb;
  const Algorithm a = cheapest(o, n, &tb);
  std::printf("\nat %.0f B (%s%s): two-level %.1f us, blueconnect %.1f us, reduction %.1f%%;"
              " ring %.1f us; best %s\n",
              n, human(n).c_str(), n == kResNet50Bytes ? ", ResNet-50 fp32 gradient" : "",
              two.seconds() * 1e6, bc.seconds() * 1e6, reduction_pct(two.seconds(), bc.seconds()),
              run(Algorithm::ring, o, n).seconds() * 1e6, std::string(name(a)).c_str());
  print_stages(two);
  print_stages(bc);
  return 0;
}
