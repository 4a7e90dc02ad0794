#include "core/alloc_kinds.hpp"

namespace streamcoll::alloc_kinds {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// The kinds of one entry, 0 if not understood.
uint32_t entry(std::string_view e) {
  const size_t colon = e.find(':');
  const std::string_view kind = e.substr(0, colon);
  const std::string_view restrictor =
      colon == std::string_view::npos ? std::string_view() : e.substr(colon + 1);
  const uint32_t host = bit(MemKind::host) | bit(MemKind::pinned);
  if (kind == "system") return restrictor.empty() ? host : 0;
  if (kind == "mpi")
    return restrictor.empty() || restrictor == "alloc_mem" || restrictor == "win_allocate" ||
                   restrictor == "win_allocate_shared"
               ? host
               : 0;
  if (kind == "cuda") {
    if (restrictor.empty()) return bit(MemKind::pinned) | bit(MemKind::device) | bit(MemKind::managed);
    if (restrictor == "host") return bit(MemKind::pinned);
    if (restrictor == "device") return bit(MemKind::device);
    if (restrictor == "managed") return bit(MemKind::managed);
  }
  return 0;  // another kind (rocm, ze, ...) or restrictor: nothing can be concluded
}

}  // namespace

uint32_t parse(std::string_view value) {
  uint32_t kinds = 0;
  bool any = false;
  while (true) {
    const size_t comma = value.find(',');
    const std::string_view e = trim(value.substr(0, comma));
    if (!e.empty()) {
      const uint32_t k = entry(e);
      if (k == 0) return 0;
      kinds |= k;
      any = true;
    }
    if (comma == std::string_view::npos) break;
    value.remove_prefix(comma + 1);
  }
  return any ? kinds : 0;
}

}  // namespace streamcoll::alloc_kinds
