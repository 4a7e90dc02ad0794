// Route ht's GPU side, shared by its calls (algorithms/ht_staged.cpp) and fusion's stream-ordered
// stages (ht_stream): pinned, device-mapped host memory and 4-byte flags in a pool; per
// GPU its primary context, one side stream per communicator, an event pool, and the
// spin-wait kernel that holds a stream where stream memory operations are unsupported;
// and the check that a context reset (cudaDeviceReset) has not taken them. Everything
// lives to the end of the process (DeviceSide::get) and is freed at shutdown.
// Thread-safe, each method as its comment says.
#pragma once

#if STREAMCOLL_HAVE_CUDA

#include <cuda.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <unordered_set>
#include <utility>
#include <vector>

#include "config/env.hpp"

namespace streamcoll::ht_device {

// Pinned, device-mapped host memory in power-of-two classes, and 4-byte flags carved from
// pinned slabs. Thread-safe. Everything is freed at shutdown.
class PinnedPool {
 public:
  void* get(size_t bytes);
  void put(void* p);

  // A context reset (cudaDeviceReset) of `ctx` freed the pinned memory allocated in it:
  // the buffers and the flags of it are forgotten (never freed again), those lent out
  // too, when they come back (put, put_flag).
  void forget_context(CUcontext ctx);

  void forget_locked(void* p);

  // A flag (host address and its device address), zeroed.
  bool get_flag(uint32_t** host, CUdeviceptr* dev);
  void put_flag(uint32_t* host, CUdeviceptr dev);

  void release_all();

 private:
  static size_t size_class(size_t bytes);
  static constexpr size_t kFlags = 1024;  // per slab
  // The live slab holding flag `f`, or null. Under mu_.
  uint32_t* slab_of(uint32_t* f) const;
  std::mutex mu_;
  std::vector<void*> all_;
  std::map<size_t, std::vector<void*>> free_;
  std::map<void*, size_t> sizes_;
  std::map<void*, CUcontext> owner_;  // the context each buffer and slab was allocated in
  std::set<uint32_t*> slabs_;         // the flags' slabs, by address
  std::vector<std::pair<uint32_t*, CUdeviceptr>> free_flags_;
};

// Per GPU: its primary context, a side stream for MPI_I* per communicator, the spin
// kernel, event pool.
struct Device {
  std::mutex mu;
  bool ready = false;
  bool failed = false;
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  // One side stream per communicator (HtComm::id): operations of different communicators,
  // which ranks may start in different orders (legal MPI), are never queued one behind
  // the other, which would deadlock two ranks that started them in opposite orders.
  std::map<uint64_t, CUstream> sides;
  CUmodule module = nullptr;
  CUfunction wait_kernel = nullptr;
  std::vector<CUevent> events;  // free events (disable-timing)
  // Events given out by DeviceSide::event and not yet put back: a context reset makes
  // them stale, and they are dropped when they come back (DeviceSide::revalidate).
  std::unordered_set<CUevent> lent;
  // Made no later than every pooled event and side stream: a context reset that took
  // them took it too, so one query of it stands for all of them (DeviceSide::revalidate).
  // Null until made (then, or if it cannot be made, each object is queried instead).
  CUevent sentinel = nullptr;
  bool unvouched = false;  // objects exist that are older than the sentinel
};
// A handle's answer once a context reset (cudaDeviceReset) took its object.
bool invalidated(CUresult r);

// The GPU whose pooled objects this thread's DeviceSide::Checked scope vouches for.
extern thread_local const Device* t_checked;

class DeviceSide {
 public:
  static DeviceSide& get();

  PinnedPool pool;

  // Whether this thread's Checked scope vouches for GPU g's pooled objects. Under g.mu.
  static bool checked(const Device& g) { return t_checked == &g && g.sentinel && !g.unvouched; }

  // Whether a context reset (cudaDeviceReset) took GPU g's pooled events and side
  // streams: the sentinel is then gone too. If so they are dropped (not destroyed: they
  // are gone), and so are the events lent out, when they come back. Makes the sentinel
  // when there is none (the objects made before it, if any, are then queried one by
  // one: unvouched). Under g.mu, the context current or not.
  void revalidate(Device& g);

  // Sets up GPU `ordinal` once; false if it cannot be used.
  Device* device(int ordinal);

  // One check, for a call that takes several pooled objects of GPU g (event, side): a
  // query of the sentinel instead of one per object. A query cost 1-2 us apiece on an
  // H200, and a stream-ordered call took six (STREAMCOLL_DRIVER_PROFILE,
  // bench/results/gpu_h200_2026-11-27b/5_driver_profile_1rank.txt). Not nested, one
  // GPU at a time, on the thread that takes the objects.
  class Checked {
   public:
    Checked(DeviceSide& ds, Device& g) : g_(&g) {
      std::lock_guard<std::mutex> lock(g.mu);
      ds.revalidate(g);
      t_checked = g_;
    }
    ~Checked() { t_checked = nullptr; }
    Checked(const Checked&) = delete;
    Checked& operator=(const Checked&) = delete;

   private:
    Device* g_;
  };

  // Communicator `comm_id`'s side stream on GPU g, created at its first MPI_I* there
  // (again if a context reset took it).
  CUstream side(Device& g, uint64_t comm_id);

  // Communicator `comm_id` is gone (its last operation has finished): its side streams
  // go too (work still queued on them finishes first, as cuStreamDestroy promises).
  void drop(uint64_t comm_id);

  CUevent event(Device& g);
  void put_event(Device& g, CUevent e);

  // Makes `stream` wait until the flag at `dev_flag` is >= 1. Returns a CUresult.
  CUresult hold_stream(Device& g, CUstream stream, CUdeviceptr dev_flag, config::HtWait mode);

  // Whether this driver can hold a stream at all (memops or the kernel's entry points).
  static bool can_hold(config::HtWait mode);

  void shutdown();

 private:
  static constexpr int kMaxDevices = 64;

  CUfunction wait_kernel(Device& g);

  Device gpus_[kMaxDevices];
  std::atomic<bool> memops_unsupported_{false};
};

}  // namespace streamcoll::ht_device

#endif  // STREAMCOLL_HAVE_CUDA
