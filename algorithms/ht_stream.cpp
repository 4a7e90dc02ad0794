// Route ht's stream-ordered staging for a contribution whose host part another component
// runs (fusion's stream-ordered MPI_Iallreduce calls): the copy in on a stream of its own,
// the hold and the copy back on another, MPI_Wait's join (algorithms/ht.hpp, ht_stream).
#include <mpi.h>

#include "algorithms/ht.hpp"
#include "algorithms/ht_host.hpp"
#include "algorithms/ht_staged.hpp"
#include "base/log.hpp"
#include "core/cuda_driver.hpp"
#include "core/errors.hpp"
#include "core/progress.hpp"
#include "core/runtime.hpp"

namespace streamcoll::ht_stream {

using ht_detail::drop_side_streams;
using ht_detail::g_next_comm_id;
#if STREAMCOLL_HAVE_CUDA
using ht_detail::Device;
using ht_detail::DeviceSide;
using ht_detail::gpu_of;
using ht_detail::Staging;
using ht_detail::unwind_staged;
#endif


Streams::Streams() : copy_key_(g_next_comm_id.fetch_add(2)), hold_key_(copy_key_ + 1) {}
Streams::~Streams() {
  drop_side_streams(copy_key_);
  drop_side_streams(hold_key_);
}

#if STREAMCOLL_HAVE_CUDA
namespace {

class JoinImpl final : public Join {
 public:
  JoinImpl(Device* gpu, CUevent done) : gpu_(gpu), done_(done) {}
  ~JoinImpl() override { DeviceSide::get().put_event(*gpu_, done_); }
  int wait_on(void* app) override {
    cuda::ScopedContext scope(gpu_->ctx);
    if (const int rc = SC_CU_CHECK(cuda::driver().cuStreamWaitEvent(static_cast<CUstream>(app), done_, 0),
                                   "fusion: cuStreamWaitEvent (MPI_Wait)"))
      return rc;
    return MPI_SUCCESS;
  }

 private:
  Device* gpu_;
  CUevent done_;
};

// After finish(): waits for the copy back, reports its failure, recycles.
class TailTask final : public progress::Task {
 public:
  TailTask(Staging st, std::shared_ptr<std::atomic<int>> async_error)
      : st_(st), async_error_(std::move(async_error)) {}
  bool step() override {
    cuda::ScopedContext scope(st_.gpu->ctx);
    const CUresult r = SC_CU_RESULT(cuda::driver().cuEventQuery(st_.copied_out));
    if (r == CUDA_ERROR_NOT_READY) return false;
    if (r != CUDA_SUCCESS) {
      const int rc = SC_CU_FAIL(r, "fusion: H2D copy");
      cuda::driver().cuEventSynchronize(st_.copied_out);
      int none = MPI_SUCCESS;
      if (async_error_) async_error_->compare_exchange_strong(none, rc);
    }
    st_.release();
    return true;
  }

 private:
  Staging st_;
  std::shared_ptr<std::atomic<int>> async_error_;
};

class StageImpl final : public Stage {
 public:
  StageImpl(Staging st, std::shared_ptr<std::atomic<int>> async_error)
      : st_(st), async_error_(std::move(async_error)) {}
  ~StageImpl() override {
    if (st_.host) finish();  // never strand the hold stream
  }
  void* buffer() const override { return st_.host; }
  Input input(int* rc) override {
    if (state_ != Input::pending) {
      *rc = rc_;
      return state_;
    }
    cuda::ScopedContext scope(st_.gpu->ctx);
    const CUresult r = SC_CU_RESULT(cuda::driver().cuEventQuery(st_.copied_in));
    if (r == CUDA_ERROR_NOT_READY) return Input::pending;
    if (r != CUDA_SUCCESS) {
      rc_ = SC_CU_FAIL(r, "fusion: D2H copy");
      // Over before anything writes the buffer (a sticky error runs nothing more).
      cuda::driver().cuEventSynchronize(st_.copied_in);
      state_ = Input::failed;
    } else {
      state_ = Input::ready;
    }
    *rc = rc_;
    return state_;
  }
  void finish() override {
    if (!st_.host) return;
    __atomic_store_n(st_.flag, 1u, __ATOMIC_RELEASE);
    st_.flag_written = true;
    auto* task = new TailTask(st_, async_error_);
    st_ = Staging{};
    if (!progress::submit(task)) {  // after MPI_Finalize began: finish here
      while (!task->step()) {
      }
      delete task;
    }
  }

 private:
  Staging st_;
  std::shared_ptr<std::atomic<int>> async_error_;
  Input state_ = Input::pending;
  int rc_ = MPI_SUCCESS;
};

}  // namespace

int start(const Streams& streams, int device, void* app_stream, const void* src, void* dst,
          uint64_t bytes, std::shared_ptr<std::atomic<int>> async_error,
          std::unique_ptr<Stage>* stage, std::unique_ptr<Join>* join, bool* dst_untouched) {
  *dst_untouched = true;
  const cuda::Driver& d = cuda::driver();
  DeviceSide& ds = DeviceSide::get();
  const config::HtWait mode = Runtime::get().settings().ht_wait;
  if (!d.usable || !DeviceSide::can_hold(mode))
    return fail(Failure::cuda, "fusion: this CUDA driver cannot hold a stream on a flag");
  CallEnv where;  // the buffer's GPU, else (managed memory) the current context's
  where.device = device;
  Device* gpu = ds.device(gpu_of(where));
  if (!gpu) return fail(Failure::cuda, "fusion: the buffer's GPU has no usable context");
  cuda::ScopedContext scope(gpu->ctx);
  DeviceSide::Checked checked(ds, *gpu);
  CUstream app = static_cast<CUstream>(app_stream);
  CUstream copy = ds.side(*gpu, streams.copy_key());
  CUstream hold = ds.side(*gpu, streams.hold_key());
  if (!copy || !hold) return fail(Failure::cuda, "fusion: cuStreamCreate (side stream) failed");

  Staging st;
  st.gpu = gpu;
  CUevent start_ev = ds.event(*gpu), done = ds.event(*gpu);
  st.copied_in = ds.event(*gpu);
  st.copied_out = ds.event(*gpu);
  st.host = ds.pool.get(bytes);
  const bool flag = ds.pool.get_flag(&st.flag, &st.dev_flag);
  if (!start_ev || !done || !st.copied_in || !st.copied_out || !st.host || !flag) {
    ds.put_event(*gpu, start_ev);
    ds.put_event(*gpu, done);
    if (!flag) st.flag = nullptr;
    st.release();  // nothing enqueued
    return fail(Failure::cuda, "fusion: no events or pinned memory for a stream-ordered call");
  }
  // What is on the streams so far decides how a failure unwinds (unwind_staged).
  bool enqueued = false, recorded_in = false, held = false, recorded_out = false;
  auto bail = [&](int rc) {  // rc: the failure, logged where it arose
    ds.put_event(*gpu, start_ev);
    ds.put_event(*gpu, done);
    // The call then fails on this rank, or (dst untouched) the caller synchronises the
    // call's stream and runs the call another way. Either way the application may free
    // or reuse `src` and `dst` once the call is complete, and nothing orders its stream
    // after ours: nothing of ours may still read or write them then. So the hold goes (a
    // copy back then moves the input, not a result, into `dst`: the call has failed) and
    // both streams are waited for (found as races by the fake driver: the copy in still
    // reading a freed input, be62a19 and again after a failed event record).
    if (enqueued) {
      if (held) {
        __atomic_store_n(st.flag, 1u, __ATOMIC_RELEASE);
        st.flag_written = true;
      }
      d.cuStreamSynchronize(copy);
      if (held) d.cuStreamSynchronize(hold);
    }
    unwind_staged(&st, nullptr, false, false, recorded_in, held, recorded_out);  // nothing left queued
    return rc;
  };
  const char* ordering = "fusion: ordering the copy stream after the call's stream";
  if (const int rc = SC_CU_CHECK(d.cuEventRecord(start_ev, app), ordering)) return bail(rc);
  if (const int rc = SC_CU_CHECK(d.cuStreamWaitEvent(copy, start_ev, 0), ordering)) return bail(rc);
  if (bytes > 0) {
    if (const int rc = SC_CU_CHECK(d.cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(st.host),
                                                   reinterpret_cast<CUdeviceptr>(src), bytes, copy),
                                   "fusion: cuMemcpyAsync (D2H)"))
      return bail(rc);
    enqueued = true;
  }
  if (const int rc = SC_CU_CHECK(d.cuEventRecord(st.copied_in, copy), "fusion: cuEventRecord"))
    return bail(rc);
  enqueued = recorded_in = true;
  if (const int rc = SC_CU_CHECK(d.cuStreamWaitEvent(hold, st.copied_in, 0),
                                 "fusion: cuStreamWaitEvent (hold stream)"))
    return bail(rc);
  if (const int rc = SC_CU_CHECK(ds.hold_stream(*gpu, hold, st.dev_flag, mode),
                                 "fusion: holding the stream (cuStreamWaitValue32 / spin kernel)"))
    return bail(rc);
  held = true;
  if (bytes > 0) {
    if (const int rc = SC_CU_CHECK(d.cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(dst),
                                                   reinterpret_cast<CUdeviceptr>(st.host), bytes, hold),
                                   "fusion: cuMemcpyAsync (H2D)"))
      return bail(rc);
    *dst_untouched = false;  // from here a failure lets the copy back run
  }
  if (const int rc = SC_CU_CHECK(d.cuEventRecord(st.copied_out, hold), "fusion: cuEventRecord"))
    return bail(rc);
  recorded_out = true;
  if (const int rc = SC_CU_CHECK(d.cuEventRecord(done, hold), "fusion: cuEventRecord")) return bail(rc);
  ds.put_event(*gpu, start_ev);  // recorded and waited on: reusable
  *join = std::make_unique<JoinImpl>(gpu, done);
  *stage = std::make_unique<StageImpl>(st, std::move(async_error));
  return MPI_SUCCESS;
}

#else  // !STREAMCOLL_HAVE_CUDA

int start(const Streams&, int, void*, const void*, void*, uint64_t,
          std::shared_ptr<std::atomic<int>>, std::unique_ptr<Stage>*, std::unique_ptr<Join>*,
          bool* dst_untouched) {
  *dst_untouched = true;
  return MPI_ERR_OTHER;  // no GPU calls in this build
}

#endif  // STREAMCOLL_HAVE_CUDA

}  // namespace streamcoll::ht_stream
