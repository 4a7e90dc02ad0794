// The NV-Group allreduce kernel (algorithms/nvgroup_kernel.hpp holds its logic, shared
// with the host build the fake CUDA driver runs). Built by nvcc into a fatbin (cubins for
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
