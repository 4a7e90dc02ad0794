// Which calls a route other than pmpi may take (DESIGN.md section 2). Pure: decided from
// facts the dispatcher gathers, so it can be unit-tested without MPI traffic.
#pragma once

#include <cstdint>

#include "base/types.hpp"
#include "core/datatypes.hpp"

namespace streamcoll {

enum class Verdict : uint8_t {
  eligible,
  invalid_args,    ///< MPI must raise the error itself
  inter_comm,      ///< inter-communicator
  empty,           ///< no data moves (count 0 everywhere, barrier is still eligible)
  derived_type,    ///< not a predefined contiguous datatype
  type_mismatch,   ///< send and receive types or counts differ (allgather, alltoall)
  user_op,         ///< not a predefined reduction op
  op_not_defined,  ///< MPI does not define this op on this type (MPI raises the error)
  mixed_memory,    ///< the buffers are of different memory kinds
};

const char* describe(Verdict v);

struct CallFacts {
  Coll coll = Coll::barrier;
  bool invalid_args = false;
  bool inter = false;
  uint64_t bytes = 0;                  ///< config::CallKey::bytes
  const TypeInfo* send_type = nullptr; ///< nullptr: derived (or absent for barrier)
  const TypeInfo* recv_type = nullptr;
  bool counts_match = true;            ///< allgather/alltoall: sendcount == recvcount
  const OpInfo* op = nullptr;          ///< nullptr: user op (only read if takes_op)
  MemKind mem = MemKind::host;
};

Verdict eligibility(const CallFacts& f);

}  // namespace streamcoll
