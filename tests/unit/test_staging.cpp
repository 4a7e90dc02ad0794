// Staging (core/staging): where a staged call's input and results lie in its scratch
// buffer, per collective, rank and in-place use (the routes that stage on a GPU, and ht,
// which stages on pinned host memory with the root's reduce result apart).
#include <doctest/doctest.h>

#include <cstdint>
#include <tuple>
#include <vector>

#include "core/staging.hpp"

using namespace streamcoll;
using namespace streamcoll::staging;

namespace {

char g_send[1], g_recv[1 << 10];  // addresses only; never dereferenced

CollArgs reduction(Coll c, bool in_place, int count, MPI_Datatype t = MPI_INT, int root = 0) {
  CollArgs a;
  a.coll = c;
  a.sendbuf = in_place ? MPI_IN_PLACE : g_send;
  a.recvbuf = g_recv;
  a.count = count;
  a.datatype = t;
  a.op = MPI_SUM;
  a.root = root;
  a.comm = MPI_COMM_WORLD;
  return a;
}

CollArgs gather(Coll c, bool in_place, int count, MPI_Datatype t = MPI_INT) {
  CollArgs a;
  a.coll = c;
  a.sendbuf = in_place ? MPI_IN_PLACE : g_send;
  a.recvbuf = g_recv;
  a.sendcount = a.recvcount = count;
  a.sendtype = a.recvtype = t;
  a.comm = MPI_COMM_WORLD;
  return a;
}

using Ranges = std::vector<std::pair<uint64_t, uint64_t>>;

Ranges out_of(const Layout& l) {
  Ranges r;
  for (const Layout::Range& x : l.out) r.emplace_back(x.off, x.bytes);
  return r;
}

// (recvbuf offset, bytes, scratch offset) of each result range.
using Moves = std::vector<std::tuple<uint64_t, uint64_t, uint64_t>>;

Moves moves_of(const Layout& l) {
  Moves m;
  for (const Layout::Range& x : l.out) m.emplace_back(x.off, x.bytes, x.from);
  return m;
}

}  // namespace

TEST_CASE("device staging: allreduce reads its input whole and writes it back whole") {
  for (bool in_place : {false, true}) {
    Layout l;
    REQUIRE(layout(reduction(Coll::allreduce, in_place, 10, MPI_DOUBLE), 1, 4, &l));
    CHECK(l.in == (in_place ? g_recv : g_send));
    CHECK(l.scratch == 80);
    CHECK(l.in_off == 0);
    CHECK(l.in_bytes == 80);
    CHECK(out_of(l) == Ranges{{0, 80}});
  }
}

TEST_CASE("device staging: reduce writes back at the root only") {
  Layout l;
  REQUIRE(layout(reduction(Coll::reduce, false, 6, MPI_INT, 2), 2, 3, &l));
  CHECK(l.in_bytes == 24);
  CHECK(out_of(l) == Ranges{{0, 24}});
  REQUIRE(layout(reduction(Coll::reduce, false, 6, MPI_INT, 2), 0, 3, &l));
  CHECK(l.in_bytes == 24);
  CHECK(out_of(l).empty());
}

TEST_CASE("device staging: bcast reads at the root, writes everywhere else") {
  Layout l;
  REQUIRE(layout(reduction(Coll::bcast, false, 5, MPI_INT, 1), 1, 4, &l));
  CHECK(l.in == g_recv);  // a bcast's buffer is its receive buffer
  CHECK(l.in_bytes == 20);
  CHECK(out_of(l).empty());
  REQUIRE(layout(reduction(Coll::bcast, false, 5, MPI_INT, 1), 3, 4, &l));
  CHECK(l.in_bytes == 0);
  CHECK(l.scratch == 20);
  CHECK(out_of(l) == Ranges{{0, 20}});
}

TEST_CASE("device staging: allgather puts this rank's block at its slot") {
  Layout l;
  REQUIRE(layout(gather(Coll::allgather, false, 3), 2, 4, &l));
  CHECK(l.in == g_send);
  CHECK(l.scratch == 48);
  CHECK(l.in_off == 24);
  CHECK(l.in_bytes == 12);
  CHECK(out_of(l) == Ranges{{0, 48}});
  // In place: the input is this rank's block of recvbuf, which is not written back.
  REQUIRE(layout(gather(Coll::allgather, true, 3), 2, 4, &l));
  CHECK(l.in == g_recv + 24);
  CHECK(out_of(l) == Ranges{{0, 24}, {36, 12}});
  REQUIRE(layout(gather(Coll::allgather, true, 3), 0, 4, &l));
  CHECK(out_of(l) == Ranges{{12, 36}});
  REQUIRE(layout(gather(Coll::allgather, true, 3), 3, 4, &l));
  CHECK(out_of(l) == Ranges{{0, 36}});
}

TEST_CASE("device staging: reduce_scatter_block reads every block, writes its first") {
  for (bool in_place : {false, true}) {
    Layout l;
    REQUIRE(layout(reduction(Coll::reduce_scatter_block, in_place, 4), 1, 3, &l));
    CHECK(l.in == (in_place ? g_recv : g_send));
    CHECK(l.scratch == 48);
    CHECK(l.in_bytes == 48);
    CHECK(out_of(l) == Ranges{{0, 16}});
  }
}

TEST_CASE("device staging: alltoall, and a collective without a staged form") {
  Layout l;
  REQUIRE(layout(gather(Coll::alltoall, false, 2), 0, 3, &l));
  CHECK(l.in_bytes == 24);
  CHECK(out_of(l) == Ranges{{0, 24}});
  CHECK_FALSE(layout(reduction(Coll::barrier, false, 0), 0, 3, &l));
}

TEST_CASE("device staging: the vector collectives, read from their rows") {
  // allgatherv at 3 ranks: blocks out of order, one empty, a gap (elements 3-4 of
  // recvbuf are not written); MPI_INT, so 4 bytes an element.
  static const int counts[] = {2, 0, 3}, displs[] = {5, 0, 1};
  CollArgs v = gather(Coll::allgatherv, false, 0);
  v.recvcounts = counts;
  v.displs = displs;
  Layout l;
  REQUIRE(layout(v, 1, 3, &l));  // this rank's block is empty: no input
  CHECK(l.in_bytes == 0);
  CHECK(l.scratch == 28);  // up to the end of rank 0's block, element 7
  CHECK(moves_of(l) == Moves{{20, 8, 20}, {4, 12, 4}});
  v.sendbuf = MPI_IN_PLACE;
  REQUIRE(layout(v, 2, 3, &l));  // in place: rank 2's block (elements 1-3) is the input
  CHECK(l.in == g_recv + 4);
  CHECK(l.in_off == 4);
  CHECK(l.in_bytes == 12);
  CHECK(out_of(l) == Ranges{{20, 8}});
  static const int negative[] = {5, 0, -1};
  v.displs = negative;
  CHECK_FALSE(layout(v, 0, 3, &l));  // a negative displacement has no mirrored scratch

  // reduce_scatter: every rank's input is the whole vector, its result its own count.
  static const int rs[] = {1, 2, 3};
  CollArgs r = reduction(Coll::reduce_scatter, false, 0);
  r.recvcounts = rs;
  REQUIRE(layout(r, 2, 3, &l));
  CHECK(l.in == g_send);
  CHECK(l.in_bytes == 24);
  CHECK(l.scratch == 24);
  CHECK(out_of(l) == Ranges{{0, 12}});
}

TEST_CASE("staging: each result range comes from the same offset of scratch, in place") {
  Layout l;
  REQUIRE(layout(gather(Coll::allgather, true, 3), 2, 4, &l));
  CHECK(moves_of(l) == Moves{{0, 24, 0}, {36, 12, 36}});
  REQUIRE(layout(reduction(Coll::reduce, false, 6, MPI_INT, 2), 2, 3, &l));
  CHECK(moves_of(l) == Moves{{0, 24, 0}});
}

TEST_CASE("staging: result_apart puts the root's reduce result after its input (ht)") {
  for (bool in_place : {false, true}) {
    Layout l;
    REQUIRE(layout(reduction(Coll::reduce, in_place, 6, MPI_INT, 1), 1, 3, &l, true));
    CHECK(l.in == (in_place ? g_recv : g_send));
    CHECK(l.in_off == 0);
    CHECK(l.in_bytes == 24);
    CHECK(l.scratch == 48);
    CHECK(moves_of(l) == Moves{{0, 24, 24}});
  }
  // Not at a non-root rank, and no other collective changes.
  Layout l;
  REQUIRE(layout(reduction(Coll::reduce, false, 6, MPI_INT, 1), 0, 3, &l, true));
  CHECK(l.scratch == 24);
  CHECK(moves_of(l).empty());
  REQUIRE(layout(reduction(Coll::allreduce, false, 6), 0, 3, &l, true));
  CHECK(l.scratch == 24);
  CHECK(moves_of(l) == Moves{{0, 24, 0}});
}
