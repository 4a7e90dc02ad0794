// What the fakes (fake_cuda.cpp, fake_nccl.cpp) share for reading their knobs. Header-only:
// the two are separate libraries.
#pragma once

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace fake_env {

// A byte count: digits, then optionally K, M, G or T (powers of 1024, either case).
inline bool parse_bytes(const char* v, unsigned long long* out) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long n = std::strtoull(v, &end, 10);
  if (end == v || errno != 0 || *v == '-') return false;
  const char* const units = "KMGT";
  int shift = 0;
  if (*end) {
    const char* u = std::strchr(units, std::toupper(static_cast<unsigned char>(*end)));
    if (!u || end[1] != '\0') return false;
    shift = 10 * static_cast<int>(u - units + 1);
  }
  if (shift && n > (~0ull >> shift)) return false;
  *out = n << shift;
  return true;
}

}  // namespace fake_env
