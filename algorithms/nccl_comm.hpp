// Route nccl's NCCL communicators (and route ccube's, which shares them): one per MPI
// communicator (NcclComm: the NCCL communicator, its streams and events, the failure
// notices between its ranks), the watchdog that polls them for asynchronous errors, the
// pool of idle ones that a new MPI communicator over the same ranks reuses, and the
// reaper that frees what a gone one leaves without blocking the caller. The failure
// handling they implement is described at the top of algorithms/nccl.cpp.
#pragma once

#include <cuda.h>
#include <mpi.h>
#include <nccl.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "algorithms/nccl_lib.hpp"

namespace streamcoll::nccl {

// ---- What a gone NCCL communicator leaves behind ----------------------------------------
// Freed without ever blocking the caller on work of the application's: at once when
// nothing of it is still queued on a stream; otherwise by the watchdog thread once its last
// operation is done (an operation on the application's stream may wait behind work the
// application has not released yet), or at MPI_Finalize with ncclCommAbort, which does not
// wait. After cudaDeviceReset the context's streams, events and memory are gone with it
// (an NCCL call on them would fail or crash): only our retain of the context is released,
// and NCCL's host-side state is left (a few KiB).
struct Remains {
  const nccl::Library* lib = nullptr;
  ncclComm_t comm = nullptr;
  bool aborted = false;
  CUdevice cudev = 0;
  CUcontext cuctx = nullptr;
  std::vector<CUstream> streams;
  std::vector<CUevent> events;
  CUevent last = nullptr;  // recorded after the latest operation, or null

  // True when done (freed); with `final`, frees now (aborting what still runs).
  bool try_free(bool final);
};

class Reaper {
 public:
  static Reaper& get();
  void dispose(Remains r);
  /// From the watchdog thread: frees what is done.
  void tick();
  /// At runtime stop (the watchdog is stopped): frees everything now.
  void drain();

 private:
  std::mutex mu_;
  std::vector<Remains> pending_;
  bool drained_ = false;
};

/// NCCL communicators alive in this process (in use, idle in the pool, or being freed).
extern std::atomic<int> g_live_nccl;

/// What streamcoll's NCCL communicators took in this process (streamcoll_nccl_counts,
/// STREAMCOLL_STATS). Bytes are GPU memory measured with cuMemGetInfo around each set-up
/// (free before minus free after; other threads' allocations meanwhile count too, so it
/// is an estimate), given back when the communicator is freed.
struct Usage {
  std::atomic<uint64_t> made_own{0};      ///< ncclCommInitRank, each with its own resources
  std::atomic<uint64_t> made_shared{0};   ///< ncclCommSplit with splitShare from a parent's
  std::atomic<uint64_t> refused{0};       ///< set-ups the budget turned away on this rank
  std::atomic<uint64_t> bytes{0};         ///< GPU memory held now by live communicators
  std::atomic<uint64_t> peak_bytes{0};    ///< the most `bytes` has been
  std::atomic<uint64_t> last_own_bytes{0};  ///< what the latest own-resource set-up took
  void take(uint64_t b);
  void give(uint64_t b) { bytes.fetch_sub(b); }
};
Usage& usage();

/// The current context's free and total GPU memory (cuMemGetInfo), or false when the
/// driver has no cuMemGetInfo or it fails.
bool memory_info(uint64_t* free, uint64_t* total);

// One NCCL communicator and the CUDA objects around it. Shared by the communicator's
// route state and the requests in flight, so MPI_Comm_free may come before MPI_Wait.
class NcclComm {
 public:
  const nccl::Library* lib = nullptr;
  ncclComm_t comm = nullptr;
  int device = -1;
  int rank = 0;
  /// Failure notices (file comment): a private duplicate of the communicator, with one
  /// receive always posted. Set up with the NCCL communicator, on every rank.
  MPI_Comm fault_comm = MPI_COMM_NULL;
  /// The communicator context's pending error (CommContext::async_error).
  std::shared_ptr<std::atomic<int>> async_error;
  /// A stream-ordered operation was issued here (its success was reported before it ran).
  std::atomic<bool> stream_ordered{false};
  CUdevice cudev = 0;
  CUcontext cuctx = nullptr;   ///< the device's primary context (retained)
  /// classic calls: a non-blocking stream, ordered explicitly after the legacy stream at
  /// each call (a blocking stream would also make the application's legacy-stream work,
  /// and through it other communicators' operations, wait for ours)
  CUstream classic = nullptr;
  CUstream side = nullptr;     ///< non-blocking stream for MPI_I* with an attached stream
  CUstream copy = nullptr;     ///< non-blocking stream for staged results (made at first use)
  std::once_flag copy_once;
  int size = 1;
  bool shared = false;  ///< split from a parent's with splitShare: no resources of its own
  uint64_t bytes = 0;   ///< GPU memory its set-up took (Usage), given back when it goes
  uint64_t key = 0;  ///< the rank group and GPUs it serves (Pool)
  uint64_t id = 0;   ///< equal on every rank of it: from its ncclUniqueId

  NcclComm() = default;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;
  ~NcclComm();

  /// Not aborted, and its CUDA objects still there (no context reset under it).
  bool usable();

  /// After an operation was enqueued on `s`: the latest operation's end, which freeing the
  /// communicator must not wait for on the caller's thread (Reaper). The caller has the
  /// context current.
  void note(CUstream s);

  /// An event from the pool (timing disabled), or nullptr with *rc set.
  CUevent take_event(int* rc);
  void give_event(CUevent e) {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(e);
  }

  /// Polls NCCL for an asynchronous error (a failed peer, a network error); on one, the
  /// NCCL communicator is aborted, which ends its kernels instead of leaving them
  /// spinning, and the peers are to be told (by the next thread that may call MPI:
  /// check_faults()). Returns whether it is aborted. Makes no MPI call: the watchdog
  /// thread uses it at any thread level.
  bool failed();

  /// From a thread that may call MPI: sends the failure notices still owed, takes one in
  /// if a peer sent it (aborting this rank's NCCL communicator), then polls failed().
  /// `pending`: an abort found here is also left for the next call on the communicator
  /// to report (nothing waits for an operation now: a stream-ordered one may be spoilt).
  /// Returns whether the NCCL communicator is aborted.
  bool check_faults(bool pending);

  /// This rank cannot take its part in an operation: abort the NCCL communicator (its
  /// kernels end) and tell every peer, so that theirs end too. Returns `rc`, the error
  /// this rank reports. From a thread that may call MPI.
  int fail_collectively(int rc, const std::string& why);

  /// An operation's end, seen by a query that found it done. An abort on this rank ends
  /// NCCL's kernels early, so after one (`aborted_before`: this rank had aborted before
  /// the query, or has by now) done is not done: the abort is the operation's error. Without one the
  /// kernels ran to their end, with every rank's part (a peer's failure stalls them, it
  /// does not end them): the operation succeeded, and a notice or asynchronous error
  /// taken in now concerns a later operation (the next call, or the stream-ordered
  /// operations already enqueued, report it), not this one, which every other rank
  /// may have completed too.
  int completed(bool aborted_before);

  /// check_faults() as an MPI error code, for the calls and waits of operations: an
  /// abort is reported by them (not again by the next call).
  int poll();

  /// Collective over `comm` (at set-up): the private duplicate for failure notices and
  /// its posted receive. False if MPI refuses.
  bool open_faults(MPI_Comm comm);

  /// Frees the notices' communicator; from the route state's destruction, on a thread
  /// that may call MPI (requests in flight may keep this object longer; they then poll
  /// NCCL's own errors only).
  void close_faults();

  /// Holds off abort() while the calling thread enqueues work on the NCCL communicator.
  std::shared_lock<std::shared_timed_mutex> use() {
    return std::shared_lock<std::shared_timed_mutex>(use_);
  }
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }

  /// Waits on the host until `e` has completed (or `s` is idle when e is null), polling
  /// for failure notices and asynchronous NCCL errors. The caller has the context
  /// current. A failed query means this rank's part is lost: its peers are told.
  int wait(CUevent e, CUstream s);

  static constexpr int kFaultTag = 7;

 private:
  static bool finalized();

  // fault_mu_ held: one notice to every peer (a static int: the sends are freed at once,
  // and complete by themselves).
  void notify_locked();

  void report_later();


  // Aborts the NCCL communicator (once); `notify`: the peers are to be told.
  void abort(std::string what, bool notify);

  std::mutex mu_;                // the event pool, last_
  std::vector<CUevent> events_;
  CUevent last_ = nullptr;       // after the latest operation (note())
  std::mutex abort_mu_;          // one abort
  std::shared_timed_mutex use_;  // shared: a call uses `comm`; exclusive: abort
  std::atomic<bool> aborted_{false};
  std::mutex fault_mu_;          // fault_comm's requests, notify_owed_
  MPI_Request fault_recv_ = MPI_REQUEST_NULL;
  int notice_in_ = 0;
  std::atomic<bool> notify_owed_{false};  // aborted for this rank's reason: peers not told yet
  std::atomic<bool> report_owed_{false};  // aborted, and no call has reported it yet
};

// Polls every ready NCCL communicator for asynchronous errors every 100 ms, so that a
// failure is noticed (and the NCCL communicator aborted, which ends its kernels) also
// while the host does not wait inside streamcoll: stream-ordered calls, or a program
// blocked in cudaStreamSynchronize. Where MPI runs at MPI_THREAD_MULTIPLE it also takes in
// the peers' failure notices (and sends this rank's); otherwise those wait for the next
// call into streamcoll. Started with the first NCCL communicator, stopped (joined) at
// runtime stop.
class Watchdog {
 public:
  static Watchdog& get();
  void watch(const std::shared_ptr<NcclComm>& c);
  void stop();

 private:
  void loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::weak_ptr<NcclComm>> comms_;
  std::thread thread_;
  bool stopping_ = false;
};

// Programs that make many communicators (MPI_Comm_dup or _split in a loop) do not get
// an NCCL communicator with resources of its own each. A communicator made from one that
// has an NCCL communicator gets a split of it, sharing its resources (algorithms/nccl.cpp,
// derive). Otherwise, when an MPI communicator goes (MPI_Comm_free, MPI_Finalize),
// its NCCL communicator, if healthy, waits here, idle, for a new MPI communicator over the
// same ranks in the same order on the same GPUs, which then reuses it (the ranks agree on
// that at its set-up; splits are not kept: a new split costs no memory). At most
// kMaxIdle wait (the oldest goes first). The budget (room()): at most
// STREAMCOLL_NCCL_MAX_COMMS exist at once, and those with resources of their own take at
// most STREAMCOLL_NCCL_MEMORY of the GPU; idle ones are freed first, and beyond it a new
// communicator's calls take the table's next rule (the ranks agree on it at the set-up).
// Why not share one NCCL communicator between live MPI communicators: NCCL matches the
// operations of one communicator by issue order, and MPI lets ranks interleave the calls
// of different communicators differently (threads, non-blocking calls).
class Pool {
 public:
  static constexpr size_t kMaxIdle = 8;
  static Pool& get();
  /// An idle communicator for `key`, taken out of the pool, or nullptr. One that cannot
  /// be used any more (aborted, or its context reset under it) is dropped instead. From a
  /// thread that may call MPI.
  std::shared_ptr<NcclComm> take(uint64_t key);
  /// A communicator whose MPI communicator is gone. From a thread that may call MPI.
  void give_back(std::shared_ptr<NcclComm> c);
  /// Whether this process may make one more NCCL communicator (`own`: with resources of
  /// its own, in the current context, which also needs room in the memory budget), if
  /// need be by freeing the oldest idle ones; *why says why not. From a thread that may
  /// call MPI.
  bool room(bool own, std::string* why);
  /// At runtime stop: every idle one goes.
  void stop();

 private:
  static void discard(std::shared_ptr<NcclComm> c) {
    c->close_faults();  // here, on a thread that may call MPI
    // The last reference frees it (Reaper), here or in a request still in flight.
  }
  std::mutex mu_;
  std::vector<std::shared_ptr<NcclComm>> idle_;  // oldest first
  bool stopped_ = false;
};

}  // namespace streamcoll::nccl
