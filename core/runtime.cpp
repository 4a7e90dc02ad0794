#include "core/runtime.hpp"

#include <mpi.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "base/log.hpp"
#include "core/agreement.hpp"
#include "core/comm_context.hpp"
#include "core/cuda_driver.hpp"
#include "core/datatypes.hpp"
#include "core/host_staging.hpp"
#include "core/progress.hpp"
#include "core/trace.hpp"
#include "streamcoll/streamcoll.h"

namespace streamcoll {
namespace {

std::atomic<int> g_app_level{-1};  // the level the application was told; -1: not ours

// MPI deletes MPI_COMM_SELF's attributes first thing in MPI_Finalize, while MPI is
// still fully usable: the standard hook for a tool to clean up (MPI-4.0 section 11.2.4).
int self_delete_fn(MPI_Comm, int, void*, void*) {
  Runtime::get().stop();
  return MPI_SUCCESS;
}

}  // namespace

void set_application_thread_level(int level) { g_app_level.store(level); }
int application_thread_level() { return g_app_level.load(); }

bool Runtime::start() {
  std::lock_guard<std::mutex> lock(mu_);
  int s = state_.load();
  if (s != not_started) return s == running;
  int initialized = 0, finalized = 0;
  PMPI_Initialized(&initialized);
  PMPI_Finalized(&finalized);
  if (!initialized || finalized) return false;

  settings_ = config::read_settings();
  cuda::set_profile(settings_.driver_profile);  // before the driver is loaded
  set_log_level(settings_.debug);
  int rank = 0;
  PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
  set_log_rank(rank);
  for (const auto& p : settings_.problems) SC_WARN("%s", p.c_str());
  load_table();
  PMPI_Query_thread(&thread_level_);
  driver_present_ = cuda::driver_present();
  const host_staging::Awareness aware = host_staging::query(settings_.mpi_cuda_aware);

  // The job-wide facts every routing decision builds on, agreed over MPI_COMM_WORLD at
  // MPI_Init (a point every rank reaches): the settings that steer routing, whether any
  // node has a CUDA driver, the thread level. Started behind MPI_Init's back (another
  // tool initialised MPI), streamcoll cannot agree, and routes nothing.
  const bool at_init = application_thread_level() >= 0;
  bool agreed = false;
  if (at_init) {
    const uint64_t fp = fingerprint();
    const int hi = static_cast<int>(fp >> 33), lo = static_cast<int>(fp & 0x7fffffff);
    int in[7] = {hi, -hi, lo, -lo, driver_present_ ? 1 : 0,
                 thread_level_ == MPI_THREAD_MULTIPLE ? 0 : 1, aware.aware ? 0 : 1};
    int out[7] = {};
    if (PMPI_Allreduce(in, out, 7, MPI_INT, MPI_MAX, MPI_COMM_WORLD) == MPI_SUCCESS) {
      agreed = out[0] == -out[1] && out[2] == -out[3];
      if (!agreed)
        log_error("the ranks of this job run with different streamcoll settings (%s, or a "
                  "different library); every call passes through",
                  config::agreed_names().c_str());
      job_gpu_ = out[4] != 0;
      // GPU memory may reach an MPI that cannot read it: every call with data exchanges
      // the ranks' staging outcomes (core/host_staging.hpp), on every rank alike.
      staging_job_ = STREAMCOLL_HAVE_CUDA && job_gpu_ && out[6] != 0;
      if (out[5] && thread_level_ == MPI_THREAD_MULTIPLE)
        thread_level_ = MPI_THREAD_SERIALIZED;  // routes that need MULTIPLE: off everywhere
    }
  } else {
    SC_INFO("MPI was initialised without streamcoll's MPI_Init: nothing is routed");
  }
  if (settings_.disable || !agreed) {
    if (settings_.disable) SC_INFO("STREAMCOLL_DISABLE is set: every call passes through");
    state_.store(disabled, std::memory_order_release);
    return false;
  }

  SC_INFO("MPI thread level %d (the application was told %d)%s", thread_level_,
          application_thread_level(),
          thread_level_ == MPI_THREAD_MULTIPLE ? "" : ": route ht is off");
  SC_INFO("%s", job_gpu_ ? "a CUDA driver is present on some node: GPU memory may be routed"
                         : "no CUDA driver on any node: only the table's host rules route");
  progress::set_binding(settings_.progress_bind);
  all_types();  // build the datatype table while MPI is surely initialised
  // An MPI that is not CUDA-aware gets GPU buffers staged through host memory; then,
  // where a driver is present, every collective with buffers must be looked at.
  if (driver_present_) host_staging::start(aware);

  uint32_t full_path = 0;
  for (int c = 0; c < kNumColls; ++c) {
    bool full = settings_.check || candidate(static_cast<Coll>(c)) ||
                (staging_job_ && static_cast<Coll>(c) != Coll::barrier);
    if (full) full_path |= 1u << c;
  }
  full_path_.store(full_path);

  comm_contexts_start();
  PMPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, self_delete_fn, &self_keyval_, nullptr);
  PMPI_Comm_set_attr(MPI_COMM_SELF, self_keyval_, nullptr);
  trace::configure(settings_);
  state_.store(running, std::memory_order_release);
  // (Statistics, the timeline and NVTX see every call: none passes straight through.)
  if (!settings_.stats && !trace::timeline_on() && !trace::nvtx_on())
    g_passthrough.store(~full_path & ((1u << kNumColls) - 1));
  SC_INFO("started (%zu tuning rules%s%s)", table_.rules().size(),
          settings_.stats ? ", statistics on" : "", settings_.check ? ", checks on" : "");
  return true;
}

uint64_t Runtime::fingerprint() const {
  // FNV-1a over everything that steers a routing decision.
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](const void* p, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      h ^= static_cast<const unsigned char*>(p)[i];
      h *= 1099511628211ull;
    }
  };
  auto mix_s = [&](const std::string& s) { mix(s.data(), s.size()); mix("\0", 1); };
  auto mix_v = [&](uint64_t v) { mix(&v, sizeof v); };
  mix_s(STREAMCOLL_VERSION);
  mix_v(STREAMCOLL_HAVE_CUDA);  // builds with and without GPU routes decide differently
  mix_v(STREAMCOLL_HAVE_NCCL);
  mix_s(config::agreed_text(settings_));  // the knobs that steer routing (config/env.cpp's rows)
  for (const config::Rule& r : table_.rules()) {
    for (uint64_t v : {uint64_t{r.colls}, r.bytes.lo, r.bytes.hi, r.ranks.lo, r.ranks.hi,
                       r.nodes.lo, r.nodes.hi, r.ppn.lo, r.ppn.hi, uint64_t{r.mems},
                       static_cast<uint64_t>(r.stream + 1),
                       static_cast<uint64_t>(r.choice.route)})
      mix_v(v);
    for (const auto& [k, v] : r.choice.params) {
      mix_s(k);
      mix_s(v);
    }
  }
  return h;
}

config::TuningTable effective_table(const config::Settings& s, bool log) {
  config::TuningTable table;
  std::optional<config::ParseError> err;
  if (!s.tuning_file.empty()) {
    std::ifstream in(s.tuning_file);
    if (!in) {
      if (log)
        log_error("STREAMCOLL_TUNING_FILE=%s: cannot open; using the default table",
                  s.tuning_file.c_str());
      err = config::ParseError{s.tuning_file, 0, "cannot open"};
    } else {
      std::stringstream text;
      text << in.rdbuf();
      table = config::TuningTable::parse(text.str(), s.tuning_file, &err);
      if (err) {
        if (log) log_error("%s; using the default table", err->to_string().c_str());
      } else if (log) {
        SC_INFO("tuning table %s: %zu rules", s.tuning_file.c_str(), table.rules().size());
      }
    }
  }
  if (s.tuning_file.empty() || err) {
    std::optional<config::ParseError> derr;
    table = config::TuningTable::parse(config::default_table_text(), "<default>", &derr);
  }
  if (!s.route.empty()) {
    std::optional<config::ParseError> rerr;
    auto forced = config::TuningTable::parse_forced(s.route, &rerr);
    if (rerr) {
      if (log) log_error("%s; STREAMCOLL_ROUTE ignored", rerr->to_string().c_str());
    } else {
      table.prepend(std::move(forced));
    }
  }
  return table;
}

void Runtime::load_table() {
  table_ = effective_table(settings_, true);
  ++table_generation_;
  forget_remembered();
}

bool Runtime::wants_thread_multiple() {
  const config::Settings s = config::read_settings();
  if (s.disable || s.thread_multiple == config::Threads::no) return false;
  if (s.thread_multiple == config::Threads::yes) return true;
  // auto: only where a route that runs the progress thread may take a call here. No
  // CUDA driver is loaded to find out (core/cuda_driver.hpp: driver_present looks only).
  return effective_table(s, false).uses_progress_thread(cuda::driver_present());
}

void Runtime::enable_stream_attribute() {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_.load() != running || !driver_present_) return;
  full_path_.store((1u << kNumColls) - 1);
  g_passthrough.store(0);
}

void Runtime::add_forced_routes(uint32_t colls) {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_.load() != running) return;
  full_path_.fetch_or(colls);
  g_passthrough.fetch_and(~colls);
}

void Runtime::stop() {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_.load() != running) return;
  // No new call is routed from here on; calls pass straight through.
  g_passthrough.store(0);
  state_.store(stopped, std::memory_order_release);
  forget_remembered();  // (the steady path: shim/steady.hpp)
  if (settings_.check) finish_agreement_checks();
  if (settings_.stats) {
    std::string table = stats_.report(MPI_COMM_WORLD);
    if (hooks_.resources) table += hooks_.resources(MPI_COMM_WORLD);
    if (!table.empty()) std::fputs(table.c_str(), stderr);
  }
  trace::finalize();  // the timeline (collective over MPI_COMM_WORLD where it is on)
  if (settings_.driver_profile) {
    // Per rank: the host time of the CUDA driver calls streamcoll made.
    int rank = 0;
    PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
    const std::string profile = cuda::profile_report();
    std::fprintf(stderr, "streamcoll driver profile (rank %d)%s\n%s", rank,
                 profile.empty() ? ": no CUDA driver call" : "", profile.c_str());
  }
  if (hooks_.threads) hooks_.threads();  // background threads first: they may hold route state
  comm_contexts_stop();
  if (hooks_.routes) hooks_.routes();  // what routes keep beyond their communicators
  if (hooks_.streams) hooks_.streams();
  host_staging::stop();
  if (self_keyval_ != MPI_KEYVAL_INVALID) PMPI_Comm_free_keyval(&self_keyval_);
  SC_INFO("stopped");
}

}  // namespace streamcoll
