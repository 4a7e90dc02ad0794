// Machine profiles for the scale model (bench/sc_model): the parameters of the α-β-γ
// models in config/cost_model.hpp for one machine, kept in a small TOML file
// (bench/profiles/*.toml), and the fit of those parameters to sc_bench measurements.
//
// The file (bench/profiles/*.toml; each one says in comments where its values come from):
//
//   name = "sierra"                  # optional, for messages and table headers
//   description = "..."              # optional
//   gpus_per_node = 4                # GPUs (ranks) per node: the size of level 0
//   gamma = 3.3e-12                  # s/B, reducing one byte on the GPU
//   host_gamma = 1e-10               # optional, s/B, reducing on the host (default gamma)
//   copy_alpha = 10e-6               # s, start-up of one device<->host copy
//   copy_bandwidth = 50.0            # GB/s of one device<->host copy
//   nccl_call_alpha = 3.6e-6         # optional, s: the fixed cost of one NCCL collective
//                                    # call (launch, NCCL's base latency), paid once per
//                                    # call on top of the per-step α; default 0
//
//   [[level]]                        # one per link level, innermost (level 0) first
//   name = "nvlink"                  # optional
//   alpha = 0.4e-6                   # s per message
//   bandwidth = 75.0                 # GB/s per rank with every rank of its group sending
//   solo_bandwidth = 12.5            # optional, GB/s with one rank per group crossing
//   a2a_bandwidth = 150.0            # optional, GB/s talking to all group peers at once
//   host_alpha = 1e-6                # optional: the host-memory path (MPI on host
//   host_bandwidth = 6.25            #   buffers, used for route ht); each defaults to
//   host_solo_bandwidth = 12.5       #   its device counterpart above (the solo one, when
//                                    #   no solo is given at all, to host_bandwidth)
//   host_call_alpha = 30e-6          # optional, s: the fixed cost of one host-path
//                                    #   collective call whose outermost level is this one
//                                    #   (the route's hand-off to its progress thread, its
//                                    #   request, the scheduler), paid once per call on
//                                    #   top of the per-step α; default 0 (sc_model fit
//                                    #   fits it)
//   size = 18                        # levels between the innermost and the outermost
//                                    # only: units of the level below per group (nodes
//                                    # per switch); level 0's size is gpus_per_node, the
//                                    # outermost level takes what is left
//
// GB means 1e9 bytes; "bandwidth" is always per direction. See model::LinkLevel for what
// each β means in the models (the sharing rule).
//
// Thread safety: pure functions of their arguments.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "config/bench_csv.hpp"
#include "config/cost_model.hpp"

namespace streamcoll::config {

struct LevelProfile {
  std::string name;
  double alpha = 0;           ///< s
  double gbps = 0;            ///< GB/s, > 0
  double solo_gbps = 0;       ///< 0 = same as gbps
  double a2a_gbps = 0;        ///< 0 = same as gbps
  int size = 0;               ///< middle levels: units of the level below per group; else 0
  std::optional<double> host_alpha;  ///< unset = alpha
  double host_gbps = 0;       ///< 0 = gbps
  double host_solo_gbps = 0;  ///< 0 = solo_gbps
  double host_call_alpha = 0; ///< s per host-path call whose outermost level is this one
};

struct MachineProfile {
  std::string name;
  std::string description;
  int gpus_per_node = 1;
  double gamma = 0;                  ///< s/B
  std::optional<double> host_gamma;  ///< unset = gamma
  double copy_alpha = 10e-6;         ///< s
  double nccl_call_alpha = 0;        ///< s per NCCL collective call
  double copy_gbps = 12;             ///< GB/s
  std::vector<LevelProfile> levels;  ///< innermost first, at least one
};

/// Which path a route takes: device buffers over NVLink/GPUDirect (nccl, blueconnect with
/// NCCL, nvgroup), or host memory (the host allreduce of route ht).
enum class ProfilePath { device, host };

/// Parses a profile. On error: nullopt and "source:line: reason" (the key named) in *error.
std::optional<MachineProfile> load_profile(std::string_view text, std::string_view source,
                                           std::string* error);
/// Reads and parses a file.
std::optional<MachineProfile> load_profile_file(const std::string& path, std::string* error);

/// The profile as TOML text that load_profile reads back to an equal profile (numbers are
/// written with the fewest digits that round-trip). `comment` lines go first, each
/// prefixed "# ".
std::string write_profile(const MachineProfile& p, std::string_view comment = {});

/// Empty when p is usable (the checks load_profile makes); otherwise the reason.
std::string check_profile(const MachineProfile& p);

/// Nodes that `gpus` GPUs span: ⌈gpus / gpus_per_node⌉.
int nodes_for(const MachineProfile& p, int gpus);

/// The link hierarchy of `gpus` GPUs on the machine, innermost first: gpus <= gpus_per_node
/// is one level {gpus}; otherwise {gpus_per_node, nodes} (or more levels where the
/// profile has them, each middle level holding `size` units). nullopt (and the reason)
/// when gpus is not a whole number of nodes or groups, or exceeds what the levels hold.
std::optional<model::Hierarchy> hierarchy(const MachineProfile& p, int gpus, ProfilePath path,
                                          std::string* error);

/// γ (device or host) and the copy parameters.
model::Machine machine(const MachineProfile& p, ProfilePath path);

// ---- the fit ----------------------------------------------------------------------------

struct FitOptions {
  int gpus_per_node = 0;  ///< for a profile without a base: 0 = the largest ppn in the rows
};

/// The fit of one level or of the copies.
struct FitQuality {
  bool fitted = false;
  int rows = 0;             ///< measurements used
  double alpha = 0;         ///< s (copies: α_c)
  double beta = 0;          ///< s/B (copies: β_c)
  double gamma = 0;         ///< s/B (levels only)
  double call_alpha = 0;    ///< s per call (levels only: the host_call_alpha term)
  bool gamma_free = false;  ///< γ was fitted here (not fixed from level 0)
  double median_rel = 0;    ///< median of |t_model / t_measured - 1| over the rows
  double max_rel = 0;       ///< largest of them
  std::string algos;        ///< host algorithms seen, "ring,rd"
};

struct FitResult {
  std::optional<MachineProfile> profile;  ///< nullopt: nothing could be fitted (see notes)
  FitQuality level0, level1, copy;
  std::vector<std::string> notes;  ///< what was fitted or kept and why, skipped rows
};

/// Fits the profile to sc_bench rows (config/bench_csv.hpp) of allreduce on route ht with
/// a known host algorithm (spec ht:algo=ring, ht:algo=rd, ht:algo=rabenseifner):
///  - level 0 from host-buffer rows on one node (p = ranks): α, β, γ and the per-call
///    cost (host_call_alpha);
///  - level 1 from host-buffer rows with one rank per node (p = nodes): α, β and the
///    per-call cost (γ fixed at level 0's value when level 0 was fitted);
///  - the copies from device-buffer rows of the same (spec, ranks, nodes, bytes) as a host
///    row: t_device - t_host = 2(α_c + n·β_c).
/// Each model is linear in (α, β, γ) on one level with uniform links, so its coefficients
/// come from evaluating it at unit parameter vectors; the per-call cost's coefficient is 1
/// (once per call, whatever the algorithm: without it the fixed cost of a call is read as
/// per-step latency, and algorithms with many steps, the ring, come out far too slow); the fit minimises the sum of squared
/// relative errors (t_model / t_measured - 1)² with every parameter >= 0 (the least-squares
/// solution on each subset of the parameters, the best feasible one kept).
/// The fitted values go to the host-path fields (host_alpha, host_bandwidth,
/// host_solo_bandwidth, host_gamma) of `base` when one is given (they describe MPI on host
/// memory); without a base, to the main fields of a new profile. Level 1 measured with one
/// rank per node gives the one-rank rate; it is written as both the shared and the solo
/// bandwidth (the shared one is not measured that way: a note says so).
FitResult fit_profile(const std::vector<BenchRow>& rows, const MachineProfile* base,
                      const FitOptions& opt = {});

/// Least squares with non-negative unknowns for up to 4 unknowns: minimises
/// Σ_i (Σ_j x[i][j]·θ_j - y_i)² over θ >= 0, θ_j fixed at 0 where bit j of `free_mask` is
/// clear. Returns θ, and in *ssr the minimum. Exposed for the tests.
std::vector<double> nonneg_least_squares(const std::vector<std::vector<double>>& x,
                                         const std::vector<double>& y, unsigned free_mask,
                                         double* ssr);

}  // namespace streamcoll::config
