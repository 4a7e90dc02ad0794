// Host collective algorithms as schedules: for one rank, the rounds of point-to-point
// messages and local reductions that carry out a collective. Pure (no MPI calls), so
// every algorithm is unit-tested for any rank count by simulating all ranks at once
// (tests/unit/test_schedule.cpp); algorithms/schedule_exec runs a schedule on PMPI_
// point-to-point, blocking or one non-blocking step() at a time.
//
// Algorithms (R. Thakur, R. Rabenseifner, W. Gropp, "Optimization of Collective
// Communication Operations in MPICH", IJHPCA 19(1), 2005, sections 3 and 4), with p
// ranks, n bytes per rank, latency α, time per byte β, reduction time per byte γ:
//   allreduce  rd            recursive doubling              lg p·α + n·lg p·(β+γ)
//              rabenseifner  recursive halving reduce-scatter, recursive doubling
//                            all-gather                      2 lg p·α + 2n(p-1)/p·β + n(p-1)/p·γ
//              ring          ring reduce-scatter + ring all-gather
//                                                            2(p-1)·α + 2n(p-1)/p·β + n(p-1)/p·γ
//   reduce     rd            binomial tree                   lg p·(α + nβ + nγ)
//              rabenseifner  recursive halving reduce-scatter + binomial gather to root
//              ring          ring reduce-scatter + gather to root
//   bcast      rd            binomial tree                   lg p·(α + nβ)
//              rabenseifner  binomial scatter + recursive doubling all-gather (van de Geijn)
//              ring          binomial scatter + ring all-gather
//   allgather  rd            recursive doubling (p a power of two), Bruck otherwise
//              rabenseifner  as rd
//              ring          ring                            (p-1)·α + n(p-1)/p·β
//              ccube         C-Cube's overlapped pipelined tree (see ccube_tree)
//                            (2h + c - 1)·(α + 3(n/c)·β + 2(n/c)·γ), h the tree's height,
//                            c the chunks (allreduce only: route ht gives the others
//                            default_algo's choice, build() rd)
//   reduce_scatter_block
//              rd            recursive halving               lg p·α + n(p-1)/p·(β+γ)
//              rabenseifner  as rd
//              ring          ring                            (p-1)·α + n(p-1)/p·(β+γ)
// Rank counts that are not a power of two use the paper's pre- and post-steps where the
// algorithm needs them (with p' the largest power of two below p and r = p - p': the
// first 2r ranks pair up, the even one hands its data to the odd one and sits out, and
// gets the result back at the end).
//
// Results are the same bit for bit on every rank (allreduce, allgather, bcast): every
// element's reduction is done in one order by one rank, or by partners who combine the
// same two operands (predefined MPI ops are commutative).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "base/types.hpp"

namespace streamcoll::bc {
struct Stage;
}

namespace streamcoll::sched {

/// A host algorithm, as named by the tuning table's `algo=` parameter of route ht.
enum class Algo : uint8_t { rd, rabenseifner, ring, mpi, ccube };
std::string_view name(Algo a);

/// The buffers a schedule addresses, in elements of the call's datatype.
///   send  the caller's send buffer (read only; never used when the call is in place)
///   recv  the caller's receive buffer (bcast: the buffer; reduce: root only)
///   tmp   scratch of Schedule::tmp_elems elements, owned by the executor
enum class Buf : uint8_t { send, recv, tmp };

struct Op {
  enum class Kind : uint8_t {
    send,    ///< send count elements of buf[off..] to peer
    recv,    ///< receive count elements from peer into buf[off..]
    reduce,  ///< buf[off+i] = src[src_off+i] (op) buf[off+i]  (MPI_Reduce_local order)
    copy,    ///< buf[off+i] = src[src_off+i]
  };
  Kind kind;
  Buf buf;
  Buf src = Buf::tmp;  ///< reduce/copy only
  int peer = -1;       ///< send/recv only: rank in the communicator
  uint64_t off = 0;
  uint64_t src_off = 0;
  uint64_t count = 0;  ///< elements; never 0 in a built schedule
};

/// Rounds of operations. Round i is ops[rounds[i] .. rounds[i+1]) (the last one ends at
/// ops.size()). A round posts all its sends and receives at once; when all of them have
/// completed, it runs its reduce and copy operations in order. A buffer region is never
/// sent in the same round as it is received into. Messages between two ranks are posted
/// in the same order on both sides (MPI's non-overtaking rule matches them).
struct Schedule {
  std::vector<Op> ops;
  std::vector<uint32_t> rounds;
  uint64_t tmp_elems = 0;

  size_t num_rounds() const { return rounds.size(); }
  /// [first, last) of round i in ops.
  uint32_t round_begin(size_t i) const { return rounds[i]; }
  uint32_t round_end(size_t i) const {
    return i + 1 < rounds.size() ? rounds[i + 1] : static_cast<uint32_t>(ops.size());
  }
};

/// What to schedule. Counts are elements of the call's datatype:
///   allreduce, reduce, bcast:  count = the whole vector
///   allgather:                 count = elements each rank contributes
///   reduce_scatter_block:      count = elements each rank receives
/// in_place: the call passed MPI_IN_PLACE (allreduce: data in recv; reduce: at the root,
/// data in recv, and ignored on other ranks, which read send as MPI has them do;
/// allgather: this rank's contribution at recv[rank*count]; reduce_scatter_block: the
/// size*count input in recv, the result left in recv[0..count) and the rest of recv left
/// as it was; bcast: ignored). A schedule writes recv only where the call's result goes.
struct Params {
  Coll coll = Coll::allreduce;
  Algo algo = Algo::rd;
  int rank = 0;
  int size = 1;
  int root = 0;
  uint64_t count = 0;
  bool in_place = false;
  /// ccube: elements per chunk (0, or >= count: one chunk, the unpipelined tree).
  uint64_t chunk = 0;
  /// ccube: the node of every rank (any integers; equal values share a node; size()
  /// == size), for the tree's mapping; null or another size: all ranks on one node.
  const std::vector<int>* node_of = nullptr;
};

/// The tree of the ccube algorithm (C-Cube's logical tree mapped onto the physical
/// topology): the ranks of each node in a binary tree under the node's leader (the
/// root on the root's node, else its lowest rank), and the leaders in a binary tree over
/// the nodes (the root's node first, then in the order of their lowest ranks), so every
/// node has one tree edge towards the root and at most two away from it across nodes.
/// A leader has at most four children (two on its node, two leaders).
struct Tree {
  std::vector<int> parent;                 ///< -1 at the root
  std::vector<int> depth;                  ///< 0 at the root
  std::vector<std::vector<int>> children;  ///< in rank order of the heap layout
  int height = 0;                          ///< the largest depth
};
Tree ccube_tree(int size, int root, const std::vector<int>* node_of);

/// True for the collectives this file schedules (allreduce, reduce, bcast, allgather,
/// reduce_scatter_block) with an algorithm other than `mpi`.
bool schedulable(Coll c);

/// The schedule for one rank. Requires schedulable(p.coll), p.algo != Algo::mpi,
/// 0 <= rank < size, 0 <= root < size. A call with no data (count 0) gets an empty
/// schedule.
Schedule build(const Params& p);

/// The algorithm used when the table names none: latency-bound sizes get recursive
/// doubling (binomial trees), large ones Rabenseifner's (allreduce, reduce) or the ring
/// (allgather, bcast, reduce_scatter_block), with MPICH's crossover points.
/// `bytes` as config::CallKey::bytes.
Algo default_algo(Coll c, uint64_t bytes, int size);

/// One stage of a hierarchical collective (BlueConnect, algorithms/blueconnect_plan.hpp)
/// for one rank: the group st.ranks reduce-scatters the segment of the vector at recv
/// (element offsets as in the stage, absolute) so that this rank ends with block st.me
/// reduced over the group, in recv; recursive halving (halving_doubling, group size a
/// power of two) or the ring. With from_send the rank's own contribution is read from
/// send (same offsets) instead of recv, which holds no input yet. Blocks of other ranks
/// in recv are left with partial results.
/// Cost with m = group size, N = segment bytes: lg m·α + N(m-1)/m·(β+γ) (halving),
/// (m-1)·α + N(m-1)/m·(β+γ) (ring).
Schedule build_stage_reduce_scatter(const bc::Stage& st, bool from_send);

/// The all-gather of the same stage: this rank holds block st.me of the segment in recv;
/// afterwards it holds every block of the segment. Recursive doubling or the ring.
/// Cost lg m·α + N(m-1)/m·β (doubling), (m-1)·α + N(m-1)/m·β (ring).
Schedule build_stage_all_gather(const bc::Stage& st);

}  // namespace streamcoll::sched
