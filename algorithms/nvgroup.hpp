// Route nvgroup's stage interface, for routes that run its kernels as a stage of their own
// (blueconnect: an NVLink group as the innermost level of a hierarchy). See
// algorithms/nvgroup.cpp (the kernels' module: nvgroup_module.cpp). Only in builds with the
// kernels (STREAMCOLL_HAVE_NVGROUP).
#pragma once

#include <cuda.h>

#include <optional>
#include <string>

#include "algorithms/nvgroup_kernel.hpp"
#include "core/coll_args.hpp"
#include "core/comm_context.hpp"
#include "core/datatypes.hpp"

namespace streamcoll::nvgroup_kernels {

/// The kernels' element type for a predefined datatype (int8..int64 and their unsigned
/// forms by size, float16, bfloat16, float, double), or nullopt.
std::optional<nvgroup::DType> type_of(const TypeInfo& t);
/// The kernels' op for sum, prod, min, max, or nullopt.
std::optional<nvgroup::ROp> op_of(OpKind k);

/// Whether reduce_kernel(device) can be expected to succeed, without loading anything:
/// it did before; or it never failed there, the driver has the entry points, and the
/// GPU's compute capability is 8.0 or more (the fatbin's cubins are sm_80 and sm_90, its
/// PTX compute_90). Local, cheap after the first call; thread-safe.
bool reduce_kernel_may_load(int device);

/// Route ccube's reduction kernel (streamcoll_reduce, nvgroup::ReduceParams) on CUDA
/// device ordinal `device`, in its primary context: the kernels' module is loaded there
/// once per process (kept to MPI_Finalize). Null, with the reason in *why, when it cannot
/// be (a driver without the entry points, a GPU the fatbin has no code for). Local: no
/// communication. Thread-safe.
CUfunction reduce_kernel(int device, std::string* why);

/// Host staging's batched-copy kernel (streamcoll_batch_copy, nvgroup::BatchCopyParams)
/// on `device`, loaded as reduce_kernel is; null, with the reason, when it cannot be (or
/// a load failed there before). Thread-safe.
CUfunction batch_copy_kernel(int device, std::string* why);

}  // namespace streamcoll::nvgroup_kernels

namespace streamcoll::nvgroup_stage {

/// Whether the kernels take `a`'s datatype and op (allreduce, reduce_scatter_block:
/// int8..float64, float16/bfloat16; sum, prod, min, max) or its element size
/// (allgather). Pure: no set-up, no communication.
bool supports(const CollArgs& a);

/// This rank cannot take its part in `a` (a blocking allreduce, reduce_scatter_block or
/// allgather on `ctx`, where route nvgroup is set up): the rounds the call would have
/// taken are given up, so the peers' kernels go on without this rank and report the call
/// failed (their status words). Nothing happens where the route is not set up.
void give_up(CommContext& ctx, const CollArgs& a);

/// Whether a kernel of this rank on `ctx` saw a failure since the last time asked (its
/// status word, cleared here): the caller reports it. Read it once the kernels are done
/// (a classic call, after its stream); false where the route is not set up.
bool take_failure(CommContext& ctx);

}  // namespace streamcoll::nvgroup_stage
