#include "core/progress.hpp"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/log.hpp"
#include "core/cuda_driver.hpp"
#include "core/trace.hpp"

#if STREAMCOLL_HAVE_HWLOC
#include <hwloc.h>
#endif

namespace streamcoll::progress {

int bind_choice(int cores, int pus_per_core, int main_core, int local_rank, bool* sibling_pu) {
  *sibling_pu = false;
  if (cores <= 0) return -1;
  if (cores == 1) {
    // One core: its second hardware thread if it has one, else stay where we are.
    if (pus_per_core >= 2) {
      *sibling_pu = true;
      return 0;
    }
    return -1;
  }
  // Applications start their threads on the first cores of their set (OpenMP's default
  // places); take them from the other end, one per rank of the node, and never the core
  // the application thread is on.
  int idx = cores - 1 - (local_rank < 0 ? 0 : local_rank % cores);
  if (idx == main_core) idx = (idx + cores - 1) % cores;
  return idx;
}

namespace {

std::atomic<bool> g_bind{true};

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  return end && *end == '\0' ? static_cast<int>(x) : fallback;
}

// The rank's index on its node, from the launcher (Open MPI, MPICH/Hydra, Slurm).
int local_rank_from_env() {
  for (const char* n : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID",
                        "PMI_LOCAL_RANK"}) {
    int r = env_int(n, -1);
    if (r >= 0) return r;
  }
  return 0;
}

#if STREAMCOLL_HAVE_HWLOC
// Decided on the submitting (application) thread, applied by the engine thread.
struct Binding {
  hwloc_topology_t topo = nullptr;
  hwloc_bitmap_t set = nullptr;  // null: leave the thread unbound
  std::string where;

  ~Binding() {
    if (set) hwloc_bitmap_free(set);
    if (topo) hwloc_topology_destroy(topo);
  }

  void choose() {
    if (hwloc_topology_init(&topo) != 0 || hwloc_topology_load(topo) != 0) {
      where = "not bound (hwloc could not load the topology)";
      return;
    }
    hwloc_bitmap_t proc = hwloc_bitmap_alloc();
    hwloc_const_bitmap_t allowed = hwloc_topology_get_allowed_cpuset(topo);
    if (hwloc_get_cpubind(topo, proc, HWLOC_CPUBIND_PROCESS) != 0 || hwloc_bitmap_iszero(proc))
      hwloc_bitmap_copy(proc, allowed);
    // An unbound application thread is wherever the scheduler put it a moment ago: only
    // a bound one has a core worth avoiding.
    const bool bound = !hwloc_bitmap_isincluded(allowed, proc);
    hwloc_bitmap_t here = hwloc_bitmap_alloc();
    hwloc_get_last_cpu_location(topo, here, HWLOC_CPUBIND_THREAD);

    const int ncores = hwloc_get_nbobjs_inside_cpuset_by_type(topo, proc, HWLOC_OBJ_CORE);
    int main_core = -1, pus = 1;
    for (int i = 0; i < ncores; ++i) {
      hwloc_obj_t core = hwloc_get_obj_inside_cpuset_by_type(topo, proc, HWLOC_OBJ_CORE, i);
      if (bound && core && hwloc_bitmap_intersects(core->cpuset, here)) main_core = i;
      if (core && i == 0) pus = hwloc_bitmap_weight(core->cpuset);
    }
    bool sibling = false;
    const int idx = bind_choice(ncores, pus, main_core, local_rank_from_env(), &sibling);
    if (idx >= 0) {
      hwloc_obj_t core = hwloc_get_obj_inside_cpuset_by_type(topo, proc, HWLOC_OBJ_CORE, idx);
      if (core) {
        set = hwloc_bitmap_dup(core->cpuset);
        hwloc_bitmap_and(set, set, proc);
        if (sibling) {
          int last = hwloc_bitmap_last(set);
          hwloc_bitmap_only(set, static_cast<unsigned>(last));
        }
        char buf[256];
        hwloc_bitmap_list_snprintf(buf, sizeof buf, set);
        where = "bound to core " + std::to_string(core->logical_index) + " (PU " + buf +
                (sibling ? ", the application's core's other hardware thread)" : ")");
      }
    }
    if (!set) where = "not bound (the process has one core with one hardware thread)";
    hwloc_bitmap_free(here);
    hwloc_bitmap_free(proc);
  }

  void apply() {
    if (set && hwloc_set_cpubind(topo, set, HWLOC_CPUBIND_THREAD) != 0)
      where = "not bound (hwloc_set_cpubind failed)";
  }
};
#endif

class Engine {
 public:
  bool submit(Task* t) {
    if (state_.load(std::memory_order_acquire) == kStopped) return false;
    t->serial = serial_.fetch_add(1, std::memory_order_relaxed);
    Task* head = head_.load(std::memory_order_relaxed);
    do {
      t->next_ = head;
    } while (!head_.compare_exchange_weak(head, t, std::memory_order_seq_cst,
                                          std::memory_order_relaxed));
    if (state_.load(std::memory_order_acquire) == kIdle) start();
    wake();
    return true;
  }

  void wake() {
    if (sleeping_.load(std::memory_order_seq_cst)) {
      std::lock_guard<std::mutex> lock(mu_);
      woken_ = true;
      cv_.notify_one();
    }
  }

  void stop() {
    std::unique_lock<std::mutex> lock(start_mu_);
    if (state_.load() == kStopped) return;
    const bool was_running = state_.load() == kRunning;
    state_.store(kStopped, std::memory_order_release);
    if (!was_running) return;
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_requested_ = true;
      cv_.notify_one();
    }
    thread_.join();
    SC_INFO("progress thread stopped after %llu operation(s)",
            static_cast<unsigned long long>(serial_.load()));
  }

  bool running() const { return state_.load(std::memory_order_acquire) == kRunning; }
  bool on_engine_thread() const { return std::this_thread::get_id() == thread_id_.load(); }

 private:
  enum : int { kIdle = 0, kRunning = 1, kStopped = 2 };

  void start() {
    std::lock_guard<std::mutex> lock(start_mu_);
    if (state_.load() != kIdle) return;
#if STREAMCOLL_HAVE_HWLOC
    auto* binding = new Binding;
    if (!g_bind.load())
      binding->where = "not bound (STREAMCOLL_PROGRESS_BIND=none)";
    else
      binding->choose();
#else
    void* binding = nullptr;
#endif
    thread_ = std::thread([this, binding] {
      thread_id_.store(std::this_thread::get_id());
      loop(binding);
    });
    state_.store(kRunning, std::memory_order_release);
  }

  // Takes everything submitted so far, in submission order, onto the active list.
  bool take_submitted() {
    Task* t = head_.exchange(nullptr, std::memory_order_seq_cst);
    if (!t) return false;
    const size_t first = active_.size();
    for (; t; t = t->next_) active_.push_back(t);
    std::reverse(active_.begin() + static_cast<std::ptrdiff_t>(first), active_.end());
    return true;
  }

#if STREAMCOLL_HAVE_HWLOC
  void loop(Binding* binding) {
    binding->apply();
    SC_INFO("progress thread started, %s", binding->where.c_str());
    delete binding;
#else
  void loop(void*) {
    SC_INFO("progress thread started (built without hwloc: not bound)");
#endif
    pthread_setname_np(pthread_self(), "sc-progress");
    unsigned idle_passes = 0;
    [[maybe_unused]] bool relaxed = false;  // cuda::relax_capture_mode done
    for (;;) {
#if STREAMCOLL_HAVE_CUDA
      if (take_submitted() && !relaxed) relaxed = cuda::relax_capture_mode();
#else
      take_submitted();
#endif
      if (active_.empty()) {
        std::unique_lock<std::mutex> lock(mu_);
        sleeping_.store(true, std::memory_order_seq_cst);
        // Re-check after announcing the sleep: a submitter that pushed before seeing
        // sleeping_ == true is seen here (both sides use seq_cst).
        if (head_.load(std::memory_order_seq_cst) == nullptr) {
          if (stop_requested_) {
            sleeping_.store(false);
            return;
          }
          cv_.wait(lock, [&] {
            return stop_requested_ || head_.load(std::memory_order_seq_cst) != nullptr;
          });
        }
        sleeping_.store(false, std::memory_order_seq_cst);
        continue;
      }
      size_t kept = 0;
      uint64_t until = UINT64_MAX;  // the earliest idle_until_ns() of the kept tasks
      for (size_t i = 0; i < active_.size(); ++i) {
        Task* t = active_[i];
        if (!t->nvtx_range && trace::nvtx_on() && t->what()) t->nvtx_range = trace::range_start(t->what());
        if (t->step()) {
          if (t->nvtx_range) trace::range_end(t->nvtx_range);
          delete t;
        } else {
          active_[kept++] = t;
          until = std::min(until, t->idle_until_ns());
        }
      }
      const bool finished_some = kept != active_.size();
      active_.resize(kept);
      if (kept && until != 0 && !finished_some) {
        // Every task waits for a time or for work from another thread: sleep until then.
        std::unique_lock<std::mutex> lock(mu_);
        woken_ = false;
        sleeping_.store(true, std::memory_order_seq_cst);
        if (head_.load(std::memory_order_seq_cst) == nullptr && !stop_requested_) {
          const uint64_t now = static_cast<uint64_t>(
              std::chrono::duration_cast<std::chrono::nanoseconds>(
                  std::chrono::steady_clock::now().time_since_epoch())
                  .count());
          if (until > now)
            cv_.wait_for(lock, std::chrono::nanoseconds(until - now), [&] {
              return woken_ || stop_requested_ || head_.load(std::memory_order_seq_cst) != nullptr;
            });
        }
        sleeping_.store(false, std::memory_order_seq_cst);
        idle_passes = 0;
        continue;
      }
      // Waiting on the network or the GPU: spin for low latency, but let other threads of
      // an oversubscribed node (and this rank's own) run now and then.
      idle_passes = finished_some ? 0 : idle_passes + 1;
      if (idle_passes >= 64) {
        sched_yield();
        idle_passes = 0;
      }
    }
  }

  std::atomic<Task*> head_{nullptr};
  std::atomic<int> state_{kIdle};
  std::atomic<bool> sleeping_{false};
  std::atomic<uint64_t> serial_{0};
  std::atomic<std::thread::id> thread_id_{};
  std::mutex start_mu_;  // start and stop
  std::mutex mu_;        // sleeping and waking
  std::condition_variable cv_;
  bool stop_requested_ = false;  // guarded by mu_
  bool woken_ = false;           // guarded by mu_: wake() since the engine went to sleep
  std::thread thread_;
  std::vector<Task*> active_;  // engine thread only
};

Engine& engine() {
  static Engine* e = new Engine;  // never destroyed: tasks may be submitted at exit
  return *e;
}

}  // namespace

void set_binding(bool enabled) { g_bind.store(enabled); }
bool submit(Task* t) { return engine().submit(t); }
void wake() { engine().wake(); }
void stop() { engine().stop(); }
bool running() { return engine().running(); }
bool on_engine_thread() { return engine().on_engine_thread(); }

}  // namespace streamcoll::progress
