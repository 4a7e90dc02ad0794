#include "core/datatypes.hpp"

#include <atomic>
#include <cstdint>
#include <string_view>

namespace streamcoll {
namespace {

std::vector<TypeInfo> build_types() {
  struct Entry {
    MPI_Datatype t;
    const char* name;
    TypeClass cls;
  };
#define T(x, c) Entry{x, #x, TypeClass::c}
  const Entry entries[] = {
      T(MPI_SIGNED_CHAR, c_integer), T(MPI_UNSIGNED_CHAR, c_integer),
      T(MPI_SHORT, c_integer), T(MPI_UNSIGNED_SHORT, c_integer),
      T(MPI_INT, c_integer), T(MPI_UNSIGNED, c_integer),
      T(MPI_LONG, c_integer), T(MPI_UNSIGNED_LONG, c_integer),
      T(MPI_LONG_LONG, c_integer), T(MPI_UNSIGNED_LONG_LONG, c_integer),
      T(MPI_INT8_T, c_integer), T(MPI_INT16_T, c_integer),
      T(MPI_INT32_T, c_integer), T(MPI_INT64_T, c_integer),
      T(MPI_UINT8_T, c_integer), T(MPI_UINT16_T, c_integer),
      T(MPI_UINT32_T, c_integer), T(MPI_UINT64_T, c_integer),
      T(MPI_INTEGER, fortran_integer),
      T(MPI_FLOAT, floating), T(MPI_DOUBLE, floating), T(MPI_LONG_DOUBLE, floating),
      T(MPI_REAL, floating), T(MPI_DOUBLE_PRECISION, floating),
      T(MPI_C_BOOL, logical), T(MPI_CXX_BOOL, logical), T(MPI_LOGICAL, logical),
      T(MPI_C_FLOAT_COMPLEX, complex), T(MPI_C_DOUBLE_COMPLEX, complex),
      T(MPI_C_LONG_DOUBLE_COMPLEX, complex), T(MPI_COMPLEX, complex),
      T(MPI_DOUBLE_COMPLEX, complex),
      T(MPI_BYTE, byte),
      T(MPI_AINT, multi_language), T(MPI_OFFSET, multi_language), T(MPI_COUNT, multi_language),
      T(MPI_FLOAT_INT, pair), T(MPI_DOUBLE_INT, pair), T(MPI_LONG_INT, pair),
      T(MPI_2INT, pair), T(MPI_SHORT_INT, pair), T(MPI_LONG_DOUBLE_INT, pair),
      T(MPI_2REAL, pair), T(MPI_2DOUBLE_PRECISION, pair), T(MPI_2INTEGER, pair),
      T(MPI_CHAR, character), T(MPI_WCHAR, character), T(MPI_CHARACTER, character),
  // Fortran's sized types, where the MPI (and its Fortran compiler) has them: routed by
  // size and class like the others (MPI_REAL8 as MPI_DOUBLE_PRECISION, ...).
#ifdef MPI_INTEGER1
      T(MPI_INTEGER1, fortran_integer),
#endif
#ifdef MPI_INTEGER2
      T(MPI_INTEGER2, fortran_integer),
#endif
#ifdef MPI_INTEGER4
      T(MPI_INTEGER4, fortran_integer),
#endif
#ifdef MPI_INTEGER8
      T(MPI_INTEGER8, fortran_integer),
#endif
#ifdef MPI_REAL2
      T(MPI_REAL2, floating),
#endif
#ifdef MPI_REAL4
      T(MPI_REAL4, floating),
#endif
#ifdef MPI_REAL8
      T(MPI_REAL8, floating),
#endif
#ifdef MPI_REAL16
      T(MPI_REAL16, floating),
#endif
#ifdef MPI_COMPLEX8
      T(MPI_COMPLEX8, complex),
#endif
#ifdef MPI_COMPLEX16
      T(MPI_COMPLEX16, complex),
#endif
#ifdef MPI_COMPLEX32
      T(MPI_COMPLEX32, complex),
#endif
  // 16-bit floating point, where the MPI has it (MPICH's extensions).
#ifdef MPIX_C_FLOAT16
      T(MPIX_C_FLOAT16, floating),
#endif
#ifdef MPIX_BFLOAT16
      T(MPIX_BFLOAT16, floating),
#endif
  };
#undef T
  std::vector<TypeInfo> out;
  for (const Entry& e : entries) {
    if (e.t == MPI_DATATYPE_NULL) continue;
    int size = 0;
    if (PMPI_Type_size(e.t, &size) != MPI_SUCCESS || size <= 0) continue;  // absent here
    // MPI_LONG_LONG and MPI_LONG_LONG_INT, or MPI_C_COMPLEX and MPI_C_FLOAT_COMPLEX, may be
    // the same handle; keep the first name.
    bool dup = false;
    for (const TypeInfo& t : out) dup = dup || t.type == e.t;
    if (!dup) out.push_back(TypeInfo{e.t, e.name, size, e.cls});
  }
  return out;
}

}  // namespace

const std::vector<TypeInfo>& all_types() {
  static const std::vector<TypeInfo> types = build_types();
  return types;
}

const TypeInfo* find_type(MPI_Datatype t) {
  // Calls repeat their datatype: the last type found is looked at first (a scan of the
  // table cost about 220 instructions per call for MPI_FLOAT). One pointer, published with
  // release/acquire (a thread reading it sees the table's entry built); entries are never
  // freed.
  static std::atomic<const TypeInfo*> last{nullptr};
  if (const TypeInfo* l = last.load(std::memory_order_acquire); l && l->type == t) return l;
  for (const TypeInfo& info : all_types())
    if (info.type == t) {
      last.store(&info, std::memory_order_release);
      return &info;
    }
  return nullptr;
}

const std::vector<OpInfo>& all_ops() {
  static const std::vector<OpInfo> ops = {
      {MPI_MAX, OpKind::max, "MPI_MAX"},       {MPI_MIN, OpKind::min, "MPI_MIN"},
      {MPI_SUM, OpKind::sum, "MPI_SUM"},       {MPI_PROD, OpKind::prod, "MPI_PROD"},
      {MPI_LAND, OpKind::land, "MPI_LAND"},    {MPI_BAND, OpKind::band, "MPI_BAND"},
      {MPI_LOR, OpKind::lor, "MPI_LOR"},       {MPI_BOR, OpKind::bor, "MPI_BOR"},
      {MPI_LXOR, OpKind::lxor, "MPI_LXOR"},    {MPI_BXOR, OpKind::bxor, "MPI_BXOR"},
      {MPI_MAXLOC, OpKind::maxloc, "MPI_MAXLOC"}, {MPI_MINLOC, OpKind::minloc, "MPI_MINLOC"},
  };
  return ops;
}

const OpInfo* find_op(MPI_Op op) {
  for (const OpInfo& info : all_ops())
    if (info.op == op) return &info;
  return nullptr;
}

bool op_defined_for(OpKind op, TypeClass cls) {
  using C = TypeClass;
  const bool integer = cls == C::c_integer || cls == C::fortran_integer || cls == C::multi_language;
  switch (op) {
    case OpKind::max:
    case OpKind::min: return integer || cls == C::floating;
    case OpKind::sum:
    case OpKind::prod: return integer || cls == C::floating || cls == C::complex;
    case OpKind::land:
    case OpKind::lor:
    case OpKind::lxor: return cls == C::c_integer || cls == C::logical;
    case OpKind::band:
    case OpKind::bor:
    case OpKind::bxor: return integer || cls == C::byte;
    case OpKind::maxloc:
    case OpKind::minloc: return cls == C::pair;
  }
  return false;
}

Numeric numeric(const TypeInfo& t) {
  const std::string_view n = t.name;
  switch (t.cls) {
    case TypeClass::c_integer:
      // MPI_UNSIGNED, MPI_UNSIGNED_CHAR, MPI_UNSIGNED_LONG..., MPI_UINT8_T...
      if (n.substr(0, 12) == "MPI_UNSIGNED" || n.substr(0, 8) == "MPI_UINT")
        return Numeric::unsigned_int;
      return Numeric::signed_int;  // MPI_SIGNED_CHAR, MPI_SHORT, MPI_INT, MPI_INT8_T...
    case TypeClass::fortran_integer:
    case TypeClass::multi_language:  // MPI_Aint, MPI_Offset, MPI_Count are signed
      return Numeric::signed_int;
    case TypeClass::floating:
      if (n == "MPI_LONG_DOUBLE") return Numeric::other;  // x87 80-bit, not IEEE binary128
      if (n.find("BF16") != std::string_view::npos || n.find("BFLOAT16") != std::string_view::npos)
        return Numeric::bfloat16;
      return Numeric::ieee_float;
    default:
      return Numeric::other;
  }
}

namespace {
template <class U>
void unsigned_min_max(const void* in, void* inout, int count, bool max) {
  const U* a = static_cast<const U*>(in);
  U* b = static_cast<U*>(inout);
  for (int i = 0; i < count; ++i)
    if (max ? a[i] > b[i] : a[i] < b[i]) b[i] = a[i];
}
}  // namespace

int reduce_local(const void* in, void* inout, int count, MPI_Datatype t, MPI_Op op) {
  if ((op == MPI_MIN || op == MPI_MAX) && count > 0)
    if (const TypeInfo* info = find_type(t); info && numeric(*info) == Numeric::unsigned_int) {
      const bool max = op == MPI_MAX;
      switch (info->size) {
        case 1: unsigned_min_max<uint8_t>(in, inout, count, max); return MPI_SUCCESS;
        case 2: unsigned_min_max<uint16_t>(in, inout, count, max); return MPI_SUCCESS;
        case 4: unsigned_min_max<uint32_t>(in, inout, count, max); return MPI_SUCCESS;
        case 8: unsigned_min_max<uint64_t>(in, inout, count, max); return MPI_SUCCESS;
        default: break;
      }
    }
  return PMPI_Reduce_local(in, inout, count, reduction_type(t), op);
}

MPI_Datatype reduction_type(MPI_Datatype t) {
  const TypeInfo* info = find_type(t);
  if (!info) return t;
  const Numeric n = numeric(*info);
  if (n != Numeric::signed_int && n != Numeric::unsigned_int) return t;
  const bool u = n == Numeric::unsigned_int;
  switch (info->size) {
    case 1: return u ? MPI_UINT8_T : MPI_INT8_T;
    case 2: return u ? MPI_UINT16_T : MPI_INT16_T;
    case 4: return u ? MPI_UINT32_T : MPI_INT32_T;
    case 8: return u ? MPI_UINT64_T : MPI_INT64_T;
    default: return t;
  }
}

}  // namespace streamcoll
