/* The extra entry points of the fake CUDA driver (fake_cuda.cpp, built as libcuda.so.1)
 * and the fake NCCL (fake_nccl.cpp), for the fake NCCL and for test programs. Nothing
 * here is part of CUDA or NCCL: the fakes export these names beside the real API, and
 * their users find them with dlsym on the handle of dlopen("libcuda.so.1") (the same
 * object streamcoll opens) or of dlopen($STREAMCOLL_NCCL_LIB).
 *
 * No CUDA header is needed: a CUstream is a `struct CUstream_st *`, as in cuda.h and
 * streamcoll/streamext.h.
 */
#ifndef STREAMCOLL_TESTS_FAKE_API_H
#define STREAMCOLL_TESTS_FAKE_API_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct CUstream_st;
struct CUevent_st;

/* A byte range a piece of stream work reads or writes (for the happens-before check). */
typedef struct {
  const void *ptr;
  size_t bytes;
  int write;
} fake_cuda_range;

/* ---- fake CUDA: for test programs -------------------------------------------------- */

/* "Device memory": host memory that the fake driver reports as device memory of device 0
 * (of `device`; of device 0 but managed). NULL for 0 bytes or no memory. fake_cuda_free
 * frees all four kinds. */
typedef void *(*fake_cuda_malloc_fn)(size_t bytes);
typedef void *(*fake_cuda_malloc_device_fn)(int device, size_t bytes);
typedef void *(*fake_cuda_malloc_managed_fn)(size_t bytes);
/* Page-locked host memory of device 0's context, as cuMemHostAlloc gives. */
typedef void *(*fake_cuda_malloc_pinned_fn)(size_t bytes);
/* Frees it, like cuMemFree; reports a race if stream work on it is not known done. */
typedef void (*fake_cuda_free_fn)(void *ptr);

/* What a CUDA runtime program does first (cudaSetDevice(0)): retains device 0's primary
 * context and makes it current on the calling thread. fini releases it. */
typedef int (*fake_cuda_runtime_init_fn)(void);
typedef void (*fake_cuda_runtime_fini_fn)(void);

/* Streams for the program's own use (cuStreamCreate/Destroy/Synchronize, but not counted
 * in the cu* call counters, so that counters show streamcoll's calls only). */
typedef struct CUstream_st *(*fake_cuda_stream_create_fn)(unsigned flags);
typedef void (*fake_cuda_stream_destroy_fn)(struct CUstream_st *stream);
typedef int (*fake_cuda_stream_sync_fn)(struct CUstream_st *stream);
/* Stream work not yet run (always 0 without FAKE_CUDA_DEFER=1). */
typedef int (*fake_cuda_pending_fn)(struct CUstream_st *stream);
/* A host-to-device copy on the stream (src is copied at once; dst written when it runs). */
typedef int (*fake_cuda_enqueue_copy_fn)(struct CUstream_st *stream, void *dst,
                                         const void *src, size_t bytes);
/* The host is about to read (write=0) or write (write=1) the range: returns the number
 * of stream operations on it that the host has not seen complete (each is a race, also
 * counted under "races" and printed on stderr). */
typedef int (*fake_cuda_host_access_fn)(const void *ptr, size_t bytes, int write);
/* A host wait on the stream, as cuStreamWaitValue32(GEQ) but for the program's own use
 * (not counted, and there also with FAKE_CUDA_NO_STREAM_MEMOPS=1): the stream stops
 * until the 32-bit word at `flag` (fake device or pinned memory) holds a value v with
 * (int32_t)(v - value) >= 0. A test holds a stream with it to prove a call does not wait
 * for the stream. Returns a CUresult. */
typedef int (*fake_cuda_enqueue_wait_fn)(struct CUstream_st *stream, const void *flag,
                                         unsigned value);
/* 1 when FAKE_CUDA_DEFER=1 (stream work waits until something waits for it). */
typedef int (*fake_cuda_deferred_fn)(void);
/* Counters, by name: an entry point without its version suffix ("cuStreamSynchronize",
 * calls made through the CUDA API, i.e. by streamcoll), or "live_streams",
 * "live_events", "ctx_refs", "live_allocs", "live_async_allocs", "live_host_allocs",
 * "races", "executed" (pieces of stream work run),
 * "not_ready", "errors"; host waits (fake_cuda.cpp): "pending_waits", "memop_waits",
 * "kernel_waits", "memop_waits_passed", "kernel_waits_passed", "held_queries",
 * "blocked_syncs", "live_modules", "not_supported"; work run beside the host
 * (fake_cuda_enqueue_async): "async_launched", "async_pending" (gauge),
 * "async_held_queries", "async_blocked_syncs"; stream capture and graphs: "captures"
 * (begun), "captured_nodes", "capture_joins" (streams joined through an event),
 * "capture_invalidated", "capture_unjoined", "live_graphs", "live_graph_execs" (gauges),
 * "graph_launches", "graph_node_run" (nodes run, counted as each completes),
 * "graph_races" (unordered nodes of a captured graph that conflict; also in "races"),
 * "host_funcs_run" (cuLaunchHostFunc calls run, live or in a graph), "not_permitted"
 * (CUDA calls from a host function); device memory (fake_cuda.cpp, "Memory"):
 * "device_bytes_used" (gauge: allocations at their mapped length and reservations, over
 * all devices), "device_bytes_peak" (its highest so far), "out_of_memory" (allocations
 * and reservations refused). Unknown names give 0. */
typedef unsigned long long (*fake_cuda_counter_fn)(const char *name);
/* cuStreamSynchronize calls made through the CUDA API (the program's own are not). */
typedef unsigned long long (*fake_cuda_sync_count_fn)(void);
/* Failure injection at run time: the n-th call of entry point `api` from now (n >= 1)
 * fails as FAKE_CUDA_FAIL describes (fake_cuda.cpp); n == 0 disarms it. Each armed
 * failure fires once; counter "injected_failures" counts those that fired. Returns -1
 * for an entry point that cannot be made to fail. */
typedef int (*fake_cuda_fail_after_fn)(const char *api, unsigned long long n);

/* cudaDeviceReset(device): every stream, event and allocation of the device's context
 * is gone (handles invalid, memory freed); contexts stay usable. Nothing may still run. */
typedef int (*fake_cuda_device_reset_fn)(int device);

/* ---- fake CUDA: for the fake NCCL ---------------------------------------------------- */

/* Work on a stream: fn(arg) runs when the stream reaches it (at once without deferral);
 * fn owns arg. ranges: what it reads and writes. check_ctx: the legacy stream handle
 * needs a current context (as for an API call). Returns a CUresult. */
typedef int (*fake_cuda_enqueue_fn)(struct CUstream_st *stream, int check_ctx,
                                    void (*fn)(void *), void *arg,
                                    const fake_cuda_range *ranges, int nranges,
                                    const char *what);
/* Work that runs beside the host once launched, as a GPU kernel does (the fake NCCL's
 * operations, run by a thread of their own). It is three pieces of stream work:
 *  1. when the stream reaches it, launch(arg) runs, on whichever thread runs the stream's
 *     work and holding the fake's lock: it must hand the work over and return, never
 *     block or call the fake;
 *  2. the stream then stays at it, "stuck" as behind a host wait, until done(arg) returns
 *     nonzero (polled holding the lock, by any thread calling into the fake: an acquire
 *     load, nothing more): cuEventQuery/cuStreamQuery answer CUDA_ERROR_NOT_READY without
 *     blocking (and yield the CPU), synchronising calls poll letting go of the lock;
 *  3. then the work is complete: `ranges` (what it read and wrote, for the happens-before
 *     check) belong to this last piece, and finish(arg) runs (it owns arg; after done()
 *     said nonzero the other thread must not touch arg any more).
 * Not a host wait: counted under "async_launched", "async_pending" (gauge),
 * "async_held_queries", "async_blocked_syncs", not under "pending_waits",
 * "held_queries", "blocked_syncs". Returns a CUresult. */
typedef int (*fake_cuda_enqueue_async_fn)(struct CUstream_st *stream, int check_ctx,
                                          void (*launch)(void *), int (*done)(void *),
                                          void (*finish)(void *), void *arg,
                                          const fake_cuda_range *ranges, int nranges,
                                          const char *what);
/* Stream capture (CUDA graphs): work the fake CUDA replays, for the fake NCCL. When
 * `stream` is capturing, records a graph node and sets *captured = 1: every launch of a
 * graph exec holding the node calls issue(arg, launch_stream) at cuGraphLaunch, on the
 * launching thread and holding the fake's lock, in the graph's node order; it enqueues
 * that run's work on launch_stream (a handle: CU_STREAM_LEGACY for the legacy stream)
 * with the helpers here, which take the lock again. release(arg) runs once the last
 * graph or exec holding the node is destroyed (or the capture is invalidated or fails).
 * ranges: what the work reads and writes (the graph's race check between unordered
 * nodes). When the stream is not capturing: *captured = 0 and nothing is recorded (the
 * caller enqueues the work itself; arg stays the caller's). Returns a CUresult:
 * CUDA_ERROR_STREAM_CAPTURE_INVALIDATED for a stream of an invalidated capture (arg stays
 * the caller's). fake_cuda_enqueue and fake_cuda_enqueue_async, whose argument is
 * one-shot, refuse a capturing stream (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, the capture
 * invalidated). */
typedef int (*fake_cuda_capture_node_fn)(struct CUstream_st *stream, int check_ctx, int *captured,
                                         void (*issue)(void *arg, struct CUstream_st *launch_stream),
                                         void (*release)(void *arg), void *arg,
                                         const fake_cuda_range *ranges, int nranges,
                                         const char *what);
/* Events outside the counters: create, record, make a stream wait, wait on the host,
 * destroy. */
typedef struct CUevent_st *(*fake_cuda_event_new_fn)(void);
typedef int (*fake_cuda_event_record_fn)(struct CUevent_st *event, struct CUstream_st *stream,
                                         int check_ctx);
typedef int (*fake_cuda_stream_wait_fn)(struct CUstream_st *stream, struct CUevent_st *event,
                                        int check_ctx);
typedef int (*fake_cuda_event_sync_fn)(struct CUevent_st *event);
typedef void (*fake_cuda_event_delete_fn)(struct CUevent_st *event);
/* Device memory a library takes for itself, with no mapping (the fake NCCL's
 * communicators): counted against the device's total as allocations are. reserve returns
 * 0 (CUDA_SUCCESS), CUDA_ERROR_OUT_OF_MEMORY when it does not fit (nothing taken) or
 * CUDA_ERROR_INVALID_DEVICE; unreserve gives bytes of earlier reservations back. */
typedef int (*fake_cuda_device_reserve_fn)(int device, unsigned long long bytes);
typedef void (*fake_cuda_device_unreserve_fn)(int device, unsigned long long bytes);
/* 1 if [ptr, ptr + bytes) lies in one live fake device allocation. */
typedef int (*fake_cuda_is_device_fn)(const void *ptr, size_t bytes);
/* The device of the calling thread's current context, or -1 if none is current. */
typedef int (*fake_cuda_current_device_fn)(void);

/* ---- fake NCCL -------------------------------------------------------------------------- */

/* Operations issued (collectives, and each send/recv group once). */
typedef unsigned long long (*fake_nccl_calls_fn)(void);
/* Counters, by name: an entry point ("ncclCommInitRank", "ncclCommSplit", "ncclCommAbort",
 * "ncclCommDestroy", "ncclAllReduce", ...: calls made), or "executed" (operations run),
 * "init_failures" (FAKE_NCCL_FAIL_INIT, and device memory refused at init or split),
 * "mismatches" (ranks ran different operations), "errors",
 * "injected_failures", "captured" (operations made graph nodes on a capturing stream:
 * not issued, not in fake_nccl_calls), "replayed" (operations issued by graph launches,
 * which fake_nccl_calls counts too); gauges of this process (fake_nccl.cpp, "Resources"):
 * "own_resource_comms" and "shared_comms" (live communicators with device memory of
 * their own, and splits sharing their parent's), "resource_bytes" (device memory the
 * communicators hold from the fake CUDA now). */
typedef unsigned long long (*fake_nccl_counter_fn)(const char *name);
/* Failure injection at run time, as FAKE_NCCL_FAIL (fake_nccl.cpp): the n-th call of
 * `api` from now (n >= 1) fails with ncclUnhandledCudaError and issues nothing; 0
 * disarms. Returns -1 for an entry point that cannot be made to fail. */
typedef int (*fake_nccl_fail_after_fn)(const char *api, unsigned long long n);

#ifdef __cplusplus
}
#endif

#endif /* STREAMCOLL_TESTS_FAKE_API_H */
