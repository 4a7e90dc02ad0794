// The CUDA driver, opened with dlopen("libcuda.so.1") at first need. A node without a
// driver, without a device, or with only the toolkit's stub library gets usable()==false
// and a reason; nothing in libstreamcoll links against CUDA.
// Thread-safe: the first call to driver() loads it once; afterwards it is read-only.
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "base/types.hpp"

#if STREAMCOLL_HAVE_CUDA
#include <cuda.h>

// The entry points streamcoll uses, as X(name). cuda.h maps some names to versioned
// symbols (cuStreamDestroy -> cuStreamDestroy_v2); the loader looks up the symbol the
// header maps to, so each pointer has the header's signature.
#define STREAMCOLL_CUDA_ENTRY_POINTS(X)                                                 \
  X(cuInit) X(cuDriverGetVersion) X(cuDeviceGetCount) X(cuGetErrorString)               \
  X(cuPointerGetAttributes) X(cuPointerGetAttribute) X(cuDeviceGet)                     \
  X(cuDeviceGetPCIBusId) X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease)       \
  X(cuCtxGetCurrent) X(cuCtxGetDevice) X(cuCtxPushCurrent) X(cuCtxPopCurrent)                         \
  X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamQuery) X(cuStreamSynchronize)          \
  X(cuStreamWaitEvent) X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord)              \
  X(cuEventQuery) X(cuEventSynchronize) X(cuMemcpyDtoDAsync) X(cuMemAllocAsync)         \
  X(cuMemFreeAsync) X(cuMemcpyAsync) X(cuMemHostAlloc) X(cuMemFreeHost)

// Entry points only some routes need: a driver without them is still usable, and those
// routes check the pointer (route ht: stream memory operations and its spin kernel;
// route nvgroup: peer access, CUDA IPC, host registration, kernels; calls recorded into
// a CUDA graph: stream capture, host functions, user objects: shim/capture.hpp).
#define STREAMCOLL_CUDA_OPTIONAL_ENTRY_POINTS(X)                                        \
  X(cuStreamWaitValue32) X(cuMemHostGetDevicePointer) X(cuModuleLoadData)               \
  X(cuModuleGetFunction) X(cuModuleUnload) X(cuLaunchKernel)                           \
  X(cuDeviceGetAttribute) X(cuDeviceGetByPCIBusId) X(cuDeviceCanAccessPeer)             \
  X(cuMemAlloc) X(cuMemFree) X(cuIpcGetMemHandle) X(cuIpcOpenMemHandle)                 \
  X(cuIpcCloseMemHandle) X(cuMemHostRegister) X(cuMemHostUnregister)                 \
  X(cuStreamIsCapturing) X(cuStreamGetCaptureInfo) X(cuLaunchHostFunc)                 \
  X(cuUserObjectCreate) X(cuUserObjectRelease) X(cuGraphRetainUserObject)              \
  X(cuThreadExchangeStreamCaptureMode) X(cuStreamWriteValue32) X(cuEventElapsedTime)    \
  X(cuMemGetInfo)
#endif

namespace streamcoll::cuda {

struct Driver {
  bool usable = false;
  int device_count = 0;
  int version = 0;     ///< cuDriverGetVersion, e.g. 13000
  std::string reason;  ///< why not usable
#if STREAMCOLL_HAVE_CUDA
#define STREAMCOLL_CUDA_MEMBER(fn) decltype(&::fn) fn = nullptr;
  STREAMCOLL_CUDA_ENTRY_POINTS(STREAMCOLL_CUDA_MEMBER)
  STREAMCOLL_CUDA_OPTIONAL_ENTRY_POINTS(STREAMCOLL_CUDA_MEMBER)
#undef STREAMCOLL_CUDA_MEMBER
#endif
};

/// The driver, loaded (dlopen, cuInit) at the first call made once the application has
/// loaded libcuda.so.1 itself; until then a Driver with usable == false, asked again at
/// each call (one RTLD_NOLOAD lookup), so that a process that never uses CUDA pays no
/// cuInit and no driver memory. Honors nothing from the environment except what the
/// CUDA driver itself reads (CUDA_VISIBLE_DEVICES). Thread-safe.
const Driver& driver();

/// Whether this node has a CUDA driver the process could load: libcuda.so.1 loaded
/// already, the NVIDIA kernel module (/proc/driver/nvidia), or libcuda.so.1 in a
/// directory of LD_LIBRARY_PATH. Loads nothing. Asked once, at MPI_Init, and agreed
/// over MPI_COMM_WORLD (a job with no driver anywhere never routes GPU memory).
bool driver_present();

/// Where `p` lives. Host when the driver is not usable, for nullptr, and for pointers the
/// driver does not know. With `device`, also the ordinal of the GPU that holds device
/// memory (-1 otherwise), from the same driver call. Cost: one cuPointerGetAttributes
/// (no context needed).
MemKind classify(const void* p, int* device = nullptr);

/// Whether `p` lies in the process's heap (between the start of the program break and
/// the break now) or on the calling thread's stack: memory the CUDA driver never gives
/// out as device or managed memory (it maps those, and its page-locked allocations, on
/// pages of their own). Such a buffer is host memory to every route, also where the
/// application page-locked it with cuMemHostRegister (the driver would say pinned; routes
/// treat pinned and host memory alike, and only stage less). No driver call: a few loads,
/// the thread's stack bounds found once per thread. Thread-safe.
bool in_heap_or_stack(const void* p);

namespace detail {
/// The heap's start, once in_heap_or_stack has found it (0 before, or when it has none).
extern std::atomic<uintptr_t> g_heap_start;
}  // namespace detail
}  // namespace streamcoll::cuda
/// glibc's program break (what sbrk(0) returns); weak: absent from other C libraries.
extern "C" {
extern void* __curbrk __attribute__((weak));
}
namespace streamcoll::cuda {

/// in_heap_or_stack's heap half, inline, for the steady path (shim/steady.hpp): a few
/// loads, no call. False (ask in_heap_or_stack) before the heap's start is known and
/// without glibc's break.
inline bool in_heap(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  const uintptr_t lo = detail::g_heap_start.load(std::memory_order_relaxed);
  return lo && &__curbrk && a >= lo && a < reinterpret_cast<uintptr_t>(__curbrk);
}

/// classify() for a buffer of a call, without asking the driver where in_heap_or_stack.
MemKind classify_buffer(const void* p, int* device);

/// The ordinal of the device that holds (or, for managed memory, last held) `p`, or -1.
int device_of(const void* p);

/// STREAMCOLL_DRIVER_PROFILE: with `on` set before the driver is loaded (Runtime sets it
/// at MPI_Init), every entry point of Driver is replaced by one that times the real call
/// (two steady_clock reads, two relaxed atomic adds: tens of nanoseconds against the
/// microseconds of a driver call). Thread-safe.
void set_profile(bool on);

/// The profile so far, one line per entry point called: calls, total and mean host
/// microseconds, most total time first, then a line with the sums. Empty when profiling
/// is off or no driver call was made. Thread-safe.
std::string profile_report();

#if STREAMCOLL_HAVE_CUDA
/// "cuStreamQuery: an illegal memory access was encountered (error 700)".
std::string describe(const char* what, CUresult r);

/// `file` (a __FILE__) from the source root on: "../core/staging.cpp", as meson names
/// sources from its build folder, gives "core/staging.cpp"; an absolute path gives the part
/// from its last top-level source folder (algorithms/, core/, ...) on.
const char* source_path(const char* file);

/// The one way a failed driver call becomes an MPI error: logs `file:line: what: <the
/// driver's message> (error N)` (rank-tagged, always), e.g. "core/staging.cpp:95:
/// cuMemcpyAsync (staging in): invalid argument (error 1)", and returns streamcoll's CUDA
/// error code (Failure::cuda, of class MPI_ERR_OTHER: core/errors.hpp). `r` is not
/// CUDA_SUCCESS. Same threading rule as fail(): from threads that may call MPI. Called
/// through the SC_CU_ macros below, which give it the caller's location.
int failure_at(const char* file, int line, const char* what, CUresult r);
inline int failure_at(const char* file, int line, const std::string& what, CUresult r) {
  return failure_at(file, line, what.c_str(), r);
}

/// describe() with the source location first, for a failure that is a reason (a route
/// not set up) rather than an MPI error.
std::string describe_at(const char* file, int line, const char* what, CUresult r);
inline std::string describe_at(const char* file, int line, const std::string& what, CUresult r) {
  return describe_at(file, line, what.c_str(), r);
}

/// A failure that is tolerated (teardown: cuEventDestroy, cuStreamDestroy, cuMemFreeHost)
/// but seen: logged at warn level (STREAMCOLL_DEBUG=warn) with the source location, never
/// an MPI error. Returns `r`.
CUresult tolerated_at(const char* file, int line, const char* what, CUresult r);

// The driver-call checks (NCCL's CUDACHECK, src/include/checks.h): each evaluates `call`
// once and, when it failed, puts the caller's file:line first on the log line. `what`
// names the call (and the route); a const char* or a std::string, built only on failure.
//   SC_CU_CHECK(call, what)  int: MPI_SUCCESS, or streamcoll's CUDA error code (logged):
//       if (const int rc = SC_CU_CHECK(d.cuEventRecord(e, s), "ht: cuEventRecord")) return rc;
//   SC_CU_FAIL(r, what)      int: the error code for a result already in hand (r failed).
//   SC_CU_WHY(r, what)       std::string: the located description, for a reason string.
//   SC_CU_TOLERATE(call)     CUresult: a failure logged at warn level, nothing more
//                            (teardown); `what` is the call's text.
//   SC_CU_RESULT(call)       CUresult, silent: for a result the caller branches on (the
//                            NOT_READY of a query, a capture status, a probe for an
//                            optional feature), where a failure is an answer, not an error.
#define SC_CU_CHECK(call, what)                                                            \
  ([&]() -> int {                                                                          \
    const CUresult sc_cu_r_ = (call);                                                      \
    return sc_cu_r_ == CUDA_SUCCESS                                                        \
               ? MPI_SUCCESS                                                               \
               : ::streamcoll::cuda::failure_at(__FILE__, __LINE__, (what), sc_cu_r_);     \
  }())
#define SC_CU_FAIL(r, what) ::streamcoll::cuda::failure_at(__FILE__, __LINE__, (what), (r))
#define SC_CU_WHY(r, what) ::streamcoll::cuda::describe_at(__FILE__, __LINE__, (what), (r))
#define SC_CU_TOLERATE(call)                                                               \
  ([&]() -> CUresult {                                                                     \
    const CUresult sc_cu_r_ = (call);                                                      \
    return sc_cu_r_ == CUDA_SUCCESS                                                        \
               ? sc_cu_r_                                                                  \
               : ::streamcoll::cuda::tolerated_at(__FILE__, __LINE__, #call, sc_cu_r_);    \
  }())
#define SC_CU_RESULT(call) static_cast<CUresult>(call)

/// Whether the legacy default stream of the current context may be used now: false while
/// a blocking stream of the context is being captured (by any thread), when any use of it
/// would invalidate that capture (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT). One driver call.
bool legacy_stream_usable();

/// The stream a classic call's own copies go on when it has none of its own: the legacy
/// default stream (nullptr), or the calling thread's per-thread default stream while the
/// legacy one is not usable (legacy_stream_usable).
inline CUstream classic_stream() { return legacy_stream_usable() ? nullptr : CU_STREAM_PER_THREAD; }

/// Orders `stream` after the work already enqueued on the legacy default stream of the
/// current context, and through it after the earlier work of every blocking stream of that
/// context (streams made without CU_STREAM_NON_BLOCKING, the per-thread default streams):
/// where a copy on the legacy stream, as a CUDA-aware MPI makes for a blocking call, would
/// run. `event` (of the current context) is recorded on the legacy stream and `stream`
/// waits for it; the event may be recorded again at once. Two driver calls, no host wait.
/// While the legacy stream is not usable (legacy_stream_usable), nothing: a capturing
/// stream's work is recorded, not run, and the order after the other blocking streams is
/// given up for that call rather than the capture invalidated.
/// Every path that reads or writes an application's GPU buffers for a classic call (no
/// stream attached) starts with this (docs/design.md, "Ordering and lifetime").
CUresult wait_for_legacy(CUstream stream, CUevent event);

/// Sets the calling thread's capture interaction mode to relaxed
/// (cuThreadExchangeStreamCaptureMode), once the driver is loaded: from then on its driver
/// calls (allocations, synchronisations of streamcoll's own streams) never invalidate a
/// capture another thread of the application has begun in global mode. For streamcoll's
/// own threads (the progress engine, the graph replay lanes). Returns true once done, or when
/// it never can be (a driver without the entry point); false while no driver is loaded.
bool relax_capture_mode();

/// The calling thread's capture interaction mode relaxed for the scope (two
/// cuThreadExchangeStreamCaptureMode calls, thread-local; nothing when `on` is false or no
/// driver is loaded). For an application thread's call that may allocate or synchronise
/// streamcoll's own streams (a classic call on GPU buffers, a call recorded into a graph):
/// CUDA's rules for global mode would otherwise refuse such calls, and invalidate the
/// capture, while any thread of the process captures in global mode.
class RelaxedCapture {
 public:
  explicit RelaxedCapture(bool on = true);
  ~RelaxedCapture();
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  CUstreamCaptureMode mode_ = CU_STREAM_CAPTURE_MODE_RELAXED;
  bool set_ = false;
};

/// The primary context of `device` (an ordinal), retained once per device for the life of
/// the process, or nullptr with *r set. Thread-safe.
CUcontext primary_context(int device, CUresult* r);

/// Makes the primary context of a device current for the scope, if it is not already
/// (the common case for a CUDA runtime application costs one cuCtxGetCurrent).
class ScopedContext {
 public:
  explicit ScopedContext(CUcontext ctx);
  ~ScopedContext();
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;

 private:
  bool pushed_ = false;
};
#endif

}  // namespace streamcoll::cuda
