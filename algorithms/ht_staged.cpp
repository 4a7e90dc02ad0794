// Route ht on GPU buffers: the stream-ordered task and requests run through the progress
// engine, the unwinding after a failure on a stream, the classic blocking call, and the
// stand-in part of a rank that lost its input (algorithms/ht_staged.hpp).
#include "algorithms/ht_staged.hpp"

#include <atomic>

#include "base/log.hpp"
#include "core/cuda_driver.hpp"
#include "core/errors.hpp"
#include "core/requests.hpp"

namespace streamcoll::ht_detail {

#if STREAMCOLL_HAVE_CUDA

staging::Layout plan_copies(const CollArgs& a, int rank, int size) {
  staging::Layout l;
  staging::layout(a, rank, size, &l, /*result_apart=*/true);
  return l;
}

namespace {

// A stream-ordered operation, advanced by the engine: wait for the D2H copy, run the host
// collective, release the stream, wait for the H2D copy, recycle.
class DeviceTask;

// MPI_I* on GPU buffers. With a stream: MPI_Wait makes the application's stream wait for
// the side stream's copy-out event and completes at once (the host does not wait).
// Without: the engine completes it when the result is in the GPU buffer.
class DeviceRequest final : public ManagedRequest {
 public:
  DeviceRequest(bool stream_ordered, CUstream app_stream, Device* gpu, CUevent done)
      : stream_ordered_(stream_ordered), app_stream_(app_stream), gpu_(gpu), done_(done) {}
  ~DeviceRequest() override { DeviceSide::get().put_event(*gpu_, done_); }

  void on_wait() override {
    if (stream_ordered_)
      join();
    else
      done_signal_.wait();
  }
  void on_test() override { join(); }  // a stream-ordered request is complete once joined
  void on_free() override {  // the operation must still complete, as for MPI_Wait
    if (stream_ordered_)
      join();
    else
      done_signal_.wait();
  }
  int error() const override { return err_.load(std::memory_order_acquire); }
  /// Classic mode only: the engine's report.
  void finish(int rc) {
    err_.store(rc, std::memory_order_release);
    done_signal_.signal();
    complete();
  }

 private:
  void join() {
    if (!stream_ordered_ || joined_.exchange(true)) return;
    cuda::ScopedContext scope(gpu_->ctx);
    if (const int rc = SC_CU_CHECK(cuda::driver().cuStreamWaitEvent(app_stream_, done_, 0),
                                   "ht: cuStreamWaitEvent (MPI_Wait)"))
      err_.store(rc);
    complete();
  }

  const bool stream_ordered_;
  CUstream app_stream_;
  Device* gpu_;
  CUevent done_;  // owned: recorded after the H2D copy on the side stream
  std::atomic<bool> joined_{false};
  std::atomic<int> err_{MPI_SUCCESS};
  Completion done_signal_;
};

class DeviceTask final : public progress::Task {
 public:
  DeviceTask(std::shared_ptr<HtComm> comm, Staging st, std::unique_ptr<HostPart> part,
             DeviceRequest* req, std::atomic<int>* stage_tasks)
      : comm_(std::move(comm)), st_(st), part_(std::move(part)), req_(req), stage_tasks_(stage_tasks) {
    if (stage_tasks_) stage_tasks_->fetch_add(1, std::memory_order_relaxed);
  }
  const char* what() const override {
    return "ht: host collective of a GPU call (progress thread)";
  }

  bool step() override {
    const cuda::Driver& d = cuda::driver();
    cuda::ScopedContext scope(st_.gpu->ctx);
    if (phase_ == 0) {
      CUresult r = SC_CU_RESULT(d.cuEventQuery(st_.copied_in));
      if (r == CUDA_ERROR_NOT_READY) return false;
      if (r != CUDA_SUCCESS) {  // no input: take part all the same, tainted
        own_ = SC_CU_FAIL(r, "ht: D2H copy");
        part_->taint();
        // Whatever the copy did, it must be over before the host collective writes the
        // staging buffer (a driver with a sticky error runs nothing more).
        d.cuEventSynchronize(st_.copied_in);
      }
      phase_ = 1;
    }
    if (phase_ == 1) {
      bool done = false;
      int rc = part_->step(&done);
      if (!done) return false;
      rc = outcome(own_, rc, part_->tainted());
      part_.reset();
      // A stream-ordered failure is recorded before the stream goes on, so that a call
      // the application makes once its stream is through reports it.
      if (rc != MPI_SUCCESS && !req_) report_async(rc);
      // Let the stream go on: it copies the staging buffer back (a valid result, or, on
      // failure, whatever is there: the caller hears of the error).
      __atomic_store_n(st_.flag, 1u, __ATOMIC_RELEASE);
      st_.flag_written = true;
      if (rc != MPI_SUCCESS) return finish(rc);
      phase_ = 2;
    }
    CUresult r = SC_CU_RESULT(d.cuEventQuery(st_.copied_out));
    if (r == CUDA_ERROR_NOT_READY) return false;
    return finish(SC_CU_CHECK(r, "ht: H2D copy"));
  }

  /// For a task the engine never took: lets the stream go on, recycles, reports `rc`.
  void abandon(int rc) {
    cuda::ScopedContext scope(st_.gpu->ctx);
    finish(rc);
  }

 private:
  bool finish(int rc) {
    part_.reset();
    // After an error the stream may still be copying: wait for it before recycling.
    if (rc != MPI_SUCCESS && st_.copied_out) {
      if (!st_.flag_written) {
        __atomic_store_n(st_.flag, 1u, __ATOMIC_RELEASE);
        st_.flag_written = true;
      }
      cuda::driver().cuEventSynchronize(st_.copied_out);
    }
    st_.release();
    if (req_) req_->finish(rc);
    else if (rc != MPI_SUCCESS) report_async(rc);
    // The last use of this call's state: its stage caller may go on (CallEnv::stage_tasks).
    if (stage_tasks_) stage_tasks_->fetch_sub(1, std::memory_order_release);
    return true;
  }

  // Stream-ordered: the call returned long ago; a later call on the communicator reports
  // it (once). Later calls themselves are unaffected.
  void report_async(int rc) {
    if (reported_) return;
    reported_ = true;
    log_error("ht: a stream-ordered operation failed (MPI error %d); the next call on the "
              "communicator reports it", rc);
    int none = MPI_SUCCESS;
    comm_->async_error->compare_exchange_strong(none, rc);
  }

  std::shared_ptr<HtComm> comm_;
  Staging st_;
  std::unique_ptr<HostPart> part_;
  DeviceRequest* req_;  // classic MPI_I* only: null for stream-ordered calls
  std::atomic<int>* stage_tasks_;  // CallEnv::stage_tasks, or null
  int phase_ = 0;
  int own_ = MPI_SUCCESS;  // this rank's failure before the collective
  bool reported_ = false;
};

// Cleans up, on the engine, after a failure on a stream the host must not wait for (the
// application's attached stream, or one ordered after it: it may hold work the
// application releases only later): once the copy in is over (its event), the flag lets
// the stream on; once the copy back is over (its event), everything goes back to the
// pools. What no event can tell the stream is through with (a flag it may still wait on,
// a staging buffer it may still read) stays allocated: a failure costs that much.
class UnwindTask final : public progress::Task {
 public:
  UnwindTask(Staging st, bool enqueued, bool recorded_in, bool held, bool recorded_out)
      : st_(st), enqueued_(enqueued), in_(recorded_in), held_(held), out_(recorded_out) {}
  bool step() override {
    const cuda::Driver& d = cuda::driver();
    cuda::ScopedContext scope(st_.gpu->ctx);
    if (in_ && d.cuEventQuery(st_.copied_in) == CUDA_ERROR_NOT_READY) return false;
    if (held_ && !st_.flag_written) {
      __atomic_store_n(st_.flag, 1u, __ATOMIC_RELEASE);
      st_.flag_written = true;
    }
    if (out_ && d.cuEventQuery(st_.copied_out) == CUDA_ERROR_NOT_READY) return false;
    if (out_ || !enqueued_ || (in_ && !held_)) {
      st_.release();  // the stream is through with all of it
    } else {  // leave what the stream may still use; the events can go
      DeviceSide& ds = DeviceSide::get();
      ds.put_event(*st_.gpu, st_.copied_in);
      ds.put_event(*st_.gpu, st_.copied_out);
    }
    return true;
  }

 private:
  Staging st_;
  bool enqueued_, in_, held_, out_;
};

}  // namespace

void unwind_staged(Staging* st, CUstream stream, bool may_block, bool enqueued,
                   bool recorded_in, bool held, bool recorded_out) {
  const cuda::Driver& d = cuda::driver();
  if (may_block || !enqueued) {
    if (held) {
      if (recorded_in) d.cuEventSynchronize(st->copied_in);
      __atomic_store_n(st->flag, 1u, __ATOMIC_RELEASE);
      st->flag_written = true;
    }
    if (enqueued) d.cuStreamSynchronize(stream);
    st->release();
    return;
  }
  auto* task = new UnwindTask(*st, enqueued, recorded_in, held, recorded_out);
  if (!progress::submit(task)) delete task;  // no engine (after MPI_Finalize began): left as is
  *st = Staging{};
}

namespace {

// Enqueues the copies and the wait on `stream`. Returns an MPI error code; on failure
// everything acquired is released (unwind_staged).
int enqueue_staged(Staging* st, const staging::Layout& l, void* recvbuf, CUstream stream,
                   config::HtWait mode, bool may_block) {
  DeviceSide& ds = DeviceSide::get();
  const cuda::Driver& d = cuda::driver();
  // What is on the stream so far: on a failure, the copy in must be over before the flag
  // lets the stream read the staging buffer, and the stream through before the buffers
  // are recycled (or the caller's freed).
  bool enqueued = false, recorded = false, held = false;
  auto unwind = [&](int rc) {
    unwind_staged(st, stream, may_block, enqueued, recorded, held, false);
    return rc;
  };
  st->host = ds.pool.get(l.scratch);
  if (!st->host)
    return unwind(SC_CU_FAIL(CUDA_ERROR_OUT_OF_MEMORY, "ht: cuMemHostAlloc (staging buffer)"));
  if (!ds.pool.get_flag(&st->flag, &st->dev_flag))
    return unwind(SC_CU_FAIL(CUDA_ERROR_OUT_OF_MEMORY, "ht: cuMemHostAlloc (flag)"));
  st->copied_in = ds.event(*st->gpu);
  st->copied_out = ds.event(*st->gpu);
  if (!st->copied_in || !st->copied_out)
    return unwind(SC_CU_FAIL(CUDA_ERROR_UNKNOWN, "ht: cuEventCreate"));
  const auto buf = reinterpret_cast<CUdeviceptr>(st->host);
  if (const int rc = staging::copy_in(l, buf, stream)) return unwind(rc);
  enqueued = l.in_bytes > 0;
  if (const int rc = SC_CU_CHECK(d.cuEventRecord(st->copied_in, stream), "ht: cuEventRecord"))
    return unwind(rc);
  enqueued = recorded = true;
  if (const int rc = SC_CU_CHECK(ds.hold_stream(*st->gpu, stream, st->dev_flag, mode),
                                 "ht: holding the stream (cuStreamWaitValue32 / spin kernel)"))
    return unwind(rc);
  held = true;  // from here the stream waits on the flag: bail() releases it
  if (const int rc = staging::copy_out(l, buf, recvbuf, stream)) return unwind(rc);
  if (const int rc = SC_CU_CHECK(d.cuEventRecord(st->copied_out, stream), "ht: cuEventRecord"))
    return unwind(rc);
  return MPI_SUCCESS;
}

}  // namespace

int run_device_classic(const CollArgs& a, HtComm& hc, AlgoSel algo, int extent, Device& gpu,
                       bool status) {
  const cuda::Driver& d = cuda::driver();
  DeviceSide& ds = DeviceSide::get();
  cuda::ScopedContext scope(gpu.ctx);
  const staging::Layout l = plan_copies(a, hc.rank, hc.size);
  void* host = ds.pool.get(l.scratch);
  std::vector<char> pageable;
  if (!host) {
    SC_WARN("ht: no pinned memory for %llu bytes of staging; using pageable memory",
            static_cast<unsigned long long>(l.scratch));
    pageable.resize(l.scratch ? l.scratch : 1);
  }
  char* h = host ? static_cast<char*>(host) : pageable.data();
  CUstream legacy = cuda::classic_stream();  // the legacy default stream, as a rule
  const auto buf = reinterpret_cast<CUdeviceptr>(h);
  int own = staging::copy_in(l, buf, legacy);
  if (own == MPI_SUCCESS && l.in_bytes) own = SC_CU_CHECK(d.cuStreamSynchronize(legacy), "ht: D2H copy");
  // Every rank runs the collective, even after a local copy failure (tainted), so none
  // hangs and none takes this rank's garbage for data.
  HostCall hcall = host_call(a, algo, hc.rank, extent, h);
  hcall.tainted = own != MPI_SUCCESS;
  hcall.status = status;
  int rc = run_blocking(hcall, hc, a.comm);
  if (own != MPI_SUCCESS) rc = own;
  if (rc == MPI_SUCCESS && !l.out.empty()) {
    rc = staging::copy_out(l, buf, a.recvbuf, legacy);
    if (rc == MPI_SUCCESS) rc = SC_CU_CHECK(d.cuStreamSynchronize(legacy), "ht: H2D copy");
  }
  if (host) ds.pool.put(host);
  return rc;
}

int run_device_async(const CollArgs& a, const std::shared_ptr<HtComm>& hc, AlgoSel algo,
                     int extent, Device& gpu, const CallEnv& env, config::HtWait mode,
                     bool status) {
  const cuda::Driver& d = cuda::driver();
  DeviceSide& ds = DeviceSide::get();
  cuda::ScopedContext scope(gpu.ctx);
  DeviceSide::Checked checked(ds, gpu);
  const staging::Layout l = plan_copies(a, hc->rank, hc->size);

  // The stream the work goes on: the attached stream for a blocking call; the side
  // stream, after the attached (or legacy) stream, for MPI_I*.
  CUstream app = env.has_stream ? static_cast<CUstream>(env.stream) : cuda::classic_stream();
  CUstream work = app;
  CUevent start = nullptr;
  if (a.nonblocking) {
    work = ds.side(gpu, hc->id);
    if (!work)
      return stand_in(a, hc, algo, extent, l.scratch, status,
                      fail(Failure::cuda, "ht: cuStreamCreate (side stream) failed"));
    start = ds.event(gpu);
    if (!start)
      return stand_in(a, hc, algo, extent, l.scratch, status,
                      fail(Failure::cuda, "ht: cuEventCreate failed"));
    int rc = SC_CU_CHECK(d.cuEventRecord(start, app), "ht: ordering the side stream");
    if (rc == MPI_SUCCESS)
      rc = SC_CU_CHECK(d.cuStreamWaitEvent(work, start, 0), "ht: ordering the side stream");
    ds.put_event(gpu, start);  // recorded and waited on: reusable
    if (rc != MPI_SUCCESS) return stand_in(a, hc, algo, extent, l.scratch, status, rc);
  }
  Staging st;
  st.gpu = &gpu;
  // The host may wait for the work stream only in classic mode (ours, after the legacy
  // stream); never for the application's attached stream.
  const bool may_block = !env.has_stream;
  if (int rc = enqueue_staged(&st, l, a.recvbuf, work, mode, may_block); rc != MPI_SUCCESS)
    return stand_in(a, hc, algo, extent, l.scratch, status, rc);

  DeviceRequest* req = nullptr;
  if (a.nonblocking) {
    // The request's own event (the task recycles the staging events independently).
    CUevent done = ds.event(gpu);
    if (const int rc = SC_CU_CHECK(done ? d.cuEventRecord(done, work) : CUDA_ERROR_UNKNOWN,
                                   "ht: cuEventRecord (request)")) {
      ds.put_event(gpu, done);
      unwind_staged(&st, work, may_block, true, true, true, true);  // let the stream go on
      return stand_in(a, hc, algo, extent, l.scratch, status, rc);
    }
    req = new DeviceRequest(env.has_stream, app, &gpu, done);
    if (int rc = start_request(req, a.request); rc != MPI_SUCCESS) {
      unwind_staged(&st, work, may_block, true, true, true, true);
      return stand_in(a, hc, algo, extent, l.scratch, status, rc);  // start_request deleted req
    }
  }
  HostCall hcall = host_call(a, algo, hc->rank, extent, st.host);
  hcall.status = status;
  auto part = std::make_unique<HostPart>(hc, hcall);
  // A stream-ordered request is completed by MPI_Wait itself (and may be freed by MPI
  // before the engine is done): the engine reports to it only in classic mode.
  DeviceRequest* report_to = env.has_stream ? nullptr : req;
  auto* task = new DeviceTask(hc, st, std::move(part), report_to, env.stage_tasks);
  if (!progress::submit(task)) {  // only after MPI_Finalize began: run it here
    log_error("ht: the progress engine is stopped; running the operation on this thread");
    while (!task->step()) {
    }
    delete task;
  }
  return MPI_SUCCESS;
}

int gpu_of(const CallEnv& env) {
  if (env.device >= 0) return env.device;
  const cuda::Driver& d = cuda::driver();
  CUcontext current = nullptr;
  CUdevice dev = -1;
  if (d.usable && SC_CU_RESULT(d.cuCtxGetCurrent(&current)) == CUDA_SUCCESS && current &&  // probes
      SC_CU_RESULT(d.cuCtxGetDevice(&dev)) == CUDA_SUCCESS)
    return dev;
  return 0;
}

void drop_side_streams(uint64_t id) { DeviceSide::get().drop(id); }

#else
void drop_side_streams(uint64_t) {}
#endif  // STREAMCOLL_HAVE_CUDA

int stand_in(const CollArgs& a, const std::shared_ptr<HtComm>& hc, AlgoSel algo, int extent,
             uint64_t bytes, bool status, int rc) {
  // (Without failure flags the part could not tell the others: the job ends here, before
  // the call returns.)
  if (algo == Algo::mpi && !status) abort_lost_input(a.comm, "ht", rc);
  auto* task = new StandInTask(hc, a, algo, extent, bytes, status);
  if (!progress::submit(task)) {
    while (!task->step()) {
    }
    delete task;
  }
  if (a.nonblocking && a.request) *a.request = MPI_REQUEST_NULL;
  return rc;
}

}  // namespace streamcoll::ht_detail
