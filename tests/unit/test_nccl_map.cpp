// The pure part of the NCCL route (algorithms/nccl_map): datatype and op maps, which
// calls it takes, the shared-GPU rule. Runs in CI without a GPU or NCCL library.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "algorithms/nccl_map.hpp"

using namespace streamcoll;
namespace nc = streamcoll::nccl;

namespace {
const TypeInfo& type(MPI_Datatype t) {
  const TypeInfo* info = find_type(t);
  REQUIRE(info);
  return *info;
}
std::optional<ncclDataType_t> rtype(MPI_Datatype t) { return nc::reduction_type(type(t)); }
}  // namespace

TEST_CASE("reduction types: NCCL's type of the same representation, or none") {
  // Fixed-width types: the size is part of the name.
  CHECK(rtype(MPI_INT8_T) == ncclInt8);
  CHECK(rtype(MPI_UINT8_T) == ncclUint8);
  CHECK(rtype(MPI_INT32_T) == ncclInt32);
  CHECK(rtype(MPI_UINT32_T) == ncclUint32);
  CHECK(rtype(MPI_INT64_T) == ncclInt64);
  CHECK(rtype(MPI_UINT64_T) == ncclUint64);
  CHECK(rtype(MPI_SIGNED_CHAR) == ncclInt8);
  CHECK(rtype(MPI_UNSIGNED_CHAR) == ncclUint8);
  CHECK(rtype(MPI_FLOAT) == ncclFloat32);
  CHECK(rtype(MPI_DOUBLE) == ncclFloat64);
  // C types: by their size on this platform and their signedness.
  auto by_size = [](size_t size, bool is_signed) -> std::optional<ncclDataType_t> {
    if (size == 4) return is_signed ? ncclInt32 : ncclUint32;
    if (size == 8) return is_signed ? ncclInt64 : ncclUint64;
    return std::nullopt;
  };
  CHECK(rtype(MPI_INT) == by_size(sizeof(int), true));
  CHECK(rtype(MPI_UNSIGNED) == by_size(sizeof(unsigned), false));
  CHECK(rtype(MPI_LONG) == by_size(sizeof(long), true));
  CHECK(rtype(MPI_UNSIGNED_LONG) == by_size(sizeof(unsigned long), false));
  CHECK(rtype(MPI_LONG_LONG) == by_size(sizeof(long long), true));
  CHECK(rtype(MPI_UNSIGNED_LONG_LONG) == by_size(sizeof(unsigned long long), false));
  CHECK(rtype(MPI_AINT) == by_size(sizeof(MPI_Aint), true));
  CHECK(rtype(MPI_OFFSET) == by_size(sizeof(MPI_Offset), true));
  // NCCL has no 16-bit integers, no long double, complex, logical or byte reductions.
  for (MPI_Datatype t : {MPI_SHORT, MPI_UNSIGNED_SHORT, MPI_INT16_T, MPI_UINT16_T,
                         MPI_LONG_DOUBLE, MPI_C_FLOAT_COMPLEX, MPI_C_DOUBLE_COMPLEX, MPI_C_BOOL,
                         MPI_CXX_BOOL, MPI_BYTE, MPI_CHAR, MPI_WCHAR}) {
    CAPTURE(std::string(type(t).name));
    CHECK_FALSE(rtype(t));
  }
}

TEST_CASE("16-bit floating point by name, where an MPI has the types") {
  TypeInfo half{MPI_DATATYPE_NULL, "MPIX_C_FLOAT16", 2, TypeClass::floating};
  TypeInfo bf16{MPI_DATATYPE_NULL, "MPIX_BFLOAT16", 2, TypeClass::floating};
  CHECK(nc::reduction_type(half) == ncclFloat16);
  CHECK(nc::reduction_type(bf16) == ncclBfloat16);
  TypeInfo odd{MPI_DATATYPE_NULL, "MPI_REAL16", 16, TypeClass::floating};
  CHECK_FALSE(nc::reduction_type(odd));
}

TEST_CASE("every predefined type: a mapped type has the MPI type's size") {
  auto nccl_size = [](ncclDataType_t t) {
    switch (t) {
      case ncclInt8: case ncclUint8: return 1;
      case ncclFloat16: case ncclBfloat16: return 2;
      case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
      case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
      default: return 0;
    }
  };
  int mapped = 0;
  for (const TypeInfo& t : all_types()) {
    CAPTURE(std::string(t.name));
    if (auto n = nc::reduction_type(t)) {
      CHECK(nccl_size(*n) == t.size);
      ++mapped;
    }
  }
  CHECK(mapped >= 10);
}

TEST_CASE("ops: SUM, PROD, MIN, MAX only") {
  CHECK(nc::reduction_op(OpKind::sum) == ncclSum);
  CHECK(nc::reduction_op(OpKind::prod) == ncclProd);
  CHECK(nc::reduction_op(OpKind::min) == ncclMin);
  CHECK(nc::reduction_op(OpKind::max) == ncclMax);
  for (OpKind k : {OpKind::land, OpKind::band, OpKind::lor, OpKind::bor, OpKind::lxor,
                   OpKind::bxor, OpKind::maxloc, OpKind::minloc})
    CHECK_FALSE(nc::reduction_op(k));
}

TEST_CASE("which calls the route takes") {
  const TypeInfo* f = find_type(MPI_FLOAT);
  const TypeInfo* sh = find_type(MPI_SHORT);
  const TypeInfo* cplx = find_type(MPI_C_DOUBLE_COMPLEX);
  const OpInfo* sum = find_op(MPI_SUM);
  const OpInfo* band = find_op(MPI_BAND);
  using S = nc::Support;
  for (Coll c : {Coll::allreduce, Coll::reduce, Coll::reduce_scatter_block}) {
    CAPTURE(name(c));
    CHECK(nc::supports(c, MemKind::device, f, sum) == S::ok);
    CHECK(nc::supports(c, MemKind::managed, f, sum) == S::ok);
    CHECK(nc::supports(c, MemKind::host, f, sum) == S::memory);
    CHECK(nc::supports(c, MemKind::pinned, f, sum) == S::memory);
    CHECK(nc::supports(c, MemKind::mixed, f, sum) == S::memory);
    CHECK(nc::supports(c, MemKind::device, sh, sum) == S::datatype);
    CHECK(nc::supports(c, MemKind::device, find_type(MPI_INT), band) == S::op);
    CHECK(nc::supports(c, MemKind::device, f, nullptr) == S::op);  // user op
  }
  // Data movement takes any predefined contiguous type, 16-bit and complex included.
  for (Coll c : {Coll::bcast, Coll::allgather, Coll::alltoall}) {
    CAPTURE(name(c));
    CHECK(nc::supports(c, MemKind::device, sh, nullptr) == S::ok);
    CHECK(nc::supports(c, MemKind::device, cplx, nullptr) == S::ok);
    CHECK(nc::supports(c, MemKind::device, find_type(MPI_CHAR), nullptr) == S::ok);
    CHECK(nc::supports(c, MemKind::device, find_type(MPI_2INT), nullptr) == S::datatype);
    CHECK(nc::supports(c, MemKind::device, nullptr, nullptr) == S::datatype);
    CHECK(nc::supports(c, MemKind::host, sh, nullptr) == S::memory);
  }
  for (Coll c : {Coll::allgatherv, Coll::reduce_scatter, Coll::barrier}) {
    CAPTURE(name(c));
    CHECK(nc::supports(c, MemKind::device, f, sum) == S::collective);
  }
}

TEST_CASE("ranks sharing a GPU: the first pair by rank, across hosts") {
  using G = nc::GpuId;
  CHECK_FALSE(nc::shared_gpu({}));
  CHECK_FALSE(nc::shared_gpu({G{1, 10}}));
  // Same bus id on two hosts is two GPUs.
  CHECK_FALSE(nc::shared_gpu({G{1, 10}, G{2, 10}, G{1, 11}, G{2, 11}}));
  auto p = nc::shared_gpu({G{1, 10}, G{1, 11}, G{2, 10}, G{1, 10}});
  REQUIRE(p);
  CHECK(*p == std::make_pair(0, 3));
  p = nc::shared_gpu({G{5, 1}, G{3, 7}, G{3, 7}, G{5, 1}});
  REQUIRE(p);
  CHECK(*p == std::make_pair(0, 3));  // (0,3) before (1,2)
  // Large communicators: 4096 ranks, 4 GPUs per host, then one duplicate at the end.
  std::vector<G> many;
  for (int r = 0; r < 4096; ++r) many.push_back(G{uint64_t(r / 4), uint64_t(r % 4)});
  CHECK_FALSE(nc::shared_gpu(many));
  many.push_back(G{1000, 2});
  p = nc::shared_gpu(many);
  REQUIRE(p);
  CHECK(*p == std::make_pair(4002, 4096));
}

TEST_CASE("host and bus hashes distinguish names") {
  CHECK(nc::hash("0000:19:00.0") != nc::hash("0000:1A:00.0"));
  CHECK(nc::hash("node1") != nc::hash("node2"));
  CHECK(nc::hash("ab", nc::hash("c")) != nc::hash("a", nc::hash("bc")));
  CHECK(nc::hash("") == 1469598103934665603ull);
}

TEST_CASE("Fortran datatypes: NCCL's type of the same size and kind, or none") {
  // Debian's Open MPI and MPICH are built with gfortran: every type below is there.
  CHECK(rtype(MPI_INTEGER) == ncclInt32);
  CHECK(rtype(MPI_REAL) == ncclFloat32);
  CHECK(rtype(MPI_DOUBLE_PRECISION) == ncclFloat64);
  CHECK(rtype(MPI_INTEGER1) == ncclInt8);
  CHECK_FALSE(rtype(MPI_INTEGER2));  // NCCL has no 16-bit integer
  CHECK(rtype(MPI_INTEGER4) == ncclInt32);
  CHECK(rtype(MPI_INTEGER8) == ncclInt64);
  CHECK(rtype(MPI_REAL4) == ncclFloat32);
  CHECK(rtype(MPI_REAL8) == ncclFloat64);
  // Complex and LOGICAL have no NCCL reduction type: reductions go to the next rule
  // (whose host algorithms reduce with the MPI's own MPI_Reduce_local); moving them is
  // bytes, which NCCL carries.
  for (MPI_Datatype t : {MPI_COMPLEX, MPI_DOUBLE_COMPLEX, MPI_COMPLEX8, MPI_COMPLEX16, MPI_LOGICAL}) {
    CHECK_FALSE(rtype(t));
    CHECK(nc::supports(Coll::allreduce, MemKind::device, &type(t), find_op(MPI_SUM)) ==
          nc::Support::datatype);
    CHECK(nc::supports(Coll::bcast, MemKind::device, &type(t), nullptr) == nc::Support::ok);
  }
  CHECK(type(MPI_INTEGER8).size == 8);
  CHECK(type(MPI_COMPLEX16).size == 16);
  CHECK(type(MPI_COMPLEX16).cls == TypeClass::complex);
  CHECK(type(MPI_INTEGER2).cls == TypeClass::fortran_integer);
}
