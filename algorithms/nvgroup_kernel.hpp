// The NV-Group allreduce kernel's logic, shared by the CUDA build (nvgroup_kernels.cu,
// one thread block per `block` index) and the host (the fake CUDA driver runs the same
// code on the CPU, one "thread" per block index, so the protocol is tested without a GPU).
//
// Source: NV-Group (Chu et al., OSU), sections 3-4: the GPUs of a group reduce together,
// each member reading its peers' buffers directly (load-reduce-store), member m reducing
// the m-th 1/k slice of the data and every member then gathering all k reduced slices.
// Each member reads (k-1)/k of the data from peers twice and writes it once.
//
// Memory, per member (set up by algorithms/nvgroup_setup.cpp, mapped into every member by
// CUDA IPC): a device scratch area of 2*chunk elements, `in` (the member's input for the
// current round) then `res` (its reduced slice), then its inbox. Flags, one set per
// member and block index: arrived (this round's input is in `in`), reduced (this round's
// slice is in `res`), done (this member has read what it needs of the peers' scratch for
// this round). A flag holds the number of the last round passed (rounds are numbered
// across calls; a call's rounds continue the communicator's sequence), with kFailBit set
// when the member saw a failure in the round. A member signals by writing its flag into
// every member's inbox (device memory: remote stores, which the GPU posts without
// waiting), and waits by polling its own inbox (local loads; only every 32nd poll also
// looks at the hosts' failure words across PCIe). The done flags also go to host memory
// shared by the group's processes and mapped into the devices (cuMemHostRegister), where
// the hosts read them. A member whose host cannot take its part (its launch failed)
// writes the round in its failure word instead (`fails`, written by that host only, so
// never overwritten by a kernel of its still running). A waiter that sees either goes on
// with the protocol (so that nobody waits forever), sets kFailBit in its own flags (so
// the failure reaches every member) and reports the call failed through its status word.
//
// Block b handles, in every round and every phase, the b-th part of each slice: it waits
// only for the flags of block b of the other members, so blocks never wait for each other
// inside a member and the grid needs no grid-wide barrier (but every block of every
// member must be able to run: the grid is at most the device's multiprocessor count).
//
// Allreduce rounds take `chunk` elements of the vector, cut into k slices; the other modes
// (Mode) take chunk/k elements of every member's block, one slice each.
// Per round r (sequence number q), block b:
//   1. wait until every member's done[b] >= q-1 (nobody still reads my scratch);
//   2. copy my input's part b of every slice into my `in` (not when my input is
//      registered: below); write where my input is (input[b]); signal arrived[b] = q;
//   3. wait for every member's arrived[b] >= q; reduce part b of my slice over the
//      members' inputs (their `in`, or their registered buffers), in member order
//      0..k-1 (the same order on every run), into my `res`; signal reduced[b] = q;
//   4. wait for every member's reduced[b] >= q; copy part b of every member's slice from
//      its `res` into my output; signal done[b] = q.
// In place (send == recv) is safe: a round's output elements are written in step 4,
// after step 2 read them.
//
// Registered inputs (the paper's load-reduce-store over the members' own buffers): a
// member whose input buffer every peer has mapped (CUDA IPC of its allocation, set up by
// the hosts: algorithms/nvgroup_group.cpp) skips step 2's copy; its input word says which of
// its registered allocations (slot) holds the input and at what byte offset, and the
// peers read it there through Params::maps (their mappings). A member reads its peers'
// input words only after their arrived flags (which release them), and never the word of
// a member whose host gave up the round (the word is then an older round's): that
// member's `in` is read instead. Its own input stays untouched until every member has
// reduced the round (step 4 waits for every reduced flag), so the caller may reuse it
// once the kernel is done. Allreduce (in place too) and reduce_scatter_block whose
// output is its own block of the input or apart from it (the host checks) may register;
// allgather always copies.
#pragma once

#include <stdint.h>

#include <type_traits>

#include "core/batch_copy.hpp"

#if defined(__CUDACC__)
#define SC_NVG_HD __host__ __device__ __forceinline__
#else
#define SC_NVG_HD inline
#endif

namespace streamcoll::nvgroup {

inline constexpr int kMaxMembers = 8;
inline constexpr int kMaxBlocks = 128;
/// Set in a flag by a member that could not take its part in the round.
inline constexpr uint64_t kFailBit = 1ull << 63;
/// Flag words per member and block: arrived, reduced, done, and the input word.
inline constexpr int kFlagWords = 4;
enum FlagWord : int { kArrived = 0, kReduced = 1, kDone = 2, kInput = 3 };
/// Registered allocations per member (input words name one of them).
inline constexpr int kSlots = 32;
/// The input word of an input at byte `offset` of the allocation in `slot`; 0 means
/// "copied into scratch".
SC_NVG_HD uint64_t input_word(uint32_t slot, uint64_t offset) {
  return (static_cast<uint64_t>(slot) + 1) << 56 | offset;
}

/// Element types the kernel reduces (as NCCL's: int8..float64, float16 and bfloat16).
enum class DType : uint32_t { i8, u8, i32, u32, i64, u64, f16, bf16, f32, f64 };
enum class ROp : uint32_t { sum, prod, min, max };
/// What the kernel does with the same phases: allreduce (all four steps),
/// reduce_scatter_block (steps 1-3, member m's slice being block m of the input, reduced
/// straight into its output), allgather (step 2 puts member m's block into its `res`,
/// then step 4).
enum class Mode : uint32_t { allreduce, reduce_scatter_block, allgather };

SC_NVG_HD uint32_t dtype_size(DType t) {
  switch (t) {
    case DType::i8: case DType::u8: return 1;
    case DType::f16: case DType::bf16: return 2;
    case DType::i32: case DType::u32: case DType::f32: return 4;
    default: return 8;
  }
}

/// The kernel's one parameter (passed by value). Pointers are device addresses valid in
/// this member's context (peers' scratch through CUDA IPC, flags through
/// cuMemHostGetDevicePointer).
struct Params {
  const void* send;            ///< this member's input, `count` elements
  void* recv;                  ///< this member's output, `count` elements (may be send)
  uint64_t count;              ///< elements: allreduce, of the vector; the others, of one block
  uint64_t chunk;              ///< elements per round: the size of each `in` and `res`
  uint64_t seq;                ///< the first round's number (>= 1); rounds go seq, seq+1, ...
  char* scratch[kMaxMembers];  ///< member m's scratch: in = [0, chunk), res = [chunk, 2 chunk)
  uint64_t* flags;             ///< [member][block][kFlagWords]
  const uint64_t* fails;       ///< [member]: the last round the member's host gave up on
  uint64_t* status;            ///< this member's status word: set to 1 on a seen failure
  uint32_t dtype;              ///< DType
  uint32_t op;                 ///< ROp
  uint32_t members;            ///< k, 1..kMaxMembers
  uint32_t me;                 ///< this member's index
  uint32_t blocks;             ///< grid size, 1..kMaxBlocks; equal on every member
  uint32_t mode;               ///< Mode
  uint64_t input;              ///< this member's input word (0: through its scratch)
  const uint64_t* maps;        ///< [member * kSlots + slot]: that member's registered
                               ///< allocation mapped here (0: not mapped); may be null
  uint64_t inbox;              ///< byte offset of the inbox in every member's scratch:
                               ///< [from member][block][kFlagWords], zeroed at set-up
};

/// Bytes of one member's inbox (after its scratch's 2*chunk bytes).
inline constexpr uint64_t kInboxBytes = sizeof(uint64_t) * kMaxMembers * kMaxBlocks * kFlagWords;
/// How many polls of an inbox flag between two looks at the hosts' failure words (host
/// memory: a look crosses PCIe; a failure is rare and may be seen a little later).
inline constexpr uint32_t kFailPollEvery = 32;

/// What a block's threads share: the failure seen by thread 0's waits, and where each
/// member's input array starts (null: in its scratch), set after the arrived flags.
struct Shared {
  uint32_t failed;
  const char* src[kMaxMembers];
};

// ---- 16-bit floating point, converted through float (round to nearest even) ------------

SC_NVG_HD float bits_to_float(uint32_t u) {
  union {
    uint32_t u;
    float f;
  } c{u};
  return c.f;
}
SC_NVG_HD uint32_t float_to_bits(float f) {
  union {
    float f;
    uint32_t u;
  } c{f};
  return c.u;
}
SC_NVG_HD float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0x1f) return bits_to_float(sign | 0x7f800000u | (man << 13));  // inf, nan
  if (exp == 0) {
    if (man == 0) return bits_to_float(sign);
    // Subnormal: normalise.
    int e = -1;
    do {
      ++e;
      man <<= 1;
    } while (!(man & 0x400u));
    return bits_to_float(sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13));
  }
  return bits_to_float(sign | ((exp + 127 - 15) << 23) | (man << 13));
}
SC_NVG_HD uint16_t float_to_half(float f) {
  const uint32_t u = float_to_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t exp = (u >> 23) & 0xffu;
  uint32_t man = u & 0x7fffffu;
  if (exp == 0xff) return static_cast<uint16_t>(sign | 0x7c00u | (man ? 0x200u : 0));
  const int e = static_cast<int>(exp) - 127 + 15;
  if (e >= 0x1f) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow: inf
  if (e <= 0) {
    if (e < -10) return static_cast<uint16_t>(sign);  // underflow: zero
    man |= 0x800000u;
    const int shift = 14 - e;
    uint32_t h = man >> shift;
    const uint32_t rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  uint32_t h = (static_cast<uint32_t>(e) << 10) | (man >> 13);
  const uint32_t rem = man & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // may carry into inf: right
  return static_cast<uint16_t>(sign | h);
}
SC_NVG_HD float bf16_to_float(uint16_t b) { return bits_to_float(static_cast<uint32_t>(b) << 16); }
SC_NVG_HD uint16_t float_to_bf16(float f) {
  const uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // nan
  const uint32_t round = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + round) >> 16);
}

template <typename T>
SC_NVG_HD T apply(ROp op, T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    // Integers wrap around, on the GPU and in the host build alike (no signed overflow,
    // which C++ leaves undefined): the sum and product in the unsigned type of the size.
    using U = std::make_unsigned_t<T>;
    switch (op) {
      case ROp::sum: return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
      case ROp::prod: return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
      case ROp::min: return b < a ? b : a;
      default: return a < b ? b : a;
    }
  } else {
    switch (op) {
      case ROp::sum: return static_cast<T>(a + b);
      case ROp::prod: return static_cast<T>(a * b);
      case ROp::min: return b < a ? b : a;
      default: return a < b ? b : a;
    }
  }
}

// ---- memory access: device (PTX) and host (GCC atomics) ---------------------------------

#if defined(__CUDA_ARCH__)
__device__ __forceinline__ uint64_t load_acquire(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void store_release(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void fence() { __threadfence_system(); }
__device__ __forceinline__ void block_sync() { __syncthreads(); }
template <typename T>
__device__ __forceinline__ T load_peer(const T* p) {
  return __ldcg(p);  // L2, not a possibly stale L1 line: peers rewrite scratch each round
}
__device__ __forceinline__ void spin_pause() { __nanosleep(64); }
#else
inline uint64_t load_acquire(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
inline void store_release(uint64_t* p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
inline void fence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void block_sync() {}
template <typename T>
inline T load_peer(const T* p) {
  return *p;
}
void spin_pause();  // the host build provides it (a yield)
#endif

/// The host copy of member's flag (the done flags; the hosts read them).
SC_NVG_HD uint64_t* flag_at(const Params& p, uint32_t member, uint32_t block, int word) {
  return p.flags + (static_cast<uint64_t>(member) * kMaxBlocks + block) * kFlagWords + word;
}
/// Member `from`'s flag as it arrives in member `at`'s inbox.
SC_NVG_HD uint64_t* inbox_at(const Params& p, uint32_t at, uint32_t from, uint32_t block, int word) {
  return reinterpret_cast<uint64_t*>(p.scratch[at] + p.inbox) +
         (static_cast<uint64_t>(from) * kMaxBlocks + block) * kFlagWords + word;
}
/// Thread 0: this member's flag (or input word) into every member's inbox, itself too.
SC_NVG_HD void post(const Params& p, uint32_t b, int word, uint64_t v) {
  for (uint32_t m = 0; m < p.members; ++m) store_release(inbox_at(p, m, p.me, b, word), v);
}

/// Thread `tid` of `nthreads` in block `b`: waits until every member's flag `word` of
/// block b reaches `q` (or its host gave up on round q); returns whether one of them
/// failed round q. Thread 0 polls, the block then synchronises (its other threads read
/// what the flags release).
SC_NVG_HD bool wait_all(const Params& p, uint32_t b, int word, uint64_t q, uint32_t tid,
                        Shared* sh) {
  if (tid == 0) {
    uint32_t failed = 0;
    for (uint32_t m = 0; m < p.members; ++m) {
      const uint64_t* f = inbox_at(p, p.me, m, b, word);
      uint64_t v = load_acquire(f);
      uint32_t polls = 0;
      while ((v & ~kFailBit) < q) {
        if (++polls % kFailPollEvery == 0 && load_acquire(p.fails + m) >= q) {
          v = kFailBit;  // its host gave up on this round
          break;
        }
        spin_pause();
        v = load_acquire(f);
      }
      if (v & kFailBit) failed = 1;
    }
    sh->failed = failed;
  }
  block_sync();
  const bool failed = sh->failed != 0;
  block_sync();
  return failed;
}

/// Thread 0, after wait_all(kArrived, q): where each member's input array is for round
/// q (Shared::src); returns whether a member's registered input is not mapped here (its
/// data cannot be read: the round fails rather than reduce garbage).
SC_NVG_HD bool locate_inputs(const Params& p, uint32_t b, uint64_t q, Shared* sh) {
  bool unmapped = false;
  for (uint32_t m = 0; m < p.members; ++m) {
    sh->src[m] = nullptr;
    // Its kernel passed this round (not its host's failure word): its input word is this
    // round's.
    if ((load_acquire(inbox_at(p, p.me, m, b, kArrived)) & ~kFailBit) < q) continue;
    const uint64_t w = m == p.me ? p.input : load_acquire(inbox_at(p, p.me, m, b, kInput));
    if (!w) continue;
    if (m == p.me) {
      sh->src[m] = static_cast<const char*>(p.send);
      continue;
    }
    const uint64_t slot = (w >> 56) - 1, off = w & ((1ull << 56) - 1);
    const uint64_t base = p.maps && slot < static_cast<uint64_t>(kSlots) ? p.maps[m * kSlots + slot] : 0;
    if (base) sh->src[m] = reinterpret_cast<const char*>(base + off);
    else unmapped = true;
  }
  return unmapped;
}

/// Every thread of block b has written what the flag releases: fence, then thread 0 posts
/// the flag to every member (the done flag to the hosts as well).
SC_NVG_HD void signal(const Params& p, uint32_t b, int word, uint64_t q, bool failed, uint32_t tid) {
  fence();
  block_sync();
  if (tid == 0) {
    const uint64_t v = q | (failed ? kFailBit : 0);
    post(p, b, word, v);
    if (word == kDone) store_release(flag_at(p, p.me, b, word), v);
  }
}

// The round's k slices. Slice s of round r: `len` elements (0 past the data), at
// `scratch` in each member's `in` and `res`, taken from `in_off` of the caller's input
// and written to `out_off` of its output (kNone: not by this member).
inline constexpr uint64_t kNone = ~0ull;
struct Slice {
  uint64_t scratch, in_off, out_off, len;
};

// The round's slot length (elements of each slice's place in `in` and `res`) and rounds.
SC_NVG_HD uint64_t slot(const Params& p, uint64_t r) {
  if (p.mode == static_cast<uint32_t>(Mode::allreduce)) {
    const uint64_t base = r * p.chunk;
    const uint64_t m = p.count - base < p.chunk ? p.count - base : p.chunk;
    return (m + p.members - 1) / p.members;
  }
  const uint64_t l = p.chunk / p.members;
  return l ? l : 1;
}
SC_NVG_HD uint64_t rounds_of(const Params& p) {
  if (p.count == 0) return 0;
  if (p.mode == static_cast<uint32_t>(Mode::allreduce)) return (p.count + p.chunk - 1) / p.chunk;
  const uint64_t l = slot(p, 0);
  return (p.count + l - 1) / l;
}

SC_NVG_HD Slice slice_of(const Params& p, uint64_t r, uint32_t s) {
  const uint64_t L = slot(p, r);
  Slice x{s * L, kNone, kNone, 0};
  switch (static_cast<Mode>(p.mode)) {
    case Mode::allreduce: {  // the round's m elements, cut in k
      const uint64_t base = r * p.chunk;
      const uint64_t m = p.count - base < p.chunk ? p.count - base : p.chunk;
      const uint64_t lo = s * L < m ? s * L : m;
      x.len = m - lo < L ? m - lo : L;
      x.in_off = x.out_off = base + lo;
      break;
    }
    case Mode::reduce_scatter_block: {  // block s's elements [r L, r L + L)
      x.len = p.count - r * L < L ? p.count - r * L : L;
      x.in_off = s * p.count + r * L;
      if (s == p.me) x.out_off = r * L;
      break;
    }
    case Mode::allgather: {  // member s's block, the same part of it
      x.len = p.count - r * L < L ? p.count - r * L : L;
      if (s == p.me) x.in_off = r * L;
      x.out_off = s * p.count + r * L;
      break;
    }
  }
  return x;
}

// [lo, hi) of part b of a slice of `len` elements in slots of L (blocks share a slot alike
// on every member, whatever the slice's length).
struct Range {
  uint64_t lo, hi;
};
SC_NVG_HD Range part(uint64_t L, uint64_t len, uint32_t blocks, uint32_t b) {
  const uint64_t per = (L + blocks - 1) / blocks;
  uint64_t lo = per * b, hi = lo + per;
  if (lo > len) lo = len;
  if (hi > len) hi = len;
  return Range{lo, hi};
}

template <typename T>
SC_NVG_HD void copy_range(T* dst, const T* src, Range r, uint32_t tid, uint32_t nthreads, bool peer) {
  for (uint64_t i = r.lo + tid; i < r.hi; i += nthreads) dst[i] = peer ? load_peer(src + i) : src[i];
}

// Reduces part `r` of a slice over the members' inputs into dst[i] (member order
// 0..k-1); in[m] is member m's slice (its `in` area or its registered input).
template <typename T>
SC_NVG_HD void reduce_range(const Params& p, const T* const* in, Range r, T* dst, uint32_t tid,
                            uint32_t nthreads) {
  const ROp op = static_cast<ROp>(p.op);
  for (uint64_t i = r.lo + tid; i < r.hi; i += nthreads) {
    T acc = load_peer(in[0] + i);
    for (uint32_t m = 1; m < p.members; ++m) acc = apply(op, acc, load_peer(in[m] + i));
    dst[i] = acc;
  }
}

// The 16-bit float types: stored as uint16_t, reduced through float, rounded per step.
template <bool kBf16>
SC_NVG_HD void reduce_range_16(const Params& p, const uint16_t* const* in, Range r, uint16_t* dst,
                               uint32_t tid, uint32_t nthreads) {
  const ROp op = static_cast<ROp>(p.op);
  for (uint64_t i = r.lo + tid; i < r.hi; i += nthreads) {
    uint16_t acc = load_peer(in[0] + i);
    for (uint32_t m = 1; m < p.members; ++m) {
      const uint16_t x = load_peer(in[m] + i);
      const float a = kBf16 ? bf16_to_float(acc) : half_to_float(acc);
      const float y = kBf16 ? bf16_to_float(x) : half_to_float(x);
      const float v = apply(op, a, y);
      acc = kBf16 ? float_to_bf16(v) : float_to_half(v);
    }
    dst[i] = acc;
  }
}

// Slice x over the members' inputs: from Shared::src where set, else their `in` areas.
template <typename T>
SC_NVG_HD void reduce_into(const Params& p, const Shared* sh, const Slice& x, Range r, T* dst,
                           uint32_t tid, uint32_t nthreads) {
  const T* in[kMaxMembers];
  for (uint32_t m = 0; m < p.members; ++m)
    in[m] = sh->src[m] ? reinterpret_cast<const T*>(sh->src[m]) + x.in_off
                       : reinterpret_cast<const T*>(p.scratch[m]) + x.scratch;
  if (p.dtype == static_cast<uint32_t>(DType::f16))
    reduce_range_16<false>(p, reinterpret_cast<const uint16_t* const*>(in), r,
                           reinterpret_cast<uint16_t*>(dst), tid, nthreads);
  else if (p.dtype == static_cast<uint32_t>(DType::bf16))
    reduce_range_16<true>(p, reinterpret_cast<const uint16_t* const*>(in), r,
                          reinterpret_cast<uint16_t*>(dst), tid, nthreads);
  else
    reduce_range<T>(p, in, r, dst, tid, nthreads);
}

template <typename T>
SC_NVG_HD void run_block_typed(const Params& p, uint32_t b, uint32_t tid, uint32_t nthreads,
                               Shared* sh) {
  bool failed = false;
  const uint64_t rounds = rounds_of(p);
  const uint32_t k = p.members;
  const Mode mode = static_cast<Mode>(p.mode);
  const T* in = static_cast<const T*>(p.send);
  T* out = static_cast<T*>(p.recv);
  T* mine_in = reinterpret_cast<T*>(p.scratch[p.me]);
  T* mine_res = mine_in + p.chunk;
  for (uint64_t r = 0; r < rounds; ++r) {
    const uint64_t q = p.seq + r;
    const uint64_t L = slot(p, r);
    // 1-2: my scratch is free again (whatever became of the previous round: its
    // failure was reported with it); my input in (allgather: straight into `res`).
    wait_all(p, b, kDone, q - 1, tid, sh);
    const bool direct = p.input != 0 && mode != Mode::allgather;  // registered: no copy
    for (uint32_t s = 0; s < k && !direct; ++s) {
      const Slice x = slice_of(p, r, s);
      if (x.in_off == kNone) continue;
      T* dst = (mode == Mode::allgather ? mine_res : mine_in) + x.scratch;
      copy_range(dst, in + x.in_off, part(L, x.len, p.blocks, b), tid, nthreads, false);
    }
    if (mode != Mode::allgather) {
      if (tid == 0) post(p, b, kInput, direct ? p.input : 0);
      signal(p, b, kArrived, q, failed, tid);
      // 3: my slice, reduced over every member's input: into `res` (allreduce), or
      // into my output (reduce_scatter_block, which then is through with the round).
      failed |= wait_all(p, b, kArrived, q, tid, sh);
      if (tid == 0 && locate_inputs(p, b, q, sh)) sh->failed = 1;
      block_sync();
      failed |= sh->failed != 0;
      const Slice x = slice_of(p, r, p.me);
      const Range mine = part(L, x.len, p.blocks, b);
      reduce_into<T>(p, sh, x, mine,
                     mode == Mode::allreduce ? mine_res + x.scratch : out + x.out_off, tid, nthreads);
      block_sync();  // Shared::src is rewritten next round
      if (mode == Mode::reduce_scatter_block) {
        signal(p, b, kDone, q, failed, tid);
        continue;
      }
    }
    signal(p, b, kReduced, q, failed, tid);
    // 4: every member's slice into my output.
    failed |= wait_all(p, b, kReduced, q, tid, sh);
    for (uint32_t s = 0; s < k; ++s) {
      const Slice x = slice_of(p, r, s);
      copy_range(out + x.out_off, reinterpret_cast<const T*>(p.scratch[s]) + p.chunk + x.scratch,
                 part(L, x.len, p.blocks, b), tid, nthreads, true);
    }
    signal(p, b, kDone, q, failed, tid);
  }
  if (failed && tid == 0) store_release(p.status, 1);
}

/// The whole of block `b`'s work for one call: `tid` of `nthreads` threads of the block;
/// `sh` is shared by the block's threads.
SC_NVG_HD void run_block(const Params& p, uint32_t b, uint32_t tid, uint32_t nthreads, Shared* sh) {
  switch (static_cast<DType>(p.dtype)) {
    case DType::i8: return run_block_typed<int8_t>(p, b, tid, nthreads, sh);
    case DType::u8: return run_block_typed<uint8_t>(p, b, tid, nthreads, sh);
    case DType::i32: return run_block_typed<int32_t>(p, b, tid, nthreads, sh);
    case DType::u32: return run_block_typed<uint32_t>(p, b, tid, nthreads, sh);
    case DType::i64: return run_block_typed<int64_t>(p, b, tid, nthreads, sh);
    case DType::u64: return run_block_typed<uint64_t>(p, b, tid, nthreads, sh);
    case DType::f16:
    case DType::bf16: return run_block_typed<uint16_t>(p, b, tid, nthreads, sh);
    case DType::f32: return run_block_typed<float>(p, b, tid, nthreads, sh);
    case DType::f64: return run_block_typed<double>(p, b, tid, nthreads, sh);
  }
}

// ---- the elementwise reduction of route ccube ------------------------------------------
// One step of a host schedule's round run on the GPU (algorithms/schedule.hpp,
// Op::reduce: buf[i] = src[i] (op) buf[i], MPI_Reduce_local's order): route ccube runs
// C-Cube's rounds as NCCL send/recv groups followed by these (algorithms/ccube.cpp). The
// types and ops are the NV-Group kernel's (DType, ROp; the 16-bit floats through float,
// rounded per step). Every thread of the grid takes the elements i = first, first +
// stride, ... (a grid-stride loop: coalesced loads, any grid size).

/// The reduction kernel's one parameter (passed by value).
struct ReduceParams {
  void* dst;        ///< count elements, read and written (device memory)
  const void* src;  ///< count elements, read; never overlaps dst
  uint64_t count;   ///< elements
  uint32_t dtype;   ///< DType
  uint32_t op;      ///< ROp
};
inline constexpr uint32_t kReduceThreads = 256;
inline constexpr uint32_t kReduceMaxBlocks = 1024;
/// Grid size for `count` elements: about 4 elements per thread, at most kReduceMaxBlocks.
SC_NVG_HD uint32_t reduce_blocks(uint64_t count) {
  const uint64_t per_block = uint64_t{kReduceThreads} * 4;
  const uint64_t b = (count + per_block - 1) / per_block;
  return b == 0 ? 1u : b > kReduceMaxBlocks ? kReduceMaxBlocks : static_cast<uint32_t>(b);
}

template <typename T>
SC_NVG_HD void reduce_elems(const ReduceParams& p, uint64_t first, uint64_t stride) {
  const ROp op = static_cast<ROp>(p.op);
  T* d = static_cast<T*>(p.dst);
  const T* s = static_cast<const T*>(p.src);
  for (uint64_t i = first; i < p.count; i += stride) d[i] = apply(op, s[i], d[i]);
}

template <bool kBf16>
SC_NVG_HD void reduce_elems_16(const ReduceParams& p, uint64_t first, uint64_t stride) {
  const ROp op = static_cast<ROp>(p.op);
  uint16_t* d = static_cast<uint16_t*>(p.dst);
  const uint16_t* s = static_cast<const uint16_t*>(p.src);
  for (uint64_t i = first; i < p.count; i += stride) {
    const float a = kBf16 ? bf16_to_float(s[i]) : half_to_float(s[i]);
    const float b = kBf16 ? bf16_to_float(d[i]) : half_to_float(d[i]);
    const float v = apply(op, a, b);
    d[i] = kBf16 ? float_to_bf16(v) : float_to_half(v);
  }
}

/// The elements of one thread: first = its index in the grid, stride = the grid's threads.
SC_NVG_HD void reduce_thread(const ReduceParams& p, uint64_t first, uint64_t stride) {
  switch (static_cast<DType>(p.dtype)) {
    case DType::i8: return reduce_elems<int8_t>(p, first, stride);
    case DType::u8: return reduce_elems<uint8_t>(p, first, stride);
    case DType::i32: return reduce_elems<int32_t>(p, first, stride);
    case DType::u32: return reduce_elems<uint32_t>(p, first, stride);
    case DType::i64: return reduce_elems<int64_t>(p, first, stride);
    case DType::u64: return reduce_elems<uint64_t>(p, first, stride);
    case DType::f16: return reduce_elems_16<false>(p, first, stride);
    case DType::bf16: return reduce_elems_16<true>(p, first, stride);
    case DType::f32: return reduce_elems<float>(p, first, stride);
    case DType::f64: return reduce_elems<double>(p, first, stride);
  }
}

// ---- batched copies (host staging of a fused group) -------------------------------------
// Host staging's batched copies (streamcoll_batch_copy, in this module's fatbin): their
// parameters and per-block work are core/batch_copy.hpp's, named here too.
using kernels::BatchCopyParams;
using kernels::batch_copy_block;
using kernels::kBatchMax;
using kernels::kBatchThreads;

}  // namespace streamcoll::nvgroup
