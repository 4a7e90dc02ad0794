// The pure part of the NCCL route: which calls NCCL can carry, the MPI -> NCCL datatype
// and op maps, and the shared-GPU rule. No MPI traffic, no GPU: unit-tested in CI.
#pragma once

#include <nccl.h>

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "base/types.hpp"
#include "core/datatypes.hpp"

namespace streamcoll::nccl {

using streamcoll::Numeric;  // core/datatypes
using streamcoll::numeric;

/// The NCCL type that reduces `t` exactly as MPI does, or nullopt (16-bit integers,
/// long double, complex, logical, byte, characters: NCCL has no such type).
std::optional<ncclDataType_t> reduction_type(const TypeInfo& t);

/// MPI_SUM/PROD/MIN/MAX -> ncclSum/Prod/Min/Max; nullopt for every other op.
std::optional<ncclRedOp_t> reduction_op(OpKind op);

/// Why the route takes a call or not. `ok` only for: allreduce, reduce, bcast, allgather,
/// reduce_scatter_block and alltoall (the last by grouped send/recv) on device or managed
/// memory; reductions need reduction_type() and reduction_op(); bcast, allgather and
/// alltoall move any predefined contiguous type as bytes. The caller has already applied
/// core/eligibility (predefined types, equal signatures, op defined for the type).
enum class Support : uint8_t { ok, collective, memory, datatype, op };
const char* describe(Support s);
Support supports(Coll c, MemKind mem, const TypeInfo* type, const OpInfo* op);

/// One rank's GPU: the host it runs on and the device's PCI bus id, both hashed.
struct GpuId {
  uint64_t host = 0;
  uint64_t bus = 0;
  bool operator==(const GpuId& o) const { return host == o.host && bus == o.bus; }
};

/// The first pair of ranks (i < j) that use the same GPU, or nullopt. NCCL refuses such
/// a communicator, so the route is off for it.
std::optional<std::pair<int, int>> shared_gpu(const std::vector<GpuId>& gpus);

/// 64-bit FNV-1a, for host names and bus ids.
uint64_t hash(const char* s, uint64_t h = 1469598103934665603ull);

}  // namespace streamcoll::nccl
