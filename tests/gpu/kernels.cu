// Device code of the GPU tests. nvcc builds it into kernels.fatbin at build time (no GPU
// needed: sm_90 code for Hopper plus compute_75 PTX that the driver compiles for any
// other GPU CUDA 13 supports); the tests load it at run time with cudaLibraryLoadFromFile
// (gpu_common.hpp, class Kernels). extern "C": the names are looked up as written.

// Holds the stream for `ns` nanoseconds of the GPU's global timer: one thread, so the
// rest of the GPU stays free for the work under test.
extern "C" __global__ void sc_spin(unsigned long long ns) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

// dst[i] = src[i] for n bytes: a kernel that writes a collective's input on the stream,
// or reads its result.
extern "C" __global__ void sc_copy(unsigned char* dst, const unsigned char* src,
                                   unsigned long long n) {
  const unsigned long long stride = static_cast<unsigned long long>(gridDim.x) * blockDim.x;
  for (unsigned long long i = static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < n; i += stride)
    dst[i] = src[i];
}
