#include "config/env.hpp"

#include <cctype>
#include <cstdlib>

namespace streamcoll::config {

const std::vector<Knob>& knobs() {
  static const std::vector<Knob> k = {
      {"STREAMCOLL_DISABLE", "0", "1: intercept nothing; every call goes straight to PMPI_"},
      {"STREAMCOLL_DEBUG", "none",
       "none|warn|info|trace: rank-prefixed diagnostics on stderr"},
      {"STREAMCOLL_STATS", "0",
       "1: print calls, bytes and time per collective, route and memory kind at MPI_Finalize "
       "(set it on every rank)"},
      {"STREAMCOLL_DRIVER_PROFILE", "0",
       "1: time every CUDA driver call streamcoll makes (two clock reads each) and print, "
       "per rank at MPI_Finalize, the calls and host microseconds per driver entry point "
       "(a diagnostic: where a GPU call's host time goes)"},
      {"STREAMCOLL_CHECK", "0",
       "1: before each routed call, one extra PMPI_Allreduce verifies that all ranks chose "
       "the same route and buffer kind; aborts with a message otherwise"},
      {"STREAMCOLL_TUNING_FILE", "",
       "path of a tuning table; replaces the embedded default (a bad file is reported and "
       "the default is used)"},
      {"STREAMCOLL_ROUTE", "",
       "force routes per collective, e.g. allreduce:nccl,bcast:pmpi,reduce:ht:algo=ring"},
      {"STREAMCOLL_NCCL_LIB", "libnccl.so.2",
       "the NCCL library to open (a file name for the loader's search path, or a path); "
       "if it cannot be opened the nccl route is off and its calls go to pmpi"},
      {"STREAMCOLL_NCCL_NONBLOCKING", "0",
       "1: MPI_I* calls on GPU memory may take route nccl too; only for a program that "
       "starts its non-blocking collectives on all communicators in one order on every "
       "rank (NCCL kernels of different communicators can otherwise deadlock); 0: they "
       "take the table's next rule"},
      {"STREAMCOLL_NVGROUP_NONBLOCKING", "0",
       "1: MPI_I* calls on GPU memory may take route nvgroup too (one group per "
       "communicator); only for a program that starts its non-blocking collectives on all "
       "communicators in one order on every rank (the group's kernels wait for each "
       "other); 0: they take the table's next rule"},
      {"STREAMCOLL_STAGING_KERNEL", "1",
       "1: host staging moves four or more copies between one GPU and its pinned staging "
       "memory (a fused group's) with one kernel launch per 64 instead of a copy each "
       "(builds with the kernels, GPUs of compute capability 8.0 or more); 0: a copy each"},
      {"STREAMCOLL_DECISION_CACHE", "auto",
       "auto|1|0: each communicator keeps the tuning table's rules per call signature "
       "(collective, bytes, memory kind, stream), so a repeated call skips the table walk: "
       "1 always, 0 never, auto when the table has 16 rules or more (below that the walk "
       "costs less than the lookup)"},
      {"STREAMCOLL_FUSION_CYCLE", "1000",
       "microseconds a group of fused MPI_Iallreduce calls (tuning table: fuse=) stays open "
       "for more members when this rank neither waits for nor tests any of them (Horovod's "
       "cycle time); a wait, a test or another call on the communicator closes it at once. "
       "Affects only how many calls are fused, never which: the ranks agree on that"},
      {"STREAMCOLL_FUSION_NCCL", "0",
       "1: a fused message of MPI_Iallreduce calls on GPU memory (tuning table: fuse=) may "
       "run on NCCL where the rules give an allreduce of its size on GPU memory to route "
       "nccl. Fused messages start when their group is agreed, on the progress thread, so "
       "their NCCL kernels interleave with the program's other NCCL operations differently "
       "on each rank: only for GPUs that run NCCL kernels of different communicators "
       "together, or programs whose fusing communicators are the only ones on NCCL; 0: they "
       "run on the host (pmpi or ht)"},
      {"STREAMCOLL_MPI_CUDA_AWARE", "auto",
       "auto|yes|no: whether the MPI accepts GPU buffers (auto asks it: "
       "MPIX_Query_cuda_support, MPIX_GPU_query_support; not found means no); when it does "
       "not, GPU buffers of calls that go to the MPI are staged through host memory"},
      {"STREAMCOLL_THREAD_MULTIPLE", "auto",
       "auto|1|0: whether MPI_Init/MPI_Init_thread ask the MPI for MPI_THREAD_MULTIPLE, which "
       "the progress thread of routes ht and blueconnect (MPI_I*) needs (the application is "
       "still told the level it asked for): auto asks only when the tuning table (with "
       "STREAMCOLL_ROUTE) has such a rule for host memory, or for GPU memory on a node with "
       "a CUDA driver; 1 always; 0 never (those routes are then off unless the application "
       "asked for MPI_THREAD_MULTIPLE itself)"},
      {"STREAMCOLL_PROGRESS_BIND", "auto",
       "auto|none: bind the progress thread (hwloc) to a core of the rank's cpuset its own "
       "threads are least likely to use, or leave it unbound"},
      {"STREAMCOLL_HT_WAIT", "auto",
       "auto|memop|kernel: how route ht holds a stream until the host collective is done: "
       "cuStreamWaitValue32 (memop), a one-thread spin kernel (kernel), or memop where the "
       "driver supports it and the kernel otherwise (auto)"},
      {"STREAMCOLL_HIERARCHY", "",
       "factors such as 2x2x2 (innermost level first): route blueconnect imposes this "
       "hierarchy, ranks in order, on every communicator of that size, instead of the "
       "discovered one (the tuning table's hierarchy= wins over it)"},
      {"STREAMCOLL_NODE_GROUPS", "",
       "levels above the node for route blueconnect: ';'-separated extended regular "
       "expressions, innermost first, matched against each node's name; the first "
       "parenthesised part (or the whole match) names its switch, rack, ..."},
  };
  return k;
}

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

bool parse_cuda_aware(std::string_view s, CudaAware* out) {
  if (lower(s) == "auto") return *out = CudaAware::auto_detect, true;
  bool b = false;
  if (!parse_bool(s, &b)) return false;
  *out = b ? CudaAware::yes : CudaAware::no;
  return true;
}

Settings read_settings() {
  Settings s;
  auto boolean = [&](const char* name, bool* dst) {
    if (const char* v = get(name); v && !parse_bool(v, dst))
      s.problems.push_back(std::string(name) + "='" + v + "' is not a boolean; ignored");
  };
  boolean("STREAMCOLL_DISABLE", &s.disable);
  boolean("STREAMCOLL_STATS", &s.stats);
  boolean("STREAMCOLL_CHECK", &s.check);
  boolean("STREAMCOLL_DRIVER_PROFILE", &s.driver_profile);
  if (const char* v = get("STREAMCOLL_DEBUG"); v && !parse_log_level(v, &s.debug)) {
    s.debug = LogLevel::warn;
    s.problems.push_back(std::string("STREAMCOLL_DEBUG='") + v +
                         "' is not none|warn|info|trace; using warn");
  }
  if (const char* v = get("STREAMCOLL_TUNING_FILE")) s.tuning_file = v;
  if (const char* v = get("STREAMCOLL_ROUTE")) s.route = v;
  if (const char* v = get("STREAMCOLL_NCCL_LIB")) s.nccl_lib = v;
  boolean("STREAMCOLL_NCCL_NONBLOCKING", &s.nccl_nonblocking);
  boolean("STREAMCOLL_NVGROUP_NONBLOCKING", &s.nvgroup_nonblocking);
  boolean("STREAMCOLL_FUSION_NCCL", &s.fusion_nccl);
  boolean("STREAMCOLL_STAGING_KERNEL", &s.staging_kernel);
  if (const char* v = get("STREAMCOLL_DECISION_CACHE")) {
    bool on = false;
    if (lower(v) == "auto") s.decision_cache = -1;
    else if (parse_bool(v, &on)) s.decision_cache = on ? 1 : 0;
    else
      s.problems.push_back(std::string("STREAMCOLL_DECISION_CACHE='") + v +
                           "' is not auto|1|0; using auto");
  }
  if (const char* v = get("STREAMCOLL_FUSION_CYCLE")) {
    char* end = nullptr;
    const unsigned long long us = std::strtoull(v, &end, 10);
    if (end != v && *end == '\0' && us <= 10000000ull) s.fusion_cycle_us = us;
    else
      s.problems.push_back(std::string("STREAMCOLL_FUSION_CYCLE='") + v +
                           "' is not a number of microseconds up to 10000000; using 1000");
  }
  if (const char* v = get("STREAMCOLL_MPI_CUDA_AWARE");
      v && !parse_cuda_aware(v, &s.mpi_cuda_aware))
    s.problems.push_back(std::string("STREAMCOLL_MPI_CUDA_AWARE='") + v +
                         "' is not auto|yes|no; using auto");
  if (const char* v = get("STREAMCOLL_THREAD_MULTIPLE")) {
    bool on = false;
    if (lower(v) == "auto") s.thread_multiple = Threads::auto_detect;
    else if (parse_bool(v, &on)) s.thread_multiple = on ? Threads::yes : Threads::no;
    else
      s.problems.push_back(std::string("STREAMCOLL_THREAD_MULTIPLE='") + v +
                           "' is not auto or a boolean; using auto");
  }
  if (const char* v = get("STREAMCOLL_PROGRESS_BIND")) {
    if (lower(v) == "none")
      s.progress_bind = false;
    else if (lower(v) != "auto")
      s.problems.push_back(std::string("STREAMCOLL_PROGRESS_BIND='") + v +
                           "' is not auto|none; using auto");
  }
  if (const char* v = get("STREAMCOLL_HT_WAIT")) {
    const std::string w = lower(v);
    if (w == "auto") s.ht_wait = HtWait::auto_detect;
    else if (w == "memop") s.ht_wait = HtWait::memop;
    else if (w == "kernel") s.ht_wait = HtWait::kernel;
    else
      s.problems.push_back(std::string("STREAMCOLL_HT_WAIT='") + v +
                           "' is not auto|memop|kernel; using auto");
  }
  if (const char* v = get("STREAMCOLL_HIERARCHY")) {
    if (auto f = topo::parse_factors(v))
      s.hierarchy = *f;
    else
      s.problems.push_back(std::string("STREAMCOLL_HIERARCHY='") + v +
                           "' is not a list of factors like 2x2x2; ignored");
  }
  if (const char* v = get("STREAMCOLL_NODE_GROUPS")) s.node_groups = v;
  return s;
}

}  // namespace streamcoll::config
