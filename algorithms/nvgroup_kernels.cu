// The NV-Group allreduce kernel, route ccube's elementwise reduction and the batched
// copies of host staging (algorithms/nvgroup_kernel.hpp holds their logic, shared with the host build the fake
// CUDA driver runs). Built by nvcc into a fatbin (cubins for
// the architectures in meson.build, plus PTX for newer GPUs), embedded in libstreamcoll
// and loaded with cuModuleLoadData: libstreamcoll links no CUDA runtime.
#include "algorithms/nvgroup_kernel.hpp"

// One block per block index of the protocol; the block's threads share the copies and
// reductions (grid-stride inside each part).
extern "C" __global__ void __launch_bounds__(256)
streamcoll_nvgroup_allreduce(streamcoll::nvgroup::Params p) {
  __shared__ streamcoll::nvgroup::Shared sh;
  streamcoll::nvgroup::run_block(p, blockIdx.x, threadIdx.x, blockDim.x, &sh);
}

// dst = src (op) dst over the grid's threads (route ccube's reduction step).
extern "C" __global__ void __launch_bounds__(256)
streamcoll_reduce(streamcoll::nvgroup::ReduceParams p) {
  static_assert(streamcoll::nvgroup::kReduceThreads == 256, "launch bounds");
  streamcoll::nvgroup::reduce_thread(p, blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x,
                                     static_cast<uint64_t>(gridDim.x) * blockDim.x);
}

// Many small copies in one launch (host staging of a fused group).
extern "C" __global__ void __launch_bounds__(128)
streamcoll_batch_copy(streamcoll::nvgroup::BatchCopyParams p) {
  static_assert(streamcoll::nvgroup::kBatchThreads == 128, "launch bounds");
  streamcoll::nvgroup::batch_copy_block(p, blockIdx.x, gridDim.x, threadIdx.x, blockDim.x);
}
