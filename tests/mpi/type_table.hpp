// The predefined datatypes and reduction ops the real-MPI test programs (host_routes.cpp,
// fusion.cpp) cover, with the value model's typed kernels for each.
#pragma once

#include <mpi.h>

#include <complex>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "value_model.hpp"

namespace {

// ------------------------------------------------------------------------ reduction ops

MPI_Op handle_of(Op op) {
  static const MPI_Op h[] = {MPI_MAX,    MPI_MIN,    MPI_SUM,    MPI_PROD, MPI_LAND,
                             MPI_LOR,    MPI_LXOR,   MPI_BAND,   MPI_BOR,  MPI_BXOR,
                             MPI_MAXLOC, MPI_MINLOC, MPI_OP_NULL};
  return h[static_cast<int>(op)];
}
const char* name_of(Op op) {
  static const char* n[] = {"MPI_MAX",    "MPI_MIN",    "MPI_SUM",  "MPI_PROD", "MPI_LAND",
                            "MPI_LOR",    "MPI_LXOR",   "MPI_BAND", "MPI_BOR",  "MPI_BXOR",
                            "MPI_MAXLOC", "MPI_MINLOC", "-"};
  return n[static_cast<int>(op)];
}

// MPI's groups of basic datatypes and the ops defined on each; `character` types (MPI_CHAR,
// MPI_WCHAR) take no op, only data movement.
enum class Cls { integer, floating, complex, logical, byte, multi_language, pair, character };

std::vector<Op> ops_for(Cls c) {
  switch (c) {
    case Cls::integer:
      return {Op::max, Op::min,  Op::sum,  Op::prod, Op::land,
              Op::lor, Op::lxor, Op::band, Op::bor,  Op::bxor};
    case Cls::floating:
      return {Op::max, Op::min, Op::sum, Op::prod};
    case Cls::complex:
      return {Op::sum, Op::prod};
    case Cls::logical:
      return {Op::land, Op::lor, Op::lxor};
    case Cls::byte:
      return {Op::band, Op::bor, Op::bxor};
    case Cls::multi_language:
      return {Op::max, Op::min, Op::sum, Op::prod, Op::band, Op::bor, Op::bxor};
    case Cls::pair:
      return {Op::maxloc, Op::minloc};
    case Cls::character:
      return {};
  }
  return {};
}

// ---------------------------------------------------------------------- datatype table

struct TypeDesc {
  MPI_Datatype handle;
  const char* name;
  Cls cls;
  Kernel k;
  bool is_unsigned;  // an unsigned integer type
  // The route carries contiguous basic types only: the pair types go to pmpi.
  bool routable() const { return cls != Cls::pair; }
};

const std::vector<TypeDesc>& all_types() {
#define TYPE(handle, ctype, cls) \
  TypeDesc { handle, #handle, Cls::cls, kernel_of<ctype>(), std::is_unsigned_v<ctype> }
  static const std::vector<TypeDesc> types = {
      TYPE(MPI_SIGNED_CHAR, signed char, integer),
      TYPE(MPI_UNSIGNED_CHAR, unsigned char, integer),
      TYPE(MPI_SHORT, short, integer),
      TYPE(MPI_UNSIGNED_SHORT, unsigned short, integer),
      TYPE(MPI_INT, int, integer),
      TYPE(MPI_UNSIGNED, unsigned, integer),
      TYPE(MPI_LONG, long, integer),
      TYPE(MPI_UNSIGNED_LONG, unsigned long, integer),
      TYPE(MPI_LONG_LONG, long long, integer),
      TYPE(MPI_UNSIGNED_LONG_LONG, unsigned long long, integer),
      TYPE(MPI_INT8_T, int8_t, integer),
      TYPE(MPI_INT16_T, int16_t, integer),
      TYPE(MPI_INT32_T, int32_t, integer),
      TYPE(MPI_INT64_T, int64_t, integer),
      TYPE(MPI_UINT8_T, uint8_t, integer),
      TYPE(MPI_UINT16_T, uint16_t, integer),
      TYPE(MPI_UINT32_T, uint32_t, integer),
      TYPE(MPI_UINT64_T, uint64_t, integer),
      TYPE(MPI_FLOAT, float, floating),
      TYPE(MPI_DOUBLE, double, floating),
      TYPE(MPI_LONG_DOUBLE, long double, floating),
      TYPE(MPI_C_FLOAT_COMPLEX, std::complex<float>, complex),
      TYPE(MPI_C_DOUBLE_COMPLEX, std::complex<double>, complex),
      TYPE(MPI_C_LONG_DOUBLE_COMPLEX, std::complex<long double>, complex),
      TYPE(MPI_C_BOOL, bool, logical),
      TYPE(MPI_CXX_BOOL, bool, logical),
      TYPE(MPI_BYTE, unsigned char, byte),
      TYPE(MPI_AINT, MPI_Aint, multi_language),
      TYPE(MPI_OFFSET, MPI_Offset, multi_language),
      TYPE(MPI_COUNT, MPI_Count, multi_language),
      TYPE(MPI_CHAR, char, character),
      TYPE(MPI_WCHAR, wchar_t, character),
      TYPE(MPI_FLOAT_INT, Pair<float>, pair),
      TYPE(MPI_DOUBLE_INT, Pair<double>, pair),
      TYPE(MPI_LONG_INT, Pair<long>, pair),
      TYPE(MPI_2INT, Pair<int>, pair),
      TYPE(MPI_SHORT_INT, Pair<short>, pair),
      TYPE(MPI_LONG_DOUBLE_INT, Pair<long double>, pair),
  };
#undef TYPE
  return types;
}

const TypeDesc& type_named(const char* name) {
  for (const TypeDesc& t : all_types())
    if (std::strcmp(t.name, name) == 0) return t;
  std::fprintf(stderr, "no datatype %s in the table\n", name);
  std::abort();
}

bool mpich_defect() {
  static const bool defect = [] {
    char lib[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
    int len = 0;
    return MPI_Get_library_version(lib, &len) == MPI_SUCCESS && mpich_unsigned_minmax_as_signed(lib);
  }();
  return defect;
}

// Inputs that every MPI here reduces alike (value_model.hpp: integer_input).
bool tame_inputs(const TypeDesc& t, Op op) {
  return (op == Op::max || op == Op::min) &&
         (std::strcmp(t.name, "MPI_UNSIGNED_LONG") == 0 || std::strcmp(t.name, "MPI_OFFSET") == 0 ||
          (t.is_unsigned && t.cls == Cls::integer && mpich_defect()));
}

}  // namespace
