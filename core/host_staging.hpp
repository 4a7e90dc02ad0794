// Host staging: GPU buffers for an MPI that is not CUDA-aware.
//
// A call on GPU memory that goes to the real MPI (route pmpi: no rule routes it, or the
// route declines it) hands the MPI the application's device pointers. A CUDA-aware MPI
// takes them; any other MPI (Debian's Open MPI, MPIX_Query_cuda_support() == 0) crashes
// on them. When the MPI is not CUDA-aware, such a call runs instead on host copies:
//
//   inputs   GPU -> host (the stream the communicator carries is already synchronised
//            by the dispatcher; without one, classic semantics: after the work already on
//            the legacy stream and the application's blocking streams, as a CUDA-aware
//            MPI's legacy-stream copy would be)
//   call     the PMPI_ call on the host copies (MPI_IN_PLACE stays MPI_IN_PLACE, with
//            the in-place data in the staged receive buffer)
//   results  host -> GPU, complete before the call returns (blocking), or before
//            MPI_Wait/MPI_Test report the request complete (non-blocking: the request is
//            a streamcoll-owned generalized request wrapping the MPI's own)
//
// Only the bytes the call reads and writes on this rank move (staging_extents), whatever
// the datatype (the extents come from MPI_Type_get_true_extent, so derived types with
// holes work; holes of the receive buffer are preserved). Device and managed memory are
// staged (managed memory is host-accessible, but not while the GPU may be using it on
// devices without concurrent managed access, so staging is the choice that is always
// correct); host and pinned buffers go to the MPI as they are, also in a call that mixes
// kinds. Calls through the Fortran bindings are not staged (passed through unchanged),
// but for a blocking call that carries the staging outcomes in band (see run()): that one
// runs as a C call, staged as one, so that it takes the same form on a rank that calls
// from C.
// Host copies are pinned (cuMemHostAlloc), from a small cache.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "base/types.hpp"
#include "config/env.hpp"
#include "core/coll_args.hpp"

struct CUfunc_st;  // CUfunction, without cuda.h

namespace streamcoll::host_staging {

// ---- Pure logic (unit-tested) -----------------------------------------------------

/// Whether a call that goes to the MPI (route pmpi) must be staged: its buffers are in
/// device or managed memory (or a mix with host memory), the MPI is not CUDA-aware, and
/// it was made through the C bindings.
bool should_stage(MemKind mem, bool fortran, bool mpi_cuda_aware);

/// Whether the MPI that MPI_Get_library_version describes as `library_version` crashes on
/// a blocking MPI_Reduce with MPI_IN_PLACE at a root other than 0 (MPICH 4.0 and 4.1:
/// pmodels/mpich#6540). A staged in-place reduce at such a root then hands the MPI a copy
/// of its input as the send buffer instead.
bool reduce_in_place_broken(const char* library_version);

/// The outcome of STREAMCOLL_MPI_CUDA_AWARE: `query_ompi` is what
/// MPIX_Query_cuda_support() returned, `query_mpich` what MPIX_GPU_query_support(CUDA)
/// said; -1 where the MPI lacks the function. Neither known under auto: not aware
/// (staging is always correct, only slower). `how` says why, for the log.
struct Awareness {
  bool aware = false;
  std::string how;
};
Awareness resolve_awareness(config::CudaAware setting, int query_ompi, int query_mpich);

/// Bytes [lo, hi) relative to a buffer's address (lo may be negative: displacements and
/// type lower bounds may point before it).
struct ByteRange {
  int64_t lo = 0, hi = 0;
  bool empty() const { return hi <= lo; }
  uint64_t bytes() const { return empty() ? 0 : static_cast<uint64_t>(hi - lo); }
  bool operator==(const ByteRange& o) const { return lo == o.lo && hi == o.hi; }
};

/// A datatype's layout, from PMPI_Type_size, PMPI_Type_get_extent and
/// PMPI_Type_get_true_extent.
struct TypeSpan {
  int64_t size = 0;         ///< bytes of data in one element
  int64_t extent = 0;       ///< stride from one element to the next
  int64_t true_lb = 0;      ///< first data byte of element 0
  int64_t true_extent = 0;  ///< from the first to the last data byte of one element
  /// A predefined contiguous type of `s` bytes.
  static TypeSpan contiguous(int64_t s) { return TypeSpan{s, s, 0, s}; }
  /// Every byte between the first and the last is data (no holes, no padding).
  bool dense() const { return extent == size && true_lb == 0 && true_extent == size; }
  /// The bytes `count` elements starting `displ` elements from the buffer occupy.
  ByteRange elements(int64_t displ, int64_t count) const;
};

/// What a call reads and writes on this rank, relative to sendbuf and recvbuf (bcast:
/// recvbuf is the buffer).
struct StagingExtents {
  ByteRange send;                   ///< read from sendbuf (empty: MPI_IN_PLACE, none)
  ByteRange recv;                   ///< staged part of recvbuf: covers recv_in, recv_out
  std::vector<ByteRange> recv_in;   ///< copied to the host before the call
  std::vector<ByteRange> recv_out;  ///< copied back after it
};

/// The extents of `a` on `rank` of `size` ranks. `send` and `recv` describe the send and
/// receive datatypes (the reduction family and bcast: both `a.datatype`). Rules:
/// MPI_IN_PLACE reads the receive buffer; reduce's recvbuf matters only at the root;
/// bcast reads the buffer at the root and writes it elsewhere; reduce_scatter(_block)
/// writes only this rank's block at the start of recvbuf; allgatherv writes each
/// rank's block at its displacement, and nothing between blocks; a receive type with
/// holes also reads what it writes, so that the holes are written back unchanged.
/// Ranges are sorted and disjoint.
StagingExtents staging_extents(const CollArgs& a, int rank, int size, const TypeSpan& send,
                               const TypeSpan& recv);

// ---- Running a staged call ----------------------------------------------------------

/// One copy between GPU and host memory, or between two GPU buffers; `gpu` is the GPU
/// buffer it belongs to (its context runs the copy).
struct Copy {
  void* dst;
  const void* src;
  uint64_t bytes;
  const void* gpu;
  /// The caller vouches that both ends are device memory of the GPU that holds `gpu` (or
  /// managed memory), so that a kernel may copy it: the batched-copy kernel then takes it
  /// as it takes copies with one end in staging's own pinned memory.
  bool device_ends = false;
};

/// Where staged data lives and how it moves. The CUDA driver in production; tests use
/// host memory that the MPI must not touch.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual MemKind classify(const void* p) = 0;
  /// Host memory for `bytes` (> 0) of staged data for a call on `gpu`; nullptr if none.
  virtual void* alloc(uint64_t bytes, const void* gpu) = 0;
  virtual void release(void* host) = 0;
  /// Performs the copies, after the work already enqueued on the legacy stream and the
  /// application's blocking streams of the GPUs involved; returns once they are complete
  /// and visible to later GPU work on any stream. MPI_SUCCESS, or an error code from
  /// fail().
  virtual int copy(const Copy* copies, size_t n) = 0;
};

/// Memory kinds the caller has found already (the dispatcher classifies each significant
/// buffer once per call): run() asks the backend only about other addresses.
struct KnownKinds {
  const void* ptr[2] = {nullptr, nullptr};
  MemKind kind[2] = {MemKind::host, MemKind::host};
  int n = 0;
};

/// How the ranks of a call that goes to the MPI learn that one of them lost its input (a
/// failed staging copy or allocation, or `own`). Equal on every rank: the dispatcher
/// chooses it from the job and the facts the ranks decide from.
enum class Outcomes {
  /// Nothing exchanged, where no rank stages (a barrier, a call the MPI will reject, host
  /// memory asserted on the communicator): a failure returns at once.
  none,
  /// Exchanged: in band or in a separate exchange (see run()); every rank learns of it.
  exchanged,
  /// Nothing exchanged, because the facts the ranks decide from say that every rank passes
  /// host memory (so no staging can fail). A rank that passes GPU memory anyway (its kind
  /// changed since the ranks last agreed) stages it as usual; if it loses its input it
  /// can neither take part without handing its peers a result built on garbage nor tell
  /// them, and it aborts the job (MPI_Abort on the call's communicator, with the reason),
  /// as a CUDA-aware MPI does when it cannot copy a device buffer (Open MPI's datatype
  /// engine and coll/cuda abort on a failed cuMemcpy). A blocking Fortran call with GPU
  /// buffers is staged as a C call.
  fatal,
};

/// Runs the call `a` on the MPI with this rank's GPU buffers staged through host memory
/// (see the file comment); buffers that are not on a GPU, and Fortran calls, go to the
/// MPI as they are. Returns what the MPI returns; a failed copy or allocation is raised
/// through a.comm's error handler here (the MPI raises its own errors).
///
/// `outcomes` == exchanged (the dispatcher's choice for a call with data in a job whose MPI
/// is not CUDA-aware, unless the agreed facts say every rank passes host memory): the
/// ranks exchange whether their staging failed, so that a rank that lost its input still
/// takes part and no rank reports a result built on it as a success. Blocking calls of at
/// most 64 KiB carry the flags in band (host_staging.cpp): an MPI_Allreduce or MPI_Reduce
/// with a predefined op other than XOR/MAXLOC/MINLOC on 4- or 8-byte integers or
/// float/double, one more element; an MPI_Bcast or MPI_Allgather, one more byte per
/// block; the call runs, and every rank that gets a result built on a lost input reports
/// an error instead. Other blocking calls exchange the flags in one small allreduce on
/// a.comm first, and no rank runs the call if any staging failed; non-blocking ones start
/// an MPI_Iallreduce before the call, which runs, and its request completes with the
/// error. The form depends only on what MPI makes equal on every rank (the collective, its
/// size, a reduction's datatype and op), never on the binding or how a rank describes its
/// data. `own`: a failure of this rank's found before (the stream synchronisation),
/// treated as a failed staging. Outcomes::none and ::fatal: see Outcomes.
/// Non-blocking calls that stage or exchange get a streamcoll-owned request in
/// *a.request (Fortran calls too: the MPI's request is wrapped).
int run(const CollArgs& a, Backend& backend, Outcomes outcomes = Outcomes::none,
        int own = MPI_SUCCESS, const KnownKinds* known = nullptr);

// ---- Process-wide state -------------------------------------------------------------

/// Whether the MPI is CUDA-aware, as STREAMCOLL_MPI_CUDA_AWARE says or the MPI answers
/// (MPIX_Query_cuda_support, MPIX_GPU_query_support).
Awareness query(config::CudaAware setting);
/// Decides, once, when the runtime starts with a usable CUDA driver, whether GPU buffers
/// must be staged (from query()'s answer); logs the outcome at info level. Returns enabled().
bool start(const Awareness& aw);
/// Frees the cached host buffers (from Runtime::stop).
void stop();
/// start() found (or was told) that the MPI is not CUDA-aware: GPU buffers are staged.
bool enabled();

/// Makes `stream` (a CUstream, of any context) wait for the work already enqueued on the
/// legacy stream of the GPU that holds `gpu` (its primary context; managed memory: the
/// current context's GPU), and so for the application's earlier work on that GPU's
/// blocking streams (cuda::wait_for_legacy): for a route whose stream is on another GPU
/// than the caller's buffer. No host wait. MPI_SUCCESS, or an error code from fail() (not
/// raised). Thread-safe.
int wait_for_legacy_of(const void* gpu, void* stream);

/// Whether the dispatcher must stage this pmpi call: enabled() and should_stage, or a
/// blocking Fortran call on GPU memory without outcomes (Outcomes::fatal: staged as C).
inline bool wanted(const CollArgs& a, MemKind mem, Outcomes outcomes = Outcomes::none) {
  return (mem == MemKind::device || mem == MemKind::managed || mem == MemKind::mixed) &&
         enabled() &&
         (should_stage(mem, a.fortran != nullptr, false) ||
          (outcomes == Outcomes::fatal && !a.nonblocking));
}
/// run() with the CUDA driver.
int run(const CollArgs& a, Outcomes outcomes, int own, const KnownKinds* known = nullptr);
/// The CUDA driver's Backend (classify, copy), or nullptr in a build without CUDA.
Backend* gpu_backend();

/// Loads the batched-copy kernel (core/batch_copy.hpp) on CUDA device ordinal `device`:
/// a CUfunction, or null with the reason in *why. Thread-safe.
using KernelLoader = CUfunc_st* (*)(int device, std::string* why);
/// The loader of the module that carries the kernel (the nvgroup kernels', which
/// registers itself when the library loads, in builds that have it). Without one,
/// batched copies are issued one copy at a time.
void set_batch_copy_loader(KernelLoader loader);

}  // namespace streamcoll::host_staging
