#include "algorithms/nccl_comm.hpp"

#include <sched.h>

#include <chrono>

#include "base/log.hpp"
#include "config/env.hpp"
#include "core/cuda_driver.hpp"
#include "core/errors.hpp"
#include "core/runtime.hpp"

namespace streamcoll::nccl {

using cuda::driver;
using cuda::ScopedContext;

std::atomic<int> g_live_nccl{0};

Usage& usage() {
  static Usage* u = new Usage;  // never destroyed: communicators may go at exit
  return *u;
}

void Usage::take(uint64_t b) {
  const uint64_t now = bytes.fetch_add(b) + b;
  uint64_t peak = peak_bytes.load();
  while (now > peak && !peak_bytes.compare_exchange_weak(peak, now)) {
  }
}

bool memory_info(uint64_t* free, uint64_t* total) {
  const cuda::Driver& d = driver();
  size_t f = 0, t = 0;
  if (!d.cuMemGetInfo || SC_CU_RESULT(d.cuMemGetInfo(&f, &t)) != CUDA_SUCCESS) return false;
  *free = f;
  *total = t;
  return true;
}

// ---- Remains ----------------------------------------------------------------

bool Remains::try_free(bool final) {
  const cuda::Driver& d = driver();
  bool reset = false;
  {
    ScopedContext scope(cuctx);
    // Our own objects answer "invalid" once the context was reset under us.
    for (CUstream s : streams) {
      const CUresult r = d.cuStreamQuery(s);
      reset = reset || r == CUDA_ERROR_INVALID_HANDLE || r == CUDA_ERROR_CONTEXT_IS_DESTROYED ||
              r == CUDA_ERROR_INVALID_CONTEXT;
    }
    if (!reset) {
      const bool busy = last && d.cuEventQuery(last) == CUDA_ERROR_NOT_READY;
      if (busy && !final) return false;
      if (comm && !aborted) busy ? lib->ncclCommAbort(comm) : lib->ncclCommDestroy(comm);
      for (CUevent e : events) SC_CU_TOLERATE(d.cuEventDestroy(e));
      if (last) SC_CU_TOLERATE(d.cuEventDestroy(last));
      for (CUstream s : streams) SC_CU_TOLERATE(d.cuStreamDestroy(s));
    }
  }
  if (reset)
    SC_INFO("nccl: the CUDA context was reset under an NCCL communicator; its objects went with "
            "it, nothing more is freed");
  SC_CU_TOLERATE(d.cuDevicePrimaryCtxRelease(cudev));
  return true;
}

// ---- Reaper -----------------------------------------------------------------

Reaper& Reaper::get() {
  static Reaper* r = new Reaper;  // lives to the end: requests may drop comms late
  return *r;
}

void Reaper::dispose(Remains r) {
  if (r.try_free(false)) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (drained_) {  // after MPI_Finalize began: nothing will tick again
    r.try_free(true);
    return;
  }
  pending_.push_back(std::move(r));
}

void Reaper::tick() {
  std::vector<Remains> left;
  std::vector<Remains> todo;
  {
    std::lock_guard<std::mutex> lock(mu_);
    todo.swap(pending_);
  }
  for (Remains& r : todo)
    if (!r.try_free(false)) left.push_back(std::move(r));
  std::lock_guard<std::mutex> lock(mu_);
  for (Remains& r : left) pending_.push_back(std::move(r));
}

void Reaper::drain() {
  std::vector<Remains> todo;
  {
    std::lock_guard<std::mutex> lock(mu_);
    drained_ = true;
    todo.swap(pending_);
  }
  for (Remains& r : todo) r.try_free(true);
}

// ---- NcclComm ---------------------------------------------------------------

NcclComm::~NcclComm() {
  if (comm) g_live_nccl.fetch_sub(1);
  usage().give(bytes);
  if (!cuctx) return;
  Remains r;
  r.lib = lib;
  r.comm = comm;
  r.aborted = aborted_.load();
  r.cudev = cudev;
  r.cuctx = cuctx;
  for (CUstream s : {classic, side, copy})
    if (s) r.streams.push_back(s);
  r.events = std::move(events_);
  r.last = last_;
  Reaper::get().dispose(std::move(r));
}

bool NcclComm::usable() {
  if (failed()) return false;
  ScopedContext scope(cuctx);
  const CUresult r = SC_CU_RESULT(driver().cuStreamQuery(classic));  // only a reset says no
  return r != CUDA_ERROR_INVALID_HANDLE && r != CUDA_ERROR_CONTEXT_IS_DESTROYED &&
         r != CUDA_ERROR_INVALID_CONTEXT;
}

void NcclComm::note(CUstream s) {
  std::lock_guard<std::mutex> lock(mu_);
  // Best effort: without the note nothing is ordered after this stream (seen at warn level).
  if (!last_ && SC_CU_TOLERATE(driver().cuEventCreate(&last_, CU_EVENT_DISABLE_TIMING)) != CUDA_SUCCESS) {
    last_ = nullptr;
    return;
  }
  if (SC_CU_TOLERATE(driver().cuEventRecord(last_, s)) != CUDA_SUCCESS) {
    SC_CU_TOLERATE(driver().cuEventDestroy(last_));
    last_ = nullptr;
  }
}

CUevent NcclComm::take_event(int* rc) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!events_.empty()) {
      CUevent e = events_.back();
      events_.pop_back();
      return e;
    }
  }
  CUevent e = nullptr;
  if (const int err = SC_CU_CHECK(driver().cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), "cuEventCreate")) {
    *rc = err;
    return nullptr;
  }
  return e;
}

bool NcclComm::failed() {
  if (aborted_.load(std::memory_order_acquire)) return true;
  ncclResult_t async = ncclSuccess;
  {
    std::shared_lock<std::shared_timed_mutex> use(use_);
    if (aborted_.load(std::memory_order_acquire)) return true;
    ncclResult_t r = lib->ncclCommGetAsyncError(comm, &async);
    if (r != ncclSuccess) async = r;
  }
  if (async == ncclSuccess || async == ncclInProgress) return false;
  abort(lib->describe("asynchronous NCCL error", async, comm), true);
  return true;
}

bool NcclComm::check_faults(bool pending) {
  {
    std::lock_guard<std::mutex> lock(fault_mu_);
    if (fault_comm != MPI_COMM_NULL && !finalized()) {
      if (notify_owed_.exchange(false)) notify_locked();
      if (fault_recv_ != MPI_REQUEST_NULL) {
        int got = 0;
        MPI_Status st;
        if (PMPI_Test(&fault_recv_, &got, &st) == MPI_SUCCESS && got) {
          fault_recv_ = MPI_REQUEST_NULL;  // one notice is enough; later ones are dropped
          if (!aborted_.load())
            abort("rank " + std::to_string(st.MPI_SOURCE) + " of the communicator could "
                  "not take its part in an NCCL operation", false);
        }
      }
    }
  }
  const bool now = failed();
  if (now) {  // an asynchronous error found just now: tell the peers at once
    std::lock_guard<std::mutex> lock(fault_mu_);
    if (fault_comm != MPI_COMM_NULL && !finalized() && notify_owed_.exchange(false))
      notify_locked();
  }
  // Nothing waits for an operation here: an abort not yet reported by a call goes to
  // the next call on the communicator, where a stream-ordered operation (which returned
  // before it ran) may have been spoilt by it. Classic operations completed in their
  // call, with every rank's part: nothing to report for them.
  if (now && pending && report_owed_.exchange(false) && stream_ordered.load()) report_later();
  return now;
}

int NcclComm::fail_collectively(int rc, const std::string& why) {
  abort(why, true);
  check_faults(false);  // sends the notices
  report_owed_.store(false);  // this rank's call reports it
  return rc;
}

int NcclComm::completed(bool aborted_before) {
  // An abort from another thread (the watchdog) between the caller's look and its query
  // may have ended the kernels just before the query: after the query, look again.
  if (aborted_before || aborted()) return poll();
  check_faults(true);
  return MPI_SUCCESS;
}

int NcclComm::poll() {
  if (!check_faults(false)) return MPI_SUCCESS;
  report_owed_.store(false);
  return error_code(Failure::nccl_aborted);
}

bool NcclComm::open_faults(MPI_Comm comm) {
  if (PMPI_Comm_dup(comm, &fault_comm) != MPI_SUCCESS) {
    fault_comm = MPI_COMM_NULL;
    return false;
  }
  PMPI_Comm_set_errhandler(fault_comm, MPI_ERRORS_RETURN);
  PMPI_Comm_rank(fault_comm, &rank);
  if (PMPI_Irecv(&notice_in_, 1, MPI_INT, MPI_ANY_SOURCE, kFaultTag, fault_comm,
                 &fault_recv_) != MPI_SUCCESS)
    fault_recv_ = MPI_REQUEST_NULL;
  return true;
}

void NcclComm::close_faults() {
  std::lock_guard<std::mutex> lock(fault_mu_);
  if (fault_comm == MPI_COMM_NULL || finalized()) return;
  if (fault_recv_ != MPI_REQUEST_NULL) {
    PMPI_Cancel(&fault_recv_);
    PMPI_Wait(&fault_recv_, MPI_STATUS_IGNORE);
  }
  PMPI_Comm_free(&fault_comm);
}

int NcclComm::wait(CUevent e, CUstream s) {
  for (unsigned i = 1;; ++i) {
    const bool aborted_before = aborted();
    // CUDA_ERROR_NOT_READY: not yet.
    CUresult r = SC_CU_RESULT(e ? driver().cuEventQuery(e) : driver().cuStreamQuery(s));
    if (r == CUDA_SUCCESS) return completed(aborted_before);
    if (r != CUDA_ERROR_NOT_READY)
      return fail_collectively(
          SC_CU_FAIL(r, e ? "cuEventQuery" : "cuStreamQuery"),
          "a wait for an NCCL operation failed on this rank");
    if (i % 1024 == 0) {
      if (int rc = poll(); rc != MPI_SUCCESS) {
        // Aborted: the kernels end; let the stream drain before the caller goes on.
        (e ? driver().cuEventSynchronize(e) : driver().cuStreamSynchronize(s));
        return rc;
      }
      if (i >= 64 * 1024) sched_yield();  // a long operation: let other threads run
    }
  }
}

bool NcclComm::finalized() {
  int f = 0;
  PMPI_Finalized(&f);
  return f != 0;
}

void NcclComm::notify_locked() {
  static const int kNotice = 1;
  int n = 0;
  PMPI_Comm_size(fault_comm, &n);
  for (int p = 0; p < n; ++p) {
    if (p == rank) continue;
    MPI_Request r = MPI_REQUEST_NULL;
    if (PMPI_Isend(&kNotice, 1, MPI_INT, p, kFaultTag, fault_comm, &r) == MPI_SUCCESS)
      PMPI_Request_free(&r);
  }
}

void NcclComm::report_later() {
  if (!async_error) return;
  int none = MPI_SUCCESS;
  async_error->compare_exchange_strong(none, error_code(Failure::nccl_aborted));
}

void NcclComm::abort(std::string what, bool notify) {
  std::lock_guard<std::mutex> lock(abort_mu_);
  if (aborted_.load()) return;
  if (notify) notify_owed_.store(true);
  report_owed_.store(true);
  // Wait for a thread inside an NCCL call on this communicator to leave it. One that
  // stays (blocked inside NCCL by the very failure) is not waited for: aborting is what
  // unblocks it, and a hung job is worse.
  std::unique_lock<std::shared_timed_mutex> excl(use_, std::defer_lock);
  if (!excl.try_lock_for(std::chrono::seconds(1)))
    what += " (a thread is still inside NCCL; aborting anyway)";
  // Aborted before ncclCommAbort ends the kernels: a thread that finds an operation
  // done must find the abort too (completed()), or it would take the end an abort
  // forced for the operation's own.
  aborted_.store(true, std::memory_order_release);
  lib->ncclCommAbort(comm);
  log_error("%s; NCCL communicator of %d ranks aborted: the operation fails on every rank, "
            "and the communicator's calls take the next route from its next blocking call",
            what.c_str(), size);
}

// ---- Watchdog ---------------------------------------------------------------

Watchdog& Watchdog::get() {
  static Watchdog w;
  return w;
}

void Watchdog::watch(const std::shared_ptr<NcclComm>& c) {
  std::lock_guard<std::mutex> lock(mu_);
  comms_.push_back(c);
  if (!thread_.joinable() && !stopping_) thread_ = std::thread([this] { loop(); });
}

void Watchdog::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    comms_.clear();
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Watchdog::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    cv_.wait_for(lock, std::chrono::milliseconds(100));
    std::vector<std::shared_ptr<NcclComm>> live;
    for (auto it = comms_.begin(); it != comms_.end();) {
      if (auto c = it->lock()) {
        live.push_back(std::move(c));
        ++it;
      } else {
        it = comms_.erase(it);
      }
    }
    lock.unlock();
    const bool mpi = Runtime::get().thread_multiple();
    for (auto& c : live) mpi ? c->check_faults(true) : c->failed();
    live.clear();  // the last owner may be here: destroy outside the lock
    Reaper::get().tick();  // free what gone communicators left, once it is done
    lock.lock();
  }
}

// ---- Pool -------------------------------------------------------------------

Pool& Pool::get() {
  static Pool* p = new Pool;
  return *p;
}

std::shared_ptr<NcclComm> Pool::take(uint64_t key) {
  for (;;) {
    std::shared_ptr<NcclComm> c;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = idle_.begin(); it != idle_.end(); ++it)
        if ((*it)->key == key) {
          c = std::move(*it);
          idle_.erase(it);
          break;
        }
    }
    if (!c) return nullptr;
    if (c->usable()) return c;
    discard(std::move(c));
  }
}

void Pool::give_back(std::shared_ptr<NcclComm> c) {
  if (!c) return;
  if (c->failed() || c->shared) return discard(std::move(c));
  std::shared_ptr<NcclComm> oldest;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopped_) {
      idle_.push_back(std::move(c));
      if (idle_.size() > kMaxIdle) {
        oldest = std::move(idle_.front());
        idle_.erase(idle_.begin());
      }
    }
  }
  if (c) discard(std::move(c));  // stopped
  if (oldest) discard(std::move(oldest));
}

bool Pool::room(bool own, std::string* why) {
  const config::Settings& set = Runtime::get().settings();
  // The memory budget, for one with resources of its own: what the last such set-up took
  // (nothing known before the first) must fit under the limit and in what is free.
  uint64_t free = 0, total = 0;
  const bool measured = own && memory_info(&free, &total);
  const uint64_t limit = set.nccl_memory_bytes ? set.nccl_memory_bytes
                                               : static_cast<uint64_t>(set.nccl_memory_share *
                                                                       static_cast<double>(total));
  const uint64_t expect = usage().last_own_bytes.load();
  for (;;) {
    const bool count_ok = g_live_nccl.load() < set.nccl_max_comms;
    const bool memory_ok = !measured || usage().bytes.load() + expect <= limit;
    if (count_ok && memory_ok) break;
    std::shared_ptr<NcclComm> oldest;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!idle_.empty()) {
        oldest = std::move(idle_.front());
        idle_.erase(idle_.begin());
      }
    }
    if (!oldest) {
      *why = !count_ok ? std::to_string(g_live_nccl.load()) +
                             " NCCL communicators exist in this process (STREAMCOLL_NCCL_MAX_COMMS=" +
                             std::to_string(set.nccl_max_comms) + ")"
                       : std::to_string(usage().bytes.load() >> 20) + " MiB of GPU memory are " +
                             "held by NCCL communicators and one more takes about " +
                             std::to_string(expect >> 20) + " MiB, over the budget of " +
                             std::to_string(limit >> 20) + " MiB (STREAMCOLL_NCCL_MEMORY)";
      return false;
    }
    discard(std::move(oldest));  // (freed at once unless an operation on it still runs)
  }
  if (measured && (memory_info(&free, &total), free < expect)) {
    *why = "the GPU has " + std::to_string(free >> 20) + " MiB free, and one more NCCL "
           "communicator takes about " + std::to_string(expect >> 20) + " MiB";
    return false;
  }
  return true;
}

void Pool::stop() {
  std::vector<std::shared_ptr<NcclComm>> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
    all.swap(idle_);
  }
  for (auto& c : all) discard(std::move(c));
}

}  // namespace streamcoll::nccl
