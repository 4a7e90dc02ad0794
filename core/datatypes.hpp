// Predefined MPI datatypes and reduction operations, and which ops MPI defines for which
// types (MPI-4.0, section 6.9.2). Only predefined, contiguous handles are listed:
// anything not found here (derived types, user ops) is passed through to PMPI_.
// The tables are built at first use after MPI_Init and are read-only afterwards.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace streamcoll {

/// MPI's groups of basic datatypes for reductions.
enum class TypeClass : uint8_t {
  c_integer,        ///< MPI_INT, MPI_UINT64_T, MPI_SIGNED_CHAR, ...
  fortran_integer,  ///< MPI_INTEGER
  floating,         ///< MPI_FLOAT, MPI_DOUBLE, MPI_LONG_DOUBLE, MPI_REAL, ...
  logical,          ///< MPI_C_BOOL, MPI_CXX_BOOL, MPI_LOGICAL
  complex,          ///< MPI_C_FLOAT_COMPLEX, ..., MPI_COMPLEX
  byte,             ///< MPI_BYTE
  multi_language,   ///< MPI_AINT, MPI_OFFSET, MPI_COUNT
  pair,             ///< MPI_2INT, MPI_DOUBLE_INT, ... (MINLOC/MAXLOC only; not contiguous)
  character,        ///< MPI_CHAR, MPI_WCHAR, MPI_CHARACTER (no reductions)
};

struct TypeInfo {
  MPI_Datatype type;
  std::string_view name;  ///< "MPI_INT"
  int size;               ///< bytes, from PMPI_Type_size
  TypeClass cls;
};

/// The predefined datatype `t`, or nullptr (derived, null, or not in this MPI).
const TypeInfo* find_type(MPI_Datatype t);
/// Every predefined datatype this MPI has (size > 0).
const std::vector<TypeInfo>& all_types();

enum class OpKind : uint8_t { max, min, sum, prod, land, band, lor, bor, lxor, bxor, maxloc, minloc };
inline constexpr int kNumOps = 12;

struct OpInfo {
  MPI_Op op;
  OpKind kind;
  std::string_view name;  ///< "MPI_SUM"
};

/// The predefined reduction op `op` (not MPI_REPLACE/MPI_NO_OP), or nullptr.
const OpInfo* find_op(MPI_Op op);
const std::vector<OpInfo>& all_ops();

/// How the values of a predefined datatype are represented, for reductions on a GPU.
enum class Numeric : uint8_t { signed_int, unsigned_int, ieee_float, bfloat16, other };

/// From the datatype's MPI name and class: MPI_INT -> signed_int, MPI_UNSIGNED_LONG ->
/// unsigned_int, MPI_DOUBLE -> ieee_float, MPIX_BFLOAT16 -> bfloat16, MPI_LONG_DOUBLE
/// and MPI_C_BOOL -> other.
Numeric numeric(const TypeInfo& t);

/// The type to reduce `t` as with PMPI_Reduce_local: for an integer type of 1, 2, 4 or
/// 8 bytes, the fixed-width type of its size and signedness (MPI_UNSIGNED_LONG ->
/// MPI_UINT64_T, MPI_OFFSET -> MPI_INT64_T); `t` itself otherwise. Open MPI 4.1 reduces
/// MPI_UNSIGNED_LONG with MIN and MAX as signed, and MPI_OFFSET as unsigned; its
/// fixed-width types reduce right, and every op defined on an integer type is defined on
/// them.
MPI_Datatype reduction_type(MPI_Datatype t);

/// inout[i] = in[i] (op) inout[i], as PMPI_Reduce_local(in, inout, count, t, op) defines
/// it, for every predefined type and op: MIN and MAX of unsigned integer types computed
/// here (MPICH 4.0's MPI_Reduce_local compares every unsigned type as signed, its
/// fixed-width ones included), everything else by the MPI on reduction_type(t).
int reduce_local(const void* in, void* inout, int count, MPI_Datatype t, MPI_Op op);

/// Whether MPI defines `op` on datatypes of class `cls` (MPI-4.0 section 6.9.2).
bool op_defined_for(OpKind op, TypeClass cls);

/// Whether a datatype of class `cls` is a contiguous array of one basic type, so that a
/// route may treat the buffer as `count * size` bytes of that type.
inline bool is_contiguous_basic(TypeClass cls) { return cls != TypeClass::pair; }

}  // namespace streamcoll
