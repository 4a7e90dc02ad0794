// Pure call logic: which buffers count, sizes, invalid-argument screening, eligibility.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/coll_args.hpp"
#include "core/datatypes.hpp"
#include "core/eligibility.hpp"

using namespace streamcoll;

namespace {
CollArgs reduction(Coll c, const void* s, void* r, int n) {
  CollArgs a;
  a.coll = c;
  a.sendbuf = s;
  a.recvbuf = r;
  a.count = n;
  a.datatype = MPI_INT;
  a.op = MPI_SUM;
  a.comm = MPI_COMM_WORLD;
  return a;
}
int sig(const CollArgs& a, int rank, int size, BufferUse* out, int ts = 4) {
  return significant_buffers(a, rank, size, ts, ts, out);
}
}  // namespace

TEST_CASE("significant buffers: in place, roots, empty buffers") {
  int s[4] = {}, r[4] = {};
  BufferUse b[2];
  CollArgs a = reduction(Coll::allreduce, s, r, 4);
  REQUIRE(sig(a, 0, 2, b) == 2);
  CHECK(b[0].ptr == s);
  CHECK(b[0].bytes == 16);
  CHECK(b[1].ptr == r);

  a.sendbuf = MPI_IN_PLACE;
  REQUIRE(sig(a, 0, 2, b) == 1);
  CHECK(b[0].ptr == r);

  a.count = 0;
  CHECK(sig(a, 0, 2, b) == 0);

  // Reduce: the receive buffer matters only at the root; MPI_IN_PLACE only at the root.
  CollArgs red = reduction(Coll::reduce, s, nullptr, 4);
  red.root = 1;
  REQUIRE(sig(red, 0, 2, b) == 1);
  CHECK(b[0].ptr == s);
  red.recvbuf = r;
  REQUIRE(sig(red, 1, 2, b) == 2);
  red.sendbuf = MPI_IN_PLACE;
  REQUIRE(sig(red, 1, 2, b) == 1);
  CHECK(b[0].ptr == r);

  // Bcast: one buffer, on every rank.
  CollArgs bc = reduction(Coll::bcast, nullptr, r, 3);
  REQUIRE(sig(bc, 0, 4, b) == 1);
  CHECK(b[0].bytes == 12);

  // Allgatherv where this rank contributes nothing: only the receive buffer counts.
  int counts[3] = {2, 0, 5}, displs[3] = {0, 2, 2};
  CollArgs ag;
  ag.coll = Coll::allgatherv;
  ag.sendbuf = nullptr;
  ag.sendcount = 0;
  ag.recvbuf = r;
  ag.recvcounts = counts;
  ag.displs = displs;
  REQUIRE(significant_buffers(ag, 1, 3, 8, 8, b) == 1);
  CHECK(b[0].ptr == r);
  CHECK(b[0].bytes == 56);

  // Reduce-scatter: the receive block of this rank; in place, the whole buffer.
  CollArgs rs = reduction(Coll::reduce_scatter, s, r, 0);
  rs.recvcounts = counts;
  REQUIRE(sig(rs, 2, 3, b) == 2);
  CHECK(b[0].bytes == 28);
  CHECK(b[1].bytes == 20);
  REQUIRE(sig(rs, 1, 3, b) == 1);  // rank 1 receives nothing
  CHECK(b[0].ptr == s);
  rs.sendbuf = MPI_IN_PLACE;
  REQUIRE(sig(rs, 1, 3, b) == 1);
  CHECK(b[0].bytes == 28);

  CollArgs rsb = reduction(Coll::reduce_scatter_block, s, r, 2);
  REQUIRE(sig(rsb, 0, 4, b) == 2);
  CHECK(b[0].bytes == 32);
  CHECK(b[1].bytes == 8);

  CollArgs bar;
  bar.coll = Coll::barrier;
  CHECK(sig(bar, 0, 4, b) == 0);
}

TEST_CASE("call bytes follow the nccl-tests convention") {
  int counts[3] = {1, 2, 3};
  CollArgs a = reduction(Coll::allreduce, nullptr, nullptr, 10);
  CHECK(call_bytes(a, 4, 8, 8) == 80);
  a.coll = Coll::reduce_scatter_block;
  CHECK(call_bytes(a, 4, 8, 8) == 320);
  a.coll = Coll::reduce_scatter;
  a.recvcounts = counts;
  CHECK(call_bytes(a, 3, 8, 8) == 48);
  CollArgs g;
  g.coll = Coll::allgather;
  g.sendcount = g.recvcount = 5;
  CHECK(call_bytes(g, 4, 2, 2) == 40);
  g.coll = Coll::alltoall;
  CHECK(call_bytes(g, 4, 2, 2) == 40);
  g.coll = Coll::allgatherv;
  g.recvcounts = counts;
  CHECK(call_bytes(g, 3, 2, 4) == 24);
  g.coll = Coll::barrier;
  CHECK(call_bytes(g, 3, 2, 4) == 0);
}

TEST_CASE("obviously invalid arguments go to the real MPI") {
  int s[2] = {}, r[2] = {};
  CollArgs a = reduction(Coll::allreduce, s, r, 2);
  CHECK_FALSE(obviously_invalid(a));
  a.count = -1;
  CHECK(obviously_invalid(a));
  a = reduction(Coll::allreduce, s, r, 2);
  a.comm = MPI_COMM_NULL;
  CHECK(obviously_invalid(a));
  a = reduction(Coll::allreduce, s, r, 2);
  a.datatype = MPI_DATATYPE_NULL;
  CHECK(obviously_invalid(a));
  a = reduction(Coll::allreduce, s, r, 2);
  a.op = MPI_OP_NULL;
  CHECK(obviously_invalid(a));
  a = reduction(Coll::allreduce, s, r, 2);
  a.nonblocking = true;  // without a request
  CHECK(obviously_invalid(a));
  // A null buffer with nothing in it is fine.
  a = reduction(Coll::allreduce, nullptr, nullptr, 0);
  CHECK_FALSE(obviously_invalid(a));
  // Non-root reduce may pass a null receive buffer.
  a = reduction(Coll::reduce, s, nullptr, 2);
  a.root = 1;
  CHECK_FALSE(obviously_invalid(a));

  CollArgs g;
  g.coll = Coll::allgather;
  g.comm = MPI_COMM_WORLD;
  g.sendbuf = s;
  g.sendcount = 1;
  g.sendtype = MPI_INT;
  g.recvbuf = r;
  g.recvcount = 1;
  g.recvtype = MPI_INT;
  CHECK_FALSE(obviously_invalid(g));
  g.recvcount = -3;
  CHECK(obviously_invalid(g));
  g.recvcount = 1;
  g.sendtype = MPI_DATATYPE_NULL;
  CHECK(obviously_invalid(g));
  g.sendbuf = MPI_IN_PLACE;  // sendtype is ignored in place
  CHECK_FALSE(obviously_invalid(g));
  g.sendcount = -1;  // and so is sendcount (MPI: both are ignored with MPI_IN_PLACE)
  CHECK_FALSE(obviously_invalid(g));
  g.sendbuf = s;
  CHECK(obviously_invalid(g));
  g.sendcount = 1;
  g.sendtype = MPI_INT;

  CollArgs v;
  v.coll = Coll::allgatherv;
  v.comm = MPI_COMM_WORLD;
  v.sendtype = v.recvtype = MPI_INT;
  CHECK(obviously_invalid(v));  // no counts array
}

TEST_CASE("null data buffers") {
  int s[4] = {}, r[4] = {};
  CollArgs a = reduction(Coll::allreduce, s, nullptr, 2);
  CHECK(has_null_pointer(a));
  CHECK(null_data_buffer(a, 0, 2, 4, 4));
  a = reduction(Coll::allreduce, nullptr, r, 2);
  CHECK(null_data_buffer(a, 0, 2, 4, 4));
  a = reduction(Coll::allreduce, nullptr, nullptr, 0);  // no data: fine
  CHECK(has_null_pointer(a));
  CHECK_FALSE(null_data_buffer(a, 0, 2, 4, 4));
  a = reduction(Coll::allreduce, MPI_IN_PLACE, r, 2);
  CHECK_FALSE(has_null_pointer(a));
  // Reduce: a null receive buffer is fine except at the root.
  a = reduction(Coll::reduce, s, nullptr, 2);
  a.root = 1;
  CHECK_FALSE(null_data_buffer(a, 0, 2, 4, 4));
  CHECK(null_data_buffer(a, 1, 2, 4, 4));
  CollArgs bc = reduction(Coll::bcast, nullptr, r, 3);
  CHECK_FALSE(has_null_pointer(bc));  // bcast has no send buffer
  bc.recvbuf = nullptr;
  CHECK(null_data_buffer(bc, 0, 2, 4, 4));
  // Allgatherv: a rank that sends nothing may pass a null send buffer.
  int counts[2] = {0, 3}, displs[2] = {0, 0};
  CollArgs ag;
  ag.coll = Coll::allgatherv;
  ag.recvbuf = r;
  ag.recvcounts = counts;
  ag.displs = displs;
  CHECK_FALSE(null_data_buffer(ag, 0, 2, 4, 4));
  ag.sendcount = 1;
  CHECK(null_data_buffer(ag, 0, 2, 4, 4));
  CollArgs bar;
  bar.coll = Coll::barrier;
  CHECK_FALSE(has_null_pointer(bar));
}

TEST_CASE("MPI's op/type table (MPI-4.0 6.9.2)") {
  using C = TypeClass;
  CHECK(op_defined_for(OpKind::sum, C::c_integer));
  CHECK(op_defined_for(OpKind::sum, C::complex));
  CHECK_FALSE(op_defined_for(OpKind::max, C::complex));
  CHECK(op_defined_for(OpKind::band, C::byte));
  CHECK_FALSE(op_defined_for(OpKind::sum, C::byte));
  CHECK(op_defined_for(OpKind::lxor, C::logical));
  CHECK_FALSE(op_defined_for(OpKind::land, C::floating));
  CHECK_FALSE(op_defined_for(OpKind::band, C::floating));
  CHECK(op_defined_for(OpKind::bor, C::multi_language));
  CHECK_FALSE(op_defined_for(OpKind::land, C::multi_language));
  CHECK(op_defined_for(OpKind::maxloc, C::pair));
  CHECK_FALSE(op_defined_for(OpKind::sum, C::pair));
  CHECK_FALSE(op_defined_for(OpKind::maxloc, C::floating));
  for (int op = 0; op < kNumOps; ++op) CHECK_FALSE(op_defined_for(static_cast<OpKind>(op), C::character));
}

TEST_CASE("the datatype table holds this MPI's predefined types with their sizes") {
  const TypeInfo* i = find_type(MPI_INT);
  REQUIRE(i);
  CHECK(i->size == static_cast<int>(sizeof(int)));
  CHECK(i->cls == TypeClass::c_integer);
  CHECK(find_type(MPI_DOUBLE)->size == 8);
  CHECK(find_type(MPI_DOUBLE)->cls == TypeClass::floating);
  CHECK(find_type(MPI_UINT8_T)->size == 1);
  CHECK(find_type(MPI_C_DOUBLE_COMPLEX)->size == 16);
  CHECK(find_type(MPI_C_DOUBLE_COMPLEX)->cls == TypeClass::complex);
  CHECK(find_type(MPI_2INT)->cls == TypeClass::pair);
  CHECK(find_type(MPI_BYTE)->cls == TypeClass::byte);
  CHECK(find_type(MPI_DATATYPE_NULL) == nullptr);
  MPI_Datatype vec;
  PMPI_Type_vector(2, 1, 2, MPI_INT, &vec);
  PMPI_Type_commit(&vec);
  CHECK(find_type(vec) == nullptr);
  PMPI_Type_free(&vec);
  for (const TypeInfo& t : all_types()) {
    int size = 0;
    PMPI_Type_size(t.type, &size);
    CHECK(t.size == size);
  }
  CHECK(find_op(MPI_SUM)->kind == OpKind::sum);
  CHECK(find_op(MPI_MINLOC)->kind == OpKind::minloc);
  CHECK(find_op(MPI_REPLACE) == nullptr);
  CHECK(find_op(MPI_OP_NULL) == nullptr);
  MPI_Op user;
  PMPI_Op_create([](void*, void*, int*, MPI_Datatype*) {}, 1, &user);
  CHECK(find_op(user) == nullptr);
  PMPI_Op_free(&user);
}

TEST_CASE("eligibility") {
  const TypeInfo* i32 = find_type(MPI_INT);
  const TypeInfo* f64 = find_type(MPI_DOUBLE);
  const TypeInfo* pair = find_type(MPI_DOUBLE_INT);
  const TypeInfo* cplx = find_type(MPI_C_FLOAT_COMPLEX);
  CallFacts f;
  f.coll = Coll::allreduce;
  f.bytes = 64;
  f.send_type = f.recv_type = f64;
  f.op = find_op(MPI_SUM);
  f.mem = MemKind::device;
  CHECK(eligibility(f) == Verdict::eligible);

  CallFacts g = f;
  g.invalid_args = true;
  CHECK(eligibility(g) == Verdict::invalid_args);
  g = f;
  g.inter = true;
  CHECK(eligibility(g) == Verdict::inter_comm);
  g = f;
  g.bytes = 0;
  CHECK(eligibility(g) == Verdict::empty);
  g = f;
  g.send_type = g.recv_type = nullptr;
  CHECK(eligibility(g) == Verdict::derived_type);
  g = f;
  g.send_type = g.recv_type = pair;
  g.op = find_op(MPI_MAXLOC);
  CHECK(eligibility(g) == Verdict::derived_type);
  g = f;
  g.op = nullptr;
  CHECK(eligibility(g) == Verdict::user_op);
  g = f;
  g.send_type = g.recv_type = cplx;
  g.op = find_op(MPI_MAX);
  CHECK(eligibility(g) == Verdict::op_not_defined);
  g = f;
  g.mem = MemKind::mixed;
  CHECK(eligibility(g) == Verdict::mixed_memory);

  // Gather-like calls take no op; their types must agree.
  CallFacts a = f;
  a.coll = Coll::allgather;
  a.op = nullptr;
  CHECK(eligibility(a) == Verdict::eligible);
  a.recv_type = i32;
  CHECK(eligibility(a) == Verdict::type_mismatch);
  a.recv_type = f64;
  a.counts_match = false;
  CHECK(eligibility(a) == Verdict::type_mismatch);

  CallFacts b;
  b.coll = Coll::barrier;
  CHECK(eligibility(b) == Verdict::eligible);
  for (Verdict v : {Verdict::eligible, Verdict::user_op, Verdict::mixed_memory})
    CHECK(std::string(describe(v)).size() > 3);
}

TEST_CASE("reduce_local: every integer type reduces MIN, MAX and SUM right at its extremes") {
  // Two values per type: the top bit set (+5), and 7. Expected results from the bits, as
  // the type's size and signedness say (two's complement), not from the MPI.
  int checked = 0;
  for (const TypeInfo& t : all_types()) {
    const Numeric n = numeric(t);
    if ((n != Numeric::signed_int && n != Numeric::unsigned_int) || t.size > 8) continue;
    CAPTURE(t.name);
    const MPI_Datatype r = reduction_type(t.type);
    int size = 0;
    PMPI_Type_size(r, &size);
    CHECK(size == t.size);
    const int bits = 8 * t.size;
    const uint64_t mask = bits == 64 ? ~0ull : (1ull << bits) - 1;
    const uint64_t big = (1ull << (bits - 1)) | 5, small = 7;
    auto as_signed = [&](uint64_t v) {
      return bits == 64 ? static_cast<int64_t>(v) : static_cast<int64_t>(v << (64 - bits)) >> (64 - bits);
    };
    const bool u = n == Numeric::unsigned_int;
    const bool big_wins = u ? big > small : as_signed(big) > as_signed(small);
    struct Case {
      MPI_Op op;
      uint64_t want;
    } cases[] = {{MPI_MAX, big_wins ? big : small},
                 {MPI_MIN, big_wins ? small : big},
                 {MPI_SUM, (big + small) & mask}};
    for (const Case& c : cases) {
      unsigned char a[8] = {0}, b[8] = {0}, w[8] = {0};
      std::memcpy(a, &big, static_cast<size_t>(t.size));  // little-endian: the low bytes
      std::memcpy(b, &small, static_cast<size_t>(t.size));
      std::memcpy(w, &c.want, static_cast<size_t>(t.size));
      REQUIRE(reduce_local(a, b, 1, t.type, c.op) == MPI_SUCCESS);
      CHECK(std::memcmp(b, w, static_cast<size_t>(t.size)) == 0);
    }
    ++checked;
  }
  CHECK(checked >= 10);
  CHECK(reduction_type(MPI_UNSIGNED_LONG) == (sizeof(long) == 8 ? MPI_UINT64_T : MPI_UINT32_T));
  CHECK(reduction_type(MPI_DOUBLE) == MPI_DOUBLE);
  CHECK(reduction_type(MPI_2INT) == MPI_2INT);
}

TEST_CASE("the collectives' rows say what MPI says of each") {
  // Written out here from the MPI standard's signatures, apart from base/colls.def.
  for (int i = 0; i < kNumColls; ++i) {
    const Coll c = static_cast<Coll>(i);
    CAPTURE(name(c));
    const bool op = c == Coll::allreduce || c == Coll::reduce || c == Coll::reduce_scatter ||
                    c == Coll::reduce_scatter_block;
    CHECK(takes_op(c) == op);
    CHECK(rooted(c) == (c == Coll::reduce || c == Coll::bcast));
    CHECK(one_type(c) == (op || c == Coll::bcast));
    CHECK(parse_coll(name(c)) == c);
  }
  CHECK(kNumColls == 9);
  CHECK(name(Coll::reduce_scatter_block) == "reduce_scatter_block");
}
