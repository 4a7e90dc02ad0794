// MPI 4.1 memory allocation kinds (MPI-4.1 sec. 11.4.3): a program asserts which kinds of
// memory it passes on a communicator with the info key mpi_assert_memory_alloc_kinds
// (MPI_Comm_set_info, MPI_Comm_dup_with_info, MPI_Comm_split_type). Where the assertion
// leaves only host memory, the memory kind of a call is a fact equal on every rank, and
// streamcoll needs neither the driver's classification nor an agreement to route it
// (shim/comm_info.cpp records it, shim/dispatch.cpp: decide uses it).
#pragma once

#include <cstdint>
#include <string_view>

#include "base/types.hpp"

namespace streamcoll::alloc_kinds {

inline constexpr const char kAssertKey[] = "mpi_assert_memory_alloc_kinds";

/// The memory kinds `value` (the info value: a comma-separated list of kind[:restrictor]
/// entries) allows, as bits 1u << MemKind; 0 when any entry is one streamcoll does not
/// understand (then the assertion is not used at all). Understood:
///   system                 host memory (pageable or registered): host, pinned
///   mpi, mpi:alloc_mem, mpi:win_allocate, mpi:win_allocate_shared   host, pinned
///   cuda:host              page-locked memory of the CUDA driver: pinned
///   cuda:device            device memory: device
///   cuda:managed           unified memory: managed
///   cuda                   every CUDA kind: pinned, device, managed
/// Spaces around entries are ignored; an empty value is 0. Thread safe (pure).
uint32_t parse(std::string_view value);

/// The bit of kind `k` in a parse() mask.
constexpr uint32_t bit(MemKind k) { return 1u << static_cast<int>(k); }

/// Whether `kinds` (nonzero, from parse()) allows host memory only.
inline bool host_only(uint32_t kinds) {
  return kinds != 0 && (kinds & ~(bit(MemKind::host) | bit(MemKind::pinned))) == 0;
}

/// The memory kind a call on a communicator asserting host_only `kinds` is routed as:
/// pinned when only page-locked memory is allowed, else host.
inline MemKind routing_kind(uint32_t kinds) {
  return kinds == bit(MemKind::pinned) ? MemKind::pinned : MemKind::host;
}

/// Whether a buffer of kind `k` is one that `kinds` allows.
inline bool allows(uint32_t kinds, MemKind k) { return (kinds & bit(k)) != 0; }

}  // namespace streamcoll::alloc_kinds
