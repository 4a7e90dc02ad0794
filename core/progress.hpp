// The progress engine: one background thread per process that advances operations the
// application does not wait for on the host (Aluminum, section V-B: the host-transfer
// collectives of a stream-ordered call, and MPI_I* collectives on host buffers).
//
// Each operation is a Task, a state object whose step() does a bounded, non-blocking
// amount of work (test a CUDA event, test MPI requests, reduce a block) and says whether
// the operation is finished. Threads submit tasks through a lock-free queue (a Treiber
// stack taken whole and reversed by the engine, so tasks start in submission order);
// the engine steps every active task in turn, and sleeps on a condition variable when
// it has none.
//
// The thread starts at the first submit(), bound with hwloc to a core the rank's own
// threads are least likely to use (progress.cpp, bind_choice), and is stopped by stop(),
// from Runtime::stop() before MPI_Finalize. The engine calls MPI, so it may only run when
// MPI provides MPI_THREAD_MULTIPLE (Runtime::thread_multiple()).
#pragma once

#include <atomic>
#include <cstdint>

namespace streamcoll::progress {

class Task;
bool submit(Task* t);

class Task {
 public:
  virtual ~Task() = default;
  /// Advances the operation without blocking. Returns true when it is finished; the
  /// engine then deletes the task (so a task completes its request before returning true).
  /// Called only from the engine thread, never concurrently for one task.
  virtual bool step() = 0;
  /// After a step() that returned false: the CLOCK_MONOTONIC time (ns) before which the
  /// task has nothing to do unless another thread hands it work (0, the default: it must be
  /// stepped again at once, e.g. to test an MPI request). When every active task has such
  /// a time, the engine sleeps until the earliest, or until a submit() or wake().
  virtual uint64_t idle_until_ns() const { return 0; }
  /// What the task does, for its NVTX range on the engine's thread from its first step to
  /// its last (core/trace.hpp); nullptr (the default): no range (long-lived tasks).
  virtual const char* what() const { return nullptr; }
  /// Order of submission, for diagnostics.
  uint64_t serial = 0;
  /// The task's NVTX range (the engine's; 0: none).
  uint64_t nvtx_range = 0;
  /// Intrusive link of the submission queue: the engine's, not the task's.
  Task* next_ = nullptr;
};

/// Whether the thread is bound when it starts (STREAMCOLL_PROGRESS_BIND); before submit.
void set_binding(bool enabled);

/// Hands `t` to the engine (which owns it from here), starting the engine if needed.
/// Thread-safe and lock-free, except when it wakes a sleeping engine or starts it.
/// Returns false, and deletes nothing, if the engine is stopped for good (after stop()).
bool submit(Task* t);

/// Wakes the engine if it sleeps until a task's idle_until_ns() (a task got work from
/// another thread). Cheap when the engine is not sleeping. Thread-safe.
void wake();

/// Finishes every task already submitted, then joins the thread. Idempotent; later
/// submit() calls return false. Must not be called from the engine thread.
void stop();

/// Whether the engine thread is running now (for tests and diagnostics).
bool running();
/// True when called from the engine thread.
bool on_engine_thread();

/// Which core of the process's cpuset the engine thread goes to (pure, for tests).
/// `cores`: cores in the cpuset the process is bound to (the whole node if unbound);
/// `pus_per_core`: hardware threads per core; `main_core`: index in that cpuset of the
/// core the application thread runs on, or -1; `local_rank`: the rank's index on its node
/// (ranks bound to one shared set, or unbound, are spread over its cores from the last).
/// Returns the core index, or -1 to leave the thread where the process is bound. With a
/// single core of several hardware threads, *sibling_pu is set: the last hardware thread.
int bind_choice(int cores, int pus_per_core, int main_core, int local_rank, bool* sibling_pu);

}  // namespace streamcoll::progress
