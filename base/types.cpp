#include "base/types.hpp"

#include <array>

namespace streamcoll {
namespace {
constexpr std::array<std::string_view, kNumColls> kCollNames = {
#define COLL(id, ...) #id,
#include "base/colls.def"
#undef COLL
};
constexpr std::array<std::string_view, kNumMemKinds> kMemNames = {
    "host", "pinned", "device", "managed", "mixed"};

template <class E, size_t N>
std::optional<E> lookup(const std::array<std::string_view, N>& names, std::string_view s) {
  for (size_t i = 0; i < N; ++i)
    if (names[i] == s) return static_cast<E>(i);
  return std::nullopt;
}
}  // namespace

std::string_view name(Coll c) { return kCollNames[static_cast<size_t>(c)]; }
std::string_view name(MemKind m) { return kMemNames[static_cast<size_t>(m)]; }

std::optional<Coll> parse_coll(std::string_view s) { return lookup<Coll>(kCollNames, s); }
std::optional<MemKind> parse_mem(std::string_view s) { return lookup<MemKind>(kMemNames, s); }

}  // namespace streamcoll
