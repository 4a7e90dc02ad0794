// α-β(-γ) cost model of allreduce on a link hierarchy: flat ring, recursive doubling,
// Rabenseifner, the two-level (reduce / leaders' allreduce / broadcast) scheme,
// BlueConnect, the binary and double binary trees, host-transfer and NV-Group, and the
// cheapest of them for a given size. Pure: no MPI, no CUDA, no other
// project header, so tools can link it or compile it alone.
//
// Units everywhere: bytes (per rank, the size of the allreduce vector), seconds.
// A point-to-point message of m bytes over link level i costs α_i + m·β_i; reducing m
// bytes into a buffer costs m·γ.
//
// Sources
//   [BC]  M. Cho, U. Finkler, D. Kung, H. Hunter, "BlueConnect: Decomposing All-Reduce for
//         Deep Learning on Heterogeneous Network Hierarchy", SysML 2019, section 3
//         (eqs. 5-7: p = p0·p1·…·pk; the all-reduce as k+1 reduce-scatter stages up the
//         levels and k+1 all-gather stages down, stage i among p_i ranks on level i's
//         links over n/(p0·…·p_{i-1}) bytes).
//   [TRG] R. Thakur, R. Rabenseifner, W. Gropp, "Optimization of Collective Communication
//         Operations in MPICH", IJHPCA 19(1), 2005, allreduce section (ring, recursive
//         doubling, Rabenseifner, the non-power-of-two pre- and post-steps).
//   [JIA] X. Jia et al., "Highly Scalable Deep Learning Training System with
//         Mixed-Precision", arXiv 1807.11205, 2018 (hierarchical all-reduce: intra-node
//         reduce to a master, inter-node ring all-reduce among masters, intra-node
//         broadcast).
//   [SST] P. Sanders, J. Speck, J. L. Träff, "Two-tree algorithms for full bandwidth
//         broadcast, reduction and scan", Parallel Computing 35(12), 2009 (a pipelined
//         binary tree needs ~2nβ per reduction or broadcast, since an inner node talks to
//         two children through one port; two trees, each on half the data, with every
//         rank inner in at most one of them, get to ~nβ).
//   [NCCL] S. Jeaugey, "Massively Scale Your Deep Learning Training with NCCL 2.4",
//         NVIDIA developer blog, 2019 (double binary trees: allreduce as a pipelined
//         reduce up and broadcast down two complementary binary trees, each carrying half
//         of the data; logarithmic latency, full bandwidth).
//   [CC]  M. Jo, J. Son, J. Kim et al. (KAIST), "C-Cube", section III: a tree allreduce
//         whose broadcast down overlaps its reduction up chunk by chunk, the logical tree
//         mapped onto the physical topology (edges inside a node first, one per node
//         across). As for [NVG] and [BC], the text was not at hand: the cost below is
//         derived for algorithms/schedule.cpp's ccube schedule, not transcribed.
//   [AL]  N. Dryden, N. Maruyama, T. Moon, T. Benson, A. Yoo, M. Snir, B. Van Essen,
//         "Aluminum: An Asynchronous, GPU-Aware Communication Library Optimized for
//         Large-Scale Training of Deep Neural Networks on HPC Systems", MLHPC 2018,
//         section III-B (host-transfer allreduce: copy the GPU buffer to the host, run
//         MPI's host allreduce, copy the result back).
//   [NVG] C.-H. Chu, P. Kousha, A. A. Awan, K. S. Khorassani, H. Subramoni, D. K. Panda,
//         "NV-Group: Link-Efficient Reduction for Distributed Deep Learning on Modern Dense
//         GPU Systems", ICS 2020, section 4 (GPUs that share NVLink form a group; a
//         persistent cooperative kernel on every member loads its peers' data over CUDA
//         IPC, reduces and stores the result back, so all of a GPU's links work at once;
//         a ring runs across the groups; the vector is cut into chunks so that the
//         intra-group and inter-group work overlap) and its cost model, eqs. 7-10.
// The text of [NVG] beyond its title and authors was not reachable either, so
// nvgroup_allreduce is derived from the design as described above (and in DESIGN.md), in
// this file's α-β-γ terms and pipeline convention; it is not a transcription of eqs. 7-10.
// The text of [BC] beyond its abstract was not reachable while this was written, so the
// stage costs below are the standard forms derived from its section 3 construction (and
// the decomposition already implemented in algorithms/blueconnect_plan.hpp), not
// transcriptions of its equations; the two-level baseline is the [JIA] scheme, which is
// what "two-level" usually denotes in this literature. See bench/results/
// blueconnect_model_192gpus.txt for the comparison with the paper's 87 % claim.
//
// Rank layout (all flat algorithms): communicator rank = hierarchy position, innermost
// coordinate fastest (rank = c0 + p0·(c1 + p1·(c2 + …))), i.e. ranks numbered node by
// node. Two ranks talk over the outermost level on which their coordinates differ.
//
// Bandwidth sharing (the one modelling choice that decides most comparisons): a level's
// links are shared by the ranks below them (a node's NICs by its GPUs).
//   β       s/byte one rank gets on level i when every rank of its level-(i-1) group
//           sends across level i at once (BlueConnect's stages, recursive doubling and
//           Rabenseifner steps);
//   β_solo  s/byte when only one rank per group crosses level i (the flat ring, which
//           leaves and enters each node once; the two-level scheme's leaders). Default:
//           equal to β (as with a link per rank, e.g. a NIC per GPU); set it when one
//           rank alone can use more than its share (it favours ring and two-level).
// Level 0 has no group below it, so only its β is used.
//
// Adding a model: write one function with the ModelFn signature (the stage helpers below
// build it from pieces), add an Algorithm value and a line in models(); best() and
// bc_model pick it up.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace streamcoll::model {

/// One level of links. alpha: seconds per message; beta: seconds per byte (see the
/// sharing rule above); beta_solo: seconds per byte with one rank per group crossing
/// (0 = same as beta); beta_a2a: seconds per byte a rank gets when it talks to all the
/// other ranks of its group at once, every one of its links busy (NV-Group's intra-group
/// load/store; 0 = same as beta, i.e. no more than the one link a ring uses).
struct LinkLevel {
  double alpha = 0;
  double beta = 0;
  double beta_solo = 0;
  double beta_a2a = 0;

  double solo() const { return beta_solo > 0 ? beta_solo : beta; }
  double a2a() const { return beta_a2a > 0 ? beta_a2a : beta; }
};

/// Seconds per byte of a bandwidth in GB/s (1 GB = 1e9 bytes); 0 for a non-positive input.
double beta_from_gbps(double gbytes_per_s);
/// A link level from α in seconds and bandwidths in GB/s (solo 0 = same as shared).
LinkLevel link_gbps(double alpha_s, double gbytes_per_s, double solo_gbytes_per_s = 0);

/// A link hierarchy: factors p0..pk innermost first ("4x48": 4 GPUs per node, 48 nodes),
/// links[i] the links that level i's stage uses. ranks() = p0·…·pk.
struct Hierarchy {
  std::vector<int> factors;
  std::vector<LinkLevel> links;

  int ranks() const;
  int levels() const { return static_cast<int>(factors.size()); }
};

/// The machine outside the links: gamma = seconds to reduce one byte (read two operands,
/// write one) on the device that reduces; copy_alpha / copy_beta = the start-up (s) and
/// the time per byte (s/B) of one device<->host copy, used by the host-transfer model only
/// (defaults: 10 µs, 12 GB/s, a PCIe 3.0 x16 copy from pinned memory). Machine{g} still
/// sets gamma alone.
struct Machine {
  double gamma = 0;
  double copy_alpha = 10e-6;
  double copy_beta = 1.0 / 12e9;
};

/// Empty when h is usable (at least one level, every factor >= 1, one link per level,
/// finite non-negative α and β, at most 64 levels and 2^24 ranks); otherwise the reason.
std::string check(const Hierarchy& h);

/// "ALPHA:GBPS" or "ALPHA:GBPS:SOLO_GBPS" (seconds, GB/s) -> a link level; nullopt on junk.
std::optional<LinkLevel> parse_level(std::string_view s);

/// How a BlueConnect stage runs inside its group of p_i ranks.
enum class StageAlgo {
  automatic,  ///< recursive halving/doubling for a power-of-two p_i, ring otherwise
              ///< (what algorithms/blueconnect_plan does by default)
  ring,       ///< always the ring (blueconnect_plan's ring_only)
};

/// The intra-node reduce and broadcast of the two-level scheme.
enum class IntraAlgo {
  pipelined,  ///< pipelined chain (NCCL's ring reduce/broadcast), ideal pipelining:
              ///< reduce (p0-1)α + nβ + nγ, broadcast (p0-1)α + nβ
  binomial,   ///< binomial tree: ⌈lg p0⌉(α + nβ + nγ), broadcast ⌈lg p0⌉(α + nβ)
};

/// The three terms of a time, in seconds.
struct Cost {
  double latency = 0;    ///< message start-ups (α terms)
  double bandwidth = 0;  ///< bytes on the critical path times β
  double reduction = 0;  ///< bytes reduced on the critical path times γ

  double total() const { return latency + bandwidth + reduction; }
  Cost& operator+=(const Cost& o);
};

/// One phase of an algorithm as a tool prints it.
struct StageCost {
  std::string what;   ///< "reduce-scatter", "all-gather", "exchange" (a recursive-doubling
                      ///< step), "reduce", "broadcast", "pre-step", "post-step"; the
                      ///< two-level leaders' phases are prefixed "leaders "
  std::string how;    ///< "ring", "halving", "doubling", "rd", "send", "pipelined", "binomial"
  int level = 0;      ///< the outermost link level it uses (one per step for rd/Rabenseifner)
  int group = 1;      ///< ranks taking part in one instance
  double bytes = 0;   ///< the vector (segment) the phase works on, per rank
  Cost cost;
};

enum class Algorithm {
  ring,
  recursive_doubling,
  rabenseifner,
  two_level,
  blueconnect,
  binary_tree,
  double_binary_tree,
  host_transfer,
  nvgroup,
  ccube,
};
/// "ring", "rd", "rabenseifner", "two-level", "blueconnect", "tree", "double-tree",
/// "host-transfer", "nvgroup", "ccube"
std::string_view name(Algorithm a);

/// A modelled allreduce: its phases in order and their sum.
struct Breakdown {
  Algorithm algo = Algorithm::ring;
  std::vector<StageCost> stages;
  Cost total;        ///< sum of stages[i].cost
  std::string error; ///< non-empty (and seconds() infinite) when the input was rejected

  double seconds() const;
};

// ---- the models (n = bytes per rank; p = h.ranks(); 0 bytes or p = 1 cost nothing) ----

/// Flat ring over all p ranks (reduce-scatter + all-gather, [TRG]):
///   2(p-1)·α* + 2(p-1)/p·n·β* + (p-1)/p·n·γ
/// Every step all ranks send n/p bytes to the next rank at once and the step ends with
/// the slowest: α* = the largest α, β* the largest of (level 0: β; outer levels: β_solo)
/// over the levels the ring crosses (every level with p_i > 1, the ring being ordered by
/// rank). Latency and bandwidth are maximised separately (a pipelined ring is bound by
/// the worst of each).
Breakdown ring_allreduce(const Hierarchy& h, double bytes, const Machine& m);

/// Recursive doubling ([TRG], short messages): ⌊lg p⌋ exchanges of the whole vector,
///   Σ_steps (α_s + n·β_s + n·γ), p a power of two: lg p·(α + nβ + nγ),
/// plus, for p not a power of two, the pre-step (α + nβ + nγ) and post-step (α + nβ) of
/// the first 2(p - p') ranks (p' = largest power of two <= p). Step s (partners at
/// distance 2^s among the p' remaining ranks, as algorithms/schedule.cpp pairs them) costs
/// the largest α and β (shared) of the levels its pairs cross.
Breakdown recursive_doubling_allreduce(const Hierarchy& h, double bytes, const Machine& m);

/// Rabenseifner ([TRG], long messages): recursive halving reduce-scatter + recursive
/// doubling all-gather among p' ranks, p a power of two:
///   2 lg p·α + 2(p-1)/p·n·β + (p-1)/p·n·γ,
/// otherwise with the pre-step (α + nβ + nγ) and post-step (α + nβ) on the whole vector:
///   (2 lg p' + 2)α + (2 + 2(p'-1)/p')nβ + (1 + (p'-1)/p')nγ   (uniform links).
/// Step order as in algorithms/schedule.cpp: the halving starts at distance p'/2 with n/2
/// bytes, the doubling ends there; each step costs its crossed levels' largest α and β.
Breakdown rabenseifner_allreduce(const Hierarchy& h, double bytes, const Machine& m);

/// Options of the two-level scheme.
struct TwoLevelOptions {
  IntraAlgo intra = IntraAlgo::pipelined;
  /// The leaders' allreduce over levels 1..k (one leader per node, each crossing level
  /// >= 1 alone, so every outer level is taken at its β_solo): ring ([JIA]) by default;
  /// recursive_doubling or rabenseifner also accepted.
  Algorithm inter = Algorithm::ring;
};

/// The two-level scheme ([JIA]; BlueConnect's "two-level" baseline as we read [BC]):
///   1. reduce to the node leader over level 0 (p0 ranks),
///   2. allreduce among the q = p/p0 leaders over levels 1..k,
///   3. broadcast from the leader over level 0.
/// With the defaults (pipelined intra, ring inter, α*/β* the worst crossed outer level):
///   2(p0-1)α0 + 2nβ0 + nγ  +  2(q-1)α* + 2(q-1)/q·n·β*_solo + (q-1)/q·n·γ
/// One level (q = 1): reduce + broadcast. p0 = 1: the leaders' allreduce alone.
Breakdown two_level_allreduce(const Hierarchy& h, double bytes, const Machine& m,
                              const TwoLevelOptions& opt = {});

/// BlueConnect ([BC] section 3, eqs. 6-7 as derived here). With P_i = p0·…·p_i,
/// P_{-1} = 1 and s_i = n/P_{i-1} (the segment stage i works on):
///   reduce-scatter stage i (i = 0..k), ring:  (p_i-1)α_i + (p_i-1)/p_i·s_i·(β_i + γ)
///                                   halving:  lg p_i·α_i + (p_i-1)/p_i·s_i·(β_i + γ)
///   all-gather stage i (i = k..0), ring:      (p_i-1)α_i + (p_i-1)/p_i·s_i·β_i
///                                  doubling:  lg p_i·α_i + (p_i-1)/p_i·s_i·β_i
/// so with rings: latency 2Σ(p_i-1)α_i, bandwidth 2n·Σ(p_i-1)/P_i·β_i, reduction
/// n·(p-1)/p·γ (the γ sum telescopes); with equal β the bandwidth term is the flat
/// ring's 2(p-1)/p·nβ. Stages with p_i = 1 cost nothing and are left out.
Breakdown blueconnect_allreduce(const Hierarchy& h, double bytes, const Machine& m,
                                StageAlgo algo = StageAlgo::automatic);

/// Pipelined binary tree ([SST] section 2; NCCL's single tree): a reduce up a binary tree
/// over all p ranks, then a broadcast down it, each pipelined in small pieces and taken at
/// ideal pipelining (start-up once per tree level; the piece-count term dropped, as in
/// IntraAlgo::pipelined). With h = ⌊lg p⌋, the height of a complete binary tree of p nodes
/// (= ⌈lg p⌉ for a power of two):
///   reduce     h·α* + 2n·β* + 2n·γ   (an inner node receives n bytes from each of its two
///                                     children through one port and reduces both)
///   broadcast  h·α* + 2n·β*          (and sends n bytes to each child)
///   allreduce  2h·α* + 4n·β* + 2n·γ
/// α*, β* as for the flat ring (the largest α; β of level 0, β_solo of outer levels, over
/// the levels with p_i > 1): the tree is laid over ranks in order, so its edges cross every
/// such level, with few ranks of a node on an outer link at a time.
Breakdown binary_tree_allreduce(const Hierarchy& h, double bytes, const Machine& m);

/// Double binary tree ([SST]'s two-tree idea as NCCL 2.4 uses it, [NCCL]): two binary
/// trees, each reducing then broadcasting n/2 bytes, every rank inner in at most one, so
/// a rank receives and sends n bytes per phase:
///   reduce     h·α* + n·β* + n·γ,   broadcast  h·α* + n·β*
///   allreduce  2h·α* + 2n·β* + n·γ
/// (h, α*, β* as for binary_tree_allreduce; the two trees run concurrently). Against the
/// flat ring on one level of p ranks it trades 2(p-1-h)α of latency for 2/p·nβ + 1/p·nγ of
/// bandwidth and reduction: with γ = 0 the two tie at n = (p-1-h)·p·α/β.
Breakdown double_binary_tree_allreduce(const Hierarchy& h, double bytes, const Machine& m);

/// Host-transfer ([AL] section III-B): copy the n bytes device-to-host, run the host
/// allreduce among all p ranks on h's links, copy the result host-to-device:
///   (α_c + n·β_c) + host allreduce + (α_c + n·β_c),
///   host allreduce = the cheaper (cheaper(); recursive doubling on a tie) of
///                    recursive_doubling_allreduce and rabenseifner_allreduce (MPICH's
///                    short / long message choice [TRG], taken here at its optimum).
/// α_c = m.copy_alpha, β_c = m.copy_beta; the host reduction uses m.gamma. The host
/// allreduce's intra-node steps are taken at level 0's links as given (MPI's shared-memory
/// path is not modelled apart), so give level 0 the host's figures when they differ.
/// Stages: "d2h copy", the host algorithm's stages prefixed "host ", "h2d copy".
Breakdown host_transfer_allreduce(const Hierarchy& h, double bytes, const Machine& m);

/// Options of a pipelined model (NV-Group, C-Cube).
struct PipelineOptions {
  /// Chunks the vector is cut into: 0 = the cheapest power of two in 1..kMaxChunks (the
  /// implementation picks its chunk size to fill the pipe; the model takes the best one).
  int chunks = 0;
  static constexpr int kMaxChunks = 4096;
};
using NVGroupOptions = PipelineOptions;

/// NV-Group ([NVG] section 4; derived, see Sources). The group is level 0 (g = p0 GPUs
/// sharing NVLink), q = p/g groups; a vector of n bytes is cut into C chunks of c = n/C.
/// Per chunk:
///   load-reduce  (group reduce-scatter): every GPU loads its 1/g slice from the g-1 peers
///                at once over all its links and reduces it, one synchronisation:
///                  t_rs(c) = α0 + (g-1)/g·c·β0a + (g-1)/g·c·γ
///   inter-group ring on the slice (GPU j of every group with GPU j of the others, all g
///                rings at once, so each crosses the outer levels at the shared β):
///                  t_ring(c) = 2(q-1)α* + 2(q-1)/q·(c/g)·β* + (q-1)/q·(c/g)·γ
///   store        (group all-gather): every GPU stores its reduced slice to the g-1 peers:
///                  t_st(c) = α0 + (g-1)/g·c·β0a
/// with β0a = level 0's a2a() β, α*, β* the largest α and (shared) β of the outer levels
/// with p_i > 1. The NVLinks carry load-reduce and store (both use both directions of
/// every link), the network carries the ring, and the two overlap chunk by chunk: with the
/// linear-pipeline convention
///   T(C) = t_rs(c) + t_ring(c) + t_st(c) + (C-1)·max(t_rs(c) + t_st(c), t_ring(c))
/// and T = min over C (NVGroupOptions::chunks). One group (q = 1), best C: C = 1 and
///   T = 2α0 + 2(g-1)/g·n·β0a + (g-1)/g·n·γ   (latency 2α0 against the ring's 2(g-1)α0);
/// g = 1: the ring across groups alone. Stages: "load-reduce", the ring's "reduce-scatter"
/// and "all-gather", "store" (each for the first chunk), then "pipeline" for the C-1 other
/// chunks (the bottleneck's cost, C-1 times) when C > 1. Not modelled: the design's
/// CPU-driven path for small chunks, and the kernel launch (the kernel is persistent).
/// Level 0 is taken as one load/store group whatever it is, so on a hierarchy whose
/// innermost level has no peer access (a CPU cluster) this model does not apply.
Breakdown nvgroup_allreduce(const Hierarchy& h, double bytes, const Machine& m,
                            const NVGroupOptions& opt);
Breakdown nvgroup_allreduce(const Hierarchy& h, double bytes, const Machine& m);

using CcubeOptions = PipelineOptions;

/// C-Cube's overlapped tree ([CC]; the schedule of algorithms/schedule.cpp, ccube_tree):
/// a binary tree inside each level-0 group (node) under its leader, a binary tree over
/// the leaders; the vector in c chunks, each going up one tree edge per round and, from
/// the root, down one per round, later chunks still going up. With
/// D = ⌊lg p0⌋ + ⌊lg(p/p0)⌋ (the depth) the rounds are c + 2D - 1, each as long as its
/// slowest part, in which a rank sends at most three chunks (one up, two down) and a
/// parent reduces k chunks (its children: 2, or 4 at a leader with children on its node
/// and across):
///   (c + 2D - 1)·(α* + 3(n/c)·β* + k(n/c)·γ)
/// α*, β*: level 0's when p = p0, else the larger of level 0's and the outer levels' (α,
/// β_solo: one rank per node crosses). One chunk is the unpipelined tree, 2D rounds.
Breakdown ccube_allreduce(const Hierarchy& h, double bytes, const Machine& m,
                          const CcubeOptions& opt);
Breakdown ccube_allreduce(const Hierarchy& h, double bytes, const Machine& m);

/// Route ccube's chunk (bytes) for an allreduce of `bytes` when the table gives none. The
/// model's best chunk count is c = sqrt((2D - 1)·3·β·n / α); route ccube pays an NCCL
/// group and a kernel per round (α about 15 us) on links of about 20 GB/s, in trees of
/// depth D about 3, so n/c = sqrt(n · α / (3(2D - 1)·β)) = sqrt(n · 20 KiB): about 144 KiB
/// at 1 MiB, 4.5 MiB at 1 GiB. Rounded up to 4 KiB; at least 4 KiB. A function of the
/// size alone, so equal on every rank. Not measured on a GPU.
inline uint64_t ccube_device_chunk(uint64_t bytes) {
  const double c = std::sqrt(static_cast<double>(bytes) * 20480.0);
  const uint64_t r = (static_cast<uint64_t>(c) + 4095) / 4096 * 4096;
  return r < 4096 ? 4096 : r;
}

// ---- the catalogue ----------------------------------------------------------------------

using ModelFn = Breakdown (*)(const Hierarchy&, double bytes, const Machine&);
struct ModelEntry {
  Algorithm algo;
  ModelFn fn;  ///< with default options
};
/// Every model with its default options, in Algorithm order.
const std::vector<ModelEntry>& models();

/// The crossover size of two models on (h, m): a byte count x in [lo, hi] where model a
/// stops being cheaper (cheaper()) than model b, found by bisection on a geometric scale
/// to a relative 1e-12: a is cheaper at the returned x and not at x·(1 + ~1e-12). nullopt
/// when a is not cheaper at lo, a is still cheaper at hi, lo/hi are not 0 < lo < hi finite,
/// or either model rejects the input. With several crossings in [lo, hi] it returns one of
/// them (the predicate is assumed to flip once, as for latency- vs bandwidth-bound pairs).
std::optional<double> crossover(ModelFn a, ModelFn b, const Hierarchy& h, const Machine& m,
                                double lo = 1, double hi = 1099511627776.0 /* 1 TiB */);
std::optional<double> crossover(Algorithm a, Algorithm b, const Hierarchy& h,
                                const Machine& m, double lo = 1,
                                double hi = 1099511627776.0);
/// The same for two time functions of the byte count (seconds; infinite or NaN = rejected
/// input, giving nullopt), e.g. two routes on different hierarchies or machines (a host
/// path and a device path).
using TimeFn = std::function<double(double bytes)>;
std::optional<double> crossover_times(const TimeFn& a, const TimeFn& b, double lo = 1,
                                      double hi = 1099511627776.0);

/// One model with its default options.
Breakdown evaluate(Algorithm a, const Hierarchy& h, double bytes, const Machine& m);

/// a takes less time than b by more than rounding (a relative 1e-9): models that are
/// equal in exact arithmetic (BlueConnect on one level and Rabenseifner, say) tie.
bool cheaper(double a_seconds, double b_seconds);

/// The cheapest model for (h, bytes, m) (ties, as cheaper() sees them: the first in
/// models() order). For an invalid h the Breakdown carries the error and an infinite time.
Breakdown best(const Hierarchy& h, double bytes, const Machine& m);

// ---- stage helpers (building blocks for models; p ranks, s bytes per rank) --------------

Cost ring_reduce_scatter(int p, double s, const LinkLevel& l, double beta, double gamma);
Cost ring_all_gather(int p, double s, const LinkLevel& l, double beta);
Cost halving_reduce_scatter(int p, double s, const LinkLevel& l, double beta, double gamma);
Cost doubling_all_gather(int p, double s, const LinkLevel& l, double beta);
// (beta is passed separately so a caller chooses l.beta or l.solo(); p a power of two for
// the halving/doubling forms; p <= 1 or s <= 0 costs nothing.)

/// A byte count for people, in binary units: "4 B", "16 KiB", "97.5 MiB" (`decimals`
/// digits after the point when the value is not whole in its unit). For tools' output.
std::string human_bytes(double bytes, int decimals = 1);

bool is_pow2(int p);
int floor_log2(int p);  ///< ⌊lg p⌋ for p >= 1
int ceil_log2(int p);   ///< ⌈lg p⌉ for p >= 1

/// The outermost level on which ranks a and b (hierarchy positions) differ; -1 if a == b.
int crossed_level(const std::vector<int>& factors, int a, int b);

}  // namespace streamcoll::model
