#include "algorithms/nccl_map.hpp"

#include <algorithm>
#include <string_view>

#include "core/coll_args.hpp"

namespace streamcoll::nccl {

std::optional<ncclDataType_t> reduction_type(const TypeInfo& t) {
  switch (numeric(t)) {
    case Numeric::signed_int:
      if (t.size == 1) return ncclInt8;
      if (t.size == 4) return ncclInt32;
      if (t.size == 8) return ncclInt64;
      return std::nullopt;
    case Numeric::unsigned_int:
      if (t.size == 1) return ncclUint8;
      if (t.size == 4) return ncclUint32;
      if (t.size == 8) return ncclUint64;
      return std::nullopt;
    case Numeric::ieee_float:
      if (t.size == 2) return ncclFloat16;
      if (t.size == 4) return ncclFloat32;
      if (t.size == 8) return ncclFloat64;
      return std::nullopt;
    case Numeric::bfloat16:
      if (t.size == 2) return ncclBfloat16;
      return std::nullopt;
    case Numeric::other:
      return std::nullopt;
  }
  return std::nullopt;
}

std::optional<ncclRedOp_t> reduction_op(OpKind op) {
  switch (op) {
    case OpKind::sum: return ncclSum;
    case OpKind::prod: return ncclProd;
    case OpKind::min: return ncclMin;
    case OpKind::max: return ncclMax;
    default: return std::nullopt;
  }
}

const char* describe(Support s) {
  switch (s) {
    case Support::ok: return "supported";
    case Support::collective: return "collective not carried by NCCL";
    case Support::memory: return "buffers not in GPU memory";
    case Support::datatype: return "datatype has no NCCL equivalent";
    case Support::op: return "op has no NCCL equivalent";
  }
  return "?";
}

Support supports(Coll c, MemKind mem, const TypeInfo* type, const OpInfo* op) {
  switch (c) {
    case Coll::allreduce:
    case Coll::reduce:
    case Coll::reduce_scatter_block:
    case Coll::bcast:
    case Coll::allgather:
    case Coll::alltoall:
      break;
    default:
      return Support::collective;
  }
  if (mem != MemKind::device && mem != MemKind::managed) return Support::memory;
  if (!type || !is_contiguous_basic(type->cls)) return Support::datatype;
  if (takes_op(c)) {
    if (!reduction_type(*type)) return Support::datatype;
    if (!op || !reduction_op(op->kind)) return Support::op;
  }
  return Support::ok;
}

std::optional<std::pair<int, int>> shared_gpu(const std::vector<GpuId>& gpus) {
  // Sorted by GPU, then rank: equal GPUs are adjacent, the lowest rank first.
  std::vector<std::pair<GpuId, int>> order;
  order.reserve(gpus.size());
  for (size_t i = 0; i < gpus.size(); ++i) order.emplace_back(gpus[i], static_cast<int>(i));
  std::sort(order.begin(), order.end(), [](const auto& x, const auto& y) {
    if (x.first.host != y.first.host) return x.first.host < y.first.host;
    if (x.first.bus != y.first.bus) return x.first.bus < y.first.bus;
    return x.second < y.second;
  });
  std::optional<std::pair<int, int>> first;
  for (size_t i = 1; i < order.size(); ++i)
    if (order[i].first == order[i - 1].first) {
      std::pair<int, int> p{order[i - 1].second, order[i].second};
      if (!first || p < *first) first = p;
    }
  return first;
}

uint64_t hash(const char* s, uint64_t h) {
  for (; *s; ++s) {
    h ^= static_cast<unsigned char>(*s);
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace streamcoll::nccl
