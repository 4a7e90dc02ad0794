// Route ht on GPU buffers (algorithms/ht.cpp): a call's data staged through pinned host
// memory, the stream held on a flag while the host collective runs (Staging); the
// stream-ordered and non-blocking calls through the progress engine, the classic blocking
// call on the calling thread, and a rank's stand-in part after a local failure.
// Internal to route ht (ht.cpp, ht_stream.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "algorithms/ht_device.hpp"
#include "algorithms/ht_host.hpp"
#include "algorithms/route.hpp"
#include "core/progress.hpp"
#include "core/staging.hpp"

namespace streamcoll::ht_detail {

#if STREAMCOLL_HAVE_CUDA

// The GPU side (pinned pool, side streams, events, the spin-wait kernel): algorithms/ht_device.
using ht_device::Device;
using ht_device::DeviceSide;

// The stream-ordered part of one call on GPU buffers: staging buffer, flag, events.
struct Staging {
  Device* gpu = nullptr;
  void* host = nullptr;          // pinned staging buffer (the schedule's in-place vector)
  uint32_t* flag = nullptr;
  CUdeviceptr dev_flag = 0;
  CUevent copied_in = nullptr;   // after the D2H copy
  CUevent copied_out = nullptr;  // after the H2D copy (the stream is past the wait)
  bool flag_written = false;

  void release() {
    DeviceSide& ds = DeviceSide::get();
    if (flag && !flag_written) __atomic_store_n(flag, 1u, __ATOMIC_RELEASE);  // never strand S
    if (flag) ds.pool.put_flag(flag, dev_flag);
    ds.pool.put(host);
    if (gpu) {
      ds.put_event(*gpu, copied_in);
      ds.put_event(*gpu, copied_out);
    }
    flag = nullptr;
    host = nullptr;
    copied_in = copied_out = nullptr;
  }
};

// Where a call's data lies in its pinned staging buffer (core/staging.hpp): the vector
// host_call runs on, the root's reduce result after the input (the host schedules do not
// reduce in place). A collective ht takes always has one.
staging::Layout plan_copies(const CollArgs& a, int rank, int size);

// After a failure: the stream's use of the staging objects must be over before they are
// recycled. `may_block`: the stream is ours, ordered after nothing the application holds
// (classic calls): wait here; otherwise the engine waits (UnwindTask).
void unwind_staged(Staging* st, CUstream stream, bool may_block, bool enqueued,
                   bool recorded_in, bool held, bool recorded_out);

// Classic semantics, blocking: copy in, collective on this thread, copy out; all ordered
// with the legacy default stream, as a CUDA-aware MPI's blocking call would be. Without
// pinned memory the staging buffer is pageable (slower copies, same result); a failed
// copy in makes this rank take part tainted.
int run_device_classic(const CollArgs& a, HtComm& hc, AlgoSel algo, int extent, Device& gpu,
                       bool status);

// Stream-ordered (env.has_stream) or non-blocking: through the engine.
int run_device_async(const CollArgs& a, const std::shared_ptr<HtComm>& hc, AlgoSel algo,
                     int extent, Device& gpu, const CallEnv& env, config::HtWait mode,
                     bool status);

// The GPU whose context carries this rank's copies: the device buffer's, else the current
// context's (managed memory), else device 0.
int gpu_of(const CallEnv& env);

#endif  // STREAMCOLL_HAVE_CUDA

// (Host memory only: in every build.)
// This rank's part of a host collective whose input it could not produce: it runs on
// scratch memory, tainted, so that the other ranks are neither left waiting for it nor
// handed garbage as data, and ends by itself; nothing waits for it.
class StandInTask final : public progress::Task {
 public:
  StandInTask(const std::shared_ptr<HtComm>& hc, const CollArgs& a, AlgoSel algo, int extent,
              uint64_t bytes, bool status)
      : scratch_(bytes ? bytes : 1) {
    HostCall h = host_call(a, algo, hc->rank, extent, scratch_.data());
    h.tainted = true;
    h.status = status;
    part_ = std::make_unique<HostPart>(hc, h);  // on the application thread: ticket order
  }
  bool step() override {
    bool done = false;
    part_->step(&done);
    return done;
  }

 private:
  std::vector<char> scratch_;
  std::unique_ptr<HostPart> part_;
};

// A local failure (rc) before this rank's part of a host collective reached the engine:
// the part runs anyway, tainted, on the engine (never blocking the caller: a non-blocking
// start must not wait for other ranks), or on this thread when there is no engine.
// Returns `rc`.
int stand_in(const CollArgs& a, const std::shared_ptr<HtComm>& hc, AlgoSel algo, int extent,
             uint64_t bytes, bool status, int rc);

}  // namespace streamcoll::ht_detail
