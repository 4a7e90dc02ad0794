// The steady path: a blocking call that repeats the full decision of the earlier call with
// the same arguments, without deciding again.
//
// A CUDA program makes the same small host collectives over and over (a loss scalar, a
// norm, a time step's minimum, a convergence flag). Once the full path (shim/dispatch.cpp)
// has decided such a call from agreed facts that every rank passed host memory and chose
// the MPI's own collective (route pmpi), its next calls with the same arguments decide the
// same until the signature's next refresh starts or is adopted
// (SignatureAgreements::steady_call): nothing they would decide from can have changed in
// between. Such a call then costs one lookup of the remembered decision, a look at this
// rank's buffers, the signature's count, and the MPI's call; no table walk, no heap
// allocation, no trace object (none is on in a process that remembers), no agreement.
//
// What is remembered, per thread, and keyed by every argument but the buffers (the
// communicator, collective, counts, predefined datatypes, predefined op, root, in-place):
// the communicator's context, the signature's agreements, and which of this rank's
// buffers the call reads or writes. Stale entries are never used: remembered_generation
// (core/comm_context.hpp) changes when a context goes, a context drops its signatures,
// forced routes, asserted kinds or the table change, and at MPI_Finalize.
//
// Why each rank may take it alone: the steady path counts the call in its signature as
// the full path would (begin_call), adopts nothing and starts nothing (the full path would
// not either, by steady_call), and leaves the same agreed facts for the communicator's
// non-blocking calls; a rank whose call does not qualify (a GPU buffer, a null buffer)
// takes the full path, which decides the same from the same facts. Remembered only in a
// process whose checks, NVTX, timeline and info log are off (they see every call; with
// statistics on, the calls are recorded as on the full path), and only where the MPI's
// call needs nothing of streamcoll's: on an MPI that is not CUDA-aware, only where the
// agreed facts say host memory on every rank (otherwise the call exchanges staging
// outcomes: core/host_staging.hpp).
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "core/agreement.hpp"
#include "core/coll_args.hpp"
#include "core/comm_context.hpp"
#include "core/cuda_driver.hpp"

namespace streamcoll::steady {

/// Which of this rank's buffers a remembered call reads or writes (bit per buffer).
enum Buffers : unsigned { kSend = 1u, kRecv = 2u };

/// Every argument of a blocking call that its decision rests on, but the buffers. (Whole
/// words only: the collective, root and in-place flag packed into one, so that a key built
/// in registers compares without narrow stores read back wide.)
struct Key {
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Datatype stype = MPI_DATATYPE_NULL, rtype = MPI_DATATYPE_NULL;
  MPI_Op op = MPI_OP_NULL;
  int64_t scount = 0, rcount = 0;
  uint64_t what = 0;  ///< root << 32 | collective << 1 | in-place
  bool operator==(const Key& o) const {
    return comm == o.comm && rcount == o.rcount && what == o.what && rtype == o.rtype &&
           scount == o.scount && stype == o.stype && op == o.op;
  }
};

inline uint64_t what_of(Coll c, int root, bool in_place) {
  return static_cast<uint64_t>(static_cast<uint32_t>(root)) << 32 |
         static_cast<uint64_t>(c) << 1 | uint64_t{in_place};
}
/// The key of a reduction, bcast or rooted call (root: reduce and bcast only, else 0; op:
/// MPI_OP_NULL for bcast).
inline Key reduction_key(Coll c, MPI_Comm comm, int count, MPI_Datatype t, MPI_Op op, int root,
                         const void* sendbuf) {
  Key k;
  k.comm = comm;
  k.stype = k.rtype = t;
  k.op = op;
  k.scount = k.rcount = count;
  k.what = what_of(c, root, sendbuf == MPI_IN_PLACE);
  return k;
}
/// The key of an allgather or alltoall (sendcount and sendtype mean nothing in place).
inline Key gather_key(Coll c, MPI_Comm comm, const void* sendbuf, int sendcount,
                      MPI_Datatype sendtype, int recvcount, MPI_Datatype recvtype) {
  Key k;
  k.comm = comm;
  const bool in_place = sendbuf == MPI_IN_PLACE;
  if (!in_place) {
    k.stype = sendtype;
    k.scount = sendcount;
  }
  k.rtype = recvtype;
  k.rcount = recvcount;
  k.what = what_of(c, 0, in_place);
  return k;
}

/// What is remembered for a key: what a hit reads, in two cache lines.
struct alignas(64) Entry {
  Key key;
  SignatureAgreements* sig = nullptr;  ///< null: nothing remembered
  uint64_t generation = 0;             ///< remembered_generation() when remembered
  CommContext* ctx = nullptr;
  std::atomic<int>* late = nullptr;    ///< ctx->async_error (held by the context)
  unsigned buffers = 0;                ///< of Buffers
  bool fused = false;                  ///< ctx->fusion (made before any call is remembered)
  /// Statistics are on (STREAMCOLL_STATS): the call is timed and recorded as the full
  /// path records it (call() only: the wrappers' inline path leaves it to dispatch()).
  bool stats = false;
  uint64_t bytes = 0;                          ///< the call's size, for the statistics
  const config::RouteChoice* choice = nullptr;  ///< the rule that chose pmpi (its parameters)
};

constexpr unsigned kEntries = 16;  ///< per thread: a time step's distinct small calls
struct Table {
  uint64_t calls = 0;  ///< taken on the steady path by this thread (streamcoll_steady_calls)
  Entry entries[kEntries];
};

/// The calling thread's table, made by its first remembered call (null before: one load
/// and a branch for a thread that never remembered). Initial-exec TLS: no
/// __tls_get_addr call on the steady path.
extern thread_local Table* t_table __attribute__((tls_model("initial-exec")));

namespace detail {
template <class H>
uint64_t bits(H h) {  // a handle's bits (Open MPI's handles are pointers, MPICH's ints)
  if constexpr (std::is_pointer_v<H>) return reinterpret_cast<uintptr_t>(h) >> 3;
  else return static_cast<uint64_t>(static_cast<uint32_t>(h));
}
// This rank's buffer `p` is host memory: the heap inline, the stack and other memory
// through cuda::classify_buffer. A GPU buffer, pinned memory (a capture or staging may
// want it) and a null buffer with data (MPI_ERR_BUFFER) are the full path's.
inline bool host(const void* p) {
  return p != nullptr &&
         (cuda::in_heap(p) || cuda::classify_buffer(p, nullptr) == MemKind::host);
}
void poke_fusion(CommContext& ctx);
}  // namespace detail

/// The entry of `t` that `k` maps to (direct-mapped: the top bits of a multiplicative
/// hash of the communicator, the receive count and type and the collective).
inline Entry& slot(Table& t, const Key& k) {
  static_assert(kEntries == 16, "four bits of the hash");
  const uint64_t h = (detail::bits(k.comm) + detail::bits(k.rtype) +
                      static_cast<uint64_t>(k.rcount) + k.what) * 0x9E3779B97F4A7C15ull;
  return t.entries[h >> 60];
}

/// The entry whose decision the blocking call with key `k` and buffers `sendbuf`,
/// `recvbuf` may repeat: remembered for `k`, nothing it rests on changed since, this
/// rank's significant buffers in host memory, and nothing on the communicator for the
/// call to report afterwards (an earlier stream-ordered failure, route work to finish:
/// the full path reports those after its call). Null otherwise. Changes nothing.
/// The entry remembered for `k` in the thread's table (*table) whose decision stands, or
/// null: nothing it rests on changed since (the communicator is the one it was made on;
/// THE RULE's facts: the table, the forced routes, the asserted kinds, the signature's
/// agreements still held).
inline Entry* remembered(const Key& k, Table** table) {
  Table* t = *table = t_table;
  if (!t) return nullptr;
  Entry& e = slot(*t, k);
  if (!e.sig || !(e.key == k) || e.generation != remembered_generation()) return nullptr;
  return &e;
}

inline Entry* find(const Key& k, const void* sendbuf, const void* recvbuf) {
  Table* t;
  Entry* found = remembered(k, &t);
  if (!found) return nullptr;
  Entry& e = *found;
  // This rank's buffers: the full path takes anything but host memory.
  if ((e.buffers & kSend) && !detail::host(sendbuf)) return nullptr;
  if ((e.buffers & kRecv) && !detail::host(recvbuf)) return nullptr;
  // (A failure found while the MPI's call runs is reported at a later call, as on the
  // full path when it is found after the call.)
  if (e.ctx->polls.load(std::memory_order_relaxed) ||
      e.late->load(std::memory_order_relaxed) != MPI_SUCCESS)
    return nullptr;
  return &e;
}

/// Takes the call on the steady path with `e` (from find()): counts it in its signature,
/// leaves the agreed facts for the communicator's non-blocking calls as the full path
/// does, closes the communicator's fused group; true, and the caller makes the MPI's
/// call. False, having changed nothing, where the call starts or adopts a refresh (the
/// full path then does, on every rank alike).
inline bool take(Entry& e, const Key& k) {
  // The n-th call of the signature, counted as the full path counts it.
  if (!e.sig->steady_call()) return false;
  ++t_table->calls;
  CommContext& ctx = *e.ctx;
  // The facts the communicator's non-blocking calls are routed from, as the full path
  // leaves them (another signature's blocking call may have set others since).
  if (ctx.agreed_by != e.sig) {
    const AgreedFacts& facts = e.sig->facts();
    ctx.agreed[k.what >> 1 & 0xff] = facts;
    ctx.agreed_last = facts;
    ctx.agreed_by = e.sig;
  }
  // Fused MPI_Iallreduce calls open on the communicator close their group before this
  // call may block (the application may wait for them inside it), as on the full path.
  if (e.fused) detail::poke_fusion(ctx);
  return true;
}

/// The steady path of the C wrappers, with their collective known at compile time: find()
/// and take(), true when the caller is to make the MPI's call and return its result.
/// (With statistics on, false: dispatch() takes it, through call(), which records it.)
inline bool enter(const Key& k, const void* sendbuf, const void* recvbuf) {
  Entry* e = find(k, sendbuf, recvbuf);
  return e && !e->stats && take(*e, k);
}

/// enter() where it needs no call at all (so that a wrapper's hit makes no function call
/// but the MPI's, as a tail call, and saves no registers): heap buffers (the inline check),
/// the agreed facts already in place, no fusion group to close, statistics off. False
/// otherwise, having changed nothing: the caller tries enter() (out of line), then the
/// full path.
inline bool hit(const Key& k, const void* sendbuf, const void* recvbuf) {
  Table* t;
  Entry* found = remembered(k, &t);
  if (!found) return false;
  Entry& e = *found;
  if ((e.buffers & kSend) && !cuda::in_heap(sendbuf)) return false;
  if ((e.buffers & kRecv) && !cuda::in_heap(recvbuf)) return false;
  if (e.fused || e.stats || e.ctx->agreed_by != e.sig ||
      e.ctx->polls.load(std::memory_order_relaxed) ||
      e.late->load(std::memory_order_relaxed) != MPI_SUCCESS || !e.sig->steady_call())
    return false;
  ++t->calls;
  return true;
}

/// The whole steady path for the blocking call `a`, of any collective it takes (the C
/// wrappers of the common ones use enter() with their collective known at compile time,
/// and make the MPI's call themselves; the Fortran wrappers and the rest come through
/// dispatch()): true when it ran, *rc the call's result. False, having changed nothing,
/// otherwise. Thread-safe as the call itself is (the table is the calling thread's).
bool call(const CollArgs& a, int* rc);

/// What the full path decided for a blocking call that the steady path may repeat.
struct Decided {
  CommContext* ctx = nullptr;
  SignatureAgreements* sig = nullptr;  ///< the agreements (on ctx) it decided from
  unsigned buffers = 0;                ///< the significant buffers on this rank, of Buffers
  uint64_t bytes = 0;                  ///< its size (CallKey convention)
  const config::RouteChoice* choice = nullptr;  ///< the rule that chose pmpi, if any
};
/// After the full path decided the blocking call `a` to pmpi from facts its signature's
/// agreements hold, in a way the steady path may repeat: remembers `d`. With d.ctx null:
/// forgets what was remembered for `a`'s arguments. Calls the steady path cannot take
/// (non-blocking, v-variants, derived datatypes, user ops) are ignored.
void remember(const CollArgs& a, const Decided& d);

/// Whether this process may remember decisions at all: STREAMCOLL_CHECK, NVTX, the
/// timeline and info logging are off (all fixed when the runtime starts; they see every
/// call). Statistics may be on: call() records the calls it takes.
bool allowed();

/// Calls taken on the steady path by the calling thread, and by the threads that have
/// exited (streamcoll_steady_calls). Thread-safe.
uint64_t calls();

}  // namespace streamcoll::steady
