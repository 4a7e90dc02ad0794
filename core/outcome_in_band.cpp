// The staging outcome carried in band (core/outcome_in_band.hpp).
#include "core/outcome_in_band.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "base/log.hpp"
#include "core/errors.hpp"
#include "core/stats.hpp"

namespace streamcoll::host_staging {

namespace {

// ---- The staging outcome in band (small blocking allreduce, reduce, bcast, allgather) ----
//
// A blocking MPI_Allreduce or MPI_Reduce of a small message carries the ranks' staging
// outcomes in its own message instead of a separate allreduce before it: one more
// element, this rank's
// flag, written as the value that the call's op leaves unchanged when no rank failed
// (SUM, MAX, BOR, LOR: 0 when fine, 1 when lost; PROD, MIN, BAND, LAND: 1 when fine, 0
// when lost), so the reduced flag equals the "fine" value only if every rank's staging
// succeeded. The result goes to the caller's buffer only then; otherwise every rank that
// gets a result (a reduce's root) reports an error, as after the exchange. Exact: 0 and 1 and their sums up to 2^24
// ranks are exact in every type taken (integers of 4 and 8 bytes, IEEE float and
// double). Equal on every rank whether a call takes it (the call's count, datatype and op,
// and kInBandMax), so all ranks pass count + 1 alike.

constexpr uint64_t kInBandMax = 64 * 1024;  // bytes: above, the exchange costs little

// The flag's "fine" value for `op` (0 or 1), or -1 where the call cannot carry it.
int in_band_fine(const CollArgs& a, const TypeInfo** type) {
  // Not from the language binding: ranks may call one collective from different ones, and
  // every rank must give the call the same form (a Fortran call goes in band through the C
  // binding, on the C handles the shim converted, its buffers staged as a C call's).
  if ((a.coll != Coll::allreduce && a.coll != Coll::reduce) || a.nonblocking || a.count < 0 ||
      a.count >= INT32_MAX)
    return -1;
  const TypeInfo* t = find_type(a.datatype);
  const OpInfo* op = find_op(a.op);
  if (!t || !op || !op_defined_for(op->kind, t->cls)) return -1;
  const Numeric n = numeric(*t);
  const bool integer = (n == Numeric::signed_int || n == Numeric::unsigned_int) &&
                       (t->size == 4 || t->size == 8);
  const bool floating = n == Numeric::ieee_float && (t->size == 4 || t->size == 8);
  if (!integer && !floating) return -1;
  if (static_cast<uint64_t>(a.count) * static_cast<uint64_t>(t->size) > kInBandMax) return -1;
  *type = t;
  switch (op->kind) {
    case OpKind::sum: case OpKind::max: case OpKind::bor: case OpKind::lor: return 0;
    case OpKind::prod: case OpKind::min: case OpKind::band: case OpKind::land: return 1;
    default: return -1;  // XOR (failures cancel), MAXLOC/MINLOC (pairs)
  }
}

void put_flag(char* p, const TypeInfo& t, int v) {
  if (numeric(t) == Numeric::ieee_float) {
    if (t.size == 4) { const float f = static_cast<float>(v); std::memcpy(p, &f, 4); }
    else { const double d = v; std::memcpy(p, &d, 8); }
  } else if (t.size == 4) {
    const int32_t i = v;
    std::memcpy(p, &i, 4);
  } else {
    const int64_t i = v;
    std::memcpy(p, &i, 8);
  }
}

bool flag_is(const char* p, const TypeInfo& t, int v) {
  if (numeric(t) == Numeric::ieee_float) {
    if (t.size == 4) { float f; std::memcpy(&f, p, 4); return f == static_cast<float>(v); }
    double d;
    std::memcpy(&d, p, 8);
    return d == v;
  }
  if (t.size == 4) { int32_t i; std::memcpy(&i, p, 4); return i == v; }
  int64_t i;
  std::memcpy(&i, p, 8);
  return i == v;
}

// The blocking allreduce or reduce `b` (its buffers in host memory, staged or the
// caller's; or, where `readable` is false, not to be read: this rank's input is lost
// anyway) with the outcome in band; `rank` is this rank (a reduce's root gets the result).
// Returns MPI_SUCCESS with the result in b.recvbuf, the MPI's error, or (raised here) this
// rank's own failure or a peer's.
int reduction_in_band(const CollArgs& a, const CollArgs& b, const TypeInfo& t, int fine,
                      int own, bool readable, int rank) {
  const size_t n = static_cast<size_t>(b.count), es = static_cast<size_t>(t.size);
  // The message, in buffers each thread keeps (at most kInBandMax + 8 bytes): no
  // allocation per call. A reduce's result goes to the second (no MPI_IN_PLACE: MPICH 4.0
  // crashes on it at a root other than 0, pmodels/mpich#6540).
  thread_local std::vector<char> buffer, result;
  const bool reduce = b.coll == Coll::reduce, root = reduce && rank == b.root;
  if (buffer.size() < (n + 1) * es) buffer.resize((n + 1) * es);
  if (root && result.size() < (n + 1) * es) result.resize((n + 1) * es);
  char* msg = buffer.data();
  const void* in = b.sendbuf == MPI_IN_PLACE ? b.recvbuf : b.sendbuf;
  if (reduce && !root && b.sendbuf == MPI_IN_PLACE && own == MPI_SUCCESS) {
    // Erroneous (MPI_IN_PLACE is the root's alone): this rank takes part, flagged, and
    // reports Open MPI's class for it (MPICH 4.0 crashes); the root reports a peer's failure.
    log_error("MPI_Reduce: MPI_IN_PLACE at a rank other than the root");
    own = MPI_ERR_ARG;
  }
  if (readable && own == MPI_SUCCESS && n > 0) std::memcpy(msg, in, n * es);
  else std::memset(msg, 0, n * es);  // (a lost input: any value, flagged)
  put_flag(msg + n * es, t, own == MPI_SUCCESS ? fine : 1 - fine);
  const int count = static_cast<int>(n + 1);
  const int rc = reduce ? PMPI_Reduce(msg, root ? result.data() : nullptr, count, b.datatype,
                                      b.op, b.root, b.comm)
                        : PMPI_Allreduce(MPI_IN_PLACE, msg, count, b.datatype, b.op, b.comm);
  if (rc != MPI_SUCCESS) return rc;  // the MPI raised it
  if (own != MPI_SUCCESS) return call_errhandler(a.comm, own);
  if (reduce && !root) return MPI_SUCCESS;  // no result here
  if (root) msg = result.data();
  if (!flag_is(msg + n * es, t, fine)) {
    log_error("%s: another rank could not stage its GPU buffers; the result is not used",
              call_name(a.coll, false).c_str());
    return call_errhandler(a.comm, error_code(Failure::peer));
  }
  if (n > 0) std::memcpy(b.recvbuf, msg, n * es);
  return MPI_SUCCESS;
}

// A blocking MPI_Bcast or MPI_Allgather of at most kInBandMax bytes (all blocks together)
// carries the outcomes in band too: its data as bytes and one flag byte per block (0: the
// input is there, 1: lost), sent as MPI_BYTE: the root's for a bcast (only the root's input
// reaches the others; a rank that fails to stage its result reports that itself), every
// rank's for an allgather. The form depends on the call's size alone, equal on every rank
// (MPI makes the type signatures match), never on how a rank describes its data: a
// predefined type's elements are copied as they are, a derived type's packed with
// PMPI_Pack (whose output on a homogeneous system is the data's bytes; a rank whose packed
// size differs takes part, flags its input lost and fails).

// The bytes of one block (a bcast's message, an allgather's per rank) where the call
// carries its outcomes this way, else 0.
uint64_t bytes_in_band(const CollArgs& a, int size) {
  if (a.nonblocking || (a.coll != Coll::bcast && a.coll != Coll::allgather)) return 0;
  const bool bcast = a.coll == Coll::bcast;
  const int count = bcast ? a.count : a.recvcount;
  const MPI_Datatype type = bcast ? a.datatype : a.recvtype;
  int ts = 0;
  if (count <= 0 || type == MPI_DATATYPE_NULL || PMPI_Type_size(type, &ts) != MPI_SUCCESS ||
      ts <= 0)
    return 0;
  const uint64_t block = static_cast<uint64_t>(count) * static_cast<uint64_t>(ts);
  return (block + 1) * static_cast<uint64_t>(bcast ? 1 : size) <= kInBandMax ? block : 0;
}

// `count` elements of `type` at `p` as their `bytes` bytes at `out`; false when they are not
// (a packed size that differs, a failed pack).
// A predefined contiguous type: its elements are their bytes.
bool raw_bytes(MPI_Datatype type) {
  const TypeInfo* info = find_type(type);
  return info && is_contiguous_basic(info->cls);
}

bool to_bytes(const void* p, int count, MPI_Datatype type, MPI_Comm comm, char* out,
              uint64_t bytes) {
  if (raw_bytes(type)) {
    std::memcpy(out, p, bytes);
    return true;
  }
  int packed = 0, position = 0;
  return PMPI_Pack_size(count, type, comm, &packed) == MPI_SUCCESS &&
         static_cast<uint64_t>(packed) == bytes &&
         PMPI_Pack(p, count, type, out, packed, &position, comm) == MPI_SUCCESS &&
         static_cast<uint64_t>(position) == bytes;
}

// The reverse: `bytes` bytes at `in` into `count` elements of `type` at `p`.
bool from_bytes(const char* in, uint64_t bytes, void* p, int count, MPI_Datatype type,
                MPI_Comm comm) {
  if (raw_bytes(type)) {
    std::memcpy(p, in, bytes);
    return true;
  }
  int position = 0;
  const int n = static_cast<int>(bytes);
  return PMPI_Unpack(in, n, &position, p, count, type, comm) == MPI_SUCCESS && position == n;
}

// The blocking bcast or allgather `b` (its buffers in host memory, staged or the caller's;
// where `readable` is false, this rank's input not to be read) of `block` bytes per block
// with the outcomes in band. MPI_SUCCESS with the data in b.recvbuf, the MPI's error, or
// (raised here) this rank's own failure or another's.
int data_in_band(const CollArgs& a, const CollArgs& b, uint64_t block, int own, bool readable,
                 int rank, int size) {
  const bool bcast = b.coll == Coll::bcast;
  const uint64_t stride = block + 1;
  const int blocks = bcast ? 1 : size;
  // Per thread, at most kInBandMax bytes each: no allocation per call.
  thread_local std::vector<char> mine, all;
  if (mine.size() < stride) mine.resize(stride);
  if (all.size() < stride * blocks) all.resize(stride * blocks);
  MPI_Aint lb = 0, extent = 0;  // an allgather's receive blocks' stride, in recvtype's extent
  if (!bcast) PMPI_Type_get_extent(b.recvtype, &lb, &extent);
  if (!bcast || rank == b.root) {  // this rank's input, flagged
    const void* in = bcast ? b.recvbuf : b.sendbuf;
    int count = bcast ? b.count : b.sendcount;
    MPI_Datatype type = bcast ? b.datatype : b.sendtype;
    if (!bcast && b.sendbuf == MPI_IN_PLACE) {  // this rank's block of recvbuf
      in = static_cast<const char*>(b.recvbuf) + static_cast<int64_t>(rank) * b.recvcount * extent;
      count = b.recvcount;
      type = b.recvtype;
    }
    char* out = bcast ? all.data() : mine.data();
    bool lost = own != MPI_SUCCESS || !readable;
    if (!lost && !to_bytes(in, count, type, b.comm, out, block)) {
      log_error("%s: this rank's data does not pack into the call's %llu bytes",
                call_name(a.coll, false).c_str(), static_cast<unsigned long long>(block));
      if (own == MPI_SUCCESS) own = MPI_ERR_TYPE;
      lost = true;
    }
    if (lost) std::memset(out, 0, block);
    out[block] = lost ? 1 : 0;
  }
  const int n = static_cast<int>(stride);
  const int rc = bcast ? PMPI_Bcast(all.data(), n, MPI_BYTE, b.root, b.comm)
                       : PMPI_Allgather(mine.data(), n, MPI_BYTE, all.data(), n, MPI_BYTE, b.comm);
  if (rc != MPI_SUCCESS) return rc;  // the MPI raised it
  if (own != MPI_SUCCESS) return call_errhandler(a.comm, own);
  for (int q = 0; q < blocks; ++q)
    if (all[q * stride + block] != 0) {
      log_error("%s: %s could not stage its GPU buffers; the data is not used",
                call_name(a.coll, false).c_str(), bcast ? "the root" : "another rank");
      return call_errhandler(a.comm, error_code(Failure::peer));
    }
  if (bcast && rank == b.root) return MPI_SUCCESS;
  for (int q = 0; q < blocks; ++q) {
    if (!bcast && q == rank && b.sendbuf == MPI_IN_PLACE) continue;  // its input, as it was
    void* at_q = bcast ? b.recvbuf
                       : static_cast<char*>(b.recvbuf) + static_cast<int64_t>(q) * b.recvcount * extent;
    if (!from_bytes(all.data() + q * stride, block, at_q, bcast ? b.count : b.recvcount,
                    bcast ? b.datatype : b.recvtype, b.comm)) {
      log_error("%s: %llu bytes do not unpack into this rank's datatype",
                call_name(a.coll, false).c_str(), static_cast<unsigned long long>(block));
      return call_errhandler(a.comm, MPI_ERR_TYPE);
    }
  }
  return MPI_SUCCESS;
}

}  // namespace

InBand in_band_form(const CollArgs& a, int size) {
  InBand f;
  if (a.nonblocking) return f;
  f.fine = in_band_fine(a, &f.type);
  if (f.fine < 0) f.block = bytes_in_band(a, size);
  return f;
}
int call_in_band(const InBand& f, const CollArgs& a, const CollArgs& b, int own, bool readable,
                 int rank, int size) {
  return f.fine >= 0 ? reduction_in_band(a, b, *f.type, f.fine, own, readable, rank)
                     : data_in_band(a, b, f.block, own, readable, rank, size);
}

bool host_in_band(const CollArgs& a, int own, const KnownKinds* known, int* rc) {
  if (a.nonblocking || !known || known->n == 0 ||
      !std::all_of(known->kind, known->kind + known->n,
                   [](MemKind k) { return k == MemKind::host || k == MemKind::pinned; }))
    return false;
  int rank = 0, size = 1;  // (an allreduce needs neither)
  if (a.coll != Coll::allreduce &&
      (PMPI_Comm_rank(a.comm, &rank) != MPI_SUCCESS || PMPI_Comm_size(a.comm, &size) != MPI_SUCCESS))
    return false;
  const InBand f = in_band_form(a, size);
  if (!f.taken()) return false;
  *rc = call_in_band(f, a, a, own, true, rank, size);
  return true;
}

}  // namespace streamcoll::host_staging
