// The NV-Group allreduce kernel's logic (algorithms/nvgroup_kernel.hpp), built for the
// host: k members as k threads of this process, each running every block of its "grid"
// in turn, over scratch areas and a flags segment in ordinary memory. Results are compared
// with reductions computed here independently, for every element type and op the kernel
// claims, counts 0, 1, 7, odd and not divisible by k, many rounds (small chunks), in
// place and not, 1..8 members, several grid sizes; and a member whose host gives up
// (its failure word) must let the others finish and report the failure.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "algorithms/nvgroup_kernel.hpp"

namespace streamcoll::nvgroup {
void spin_pause() { std::this_thread::yield(); }
}  // namespace streamcoll::nvgroup

namespace {

using namespace streamcoll::nvgroup;

// Each member's inbox follows its 2 x chunk elements of scratch (8-byte aligned).
uint64_t inbox_offset(uint64_t chunk, uint32_t esize) { return (2 * chunk * esize + 7) / 8 * 8; }

// The group: scratch per member (with its inbox), flags, failure and status words.
struct Group {
  uint32_t k, blocks;
  uint64_t chunk;  // elements
  uint32_t esize;
  std::vector<std::vector<char>> scratch;
  std::vector<uint64_t> flags, fails, status;
  uint64_t seq = 1;
  // Registered inputs: members in `direct` hand their input in place (input word, slot
  // (m + 1) % kSlots, offset 0), mapped for the others in `maps` unless in `unmapped`.
  uint32_t direct = 0, unmapped = 0;
  std::vector<uint64_t> maps = std::vector<uint64_t>(static_cast<size_t>(kMaxMembers) * kSlots, 0);
  Group(uint32_t k_, uint32_t blocks_, uint64_t chunk_, uint32_t esize_)
      : k(k_), blocks(blocks_), chunk(chunk_), esize(esize_),
        scratch(k_, std::vector<char>(inbox_offset(chunk_, esize_) + kInboxBytes)),
        flags(static_cast<size_t>(kMaxMembers) * kMaxBlocks * kFlagWords, 0),
        fails(kMaxMembers, 0), status(kMaxMembers, 0) {}

  Params params(uint32_t me, const void* send, void* recv, uint64_t count, DType t, ROp op,
                Mode mode) {
    Params p{};
    p.send = send;
    p.recv = recv;
    p.count = count;
    p.chunk = chunk;
    p.seq = seq;
    for (uint32_t m = 0; m < k; ++m) p.scratch[m] = scratch[m].data();
    p.flags = flags.data();
    p.inbox = inbox_offset(chunk, esize);
    p.fails = fails.data();
    p.status = &status[me];
    p.dtype = static_cast<uint32_t>(t);
    p.op = static_cast<uint32_t>(op);
    p.members = k;
    p.me = me;
    p.blocks = blocks;
    p.mode = static_cast<uint32_t>(mode);
    p.maps = maps.data();
    return p;
  }

  // One allreduce: member m reduces in[m] into out[m] (in place when they are the same
  // buffer). `gives_up`: that member's host does not run its kernel and writes its
  // failure word instead.
  void run(std::vector<std::vector<char>>& in, std::vector<std::vector<char>>& out, uint64_t count,
           DType t, ROp op, int gives_up = -1, Mode mode = Mode::allreduce,
           uint64_t in_stride = 0) {
    Params probe = params(0, nullptr, nullptr, count, t, op, mode);
    const uint64_t rounds = rounds_of(probe);
    std::vector<std::thread> th;
    for (uint32_t m = 0; m < k; ++m) {
      if (static_cast<int>(m) == gives_up) {
        __atomic_store_n(&fails[m], seq + rounds - 1, __ATOMIC_RELEASE);
        continue;
      }
      // in_stride: member m's input starts m * in_stride bytes into in[m] (in-place
      // allgather: its own block of the output).
      Params p = params(m, in[m].data() + m * in_stride, out[m].data(), count, t, op, mode);
      const uint32_t slot = (m + 1) % kSlots;
      if (direct >> m & 1u) {
        p.input = input_word(slot, 0);
        maps[m * kSlots + slot] = unmapped >> m & 1u ? 0 : reinterpret_cast<uint64_t>(p.send);
      }
      th.emplace_back([p] {
        for (uint32_t b = 0; b < p.blocks; ++b) {
          Shared sh{};
          run_block(p, b, 0, 1, &sh);
        }
      });
    }
    for (auto& x : th) x.join();
    seq += rounds;
  }
};

// Values exact in every type: small integers (products of 1, 2 and -1).
double value(ROp op, uint32_t m, uint64_t i, bool is_signed) {
  switch (op) {
    case ROp::prod: {
      const uint64_t r = (i * 5 + m * 3) % 3;
      return r == 0 ? 1 : r == 1 ? 2 : (is_signed ? -1 : 1);
    }
    case ROp::sum: return static_cast<double>((i * 7 + m * 13) % 21) - (is_signed ? 10 : 0);
    default: return static_cast<double>((i * 37 + m * 101) % 200) - (is_signed ? 100 : 0);
  }
}

template <class T>
void put(char* p, double v) {
  const T x = static_cast<T>(v);
  std::memcpy(p, &x, sizeof x);
}

void store(DType t, char* p, double v) {
  switch (t) {
    case DType::i8: return put<int8_t>(p, v);
    case DType::u8: return put<uint8_t>(p, v);
    case DType::i32: return put<int32_t>(p, v);
    case DType::u32: return put<uint32_t>(p, v);
    case DType::i64: return put<int64_t>(p, v);
    case DType::u64: return put<uint64_t>(p, v);
    case DType::f32: return put<float>(p, v);
    case DType::f64: return put<double>(p, v);
    case DType::f16: {
      const uint16_t h = float_to_half(static_cast<float>(v));
      std::memcpy(p, &h, 2);
      return;
    }
    case DType::bf16: {
      const uint16_t h = float_to_bf16(static_cast<float>(v));
      std::memcpy(p, &h, 2);
      return;
    }
  }
}

bool is_signed(DType t) { return t != DType::u8 && t != DType::u32 && t != DType::u64; }

// The reference: the op over members 0..k-1 of the exact values, then stored as the
// type (the small values are exact in every type, so no rounding order matters) - except
// integer sums that overflow 8 bits, which wrap in the type (two's complement).
std::vector<char> reference(DType t, ROp op, uint32_t k, uint64_t count) {
  const uint32_t es = dtype_size(t);
  std::vector<char> out(count * es);
  for (uint64_t i = 0; i < count; ++i) {
    double acc = value(op, 0, i, is_signed(t));
    for (uint32_t m = 1; m < k; ++m) {
      const double x = value(op, m, i, is_signed(t));
      switch (op) {
        case ROp::sum: acc += x; break;
        case ROp::prod: acc *= x; break;
        case ROp::min: acc = std::min(acc, x); break;
        case ROp::max: acc = std::max(acc, x); break;
      }
    }
    if (t == DType::i8) acc = static_cast<double>(static_cast<int8_t>(static_cast<int64_t>(acc)));
    if (t == DType::u8) acc = static_cast<double>(static_cast<uint8_t>(static_cast<int64_t>(acc)));
    if (t == DType::u32) acc = static_cast<double>(static_cast<uint32_t>(static_cast<int64_t>(acc)));
    if (t == DType::u64) {
      const uint64_t u = static_cast<uint64_t>(static_cast<int64_t>(acc));
      std::memcpy(out.data() + i * es, &u, 8);
      continue;
    }
    store(t, out.data() + i * es, acc);
  }
  return out;
}

const char* name(DType t) {
  static const char* n[] = {"i8", "u8", "i32", "u32", "i64", "u64", "f16", "bf16", "f32", "f64"};
  return n[static_cast<int>(t)];
}
const char* name(ROp o) {
  static const char* n[] = {"sum", "prod", "min", "max"};
  return n[static_cast<int>(o)];
}

void check_case(uint32_t k, uint32_t blocks, uint64_t chunk, DType t, ROp op, uint64_t count,
                bool in_place, Group* reuse = nullptr, uint32_t direct = 0) {
  const uint32_t es = dtype_size(t);
  Group local(k, blocks, chunk, es);
  Group& g = reuse ? *reuse : local;
  g.direct = direct;
  std::vector<std::vector<char>> in(k, std::vector<char>(count * es + 1)), out(k);
  for (uint32_t m = 0; m < k; ++m)
    for (uint64_t i = 0; i < count; ++i)
      store(t, in[m].data() + i * es, value(op, m, i, is_signed(t)));
  for (uint32_t m = 0; m < k; ++m) out[m].assign(count * es + 1, static_cast<char>(0x5a));
  if (in_place) {
    g.run(in, in, count, t, op);
  } else {
    g.run(in, out, count, t, op);
  }
  const std::vector<char> want = reference(t, op, k, count);
  for (uint32_t m = 0; m < k; ++m) {
    const std::vector<char>& got = in_place ? in[m] : out[m];
    const std::string what = "k=" + std::to_string(k) + " blocks=" + std::to_string(blocks) +
                             " chunk=" + std::to_string(chunk) + " " + name(t) + " " + name(op) +
                             " count=" + std::to_string(count) + (in_place ? " in place" : "") +
                             " direct " + std::to_string(direct) + " member " + std::to_string(m);
    INFO(what);
    CHECK(std::memcmp(got.data(), want.data(), want.size()) == 0);
    CHECK(got[count * es] == (in_place ? 0 : 0x5a));  // nothing written past the end
    CHECK(g.status[m] == 0);
  }
}

// reduce_scatter_block: member m's input is k blocks of `count`; it gets block m of the
// reduction. allgather: member m's input is one block; everyone gets the k blocks in
// member order. In place as MPI has it: the input in the output buffer (allgather: at
// the member's block), reduce_scatter_block writing only the first block.
void check_blocks(Mode mode, uint32_t k, uint32_t blocks, uint64_t chunk, DType t, ROp op,
                  uint64_t count, bool in_place, Group* reuse = nullptr, uint32_t direct = 0) {
  const uint32_t es = dtype_size(t);
  Group local(k, blocks, chunk, es);
  Group& g = reuse ? *reuse : local;
  g.direct = direct;
  const bool rsb = mode == Mode::reduce_scatter_block;
  const uint64_t in_elems = rsb ? k * count : count, out_elems = rsb ? count : k * count;
  std::vector<std::vector<char>> in(k), out(k);
  for (uint32_t m = 0; m < k; ++m) {
    out[m].assign((in_place && rsb ? in_elems : out_elems) * es + 1, static_cast<char>(0x5a));
    std::vector<char> v(in_elems * es);
    for (uint64_t i = 0; i < in_elems; ++i) store(t, v.data() + i * es, value(op, m, i, is_signed(t)));
    if (in_place) {
      std::memcpy(out[m].data() + (rsb ? 0 : m * count * es), v.data(), v.size());
      in[m] = out[m];  // the kernel reads `in` as recv itself: same buffer below
    } else {
      in[m] = v;
    }
  }
  if (in_place) g.run(out, out, count, t, op, -1, mode, rsb ? 0 : count * es);
  else g.run(in, out, count, t, op, -1, mode);
  const std::vector<char> red = rsb ? reference(t, op, k, k * count) : std::vector<char>();
  for (uint32_t m = 0; m < k; ++m) {
    std::vector<char> want;
    if (rsb) {
      want.assign(red.begin() + static_cast<long>(m * count * es), red.begin() + static_cast<long>((m + 1) * count * es));
    } else {
      for (uint32_t q = 0; q < k; ++q)
        for (uint64_t i = 0; i < count; ++i) {
          char buf[8];
          store(t, buf, value(op, q, i, is_signed(t)));
          want.insert(want.end(), buf, buf + es);
        }
    }
    const std::string what = std::string(rsb ? "reduce_scatter_block" : "allgather") + " k=" +
                             std::to_string(k) + " blocks=" + std::to_string(blocks) + " chunk=" +
                             std::to_string(chunk) + " " + name(t) + " " + name(op) + " count=" +
                             std::to_string(count) + (in_place ? " in place" : "") + " member " +
                             std::to_string(m);
    INFO(what);
    CHECK(std::memcmp(out[m].data(), want.data(), want.size()) == 0);
    if (in_place && rsb)  // the rest of the buffer (the input's other blocks) untouched
      CHECK(std::memcmp(out[m].data() + count * es, in[m].data() + count * es, (k - 1) * count * es) == 0);
    CHECK(out[m].back() == static_cast<char>(0x5a));
    CHECK(g.status[m] == 0);
  }
}

}  // namespace

TEST_CASE("nvgroup kernel: 16-bit float conversions round to nearest even") {
  CHECK(half_to_float(float_to_half(1.0f)) == 1.0f);
  CHECK(half_to_float(float_to_half(-2.5f)) == -2.5f);
  CHECK(float_to_half(65504.0f) == 0x7bff);
  CHECK(float_to_half(65520.0f) == 0x7c00);                // rounds up to inf
  CHECK(float_to_half(1.0f + 1.0f / 2048) == 0x3c00);     // tie to even: down
  CHECK(float_to_half(1.0f + 3.0f / 2048) == 0x3c02);     // tie to even: up
  CHECK(half_to_float(0x0001) == std::ldexp(1.0f, -24));  // smallest subnormal
  CHECK(float_to_half(std::ldexp(1.0f, -24)) == 0x0001);
  CHECK(std::isnan(half_to_float(float_to_half(std::nanf("")))));
  CHECK(bf16_to_float(float_to_bf16(3.0f)) == 3.0f);
  CHECK(float_to_bf16(1.0f + 1.0f / 256) == 0x3f80);  // tie to even: down
  CHECK(float_to_bf16(1.0f + 3.0f / 256) == 0x3f82);  // tie to even: up
}

TEST_CASE("nvgroup kernel: every type and op, exact, over 1..4 members") {
  const DType types[] = {DType::i8, DType::u8,   DType::i32, DType::u32, DType::i64,
                         DType::u64, DType::f16, DType::bf16, DType::f32, DType::f64};
  const ROp ops[] = {ROp::sum, ROp::prod, ROp::min, ROp::max};
  for (uint32_t k : {1u, 2u, 3u, 4u})
    for (DType t : types)
      for (ROp op : ops)
        for (uint64_t count : {0ull, 1ull, 7ull, 1001ull})
          check_case(k, 3, 64, t, op, count, (count + k) % 2 == 0);
}

TEST_CASE("nvgroup kernel: rounds, grids, in place, 8 members, 1 Mi elements") {
  check_case(8, 5, 100, DType::f32, ROp::sum, 12345, false);
  check_case(8, 1, 16, DType::i32, ROp::max, 999, true);
  check_case(3, 16, 1 << 16, DType::f64, ROp::sum, 1 << 20, false);
  check_case(4, 32, 1 << 18, DType::i64, ROp::min, 1 << 20, true);
  // Calls continue the group's round numbers: many calls on one group.
  Group g(3, 4, 50, 4);
  for (int i = 0; i < 20; ++i) check_case(3, 4, 50, DType::i32, ROp::sum, 7 + 31 * i, i % 2, &g);
}

TEST_CASE("nvgroup kernel: a member whose host gives up does not hang the others") {
  for (int gives_up : {0, 2}) {
    Group g(3, 4, 32, 4);
    std::vector<std::vector<char>> in(3, std::vector<char>(400 * 4)), out = in;
    g.run(in, out, 400, DType::i32, ROp::sum, gives_up);  // returns: nobody waits forever
    for (int m = 0; m < 3; ++m)
      if (m != gives_up) CHECK(g.status[m] == 1);  // and the others know the call failed
    // The next call on the same group works again, on every member.
    for (auto& s : g.status) s = 0;
    check_case(3, 4, 32, DType::i32, ROp::sum, 333, false, &g);
  }
}

TEST_CASE("nvgroup kernel: reduce_scatter_block and allgather, every type, in place and not") {
  const DType types[] = {DType::i8, DType::u8,   DType::i32, DType::u32, DType::i64,
                         DType::u64, DType::f16, DType::bf16, DType::f32, DType::f64};
  for (uint32_t k : {1u, 2u, 3u, 4u})
    for (DType t : types)
      for (uint64_t count : {0ull, 1ull, 7ull, 301ull}) {
        for (ROp op : {ROp::sum, ROp::prod, ROp::min, ROp::max})
          check_blocks(Mode::reduce_scatter_block, k, 3, 64, t, op, count, (count + k) % 2 == 0);
        check_blocks(Mode::allgather, k, 3, 64, t, ROp::sum, count, (count + k) % 2 == 1);
      }
  // Many rounds, wide grids, 8 members, and calls in turn on one group.
  check_blocks(Mode::reduce_scatter_block, 8, 5, 40, DType::f32, ROp::sum, 1001, false);
  check_blocks(Mode::allgather, 8, 7, 40, DType::i64, ROp::sum, 999, true);
  Group g(3, 4, 60, 4);
  for (int i = 0; i < 12; ++i) {
    check_blocks(Mode::reduce_scatter_block, 3, 4, 60, DType::i32, ROp::sum, 5 + 17 * i, i % 2, &g);
    check_blocks(Mode::allgather, 3, 4, 60, DType::i32, ROp::sum, 9 + 13 * i, i % 3 == 0, &g);
    check_case(3, 4, 60, DType::i32, ROp::max, 11 + 29 * i, i % 2, &g);
  }
}

TEST_CASE("nvgroup kernel: registered inputs read in place, mixed with copied ones") {
  const DType types[] = {DType::i8, DType::u64, DType::f16, DType::bf16, DType::f32, DType::f64};
  for (uint32_t k : {1u, 2u, 3u, 4u})
    for (DType t : types)
      for (ROp op : {ROp::sum, ROp::prod, ROp::min, ROp::max})
        for (uint32_t direct : {0xffu, 0x1u, 0x6u})
          for (uint64_t count : {1ull, 7ull, 1001ull}) {
            check_case(k, 3, 64, t, op, count, (count + direct) % 2 == 0, nullptr, direct);
            // reduce_scatter_block, not in place (its output would be another
            // member's input block): the host registers only then.
            check_blocks(Mode::reduce_scatter_block, k, 3, 64, t, op, count, false, nullptr, direct);
          }
  // Allgather copies whatever the word says.
  check_blocks(Mode::allgather, 3, 4, 64, DType::i32, ROp::sum, 777, false, nullptr, 0x7u);
  // Calls in turn on one group, members registering or not from call to call.
  Group g(4, 4, 50, 8);
  for (int i = 0; i < 16; ++i) {
    check_case(4, 4, 50, DType::f64, ROp::sum, 13 + 37 * i, i % 2, &g, static_cast<uint32_t>(i) & 0xfu);
    check_blocks(Mode::reduce_scatter_block, 4, 4, 50, DType::i64, ROp::max, 9 + 11 * i, false, &g,
                 static_cast<uint32_t>(i * 5) & 0xfu);
  }
  check_case(8, 5, 100, DType::f32, ROp::sum, 12345, true, nullptr, 0xa5u);
}

TEST_CASE("nvgroup kernel: a registered input a member has not mapped fails the call, no hang") {
  Group g(3, 4, 32, 4);
  g.direct = 0x2u;
  g.unmapped = 0x2u;  // member 1 says "read me in place", nobody has its mapping
  std::vector<std::vector<char>> in(3, std::vector<char>(400 * 4)), out = in;
  g.run(in, out, 400, DType::i32, ROp::sum);
  for (int m = 0; m < 3; ++m) CHECK(g.status[m] == 1);  // every member reports the failure
  for (auto& s : g.status) s = 0;
  g.unmapped = 0;
  check_case(3, 4, 32, DType::i32, ROp::sum, 333, false, &g, 0x3u);  // then fine again
  // A member whose host gives up while the others read in place.
  g.direct = 0x5u;
  g.run(in, out, 400, DType::i32, ROp::sum, 1);
  CHECK(g.status[0] == 1);
  CHECK(g.status[2] == 1);
  for (auto& s : g.status) s = 0;
  check_case(3, 4, 32, DType::i32, ROp::min, 100, true, &g, 0x7u);
}
