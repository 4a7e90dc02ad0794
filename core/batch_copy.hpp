// The batched-copy kernel's interface (streamcoll_batch_copy): host staging
// (core/host_staging.cpp) launches it, the kernels' module (algorithms/nvgroup_kernels.cu,
// built with the nvgroup kernels) carries it, and the fake driver runs batch_copy_block on
// the host. Plain C++ for the host and CUDA for the device.
//
// Many small copies between GPU buffers and pinned host memory in one launch: a fused
// group of MPI_Iallreduce calls packs each member's GPU buffer into its slice of the
// fused (pinned) buffer and unpacks the result likewise (algorithms/fusion_group.cpp through
// host_staging's CUDA backend). The kernel reads and writes pinned host memory in place
// (unified addressing: its host address is valid on the GPU), so a group costs one launch
// and one synchronisation per direction instead of a copy per member. Block b copies the
// segments b, b + grid, ...; its threads stride over a segment's bytes, by 8 bytes where
// both ends are 8-byte aligned.
#pragma once

#include <stdint.h>

#if defined(__CUDACC__)
#define SC_BATCH_HD __host__ __device__ __forceinline__
#else
#define SC_BATCH_HD inline
#endif

namespace streamcoll::kernels {

inline constexpr uint32_t kBatchMax = 64;       ///< segments per launch
inline constexpr uint32_t kBatchThreads = 128;  ///< threads per block

/// The batched-copy kernel's one parameter (passed by value, 1.5 KiB).
struct BatchCopyParams {
  uint32_t n;    ///< segments, 1..kBatchMax
  uint32_t pad;
  struct Segment {
    uint64_t dst, src, bytes;  ///< addresses valid on the GPU; ranges never overlap
  } seg[kBatchMax];
};

/// Block `b` of `blocks`, thread `tid` of `nthreads`: its share of the segments.
SC_BATCH_HD void batch_copy_block(const BatchCopyParams& p, uint32_t b, uint32_t blocks,
                                  uint32_t tid, uint32_t nthreads) {
  for (uint32_t s = b; s < p.n; s += blocks) {
    const BatchCopyParams::Segment& x = p.seg[s];
    if (((x.dst | x.src | x.bytes) & 7u) == 0) {
      auto* d = reinterpret_cast<uint64_t*>(x.dst);
      const auto* q = reinterpret_cast<const uint64_t*>(x.src);
      for (uint64_t i = tid; i < x.bytes / 8; i += nthreads) d[i] = q[i];
    } else {
      auto* d = reinterpret_cast<unsigned char*>(x.dst);
      const auto* q = reinterpret_cast<const unsigned char*>(x.src);
      for (uint64_t i = tid; i < x.bytes; i += nthreads) d[i] = q[i];
    }
  }
}

}  // namespace streamcoll::kernels
