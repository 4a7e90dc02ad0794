#include "algorithms/blueconnect_plan.hpp"

#include <algorithm>

namespace streamcoll::bc {
namespace {

bool is_pow2(int p) { return p > 0 && (p & (p - 1)) == 0; }

// Block j of a segment of len elements cut into m blocks, relative to the segment.
uint64_t cut(uint64_t len, uint64_t m, uint64_t j) { return j * (len / m) + std::min(j, len % m); }

}  // namespace

Plan plan(const topo::Hierarchy& h, int rank, uint64_t count, bool ring_only) {
  Plan out;
  out.count = count;
  const int pos = h.position_of[static_cast<size_t>(rank)];
  uint64_t seg_off = 0, seg_len = count;
  int stride = 1;  // positions between neighbours at this level
  for (int level = 0; level < h.levels(); ++level) {
    const int m = h.factors[static_cast<size_t>(level)];
    const int c = (pos / stride) % m;
    Stage st;
    st.level = level;
    st.me = c;
    st.seg_off = seg_off;
    st.seg_len = seg_len;
    st.algo = (!ring_only && is_pow2(m)) ? StageAlgo::halving_doubling : StageAlgo::ring;
    st.ranks.resize(static_cast<size_t>(m));
    st.bounds.resize(static_cast<size_t>(m) + 1);
    const int base = pos - c * stride;
    for (int j = 0; j < m; ++j) st.ranks[static_cast<size_t>(j)] = h.rank_at[static_cast<size_t>(base + j * stride)];
    for (int j = 0; j <= m; ++j)
      st.bounds[static_cast<size_t>(j)] = seg_off + cut(seg_len, static_cast<uint64_t>(m), static_cast<uint64_t>(j));
    seg_off = st.block_off(c);
    seg_len = st.block_len(c);
    out.stages.push_back(std::move(st));
    stride *= m;
  }
  out.final_off = seg_off;
  out.final_len = seg_len;
  return out;
}

void final_block(const std::vector<int>& factors, int pos, uint64_t count, uint64_t* off,
                 uint64_t* len) {
  uint64_t o = 0, n = count;
  for (int m : factors) {
    const uint64_t c = static_cast<uint64_t>(pos % m);
    pos /= m;
    const uint64_t b = cut(n, static_cast<uint64_t>(m), c);
    n = cut(n, static_cast<uint64_t>(m), c + 1) - b;
    o += b;
  }
  *off = o;
  *len = n;
}

int tree_slot(const std::vector<int>& factors, int pos) {
  int slot = 0;
  for (int m : factors) {
    slot = slot * m + pos % m;
    pos /= m;
  }
  return slot;
}

}  // namespace streamcoll::bc
