// Route ccube: C-Cube's overlapped tree (Jo, Son, Kim et al., KAIST, section III; the
// rounds and the tree mapped onto the nodes: algorithms/schedule.cpp, allreduce_ccube)
// run on the NCCL communicator. A round is one
// NCCL group of its sends and receives (byte messages, matched per pair of ranks in issue
// order, as a round's messages are posted by both ends in the same round), then its
// copies (cuMemcpyDtoDAsync) and reductions (streamcoll_reduce, dst = src op dst), all on
// the call's stream; the children's chunks land in stream-ordered scratch (one chunk per
// child). Why NCCL point-to-point plus a kernel and not NV-Group's kernels: the tree's
// edges cross nodes, which NCCL's send/recv reach (over NVLink, PCIe or the network)
// while NV-Group's kernels are one node's (CUDA IPC); and NCCL's groups let a round's
// messages run concurrently, which is what overlaps a chunk's broadcast down with the
// next chunk's reduction up. Cost: a group launch per round and a kernel per child and
// round, so chunks are large: the table's chunk=, else model::ccube_device_chunk (about
// sqrt(n · 20 KiB), from the α-β model, not measured on a GPU).
// Its route is route nccl's class (algorithms/nccl.cpp: the NCCL communicator, streams,
// failure handling and stream semantics are nccl's), with RouteId::ccube.
#pragma once

#include <cuda.h>
#include <nccl.h>

#include <cstdint>

#include "algorithms/nccl_comm.hpp"
#include "core/coll_args.hpp"
#include "core/comm_context.hpp"

namespace streamcoll {

/// Route ccube's parameters for one call: the chunk in bytes (0: the model's) and the
/// reduction kernel of the NCCL communicator's GPU.
struct Ccube {
  uint64_t chunk_bytes = 0;
  CUfunction reduce = nullptr;
};

/// Whether route ccube's kernels reduce `a`: an allreduce of a type and op they take
/// (false in a build without the kernels). From the call's arguments: equal on every rank.
bool ccube_takes(const CollArgs& a);

/// Enqueues C-Cube's allreduce of `a` on stream `s` over `c`'s NCCL communicator: the
/// rounds of sched::build (algo ccube, the tree mapped onto ctx's nodes) as NCCL groups
/// of byte sends and receives, then the round's copies and reductions (cc.reduce). Returns
/// the NCCL result; *cu gets the first failed CUDA call (scratch, copies, kernels), left
/// as it was when none failed. Never waits on the host.
ncclResult_t enqueue_ccube(const CollArgs& a, const CommContext& ctx, const nccl::NcclComm& c,
                           CUstream s, const Ccube& cc, CUresult* cu);

}  // namespace streamcoll
