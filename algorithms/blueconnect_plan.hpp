// BlueConnect's decomposition of a collective along a link hierarchy (M. Cho, U. Finkler,
// D. Kung, H. Hunter, "BlueConnect: Decomposing All-Reduce for Deep Learning on
// Heterogeneous Network Hierarchy", SysML 2019, section 3, eqs. 5-7). Pure: no MPI.
//
// With p = p0·p1·…·pk (core/topology.hpp, innermost level first), an allreduce of n
// elements is k+1 reduce-scatter stages up the levels followed by k+1 all-gather stages
// back down:
//   stage i (i = 0..k): the p_i ranks that differ only in coordinate c_i reduce-scatter
//     the segment they share (the whole vector at stage 0) into p_i blocks; the rank
//     with coordinate c_i keeps block c_i, which is the segment of stage i+1;
//   then stages k..0 all-gather the same blocks in reverse.
// Every rank takes part in every stage (p/p_i groups run concurrently), the latency term
// is 2·Σ(p_i - 1)·α_i for rings instead of 2(p-1)·α, and stage i's traffic,
// 2n(p_i-1)/(p0·…·p_i) per rank, stays on level i's links.
//
// A segment of len elements is cut into p_i blocks, block j starting at
// j·⌊len/p_i⌋ + min(j, len mod p_i) (the first len mod p_i blocks one element longer;
// some blocks are empty when len < p_i). Inside a stage: recursive halving (reduce-
// scatter) / recursive doubling (all-gather) when p_i is a power of two, the ring
// otherwise (or always, with ring_only).
//
// reduce_scatter_block and all-gather as collectives of their own use the same stages on
// the p blocks of the call laid out in "tree order": rank r's block goes to slot
// tree_slot(position of r), the order in which the stages' cuts hand out the blocks
// (c0 most significant). The route permutes the blocks into that order and back.
#pragma once

#include <cstdint>
#include <vector>

#include "core/topology.hpp"

namespace streamcoll::bc {

/// How a stage runs inside its group.
enum class StageAlgo : uint8_t {
  halving_doubling,  ///< recursive halving reduce-scatter / recursive doubling all-gather
  ring,
};

/// One level's stage as seen by one rank.
struct Stage {
  int level = 0;
  std::vector<int> ranks;           ///< the group: communicator ranks, index = coordinate
  int me = 0;                       ///< this rank's index in `ranks` (its coordinate c_level)
  uint64_t seg_off = 0;             ///< the segment the group shares, in elements
  uint64_t seg_len = 0;
  std::vector<uint64_t> bounds;     ///< ranks.size()+1 offsets (absolute, in elements):
                                    ///< block j = [bounds[j], bounds[j+1])
  StageAlgo algo = StageAlgo::ring;

  int size() const { return static_cast<int>(ranks.size()); }
  uint64_t block_off(int j) const { return bounds[j]; }
  uint64_t block_len(int j) const { return bounds[j + 1] - bounds[j]; }
};

/// The stages of one rank for a vector of `count` elements, innermost level first (the
/// reduce-scatter order; all-gathers run them backwards). `rank` is a communicator
/// rank of h. After the last stage the rank owns [final_off, final_off + final_len).
struct Plan {
  std::vector<Stage> stages;
  uint64_t count = 0;
  uint64_t final_off = 0;
  uint64_t final_len = 0;
};
Plan plan(const topo::Hierarchy& h, int rank, uint64_t count, bool ring_only = false);

/// The block of a count-element vector that the rank at hierarchy position `pos` owns
/// after every stage: [off, off+len). Equals plan(...).final_off/len.
void final_block(const std::vector<int>& factors, int pos, uint64_t count, uint64_t* off,
                 uint64_t* len);

/// Tree order: the index among the p equal final blocks of the rank at position `pos`
/// (digits c0, c1, ..., ck with c0 most significant).
int tree_slot(const std::vector<int>& factors, int pos);

}  // namespace streamcoll::bc
