// The value model of the MPI collective checks (collectives_check.cpp, host_routes.cpp):
// what each rank contributes to each element of each call, exact under any reduction
// order, and the reduction ops as MPI defines them, for every predefined datatype class.
// Included by one translation unit per program.
#pragma once

#include <complex>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

namespace {

enum class Op { max, min, sum, prod, land, lor, lxor, band, bor, bxor, maxloc, minloc, none };


template <class V>
struct Pair {  // the C layout of MPI_FLOAT_INT, MPI_2INT, ...
  V v;
  int i;
};
template <class T>
struct is_pair : std::false_type {};
template <class V>
struct is_pair<Pair<V>> : std::true_type {};
template <class T>
struct is_complex : std::false_type {};
template <class F>
struct is_complex<std::complex<F>> : std::true_type {};

// The MPICH version that MPI_Get_library_version wrote into `lib` ("MPICH Version:" and
// spaces or a tab, then "4.0.2"); false for any other MPI.
inline bool mpich_version(const char* lib, int* major, int* minor) {
  const char* v = std::strstr(lib, "MPICH Version:");
  return v && std::sscanf(v + std::strlen("MPICH Version:"), " %d.%d", major, minor) == 2;
}

// Whether that MPI reduces every unsigned integer type as signed in MAX and MIN, in its
// collectives and MPI_Reduce_local: MPICH 4.0 (pmodels/mpich#6083). Its results for
// inputs above the signed range are wrong.
inline bool mpich_unsigned_minmax_as_signed(const char* lib) {
  int major = 0, minor = 0;
  return mpich_version(lib, &major, &minor) && major == 4 && minor == 0;
}

inline uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline uint64_t element_hash(Op op, int rank, uint64_t elem, uint64_t salt) {
  const uint64_t call = mix(salt * 16 + static_cast<uint64_t>(op));
  return mix(call ^ (static_cast<uint64_t>(static_cast<uint32_t>(rank)) << 40) ^ elem);
}

// Ranks from 4 on contribute only units to PROD, so |products| <= 16.
constexpr int kProdRanks = 4;

// `tame`: MAX and MIN see only [0, 100], read the same signed or unsigned (Open MPI 4.1.4
// reduces MPI_UNSIGNED_LONG as signed and MPI_OFFSET as unsigned; the PMPI comparison
// needs both readings to agree).
template <class T>
T integer_input(Op op, int rank, uint64_t h, bool tame) {
  using U = std::make_unsigned_t<T>;
  constexpr bool is_signed = std::is_signed_v<T>;
  const uint64_t r = h >> 8;
  switch (op) {
    case Op::max:
    case Op::min:
      if (tame) return static_cast<T>(r % 101);
      if ((h & 15) == 0) return std::numeric_limits<T>::max();
      if ((h & 15) == 1) return std::numeric_limits<T>::min();
      return is_signed ? static_cast<T>(static_cast<int64_t>(r % 201) - 100)
                       : static_cast<T>(r % 201);
    case Op::sum:
      return is_signed ? static_cast<T>(static_cast<int64_t>(r % 7) - 3) : static_cast<T>(r % 7);
    case Op::prod: {
      const T mag = (rank < kProdRanks && (r & 1)) ? T(2) : T(1);
      if constexpr (is_signed) {
        if (r & 2) return static_cast<T>(-mag);
      }
      return mag;
    }
    case Op::land:
    case Op::lor:
    case Op::lxor: {  // zero, or one set bit anywhere in the word
      const bool nonzero = op == Op::land  ? (h & 7) != 0
                           : op == Op::lor ? (h & 7) == 0
                                           : (h & 1) != 0;
      if (!nonzero) return T(0);
      return static_cast<T>(static_cast<U>(U(1) << (r % (8 * sizeof(T)))));
    }
    case Op::band:
      return static_cast<T>(static_cast<U>(r | mix(r)));  // dense bits
    case Op::bor:
      return static_cast<T>(static_cast<U>(r & mix(r)));  // sparse bits
    default:
      return static_cast<T>(static_cast<U>(h));  // any bit pattern
  }
}

template <class F>
F floating_input(Op op, int rank, uint64_t h) {
  const uint64_t r = h >> 8;
  switch (op) {
    case Op::max:
    case Op::min:
      if ((h & 15) == 0) return std::numeric_limits<F>::max();
      if ((h & 15) == 1) return std::numeric_limits<F>::lowest();
      return F(static_cast<int64_t>(r % 801) - 400) / F(4);
    case Op::sum:
      return F(static_cast<int64_t>(r % 13) - 6) / F(2);
    case Op::prod: {
      F mag = F(1);
      if (rank < kProdRanks) mag = r % 3 == 0 ? F(2) : r % 3 == 1 ? F(0.5) : F(1);
      return (r & 64) ? -mag : mag;
    }
    default:
      return F(static_cast<int64_t>(r % 2000001) - 1000000) / F(8);
  }
}

template <class F>
std::complex<F> complex_input(Op op, int rank, uint64_t h) {
  if (op == Op::prod) {  // Gaussian integers of modulus <= 2: products are exact
    static const int units[4][2] = {{1, 0}, {0, 1}, {-1, 0}, {0, -1}};
    static const int small[4][2] = {{1, 1}, {1, -1}, {2, 0}, {0, 2}};
    const int* z = (rank < kProdRanks && (h & 8)) ? small[(h >> 4) & 3] : units[(h >> 4) & 3];
    return {F(z[0]), F(z[1])};
  }
  return {floating_input<F>(op, rank, h), floating_input<F>(op, rank, mix(h))};
}

// What `rank` contributes at element `elem` of call `salt` (Op::none: data of the
// data-movement collectives, and the sentinels).
template <class T>
T input(Op op, int rank, uint64_t elem, uint64_t salt, bool tame = false) {
  const uint64_t h = element_hash(op, rank, elem, salt);
  if constexpr (std::is_same_v<T, bool>) {
    return op == Op::land ? (h & 7) != 0 : op == Op::lor ? (h & 7) == 0 : (h & 1) != 0;
  } else if constexpr (is_pair<T>::value) {
    using V = decltype(T::v);
    if (op == Op::maxloc || op == Op::minloc)  // four values, so ties are common
      return T{V(static_cast<int64_t>((h >> 8) % 4) - 1), static_cast<int>((h >> 20) % 50)};
    return T{V(static_cast<int64_t>((h >> 8) % 20001) - 10000), static_cast<int>(h >> 33)};
  } else if constexpr (is_complex<T>::value) {
    return complex_input<typename T::value_type>(op, rank, h);
  } else if constexpr (std::is_floating_point_v<T>) {
    return floating_input<T>(op, rank, h);
  } else {
    return integer_input<T>(op, rank, h, tame);
  }
}

// a (op) b as MPI defines it; MAXLOC/MINLOC keep the lower index on ties.
template <class T>
T combine(Op op, const T& a, const T& b) {
  if constexpr (is_pair<T>::value) {
    if (a.v != b.v) return ((op == Op::maxloc) == (a.v > b.v)) ? a : b;
    return T{a.v, a.i < b.i ? a.i : b.i};
  } else if constexpr (is_complex<T>::value) {
    return op == Op::sum ? a + b : a * b;
  } else if constexpr (std::is_same_v<T, bool>) {
    return op == Op::land ? (a && b) : op == Op::lor ? (a || b) : (a != b);
  } else {
    switch (op) {
      case Op::max:
        return a < b ? b : a;
      case Op::min:
        return b < a ? b : a;
      case Op::sum:
        return static_cast<T>(a + b);
      case Op::prod:
        return static_cast<T>(a * b);
      case Op::land:
        return static_cast<T>(a != 0 && b != 0);
      case Op::lor:
        return static_cast<T>(a != 0 || b != 0);
      case Op::lxor:
        return static_cast<T>((a != 0) != (b != 0));
      default:
        break;
    }
    if constexpr (std::is_integral_v<T>) {
      switch (op) {
        case Op::band:
          return static_cast<T>(a & b);
        case Op::bor:
          return static_cast<T>(a | b);
        case Op::bxor:
          return static_cast<T>(a ^ b);
        default:
          break;
      }
    }
    std::abort();  // an op this type does not define: a bug in the tables
  }
}

template <class T>
bool same(const T& a, const T& b) {
  if constexpr (is_pair<T>::value)
    return a.v == b.v && a.i == b.i;  // padding ignored
  else
    return a == b;
}

template <class T>
std::string show(const T& x) {
  char s[96];
  if constexpr (is_pair<T>::value) {
    return "(" + show(x.v) + ", " + std::to_string(x.i) + ")";
  } else if constexpr (is_complex<T>::value) {
    return "(" + show(x.real()) + ", " + show(x.imag()) + ")";
  } else if constexpr (std::is_same_v<T, bool>) {
    return x ? "true" : "false";
  } else if constexpr (std::is_floating_point_v<T>) {
    std::snprintf(s, sizeof s, "%.21Lg", static_cast<long double>(x));
    return s;
  } else if constexpr (std::is_signed_v<T>) {
    return std::to_string(static_cast<long long>(x));
  } else {
    return std::to_string(static_cast<unsigned long long>(x));
  }
}

// The typed operations behind function pointers, so the datatype table can hold them.
struct Kernel {
  size_t size;
  void (*fill)(void* dst, size_t n, Op op, int rank, uint64_t first, uint64_t salt, bool tame);
  // dst[k] = input(0, e) op input(1, e) op ... op input(nranks - 1, e), e = first + k
  void (*reduce)(void* dst, size_t n, Op op, int nranks, uint64_t first, uint64_t salt, bool tame);
  size_t (*mismatch)(const void* got, const void* want, size_t begin, size_t end);
  std::string (*show)(const void* buf, size_t k);
};

template <class T>
Kernel kernel_of() {
  Kernel k;
  k.size = sizeof(T);
  k.fill = [](void* dst, size_t n, Op op, int rank, uint64_t first, uint64_t salt, bool tame) {
    T* d = static_cast<T*>(dst);
    for (size_t i = 0; i < n; ++i) {
      const T x = input<T>(op, rank, first + i, salt, tame);
      if constexpr (is_pair<T>::value) {  // members only: the padding stays defined (zero)
        d[i].v = x.v;
        d[i].i = x.i;
      } else {
        d[i] = x;
      }
    }
  };
  k.reduce = [](void* dst, size_t n, Op op, int nranks, uint64_t first, uint64_t salt, bool tame) {
    T* d = static_cast<T*>(dst);
    for (size_t i = 0; i < n; ++i) {
      T acc = input<T>(op, 0, first + i, salt, tame);
      for (int r = 1; r < nranks; ++r)
        acc = combine<T>(op, acc, input<T>(op, r, first + i, salt, tame));
      d[i] = acc;
    }
  };
  k.mismatch = [](const void* got, const void* want, size_t begin, size_t end) {
    const T* g = static_cast<const T*>(got);
    const T* w = static_cast<const T*>(want);
    for (size_t i = begin; i < end; ++i)
      if (!same<T>(g[i], w[i])) return i;
    return end;
  };
  k.show = [](const void* buf, size_t i) { return show<T>(static_cast<const T*>(buf)[i]); };
  return k;
}

}  // namespace
