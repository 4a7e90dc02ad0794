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

// The parsers and printers of the knob rows, by the kind of field. A parser leaves the
// Settings alone for a value it does not understand and returns false.

template <bool Settings::*F>
bool set_bool(std::string_view v, Settings* s) { return parse_bool(v, &(s->*F)); }
template <bool Settings::*F>
std::string show_bool(const Settings& s) { return s.*F ? "1" : "0"; }

template <std::string Settings::*F>
bool set_string(std::string_view v, Settings* s) { return s->*F = std::string(v), true; }
template <std::string Settings::*F>
std::string show_string(const Settings& s) { return s.*F; }

// auto|boolean fields: -1 auto, 1, 0.
template <int Settings::*F>
bool set_auto(std::string_view v, Settings* s) { return parse_auto_bool(v, &(s->*F)); }
template <int Settings::*F>
std::string show_auto(const Settings& s) { return s.*F < 0 ? "auto" : s.*F ? "1" : "0"; }

// A whole number in [Lo, Hi], decimal.
template <class T, T Settings::*F, uint64_t Lo, uint64_t Hi>
bool set_count(std::string_view v, Settings* s) {
  const std::string text(v);
  char* end = nullptr;
  const unsigned long long n = std::strtoull(text.c_str(), &end, 10);
  if (text.empty() || text[0] == '-' || *end != '\0' || n < Lo || n > Hi) return false;
  s->*F = static_cast<T>(n);
  return true;
}
template <class T, T Settings::*F>
std::string show_count(const Settings& s) { return std::to_string(s.*F); }

// One of named values (case-insensitive); show gives a value's first name.
template <class E>
struct Choice {
  std::string_view name;
  E value;
};
template <class E, E Settings::*F, const auto& Names>
bool set_choice(std::string_view v, Settings* s) {
  const std::string w = lower(v);
  for (const Choice<E>& c : Names)
    if (w == c.name) return s->*F = c.value, true;
  return false;
}
template <class E, E Settings::*F, const auto& Names>
std::string show_choice(const Settings& s) {
  for (const Choice<E>& c : Names)
    if (s.*F == c.value) return std::string(c.name);
  return "?";
}

constexpr Choice<HtWait> kHtWait[] = {
    {"auto", HtWait::auto_detect}, {"memop", HtWait::memop}, {"kernel", HtWait::kernel}};
constexpr Choice<bool> kBind[] = {{"auto", true}, {"none", false}};

bool set_debug(std::string_view v, Settings* s) { return parse_log_level(v, &s->debug); }
std::string show_debug(const Settings& s) {
  static const char* const names[] = {"none", "warn", "info", "trace"};
  return names[static_cast<int>(s.debug) & 3];
}

// auto or a boolean (parse_auto_bool), as STREAMCOLL_MPI_CUDA_AWARE.
bool set_threads(std::string_view v, Settings* s) {
  int t = 0;
  if (!parse_auto_bool(v, &t)) return false;
  s->thread_multiple = t < 0 ? Threads::auto_detect : t ? Threads::yes : Threads::no;
  return true;
}
std::string show_threads(const Settings& s) {
  return s.thread_multiple == Threads::auto_detect ? "auto" : s.thread_multiple == Threads::yes ? "1" : "0";
}

bool set_cuda_aware(std::string_view v, Settings* s) { return parse_cuda_aware(v, &s->mpi_cuda_aware); }
std::string show_cuda_aware(const Settings& s) {
  return s.mpi_cuda_aware == CudaAware::auto_detect ? "auto" : s.mpi_cuda_aware == CudaAware::yes ? "yes" : "no";
}

// A share of the GPU (`25%`) or a size (`8G`, not 0).
bool set_nccl_memory(std::string_view v, Settings* s) {
  const std::string text(v);
  if (!text.empty() && text.back() == '%') {
    char* end = nullptr;
    const double pct = std::strtod(text.c_str(), &end);
    if (end == text.c_str() || end != text.c_str() + text.size() - 1 || !(pct >= 0 && pct <= 100))
      return false;
    s->nccl_memory_share = pct / 100;
    s->nccl_memory_bytes = 0;
    return true;
  }
  const auto b = parse_size(text);
  if (!b || *b == 0) return false;
  s->nccl_memory_bytes = *b;
  s->nccl_memory_share = 0;
  return true;
}
std::string show_nccl_memory(const Settings& s) {
  if (s.nccl_memory_bytes) return std::to_string(s.nccl_memory_bytes);
  std::string pct = std::to_string(s.nccl_memory_share * 100);
  pct.erase(pct.find_last_not_of('0') + 1);
  if (!pct.empty() && pct.back() == '.') pct.pop_back();
  return pct + "%";
}

bool set_hierarchy(std::string_view v, Settings* s) {
  auto f = topo::parse_factors(std::string(v));
  if (f) s->hierarchy = *f;
  return f.has_value();
}
std::string show_hierarchy(const Settings& s) {
  std::string t;
  for (int f : s.hierarchy) t += (t.empty() ? "" : "x") + std::to_string(f);
  return t;
}

constexpr auto set_ht_wait = set_choice<HtWait, &Settings::ht_wait, kHtWait>;
constexpr auto show_ht_wait = show_choice<HtWait, &Settings::ht_wait, kHtWait>;
constexpr auto set_bind = set_choice<bool, &Settings::progress_bind, kBind>;
constexpr auto show_bind = show_choice<bool, &Settings::progress_bind, kBind>;

#define SC_BOOL(f) set_bool<&Settings::f>, show_bool<&Settings::f>
#define SC_STRING(f) set_string<&Settings::f>, show_string<&Settings::f>
#define SC_AUTO(f) set_auto<&Settings::f>, show_auto<&Settings::f>
#define SC_COUNT(T, f, lo, hi) set_count<T, &Settings::f, lo, hi>, show_count<T, &Settings::f>

constexpr std::string_view kBoolean = "a boolean";
constexpr std::string_view kAutoBool = "auto|1|0";
constexpr std::string_view kAnyText = "";  // every value is understood

}  // namespace

const std::vector<Knob>& knobs() {
  static const std::vector<Knob> k = {
      {"STREAMCOLL_DISABLE", "0", kBoolean, SC_BOOL(disable), Agreed::value,
       "`1`: intercept nothing; every call goes straight to `PMPI_`"},
      {"STREAMCOLL_DEBUG", "none", "none|warn|info|trace", set_debug, show_debug, Agreed::local,
       "`none`, `warn`, `info` or `trace`: diagnostics on stderr, one line each, tagged "
       "`[streamcoll RANK]`",
       "warn"},
      {"STREAMCOLL_STATS", "0", kBoolean, SC_BOOL(stats), Agreed::value,
       "`1`: at `MPI_Finalize`, rank 0 prints calls, bytes and time per collective, route "
       "and memory kind, summed over `MPI_COMM_WORLD` (set it on every rank)"},
      {"STREAMCOLL_TIMELINE", "", kAnyText, SC_STRING(timeline), Agreed::presence,
       "a file: at `MPI_Finalize` rank 0 writes there every rank's calls (collective, "
       "route, bytes, memory, mode, host span, GPU span of stream-ordered calls) as Chrome "
       "trace JSON (Perfetto, `chrome://tracing`, `scripts/plot_timeline.py`); a rank that "
       "exits without `MPI_Finalize` writes its own, `FILE.rank<N>`"},
      {"STREAMCOLL_TIMELINE_MAX", "100000", "a number of calls from 1 to 100000000", SC_COUNT(uint64_t, timeline_max, 1, 100000000), Agreed::local,
       "calls the timeline keeps per rank, the latest (about 100 bytes each); the file "
       "says how many were dropped"},
      {"STREAMCOLL_NVTX", "auto", kAutoBool, SC_AUTO(nvtx), Agreed::local,
       "NVTX ranges in domain `streamcoll` (Nsight Systems): `auto` when an NVTX tool is "
       "attached (`NVTX_INJECTION64_PATH` set, as `nsys` does), `1` always, `0` never; "
       "absent from builds without the CUDA toolkit's NVTX3 headers"},
      {"STREAMCOLL_DRIVER_PROFILE", "0", kBoolean, SC_BOOL(driver_profile), Agreed::local,
       "`1`: every CUDA driver call streamcoll makes is timed (two clock reads each), and at"
       " `MPI_Finalize` each rank prints to stderr, per driver entry point, the calls and "
       "host microseconds (total and mean), most time first: where a GPU call's host time "
       "goes (a diagnostic; `tests/fake/driver_profile.sh`)"},
      {"STREAMCOLL_CHECK", "0", kBoolean, SC_BOOL(check), Agreed::value,
       "`1`: before each call, one extra `PMPI_Allreduce` verifies that all ranks see the "
       "same call and chose the same rule, before anything collective of streamcoll's runs; "
       "aborts with a message otherwise"},
      {"STREAMCOLL_TUNING_FILE", "", kAnyText, SC_STRING(tuning_file), Agreed::table,
       "a tuning table that replaces the embedded default; a malformed file is reported as "
       "`file:line: reason` and the default is used"},
      {"STREAMCOLL_ROUTE", "", kAnyText, SC_STRING(route), Agreed::table,
       "force routes per collective, e.g. `allreduce:nccl,bcast:pmpi,reduce:ht:algo=ring`; "
       "`*` stands for every collective"},
      {"STREAMCOLL_NCCL_LIB", "libnccl.so.2", kAnyText, SC_STRING(nccl_lib), Agreed::local,
       "the NCCL library the `nccl` route opens (a name for the loader's search path, or a "
       "path); if it cannot be opened the route is off and its calls go to `pmpi`"},
      {"STREAMCOLL_NCCL_NONBLOCKING", "0", kBoolean, SC_BOOL(nccl_nonblocking), Agreed::value,
       "`1`: `MPI_I*` calls on GPU memory may take route `nccl` too. Only for a program that"
       " starts its non-blocking collectives on all communicators in one order on every "
       "rank: NCCL kernels of different NCCL communicators can deadlock otherwise (see "
       "Safety rules); `0`: they take the table's next matching rule (`pmpi` in the default "
       "table)"},
      {"STREAMCOLL_ONE_RANK_SELF", "1", kBoolean, SC_BOOL(one_rank_self), Agreed::local,
       "`1`: a communicator of one rank takes route `self` for calls on GPU memory (a copy on "
       "the GPU; no NCCL communicator, no agreement, nothing set up), and no other route but "
       "`pmpi`; `0`: it is routed as any communicator (to test a route on one rank)"},
      {"STREAMCOLL_NCCL_MAX_COMMS", "32", "a number of communicators from 1 to 4096", SC_COUNT(int, nccl_max_comms, 1, 4096), Agreed::local,
       "NCCL communicators streamcoll keeps alive at once in a process, those with resources "
       "of their own and those split from a parent with `splitShare` together (idle ones are "
       "freed first); beyond it a new communicator's calls take the table's next rule"},
      {"STREAMCOLL_NCCL_MEMORY", "25%", "a share like 25% or a size like 8G", set_nccl_memory, show_nccl_memory, Agreed::local,
       "GPU memory that streamcoll's NCCL communicators with resources of their own may take "
       "on one GPU: a share of its total (`25%`) or a size (`8G`), measured with "
       "`cuMemGetInfo` around each set-up (idle ones are freed first); beyond it a new "
       "communicator's calls take the table's next rule, on every rank alike"},
      {"STREAMCOLL_NVGROUP_NONBLOCKING", "0", kBoolean, SC_BOOL(nvgroup_nonblocking), Agreed::value,
       "`1`: `MPI_I*` allreduce, reduce-scatter-block and all-gather on GPU memory may take "
       "route `nvgroup` too (one group per communicator). Only for a program that starts its"
       " non-blocking collectives on all communicators in one order on every rank: the "
       "group's kernels wait for each other (see Safety rules); `0`: they take the table's "
       "next matching rule"},
      {"STREAMCOLL_DECISION_CACHE", "auto", kAutoBool, SC_AUTO(decision_cache), Agreed::local,
       "`1`: each communicator keeps, per call signature (collective, bytes, memory kind, "
       "stream), the tuning table's matching rules (Horovod's response cache as a decision "
       "cache), so a repeated call skips the table walk; dropped when the forced routes or "
       "the table change, freed with the communicator; the agreement and the routes' checks "
       "still run at every call; `0`: walk the table at every call; `auto`: `1` for a table "
       "of 16 rules or more, where the walk costs more than the lookup (callgrind, "
       "`scripts/decision-cost.sh`: a lookup 179 instructions, a walk of 11 rules 214, of 28"
       " rules 384; `bench/results/decision_cost_2026-11-25`)"},
      {"STREAMCOLL_FUSION_NCCL", "0", kBoolean, SC_BOOL(fusion_nccl), Agreed::value,
       "`1`: a fused message of `MPI_Iallreduce` calls on GPU memory (a `fuse=` rule) runs "
       "on NCCL where the rules give an allreduce of its size on GPU memory to route `nccl` "
       "(see Fusion). Only where the GPU runs NCCL kernels of different communicators "
       "together, or the fusing communicators are the only ones on NCCL: the fused message's"
       " kernel starts when its group is agreed, in an order relative to other NCCL "
       "operations that differs between ranks; `0`: fused messages run on the host (`pmpi`, "
       "`ht`)"},
      {"STREAMCOLL_FUSION_CYCLE", "1000", "a number of microseconds up to 10000000", SC_COUNT(uint64_t, fusion_cycle_us, 0, 10000000), Agreed::local,
       "microseconds a group of fused `MPI_Iallreduce` calls (a table rule with `fuse=`) "
       "stays open for more calls when this rank neither waits for nor tests any of them "
       "(Horovod's cycle time); a wait, a test or another call on the communicator closes it"
       " at once. It changes how many calls are fused, never which: the ranks agree on that "
       "(see Fusion)"},
      {"STREAMCOLL_THREAD_MULTIPLE", "auto", "auto or a boolean", set_threads, show_threads, Agreed::local,
       "whether `MPI_Init`/`MPI_Init_thread` ask the MPI for `MPI_THREAD_MULTIPLE`, which "
       "the progress thread of routes `ht` and `blueconnect` (`MPI_I*` on host memory) needs"
       " (the application is still told the level it asked for): `auto` asks only when the "
       "tuning table (with `STREAMCOLL_ROUTE`) has such a rule for host memory, or for GPU "
       "memory on a node with a CUDA driver; `1` always (for routes forced with "
       "`streamcoll_comm_set_route`); `0` never (those routes are then off unless the "
       "application asked for `MPI_THREAD_MULTIPLE` itself)"},
      {"STREAMCOLL_STAGING_KERNEL", "1", kBoolean, SC_BOOL(staging_kernel), Agreed::local,
       "`1`: host staging moves four or more copies between one GPU and its pinned staging "
       "memory (a fused group's) with one kernel launch per 64 (builds with nvcc, GPUs of "
       "compute capability 8.0 or more); `0`: a driver copy each"},
      {"STREAMCOLL_PROGRESS_BIND", "auto", "auto|none", set_bind, show_bind, Agreed::local,
       "`auto`: bind the progress thread (hwloc) to a core of the rank's cpuset its own "
       "threads are least likely to use; `none`: leave it unbound"},
      {"STREAMCOLL_HT_WAIT", "auto", "auto|memop|kernel", set_ht_wait, show_ht_wait, Agreed::value,
       "how route `ht` holds a stream until the host collective is done: `memop` "
       "(`cuStreamWaitValue32`), `kernel` (a one-thread spin kernel), `auto` (memop where "
       "the driver supports it, else the kernel)"},
      {"STREAMCOLL_HIERARCHY", "", "a list of factors like 2x2x2", set_hierarchy, show_hierarchy, Agreed::value,
       "factors such as `2x2x2`, innermost level first: route `blueconnect` imposes this "
       "hierarchy (ranks in order) on every communicator of that size instead of the "
       "discovered one; the tuning table's `hierarchy=` wins over it"},
      {"STREAMCOLL_NODE_GROUPS", "", kAnyText, SC_STRING(node_groups), Agreed::value,
       "levels above the node for route `blueconnect`: `;`-separated extended regular "
       "expressions, innermost first, matched against each node's name "
       "(`MPI_Get_processor_name`); the first parenthesised part, or the whole match, names "
       "the node's switch, rack, ... (e.g. `^(r[0-9]+)n` for racks of hosts `r07n12`)"},
      {"STREAMCOLL_MPI_CUDA_AWARE", "auto", "auto|yes|no", set_cuda_aware, show_cuda_aware, Agreed::local,
       "`yes` or `no`: whether the MPI accepts GPU buffers; `auto` asks it "
       "(`MPIX_Query_cuda_support`, else `MPIX_GPU_query_support`; neither found counts as "
       "`no`). When it does not, GPU buffers of calls that go to the MPI are staged through "
       "host memory, and every call is classified (no pass-through fast path while a GPU is "
       "present)"},
  };
  return k;
}

#undef SC_BOOL
#undef SC_STRING
#undef SC_AUTO
#undef SC_COUNT

Settings read_settings() {
  Settings s;
  for (const Knob& k : knobs())
    if (!k.default_value.empty()) k.set(k.default_value, &s);  // test_env: every default parses
  for (const Knob& k : knobs()) {
    const char* v = get(std::string(k.name).c_str());
    if (!v || k.set(v, &s)) continue;
    const std::string_view fallback = k.on_bad.empty() ? k.default_value : k.on_bad;
    if (!fallback.empty()) k.set(fallback, &s);
    s.problems.push_back(std::string(k.name) + "='" + v + "' is not " + std::string(k.expect) +
                         (fallback.empty() ? "; ignored" : "; using " + std::string(fallback)));
  }
  return s;
}

std::string agreed_text(const Settings& s) {
  std::string t;
  for (const Knob& k : knobs()) {
    if (k.agreed == Agreed::value) t += std::string(k.name) + "=" + k.show(s) + "\n";
    if (k.agreed == Agreed::presence)
      t += std::string(k.name) + (k.show(s).empty() ? " unset\n" : " set\n");
  }
  return t;
}

std::string agreed_names() {
  std::string t;
  for (const Knob& k : knobs())
    if (k.agreed != Agreed::local) t += (t.empty() ? "" : ", ") + std::string(k.name);
  return t;
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
