// α-β-γ models of allreduce on a link hierarchy; formulas and sources in cost_model.hpp.
#include "config/cost_model.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <limits>

namespace streamcoll::model {

namespace {

constexpr int kMaxRanks = 1 << 24;  // the step scans of rd/Rabenseifner are O(p lg p)
constexpr int kMaxLevels = 64;      // crossed levels travel as a 64-bit mask

bool finite_nonneg(double x) { return std::isfinite(x) && x >= 0; }

/// The slowest links a set of simultaneous messages crosses.
struct Crossing {
  double alpha = 0;
  double beta = 0;
  int level = 0;  ///< the outermost level crossed
};

// Bit i set for every level i >= first with more than one rank: the levels an algorithm
// over all ranks (ordered by hierarchy position) crosses.
uint64_t levels_in_use(const Hierarchy& h, int first = 0) {
  uint64_t mask = 0;
  for (int i = first; i < h.levels(); ++i)
    if (h.factors[i] > 1) mask |= uint64_t{1} << i;
  return mask;
}

Crossing slowest(const Hierarchy& h, uint64_t mask, bool solo_outer) {
  Crossing c;
  for (int i = 0; i < h.levels(); ++i) {
    if (!(mask >> i & 1)) continue;
    const LinkLevel& l = h.links[i];
    c.alpha = std::max(c.alpha, l.alpha);
    c.beta = std::max(c.beta, (solo_outer && i > 0) ? l.solo() : l.beta);
    c.level = i;
  }
  return c;
}

/// Levels crossed by the pairs (real(v), real(v ^ d)) for v in [0, pof2).
template <typename Real>
uint64_t step_mask(const std::vector<int>& f, int pof2, int d, Real real) {
  uint64_t mask = 0;
  for (int v = 0; v < pof2; ++v) {
    const int w = v ^ d;
    if (w < v) continue;
    const int lv = crossed_level(f, real(v), real(w));
    if (lv >= 0) mask |= uint64_t{1} << lv;
  }
  return mask;
}

/// Levels crossed by the pre/post-step pairs (2j, 2j+1), j < rem.
uint64_t pair_mask(const std::vector<int>& f, int rem) {
  uint64_t mask = 0;
  for (int j = 0; j < rem; ++j) {
    const int lv = crossed_level(f, 2 * j, 2 * j + 1);
    if (lv >= 0) mask |= uint64_t{1} << lv;
  }
  return mask;
}

StageCost message_stage(const char* what, const char* how, const Crossing& c, int group,
                        double vec_bytes, double msg_bytes, double reduced_bytes,
                        double gamma) {
  StageCost s;
  s.what = what;
  s.how = how;
  s.level = c.level;
  s.group = group;
  s.bytes = vec_bytes;
  s.cost.latency = c.alpha;
  s.cost.bandwidth = msg_bytes * c.beta;
  s.cost.reduction = reduced_bytes * gamma;
  return s;
}

/// Sums the stages; sets the error and leaves nothing else when the input is rejected.
bool start(Breakdown* b, Algorithm a, const Hierarchy& h, double bytes) {
  b->algo = a;
  b->error = check(h);
  if (b->error.empty() && !(std::isfinite(bytes) && bytes >= 0)) b->error = "bytes must be >= 0";
  return b->error.empty();
}

void finish(Breakdown* b) {
  b->total = Cost{};
  for (const StageCost& s : b->stages) b->total += s.cost;
}

/// A hierarchy of levels 1..k of h with every β replaced by β_solo (one leader per node).
Hierarchy leaders_of(const Hierarchy& h) {
  Hierarchy o;
  for (int i = 1; i < h.levels(); ++i) {
    o.factors.push_back(h.factors[i]);
    LinkLevel l = h.links[i];
    l.beta = l.solo();
    l.beta_solo = l.beta;
    o.links.push_back(l);
  }
  return o;
}

bool parse_double(std::string_view s, double* out) {
  if (s.empty() || s.size() > 64) return false;
  const std::string t(s);
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size() || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

}  // namespace

// ---- small pieces -----------------------------------------------------------------------

double beta_from_gbps(double gbytes_per_s) {
  return gbytes_per_s > 0 ? 1.0 / (gbytes_per_s * 1e9) : 0.0;
}

LinkLevel link_gbps(double alpha_s, double gbytes_per_s, double solo_gbytes_per_s) {
  LinkLevel l;
  l.alpha = alpha_s;
  l.beta = beta_from_gbps(gbytes_per_s);
  l.beta_solo = beta_from_gbps(solo_gbytes_per_s);
  return l;
}

int Hierarchy::ranks() const {
  long long p = 1;
  for (int f : factors) {
    p *= f;
    if (p > kMaxRanks || p < 1) return -1;
  }
  return static_cast<int>(p);
}

Cost& Cost::operator+=(const Cost& o) {
  latency += o.latency;
  bandwidth += o.bandwidth;
  reduction += o.reduction;
  return *this;
}

double Breakdown::seconds() const {
  return error.empty() ? total.total() : std::numeric_limits<double>::infinity();
}

std::string check(const Hierarchy& h) {
  if (h.factors.empty()) return "the hierarchy has no level";
  if (h.levels() > kMaxLevels) return "more than 64 levels";
  if (h.links.size() != h.factors.size()) {
    return "one link level per hierarchy level is needed (" + std::to_string(h.factors.size()) +
           " levels, " + std::to_string(h.links.size()) + " links)";
  }
  for (int i = 0; i < h.levels(); ++i) {
    if (h.factors[i] < 1) return "factor " + std::to_string(i) + " is < 1";
    const LinkLevel& l = h.links[i];
    if (!finite_nonneg(l.alpha) || !finite_nonneg(l.beta) || !finite_nonneg(l.beta_solo)) {
      return "link level " + std::to_string(i) + ": α and β must be finite and >= 0";
    }
  }
  if (h.ranks() < 1) return "more than 2^24 ranks";
  return {};
}

std::optional<LinkLevel> parse_level(std::string_view s) {
  double v[3] = {0, 0, 0};
  int n = 0;
  while (true) {
    const size_t c = s.find(':');
    if (n == 3 || !parse_double(s.substr(0, c), &v[n])) return std::nullopt;
    ++n;
    if (c == std::string_view::npos) break;
    s.remove_prefix(c + 1);
  }
  if (n < 2 || v[0] < 0 || v[1] <= 0 || (n == 3 && v[2] <= 0)) return std::nullopt;
  return link_gbps(v[0], v[1], n == 3 ? v[2] : 0);
}

std::string_view name(Algorithm a) {
  switch (a) {
    case Algorithm::ring: return "ring";
    case Algorithm::recursive_doubling: return "rd";
    case Algorithm::rabenseifner: return "rabenseifner";
    case Algorithm::two_level: return "two-level";
    case Algorithm::blueconnect: return "blueconnect";
    case Algorithm::binary_tree: return "tree";
    case Algorithm::double_binary_tree: return "double-tree";
    case Algorithm::host_transfer: return "host-transfer";
    case Algorithm::nvgroup: return "nvgroup";
    case Algorithm::ccube: return "ccube";
  }
  return "?";
}

std::string human_bytes(double bytes, int decimals) {
  const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  const bool whole = std::fabs(bytes - std::round(bytes)) < 1e-9;
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*f %s", whole ? 0 : std::clamp(decimals, 0, 9), bytes,
                unit[u]);
  return buf;
}

bool is_pow2(int p) { return p >= 1 && (p & (p - 1)) == 0; }

int floor_log2(int p) {
  int k = 0;
  while ((p >>= 1) > 0) ++k;
  return k;
}

int ceil_log2(int p) { return p <= 1 ? 0 : floor_log2(p - 1) + 1; }

int crossed_level(const std::vector<int>& factors, int a, int b) {
  if (a == b) return -1;
  long long stride = 1;
  for (int i = 0; i < static_cast<int>(factors.size()); ++i) {
    stride *= factors[i];
    if (a / stride == b / stride) return i;
  }
  return static_cast<int>(factors.size()) - 1;
}

// ---- stage helpers ----------------------------------------------------------------------

Cost ring_reduce_scatter(int p, double s, const LinkLevel& l, double beta, double gamma) {
  Cost c;
  if (p <= 1 || s <= 0) return c;
  const double frac = double(p - 1) / p;
  c.latency = (p - 1) * l.alpha;
  c.bandwidth = frac * s * beta;
  c.reduction = frac * s * gamma;
  return c;
}

Cost ring_all_gather(int p, double s, const LinkLevel& l, double beta) {
  Cost c = ring_reduce_scatter(p, s, l, beta, 0);
  c.reduction = 0;
  return c;
}

Cost halving_reduce_scatter(int p, double s, const LinkLevel& l, double beta, double gamma) {
  Cost c = ring_reduce_scatter(p, s, l, beta, gamma);
  c.latency = floor_log2(p > 1 ? p : 1) * l.alpha;
  if (p <= 1 || s <= 0) c.latency = 0;
  return c;
}

Cost doubling_all_gather(int p, double s, const LinkLevel& l, double beta) {
  Cost c = halving_reduce_scatter(p, s, l, beta, 0);
  c.reduction = 0;
  return c;
}

// ---- the models -------------------------------------------------------------------------

Breakdown ring_allreduce(const Hierarchy& h, double bytes, const Machine& m) {
  Breakdown b;
  if (!start(&b, Algorithm::ring, h, bytes)) return b;
  const int p = h.ranks();
  if (p > 1 && bytes > 0) {
    const Crossing c = slowest(h, levels_in_use(h), /*solo_outer=*/true);
    const LinkLevel l{c.alpha, c.beta, 0};
    StageCost rs{"reduce-scatter", "ring", c.level, p, bytes,
                 ring_reduce_scatter(p, bytes, l, c.beta, m.gamma)};
    StageCost ag{"all-gather", "ring", c.level, p, bytes, ring_all_gather(p, bytes, l, c.beta)};
    b.stages.push_back(rs);
    b.stages.push_back(ag);
  }
  finish(&b);
  return b;
}

// The frame of Thakur, Rabenseifner and Gropp for p not a power of two: the first 2r
// ranks pair up (pre-step: one hands its vector to the other), the p' = 2^⌊lg p⌋ that go
// on run `steps(pof2, real, add)` (real(v): the rank playing virtual rank v; add(name,
// how, crossing, message, reduced) appends one exchange), then the post-step sends the
// result back.
template <class Steps>
Breakdown pow2_frame(Algorithm algo, const Hierarchy& h, double bytes, const Machine& m,
                     Steps steps) {
  Breakdown b;
  if (!start(&b, algo, h, bytes)) return b;
  const int p = h.ranks();
  if (p > 1 && bytes > 0) {
    const int pof2 = 1 << floor_log2(p), rem = p - pof2;
    auto real = [rem](int v) { return v < rem ? 2 * v + 1 : v + rem; };
    auto add = [&](const char* what, const char* how, const Crossing& c, double msg,
                   double reduced) {
      b.stages.push_back(message_stage(what, how, c, 2, bytes, msg, reduced, m.gamma));
    };
    const Crossing pre = slowest(h, pair_mask(h.factors, rem), false);
    if (rem > 0) add("pre-step", "send", pre, bytes, bytes);
    steps(pof2, real, add);
    if (rem > 0) add("post-step", "send", pre, bytes, 0);
  }
  finish(&b);
  return b;
}

Breakdown recursive_doubling_allreduce(const Hierarchy& h, double bytes, const Machine& m) {
  return pow2_frame(Algorithm::recursive_doubling, h, bytes, m, [&](int pof2, auto real, auto add) {
    for (int d = 1; d < pof2; d *= 2) {
      const Crossing c = slowest(h, step_mask(h.factors, pof2, d, real), false);
      add("exchange", "rd", c, bytes, bytes);
    }
  });
}

Breakdown rabenseifner_allreduce(const Hierarchy& h, double bytes, const Machine& m) {
  return pow2_frame(Algorithm::rabenseifner, h, bytes, m, [&](int pof2, auto real, auto add) {
    for (int d = pof2 / 2; d >= 1; d /= 2) {
      const Crossing c = slowest(h, step_mask(h.factors, pof2, d, real), false);
      add("reduce-scatter", "halving", c, bytes * d / pof2, bytes * d / pof2);
    }
    for (int d = 1; d < pof2; d *= 2) {
      const Crossing c = slowest(h, step_mask(h.factors, pof2, d, real), false);
      add("all-gather", "doubling", c, bytes * d / pof2, 0);
    }
  });
}

Breakdown two_level_allreduce(const Hierarchy& h, double bytes, const Machine& m,
                              const TwoLevelOptions& opt) {
  Breakdown b;
  if (!start(&b, Algorithm::two_level, h, bytes)) return b;
  if (opt.inter != Algorithm::ring && opt.inter != Algorithm::recursive_doubling &&
      opt.inter != Algorithm::rabenseifner) {
    b.error = "the leaders' allreduce must be ring, rd or rabenseifner";
    return b;
  }
  const int p = h.ranks(), p0 = h.factors[0];
  if (p <= 1 || bytes <= 0) {
    finish(&b);
    return b;
  }
  const LinkLevel& l0 = h.links[0];
  StageCost reduce{"reduce", "", 0, p0, bytes, {}};
  StageCost bcast{"broadcast", "", 0, p0, bytes, {}};
  if (p0 > 1) {
    if (opt.intra == IntraAlgo::pipelined) {
      reduce.how = bcast.how = "pipelined";
      reduce.cost = {(p0 - 1) * l0.alpha, bytes * l0.beta, bytes * m.gamma};
      bcast.cost = {(p0 - 1) * l0.alpha, bytes * l0.beta, 0};
    } else {
      reduce.how = bcast.how = "binomial";
      const int steps = ceil_log2(p0);
      reduce.cost = {steps * l0.alpha, steps * bytes * l0.beta, steps * bytes * m.gamma};
      bcast.cost = {steps * l0.alpha, steps * bytes * l0.beta, 0};
    }
    b.stages.push_back(reduce);
  }
  if (h.levels() > 1 && p / p0 > 1) {
    const Hierarchy leaders = leaders_of(h);
    Breakdown inter;
    switch (opt.inter) {
      case Algorithm::recursive_doubling:
        inter = recursive_doubling_allreduce(leaders, bytes, m);
        break;
      case Algorithm::rabenseifner: inter = rabenseifner_allreduce(leaders, bytes, m); break;
      default: inter = ring_allreduce(leaders, bytes, m); break;
    }
    for (StageCost s : inter.stages) {
      s.level += 1;
      s.what = "leaders " + s.what;
      b.stages.push_back(s);
    }
  }
  if (p0 > 1) b.stages.push_back(bcast);
  finish(&b);
  return b;
}

Breakdown blueconnect_allreduce(const Hierarchy& h, double bytes, const Machine& m,
                                StageAlgo algo) {
  Breakdown b;
  if (!start(&b, Algorithm::blueconnect, h, bytes)) return b;
  if (h.ranks() > 1 && bytes > 0) {
    std::vector<StageCost> up, down;
    double seg = bytes;
    for (int i = 0; i < h.levels(); ++i) {
      const int pi = h.factors[i];
      if (pi <= 1) continue;
      const LinkLevel& l = h.links[i];
      const bool hd = algo == StageAlgo::automatic && is_pow2(pi);
      StageCost rs{"reduce-scatter", hd ? "halving" : "ring", i, pi, seg,
                   hd ? halving_reduce_scatter(pi, seg, l, l.beta, m.gamma)
                      : ring_reduce_scatter(pi, seg, l, l.beta, m.gamma)};
      StageCost ag{"all-gather", hd ? "doubling" : "ring", i, pi, seg,
                   hd ? doubling_all_gather(pi, seg, l, l.beta)
                      : ring_all_gather(pi, seg, l, l.beta)};
      up.push_back(rs);
      down.push_back(ag);
      seg /= pi;
    }
    b.stages = up;
    b.stages.insert(b.stages.end(), down.rbegin(), down.rend());
  }
  finish(&b);
  return b;
}

namespace {

/// The power of two in 1..PipelineOptions::kMaxChunks with the cheapest seconds(chunks)
/// (the smallest of equals, cheaper()).
template <typename F>
int best_chunks(F seconds) {
  int best = 1;
  double best_t = seconds(1);
  for (int c = 2; c <= PipelineOptions::kMaxChunks; c *= 2) {
    const double t = seconds(c);
    if (cheaper(t, best_t)) {
      best_t = t;
      best = c;
    }
  }
  return best;
}

/// The reduce-up / broadcast-down tree allreduce; `trees` = 1 (binary) or 2 (double
/// binary: each tree carries n/2, so per rank the per-phase load halves).
Breakdown tree_allreduce(Algorithm a, int trees, const Hierarchy& h, double bytes,
                         const Machine& m) {
  Breakdown b;
  if (!start(&b, a, h, bytes)) return b;
  const int p = h.ranks();
  if (p > 1 && bytes > 0) {
    const Crossing c = slowest(h, levels_in_use(h), /*solo_outer=*/true);
    const int height = floor_log2(p);
    // Per phase an inner node moves 2 (children) x n/trees bytes through its port.
    const double load = 2.0 * bytes / trees;
    const char* how = trees == 1 ? "tree" : "double-tree";
    StageCost up{"reduce", how, c.level, p, bytes,
                 Cost{height * c.alpha, load * c.beta, load * m.gamma}};
    StageCost down{"broadcast", how, c.level, p, bytes, Cost{height * c.alpha, load * c.beta, 0}};
    b.stages.push_back(up);
    b.stages.push_back(down);
  }
  finish(&b);
  return b;
}

}  // namespace

Breakdown binary_tree_allreduce(const Hierarchy& h, double bytes, const Machine& m) {
  return tree_allreduce(Algorithm::binary_tree, 1, h, bytes, m);
}

Breakdown double_binary_tree_allreduce(const Hierarchy& h, double bytes, const Machine& m) {
  return tree_allreduce(Algorithm::double_binary_tree, 2, h, bytes, m);
}

Breakdown host_transfer_allreduce(const Hierarchy& h, double bytes, const Machine& m) {
  Breakdown b;
  if (!start(&b, Algorithm::host_transfer, h, bytes)) return b;
  if (!(finite_nonneg(m.copy_alpha) && finite_nonneg(m.copy_beta))) {
    b.error = "copy α and β must be finite and >= 0";
    return b;
  }
  if (h.ranks() > 1 && bytes > 0) {
    const Breakdown rd = recursive_doubling_allreduce(h, bytes, m);
    const Breakdown rab = rabenseifner_allreduce(h, bytes, m);
    const Breakdown& host = cheaper(rab.seconds(), rd.seconds()) ? rab : rd;
    const Cost copy{m.copy_alpha, bytes * m.copy_beta, 0};
    b.stages.push_back(StageCost{"d2h copy", "copy", 0, 1, bytes, copy});
    for (StageCost s : host.stages) {
      s.what = "host " + s.what;
      b.stages.push_back(s);
    }
    b.stages.push_back(StageCost{"h2d copy", "copy", 0, 1, bytes, copy});
  }
  finish(&b);
  return b;
}

Breakdown nvgroup_allreduce(const Hierarchy& h, double bytes, const Machine& m,
                            const NVGroupOptions& opt) {
  Breakdown b;
  if (!start(&b, Algorithm::nvgroup, h, bytes)) return b;
  if (opt.chunks < 0 || opt.chunks > PipelineOptions::kMaxChunks) {
    b.error = "nvgroup: chunks must be 0 (best) or 1.." +
              std::to_string(PipelineOptions::kMaxChunks);
    return b;
  }
  const int p = h.ranks(), g = h.factors[0], q = p / g;
  if (p <= 1 || bytes <= 0) {
    finish(&b);
    return b;
  }
  const LinkLevel& l0 = h.links[0];
  const Crossing x = slowest(h, levels_in_use(h, 1), /*solo_outer=*/false);
  const double gf = double(g - 1) / g, qf = double(q - 1) / q;

  // The stages of one chunk of c bytes.
  struct Chunk {
    Cost rs, ring_rs, ring_ag, st;
    Cost nvlink() const {
      Cost c = rs;
      c += st;
      return c;
    }
    Cost ring() const {
      Cost c = ring_rs;
      c += ring_ag;
      return c;
    }
  };
  auto chunk = [&](double c) {
    Chunk k;
    if (g > 1) {
      k.rs = Cost{l0.alpha, gf * c * l0.a2a(), gf * c * m.gamma};
      k.st = Cost{l0.alpha, gf * c * l0.a2a(), 0};
    }
    if (q > 1) {
      k.ring_rs = Cost{(q - 1) * x.alpha, qf * (c / g) * x.beta, qf * (c / g) * m.gamma};
      k.ring_ag = Cost{(q - 1) * x.alpha, qf * (c / g) * x.beta, 0};
    }
    return k;
  };
  // T(C) for C chunks; *k: one chunk's stages, *neck_net: whether the network (the ring)
  // is the bottleneck rather than the NVLinks.
  auto total = [&](int chunks, Chunk* k, bool* neck_net) {
    *k = chunk(bytes / chunks);
    const Cost nv = k->nvlink(), net = k->ring();
    *neck_net = net.total() > nv.total();
    return nv.total() + net.total() + (chunks - 1) * (*neck_net ? net : nv).total();
  };
  int chunks = opt.chunks;
  if (chunks == 0) {
    // One group or g = 1: one resource, so chunking only adds start-ups.
    chunks = 1;
    if (g > 1 && q > 1) {
      Chunk k;
      bool neck_net;
      chunks = best_chunks([&](int c) { return total(c, &k, &neck_net); });
    }
  }
  Chunk k;
  bool neck_net;
  total(chunks, &k, &neck_net);
  const double c = bytes / chunks;
  if (g > 1) b.stages.push_back(StageCost{"load-reduce", "ipc", 0, g, c, k.rs});
  if (q > 1) {
    b.stages.push_back(StageCost{"reduce-scatter", "ring", x.level, q, c / g, k.ring_rs});
    b.stages.push_back(StageCost{"all-gather", "ring", x.level, q, c / g, k.ring_ag});
  }
  if (g > 1) b.stages.push_back(StageCost{"store", "ipc", 0, g, c, k.st});
  if (chunks > 1) {
    const Cost neck = neck_net ? k.ring() : k.nvlink();
    const Cost rest{(chunks - 1) * neck.latency, (chunks - 1) * neck.bandwidth,
                    (chunks - 1) * neck.reduction};
    b.stages.push_back(StageCost{"pipeline", std::to_string(chunks - 1) + " chunks",
                                 neck_net ? x.level : 0, p, c, rest});
  }
  finish(&b);
  return b;
}

Breakdown nvgroup_allreduce(const Hierarchy& h, double bytes, const Machine& m) {
  return nvgroup_allreduce(h, bytes, m, NVGroupOptions{});
}

Breakdown ccube_allreduce(const Hierarchy& h, double bytes, const Machine& m,
                          const CcubeOptions& opt) {
  Breakdown b;
  if (!start(&b, Algorithm::ccube, h, bytes)) return b;
  if (opt.chunks < 0 || opt.chunks > PipelineOptions::kMaxChunks) {
    b.error = "ccube: chunks must be 0 (best) or 1.." + std::to_string(PipelineOptions::kMaxChunks);
    return b;
  }
  const int p = h.ranks(), g = h.factors[0], q = p / g;
  if (p <= 1 || bytes <= 0) {
    finish(&b);
    return b;
  }
  const int depth = floor_log2(g) + floor_log2(q);
  const int kids = (g > 1 ? std::min(g - 1, 2) : 0) + (q > 1 ? std::min(q - 1, 2) : 0);
  const Crossing x = slowest(h, levels_in_use(h), /*solo_outer=*/true);
  // One round of chunks of c bytes.
  auto round = [&](double c) { return Cost{x.alpha, 3 * c * x.beta, kids * c * m.gamma}; };
  auto total = [&](int chunks) { return (chunks + 2 * depth - 1) * round(bytes / chunks).total(); };
  const int chunks = opt.chunks ? opt.chunks : best_chunks(total);
  const Cost r = round(bytes / chunks);
  const int rounds = chunks + 2 * depth - 1;
  b.stages.push_back(StageCost{"pipeline", std::to_string(chunks) + " chunks, " +
                                               std::to_string(rounds) + " rounds",
                               x.level, p, bytes / chunks,
                               Cost{rounds * r.latency, rounds * r.bandwidth, rounds * r.reduction}});
  finish(&b);
  return b;
}

Breakdown ccube_allreduce(const Hierarchy& h, double bytes, const Machine& m) {
  return ccube_allreduce(h, bytes, m, CcubeOptions{});
}

// ---- the catalogue ----------------------------------------------------------------------

namespace {
Breakdown two_level_default(const Hierarchy& h, double n, const Machine& m) {
  return two_level_allreduce(h, n, m);
}
Breakdown blueconnect_default(const Hierarchy& h, double n, const Machine& m) {
  return blueconnect_allreduce(h, n, m);
}
Breakdown nvgroup_default(const Hierarchy& h, double n, const Machine& m) {
  return nvgroup_allreduce(h, n, m);
}
Breakdown ccube_default(const Hierarchy& h, double n, const Machine& m) {
  return ccube_allreduce(h, n, m);
}
}  // namespace

const std::vector<ModelEntry>& models() {
  static const std::vector<ModelEntry> all = {
      {Algorithm::ring, ring_allreduce},
      {Algorithm::recursive_doubling, recursive_doubling_allreduce},
      {Algorithm::rabenseifner, rabenseifner_allreduce},
      {Algorithm::two_level, two_level_default},
      {Algorithm::blueconnect, blueconnect_default},
      {Algorithm::binary_tree, binary_tree_allreduce},
      {Algorithm::double_binary_tree, double_binary_tree_allreduce},
      {Algorithm::host_transfer, host_transfer_allreduce},
      {Algorithm::nvgroup, nvgroup_default},
      {Algorithm::ccube, ccube_default},
  };
  return all;
}

Breakdown evaluate(Algorithm a, const Hierarchy& h, double bytes, const Machine& m) {
  for (const ModelEntry& e : models()) {
    if (e.algo == a) return e.fn(h, bytes, m);
  }
  Breakdown b;
  b.algo = a;
  b.error = "no such model";
  return b;
}

namespace {

template <typename Wins>
std::optional<double> bisect(double lo, double hi, Wins a_wins, const bool& bad) {
  if (!(std::isfinite(lo) && std::isfinite(hi)) || !(lo > 0 && lo < hi)) return std::nullopt;
  if (!a_wins(lo) || bad) return std::nullopt;
  if (a_wins(hi) || bad) return std::nullopt;
  // Invariant: a wins at lo, not at hi. Geometric midpoints: sizes span many decades.
  for (int it = 0; it < 400 && hi > lo * (1 + 1e-12); ++it) {
    const double mid = std::sqrt(lo) * std::sqrt(hi);
    if (!(mid > lo && mid < hi)) break;
    (a_wins(mid) ? lo : hi) = mid;
  }
  if (bad) return std::nullopt;  // a model rejected a size inside the range
  return lo;
}

}  // namespace

std::optional<double> crossover(ModelFn a, ModelFn b, const Hierarchy& h, const Machine& m,
                                double lo, double hi) {
  if (a == nullptr || b == nullptr) return std::nullopt;
  bool bad = false;
  auto a_wins = [&](double n) {
    const Breakdown x = a(h, n, m), y = b(h, n, m);
    if (!x.error.empty() || !y.error.empty()) bad = true;
    return cheaper(x.seconds(), y.seconds());
  };
  return bisect(lo, hi, a_wins, bad);
}

std::optional<double> crossover_times(const TimeFn& a, const TimeFn& b, double lo,
                                      double hi) {
  if (!a || !b) return std::nullopt;
  bool bad = false;
  auto a_wins = [&](double n) {
    const double x = a(n), y = b(n);
    if (!std::isfinite(x) || !std::isfinite(y)) bad = true;
    return cheaper(x, y);
  };
  return bisect(lo, hi, a_wins, bad);
}

std::optional<double> crossover(Algorithm a, Algorithm b, const Hierarchy& h,
                                const Machine& m, double lo, double hi) {
  ModelFn fa = nullptr, fb = nullptr;
  for (const ModelEntry& e : models()) {
    if (e.algo == a) fa = e.fn;
    if (e.algo == b) fb = e.fn;
  }
  return crossover(fa, fb, h, m, lo, hi);
}

bool cheaper(double a_seconds, double b_seconds) {
  return a_seconds < b_seconds - 1e-9 * std::fabs(b_seconds);
}

Breakdown best(const Hierarchy& h, double bytes, const Machine& m) {
  Breakdown top;
  bool have = false;
  for (const ModelEntry& e : models()) {
    Breakdown b = e.fn(h, bytes, m);
    if (!b.error.empty()) return b;
    if (!have || cheaper(b.seconds(), top.seconds())) {
      top = std::move(b);
      have = true;
    }
  }
  return top;
}

}  // namespace streamcoll::model
