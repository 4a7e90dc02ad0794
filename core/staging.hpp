// Staging a call's buffers through a scratch buffer where the route runs, written once
// for the routes that stage (the other direction, host staging for an MPI that is not
// CUDA-aware, is core/host_staging.hpp: it stages any datatype and the v-collectives):
//
//   nccl, ccube, nvgroup, blueconnect   a rank whose buffers are not on the route's GPU
//       (host, pinned or managed memory, another GPU) runs its part on scratch on that
//       GPU. The call was routed from memory kinds agreed at an earlier call (a
//       non-blocking call, or a blocking one decided from its signature's earlier
//       agreements: shim/dispatch.cpp), so every other rank runs the route's operation
//       and this one must too.
//   ht  a call on GPU buffers runs its host collective on pinned host memory.
//
//   order    the scratch stream waits for the application's work on the buffers' own GPUs
//            (their legacy streams, and so the blocking streams there) and, where this
//            rank has one, on the stream attached to the communicator
//   in       the input bytes -> scratch (Layout::in, in_bytes at in_off)
//   call     the route's operation on scratch (sendbuf MPI_IN_PLACE)
//   out      the bytes MPI says the call writes on this rank -> recvbuf (Layout::out)
//
// The GPU routes (nccl, ccube, nvgroup, blueconnect) stage through GpuStage, below: the
// sequence written once. Which streams it is given, when the host waits and how a failure
// is told to the peers belong to the route (nccl_enqueue.cpp, nvgroup_launch.cpp: run_staged;
// blueconnect_gpu.cpp: run_gpu_staged); route ht stages to pinned host memory on its own
// (ht_staged.cpp: enqueue_staged, run_device_classic). A staged rank without a stream keeps plain
// MPI semantics: its buffers are final when the call returns or its request completes.
#pragma once

#include <cstdint>
#include <vector>

#include "core/coll_args.hpp"

#if STREAMCOLL_HAVE_CUDA
#include <cuda.h>
#endif

namespace streamcoll::staging {

/// Where a staged call's data lies in its scratch buffer: the input (`in`: in_bytes of it
/// go to offset in_off), the scratch size in bytes, and the byte ranges of the result
/// copied back: `bytes` from scratch offset `from` to recvbuf offset `off`.
struct Layout {
  struct Range {
    uint64_t off = 0, bytes = 0, from = 0;
  };
  const char* in = nullptr;
  uint64_t scratch = 0, in_off = 0, in_bytes = 0;
  std::vector<Range> out;
};

/// The layout of `a` (allreduce, reduce, bcast, allgather, reduce_scatter_block,
/// alltoall, with a predefined datatype) for rank `rank` of `size`; false for any other
/// collective. In place (MPI_IN_PLACE) the input is read from recvbuf (allgather: this
/// rank's block of it), and an in-place allgather does not write this rank's block back.
/// `result_apart`: the root of a reduce gets its result after the input (scratch twice
/// the vector, the result from offset count * size), for a host schedule that does not
/// reduce in place; otherwise every result is in place. Pure: no driver, no
/// communication.
bool layout(const CollArgs& a, int rank, int size, Layout* l, bool result_apart = false);

#if STREAMCOLL_HAVE_CUDA
/// Makes `s` (a stream of the route's context, current) wait for the application's work
/// on the GPUs that hold `in` and `out` (device or managed memory; host memory needs no
/// ordering: the host made its writes before the call) and, when `attached` is not null,
/// on that stream. No host wait. MPI_SUCCESS, or an error code from fail() (not raised).
int order_after(const void* in, const void* out, CUstream s, CUstream attached);

/// Copies the input of `l` to scratch `buf` on `s`. MPI_SUCCESS or an error code. `buf`
/// is any memory the driver addresses: GPU memory, or pinned (or pageable) host memory.
int copy_in(const Layout& l, CUdeviceptr buf, CUstream s);

/// Copies the result ranges of `l` from scratch `buf` to `recvbuf` on `s`. Every range is
/// tried; the first failure is returned.
int copy_out(const Layout& l, CUdeviceptr buf, void* recvbuf, CUstream s);

/// One call staged through scratch on a route's GPU: order, scratch, copy in (in()), the
/// call as the route runs it there (args()), and the copies back (finish()). Not
/// thread-safe (one call's); owns the scratch, which the destructor frees (after the work
/// on the stream in() was given) when finish() or drop() did not.
class GpuStage {
 public:
  GpuStage() = default;
  ~GpuStage();
  GpuStage(const GpuStage&) = delete;
  GpuStage& operator=(const GpuStage&) = delete;

  /// Stages `a` (this rank `rank` of `size`) for a route whose GPU's context is `ctx`:
  /// its layout; stream `s` (of ctx) ordered after the application's work on the buffers'
  /// GPUs and after `attached` (the communicator's stream; null: none); scratch allocated
  /// on `s` and the input copied there. `what` names the route in messages ("nvgroup").
  /// Returns MPI_SUCCESS or the code of the first step that failed (the steps after it are
  /// not taken; args() is then a call on whatever scratch there is, possibly none).
  int in(const CollArgs& a, int rank, int size, CUcontext ctx, CUstream s, CUstream attached,
         const char* what);
  /// `a` as the route runs it: in place, on the scratch buffer.
  CollArgs args(const CollArgs& a) const;
  /// Ends the call on `s` (of the context): with `copy_back`, the result ranges to the
  /// caller's recvbuf; the scratch freed; the host waits for `s`. Returns the first failure.
  int finish(CUstream s, bool copy_back = true);
  /// Frees the scratch after the work on `s`, copying nothing back (the call failed).
  void drop(CUstream s);

 private:
  CUcontext ctx_ = nullptr;
  Layout l_;
  void* recvbuf_ = nullptr;
  CUdeviceptr buf_ = 0;
  CUstream free_on_ = nullptr;
  const char* what_ = "";
};
#endif

}  // namespace streamcoll::staging
