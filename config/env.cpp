#include "config/env.hpp"

#include <cctype>
#include <cstdlib>

#include "config/tuning_table.hpp"

namespace streamcoll::config {

namespace {
std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}
const char* get(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}
}  // namespace

bool parse_bool(std::string_view s, bool* out) {
  auto v = lower(s);
  if (v == "1" || v == "yes" || v == "true" || v == "on") return *out = true, true;
  if (v == "0" || v == "no" || v == "false" || v == "off") return *out = false, true;
  return false;
}

bool parse_log_level(std::string_view s, LogLevel* out) {
  auto v = lower(s);
  static const char* const names[] = {"none", "warn", "info", "trace"};
  for (int i = 0; i < 4; ++i)
    if (v == names[i] || v == std::to_string(i)) return *out = static_cast<LogLevel>(i), true;
  return false;
}

namespace {
// "auto" -> -1, a boolean -> 1 or 0; false (and *out left alone) for anything else.
bool parse_auto_bool(std::string_view s, int* out) {
  bool b = false;
  if (lower(s) == "auto") *out = -1;
  else if (parse_bool(s, &b)) *out = b ? 1 : 0;
  else return false;
  return true;
}
}  // namespace

bool parse_cuda_aware(std::string_view s, CudaAware* out) {
  int v = 0;
  if (!parse_auto_bool(s, &v)) return false;
  *out = v < 0 ? CudaAware::auto_detect : v ? CudaAware::yes : CudaAware::no;
  return true;
}

namespace {

void problem(Settings* s, const Knob& k, const char* v, const char* what) {
  s->problems.push_back(std::string(k.name) + "='" + v + "' " + what);
}

template <bool Settings::*field>
void set_bool(const Knob& k, const char* v, Settings* s) {
  if (!parse_bool(v, &(s->*field))) problem(s, k, v, "is not a boolean; ignored");
}

template <std::string Settings::*field>
void set_string(const Knob&, const char* v, Settings* s) {
  s->*field = v;
}

void set_debug(const Knob& k, const char* v, Settings* s) {
  if (parse_log_level(v, &s->debug)) return;
  s->debug = LogLevel::warn;
  problem(s, k, v, "is not none|warn|info|trace; using warn");
}

void set_decision_cache(const Knob& k, const char* v, Settings* s) {
  if (!parse_auto_bool(v, &s->decision_cache)) problem(s, k, v, "is not auto|1|0; using auto");
}

void set_fusion_cycle(const Knob& k, const char* v, Settings* s) {
  char* end = nullptr;
  const unsigned long long us = std::strtoull(v, &end, 10);
  if (end != v && *end == '\0' && us <= 10000000ull) s->fusion_cycle_us = us;
  else problem(s, k, v, "is not a number of microseconds up to 10000000; using 1000");
}

void set_cuda_aware(const Knob& k, const char* v, Settings* s) {
  if (!parse_cuda_aware(v, &s->mpi_cuda_aware)) problem(s, k, v, "is not auto|yes|no; using auto");
}

void set_thread_multiple(const Knob& k, const char* v, Settings* s) {
  int t = 0;
  if (!parse_auto_bool(v, &t)) return problem(s, k, v, "is not auto or a boolean; using auto");
  s->thread_multiple = t < 0 ? Threads::auto_detect : t ? Threads::yes : Threads::no;
}

void set_progress_bind(const Knob& k, const char* v, Settings* s) {
  if (lower(v) == "none") s->progress_bind = false;
  else if (lower(v) != "auto") problem(s, k, v, "is not auto|none; using auto");
}

void set_ht_wait(const Knob& k, const char* v, Settings* s) {
  const std::string w = lower(v);
  if (w == "auto") s->ht_wait = HtWait::auto_detect;
  else if (w == "memop") s->ht_wait = HtWait::memop;
  else if (w == "kernel") s->ht_wait = HtWait::kernel;
  else problem(s, k, v, "is not auto|memop|kernel; using auto");
}

void set_timeline_max(const Knob& k, const char* v, Settings* s) {
  char* end = nullptr;
  const unsigned long long n = std::strtoull(v, &end, 10);
  if (end != v && *end == '\0' && n >= 1 && n <= 100000000ull) s->timeline_max = n;
  else problem(s, k, v, "is not a number of calls from 1 to 100000000; using 100000");
}

void set_nccl_max_comms(const Knob& k, const char* v, Settings* s) {
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (end != v && *end == '\0' && n >= 1 && n <= 4096) s->nccl_max_comms = static_cast<int>(n);
  else problem(s, k, v, "is not a number of communicators from 1 to 4096; using 32");
}

void set_nccl_memory(const Knob& k, const char* v, Settings* s) {
  const std::string_view text(v);
  if (!text.empty() && text.back() == '%') {
    char* end = nullptr;
    const double pct = std::strtod(v, &end);
    if (end != v && end == v + text.size() - 1 && pct >= 0 && pct <= 100) {
      s->nccl_memory_share = pct / 100;
      s->nccl_memory_bytes = 0;
      return;
    }
  } else if (auto b = parse_size(text)) {
    s->nccl_memory_bytes = *b;
    s->nccl_memory_share = *b ? 0 : s->nccl_memory_share;
    if (*b) return;
  }
  problem(s, k, v, "is not a share like 25% or a size like 8G; using 25%");
  s->nccl_memory_share = 0.25;
  s->nccl_memory_bytes = 0;
}

void set_nvtx(const Knob& k, const char* v, Settings* s) {
  if (!parse_auto_bool(v, &s->nvtx)) problem(s, k, v, "is not auto|1|0; using auto");
}

void set_hierarchy(const Knob& k, const char* v, Settings* s) {
  if (auto f = topo::parse_factors(v)) s->hierarchy = *f;
  else problem(s, k, v, "is not a list of factors like 2x2x2; ignored");
}

}  // namespace

const std::vector<Knob>& knobs() {
  static const std::vector<Knob> k = {
      {"STREAMCOLL_DISABLE", "0", set_bool<&Settings::disable>,
       "`1`: intercept nothing; every call goes straight to `PMPI_`"},
      {"STREAMCOLL_DEBUG", "none", set_debug,
       "`none`, `warn`, `info` or `trace`: diagnostics on stderr, one line each, tagged "
       "`[streamcoll RANK]`"},
      {"STREAMCOLL_STATS", "0", set_bool<&Settings::stats>,
       "`1`: at `MPI_Finalize`, rank 0 prints calls, bytes and time per collective, route "
       "and memory kind, summed over `MPI_COMM_WORLD` (set it on every rank)"},
      {"STREAMCOLL_TIMELINE", "", set_string<&Settings::timeline>,
       "a file: at `MPI_Finalize` rank 0 writes there every rank's calls (collective, "
       "route, bytes, memory, mode, host span, GPU span of stream-ordered calls) as Chrome "
       "trace JSON (Perfetto, `chrome://tracing`, `scripts/plot_timeline.py`); a rank that "
       "exits without `MPI_Finalize` writes its own, `FILE.rank<N>`"},
      {"STREAMCOLL_TIMELINE_MAX", "100000", set_timeline_max,
       "calls the timeline keeps per rank, the latest (about 100 bytes each); the file "
       "says how many were dropped"},
      {"STREAMCOLL_NVTX", "auto", set_nvtx,
       "NVTX ranges in domain `streamcoll` (Nsight Systems): `auto` when an NVTX tool is "
       "attached (`NVTX_INJECTION64_PATH` set, as `nsys` does), `1` always, `0` never; "
       "absent from builds without the CUDA toolkit's NVTX3 headers"},
      {"STREAMCOLL_DRIVER_PROFILE", "0", set_bool<&Settings::driver_profile>,
       "`1`: every CUDA driver call streamcoll makes is timed (two clock reads each), and at"
       " `MPI_Finalize` each rank prints to stderr, per driver entry point, the calls and "
       "host microseconds (total and mean), most time first: where a GPU call's host time "
       "goes (a diagnostic; `tests/fake/driver_profile.sh`)"},
      {"STREAMCOLL_CHECK", "0", set_bool<&Settings::check>,
       "`1`: before each call, one extra `PMPI_Allreduce` verifies that all ranks see the "
       "same call and chose the same rule, before anything collective of streamcoll's runs; "
       "aborts with a message otherwise"},
      {"STREAMCOLL_TUNING_FILE", "", set_string<&Settings::tuning_file>,
       "a tuning table that replaces the embedded default; a malformed file is reported as "
       "`file:line: reason` and the default is used"},
      {"STREAMCOLL_ROUTE", "", set_string<&Settings::route>,
       "force routes per collective, e.g. `allreduce:nccl,bcast:pmpi,reduce:ht:algo=ring`; "
       "`*` stands for every collective"},
      {"STREAMCOLL_NCCL_LIB", "libnccl.so.2", set_string<&Settings::nccl_lib>,
       "the NCCL library the `nccl` route opens (a name for the loader's search path, or a "
       "path); if it cannot be opened the route is off and its calls go to `pmpi`"},
      {"STREAMCOLL_NCCL_NONBLOCKING", "0", set_bool<&Settings::nccl_nonblocking>,
       "`1`: `MPI_I*` calls on GPU memory may take route `nccl` too. Only for a program that"
       " starts its non-blocking collectives on all communicators in one order on every "
       "rank: NCCL kernels of different NCCL communicators can deadlock otherwise (see "
       "Safety rules); `0`: they take the table's next matching rule (`pmpi` in the default "
       "table)"},
      {"STREAMCOLL_ONE_RANK_SELF", "1", set_bool<&Settings::one_rank_self>,
       "`1`: a communicator of one rank takes route `self` for calls on GPU memory (a copy on "
       "the GPU; no NCCL communicator, no agreement, nothing set up), and no other route but "
       "`pmpi`; `0`: it is routed as any communicator (to test a route on one rank)"},
      {"STREAMCOLL_NCCL_MAX_COMMS", "32", set_nccl_max_comms,
       "NCCL communicators streamcoll keeps alive at once in a process, those with resources "
       "of their own and those split from a parent with `splitShare` together (idle ones are "
       "freed first); beyond it a new communicator's calls take the table's next rule"},
      {"STREAMCOLL_NCCL_MEMORY", "25%", set_nccl_memory,
       "GPU memory that streamcoll's NCCL communicators with resources of their own may take "
       "on one GPU: a share of its total (`25%`) or a size (`8G`), measured with "
       "`cuMemGetInfo` around each set-up (idle ones are freed first); beyond it a new "
       "communicator's calls take the table's next rule, on every rank alike"},
      {"STREAMCOLL_NVGROUP_NONBLOCKING", "0", set_bool<&Settings::nvgroup_nonblocking>,
       "`1`: `MPI_I*` allreduce, reduce-scatter-block and all-gather on GPU memory may take "
       "route `nvgroup` too (one group per communicator). Only for a program that starts its"
       " non-blocking collectives on all communicators in one order on every rank: the "
       "group's kernels wait for each other (see Safety rules); `0`: they take the table's "
       "next matching rule"},
      {"STREAMCOLL_DECISION_CACHE", "auto", set_decision_cache,
       "`1`: each communicator keeps, per call signature (collective, bytes, memory kind, "
       "stream), the tuning table's matching rules (Horovod's response cache as a decision "
       "cache), so a repeated call skips the table walk; dropped when the forced routes or "
       "the table change, freed with the communicator; the agreement and the routes' checks "
       "still run at every call; `0`: walk the table at every call; `auto`: `1` for a table "
       "of 16 rules or more, where the walk costs more than the lookup (callgrind, "
       "`scripts/decision-cost.sh`: a lookup 179 instructions, a walk of 11 rules 214, of 28"
       " rules 384; `bench/results/decision_cost_2026-11-25`)"},
      {"STREAMCOLL_FUSION_NCCL", "0", set_bool<&Settings::fusion_nccl>,
       "`1`: a fused message of `MPI_Iallreduce` calls on GPU memory (a `fuse=` rule) runs "
       "on NCCL where the rules give an allreduce of its size on GPU memory to route `nccl` "
       "(see Fusion). Only where the GPU runs NCCL kernels of different communicators "
       "together, or the fusing communicators are the only ones on NCCL: the fused message's"
       " kernel starts when its group is agreed, in an order relative to other NCCL "
       "operations that differs between ranks; `0`: fused messages run on the host (`pmpi`, "
       "`ht`)"},
      {"STREAMCOLL_FUSION_CYCLE", "1000", set_fusion_cycle,
       "microseconds a group of fused `MPI_Iallreduce` calls (a table rule with `fuse=`) "
       "stays open for more calls when this rank neither waits for nor tests any of them "
       "(Horovod's cycle time); a wait, a test or another call on the communicator closes it"
       " at once. It changes how many calls are fused, never which: the ranks agree on that "
       "(see Fusion)"},
      {"STREAMCOLL_THREAD_MULTIPLE", "auto", set_thread_multiple,
       "whether `MPI_Init`/`MPI_Init_thread` ask the MPI for `MPI_THREAD_MULTIPLE`, which "
       "the progress thread of routes `ht` and `blueconnect` (`MPI_I*` on host memory) needs"
       " (the application is still told the level it asked for): `auto` asks only when the "
       "tuning table (with `STREAMCOLL_ROUTE`) has such a rule for host memory, or for GPU "
       "memory on a node with a CUDA driver; `1` always (for routes forced with "
       "`streamcoll_comm_set_route`); `0` never (those routes are then off unless the "
       "application asked for `MPI_THREAD_MULTIPLE` itself)"},
      {"STREAMCOLL_STAGING_KERNEL", "1", set_bool<&Settings::staging_kernel>,
       "`1`: host staging moves four or more copies between one GPU and its pinned staging "
       "memory (a fused group's) with one kernel launch per 64 (builds with nvcc, GPUs of "
       "compute capability 8.0 or more); `0`: a driver copy each"},
      {"STREAMCOLL_PROGRESS_BIND", "auto", set_progress_bind,
       "`auto`: bind the progress thread (hwloc) to a core of the rank's cpuset its own "
       "threads are least likely to use; `none`: leave it unbound"},
      {"STREAMCOLL_HT_WAIT", "auto", set_ht_wait,
       "how route `ht` holds a stream until the host collective is done: `memop` "
       "(`cuStreamWaitValue32`), `kernel` (a one-thread spin kernel), `auto` (memop where "
       "the driver supports it, else the kernel)"},
      {"STREAMCOLL_HIERARCHY", "", set_hierarchy,
       "factors such as `2x2x2`, innermost level first: route `blueconnect` imposes this "
       "hierarchy (ranks in order) on every communicator of that size instead of the "
       "discovered one; the tuning table's `hierarchy=` wins over it"},
      {"STREAMCOLL_NODE_GROUPS", "", set_string<&Settings::node_groups>,
       "levels above the node for route `blueconnect`: `;`-separated extended regular "
       "expressions, innermost first, matched against each node's name "
       "(`MPI_Get_processor_name`); the first parenthesised part, or the whole match, names "
       "the node's switch, rack, ... (e.g. `^(r[0-9]+)n` for racks of hosts `r07n12`)"},
      {"STREAMCOLL_MPI_CUDA_AWARE", "auto", set_cuda_aware,
       "`yes` or `no`: whether the MPI accepts GPU buffers; `auto` asks it "
       "(`MPIX_Query_cuda_support`, else `MPIX_GPU_query_support`; neither found counts as "
       "`no`). When it does not, GPU buffers of calls that go to the MPI are staged through "
       "host memory, and every call is classified (no pass-through fast path while a GPU is "
       "present)"},
  };
  return k;
}

Settings read_settings() {
  Settings s;
  for (const Knob& k : knobs())
    if (const char* v = get(std::string(k.name).c_str())) k.set(k, v, &s);
  return s;
}

std::string knobs_markdown() {
  std::string t = "| variable | default | meaning |\n|---|---|---|\n";
  for (const Knob& k : knobs()) {
    t += "| `" + std::string(k.name) + "` | ";
    if (!k.default_value.empty()) t += "`" + std::string(k.default_value) + "` ";
    t += "| " + std::string(k.doc) + " |\n";
  }
  return t;
}

}  // namespace streamcoll::config
