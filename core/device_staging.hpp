// Device staging: a rank's part in a route that runs on one GPU (nccl, ccube, nvgroup)
// when this rank's buffers are somewhere else: host, pinned or managed memory, or another
// GPU. The call was routed from memory kinds agreed at an earlier call (a non-blocking
// call, or a blocking one decided from its signature's earlier agreements:
// shim/dispatch.cpp), so every other rank runs the route's operation; this one must run
// it too, on a scratch buffer on the route's GPU:
//
//   order    the scratch stream waits for the application's work on the buffers' own GPUs
//            (their legacy streams, and so the blocking streams there) and, where this
//            rank has one, on the stream attached to the communicator
//   in       the input bytes -> scratch (Layout::in, in_bytes at in_off)
//   call     the route's operation in place on scratch (sendbuf MPI_IN_PLACE)
//   out      the bytes MPI says the call writes on this rank -> recvbuf (Layout::out,
//            the same offsets), on a stream that nothing else uses
//
// Which stream each step goes on, when the host waits and how a failure is told to the
// peers belong to the route (nccl.cpp: run_staged, nvgroup.cpp: run_staged). The staged
// rank keeps plain MPI semantics: its buffers are final when the call returns or its
// request completes. Host staging for the real MPI (the other direction) is
// core/host_staging.hpp.
#pragma once

#include <cstdint>
#include <vector>

#include "core/coll_args.hpp"

#if STREAMCOLL_HAVE_CUDA
#include <cuda.h>
#endif

namespace streamcoll::device_staging {

/// Where a staged call's data lies in its scratch buffer: the input (`in`: in_bytes of it
/// go to offset in_off), the scratch size in bytes, and the byte ranges of the result
/// copied back to the same offsets of recvbuf.
struct Layout {
  struct Range {
    uint64_t off = 0, bytes = 0;
  };
  const char* in = nullptr;
  uint64_t scratch = 0, in_off = 0, in_bytes = 0;
  std::vector<Range> out;
};

/// The layout of `a` (allreduce, reduce, bcast, allgather, reduce_scatter_block,
/// alltoall, with a predefined datatype) for rank `rank` of `size`; false for any other
/// collective. In place (MPI_IN_PLACE) the input is read from recvbuf (allgather: this
/// rank's block of it), and an in-place allgather does not write this rank's block back.
/// Pure: no driver, no communication.
bool layout(const CollArgs& a, int rank, int size, Layout* l);

#if STREAMCOLL_HAVE_CUDA
/// Makes `s` (a stream of the route's context, current) wait for the application's work
/// on the GPUs that hold `in` and `out` (device or managed memory; host memory needs no
/// ordering: the host made its writes before the call) and, when `attached` is not null,
/// on that stream. No host wait. MPI_SUCCESS, or an error code from fail() (not raised).
int order_after(const void* in, const void* out, CUstream s, CUstream attached);

/// Copies the input of `l` to scratch `buf` on `s`. MPI_SUCCESS or an error code.
int copy_in(const Layout& l, CUdeviceptr buf, CUstream s);

/// Copies the result ranges of `l` from scratch `buf` to `recvbuf` on `s`. Every range is
/// tried; the first failure is returned.
int copy_out(const Layout& l, CUdeviceptr buf, void* recvbuf, CUstream s);
#endif

}  // namespace streamcoll::device_staging
