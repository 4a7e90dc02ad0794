// Vocabulary shared by every layer: collectives, routes, memory kinds.
// Names are the ones used in the tuning table, STREAMCOLL_ROUTE and the statistics.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "base/routes.hpp"

namespace streamcoll {

/// A collective, blocking or not (MPI_Iallreduce is `allreduce` with nonblocking=true).
enum class Coll : uint8_t {
  allreduce,
  reduce,
  bcast,
  allgather,
  allgatherv,
  reduce_scatter,
  reduce_scatter_block,
  alltoall,
  barrier,
};
inline constexpr int kNumColls = 9;

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
