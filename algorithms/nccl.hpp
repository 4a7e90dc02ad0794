// Route nccl's stage interface: its failure handling, for routes that run NCCL operations
// as stages of their own (blueconnect; see algorithms/nccl.cpp, "Failures stay
// collective"), and GPU memory for fusion's messages packed on the GPU.
// Only in builds with NCCL (STREAMCOLL_HAVE_NCCL); call from threads that may call MPI.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/comm_context.hpp"

namespace streamcoll::nccl_stage {

/// This rank cannot take its part in an operation on `ctx`'s NCCL communicator (route
/// nccl set up there): abort it and tell the peers, so that their kernels end too and
/// they report an error. Nothing happens where route nccl has no communicator.
void fail_collectively(CommContext& ctx, int rc, const std::string& why);

/// Waits on the host until stream `stream` (a CUstream of the current CUDA context) is
/// idle, polling the failure notices and asynchronous errors of the NCCL communicators
/// of `ctxs` (a peer that failed makes this rank abort, which ends its kernels). Returns
/// MPI_SUCCESS, or an error code when the wait failed or one of them is aborted.
int wait_stream(const std::vector<CommContext*>& ctxs, void* stream);

/// GPU memory for a message route nccl will run on `ctx` (a fused message packed on the
/// GPU, algorithms/fusion.hpp): `bytes` (> 0) bytes on the GPU route nccl runs ctx's
/// operations on (*device: its ordinal), freed when the last copy of the pointer goes,
/// by which time the operation on it and every copy from or to it must be complete.
/// Null: route nccl is not set up on `ctx`, or the memory cannot be had. Local and
/// never waits for other ranks.
std::shared_ptr<void> device_buffer(CommContext& ctx, uint64_t bytes, int* device);

}  // namespace streamcoll::nccl_stage
