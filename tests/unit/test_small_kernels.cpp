// Route ccube's elementwise reduction and host staging's batched copies
// (algorithms/nvgroup_kernel.hpp, reduce_thread and batch_copy_block), built for the host.
// The GPU runs them as a grid of threads that split the work by index (grid-stride
// loops); the fake CUDA driver runs them as one thread. Here every thread of several
// grid shapes is run in turn, so the split itself is checked: every element reduced or
// copied exactly once, nothing outside the ranges touched. Results are compared with
// values computed here, for every element type and op the reduction claims (float16 and
// bfloat16 through float, rounded per step), counts 1 to 5000.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "algorithms/nvgroup_kernel.hpp"

namespace {

using namespace streamcoll::nvgroup;

// Runs the reduction as a grid of `blocks` x `threads`, every thread in turn.
void run_reduce(const ReduceParams& p, uint32_t blocks, uint32_t threads) {
  const uint64_t stride = uint64_t{blocks} * threads;
  for (uint64_t t = 0; t < stride; ++t) reduce_thread(p, t, stride);
}

template <typename T>
T ref_apply(ROp op, T a, T b) {
  switch (op) {
    case ROp::sum: return static_cast<T>(a + b);
    case ROp::prod: return static_cast<T>(a * b);
    case ROp::min: return a < b ? a : b;
    default: return a < b ? b : a;
  }
}

template <typename T>
void check_type(DType dt) {
  for (ROp op : {ROp::sum, ROp::prod, ROp::min, ROp::max})
    for (uint64_t n : {uint64_t{1}, uint64_t{7}, uint64_t{1000}, uint64_t{4099}})
      for (uint32_t blocks : {1u, 3u, reduce_blocks(n)}) {
        // Small values (products stay exact for 8-bit types), guards on both sides.
        std::vector<T> src(n), dst(n + 2), want(n + 2);
        for (uint64_t i = 0; i < n; ++i) {
          src[i] = static_cast<T>((i * 7 + 3) % 5 + 1);
          dst[i + 1] = static_cast<T>((i * 11 + 1) % 4 + 1);
        }
        dst[0] = dst[n + 1] = static_cast<T>(9);
        want = dst;
        for (uint64_t i = 0; i < n; ++i) want[i + 1] = ref_apply(op, src[i], dst[i + 1]);
        ReduceParams p{dst.data() + 1, src.data(), n, static_cast<uint32_t>(dt), static_cast<uint32_t>(op)};
        run_reduce(p, blocks, 32);
        CHECK_MESSAGE(std::memcmp(dst.data(), want.data(), (n + 2) * sizeof(T)) == 0,
                      "dtype " << static_cast<int>(dt) << " op " << static_cast<int>(op) << " n " << n
                               << " blocks " << blocks);
      }
}

// 16-bit floats: values exact in both formats (small integers and halves), so the
// reference is the float result converted back.
void check_16(DType dt) {
  const bool bf = dt == DType::bf16;
  auto to16 = [&](float f) { return bf ? float_to_bf16(f) : float_to_half(f); };
  auto from16 = [&](uint16_t h) { return bf ? bf16_to_float(h) : half_to_float(h); };
  for (ROp op : {ROp::sum, ROp::prod, ROp::min, ROp::max})
    for (uint64_t n : {uint64_t{1}, uint64_t{1000}}) {
      std::vector<uint16_t> src(n), dst(n), want(n);
      for (uint64_t i = 0; i < n; ++i) {
        src[i] = to16(static_cast<float>((i % 9)) * 0.5f - 2.0f);
        dst[i] = to16(static_cast<float>((i % 5)) + 0.5f);
      }
      for (uint64_t i = 0; i < n; ++i) want[i] = to16(ref_apply(op, from16(src[i]), from16(dst[i])));
      ReduceParams p{dst.data(), src.data(), n, static_cast<uint32_t>(dt), static_cast<uint32_t>(op)};
      run_reduce(p, 2, 64);
      CHECK(dst == want);
    }
}

}  // namespace

TEST_CASE("ccube's reduction kernel: every type and op, any grid, exactly the range") {
  check_type<int8_t>(DType::i8);
  check_type<uint8_t>(DType::u8);
  check_type<int32_t>(DType::i32);
  check_type<uint32_t>(DType::u32);
  check_type<int64_t>(DType::i64);
  check_type<uint64_t>(DType::u64);
  check_type<float>(DType::f32);
  check_type<double>(DType::f64);
  check_16(DType::f16);
  check_16(DType::bf16);
}

TEST_CASE("reduce_blocks: 1 to kReduceMaxBlocks, about 4 elements per thread") {
  CHECK(reduce_blocks(0) == 1);
  CHECK(reduce_blocks(1) == 1);
  CHECK(reduce_blocks(kReduceThreads * 4) == 1);
  CHECK(reduce_blocks(kReduceThreads * 4 + 1) == 2);
  CHECK(reduce_blocks(uint64_t{1} << 40) == kReduceMaxBlocks);
}

TEST_CASE("batched copies: every segment once, aligned or not, any grid") {
  // Segments of assorted lengths and alignments packed from separate sources into one
  // buffer (as a fused group packs), then unpacked into separate destinations.
  const std::vector<uint64_t> lens = {1, 7, 8, 16, 24, 3, 1000, 4096, 5, 64, 13, 800};
  for (uint32_t nseg : {1u, 4u, 12u}) {
    std::vector<std::vector<unsigned char>> src(nseg), back(nseg);
    uint64_t total = 0;
    for (uint32_t s = 0; s < nseg; ++s) {
      src[s].resize(lens[s] + 1);  // +1: an unaligned start for odd segments below
      for (size_t i = 0; i < src[s].size(); ++i) src[s][i] = static_cast<unsigned char>(s * 31 + i * 7 + 1);
      back[s].assign(lens[s] + 2, 0xEE);
      total += lens[s] + 8;  // gaps between the packed segments stay untouched
    }
    for (uint32_t blocks : {1u, 3u, nseg})
      for (uint32_t threads : {1u, 32u, kBatchThreads}) {
        std::vector<unsigned char> packed(total + 8, 0xCD);
        BatchCopyParams pack{};
        pack.n = nseg;
        uint64_t off = 8;  // 8-byte aligned start of the packed area
        std::vector<uint64_t> at(nseg);
        for (uint32_t s = 0; s < nseg; ++s) {
          at[s] = off;
          const unsigned char* from = src[s].data() + (s % 2);  // odd segments unaligned
          pack.seg[s] = {reinterpret_cast<uint64_t>(packed.data() + off),
                         reinterpret_cast<uint64_t>(from), lens[s]};
          off += (lens[s] + 7) / 8 * 8;
        }
        for (uint32_t b = 0; b < blocks; ++b)
          for (uint32_t t = 0; t < threads; ++t) batch_copy_block(pack, b, blocks, t, threads);
        BatchCopyParams unpack{};
        unpack.n = nseg;
        for (uint32_t s = 0; s < nseg; ++s)
          unpack.seg[s] = {reinterpret_cast<uint64_t>(back[s].data() + 1),
                           reinterpret_cast<uint64_t>(packed.data() + at[s]), lens[s]};
        for (uint32_t b = 0; b < blocks; ++b)
          for (uint32_t t = 0; t < threads; ++t) batch_copy_block(unpack, b, blocks, t, threads);
        for (uint32_t s = 0; s < nseg; ++s) {
          const unsigned char* from = src[s].data() + (s % 2);
          CHECK_MESSAGE(std::memcmp(back[s].data() + 1, from, lens[s]) == 0,
                        "segment " << s << " of " << nseg << ", grid " << blocks << " x " << threads);
          CHECK(back[s][0] == 0xEE);
          CHECK(back[s][lens[s] + 1] == 0xEE);
          // The packed area between segments is untouched.
          const uint64_t end = at[s] + lens[s];
          const uint64_t next = s + 1 < nseg ? at[s + 1] : packed.size();
          for (uint64_t i = end; i < next; ++i) CHECK(packed[i] == 0xCD);
        }
      }
  }
}
