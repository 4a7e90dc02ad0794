// Route ht's stage interface, for routes that run its collectives as a stage of their own
// (blueconnect's levels; see algorithms/ht.cpp, "Failures stay collective"), and its
// stream-ordered staging, for fusion's stream-ordered calls (ht_stream below).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "algorithms/route.hpp"

namespace streamcoll::ht_stage {

/// This rank cannot produce its input for `a` on `ctx` (route ht set up there; a GPU call
/// as agreed, `env` as the call would have run with): its part of the host collective
/// runs anyway, on scratch memory, marked unusable, so that the peers are neither left
/// waiting nor handed garbage as data (their results report Failure::peer). Runs on the
/// progress engine (on this thread when there is none); never blocks on the peers.
void stand_in(CommContext& ctx, const CollArgs& a, const CallEnv& env);

}  // namespace streamcoll::ht_stage

namespace streamcoll::ht_stream {

/// The side streams of one stream-ordered user of Stage (one fusion queue): a copy stream
/// and a hold stream on every GPU it uses, created at first use, destroyed with this
/// object (work queued on them finishes first). Thread-safe.
class Streams {
 public:
  Streams();
  ~Streams();
  Streams(const Streams&) = delete;
  Streams& operator=(const Streams&) = delete;
  uint64_t copy_key() const { return copy_key_; }
  uint64_t hold_key() const { return hold_key_; }

 private:
  uint64_t copy_key_, hold_key_;
};

/// MPI_Wait's part of a stream-ordered call: an event recorded after the copy back.
/// Independent of the Stage (a request may be waited for after its stage is recycled,
/// or before). Not thread-safe (one request's).
class Join {
 public:
  virtual ~Join() = default;
  /// Makes `app` (a CUstream) wait for the copy back; never blocks the host. Returns an
  /// MPI error code.
  virtual int wait_on(void* app) = 0;
};

/// Route ht's stream-ordered staging (algorithms/ht_stream.cpp) for one contribution whose
/// host part another component runs: algorithms/fusion.hpp's stream-ordered MPI_Iallreduce
/// calls, whose host part is a fused message. On GPU `device`, after what `app` (a
/// CUstream, the communicator's attached stream) holds at the call:
///   copy stream:  [wait for app] [D2H: src -> pinned buffer, `bytes`] [event: input]
///   hold stream:  [wait for input] [wait: flag >= 1] [H2D: buffer -> dst] [event: done]
/// The copy in goes on a stream of its own so that the next call's copy in is not queued
/// behind this call's hold: a burst of calls has all its input in pinned memory before
/// the first call's host part runs (which a fused message needs). The hold stream holds
/// the calls in their order, so the copies back are in call order too.
/// Thread safety: one thread at a time per Stage (start on the application thread, the
/// rest on the thread that runs the host part).
class Stage {
 public:
  enum class Input { pending, ready, failed };
  virtual ~Stage() = default;
  /// The pinned staging buffer (`bytes` long): the input once input() says ready; the
  /// host part writes the result there before finish().
  virtual void* buffer() const = 0;
  /// Polls the copy in, never blocking. failed: *rc gets the MPI error code (the buffer
  /// holds no input; the copy is over).
  virtual Input input(int* rc) = 0;
  /// The host part is done: the hold stream goes on and copies the buffer back (the
  /// result, or, after a failure, whatever is there: the caller reports it). Recycling
  /// waits on the progress engine for the copy back; a failure of the copy back is
  /// stored in `async_error` (for the communicator's next call to report). Call once,
  /// last.
  virtual void finish() = 0;
};

/// Enqueues a Stage (above) for `bytes` bytes from `src` to `dst` (GPU memory of
/// `device`, or any memory the driver can address; `device` -1: the current context's
/// GPU, else GPU 0, as for managed memory). Returns an MPI error code. On
/// failure `*dst_untouched` says whether nothing will write `dst` (the caller may then
/// run the call another way, after synchronising `app`: the copy in is over, this waited
/// for it); false means `dst` may hold the input (the copy back ran: the call must
/// fail). Either way nothing of the staging reads `src` or writes `dst` any more when
/// this returns (it waited for its streams: a failure may block the host). Everything
/// acquired is released. Needs STREAMCOLL_HAVE_CUDA (otherwise fails with dst
/// untouched).
int start(const Streams& streams, int device, void* app, const void* src, void* dst,
          uint64_t bytes, std::shared_ptr<std::atomic<int>> async_error,
          std::unique_ptr<Stage>* stage, std::unique_ptr<Join>* join, bool* dst_untouched);

}  // namespace streamcoll::ht_stream
