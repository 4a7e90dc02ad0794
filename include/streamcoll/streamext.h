/* streamcoll stream extension: order a communicator's GPU collectives on a CUDA stream.
 *
 * Attach a CUDA stream to a communicator, and from then on the collectives streamcoll
 * intercepts on that communicator, when their buffers are in GPU memory, are
 * *stream-ordered* (Aluminum: Dryden et
 * al., "Aluminum: An Asynchronous, GPU-Aware Communication Library Optimized for Large-
 * Scale Training of Deep Neural Networks on HPC Systems", MLHPC 2018, sections IV-B and
 * V-A):
 *
 *   - it runs after all work enqueued on the stream before the call;
 *   - work enqueued on the stream after the call sees its result;
 *   - the calling thread does not wait for the data: the call returns as soon as the
 *     operation is enqueued. Buffers must stay allocated, and must not be reused by other
 *     streams, until the stream has passed the operation (cudaStreamSynchronize, or an
 *     event recorded on the stream after the call).
 *   - MPI_Iallreduce etc. return a real MPI_Request. The operation may overlap with
 *     later work on the stream; MPI_Wait, MPI_Test and their array forms (mixing these
 *     requests with ordinary ones is fine) make the *stream* wait for the operation and
 *     complete the request at once: later work on the stream sees the result, the host
 *     is not held. MPI_Request_free does the same.
 *   - made while the stream is being captured (cudaStreamBeginCapture), the call is
 *     recorded into the CUDA graph and made once at every launch of it, in stream
 *     order; MPI_I* calls return a request that is already complete (each launch makes
 *     the MPI_I* call and waits for it on the stream). Needs MPI_THREAD_MULTIPLE; a rank launches its graphs and makes
 *     its live calls on a communicator in one order, the same on every rank, and makes no
 *     live call on it while a launched graph's calls may be pending; destroy the graphs
 *     before freeing the communicator (docs/guide.md, "CUDA graphs").
 *
 * Covered: MPI_Allreduce, MPI_Reduce, MPI_Bcast, MPI_Allgather, MPI_Allgatherv,
 * MPI_Reduce_scatter_block, MPI_Reduce_scatter, MPI_Alltoall, MPI_Barrier, their MPI_I*
 * forms and their persistent forms (MPI 4.0 MPI_*_init, Open MPI 4.1 MPIX_*_init, with
 * MPI_Start/MPI_Startall: each start is ordered on the stream as the MPI_I* call is, and
 * recorded when the stream is being captured), made from C or through the Fortran
 * bindings (the module streamcoll attaches a stream from Fortran; persistent ones from
 * Fortran under MPICH only). Not
 * covered, and NOT ordered on the stream: MPI_Gather(v), MPI_Scatter(v), MPI_Alltoallv/w,
 * MPI_Scan, MPI_Exscan, the neighborhood collectives (persistent or not), and point-to-point:
 * streamcoll passes them to the MPI untouched, so synchronise the stream before them, as
 * without streamcoll.
 *
 * Without an attached stream, GPU collectives keep classic CUDA-aware MPI semantics:
 * the caller makes the input ready (e.g. cudaStreamSynchronize) before the call, and the
 * call returns when the result is in the receive buffer and visible to later CUDA work on
 * any stream. Collectives on host buffers keep plain MPI semantics on every
 * communicator, attached stream or not. A call that streamcoll cannot run on the stream
 * (a route declines it: datatype, op, ranks sharing one GPU, ...) is still correct: the
 * stream is synchronised, the real MPI call runs, and the host waits for it.
 *
 * The attribute. The stream is stored with MPI_Comm_set_attr under the keyval that
 * streamcoll_stream_keyval() returns; the attribute value *is* the stream handle (a
 * cudaStream_t, which is the driver's CUstream; 0, cudaStreamLegacy and
 * cudaStreamPerThread are valid). MPI_Comm_dup copies it (the duplicate is ordered on
 * the same stream); MPI_Comm_split, MPI_Comm_create and friends do not. MPI_Comm_free,
 * or detaching, releases what streamcoll holds for the communicator. The stream must
 * belong to the GPU the communicator's buffers are on, and outlive the attachment.
 * Every rank of the communicator should attach (its own) stream at the same point. A
 * blocking call on a communicator where only some ranks attached one is still correct
 * (the ranks agree on it and take the MPI's route together), but not stream-ordered.
 *
 * Finding streamcoll. These helpers are header-only and look streamcoll up at run time
 * (dlsym), so a program built with them runs with or without streamcoll, preloaded or
 * linked. When it is absent (or STREAMCOLL_DISABLE=1, or MPI is not initialised), they
 * return STREAMCOLL_ERR_ABSENT, and the caller keeps the classic pattern
 * (cudaStreamSynchronize before each collective). Link with -ldl on glibc < 2.34.
 *
 * Thread safety: after MPI_Init, as MPI_Comm_set_attr/get_attr/delete_attr on the same
 * communicator (the MPI's own rules; MPI_THREAD_MULTIPLE for concurrent use).
 */
#ifndef STREAMCOLL_STREAMEXT_H
#define STREAMCOLL_STREAMEXT_H

#include <dlfcn.h>
#include <mpi.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A CUDA stream. cudaStream_t and CUstream are both `struct CUstream_st *`, so either
 * converts without a cast; this header does not need the CUDA headers. */
struct CUstream_st;
typedef struct CUstream_st *streamcoll_stream_t;

/* Returned by the helpers below when streamcoll is not in this process, is disabled,
 * or MPI is not initialised. Not an MPI error code (those are >= 0). */
#define STREAMCOLL_ERR_ABSENT (-1)

/* Exported by libstreamcoll: the stream keyval, created at first call; MPI_KEYVAL_INVALID
 * when disabled or before MPI_Init. Prefer streamcoll_stream_keyval() below, which also
 * works when the library is not loaded. */
typedef int (*streamcoll_get_stream_keyval_fn)(void);

/** The keyval under which a communicator's stream is stored, or MPI_KEYVAL_INVALID when
 *  streamcoll is not loaded, disabled, or MPI is not initialised. Local, cheap after the
 *  first call. */
static inline int streamcoll_stream_keyval(void) {
  streamcoll_get_stream_keyval_fn fn =
      (streamcoll_get_stream_keyval_fn)dlsym(RTLD_DEFAULT, "streamcoll_get_stream_keyval");
  return fn ? fn() : MPI_KEYVAL_INVALID;
}

/** 1 if streamcoll is loaded and active (stream attachment will take effect), else 0. */
static inline int streamcoll_stream_available(void) {
  return streamcoll_stream_keyval() != MPI_KEYVAL_INVALID;
}

/** Attaches `stream` to `comm`, replacing any stream attached before (the next
 *  collective is ordered on the new stream only). Local (not collective).
 *  Returns MPI_SUCCESS; STREAMCOLL_ERR_ABSENT (nothing attached: synchronise yourself);
 *  or the MPI error code of MPI_Comm_set_attr (e.g. MPI_ERR_COMM for MPI_COMM_NULL), as
 *  returned when the communicator's error handler returns. */
static inline int streamcoll_comm_attach_stream(MPI_Comm comm, streamcoll_stream_t stream) {
  int keyval = streamcoll_stream_keyval();
  if (keyval == MPI_KEYVAL_INVALID) return STREAMCOLL_ERR_ABSENT;
  return MPI_Comm_set_attr(comm, keyval, (void *)stream);
}

/** The stream attached to `comm`: *flag = 1 and *stream set, or *flag = 0 (*stream left
 *  alone) when none is attached. Returns MPI_SUCCESS, STREAMCOLL_ERR_ABSENT (*flag = 0),
 *  or the error code of MPI_Comm_get_attr. */
static inline int streamcoll_comm_get_stream(MPI_Comm comm, streamcoll_stream_t *stream,
                                             int *flag) {
  int keyval = streamcoll_stream_keyval();
  void *value = NULL;
  int rc;
  *flag = 0;
  if (keyval == MPI_KEYVAL_INVALID) return STREAMCOLL_ERR_ABSENT;
  rc = MPI_Comm_get_attr(comm, keyval, &value, flag);
  if (rc == MPI_SUCCESS && *flag) *stream = (streamcoll_stream_t)value;
  return rc;
}

/** Detaches the stream from `comm`: later collectives have classic semantics. Operations
 *  already enqueued stay on the stream. Detaching a communicator with no stream is not an
 *  error. Returns MPI_SUCCESS, STREAMCOLL_ERR_ABSENT, or the error code of
 *  MPI_Comm_delete_attr. */
static inline int streamcoll_comm_detach_stream(MPI_Comm comm) {
  int keyval = streamcoll_stream_keyval();
  void *value = NULL;
  int flag = 0, rc;
  if (keyval == MPI_KEYVAL_INVALID) return STREAMCOLL_ERR_ABSENT;
  rc = MPI_Comm_get_attr(comm, keyval, &value, &flag);
  if (rc != MPI_SUCCESS || !flag) return rc;
  return MPI_Comm_delete_attr(comm, keyval);
}

#ifdef __cplusplus
} /* extern "C" */

namespace streamcoll {

/** Attaches a stream (cudaStream_t or CUstream) for the lifetime of this object and
 *  detaches it on destruction. `attached()` says whether streamcoll took it; when false,
 *  synchronise the stream yourself before each collective. Not copyable. */
class ScopedStream {
 public:
  ScopedStream(MPI_Comm comm, streamcoll_stream_t stream)
      : comm_(comm), attached_(streamcoll_comm_attach_stream(comm, stream) == MPI_SUCCESS) {}
  ~ScopedStream() {
    if (attached_) streamcoll_comm_detach_stream(comm_);
  }
  ScopedStream(const ScopedStream &) = delete;
  ScopedStream &operator=(const ScopedStream &) = delete;
  bool attached() const { return attached_; }

 private:
  MPI_Comm comm_;
  bool attached_;
};

}  // namespace streamcoll
#endif

#endif /* STREAMCOLL_STREAMEXT_H */
