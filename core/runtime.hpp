// The process-wide state of streamcoll, with an explicit lifetime: started when the
// application initialises MPI (or at the first intercepted call, if MPI was initialised
// behind our back, e.g. from Fortran), stopped before MPI_Finalize returns (from our
// MPI_Finalize wrapper, or from the delete callback of an attribute on MPI_COMM_SELF,
// which MPI runs first thing in MPI_Finalize).
#pragma once

#include <mpi.h>

#include <atomic>
#include <mutex>

#include "base/types.hpp"
#include "config/env.hpp"
#include "config/tuning_table.hpp"
#include "core/stats.hpp"

namespace streamcoll {

/// Bit c set: a call of collective Coll(c) with well-formed arguments goes straight to
/// PMPI_ (runtime running, no statistics, nothing in the table or the memory can route
/// it elsewhere). Read by every wrapper; written only by Runtime::start/stop.
inline std::atomic<uint32_t> g_passthrough{0};

/// The thread level the application was told at MPI_Init (shim/init.cpp), or -1 when it
/// initialised MPI without streamcoll seeing it.
void set_application_thread_level(int level);
int application_thread_level();

/// The tuning table the settings ask for: STREAMCOLL_TUNING_FILE (or the embedded
/// default, also when the file cannot be read or parsed), with STREAMCOLL_ROUTE's rules
/// in front. `log`: say what was wrong (once MPI is up); quiet otherwise. Pure but for
/// reading the file.
config::TuningTable effective_table(const config::Settings& s, bool log);

class Runtime {
 public:
  enum State : int { not_started = 0, running = 1, disabled = 2, stopped = 3 };

  static Runtime& get() {
    static Runtime rt;
    return rt;
  }

  /// True when calls should be looked at (not disabled, MPI initialised, not finalised).
  /// Starts the runtime on first use. Cheap after the first call.
  bool active() {
    int s = state_.load(std::memory_order_acquire);
    return s == running || (s == not_started && start());
  }

  /// Starts if MPI is initialised; returns whether the runtime is running. Idempotent,
  /// thread-safe. Collective-free: it may run on one rank only.
  bool start();
  /// Prints statistics, frees every communicator context. Idempotent. Collective over
  /// MPI_COMM_WORLD when STREAMCOLL_STATS=1.
  void stop();

  /// What the layers above this one (routes, the stream attribute) release at stop(), in
  /// this order: `threads` (background threads, which may hold route state), then the
  /// communicator contexts go, then `routes` (what routes keep beyond their
  /// communicators), then `streams`. Set once by the shim when the library loads
  /// (shim/init.cpp); a null hook does nothing.
  struct StopHooks {
    void (*threads)() = nullptr;
    void (*routes)() = nullptr;
    void (*streams)() = nullptr;
    /// STREAMCOLL_STATS: what the routes took, as rank 0's text (collective over `comm`).
    std::string (*resources)(MPI_Comm comm) = nullptr;
  };
  void set_stop_hooks(const StopHooks& h) {
    std::lock_guard<std::mutex> lock(mu_);
    hooks_ = h;
  }

  const config::Settings& settings() const { return settings_; }
  const config::TuningTable& table() const { return table_; }
  /// Changes whenever table() is (re)loaded: DecisionCache drops what it kept of the old.
  uint64_t table_generation() const { return table_generation_; }
  Stats& stats() { return stats_; }
  bool stats_on() const { return settings_.stats; }
  bool check_on() const { return settings_.check; }
  /// Some node of the job has a CUDA driver (agreed at MPI_Init): GPU memory may exist,
  /// and the table's GPU rules apply.
  bool job_gpu() const { return job_gpu_; }
  /// job_gpu() and the MPI is not CUDA-aware on some rank (agreed at MPI_Init): calls on
  /// GPU memory that go to the MPI are staged, and every call with data exchanges the
  /// ranks' staging outcomes (core/host_staging.hpp).
  bool staging_job() const { return staging_job_; }

  /// Whether a call of `c` may leave pmpi on any communicator whose routes are not
  /// forced: the table routes some memory kind of it (GPU kinds only in a job with a
  /// CUDA driver). Equal on every rank: built from facts agreed at MPI_Init only.
  bool candidate(Coll c) const {
    return table_.routes_host(c) ||
           (job_gpu_ && (table_.may_leave_pmpi(c, MemKind::device) ||
                         table_.may_leave_pmpi(c, MemKind::managed)));
  }

  /// Whether a call of `c` must be looked at beyond the pass-through fast path: it is a
  /// candidate(), STREAMCOLL_CHECK is on, or this process needs to look for local reasons
  /// (GPU buffers to stage for an MPI that is not CUDA-aware, a stream attribute, routes
  /// forced on one of its communicators). Local facts may differ between ranks: the
  /// full path does nothing collective for a call that is not a candidate.
  bool full_path(Coll c) const {
    return full_path_.load(std::memory_order_relaxed) >> static_cast<int>(c) & 1u;
  }

  /// Some communicator of this process now forces routes for the collectives in `colls`
  /// (bit per Coll): those calls take the full path from now on (only that
  /// communicator's calls may leave pmpi for it: decide() asks it, not this).
  void add_forced_routes(uint32_t colls);

  /// Whether MPI_Init/MPI_Init_thread should ask the MPI for MPI_THREAD_MULTIPLE (see
  /// STREAMCOLL_THREAD_MULTIPLE: auto asks only where the effective tuning table has a rule
  /// for a route with a progress thread that can apply on this node). Before MPI exists:
  /// reads the environment and the table file itself. Not collective: the ranks agree on
  /// the level they got at start().
  static bool wants_thread_multiple();

  /// The thread level MPI provides (what streamcoll asked for at MPI_Init), and whether
  /// it is MPI_THREAD_MULTIPLE: the progress engine calls MPI from its own thread.
  int thread_level() const { return thread_level_; }
  bool thread_multiple() const { return thread_level_ == MPI_THREAD_MULTIPLE; }

  /// A communicator may now carry a CUDA stream (streamext): with a usable GPU, every
  /// collective takes the full path, so that GPU buffers on such a communicator are
  /// stream-ordered even when the table sends them to pmpi.
  void enable_stream_attribute();

 private:
  Runtime() = default;
  void load_table();

  std::atomic<int> state_{not_started};
  std::mutex mu_;
  config::Settings settings_;
  config::TuningTable table_;
  uint64_t table_generation_ = 0;
  Stats stats_;
  uint64_t fingerprint() const;  ///< of the settings that steer routing
  bool driver_present_ = false;  ///< this node has a CUDA driver (cuda::driver_present)
  bool job_gpu_ = false;         ///< some node of the job has one (agreed at MPI_Init)
  bool staging_job_ = false;     ///< see staging_job()
  std::atomic<uint32_t> full_path_{0};
  int thread_level_ = MPI_THREAD_SINGLE;
  int self_keyval_ = MPI_KEYVAL_INVALID;
  StopHooks hooks_;
};

}  // namespace streamcoll
