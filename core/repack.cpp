#include "core/repack.hpp"

#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "base/log.hpp"
#include "core/call_request.hpp"
#include "core/datatypes.hpp"
#include "core/errors.hpp"
#include "core/host_staging.hpp"
#include "core/requests.hpp"
#include "core/stats.hpp"

namespace streamcoll::repack {
namespace {

bool contiguous_basic(MPI_Datatype t) {
  const TypeInfo* info = t == MPI_DATATYPE_NULL ? nullptr : find_type(t);
  return info && is_contiguous_basic(info->cls);
}

int type_size(MPI_Datatype t) {
  int s = 0;
  return PMPI_Type_size(t, &s) == MPI_SUCCESS ? s : 0;
}

// Bytes [lo, hi) that `count` elements of `t` occupy, relative to the buffer's address.
bool span(MPI_Datatype t, int count, int64_t* lo, int64_t* hi) {
  MPI_Aint lb = 0, extent = 0, tlb = 0, textent = 0;
  if (PMPI_Type_get_extent(t, &lb, &extent) != MPI_SUCCESS ||
      PMPI_Type_get_true_extent(t, &tlb, &textent) != MPI_SUCCESS || count <= 0)
    return false;
  const int64_t first = static_cast<int64_t>(tlb), stride = static_cast<int64_t>(extent);
  const int64_t last = stride * (count - 1);
  *lo = first + (last < 0 ? last : 0);
  *hi = first + static_cast<int64_t>(textent) + (last > 0 ? last : 0);
  return *hi > *lo;
}

// One side of the call on this rank: the caller's buffer and description, and its
// contiguous copy.
struct Side {
  void* user = nullptr;  // the caller's buffer (its address, as MPI computes offsets)
  int count = 0;         // elements of `type`
  MPI_Datatype type = MPI_DATATYPE_NULL;
  std::vector<char> packed;  // contiguous, elements of the basic type
};

// Copies `count` elements of `type` at `user` into the contiguous `out` (bytes), through a
// host copy of the span when `user` is GPU memory. MPI_SUCCESS or an error code (raised
// by the caller).
int pack(const void* user, int count, MPI_Datatype type, MPI_Datatype basic, char* out) {
  const int n = static_cast<int>(static_cast<int64_t>(count) * type_size(type) / type_size(basic));
  const void* src = user;
  std::vector<char> host;
  const MemKind kind = host_staging::gpu_backend() ? host_staging::gpu_backend()->classify(user)
                                                   : MemKind::host;
  int64_t lo = 0, hi = 0;
  if ((kind == MemKind::device || kind == MemKind::managed) && span(type, count, &lo, &hi)) {
    host.resize(static_cast<size_t>(hi - lo));
    const host_staging::Copy c{host.data(), static_cast<const char*>(user) + lo,
                               static_cast<uint64_t>(hi - lo), user};
    if (int rc = host_staging::gpu_backend()->copy(&c, 1); rc != MPI_SUCCESS) return rc;
    src = host.data() - lo;
  }
  return PMPI_Sendrecv(src, count, type, 0, 0, out, n, basic, 0, 0, MPI_COMM_SELF,
                       MPI_STATUS_IGNORE);
}

// The reverse: the contiguous `in` into `count` elements of `type` at `user` (a GPU
// buffer's span is read first, so that its holes are written back unchanged).
int unpack(const char* in, void* user, int count, MPI_Datatype type, MPI_Datatype basic) {
  const int n = static_cast<int>(static_cast<int64_t>(count) * type_size(type) / type_size(basic));
  host_staging::Backend* be = host_staging::gpu_backend();
  const MemKind kind = be ? be->classify(user) : MemKind::host;
  int64_t lo = 0, hi = 0;
  if ((kind == MemKind::device || kind == MemKind::managed) && span(type, count, &lo, &hi)) {
    std::vector<char> host(static_cast<size_t>(hi - lo));
    char* gpu = static_cast<char*>(user) + lo;
    host_staging::Copy c{host.data(), gpu, host.size(), user};
    if (int rc = be->copy(&c, 1); rc != MPI_SUCCESS) return rc;
    if (int rc = PMPI_Sendrecv(in, n, basic, 0, 0, host.data() - lo, count, type, 0, 0,
                               MPI_COMM_SELF, MPI_STATUS_IGNORE);
        rc != MPI_SUCCESS)
      return rc;
    c = host_staging::Copy{gpu, host.data(), host.size(), user};
    return be->copy(&c, 1);
  }
  return PMPI_Sendrecv(in, n, basic, 0, 0, user, count, type, 0, 0, MPI_COMM_SELF,
                       MPI_STATUS_IGNORE);
}

// The request the caller gets: completes once the repacked call's request has, after
// unpacking the received data into the caller's buffer.
struct RepackCall {
  MPI_Datatype basic;
  std::unique_ptr<Side> send, recv;
  bool unpack_recv;
  int own;
  MPI_Request inner = MPI_REQUEST_NULL;
  bool done = false;
  ~RepackCall() {
    if (done || inner == MPI_REQUEST_NULL) return;
    if (OwnedRequest* op = requests::peek(inner)) requests::complete_one(op);
    PMPI_Wait(&inner, MPI_STATUS_IGNORE);
  }
};

CallSteps repack_steps(std::shared_ptr<RepackCall> c) {
  CallSteps st;
  st.test = [c](bool* finished) {
    *finished = true;
    if (c->inner == MPI_REQUEST_NULL) return MPI_SUCCESS;
    // The repacked call's request may be streamcoll's own: it advances (and its MPI
    // request completes) on this thread.
    if (OwnedRequest* op = requests::peek(c->inner)) op->advance();
    int flag = 0;
    MPI_Status status;
    const int rc = PMPI_Test(&c->inner, &flag, &status);
    *finished = rc != MPI_SUCCESS || flag;
    return rc;
  };
  st.after = [c](int rc) {
    if (rc == MPI_SUCCESS && c->unpack_recv)
      rc = unpack(c->recv->packed.data(), c->recv->user, c->recv->count, c->recv->type, c->basic);
    if (c->own != MPI_SUCCESS) rc = c->own;
    c->done = true;
    c->send.reset();
    c->recv.reset();
    return rc;
  };
  return st;
}

}  // namespace

MPI_Datatype basic_of(MPI_Datatype t) {
  if (t == MPI_DATATYPE_NULL) return MPI_DATATYPE_NULL;
  int ni = 0, na = 0, nd = 0, combiner = 0;
  if (PMPI_Type_get_envelope(t, &ni, &na, &nd, &combiner) != MPI_SUCCESS)
    return MPI_DATATYPE_NULL;
  if (combiner == MPI_COMBINER_NAMED) {
    if (contiguous_basic(t)) return t;
    // A pair type (MINLOC/MAXLOC) is two named types: its one component when both are
    // alike, bytes otherwise; a named type streamcoll does not know is bytes too.
    if (t == MPI_2INT) return MPI_INT;
    if (t == MPI_2REAL) return MPI_REAL;
    if (t == MPI_2DOUBLE_PRECISION) return MPI_DOUBLE_PRECISION;
    if (t == MPI_2INTEGER) return MPI_INTEGER;
    return MPI_BYTE;
  }
  std::vector<int> ints(static_cast<size_t>(ni) + 1);
  std::vector<MPI_Aint> aints(static_cast<size_t>(na) + 1);
  std::vector<MPI_Datatype> types(static_cast<size_t>(nd) + 1);
  if (PMPI_Type_get_contents(t, ni, na, nd, ints.data(), aints.data(), types.data()) !=
      MPI_SUCCESS)
    return MPI_DATATYPE_NULL;
  MPI_Datatype basic = MPI_DATATYPE_NULL;
  bool first = true;
  for (int i = 0; i < nd; ++i) {
    const MPI_Datatype b = basic_of(types[static_cast<size_t>(i)]);
    if (first) basic = b;
    else if (b != basic) basic = MPI_BYTE;  // several named types: bytes, on every rank
    first = false;
    // get_contents hands out new handles for derived types: free them.
    int ci = 0, ca = 0, cd = 0, cc = 0;
    if (PMPI_Type_get_envelope(types[static_cast<size_t>(i)], &ci, &ca, &cd, &cc) == MPI_SUCCESS &&
        cc != MPI_COMBINER_NAMED)
      PMPI_Type_free(&types[static_cast<size_t>(i)]);
  }
  return basic;
}

bool needed(const CollArgs& a) {
  if (a.nonblocking && a.request == nullptr) return false;
  switch (a.coll) {
    case Coll::bcast:
      return a.count > 0 && !contiguous_basic(a.datatype);
    case Coll::allgather:
    case Coll::alltoall:
      return a.recvcount > 0 && (!contiguous_basic(a.recvtype) ||
                                 (a.sendbuf != MPI_IN_PLACE && !contiguous_basic(a.sendtype)));
    default:
      return false;
  }
}

namespace {

// A call repacked: `b` is `a` on contiguous host copies described with the basic type;
// what to unpack afterwards, and whether reading this rank's input failed (`own`).
struct Plan {
  CollArgs b;
  MPI_Datatype basic = MPI_DATATYPE_NULL;
  std::unique_ptr<Side> send = std::make_unique<Side>(), recv = std::make_unique<Side>();
  bool unpack_recv = true;
  int own = MPI_SUCCESS;
};

// b's datatypes and counts for `a` (no data touched): false where MPI cannot tell the
// basic type (the call then runs as it is, and MPI says what is wrong).
bool describe(const CollArgs& a, CollArgs* b, MPI_Datatype* basic_out, int64_t* block_out) {
  const MPI_Datatype described = a.coll == Coll::bcast ? a.datatype : a.recvtype;
  const MPI_Datatype basic = basic_of(described);
  const int bs = basic == MPI_DATATYPE_NULL ? 0 : type_size(basic);
  if (bs <= 0 || !contiguous_basic(basic)) return false;
  const int64_t block = static_cast<int64_t>(a.coll == Coll::bcast ? a.count : a.recvcount) *
                        type_size(described) / bs;  // basic elements per block
  *b = a;
  b->fortran = nullptr;  // the repacked call is streamcoll's own, on C arguments
  if (a.coll == Coll::bcast) {
    b->count = static_cast<int>(block);
    b->datatype = basic;
  } else {
    b->recvcount = static_cast<int>(block);
    b->recvtype = basic;
    if (a.sendbuf != MPI_IN_PLACE) {
      b->sendcount = static_cast<int>(block);
      b->sendtype = basic;
    }
  }
  *basic_out = basic;
  *block_out = block;
  return true;
}

// The plan for `a` with its data packed; `own`: a failure of this rank's found before
// (taken as a failure to read its input). False where `a` is not repacked (run as it is).
bool make_plan(const CollArgs& a, int own_before, Plan* p) {
  int rank = 0, size = 1;
  PMPI_Comm_rank(a.comm, &rank);
  PMPI_Comm_size(a.comm, &size);
  int64_t block = 0;
  if ((a.coll != Coll::bcast && a.coll != Coll::allgather && a.coll != Coll::alltoall) ||
      !describe(a, &p->b, &p->basic, &block))
    return false;
  const MPI_Datatype described = a.coll == Coll::bcast ? a.datatype : a.recvtype;
  const MPI_Datatype basic = p->basic;
  const int bs = type_size(basic);
  p->own = own_before;
  const int nblocks = a.coll == Coll::bcast ? 1 : size;
  Side& recv = *p->recv;
  Side& send = *p->send;
  recv.user = a.recvbuf;
  recv.count = (a.coll == Coll::bcast ? a.count : a.recvcount) * nblocks;
  recv.type = described;
  recv.packed.assign(static_cast<size_t>(block * nblocks * bs), 0);
  p->b.recvbuf = recv.packed.data();
  const int64_t block_bytes = block * bs;
  int own = MPI_SUCCESS;
  if (a.coll == Coll::bcast) {
    if (rank == a.root) {
      own = pack(a.recvbuf, a.count, a.datatype, basic, recv.packed.data());
      p->unpack_recv = false;  // the root's buffer is its input
    }
  } else if (a.sendbuf == MPI_IN_PLACE) {
    MPI_Aint lb = 0, extent = 0;
    PMPI_Type_get_extent(a.recvtype, &lb, &extent);
    if (a.coll == Coll::allgather) {  // this rank's block, where it lies in recvbuf
      own = pack(static_cast<char*>(a.recvbuf) + static_cast<int64_t>(rank) * a.recvcount * extent,
                 a.recvcount, a.recvtype, basic, recv.packed.data() + rank * block_bytes);
    } else {  // all of recvbuf is the input
      own = pack(a.recvbuf, a.recvcount * size, a.recvtype, basic, recv.packed.data());
    }
  } else {
    const int scount = a.coll == Coll::allgather ? a.sendcount : a.sendcount * size;
    send.count = scount;
    send.type = a.sendtype;
    send.packed.assign(static_cast<size_t>(block_bytes * (a.coll == Coll::allgather ? 1 : size)), 0);
    own = pack(a.sendbuf, scount, a.sendtype, basic, send.packed.data());
    p->b.sendbuf = send.packed.data();
  }
  if (p->own == MPI_SUCCESS) p->own = own;
  if (p->own != MPI_SUCCESS)
    log_error("%s: could not read this rank's input to repack it (its datatype is derived)",
              call_name(a.coll, a.nonblocking).c_str());
  return true;
}

}  // namespace

bool basic_view(const CollArgs& a, CollArgs* view) {
  if (!needed(a)) return false;
  MPI_Datatype basic = MPI_DATATYPE_NULL;
  int64_t block = 0;
  return describe(a, view, &basic, &block);
}

int run(const CollArgs& a, const std::function<int(const CollArgs&)>& inner, int own) {
  Plan p;
  if (!make_plan(a, own, &p)) return inner(a);
  if (p.own != MPI_SUCCESS) log_error("%s: this rank takes part with zeros and reports the error",
                                      call_name(a.coll, true).c_str());
  auto call = std::make_shared<RepackCall>();
  call->basic = p.basic;
  call->send = std::move(p.send);
  call->recv = std::move(p.recv);
  call->unpack_recv = p.unpack_recv;
  call->own = p.own;
  p.b.request = &call->inner;
  const int rc = inner(p.b);
  if (rc != MPI_SUCCESS) {
    // The repacked call failed to start (its route raised the error): nothing to wait for.
    call->inner = MPI_REQUEST_NULL;
    *a.request = MPI_REQUEST_NULL;
    return rc;
  }
  // A failure to read this rank's input is reported when the request completes.
  return start_call_request(repack_steps(std::move(call)), a.request);
}

int run_blocking(const CollArgs& a, const std::function<int(const CollArgs&, int)>& inner,
                 int own) {
  Plan p;
  if (!make_plan(a, own, &p)) return inner(a, own);
  int rc = inner(p.b, p.own);
  if (rc == MPI_SUCCESS && p.own != MPI_SUCCESS) rc = p.own;  // a route that took no notice
  if (rc == MPI_SUCCESS && p.unpack_recv) {
    rc = unpack(p.recv->packed.data(), p.recv->user, p.recv->count, p.recv->type, p.basic);
    if (rc != MPI_SUCCESS)
      log_error("%s: could not write the repacked result into this rank's buffer",
                call_name(a.coll, false).c_str());
  }
  return rc;
}

}  // namespace streamcoll::repack
