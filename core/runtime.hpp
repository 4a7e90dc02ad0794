// The process-wide state of streamcoll, with an explicit lifetime: started when the
// application initialises MPI (or at the first intercepted call, if MPI was initialised
// behind our back, e.g. from Fortran), stopped before MPI_Finalize returns (from our
// MPI_Finalize wrapper, or from the delete callback of an attribute on MPI_COMM_SELF,
// which MPI runs first thing in MPI_Finalize).
#pragma once

#include <atomic>
#include <mutex>

#include "config/env.hpp"
#include "config/tuning_table.hpp"
#include "core/stats.hpp"
#include "core/types.hpp"

namespace streamcoll {

/// Bit c set: a call of collective Coll(c) with well-formed arguments goes straight to
/// PMPI_ (runtime running, no statistics, nothing in the table or the memory can route
/// it elsewhere). Read by every wrapper; written only by Runtime::start/stop.
inline std::atomic<uint32_t> g_passthrough{0};

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

  const config::Settings& settings() const { return settings_; }
  const config::TuningTable& table() const { return table_; }
  Stats& stats() { return stats_; }
  bool stats_on() const { return settings_.stats; }
  bool check_on() const { return settings_.check; }
  bool cuda_usable() const { return cuda_usable_; }

  /// Whether a call of `c` must be looked at beyond the pass-through fast path: buffers
  /// may be on a GPU, the table may route host memory, or STREAMCOLL_CHECK is on.
  bool full_path(Coll c) const {
    return full_path_.load(std::memory_order_relaxed) >> static_cast<int>(c) & 1u;
  }

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
  Stats stats_;
  bool cuda_usable_ = false;
  std::atomic<uint32_t> full_path_{0};
  int self_keyval_ = MPI_KEYVAL_INVALID;
};

}  // namespace streamcoll
