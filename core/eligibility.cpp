#include "core/eligibility.hpp"

#include "core/coll_args.hpp"

namespace streamcoll {

const char* describe(Verdict v) {
  switch (v) {
    case Verdict::eligible: return "eligible";
    case Verdict::invalid_args: return "invalid arguments (MPI reports the error)";
    case Verdict::inter_comm: return "inter-communicator";
    case Verdict::empty: return "no data";
    case Verdict::derived_type: return "derived or non-contiguous datatype";
    case Verdict::type_mismatch: return "send and receive type signatures differ";
    case Verdict::user_op: return "user-defined op";
    case Verdict::op_not_defined: return "op not defined for this datatype";
    case Verdict::mixed_memory: return "buffers in different memory kinds";
  }
  return "?";
}

Verdict eligibility(const CallFacts& f) {
  if (f.invalid_args) return Verdict::invalid_args;
  if (f.inter) return Verdict::inter_comm;
  if (f.coll == Coll::barrier) return Verdict::eligible;
  if (f.bytes == 0) return Verdict::empty;
  if (!f.send_type || !f.recv_type || !is_contiguous_basic(f.send_type->cls) ||
      !is_contiguous_basic(f.recv_type->cls))
    return Verdict::derived_type;
  if (f.send_type != f.recv_type || !f.counts_match) return Verdict::type_mismatch;
  if (takes_op(f.coll)) {
    if (!f.op) return Verdict::user_op;
    if (!op_defined_for(f.op->kind, f.send_type->cls)) return Verdict::op_not_defined;
  }
  if (f.mem == MemKind::mixed) return Verdict::mixed_memory;
  return Verdict::eligible;
}

}  // namespace streamcoll
