// Seeing what streamcoll did: NVTX ranges for Nsight Systems and a per-call timeline.
//
// NVTX (header-only NVTX3 from the CUDA toolkit, domain "streamcoll"): a range per routed
// call (the call's whole host time, named by collective), inside it a range named by
// collective, route, memory kind and mode with the bytes as payload, coloured by route;
// ranges for the agreements and the progress thread's host collectives; a mark per call
// that falls back, with the reason. Emitted only when STREAMCOLL_NVTX says so (auto: when
// a tool is attached, NVTX_INJECTION64_PATH set): otherwise no NVTX call at all.
//
// The timeline (STREAMCOLL_TIMELINE=file): one record per call (collective, route,
// bytes, memory kind, mode, communicator size, host begin/end) in a ring of
// STREAMCOLL_TIMELINE_MAX records (the latest kept); for a stream-ordered call also the
// GPU-side span, from two CUDA events recorded on the call's stream around the operation,
// read back without blocking (at later calls, cuEventQuery) or at MPI_Finalize. At
// MPI_Finalize the ranks' records are gathered to rank 0 of MPI_COMM_WORLD, on one time
// base (each rank's clock aligned at a barrier there), and written as Chrome trace event
// JSON: pid = rank, tid 0 = host spans, tid 1 = GPU spans. A rank that exits without
// MPI_Finalize writes its own records to FILE.rank<N> at exit.
//
// Thread safety: every function may be called from any thread (the timeline takes a
// mutex per call; the NVTX string registry is lock-free after the first use of a name).
#pragma once

#include <mpi.h>

#include <cstdint>

#include "base/routes.hpp"
#include "base/types.hpp"

namespace streamcoll::config {
struct Settings;
}

namespace streamcoll::trace {

/// How a call ran, for the range name and the timeline.
enum class Mode : uint8_t {
  host,      ///< host buffers
  classic,   ///< GPU buffers, no stream: the host waits for the operation
  stream,    ///< stream-ordered on the communicator's stream
  captured,  ///< recorded into a CUDA graph (shim/capture.hpp)
};
inline constexpr int kNumModes = 4;
const char* name(Mode m);

/// Reads the settings (STREAMCOLL_NVTX, STREAMCOLL_TIMELINE*); at runtime start.
void configure(const config::Settings& s);
/// Whether NVTX ranges / the timeline are on (cheap: one relaxed load).
bool nvtx_on();
bool timeline_on();

/// One intercepted call, begun at entry: the NVTX range of the call, the host begin.
/// routed() names it once the route is known; the destructor ends it (and, for a
/// stream-ordered call, records the GPU end event on `stream`).
class Call {
 public:
  Call(Coll coll, bool nonblocking);
  ~Call();
  /// NVTX or the timeline is on for this call (else routed() need not be called).
  bool on() const { return nvtx_ || timed_; }
  /// The decision: route, memory kind, mode, bytes, communicator size; `stream` (a
  /// CUstream, or nullptr) is where a stream-ordered call's work goes: for a blocking
  /// stream-ordered call with the timeline on, the GPU begin event is recorded on it now
  /// and the end event at the end of the call. A call never routed (recorded into a
  /// graph, refused) leaves no timeline record.
  void routed(RouteId route, MemKind mem, Mode mode, uint64_t bytes, int comm_size, void* stream);
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;

 private:
  Coll coll_;
  bool nonblocking_;
  bool nvtx_ = false, nvtx_inner_ = false;
  bool timed_ = false, routed_ = false;
  RouteId route_ = RouteId::pmpi;
  MemKind mem_ = MemKind::host;
  Mode mode_ = Mode::host;
  uint64_t bytes_ = 0;
  int comm_size_ = 0;
  void* stream_ = nullptr;
  void* gpu_begin_ = nullptr;  ///< CUevent
  uint64_t t0_ = 0;
};

/// An NVTX range on this thread for the scope (agreements, host collectives of the
/// progress thread); `what` must be a string literal (registered once by address).
class Range {
 public:
  explicit Range(const char* what);
  ~Range();
  Range(const Range&) = delete;
  Range& operator=(const Range&) = delete;

 private:
  bool on_ = false;
};

/// An NVTX start/end range (may end on another thread; here: a progress-engine task from
/// its first step to its last); `what` a string literal. range_start returns 0 when NVTX
/// is off; range_end(0) does nothing.
uint64_t range_start(const char* what);
void range_end(uint64_t id);

/// An NVTX mark: a call that fell back, a route that declined, with the reason.
void mark(const char* text);

/// At MPI_Finalize (before the runtime stops; collective over MPI_COMM_WORLD when the
/// timeline is on): writes the timeline. Returns quietly when it is off.
void finalize();

}  // namespace streamcoll::trace
