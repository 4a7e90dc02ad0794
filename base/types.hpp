// Vocabulary shared by every layer: collectives, routes, memory kinds.
// Names are the ones used in the tuning table, STREAMCOLL_ROUTE and the statistics.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "base/routes.hpp"

namespace streamcoll {

/// A collective, blocking or not (MPI_Iallreduce is `allreduce` with nonblocking=true):
/// one per row of base/colls.def, in its order (its description: base/coll_traits.hpp).
enum class Coll : uint8_t {
#define COLL(id, ...) id,
#include "base/colls.def"
#undef COLL
};
inline constexpr int kNumColls = 0
#define COLL(id, ...) +1
#include "base/colls.def"
#undef COLL
    ;

/// Where a buffer lives, as the CUDA driver reports it.
enum class MemKind : uint8_t {
  host,     ///< ordinary pageable host memory (or no CUDA driver)
  pinned,   ///< page-locked / registered host memory (cudaMallocHost, cudaHostRegister)
  device,   ///< device memory (cudaMalloc)
  managed,  ///< unified memory (cudaMallocManaged)
  mixed,    ///< the call's significant buffers are of different kinds
};
inline constexpr int kNumMemKinds = 5;

std::string_view name(Coll c);
std::string_view name(MemKind m);

std::optional<Coll> parse_coll(std::string_view s);
std::optional<MemKind> parse_mem(std::string_view s);

}  // namespace streamcoll
