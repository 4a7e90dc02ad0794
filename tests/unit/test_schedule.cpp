// Host schedules (algorithms/schedule.hpp), run by a simulator that executes the
// schedules of all p ranks together on real buffers. No MPI.
//
// The simulator checks, besides the results:
//   - every op: count > 0, buffer ranges inside the buffers (send, recv as the collective
//     defines them, tmp as Schedule::tmp_elems), peers valid, nothing written to send,
//     send never used in place, a non-root reduce never touching recv, no overlapping
//     operands of one reduce or copy;
//   - every round: no region both sent and received into, no region received into twice;
//   - messages: a round posts all its sends (their data taken at that moment) and
//     receives; messages between two ranks match in posting order and must have the same
//     count; a send completes only when it is matched (the strictest MPI can be); a round
//     runs its reduce and copy operations once all its messages completed;
//   - a deadlock (ranks left, none can move) is reported with what each one waits for;
//   - tmp and the parts of recv that hold no input start as poison: a reduction that reads
//     poison fails, and so does poison in a result. Integer elements carry the set of
//     ranks summed into them, so a contribution counted twice or missed is caught.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <numeric>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "algorithms/blueconnect_plan.hpp"
#include "algorithms/schedule.hpp"
#include "hierarchies.hpp"

using namespace streamcoll;
using namespace streamcoll::sched;

namespace {

// ---- element types ---------------------------------------------------------------------

/// An integer element and the set of ranks whose contributions it holds (p <= 64).
struct Cell {
  int64_t v = 0;
  uint64_t ranks = 0;
  bool poison = false;
  bool operator==(const Cell& o) const {
    return v == o.v && ranks == o.ranks && poison == o.poison;
  }
};

int64_t input_value(int rank, uint64_t j) {
  return int64_t{rank} * 1000003 + static_cast<int64_t>(j) * 7 + 1;
}

struct IntElems {
  using T = Cell;
  static T input(int rank, uint64_t j) { return {input_value(rank, j), uint64_t{1} << rank, false}; }
  static T poison() { return {-777, 0, true}; }
  static bool is_poison(const T& x) { return x.poison; }
  /// dst = src + dst; a false return names the fault.
  static const char* combine(T& dst, const T& src) {
    if (dst.poison || src.poison) return "a reduction reads data never written";
    if (dst.ranks & src.ranks) return "a reduction counts a rank's contribution twice";
    dst.v += src.v;
    dst.ranks |= src.ranks;
    return nullptr;
  }
};

struct DoubleElems {
  using T = double;
  static T input(int rank, uint64_t j) { return 1.0 / (rank + 1) + static_cast<double>(j) * 1e-3; }
  static T poison() { return std::nan("7"); }
  static bool is_poison(const T& x) { return std::isnan(x); }
  static const char* combine(T& dst, const T& src) {
    if (std::isnan(dst) || std::isnan(src)) return "a reduction reads data never written";
    dst = src + dst;
    return nullptr;
  }
};

// ---- the simulator ---------------------------------------------------------------------

std::string describe(const Params& p) {
  std::ostringstream s;
  s << name(p.coll) << " algo=" << name(p.algo) << " p=" << p.size << " count=" << p.count
    << " in_place=" << p.in_place;
  if (p.coll == Coll::reduce || p.coll == Coll::bcast) s << " root=" << p.root;
  return s.str();
}

bool is_reduction(Coll c) {
  return c == Coll::allreduce || c == Coll::reduce || c == Coll::reduce_scatter_block;
}

/// Elements of the caller's send and receive buffers of `rank`, as MPI defines them.
/// `in_place` is the effective one (reduce: only at the root).
void user_sizes(const Params& p, int rank, bool in_place, uint64_t* send, uint64_t* recv) {
  const uint64_t n = p.count, all = n * static_cast<uint64_t>(p.size);
  switch (p.coll) {
    case Coll::allreduce: *send = n, *recv = n; break;
    case Coll::reduce: *send = n, *recv = rank == p.root ? n : 0; break;
    case Coll::bcast: *send = 0, *recv = n; break;
    case Coll::allgather: *send = n, *recv = all; break;
    case Coll::reduce_scatter_block: *send = all, *recv = in_place ? all : n; break;
    default: *send = *recv = 0; break;
  }
  if (in_place) *send = 0;
}

bool overlap(uint64_t a, uint64_t na, uint64_t b, uint64_t nb) { return a < b + nb && b < a + na; }

using BuildFn = std::function<Schedule(const Params&)>;

/// Runs the collective p on all ranks. Returns "" or the first fault found. With
/// `results` given, it receives every rank's receive buffer at the end.
template <class E>
std::string simulate(const Params& base, const BuildFn& build_fn = build,
                     std::vector<std::vector<typename E::T>>* results = nullptr) {
  using T = typename E::T;
  const int P = base.size;
  const uint64_t n = base.count;
  std::ostringstream err;

  struct Rank {
    Params par;
    bool in_place = false;
    Schedule s;
    std::vector<T> buf[3];
    uint64_t limit[3] = {};
    size_t round = 0;
    bool posted = false;
    int pending = 0;  // unmatched messages of the posted round
  };
  std::vector<Rank> rk(static_cast<size_t>(P));

  // Build and check every rank's schedule before running anything.
  for (int r = 0; r < P; ++r) {
    Rank& R = rk[static_cast<size_t>(r)];
    R.par = base;
    R.par.rank = r;
    R.in_place = base.in_place && (base.coll != Coll::reduce || r == base.root);
    R.s = build_fn(R.par);
    const Schedule& s = R.s;
    uint64_t us = 0, ur = 0;
    user_sizes(base, r, R.in_place, &us, &ur);
    R.limit[0] = us;
    R.limit[1] = ur;
    R.limit[2] = s.tmp_elems;
    auto fail = [&](size_t i, const char* what) {
      err << "rank " << r << " op " << i << ": " << what;
      return err.str();
    };
    if (s.ops.empty() != s.rounds.empty()) return fail(0, "rounds and ops disagree");
    if (!s.rounds.empty() && s.rounds[0] != 0) return fail(0, "first round does not start at 0");
    for (size_t i = 1; i < s.rounds.size(); ++i)
      if (s.rounds[i] <= s.rounds[i - 1] || s.rounds[i] > s.ops.size())
        return fail(s.rounds[i], "rounds not increasing (an empty round?)");
    for (size_t i = 0; i < s.ops.size(); ++i) {
      const Op& o = s.ops[i];
      if (o.count == 0) return fail(i, "count 0");
      for (Buf b : {o.buf, o.src}) {
        if (static_cast<int>(b) > 2) return fail(i, "unknown buffer");
      }
      const bool msg = o.kind == Op::Kind::send || o.kind == Op::Kind::recv;
      auto in_range = [&](Buf b, uint64_t off) {
        const uint64_t lim = R.limit[static_cast<int>(b)];
        return off <= lim && o.count <= lim - off;
      };
      auto uses = [&](Buf b) { return o.buf == b || (!msg && o.src == b); };
      if (R.in_place && uses(Buf::send)) return fail(i, "uses send in place");
      if (base.coll == Coll::bcast && uses(Buf::send)) return fail(i, "bcast uses send");
      if (base.coll == Coll::reduce && r != base.root && uses(Buf::recv))
        return fail(i, "a non-root reduce touches recv");
      if (o.kind != Op::Kind::send && o.buf == Buf::send) return fail(i, "writes send");
      if (!in_range(o.buf, o.off)) return fail(i, "out of its buffer");
      if (msg) {
        if (o.peer < 0 || o.peer >= P || o.peer == r) return fail(i, "bad peer");
      } else {
        if (!in_range(o.src, o.src_off)) return fail(i, "source out of its buffer");
        if (o.src == o.buf && overlap(o.off, o.count, o.src_off, o.count))
          return fail(i, "source and destination overlap");
        if (o.kind == Op::Kind::reduce && !is_reduction(base.coll))
          return fail(i, "a reduction in a collective without one");
      }
    }
    for (size_t k = 0; k < s.num_rounds(); ++k) {
      for (uint32_t i = s.round_begin(k); i < s.round_end(k); ++i) {
        const Op& a = s.ops[i];
        if (a.kind != Op::Kind::recv) continue;
        for (uint32_t j = s.round_begin(k); j < s.round_end(k); ++j) {
          const Op& b = s.ops[j];
          if (j == i || (b.kind != Op::Kind::send && b.kind != Op::Kind::recv)) continue;
          if (b.buf == a.buf && overlap(a.off, a.count, b.off, b.count))
            return fail(i, b.kind == Op::Kind::send
                               ? "receives into a region sent in the same round"
                               : "two receives into one region in a round");
        }
      }
    }
    // Buffers: inputs where the collective has them, poison everywhere else.
    for (auto& b : R.buf) b.clear();
    R.buf[0].assign(us, E::poison());
    R.buf[1].assign(ur != 0 ? ur : n, E::poison());  // a non-root reduce's recv stays poison
    R.buf[2].assign(s.tmp_elems, E::poison());
    switch (base.coll) {
      case Coll::allreduce:
      case Coll::reduce:
      case Coll::reduce_scatter_block: {
        std::vector<T>& in = R.in_place ? R.buf[1] : R.buf[0];
        const uint64_t len = base.coll == Coll::reduce_scatter_block ? n * P : n;
        for (uint64_t j = 0; j < len; ++j) in[j] = E::input(r, j);
        break;
      }
      case Coll::bcast:
        if (r == base.root)
          for (uint64_t j = 0; j < n; ++j) R.buf[1][j] = E::input(r, j);
        break;
      case Coll::allgather:
        for (uint64_t j = 0; j < n; ++j) {
          if (R.in_place)
            R.buf[1][static_cast<uint64_t>(r) * n + j] = E::input(r, j);
          else
            R.buf[0][j] = E::input(r, j);
        }
        break;
      default:
        break;
    }
  }

  // Run. Channel (src, dst) keeps the unmatched sends or the unmatched receives.
  struct Msg {
    int rank;       // the poster
    const Op* op;
    std::vector<T> data;  // sends: the data at posting
  };
  std::vector<std::deque<Msg>> sends(static_cast<size_t>(P) * P), recvs(sends.size());
  std::string fault;
  auto deliver = [&](Msg& snd, Msg& rcv) {
    if (snd.op->count != rcv.op->count) {
      if (fault.empty()) {
        std::ostringstream f;
        f << "rank " << snd.rank << " sends " << snd.op->count << " elements to rank "
          << rcv.rank << ", which receives " << rcv.op->count;
        fault = f.str();
      }
      return;
    }
    Rank& to = rk[static_cast<size_t>(rcv.rank)];
    std::copy(snd.data.begin(), snd.data.end(),
              to.buf[static_cast<int>(rcv.op->buf)].begin() + static_cast<ptrdiff_t>(rcv.op->off));
    --rk[static_cast<size_t>(snd.rank)].pending;
    --to.pending;
  };

  for (bool moved = true; moved && fault.empty();) {
    moved = false;
    for (int r = 0; r < P && fault.empty(); ++r) {
      Rank& R = rk[static_cast<size_t>(r)];
      if (R.round >= R.s.num_rounds()) continue;
      if (!R.posted) {
        R.posted = true;
        moved = true;
        for (uint32_t i = R.s.round_begin(R.round); i < R.s.round_end(R.round); ++i) {
          const Op& o = R.s.ops[i];
          if (o.kind == Op::Kind::send) {
            const std::vector<T>& b = R.buf[static_cast<int>(o.buf)];
            Msg m{r, &o, std::vector<T>(b.begin() + static_cast<ptrdiff_t>(o.off),
                                        b.begin() + static_cast<ptrdiff_t>(o.off + o.count))};
            R.pending++;
            std::deque<Msg>& rq = recvs[static_cast<size_t>(r) * P + o.peer];
            if (!rq.empty()) {
              deliver(m, rq.front());
              rq.pop_front();
            } else {
              sends[static_cast<size_t>(r) * P + o.peer].push_back(std::move(m));
            }
          } else if (o.kind == Op::Kind::recv) {
            Msg m{r, &o, {}};
            R.pending++;
            std::deque<Msg>& sq = sends[static_cast<size_t>(o.peer) * P + r];
            if (!sq.empty()) {
              deliver(sq.front(), m);
              sq.pop_front();
            } else {
              recvs[static_cast<size_t>(o.peer) * P + r].push_back(m);
            }
          }
        }
      }
      if (R.posted && R.pending == 0 && fault.empty()) {
        for (uint32_t i = R.s.round_begin(R.round); i < R.s.round_end(R.round); ++i) {
          const Op& o = R.s.ops[i];
          if (o.kind != Op::Kind::reduce && o.kind != Op::Kind::copy) continue;
          std::vector<T>& d = R.buf[static_cast<int>(o.buf)];
          const std::vector<T>& src = R.buf[static_cast<int>(o.src)];
          for (uint64_t j = 0; j < o.count; ++j) {
            if (o.kind == Op::Kind::copy) {
              d[o.off + j] = src[o.src_off + j];
            } else if (const char* e = E::combine(d[o.off + j], src[o.src_off + j])) {
              std::ostringstream f;
              f << "rank " << r << " round " << R.round << " op " << i << ": " << e;
              fault = f.str();
              break;
            }
          }
        }
        R.round++;
        R.posted = false;
        moved = true;
      }
    }
  }
  if (!fault.empty()) return fault;
  for (int r = 0; r < P; ++r) {
    const Rank& R = rk[static_cast<size_t>(r)];
    if (R.round < R.s.num_rounds()) {
      err << "deadlock:";
      for (int q = 0; q < P; ++q) {
        const Rank& Q = rk[static_cast<size_t>(q)];
        if (Q.round >= Q.s.num_rounds()) continue;
        err << " [rank " << q << " round " << Q.round << " waits on";
        for (uint32_t i = Q.s.round_begin(Q.round); i < Q.s.round_end(Q.round); ++i) {
          const Op& o = Q.s.ops[i];
          if (o.kind == Op::Kind::send || o.kind == Op::Kind::recv)
            err << (o.kind == Op::Kind::send ? " send>" : " recv<") << o.peer << "("
                << o.count << ")";
        }
        err << "]";
      }
      return err.str();
    }
  }
  for (size_t c = 0; c < sends.size(); ++c)
    if (!sends[c].empty() || !recvs[c].empty()) return "unmatched messages left over";
  if (results) {
    results->clear();
    for (const Rank& R : rk) results->push_back(R.buf[1]);
  }
  return "";
}

/// The expected receive buffer of `rank` (integer elements), computed by plain loops.
/// In place, reduce_scatter_block's receive buffer beyond count keeps the rank's input
/// (MPI writes the result to the first count elements only).
std::vector<Cell> expected(const Params& p, int rank) {
  const uint64_t n = p.count;
  const int P = p.size;
  const uint64_t everyone = P == 64 ? ~uint64_t{0} : (uint64_t{1} << P) - 1;
  auto sum = [&](uint64_t j) {
    Cell c{0, everyone, false};
    for (int r = 0; r < P; ++r) c.v += input_value(r, j);
    return c;
  };
  std::vector<Cell> out;
  switch (p.coll) {
    case Coll::allreduce:
      for (uint64_t j = 0; j < n; ++j) out.push_back(sum(j));
      break;
    case Coll::reduce:
      for (uint64_t j = 0; j < n; ++j) out.push_back(rank == p.root ? sum(j) : IntElems::poison());
      break;
    case Coll::bcast:
      for (uint64_t j = 0; j < n; ++j) out.push_back(IntElems::input(p.root, j));
      break;
    case Coll::allgather:
      for (int q = 0; q < P; ++q)
        for (uint64_t j = 0; j < n; ++j) out.push_back(IntElems::input(q, j));
      break;
    case Coll::reduce_scatter_block:
      for (uint64_t j = 0; j < n; ++j) out.push_back(sum(static_cast<uint64_t>(rank) * n + j));
      if (p.in_place && P > 1)
        for (uint64_t j = n; j < n * static_cast<uint64_t>(P); ++j)
          out.push_back(IntElems::input(rank, j));
      break;
    default:
      break;
  }
  return out;
}

/// The most tmp a schedule may ask for.
uint64_t tmp_bound(const Params& p) {
  const uint64_t n = p.count, all = n * static_cast<uint64_t>(p.size);
  if (p.algo == Algo::ccube && p.coll == Coll::allreduce) {  // a chunk per child, <= 4
    const uint64_t c = p.chunk == 0 || p.chunk >= n ? 1 : (n + p.chunk - 1) / p.chunk;
    return 4 * ((n + c - 1) / c);
  }
  switch (p.coll) {
    case Coll::allreduce:
    case Coll::reduce: return 2 * n;
    case Coll::bcast: return 0;
    case Coll::allgather: return all;
    case Coll::reduce_scatter_block: return 2 * all;
    default: return 0;
  }
}

/// Simulates p with integers and checks every rank's result. "" when all is well.
std::string run_and_check(const Params& p, const BuildFn& build_fn = build) {
  std::vector<std::vector<Cell>> res;
  std::string e = simulate<IntElems>(p, build_fn, &res);
  if (!e.empty()) return e;
  for (int r = 0; r < p.size; ++r) {
    Params pr = p;
    pr.rank = r;
    const uint64_t tmp = build_fn(pr).tmp_elems;
    if (tmp > tmp_bound(p)) {
      std::ostringstream f;
      f << "rank " << r << " asks for " << tmp << " tmp elements, more than " << tmp_bound(p);
      return f.str();
    }
    const std::vector<Cell> want = expected(p, r);
    for (size_t j = 0; j < want.size(); ++j) {
      if (res[static_cast<size_t>(r)][j] == want[j]) continue;
      const Cell& got = res[static_cast<size_t>(r)][j];
      std::ostringstream f;
      f << "rank " << r << " recv[" << j << "] = " << got.v << (got.poison ? " (poison)" : "")
        << " ranks 0x" << std::hex << got.ranks << std::dec << ", expected " << want[j].v
        << (want[j].poison ? " (poison: untouched)" : "") << " ranks 0x" << std::hex
        << want[j].ranks;
      return f.str();
    }
  }
  return "";
}

std::vector<int> rank_counts() {
  std::vector<int> v;
  for (int p = 1; p <= 33; ++p) v.push_back(p);
  v.push_back(48);
  v.push_back(64);
  return v;
}

std::vector<uint64_t> counts_for(int p) {
  std::vector<uint64_t> c;
  const uint64_t P = static_cast<uint64_t>(p);
  for (uint64_t n : {uint64_t{1}, uint64_t{2}, P - 1, P, P + 1, 3 * P + 5, uint64_t{100}})
    if (n > 0 && std::find(c.begin(), c.end(), n) == c.end()) c.push_back(n);
  return c;
}

std::vector<int> roots_for(Coll c, int p) {
  if (c != Coll::reduce && c != Coll::bcast) return {0};
  std::vector<int> r{0};
  for (int x : {p - 1, p / 2})
    if (std::find(r.begin(), r.end(), x) == r.end()) r.push_back(x);
  return r;
}

constexpr Coll kColls[] = {Coll::allreduce, Coll::reduce, Coll::bcast, Coll::allgather,
                           Coll::reduce_scatter_block};
constexpr Algo kAlgos[] = {Algo::rd, Algo::rabenseifner, Algo::ring};

/// Every collective, algorithm, rank count, count, in-place flag and root for `coll`.
void sweep(Coll coll) {
  const auto t0 = std::chrono::steady_clock::now();
  int sims = 0, schedules = 0, failures = 0;
  for (Algo algo : kAlgos) {
    for (int p : rank_counts()) {
      for (uint64_t n : counts_for(p)) {
        for (bool in_place : {false, true}) {
          for (int root : roots_for(coll, p)) {
            Params par;
            par.coll = coll;
            par.algo = algo;
            par.size = p;
            par.root = root;
            par.count = n;
            par.in_place = in_place;
            const std::string e = run_and_check(par);
            ++sims;
            schedules += p;
            if (!e.empty() && ++failures <= 8) FAIL_CHECK(describe(par) << ": " << e);
          }
        }
      }
    }
  }
  const double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE(name(coll) << ": " << sims << " collectives simulated (" << schedules
                     << " rank schedules) in " << s << " s, " << failures << " failed");
  CHECK(failures == 0);
}

}  // namespace

TEST_CASE("schedule: allreduce, every algorithm, rank count, count and in-place flag") {
  sweep(Coll::allreduce);
}
TEST_CASE("schedule: reduce, every algorithm, rank count, count, in-place flag and root") {
  sweep(Coll::reduce);
}
TEST_CASE("schedule: bcast, every algorithm, rank count, count and root") {
  sweep(Coll::bcast);
}
TEST_CASE("schedule: allgather, every algorithm, rank count, count and in-place flag") {
  sweep(Coll::allgather);
}
TEST_CASE("schedule: reduce_scatter_block, every algorithm, rank count, count, in place") {
  sweep(Coll::reduce_scatter_block);
}

/// Simulates allreduce p with doubles: "" when every rank has the same bits and they
/// are the sum.
std::string run_doubles(const Params& p, const BuildFn& build_fn = build) {
  std::vector<std::vector<double>> res;
  std::string e = simulate<DoubleElems>(p, build_fn, &res);
  if (!e.empty()) return e;
  const size_t bytes = p.count * sizeof(double);
  for (int r = 1; r < p.size; ++r)
    if (std::memcmp(res[static_cast<size_t>(r)].data(), res[0].data(), bytes) != 0)
      return "rank " + std::to_string(r) + " differs from rank 0 in some bits";
  for (uint64_t j = 0; j < p.count; ++j) {
    double want = 0;
    for (int r = 0; r < p.size; ++r) want += DoubleElems::input(r, j);
    if (!(std::fabs(res[0][j] - want) <= 1e-9 * std::fabs(want)))
      return "element " + std::to_string(j) + " is wrong";
  }
  return "";
}

TEST_CASE("schedule: allreduce results are bitwise equal on all ranks (doubles)") {
  int failures = 0;
  for (Algo algo : kAlgos) {
    for (int p : rank_counts()) {
      for (uint64_t n : {uint64_t{1}, static_cast<uint64_t>(p) + 1, uint64_t{100}}) {
        for (bool in_place : {false, true}) {
          Params par;
          par.algo = algo;
          par.size = p;
          par.count = n;
          par.in_place = in_place;
          const std::string e = run_doubles(par);
          if (!e.empty() && ++failures <= 8) FAIL_CHECK(describe(par) << ": " << e);
        }
      }
    }
  }
  CHECK(failures == 0);

  // The check itself: every rank sums all vectors starting from its own is right in
  // integers but not bit for bit in floating point.
  auto own_order = [](const Params& q) {
    Schedule s;
    s.rounds.push_back(0);
    const uint64_t n = q.count;
    for (int k = 1; k < q.size; ++k)
      s.ops.push_back({Op::Kind::send, Buf::send, Buf::tmp, (q.rank + k) % q.size, 0, 0, n});
    for (int k = 1; k < q.size; ++k)
      s.ops.push_back({Op::Kind::recv, Buf::tmp, Buf::tmp, (q.rank + k) % q.size,
                       (k - 1) * n, 0, n});
    s.ops.push_back({Op::Kind::copy, Buf::recv, Buf::send, -1, 0, 0, n});
    for (int k = 1; k < q.size; ++k)
      s.ops.push_back({Op::Kind::reduce, Buf::recv, Buf::tmp, -1, 0, (k - 1) * n, n});
    s.tmp_elems = (q.size - 1) * n;
    return s;
  };
  Params par;
  par.size = 3;
  par.count = 100;
  CHECK(run_and_check(par, own_order) == "");
  CHECK(run_doubles(par, own_order).find("differs") != std::string::npos);
}

TEST_CASE("schedule: the simulator catches broken schedules") {
  Params par;
  par.coll = Coll::allreduce;
  par.algo = Algo::ring;
  par.size = 4;
  par.count = 8;
  auto with = [&](std::function<void(Schedule&, const Params&)> spoil) {
    return [spoil](const Params& q) {
      Schedule s = build(q);
      spoil(s, q);
      return s;
    };
  };
  REQUIRE(run_and_check(par) == "");

  auto contains = [](const std::string& s, const char* what) {
    INFO(s);
    return s.find(what) != std::string::npos;
  };
  // An op beyond its buffer fails instead of writing past the end.
  CHECK(contains(run_and_check(par, with([](Schedule& s, const Params& q) {
                   if (q.rank == 2) s.ops[0].off = 1000;
                 })),
                 "out of its buffer"));
  CHECK(contains(run_and_check(par, with([](Schedule& s, const Params&) {
                   for (Op& o : s.ops)
                     if (o.kind == Op::Kind::reduce) o.src_off = ~uint64_t{0} - 1;
                 })),
                 "source out of its buffer"));
  // A receive of a different count than its send.
  CHECK(contains(run_and_check(par, with([](Schedule& s, const Params& q) {
                   if (q.rank == 1) s.ops[0].count -= 1;
                 })),
                 "which receives"));
  // Everyone receives before sending: a deadlock.
  CHECK(contains(run_and_check(par, with([](Schedule& s, const Params&) {
                   Schedule t;
                   for (const Op& o : s.ops)
                     if (o.kind == Op::Kind::recv) {
                       t.rounds.push_back(static_cast<uint32_t>(t.ops.size()));
                       t.ops.push_back(o);
                     }
                   for (const Op& o : s.ops)
                     if (o.kind == Op::Kind::send) {
                       t.rounds.push_back(static_cast<uint32_t>(t.ops.size()));
                       t.ops.push_back(o);
                     }
                   t.tmp_elems = s.tmp_elems;
                   s = t;
                 })),
                 "deadlock"));
  // A wrong peer.
  CHECK_FALSE(run_and_check(par, with([](Schedule& s, const Params& q) {
                if (q.rank == 0) s.ops[0].peer = 2;
              })).empty());
  // send in place, a reduce of data never written, a missing step.
  Params ip = par;
  ip.in_place = true;
  CHECK(contains(run_and_check(ip, with([](Schedule& s, const Params&) {
                   s.ops[0].buf = Buf::send;
                 })),
                 "uses send in place"));
  CHECK(contains(run_and_check(ip, with([](Schedule& s, const Params&) {
                   s.tmp_elems += 4;
                   for (Op& o : s.ops)
                     if (o.kind == Op::Kind::reduce) o.src_off += 2;
                 })),
                 "never written"));
  CHECK_FALSE(run_and_check(ip, with([](Schedule& s, const Params&) {
                s.ops.resize(s.round_begin(s.num_rounds() - 1));
                s.rounds.pop_back();
              })).empty());
  // Receiving into what the same round sends.
  CHECK(contains(run_and_check(ip, with([](Schedule& s, const Params&) {
                   s.ops[1].buf = s.ops[0].buf;
                   s.ops[1].off = s.ops[0].off;
                 })),
                 "sent in the same round"));
  // A non-root reduce touching recv.
  Params red = par;
  red.coll = Coll::reduce;
  red.root = 3;
  CHECK(contains(run_and_check(red, with([](Schedule& s, const Params& q) {
                   if (q.rank == 0)
                     for (Op& o : s.ops)
                       if (o.buf == Buf::tmp) o.buf = Buf::recv;
                 })),
                 "non-root reduce touches recv"));
}

TEST_CASE("schedule: no data, no schedule; reduce's in place only at the root") {
  for (Coll c : kColls) {
    CHECK(schedulable(c));
    for (Algo a : kAlgos) {
      Params p;
      p.coll = c;
      p.algo = a;
      p.size = 5;
      p.rank = 3;
      p.count = 0;
      const Schedule s = build(p);
      CHECK(s.ops.empty());
      CHECK(s.rounds.empty());
      CHECK(s.tmp_elems == 0);
    }
  }
  for (Coll c : {Coll::allgatherv, Coll::reduce_scatter, Coll::alltoall, Coll::barrier})
    CHECK_FALSE(schedulable(c));
  // A single rank copies at most.
  Params one;
  one.count = 10;
  const Schedule s = build(one);
  REQUIRE(s.ops.size() == 1);
  CHECK(s.ops[0].kind == Op::Kind::copy);
  one.in_place = true;
  CHECK(build(one).ops.empty());
}

TEST_CASE("schedule: algorithm names and defaults") {
  CHECK(name(Algo::rd) == "rd");
  CHECK(name(Algo::rabenseifner) == "rabenseifner");
  CHECK(name(Algo::ring) == "ring");
  CHECK(name(Algo::mpi) == "mpi");

  // Latency-bound sizes get recursive doubling / binomial trees.
  CHECK(default_algo(Coll::allreduce, 1024, 16) == Algo::rd);
  CHECK(default_algo(Coll::allreduce, 1 << 20, 16) == Algo::rabenseifner);
  CHECK(default_algo(Coll::reduce, 2048, 7) == Algo::rd);
  CHECK(default_algo(Coll::reduce, 4096, 7) == Algo::rabenseifner);
  CHECK(default_algo(Coll::bcast, 100000, 4) == Algo::rd);
  CHECK(default_algo(Coll::bcast, 8192, 64) == Algo::rd);
  CHECK(default_algo(Coll::bcast, 100000, 64) == Algo::rabenseifner);
  CHECK(default_algo(Coll::bcast, 100000, 48) == Algo::ring);
  CHECK(default_algo(Coll::bcast, 1 << 20, 64) == Algo::ring);
  CHECK(default_algo(Coll::allgather, 256 << 10, 16) == Algo::rd);
  CHECK(default_algo(Coll::allgather, 256 << 10, 12) == Algo::ring);
  CHECK(default_algo(Coll::allgather, 64 << 10, 12) == Algo::rd);
  CHECK(default_algo(Coll::allgather, 1 << 20, 16) == Algo::ring);
  CHECK(default_algo(Coll::reduce_scatter_block, 512 << 10, 12) == Algo::rd);
  CHECK(default_algo(Coll::reduce_scatter_block, 1 << 20, 12) == Algo::ring);

  // Whatever the default, it is schedulable and gives a correct schedule.
  for (Coll c : kColls) {
    for (uint64_t bytes : {uint64_t{8}, uint64_t{4096}, uint64_t{100000}, uint64_t{1} << 22}) {
      for (int p : {1, 3, 8, 12, 64}) {
        const Algo a = default_algo(c, bytes, p);
        REQUIRE(a != Algo::mpi);
        Params par;
        par.coll = c;
        par.algo = a;
        par.size = p;
        par.count = 17;
        par.root = p - 1;
        INFO(describe(par));
        CHECK(run_and_check(par) == "");
      }
    }
  }
  CHECK(default_algo(Coll::alltoall, 8, 4) == Algo::mpi);
}

// ---- BlueConnect stages (algorithms/blueconnect_plan.hpp) ------------------------------
// The stage schedules of a hierarchy, concatenated, run by the same simulator: allreduce
// (reduce-scatter stages up, all-gather stages down) against the plain-loop sums, and the
// two halves alone against what each must leave.

namespace {

Schedule concat(const std::vector<Schedule>& parts) {
  Schedule out;
  for (const Schedule& s : parts) {
    const uint32_t base = static_cast<uint32_t>(out.ops.size());
    for (uint32_t r : s.rounds) out.rounds.push_back(base + r);
    out.ops.insert(out.ops.end(), s.ops.begin(), s.ops.end());
    out.tmp_elems = std::max(out.tmp_elems, s.tmp_elems);
  }
  return out;
}

/// The BlueConnect schedule of one rank: reduce-scatter stages (rs), then all-gather
/// stages backwards (ag).
BuildFn blueconnect(const streamcoll::topo::Hierarchy& h, bool ring_only, bool rs, bool ag) {
  return [h, ring_only, rs, ag](const Params& q) {
    const streamcoll::bc::Plan pl = streamcoll::bc::plan(h, q.rank, q.count, ring_only);
    std::vector<Schedule> parts;
    if (rs)
      for (size_t i = 0; i < pl.stages.size(); ++i)
        parts.push_back(build_stage_reduce_scatter(pl.stages[i], i == 0 && !q.in_place));
    if (ag)
      for (size_t i = pl.stages.size(); i-- > 0;)
        parts.push_back(build_stage_all_gather(pl.stages[i]));
    return concat(parts);
  };
}

std::string hdesc(const streamcoll::topo::Hierarchy& h) { return streamcoll::testing::text(h.factors); }

/// Reduce-scatter stages alone (in place): every rank's final block holds the sum.
/// All-gather stages alone: afterwards every element holds its owner's input.
std::string run_halves(const Params& p, const streamcoll::topo::Hierarchy& h, bool ring_only) {
  std::vector<std::vector<Cell>> res;
  Params q = p;
  q.in_place = true;
  if (auto e = simulate<IntElems>(q, blueconnect(h, ring_only, true, false), &res); !e.empty())
    return "reduce-scatter: " + e;
  const uint64_t everyone = p.size == 64 ? ~uint64_t{0} : (uint64_t{1} << p.size) - 1;
  std::vector<int> owner(p.count, -1);
  for (int r = 0; r < p.size; ++r) {
    const auto pl = streamcoll::bc::plan(h, r, p.count, ring_only);
    for (uint64_t j = pl.final_off; j < pl.final_off + pl.final_len; ++j) {
      owner[j] = r;
      int64_t sum = 0;
      for (int s = 0; s < p.size; ++s) sum += input_value(s, j);
      const Cell& c = res[static_cast<size_t>(r)][j];
      if (c.poison || c.v != sum || c.ranks != everyone)
        return "reduce-scatter: rank " + std::to_string(r) + " element " + std::to_string(j) +
               " is not the sum";
    }
  }
  if (auto e = simulate<IntElems>(q, blueconnect(h, ring_only, false, true), &res); !e.empty())
    return "all-gather: " + e;
  for (int r = 0; r < p.size; ++r)
    for (uint64_t j = 0; j < p.count; ++j)
      if (!(res[static_cast<size_t>(r)][j] == IntElems::input(owner[j], j)))
        return "all-gather: rank " + std::to_string(r) + " element " + std::to_string(j) +
               " is not its owner's";
  return "";
}

}  // namespace

TEST_CASE("schedule: BlueConnect stages, every factorization of 1..24 ranks and named ones") {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::pair<int, std::vector<int>>> cases;
  for (int p = 1; p <= 24; ++p)
    for (auto& f : streamcoll::testing::factorizations(p)) cases.push_back({p, f});
  for (auto f : {std::vector<int>{3, 2, 2}, {4, 6}, {16, 6}, {2, 2, 2}, {6, 4}, {2, 32}, {4, 4, 4},
                 {4, 12}})
    cases.push_back({std::accumulate(f.begin(), f.end(), 1, std::multiplies<int>()), f});
  int sims = 0, failures = 0;
  for (auto& [p, f] : cases) {
    for (bool shuffle : {false, true}) {
      const auto h = streamcoll::testing::layout(f, p, shuffle ? 3 : -1);
      for (bool ring_only : {false, true}) {
        for (uint64_t n : counts_for(p)) {
          if (p > 24 && n != uint64_t(3 * p + 5) && n != 1) continue;  // keep it quick
          for (bool in_place : {false, true}) {
            Params par;
            par.size = p;
            par.count = n;
            par.in_place = in_place;
            // Integer cells track contributions for up to 64 ranks; beyond, doubles only.
            std::string e;
            if (p <= 64) {
              e = run_and_check(par, blueconnect(h, ring_only, true, true));
              if (e.empty() && in_place) e = run_halves(par, h, ring_only);
            }
            if (e.empty() && !in_place && (n == static_cast<uint64_t>(p) + 1 || p > 64))
              e = run_doubles(par, blueconnect(h, ring_only, true, true));
            ++sims;
            if (!e.empty() && ++failures <= 8) {
              const std::string what = "hierarchy " + hdesc(h) +
                                       (shuffle ? " shuffled" : "") +
                                       (ring_only ? " rings" : "") + " count " +
                                       std::to_string(n) + (in_place ? " in place" : "");
              FAIL_CHECK(what << ": " << e);
            }
          }
        }
      }
    }
  }
  const double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE("BlueConnect: " << cases.size() << " hierarchies, " << sims
                          << " allreduce simulations (plus halves) in " << s << " s, "
                          << failures << " failed");
  CHECK(failures == 0);
}

TEST_CASE("schedule: BlueConnect message counts match the decomposition") {
  // Per rank, a ring stage of m sends 2(m-1) messages (reduce-scatter + all-gather) and a
  // halving/doubling stage 2 lg m, when every block is non-empty.
  for (auto f : {std::vector<int>{3, 2, 2}, {4, 6}, {2, 2, 2}, {16, 6}}) {
    const int p = std::accumulate(f.begin(), f.end(), 1, std::multiplies<int>());
    const auto h = streamcoll::testing::layout(f, p, -1);
    for (bool ring_only : {false, true}) {
      int want = 0;
      for (int m : f) {
        const bool pow2 = (m & (m - 1)) == 0;
        int lg = 0;
        while ((1 << lg) < m) ++lg;
        want += 2 * ((pow2 && !ring_only) ? lg : m - 1);
      }
      Params q;
      q.size = p;
      q.count = static_cast<uint64_t>(p) * 10;
      for (int r = 0; r < p; ++r) {
        q.rank = r;
        const Schedule s = blueconnect(h, ring_only, true, true)(q);
        const auto sends = std::count_if(s.ops.begin(), s.ops.end(),
                                         [](const Op& o) { return o.kind == Op::Kind::send; });
        const std::string what = hdesc(h) + " rank " + std::to_string(r) + (ring_only ? " rings" : "");
        CHECK_MESSAGE(sends == want, what);
      }
    }
  }
}

// ---- ccube (C-Cube's overlapped pipelined tree) --------------------------------------------

namespace {

// Node layouts for p ranks: all on one node; blocks of 2 and 3 (by-slot mapping); round
// robin over 2 nodes (by-node mapping); one rank per node; uneven (1, 3, 2, ...).
std::vector<std::pair<std::string, std::vector<int>>> layouts(int p) {
  std::vector<std::pair<std::string, std::vector<int>>> v;
  v.push_back({"one node", {}});
  std::vector<int> b2, b3, rr, solo, uneven;
  for (int r = 0; r < p; ++r) {
    b2.push_back(r / 2);
    b3.push_back(100 + r / 3);
    rr.push_back(r % 2);
    solo.push_back(r);
  }
  for (int r = 0, node = 0, left = 1; r < p; ++r) {
    uneven.push_back(node);
    if (--left == 0) left = 1 + (++node % 3);
  }
  v.push_back({"2 per node", b2});
  v.push_back({"3 per node", b3});
  v.push_back({"round robin over 2 nodes", rr});
  v.push_back({"1 per node", solo});
  v.push_back({"uneven nodes", uneven});
  return v;
}

std::vector<uint64_t> ccube_chunks(uint64_t n) {
  std::vector<uint64_t> v{0, 1, 2, 3, n / 2, n / 3 + 1, n, n + 5};
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

}  // namespace

TEST_CASE("schedule: ccube allreduce, every rank count, count, chunk size, node layout, in place") {
  int sims = 0, failures = 0;
  for (int p : rank_counts()) {
    for (const auto& [lname, nodes] : layouts(p)) {
      for (uint64_t n : counts_for(p)) {
        for (uint64_t chunk : ccube_chunks(n)) {
          for (bool in_place : {false, true}) {
            Params par;
            par.algo = Algo::ccube;
            par.size = p;
            par.count = n;
            par.chunk = chunk;
            par.in_place = in_place;
            par.node_of = nodes.empty() ? nullptr : &nodes;
            std::string e = run_and_check(par);
            if (e.empty() && (n == 100 || n == 1)) e = run_doubles(par);  // the same bits everywhere
            ++sims;
            if (!e.empty() && ++failures <= 8)
              FAIL_CHECK(describe(par) << " chunk " << chunk << ", " << lname << ": " << e);
          }
        }
      }
    }
  }
  MESSAGE("ccube: " << sims << " allreduces simulated, " << failures << " failed");
  CHECK(failures == 0);
}

TEST_CASE("schedule: ccube's tree maps onto the nodes; c chunks up and down every edge") {
  for (int p : rank_counts()) {
    for (const auto& [lname, nodes] : layouts(p)) {
      const std::vector<int>* map = nodes.empty() ? nullptr : &nodes;
      for (int root : {0, p - 1, p / 2}) {
        const Tree t = ccube_tree(p, root, map);
        INFO(p << " ranks, " << lname << ", root " << root);
        auto node = [&](int r) { return map ? (*map)[static_cast<size_t>(r)] : 0; };
        std::map<int, int> edges_in;  // per node: tree edges towards the root from another node
        int roots = 0;
        for (int r = 0; r < p; ++r) {
          const int par = t.parent[static_cast<size_t>(r)];
          CHECK(t.children[static_cast<size_t>(r)].size() <= 4);
          if (par < 0) {
            ++roots;
            CHECK(r == root);
            CHECK(t.depth[static_cast<size_t>(r)] == 0);
            continue;
          }
          CHECK(t.depth[static_cast<size_t>(r)] == t.depth[static_cast<size_t>(par)] + 1);
          if (node(par) != node(r)) ++edges_in[node(r)];
          int across = 0;
          for (int k : t.children[static_cast<size_t>(r)]) across += node(k) != node(r);
          CHECK(across <= 2);
        }
        CHECK(roots == 1);
        for (const auto& [n, e] : edges_in) CHECK(e == 1);  // one edge per node, its leader's
        CHECK(edges_in.count(node(root)) == 0);
        int height = 0;
        for (int d : t.depth) height = std::max(height, d);
        CHECK(t.height == height);
        if (p > 1 && !map) {  // a complete binary tree: floor(lg p)
          int lg = 0;
          while ((2 << lg) <= p) ++lg;
          CHECK(t.height == lg);
        }
      }
      // Messages: c chunks up every tree edge and c down it, nothing else.
      for (uint64_t c : {uint64_t{1}, uint64_t{4}, uint64_t{9}}) {
        Params par;
        par.algo = Algo::ccube;
        par.size = p;
        par.count = 72;
        par.chunk = 72 / c;
        par.node_of = map;
        const Tree t = ccube_tree(p, 0, map);
        for (int r = 0; r < p; ++r) {
          par.rank = r;
          const Schedule s = build(par);
          std::map<int, int> sent, received;
          for (const Op& o : s.ops) {
            if (o.kind == Op::Kind::send) ++sent[o.peer];
            if (o.kind == Op::Kind::recv) ++received[o.peer];
          }
          std::map<int, int> want;
          if (t.parent[static_cast<size_t>(r)] >= 0) want[t.parent[static_cast<size_t>(r)]] = static_cast<int>(c);
          for (int k : t.children[static_cast<size_t>(r)]) want[k] = static_cast<int>(c);
          CHECK_MESSAGE(sent == want, p << " ranks, " << lname << ", rank " << r << ", " << c << " chunks");
          CHECK_MESSAGE(received == want, p << " ranks, " << lname << ", rank " << r << ", " << c << " chunks");
        }
      }
    }
  }
  CHECK(name(Algo::ccube) == "ccube");
}
