// Host collective algorithms as schedules (see schedule.hpp for the list, the paper and
// the costs). Every builder below writes the rounds of one rank; a rank count that is not
// a power of two uses the paper's pre- and post-steps, or an algorithm that needs none.
//
// Conventions shared by the builders:
//   - A vector of n elements cut into m blocks: block i starts at i*(n/m) + min(i, n%m),
//     so the first n%m blocks are one element longer; with n < m some blocks are empty
//     and their messages are left out on both sides.
//   - "own" is where this rank's contribution lives (send, or recv when in place). The
//     first combination of a partner's data with it receives straight into the result
//     buffer and reduces own into it (dst = own (op) received), which saves a copy; later
//     ones receive into tmp and reduce into the result.
//   - Partners that both combine a block combine the same two operands, and a block that
//     one rank finished is only copied afterwards, so allreduce results are the same bit
//     for bit on every rank (the predefined MPI operations are commutative).
#include "algorithms/schedule.hpp"

#include <algorithm>

#include "algorithms/blueconnect_plan.hpp"

namespace streamcoll::sched {

namespace {

/// A place in one of the schedule's buffers.
struct Loc {
  Buf buf;
  uint64_t off = 0;
  Loc at(uint64_t d) const { return {buf, off + d}; }
  bool operator==(const Loc& o) const { return buf == o.buf && off == o.off; }
  bool operator!=(const Loc& o) const { return !(*this == o); }
};

/// n elements cut into m nearly equal blocks; [off(i), off(j)) is blocks i..j-1.
struct Blocks {
  uint64_t n, m;
  uint64_t off(uint64_t i) const { return i * (n / m) + std::min(i, n % m); }
  uint64_t len(uint64_t i, uint64_t j) const { return off(j) - off(i); }
};

int floor_pow2(int p) {
  int f = 1;
  while (f * 2 <= p) f *= 2;
  return f;
}
int mod(int a, int p) { return ((a % p) + p) % p; }

/// Appends operations round by round; empty messages and empty rounds are left out, and
/// the tmp elements used are counted into tmp_elems.
class Builder {
 public:
  explicit Builder(Schedule* s) : s_(s) {}

  /// Starts a new round (a no-op while the current one is still empty).
  void round() {
    if (s_->rounds.empty() || s_->rounds.back() != s_->ops.size())
      s_->rounds.push_back(static_cast<uint32_t>(s_->ops.size()));
  }
  void send(Loc l, uint64_t count, int peer) { message(Op::Kind::send, l, count, peer); }
  void recv(Loc l, uint64_t count, int peer) { message(Op::Kind::recv, l, count, peer); }
  void reduce(Loc dst, Loc src, uint64_t count) { local(Op::Kind::reduce, dst, src, count); }
  void copy(Loc dst, Loc src, uint64_t count) {
    if (dst != src) local(Op::Kind::copy, dst, src, count);
  }
  /// Receives count elements from peer and combines them with this rank's data at own,
  /// leaving the result at work: straight into work when own is elsewhere, else through
  /// the scratch place in.
  void recv_reduce(Loc work, Loc own, Loc in, uint64_t count, int peer) {
    if (own != work) {
      recv(work, count, peer);
      reduce(work, own, count);
    } else {
      recv(in, count, peer);
      reduce(work, in, count);
    }
  }
  void finish() {
    if (!s_->rounds.empty() && s_->rounds.back() == s_->ops.size()) s_->rounds.pop_back();
  }

 private:
  void message(Op::Kind k, Loc l, uint64_t count, int peer) {
    if (count == 0) return;
    if (s_->rounds.empty()) round();
    Op op{};
    op.kind = k;
    op.buf = l.buf;
    op.peer = peer;
    op.off = l.off;
    op.count = count;
    use(l, count);
    s_->ops.push_back(op);
  }
  void local(Op::Kind k, Loc dst, Loc src, uint64_t count) {
    if (count == 0) return;
    if (s_->rounds.empty()) round();
    Op op{};
    op.kind = k;
    op.buf = dst.buf;
    op.src = src.buf;
    op.off = dst.off;
    op.src_off = src.off;
    op.count = count;
    use(dst, count);
    use(src, count);
    s_->ops.push_back(op);
  }
  void use(Loc l, uint64_t count) {
    if (l.buf == Buf::tmp) s_->tmp_elems = std::max(s_->tmp_elems, l.off + count);
  }

  Schedule* s_;
};

/// The paper's pre-step for p ranks that are not a power of two: among the first 2r
/// ranks, the even one hands its whole vector (n elements at own) to the odd one and sits
/// out. Returns the rank's virtual rank among the p' that go on (-1: sits out); own moves
/// to work where the rank combined its partner's vector.
int pre_step(Builder& b, int me, int rem, uint64_t n, Loc work, Loc* own, Loc in) {
  if (me >= 2 * rem) return me - rem;
  b.round();
  if (me % 2 == 0) {
    b.send(*own, n, me + 1);
    return -1;
  }
  b.recv_reduce(work, *own, in, n, me - 1);
  *own = work;
  return me / 2;
}
/// The rank that plays virtual rank v after pre_step.
int real_rank(int v, int rem) { return v < rem ? 2 * v + 1 : v + rem; }

/// The paper's post-step: the odd ones of the first 2r ranks send the n-element result
/// at res back to the even partner.
void post_step(Builder& b, int me, int rem, uint64_t n, Loc res) {
  if (me >= 2 * rem) return;
  b.round();
  if (me % 2 == 0)
    b.recv(res, n, me + 1);
  else
    b.send(res, n, me - 1);
}

/// Recursive halving reduce-scatter among p' = pof2 virtual ranks (paper section 4.1):
/// in the step at distance d (p'/2 first) v keeps the half of its range of blocks on its
/// side of v^d, sends the other half and combines the half it keeps. v ends with block v.
/// `start(i)` is where block i of the p' blocks starts, start(p') the end; `peer(w)` the
/// rank that plays virtual rank w.
template <class Start, class Peer>
void halving(Builder& b, int v, int pof2, Start start, Peer peer, Loc work, Loc* own, Loc in) {
  int lo = 0;
  for (int d = pof2 / 2; d >= 1; d /= 2) {
    b.round();
    const int w = v ^ d;
    int keep = lo, give = lo + d;
    if (v & d) std::swap(keep, give);
    lo = keep;
    b.send(own->at(start(give)), start(give + d) - start(give), peer(w));
    b.recv_reduce(work.at(start(keep)), own->at(start(keep)), in,
                  start(keep + d) - start(keep), peer(w));
    *own = work;
  }
}

// ---- allreduce -------------------------------------------------------------------------

// Recursive doubling (paper section 4.1, short messages): lg p' exchanges of the whole
// vector, each combined by both partners; pre- and post-step for p != p'.
// Cost lg p'·(α + nβ + nγ), plus (2α + 2nβ + nγ) when p != p'.
void allreduce_rd(Builder& b, int me, int p, uint64_t n, bool in_place) {
  const int pof2 = floor_pow2(p), rem = p - pof2;
  const Loc res{Buf::recv}, in{Buf::tmp};
  Loc own = in_place ? res : Loc{Buf::send};
  const int v = pre_step(b, me, rem, n, res, &own, in);
  if (v >= 0) {
    for (int d = 1; d < pof2; d *= 2) {
      b.round();
      const int w = real_rank(v ^ d, rem);
      b.send(own, n, w);
      b.recv_reduce(res, own, in, n, w);
      own = res;
    }
  }
  post_step(b, me, rem, n, res);
}

// Rabenseifner (paper section 4.1, long messages): recursive halving reduce-scatter then
// recursive doubling all-gather among p' ranks, blocks of n/p'; pre- and post-step.
// Cost 2 lg p'·α + 2n(p'-1)/p'·β + n(p'-1)/p'·γ, plus (2α + 2nβ + nγ) when p != p'.
void allreduce_rabenseifner(Builder& b, int me, int p, uint64_t n, bool in_place) {
  const int pof2 = floor_pow2(p), rem = p - pof2;
  const Loc res{Buf::recv}, in{Buf::tmp};
  Loc own = in_place ? res : Loc{Buf::send};
  const int v = pre_step(b, me, rem, n, res, &own, in);
  if (v >= 0) {
    const Blocks bl{n, static_cast<uint64_t>(pof2)};
    auto start = [&](int i) { return bl.off(i); };
    halving(b, v, pof2, start, [&](int w) { return real_rank(w, rem); }, res, &own, in);
    // All-gather: before the step at distance d, v holds the d blocks of its aligned group.
    for (int d = 1; d < pof2; d *= 2) {
      b.round();
      const int w = v ^ d;
      const int mine = v & ~(d - 1), theirs = w & ~(d - 1);
      b.send(res.at(bl.off(mine)), bl.len(mine, mine + d), real_rank(w, rem));
      b.recv(res.at(bl.off(theirs)), bl.len(theirs, theirs + d), real_rank(w, rem));
    }
  }
  post_step(b, me, rem, n, res);
}

// Ring (Patarasuk and Yuan; the reduce-scatter and all-gather rings of paper section 4):
// p-1 steps pass partial sums of n/p blocks around the ring, then p-1 steps pass the
// finished blocks. Any p. Cost 2(p-1)·α + 2n(p-1)/p·β + n(p-1)/p·γ.
void allreduce_ring(Builder& b, int me, int p, uint64_t n, bool in_place) {
  const Blocks bl{n, static_cast<uint64_t>(p)};
  const Loc res{Buf::recv};
  const Loc own = in_place ? res : Loc{Buf::send};
  const int next = mod(me + 1, p), prev = mod(me - 1, p);
  // Reduce-scatter: in step s rank me passes on block me-s and adds its own contribution
  // to block me-s-1; it finishes block me+1.
  for (int s = 0; s < p - 1; ++s) {
    b.round();
    const int sb = mod(me - s, p), rb = mod(me - s - 1, p);
    b.send((s == 0 ? own : res).at(bl.off(sb)), bl.len(sb, sb + 1), next);
    b.recv_reduce(res.at(bl.off(rb)), own.at(bl.off(rb)), Loc{Buf::tmp}, bl.len(rb, rb + 1),
                  prev);
  }
  // All-gather: in step s rank me passes on finished block me+1-s.
  for (int s = 0; s < p - 1; ++s) {
    b.round();
    const int sb = mod(me + 1 - s, p), rb = mod(me - s, p);
    b.send(res.at(bl.off(sb)), bl.len(sb, sb + 1), next);
    b.recv(res.at(bl.off(rb)), bl.len(rb, rb + 1), prev);
  }
}

// C-Cube (M. Jo, J. Son, J. Kim et al., "C-Cube: ..." (KAIST), section III): a reduction
// up a tree whose broadcast down overlaps it chunk by chunk: the vector is cut into c
// chunks; chunk k goes up one tree level per round and, once the root has it complete,
// down one level per round, while later chunks are still on their way up. The tree is
// ccube_tree's (the physical mapping). Rounds are global: with D the tree's height and d
// a rank's depth, in round t a rank
//   receives chunk t-(D-d-1) from each child and reduces it into its result (end of round),
//   sends chunk t-(D-d) to its parent (its own data at a leaf),
//   receives the finished chunk t-(D+d-1) from its parent,
//   sends the finished chunk t-(D+d) to each child,
// so every message is posted by both ends in the same round, and a rank's result chunk is
// never sent in a round that receives into it (up at t = k+D-d, down at k+D+d-1, d >= 1).
// The root finishes chunk k at the end of round k+D-1. Rounds: c + 2D - 1.
// Per round a rank sends at most three chunks (one up, two down) and reduces two: the
// cost (c + 2D - 1)·(α + 3(n/c)·β + 2(n/c)·γ) with binary trees inside and across nodes.
// Every rank ends with the root's bits. tmp: one chunk per child.
void allreduce_ccube(Builder& b, int me, int p, uint64_t n, uint64_t chunk, bool in_place,
                     const std::vector<int>* node_of) {
  const Tree t = ccube_tree(p, 0, node_of);
  const uint64_t c = chunk == 0 || chunk >= n ? 1 : (n + chunk - 1) / chunk;
  const Blocks bl{n, c};
  const uint64_t slot = bl.len(0, 1);  // the longest chunk
  const Loc res{Buf::recv};
  const Loc own = in_place ? res : Loc{Buf::send};
  const int64_t D = t.height, d = t.depth[static_cast<size_t>(me)];
  const int parent = t.parent[static_cast<size_t>(me)];
  const std::vector<int>& kids = t.children[static_cast<size_t>(me)];
  const int64_t C = static_cast<int64_t>(c);
  auto chunk_ok = [&](int64_t k) { return k >= 0 && k < C; };
  auto at = [&](Loc l, int64_t k) { return l.at(bl.off(static_cast<uint64_t>(k))); };
  auto len = [&](int64_t k) {
    return bl.len(static_cast<uint64_t>(k), static_cast<uint64_t>(k) + 1);
  };
  for (int64_t r = 0; r < C + 2 * D - 1; ++r) {
    b.round();
    const int64_t ku = r - (D - d - 1), ks = r - (D - d), kd = r - (D + d - 1), kc = r - (D + d);
    const bool up_in = !kids.empty() && chunk_ok(ku);
    if (up_in)
      for (size_t i = 0; i < kids.size(); ++i) b.recv(Loc{Buf::tmp, i * slot}, len(ku), kids[i]);
    if (parent >= 0 && chunk_ok(ks)) b.send(at(kids.empty() ? own : res, ks), len(ks), parent);
    if (parent >= 0 && chunk_ok(kd)) b.recv(at(res, kd), len(kd), parent);
    if (chunk_ok(kc))
      for (int kid : kids) b.send(at(res, kc), len(kc), kid);
    if (up_in) {
      b.copy(at(res, ku), at(own, ku), len(ku));
      for (size_t i = 0; i < kids.size(); ++i) b.reduce(at(res, ku), Loc{Buf::tmp, i * slot}, len(ku));
    }
  }
}

// ---- reduce ----------------------------------------------------------------------------
// Non-root ranks accumulate in tmp; the receive buffer is only used at the root.

// Binomial tree relative to the root (paper section 4.2, short messages): a rank combines
// the vectors of its children, largest distance last, and sends the sum to its parent.
// Cost ⌈lg p⌉·(α + nβ + nγ).
void reduce_rd(Builder& b, int me, int p, int root, uint64_t n, bool in_place) {
  const int vr = mod(me - root, p);
  const bool is_root = me == root;
  const Loc work = is_root ? Loc{Buf::recv} : Loc{Buf::tmp};
  const Loc in = is_root ? Loc{Buf::tmp} : Loc{Buf::tmp, n};
  Loc own = is_root && in_place ? Loc{Buf::recv} : Loc{Buf::send};
  for (int mask = 1; mask < p; mask *= 2) {
    if (vr & mask) {
      b.round();
      b.send(own, n, mod(vr - mask + root, p));
      return;
    }
    if (vr + mask < p) {
      b.round();
      b.recv_reduce(work, own, in, n, mod(vr + mask + root, p));
      own = work;
    }
  }
}

// Rabenseifner (paper section 4.2, long messages): pre-step, recursive halving reduce-
// scatter among p' ranks, then a binomial gather of the blocks to the root. Ranks are
// taken relative to the root and in the pre-step the even one of a pair keeps going, so
// the root is always virtual rank 0 and no extra step is needed for any root.
// Cost 2 lg p'·α + 2n(p'-1)/p'·β + n(p'-1)/p'·γ, plus (α + nβ + nγ) when p != p'.
void reduce_rabenseifner(Builder& b, int me, int p, int root, uint64_t n, bool in_place) {
  const int pof2 = floor_pow2(p), rem = p - pof2;
  const int vr = mod(me - root, p);
  const bool is_root = me == root;
  const Loc work = is_root ? Loc{Buf::recv} : Loc{Buf::tmp};
  const Loc in = is_root ? Loc{Buf::tmp} : Loc{Buf::tmp, n};
  Loc own = is_root && in_place ? Loc{Buf::recv} : Loc{Buf::send};
  auto real = [&](int rel) { return mod(rel + root, p); };
  // Virtual rank v is played by relative rank 2v (v < r) or v + r.
  auto real_v = [&](int v) { return real(v < rem ? 2 * v : v + rem); };
  int v = vr - rem;
  if (vr < 2 * rem) {
    b.round();
    if (vr % 2) {
      b.send(own, n, real(vr - 1));
      return;
    }
    b.recv_reduce(work, own, in, n, real(vr + 1));
    own = work;
    v = vr / 2;
  }
  const Blocks bl{n, static_cast<uint64_t>(pof2)};
  int lo = 0;
  for (int d = pof2 / 2; d >= 1; d /= 2) {
    b.round();
    const int w = v ^ d;
    int keep = lo, give = lo + d;
    if (v & d) std::swap(keep, give);
    lo = keep;
    b.send(own.at(bl.off(give)), bl.len(give, give + d), real_v(w));
    b.recv_reduce(work.at(bl.off(keep)), own.at(bl.off(keep)), in, bl.len(keep, keep + d),
                  real_v(w));
    own = work;
  }
  // Binomial gather: before the step at distance m, v holds blocks [v, v+m).
  for (int m = 1; m < pof2; m *= 2) {
    b.round();
    if (v & m) {
      b.send(work.at(bl.off(v)), bl.len(v, v + m), real_v(v - m));
      return;
    }
    b.recv(work.at(bl.off(v + m)), bl.len(v + m, v + 2 * m), real_v(v + m));
  }
}

// Ring reduce-scatter (as in allreduce_ring) then every rank sends its finished block
// straight to the root. Any p. Cost 2(p-1)·α + 2n(p-1)/p·β + n(p-1)/p·γ (the root
// receives p-1 blocks at once).
void reduce_ring(Builder& b, int me, int p, int root, uint64_t n, bool in_place) {
  const Blocks bl{n, static_cast<uint64_t>(p)};
  const bool is_root = me == root;
  const Loc work = is_root ? Loc{Buf::recv} : Loc{Buf::tmp};
  const Loc own = is_root && in_place ? Loc{Buf::recv} : Loc{Buf::send};
  const int next = mod(me + 1, p), prev = mod(me - 1, p);
  for (int s = 0; s < p - 1; ++s) {
    b.round();
    const int sb = mod(me - s, p), rb = mod(me - s - 1, p);
    b.send((s == 0 ? own : work).at(bl.off(sb)), bl.len(sb, sb + 1), next);
    // A non-root rank's own data is in send, so tmp is only the root's scratch here.
    b.recv_reduce(work.at(bl.off(rb)), own.at(bl.off(rb)), Loc{Buf::tmp}, bl.len(rb, rb + 1),
                  prev);
  }
  // Rank q finished block q+1.
  b.round();
  if (!is_root) {
    const int k = mod(me + 1, p);
    b.send(work.at(bl.off(k)), bl.len(k, k + 1), root);
    return;
  }
  for (int q = 0; q < p; ++q) {
    const int k = mod(q + 1, p);
    if (q != root) b.recv(work.at(bl.off(k)), bl.len(k, k + 1), q);
  }
}

// ---- bcast -----------------------------------------------------------------------------

// Binomial tree from the root (paper section 3, short messages): a rank receives from
// its parent, then sends to its children, largest subtree first, one per round.
// Cost ⌈lg p⌉·(α + nβ).
void bcast_rd(Builder& b, int me, int p, int root, uint64_t n) {
  const int vr = mod(me - root, p);
  int mask = 1;
  for (; mask < p; mask *= 2) {
    if (vr & mask) {
      b.round();
      b.recv(Loc{Buf::recv}, n, mod(vr - mask + root, p));
      break;
    }
  }
  for (mask /= 2; mask > 0; mask /= 2) {
    if (vr + mask < p) {
      b.round();
      b.send(Loc{Buf::recv}, n, mod(vr + mask + root, p));
    }
  }
}

// Van de Geijn's bcast (paper section 3, long messages): a binomial scatter gives relative
// rank i block i of p (and the blocks of its subtree), then an all-gather: recursive
// doubling for p a power of two (ring = false), the ring otherwise. A block the receiver
// already holds from the scatter is not sent. Cost (lg p + lg p)·α + 2n(p-1)/p·β with
// recursive doubling, (lg p + p - 1)·α + 2n(p-1)/p·β with the ring.
void bcast_scatter_allgather(Builder& b, int me, int p, int root, uint64_t n, bool ring) {
  const Blocks bl{n, static_cast<uint64_t>(p)};
  const int vr = mod(me - root, p);
  const Loc buf{Buf::recv};
  auto real = [&](int rel) { return mod(rel + root, p); };
  // Relative rank q holds blocks [q, q + sub(q)) after the scatter.
  auto sub = [&](int q) { return q == 0 ? p : std::min(q & -q, p - q); };
  auto has = [&](int q, int first, int last) { return first >= q && last <= q + sub(q); };
  auto blocks = [&](int first, int last) { return bl.len(first, last); };

  int mask = 1;
  for (; mask < p; mask *= 2) {
    if (vr & mask) {
      b.round();
      b.recv(buf.at(bl.off(vr)), blocks(vr, vr + sub(vr)), real(vr - mask));
      break;
    }
  }
  for (mask /= 2; mask > 0; mask /= 2) {
    const int c = vr + mask;
    if (c < p) {
      b.round();
      b.send(buf.at(bl.off(c)), blocks(c, c + sub(c)), real(c));
    }
  }

  if (!ring) {
    // Before the step at distance d, q holds the d blocks of its aligned group.
    for (int d = 1; d < p; d *= 2) {
      b.round();
      const int w = vr ^ d;
      const int mine = vr & ~(d - 1), theirs = w & ~(d - 1);
      if (!has(w, mine, mine + d)) b.send(buf.at(bl.off(mine)), blocks(mine, mine + d), real(w));
      if (!has(vr, theirs, theirs + d))
        b.recv(buf.at(bl.off(theirs)), blocks(theirs, theirs + d), real(w));
    }
    return;
  }
  const int next = mod(vr + 1, p), prev = mod(vr - 1, p);
  for (int s = 0; s < p - 1; ++s) {
    b.round();
    const int sb = mod(vr - s, p), rb = mod(vr - s - 1, p);
    if (!has(next, sb, sb + 1)) b.send(buf.at(bl.off(sb)), blocks(sb, sb + 1), real(next));
    if (!has(vr, rb, rb + 1)) b.recv(buf.at(bl.off(rb)), blocks(rb, rb + 1), real(prev));
  }
}

// ---- allgather -------------------------------------------------------------------------
// Rank q's contribution ends at recv[q*n].

// Recursive doubling (paper section 3, p a power of two): lg p exchanges of doubling
// groups of blocks. Cost lg p·α + n(p-1)·β (n per rank).
void allgather_rd(Builder& b, int me, int p, uint64_t n, Loc own) {
  const Loc res{Buf::recv};
  for (int d = 1; d < p; d *= 2) {
    b.round();
    const int w = me ^ d;
    const int mine = me & ~(d - 1), theirs = w & ~(d - 1);
    b.send(d == 1 ? own : res.at(mine * n), d * n, w);
    b.recv(res.at(theirs * n), d * n, w);
    if (d == 1) b.copy(res.at(me * n), own, n);
  }
}

// Bruck et al. (paper section 3, p not a power of two): ⌈lg p⌉ steps; in the step at
// distance d a rank sends the first min(d, p-d) blocks it has collected in tmp (its own
// block first) to rank me-d and appends those of rank me+d; tmp then holds the blocks of
// ranks me, me+1, ... and is rotated into place. Cost ⌈lg p⌉·α + n(p-1)·β + the rotation.
void allgather_bruck(Builder& b, int me, int p, uint64_t n, Loc own, bool in_place) {
  const Loc res{Buf::recv}, tmp{Buf::tmp};
  const uint64_t q = static_cast<uint64_t>(me), P = static_cast<uint64_t>(p);
  for (int d = 1; d < p; d *= 2) {
    b.round();
    const uint64_t k = static_cast<uint64_t>(std::min(d, p - d));
    b.send(d == 1 ? own : tmp, k * n, mod(me - d, p));
    b.recv(tmp.at(d * n), k * n, mod(me + d, p));
    if (d == 1) b.copy(tmp, own, n);
  }
  // tmp block i is rank me+i's; the own block is already in place when in place.
  const uint64_t skip = in_place ? 1 : 0;
  b.copy(res.at((q + skip) * n), tmp.at(skip * n), (P - q - skip) * n);
  b.copy(res, tmp.at((P - q) * n), q * n);
}

// Ring (paper section 3, long messages): in step s rank me passes block me-s to me+1.
// Cost (p-1)·α + n(p-1)·β.
void allgather_ring(Builder& b, int me, int p, uint64_t n, Loc own) {
  const Loc res{Buf::recv};
  for (int s = 0; s < p - 1; ++s) {
    b.round();
    const uint64_t sb = static_cast<uint64_t>(mod(me - s, p));
    const uint64_t rb = static_cast<uint64_t>(mod(me - s - 1, p));
    b.send(s == 0 ? own : res.at(sb * n), n, mod(me + 1, p));
    b.recv(res.at(rb * n), n, mod(me - 1, p));
    if (s == 0) b.copy(res.at(me * n), own, n);
  }
}

// ---- reduce_scatter_block --------------------------------------------------------------
// The input is p blocks of n (send, or recv when in place); rank q gets block q in
// recv[0..n). Nothing else of recv is written: in place, blocks 1..p-1 keep their input
// (MPI writes the result to the first n elements only), so partial sums live in tmp.

// Recursive halving (paper section 4.1): pre-step, then lg p' halving steps among p'
// virtual ranks. Virtual rank v < r stands for ranks 2v and 2v+1 and owns their two
// blocks, v >= r owns the block of rank v+r, so each v owns a contiguous "superblock";
// in the post-step the odd rank sends its even partner its block. The input (send, or
// recv in place) is only read; it is combined in tmp.
// Cost lg p'·α + N(p'-1)/p'·(β+γ) for N = pn, plus (2α + Nβ + Nγ + nβ) when p != p'.
void rsb_halving(Builder& b, int me, int p, uint64_t n, bool in_place) {
  const int pof2 = floor_pow2(p), rem = p - pof2;
  const uint64_t total = static_cast<uint64_t>(p) * n;
  const Loc work{Buf::tmp};
  const Loc in{Buf::tmp, total};
  Loc own = in_place ? Loc{Buf::recv} : Loc{Buf::send};
  const int v = pre_step(b, me, rem, total, work, &own, in);
  if (v >= 0) {
    auto start = [&](int i) { return static_cast<uint64_t>(i + std::min(i, rem)) * n; };
    halving(b, v, pof2, start, [&](int w) { return real_rank(w, rem); }, work, &own, in);
  }
  const Loc res{Buf::recv};
  if (me < 2 * rem) {
    b.round();
    if (me % 2 == 0) {
      b.recv(res, n, me + 1);
      return;
    }
    b.send(work.at(static_cast<uint64_t>(me - 1) * n), n, me - 1);
  }
  // Runs after the round's messages and reductions, so it may overwrite what they read
  // (in place, the input's block 0).
  b.copy(res, work.at(static_cast<uint64_t>(me) * n), n);
}

// Ring (the reduce-scatter half of allreduce_ring): in step s rank me passes on the
// partial sum of block me-s-1 and adds its contribution to block me-s-2; it finishes its
// own block. The partial sums alternate between two tmp blocks and the last one lands in
// recv[0..n). In place, recv[0..n) is also the input's block 0, which every rank reads
// before its last step except rank 0 (its operand in the last step) and, with p = 2, rank
// 1 (which sends it in that step): those finish in tmp and copy the result over it.
// Cost (p-1)·α + N(p-1)/p·(β+γ) for N = pn.
void rsb_ring(Builder& b, int me, int p, uint64_t n, bool in_place) {
  const int next = mod(me + 1, p), prev = mod(me - 1, p);
  const Loc res{Buf::recv};
  const Loc own = in_place ? res : Loc{Buf::send};
  auto block = [&](int k) { return static_cast<uint64_t>(k) * n; };
  const bool via_tmp = in_place && (me == 0 || p == 2);
  for (int s = 0; s < p - 1; ++s) {
    b.round();
    const int sb = mod(me - s - 1, p), rb = mod(me - s - 2, p);
    const Loc from = s == 0 ? own.at(block(sb)) : Loc{Buf::tmp, block((s - 1) % 2)};
    const Loc into = s == p - 2 && !via_tmp ? res : Loc{Buf::tmp, block(s % 2)};
    b.send(from, n, next);
    b.recv_reduce(into, own.at(block(rb)), Loc{Buf::tmp}, n, prev);
  }
  if (via_tmp) b.copy(res, Loc{Buf::tmp, block((p - 2) % 2)}, n);  // after the last round
}

// ---- hierarchical stages (BlueConnect) ------------------------------------------------
// The group's members are st.ranks[0..m); block j of the segment is
// [st.bounds[j], st.bounds[j+1]) of recv.

// Ring reduce-scatter over the group's blocks (as rsb_ring): in step s member me passes on
// the partial result of block me-s-1 and combines its own data into block me-s-2, so it
// finishes block me.
void stage_rs_ring(Builder& b, const bc::Stage& st, Loc own) {
  const int m = st.size(), me = st.me;
  const Loc work{Buf::recv}, in{Buf::tmp};
  const int next = st.ranks[static_cast<size_t>(mod(me + 1, m))];
  const int prev = st.ranks[static_cast<size_t>(mod(me - 1, m))];
  for (int s = 0; s < m - 1; ++s) {
    b.round();
    const int sb = mod(me - s - 1, m), rb = mod(me - s - 2, m);
    b.send((s == 0 ? own : work).at(st.block_off(sb)), st.block_len(sb), next);
    b.recv_reduce(work.at(st.block_off(rb)), own.at(st.block_off(rb)), in, st.block_len(rb),
                  prev);
  }
}

// Recursive doubling all-gather over the group's blocks (m a power of two): before the
// step at distance d, member me holds the d blocks of its aligned group.
void stage_ag_doubling(Builder& b, const bc::Stage& st) {
  const Loc work{Buf::recv};
  for (int d = 1; d < st.size(); d *= 2) {
    b.round();
    const int w = st.me ^ d;
    const int mine = st.me & ~(d - 1), theirs = w & ~(d - 1);
    const int peer = st.ranks[static_cast<size_t>(w)];
    b.send(work.at(st.bounds[mine]), st.bounds[mine + d] - st.bounds[mine], peer);
    b.recv(work.at(st.bounds[theirs]), st.bounds[theirs + d] - st.bounds[theirs], peer);
  }
}

// Ring all-gather over the group's blocks: in step s member me passes block me-s on.
void stage_ag_ring(Builder& b, const bc::Stage& st) {
  const int m = st.size(), me = st.me;
  const Loc work{Buf::recv};
  const int next = st.ranks[static_cast<size_t>(mod(me + 1, m))];
  const int prev = st.ranks[static_cast<size_t>(mod(me - 1, m))];
  for (int s = 0; s < m - 1; ++s) {
    b.round();
    const int sb = mod(me - s, m), rb = mod(me - s - 1, m);
    b.send(work.at(st.block_off(sb)), st.block_len(sb), next);
    b.recv(work.at(st.block_off(rb)), st.block_len(rb), prev);
  }
}

}  // namespace

Schedule build_stage_reduce_scatter(const bc::Stage& st, bool from_send) {
  Schedule s;
  Builder b(&s);
  Loc own = from_send ? Loc{Buf::send} : Loc{Buf::recv};
  const int m = st.size();
  if (m == 1) {
    if (from_send) b.copy(Loc{Buf::recv, st.seg_off}, own.at(st.seg_off), st.seg_len);
  } else if (st.algo == bc::StageAlgo::halving_doubling) {
    auto start = [&](int i) { return st.bounds[static_cast<size_t>(i)]; };
    auto peer = [&](int w) { return st.ranks[static_cast<size_t>(w)]; };
    halving(b, st.me, m, start, peer, Loc{Buf::recv}, &own, Loc{Buf::tmp});
  } else {
    stage_rs_ring(b, st, own);
  }
  b.finish();
  return s;
}

Schedule build_stage_all_gather(const bc::Stage& st) {
  Schedule s;
  Builder b(&s);
  if (st.size() > 1) {
    if (st.algo == bc::StageAlgo::halving_doubling)
      stage_ag_doubling(b, st);
    else
      stage_ag_ring(b, st);
  }
  b.finish();
  return s;
}

Tree ccube_tree(int size, int root, const std::vector<int>* node_of) {
  Tree t;
  const size_t P = static_cast<size_t>(std::max(size, 0));
  t.parent.assign(P, -1);
  t.depth.assign(P, 0);
  t.children.assign(P, {});
  if (P == 0) return t;
  const bool mapped = node_of && node_of->size() == P;
  // Nodes in the order of their lowest ranks, the root's first; the root leads its node.
  std::vector<std::vector<int>> nodes;
  std::vector<int> keys;
  auto node_index = [&](int r) {
    const int key = mapped ? (*node_of)[static_cast<size_t>(r)] : 0;
    for (size_t i = 0; i < keys.size(); ++i)
      if (keys[i] == key) return i;
    keys.push_back(key);
    nodes.emplace_back();
    return keys.size() - 1;
  };
  nodes.reserve(P);
  node_index(root);
  nodes[0].push_back(root);
  for (int r = 0; r < size; ++r)
    if (r != root) nodes[node_index(r)].push_back(r);
  auto link = [&](int child, int parent) {
    t.parent[static_cast<size_t>(child)] = parent;
    t.children[static_cast<size_t>(parent)].push_back(child);
  };
  // Leaders' tree first, so a leader's children across nodes come before those on its node
  // (they are the farther ones: their chunks start up the tree soonest).
  for (size_t j = 1; j < nodes.size(); ++j) link(nodes[j][0], nodes[(j - 1) / 2][0]);
  for (const auto& m : nodes)
    for (size_t i = 1; i < m.size(); ++i) link(m[i], m[(i - 1) / 2]);
  // Depths, parents before children: the leaders' heap order, then each node's.
  for (size_t j = 1; j < nodes.size(); ++j) {
    const int l = nodes[j][0];
    t.depth[static_cast<size_t>(l)] = t.depth[static_cast<size_t>(t.parent[static_cast<size_t>(l)])] + 1;
  }
  for (const auto& m : nodes)
    for (size_t i = 1; i < m.size(); ++i)
      t.depth[static_cast<size_t>(m[i])] = t.depth[static_cast<size_t>(m[(i - 1) / 2])] + 1;
  for (int d : t.depth) t.height = std::max(t.height, d);
  return t;
}

std::string_view name(Algo a) {
  switch (a) {
    case Algo::ccube: return "ccube";
    case Algo::rd: return "rd";
    case Algo::rabenseifner: return "rabenseifner";
    case Algo::ring: return "ring";
    case Algo::mpi: return "mpi";
  }
  return "?";
}

bool schedulable(Coll c) {
  switch (c) {
    case Coll::allreduce:
    case Coll::reduce:
    case Coll::bcast:
    case Coll::allgather:
    case Coll::reduce_scatter_block:
      return true;
    default:
      return false;
  }
}

Schedule build(const Params& p) {
  Schedule s;
  if (p.count == 0 || p.algo == Algo::mpi || !schedulable(p.coll)) return s;
  Builder b(&s);
  const int me = p.rank, P = p.size;
  const uint64_t n = p.count;
  // MPI_IN_PLACE is meaningful only at a reduce's root; other ranks read send.
  const bool in_place = p.in_place && (p.coll != Coll::reduce || p.rank == p.root);
  // ccube is an allreduce; the table's route picks another algorithm for the others.
  const Algo algo = p.algo == Algo::ccube && p.coll != Coll::allreduce ? Algo::rd : p.algo;
  switch (p.coll) {
    case Coll::allreduce:
      if (P == 1) {
        if (!in_place) b.copy(Loc{Buf::recv}, Loc{Buf::send}, n);
      } else if (algo == Algo::rd) {
        allreduce_rd(b, me, P, n, in_place);
      } else if (algo == Algo::rabenseifner) {
        allreduce_rabenseifner(b, me, P, n, in_place);
      } else if (algo == Algo::ccube) {
        allreduce_ccube(b, me, P, n, p.chunk, in_place, p.node_of);
      } else {
        allreduce_ring(b, me, P, n, in_place);
      }
      break;
    case Coll::reduce:
      if (P == 1) {
        if (!in_place) b.copy(Loc{Buf::recv}, Loc{Buf::send}, n);
      } else if (algo == Algo::rd) {
        reduce_rd(b, me, P, p.root, n, in_place);
      } else if (algo == Algo::rabenseifner) {
        reduce_rabenseifner(b, me, P, p.root, n, in_place);
      } else {
        reduce_ring(b, me, P, p.root, n, in_place);
      }
      break;
    case Coll::bcast:
      if (P == 1) break;
      if (algo == Algo::rd)
        bcast_rd(b, me, P, p.root, n);
      else
        bcast_scatter_allgather(b, me, P, p.root, n,
                                algo == Algo::ring || floor_pow2(P) != P);
      break;
    case Coll::allgather: {
      const Loc own = in_place ? Loc{Buf::recv, static_cast<uint64_t>(me) * n} : Loc{Buf::send};
      if (P == 1)
        b.copy(Loc{Buf::recv}, own, n);
      else if (algo == Algo::ring)
        allgather_ring(b, me, P, n, own);
      else if (floor_pow2(P) == P)
        allgather_rd(b, me, P, n, own);
      else
        allgather_bruck(b, me, P, n, own, in_place);
      break;
    }
    case Coll::reduce_scatter_block:
      if (P == 1) {
        if (!in_place) b.copy(Loc{Buf::recv}, Loc{Buf::send}, n);
      } else if (algo == Algo::ring) {
        rsb_ring(b, me, P, n, in_place);
      } else {
        rsb_halving(b, me, P, n, in_place);
      }
      break;
    default:
      break;
  }
  b.finish();
  return s;
}

// MPICH's crossover points (src/mpi/coll/*, CVARs of the same names):
//   allreduce, reduce  rd up to 2 KiB (ALLREDUCE_SHORT_MSG_SIZE, REDUCE_SHORT_MSG_SIZE)
//                      or when the vector has fewer elements than p' (taken here as 8-byte
//                      elements, as the element size is not known), else Rabenseifner's
//   bcast              rd below 12 KiB (BCAST_SHORT_MSG_SIZE) or below 8 ranks
//                      (BCAST_MIN_PROCS); else scatter + recursive doubling for p a power
//                      of two below 512 KiB (BCAST_LONG_MSG_SIZE), else scatter + ring
//   allgather          rd (recursive doubling) for p a power of two below 512 KiB in all
//                      (ALLGATHER_LONG_MSG_SIZE), rd (Bruck) below 80 KiB
//                      (ALLGATHER_SHORT_MSG_SIZE) otherwise, else the ring
//   reduce_scatter_block  recursive halving up to 512 KiB of input
//                      (REDSCAT_COMMUTATIVE_LONG_MSG_SIZE), else the ring (MPICH's
//                      pairwise exchange costs the same: (p-1)·α + N(p-1)/p·(β+γ))
Algo default_algo(Coll c, uint64_t bytes, int size) {
  const uint64_t pof2 = static_cast<uint64_t>(floor_pow2(std::max(size, 1)));
  const bool is_pof2 = pof2 == static_cast<uint64_t>(std::max(size, 1));
  switch (c) {
    case Coll::allreduce:
    case Coll::reduce:
      return bytes <= 2048 || bytes < 8 * pof2 ? Algo::rd : Algo::rabenseifner;
    case Coll::bcast:
      if (bytes < 12288 || size < 8) return Algo::rd;
      return is_pof2 && bytes < 524288 ? Algo::rabenseifner : Algo::ring;
    case Coll::allgather:
      if (is_pof2 ? bytes < 524288 : bytes < 81920) return Algo::rd;
      return Algo::ring;
    case Coll::reduce_scatter_block:
      return bytes <= 524288 ? Algo::rd : Algo::ring;
    default:
      return Algo::mpi;
  }
}

}  // namespace streamcoll::sched
