// Collectives recorded into a CUDA graph: a stream-ordered call made while the stream
// attached to its communicator (streamext.h) is being captured (cuStreamBeginCapture).
//
// A capture is a fact of this rank alone (one rank may capture a step that another runs
// live), so nothing is decided or exchanged at capture time: the call becomes two nodes
// of the graph, and every launch of the graph makes the call once, in stream order,
// through the same routing as a live call (shim/dispatch.cpp), at the point where the
// GPU reaches it:
//
//   graph:     ... [host node: flag = 0, hand the call over] [wait: flag >= 1] ...
//   lane:      dispatch(call) stream-ordered on its own stream R, then on R: flag = 1
//              (cuStreamWriteValue32: the lane goes on to the next call at once;
//              without stream memory operations it synchronises R and writes the flag)
//
// The host node only re-arms the flag and queues the call (a CUDA host function may make
// no CUDA or blocking call) on the replay lane of its communicator: a thread of
// streamcoll's per communicator with captured calls, which makes the call as the
// application would have made it live, stream-ordered on a stream of the lane's own, so
// it takes the route every rank agrees on, its agreement included, whether the peers
// replay a graph or call live. A lane's call may wait for the peers (an agreement, a
// set-up, the MPI's own call), but only for their calls on the same communicator: the
// replays of different communicators never wait for each other, so ranks may launch the
// graphs of different communicators in different orders (shim/capture.cpp, Lane). No flag value is baked into the graph: each launch re-arms it.
// What the call holds (its arguments, the flag) lives as long as the graph and its
// executable graphs (a CUDA user object); a communicator freed while a graph still holds
// its calls is reported, and a launch after that skips the call with an error message.
//
// The rules for a program (docs/guide.md, "CUDA graphs"): the replayed calls of a
// communicator take their place in its order of collectives when the GPU reaches them, so
// a rank launches its graphs and makes its live calls on a communicator in one order, the
// same on every rank (as with NCCL), and makes no live collective call on a communicator
// while a launched graph's calls on it may still be pending (synchronise the stream
// first). Needs MPI_THREAD_MULTIPLE (the replay lanes call MPI). An MPI_I* call under capture
// returns a request that is already complete; each launch makes it as an MPI_I* call (a
// blocking collective never matches a non-blocking one) and waits for it on the stream
// at once: the graph's work after the call waits for the collective.
#pragma once

#include <cstdint>
#include <functional>

#include "core/coll_args.hpp"

namespace streamcoll::capture {

/// Records `a` into the capture of its communicator's stream, if that stream is being
/// captured and the call's significant buffers are in GPU memory; *rc is then what the call
/// returns (MPI_SUCCESS, or an error raised through the communicator's error handler when
/// the call cannot be captured: no MPI_THREAD_MULTIPLE, a driver without the entry points,
/// a capture already invalidated). Returns false, touching nothing, otherwise. Cost when
/// the communicator has a stream: one cuStreamIsCapturing.
bool record(const CollArgs& a, int* rc);

/// A persistent collective's start (MPI_Start of a request streamcoll planned at its init:
/// shim/persistent.cpp) made on a stream being captured: recorded as record() records the
/// MPI_I* call `a` it is, but each launch runs `start`, the route agreed at the init with no
/// decision (as a live start does, so ranks that replay and ranks that start live take the
/// same route), which returns an MPI error code and sets the operation's request, waited
/// for on the replay's stream. `start` holds what it uses (it lives as long as the graph).
/// *rc and the return value as record()'s; *a.request then holds a completed request.
bool record_start(const CollArgs& a, std::function<int(MPI_Request*)> start, int* rc);

/// On a replay lane's thread, during a replayed call: true and the stream it runs on (the
/// call is stream-ordered on it instead of the communicator's stream).
bool replay_stream(void** stream);

/// Whether this thread is making a replayed call: its failures are kept for the next call
/// on the communicator (CommContext::async_error), as for a stream-ordered operation.
bool replaying();

/// Ends the replay lanes (the calls already handed over run first). From MPI_Finalize.
void stop();

/// Process-wide counts: replay lanes (threads) started and alive now, calls replayed, and
/// calls skipped because their communicator was freed. Thread-safe.
struct Counts {
  uint64_t lanes_started = 0, lanes_live = 0, replayed = 0, skipped = 0;
};
Counts counts();

}  // namespace streamcoll::capture
