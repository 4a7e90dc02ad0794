// Every environment variable streamcoll reads is declared here, and only here.
// docs/reference.md's environment table is generated from it (knobs_markdown; a unit
// test keeps them equal).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/hierarchy.hpp"
#include "base/log.hpp"

namespace streamcoll::config {

struct Settings;

/// Whether the ranks of a job must agree on a knob, and how (Runtime::fingerprint, at
/// MPI_Init over MPI_COMM_WORLD: a job whose ranks differ in one passes every call through).
enum class Agreed : uint8_t {
  local,     ///< steers nothing collective, or is agreed where it matters (at run time)
  value,     ///< its value steers routing: equal on every rank
  presence,  ///< whether it is set steers something collective: equal on every rank
  table,     ///< steers routing through the tuning table, whose rules are agreed instead
};

/// An environment variable, declared once, in one row of knobs(): its name; its default,
/// as text that `set` parses (read_settings applies it before the environment; empty:
/// none, the Settings field's empty value); `set`, which parses a value into Settings
/// (false, *s unchanged, for a value it does not understand: read_settings then adds a
/// line "NAME='v' is not EXPECT; using DEFAULT" to Settings::problems and applies
/// `on_bad`, or the default); `show`, the value in effect, as `set` reads it; how the
/// ranks agree on it; and its documentation (Markdown). docs/reference.md's table
/// (knobs_markdown), streamcoll-info's environment section and Runtime::fingerprint all
/// come from these rows.
struct Knob {
  std::string_view name;
  std::string_view default_value;
  std::string_view expect;  ///< what `set` accepts, as a message says it ("a boolean")
  bool (*set)(std::string_view value, Settings* s);
  std::string (*show)(const Settings& s);
  Agreed agreed;
  std::string_view doc;
  std::string_view on_bad = {};  ///< applied for a value not understood (empty: the default)
};

/// All knobs, in the order docs/reference.md lists them.
const std::vector<Knob>& knobs();
/// docs/reference.md's environment table, generated from knobs() (a unit test keeps the
/// file equal to it; `streamcoll-info --knobs` prints it).
std::string knobs_markdown();
/// What the ranks of a job must agree on in `s` (the knobs of Agreed::value and
/// Agreed::presence, one `NAME=VALUE` line each), for Runtime::fingerprint to hash.
std::string agreed_text(const Settings& s);
/// The names of the knobs the ranks must agree on (Agreed::value, ::presence, ::table),
/// comma-separated, for the message that says they do not.
std::string agreed_names();

/// STREAMCOLL_MPI_CUDA_AWARE: whether the MPI library accepts GPU buffers.
enum class CudaAware : uint8_t {
  auto_detect,  ///< ask the MPI (core/host_staging.cpp)
  yes,          ///< GPU buffers go to the MPI as they are
  no,           ///< GPU buffers of calls that go to the MPI are staged through host memory
};

/// STREAMCOLL_THREAD_MULTIPLE: which thread level streamcoll asks the MPI for.
enum class Threads : uint8_t {
  auto_detect,  ///< MPI_THREAD_MULTIPLE only where a route with a progress thread may run
  yes,          ///< always MPI_THREAD_MULTIPLE
  no,           ///< the application's level
};

/// STREAMCOLL_HT_WAIT: how route ht holds a stream during the host collective.
enum class HtWait : uint8_t {
  auto_detect,  ///< cuStreamWaitValue32 where supported, else the spin kernel
  memop,        ///< cuStreamWaitValue32 only (route ht declines device calls without it)
  kernel,       ///< the spin kernel
};

/// From this many rules a table walk costs more than a DecisionCache lookup (callgrind:
/// 11 rules 214 instructions, 28 rules 384; a lookup 179; bench/results/decision_cost_*).
inline constexpr size_t kDecisionCacheRules = 16;

/// The settings the environment asks for, read once when the runtime starts. A field's
/// default is its knob's (knobs(), applied by read_settings); the initializers here are
/// only the empty values a Settings not made by read_settings has.
struct Settings {
  bool disable = false;          ///< STREAMCOLL_DISABLE: pass every call straight through
  LogLevel debug = LogLevel::none;  ///< STREAMCOLL_DEBUG
  bool stats = false;            ///< STREAMCOLL_STATS: table at MPI_Finalize
  bool check = false;            ///< STREAMCOLL_CHECK: verify route agreement per call
  std::string tuning_file;       ///< STREAMCOLL_TUNING_FILE
  std::string route;             ///< STREAMCOLL_ROUTE
  std::string nccl_lib;          ///< STREAMCOLL_NCCL_LIB
  bool nccl_nonblocking = false; ///< STREAMCOLL_NCCL_NONBLOCKING: MPI_I* may take route nccl
  bool nvgroup_nonblocking = false;  ///< STREAMCOLL_NVGROUP_NONBLOCKING: MPI_I* may take route nvgroup
  /// STREAMCOLL_ONE_RANK_SELF: a communicator of one rank takes route self (false: it is
  /// routed as any other, the table's routes included; for testing a route on one rank).
  bool one_rank_self = false;
  /// STREAMCOLL_NCCL_MAX_COMMS: NCCL communicators alive at once in a process (own and
  /// shared), beyond which a new communicator's calls take the table's next rule.
  int nccl_max_comms = 0;
  /// STREAMCOLL_NCCL_MEMORY: GPU memory the NCCL communicators with resources of their
  /// own may take on one GPU, as a share of its total (nccl_memory_share, 0..1) or in bytes
  /// (nccl_memory_bytes, when not 0).
  double nccl_memory_share = 0;
  uint64_t nccl_memory_bytes = 0;
  /// STREAMCOLL_DRIVER_PROFILE: time the CUDA driver calls (core/cuda_driver.hpp,
  /// set_profile) and print them per rank at MPI_Finalize.
  bool driver_profile = false;
  /// STREAMCOLL_STAGING_KERNEL: host staging moves four or more small copies of one GPU
  /// (a fused group's) with one kernel launch instead of a copy each.
  bool staging_kernel = false;
  /// STREAMCOLL_DECISION_CACHE: cache the table walk per communicator: 1 always, 0 never,
  /// -1 (auto) when the tuning table has kDecisionCacheRules rules or more.
  int decision_cache = 0;
  /// STREAMCOLL_FUSION_CYCLE: microseconds a fused group of MPI_Iallreduce calls may stay
  /// open waiting for more members when nothing on this rank asks for them (Horovod's
  /// cycle time); algorithms/fusion.hpp.
  uint64_t fusion_cycle_us = 0;
  /// STREAMCOLL_FUSION_NCCL: fused messages on GPU memory may run on route nccl
  /// (algorithms/fusion.hpp, ROUTE).
  bool fusion_nccl = false;
  CudaAware mpi_cuda_aware = CudaAware::auto_detect;  ///< STREAMCOLL_MPI_CUDA_AWARE
  Threads thread_multiple = Threads::auto_detect;  ///< STREAMCOLL_THREAD_MULTIPLE
  bool progress_bind = false;    ///< STREAMCOLL_PROGRESS_BIND: auto (true) or none
  HtWait ht_wait = HtWait::auto_detect;  ///< STREAMCOLL_HT_WAIT
  std::vector<int> hierarchy;    ///< STREAMCOLL_HIERARCHY factors, innermost first (empty: none)
  std::string node_groups;       ///< STREAMCOLL_NODE_GROUPS
  /// STREAMCOLL_TIMELINE: where MPI_Finalize writes the per-call timeline (Chrome trace
  /// JSON, core/trace.hpp); empty: no timeline.
  std::string timeline;
  uint64_t timeline_max = 0;     ///< STREAMCOLL_TIMELINE_MAX: calls kept per rank (the latest)
  /// STREAMCOLL_NVTX: NVTX ranges: 1 always, 0 never, -1 (auto) when an NVTX tool is
  /// attached (NVTX_INJECTION64_PATH set, as Nsight Systems does).
  int nvtx = 0;
  std::vector<std::string> problems;  ///< values that could not be understood
};
Settings read_settings();


/// Parses a boolean knob value: 1/yes/true/on and 0/no/false/off (case-insensitive).
/// Returns false and leaves *out alone for anything else.
bool parse_bool(std::string_view s, bool* out);
/// Parses a STREAMCOLL_DEBUG value: none|warn|info|trace or 0..3.
bool parse_log_level(std::string_view s, LogLevel* out);
/// Parses a STREAMCOLL_MPI_CUDA_AWARE value: auto, or a boolean (yes/no, 1/0, ...).
bool parse_cuda_aware(std::string_view s, CudaAware* out);

}  // namespace streamcoll::config
