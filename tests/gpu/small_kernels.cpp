// Route ccube's elementwise reduction (streamcoll_reduce) and host staging's batched
// copies (streamcoll_batch_copy) on a real GPU, from the fatbin libstreamcoll embeds
// (STREAMCOLL_TEST_NVGROUP_FATBIN: its path in the build), loaded with
// cudaLibraryLoadFromFile and launched as streamcoll launches them (grids from
// reduce_blocks, kReduceThreads; kBatchThreads, one block per segment).
//   - streamcoll_reduce: every element type and op, counts 1, 1000, 4099 and 1 Mi, on
//     device memory with guard elements on both sides; the result must equal, bit for
//     bit, the same logic compiled for the host (algorithms/nvgroup_kernel.hpp, which
//     tests/unit/test_small_kernels.cpp checks against independent values), and the
//     guards must be untouched;
//   - streamcoll_batch_copy: 100 segments of 1 to 800 bytes, aligned and not, packed from
//     device buffers into pinned host memory (cudaHostAlloc, used at its host address)
//     and unpacked into other device buffers, in launches of at most kBatchMax segments.
// No MPI. Skips (exit 77) without a GPU or without the fatbin (a build without nvcc).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "algorithms/nvgroup_kernel.hpp"

namespace streamcoll::nvgroup {
void spin_pause() {}  // declared for the NV-Group kernel's host build; not used here
}  // namespace streamcoll::nvgroup

namespace {

using namespace streamcoll::nvgroup;

int g_pass = 0, g_fail = 0;
void check(bool ok, const std::string& what) {
  ok ? ++g_pass : ++g_fail;
  if (!ok && g_fail <= 30) std::fprintf(stderr, "FAIL: %s\n", what.c_str());
}

#define CU(x)                                                                           \
  do {                                                                                  \
    cudaError_t e_ = (x);                                                               \
    if (e_ != cudaSuccess) {                                                            \
      std::fprintf(stderr, "FAIL: %s: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__); \
      std::exit(1);                                                                     \
    }                                                                                   \
  } while (0)

uint32_t size_of(DType t) { return dtype_size(t); }

void test_reduce(cudaKernel_t k) {
  const DType types[] = {DType::i8, DType::u8, DType::i32, DType::u32, DType::i64,
                         DType::u64, DType::f16, DType::bf16, DType::f32, DType::f64};
  for (DType t : types)
    for (ROp op : {ROp::sum, ROp::prod, ROp::min, ROp::max})
      for (uint64_t n : {uint64_t{1}, uint64_t{1000}, uint64_t{4099}, uint64_t{1} << 20}) {
        const uint64_t es = size_of(t), bytes = n * es, guard = 64;
        std::vector<unsigned char> src(bytes), dst(bytes + 2 * guard), want, got(bytes + 2 * guard);
        for (uint64_t i = 0; i < bytes; ++i) src[i] = static_cast<unsigned char>((i * 37 + 11) % 7 + 1);
        for (uint64_t i = 0; i < dst.size(); ++i) dst[i] = static_cast<unsigned char>((i * 13 + 5) % 5 + 1);
        // Small bytes make small values of every type: sums and products stay finite.
        if (t == DType::f16 || t == DType::bf16 || t == DType::f32 || t == DType::f64)
          for (uint64_t i = 0; i < n; ++i) {
            const float a = static_cast<float>(i % 9) * 0.5f - 2.0f, b = static_cast<float>(i % 5) + 0.5f;
            auto put = [&](unsigned char* base, float v) {
              if (t == DType::f16) { const uint16_t h = float_to_half(v); std::memcpy(base + i * 2, &h, 2); }
              if (t == DType::bf16) { const uint16_t h = float_to_bf16(v); std::memcpy(base + i * 2, &h, 2); }
              if (t == DType::f32) std::memcpy(base + i * 4, &v, 4);
              if (t == DType::f64) { const double d = v; std::memcpy(base + i * 8, &d, 8); }
            };
            put(src.data(), a);
            put(dst.data() + guard, b);
          }
        want = dst;
        ReduceParams h{want.data() + guard, src.data(), n, static_cast<uint32_t>(t), static_cast<uint32_t>(op)};
        reduce_thread(h, 0, 1);
        unsigned char *d_src = nullptr, *d_dst = nullptr;
        CU(cudaMalloc(&d_src, bytes));
        CU(cudaMalloc(&d_dst, dst.size()));
        CU(cudaMemcpy(d_src, src.data(), bytes, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(d_dst, dst.data(), dst.size(), cudaMemcpyHostToDevice));
        ReduceParams p{d_dst + guard, d_src, n, static_cast<uint32_t>(t), static_cast<uint32_t>(op)};
        void* args[] = {&p};
        CU(cudaLaunchKernel(reinterpret_cast<const void*>(k), dim3(reduce_blocks(n)),
                            dim3(kReduceThreads), args, 0, nullptr));
        CU(cudaDeviceSynchronize());
        CU(cudaMemcpy(got.data(), d_dst, got.size(), cudaMemcpyDeviceToHost));
        CU(cudaFree(d_src));
        CU(cudaFree(d_dst));
        check(got == want, "streamcoll_reduce dtype " + std::to_string(static_cast<int>(t)) + " op " +
                               std::to_string(static_cast<int>(op)) + " n " + std::to_string(n));
      }
}

void test_batch_copy(cudaKernel_t k) {
  constexpr int kSegs = 100;
  std::vector<uint64_t> len(kSegs), at(kSegs);
  uint64_t total = 0;
  for (int s = 0; s < kSegs; ++s) {
    len[s] = 1 + static_cast<uint64_t>(s * 97 % 800);
    at[s] = total + (s % 3 == 1 ? 3 : 0);  // every third segment at an odd offset
    total = at[s] + len[s] + 8;
  }
  unsigned char* pinned = nullptr;
  CU(cudaHostAlloc(reinterpret_cast<void**>(&pinned), total, cudaHostAllocDefault));
  std::memset(pinned, 0xCD, total);
  std::vector<unsigned char*> in(kSegs), out(kSegs);
  std::vector<std::vector<unsigned char>> data(kSegs);
  for (int s = 0; s < kSegs; ++s) {
    data[s].resize(len[s]);
    for (uint64_t i = 0; i < len[s]; ++i) data[s][i] = static_cast<unsigned char>(s * 31 + i * 7 + 1);
    CU(cudaMalloc(&in[s], len[s]));
    CU(cudaMalloc(&out[s], len[s]));
    CU(cudaMemcpy(in[s], data[s].data(), len[s], cudaMemcpyHostToDevice));
    CU(cudaMemset(out[s], 0xEE, len[s]));
  }
  auto launch = [&](bool pack) {
    for (int first = 0; first < kSegs; first += static_cast<int>(kBatchMax)) {
      BatchCopyParams p{};
      p.n = static_cast<uint32_t>(std::min<int>(kBatchMax, kSegs - first));
      for (uint32_t i = 0; i < p.n; ++i) {
        const int s = first + static_cast<int>(i);
        const auto host = reinterpret_cast<uint64_t>(pinned + at[s]);
        const auto dev = reinterpret_cast<uint64_t>(pack ? in[s] : out[s]);
        p.seg[i] = pack ? BatchCopyParams::Segment{host, dev, len[s]}
                        : BatchCopyParams::Segment{dev, host, len[s]};
      }
      void* args[] = {&p};
      CU(cudaLaunchKernel(reinterpret_cast<const void*>(k), dim3(p.n), dim3(kBatchThreads), args, 0,
                          nullptr));
    }
    CU(cudaDeviceSynchronize());
  };
  launch(true);
  bool packed = true, gaps = true;
  for (int s = 0; s < kSegs; ++s) {
    packed = packed && std::memcmp(pinned + at[s], data[s].data(), len[s]) == 0;
    const uint64_t next = s + 1 < kSegs ? at[s + 1] : total;
    for (uint64_t i = at[s] + len[s]; i < next; ++i) gaps = gaps && pinned[i] == 0xCD;
  }
  check(packed, "streamcoll_batch_copy: 100 segments packed into pinned memory");
  check(gaps, "streamcoll_batch_copy: the pinned memory between segments untouched");
  launch(false);
  bool unpacked = true;
  std::vector<unsigned char> got;
  for (int s = 0; s < kSegs; ++s) {
    got.resize(len[s]);
    CU(cudaMemcpy(got.data(), out[s], len[s], cudaMemcpyDeviceToHost));
    unpacked = unpacked && got == data[s];
    CU(cudaFree(in[s]));
    CU(cudaFree(out[s]));
  }
  check(unpacked, "streamcoll_batch_copy: 100 segments unpacked into device buffers");
  CU(cudaFreeHost(pinned));
}

}  // namespace

int main() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("SKIP: no usable GPU\n");
    return 77;
  }
  const char* path = std::getenv("STREAMCOLL_TEST_NVGROUP_FATBIN");
  if (!path || !*path) {
    std::printf("SKIP: STREAMCOLL_TEST_NVGROUP_FATBIN is not set (a build without nvcc)\n");
    return 77;
  }
  cudaLibrary_t lib = nullptr;
  cudaKernel_t reduce = nullptr, batch = nullptr;
  CU(cudaLibraryLoadFromFile(&lib, path, nullptr, nullptr, 0, nullptr, nullptr, 0));
  CU(cudaLibraryGetKernel(&reduce, lib, "streamcoll_reduce"));
  CU(cudaLibraryGetKernel(&batch, lib, "streamcoll_batch_copy"));
  test_reduce(reduce);
  test_batch_copy(batch);
  CU(cudaLibraryUnload(lib));
  std::printf("small_kernels: %d passed, %d failed\n", g_pass, g_fail);
  return g_fail == 0 ? 0 : 1;
}
