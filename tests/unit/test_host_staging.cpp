// Host staging (core/host_staging): when a call is staged, how the MPI's CUDA support is
// decided, and which bytes of each buffer a call reads and writes on one rank.
#include <doctest/doctest.h>

#include <cstdlib>
#include <vector>

#include "config/env.hpp"
#include "core/host_staging.hpp"

using namespace streamcoll;
using namespace streamcoll::host_staging;

namespace {

using R = ByteRange;
using Ranges = std::vector<ByteRange>;

const TypeSpan kInt = TypeSpan::contiguous(4);
const TypeSpan kDouble = TypeSpan::contiguous(8);

char g_send[1], g_recv[1];  // addresses only; never dereferenced

CollArgs reduction(Coll c, bool in_place, int count) {
  CollArgs a;
  a.coll = c;
  a.sendbuf = in_place ? MPI_IN_PLACE : g_send;
  a.recvbuf = g_recv;
  a.count = count;
  a.datatype = MPI_INT;
  a.op = MPI_SUM;
  a.comm = MPI_COMM_WORLD;
  return a;
}

CollArgs gather(Coll c, bool in_place, int sendcount, int recvcount) {
  CollArgs a;
  a.coll = c;
  a.sendbuf = in_place ? MPI_IN_PLACE : g_send;
  a.recvbuf = g_recv;
  a.sendcount = sendcount;
  a.sendtype = MPI_INT;
  a.recvcount = recvcount;
  a.recvtype = MPI_INT;
  a.comm = MPI_COMM_WORLD;
  return a;
}

StagingExtents ext(const CollArgs& a, int rank, int size, TypeSpan s = kInt, TypeSpan r = kInt) {
  return staging_extents(a, rank, size, s, r);
}

}  // namespace

TEST_CASE("staging: which MPIs cannot take an in-place MPI_Reduce at a root other than 0") {
  // MPI_Get_library_version's first line, as each MPI writes it.
  CHECK(reduce_in_place_broken("MPICH Version:\t4.0.2\nMPICH Release date:\tThu May 26 2022"));
  CHECK(reduce_in_place_broken("MPICH Version:      4.1.1\n"));
  CHECK_FALSE(reduce_in_place_broken("MPICH Version:\t4.2.0\n"));
  CHECK_FALSE(reduce_in_place_broken("MPICH Version:\t3.4.3\n"));
  CHECK_FALSE(reduce_in_place_broken("MPICH Version:\t5.0.0\n"));
  CHECK_FALSE(reduce_in_place_broken("Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4"));
  CHECK_FALSE(reduce_in_place_broken("MPICH Version:\tgarbage"));
  CHECK_FALSE(reduce_in_place_broken(""));
}

TEST_CASE("staging: only GPU memory, only without CUDA support, only C calls") {
  for (MemKind m : {MemKind::device, MemKind::managed, MemKind::mixed}) {
    CAPTURE(name(m));
    CHECK(should_stage(m, false, false));
    CHECK_FALSE(should_stage(m, false, true));  // a CUDA-aware MPI takes them
    CHECK_FALSE(should_stage(m, true, false));  // Fortran: passed through unchanged
  }
  for (MemKind m : {MemKind::host, MemKind::pinned}) {
    CAPTURE(name(m));
    CHECK_FALSE(should_stage(m, false, false));
  }
  // The dispatcher's test: host memory never; GPU memory only while staging is on.
  CollArgs a = reduction(Coll::allreduce, false, 4);
  CHECK_FALSE(wanted(a, MemKind::host));
  CHECK_FALSE(wanted(a, MemKind::pinned));
  CHECK(wanted(a, MemKind::device) == enabled());
  a.fortran = reinterpret_cast<const FortranCall*>(&a);  // any non-null pointer
  CHECK_FALSE(wanted(a, MemKind::device));
}

TEST_CASE("STREAMCOLL_MPI_CUDA_AWARE: the setting, then what the MPI says") {
  using config::CudaAware;
  CHECK(resolve_awareness(CudaAware::yes, 0, 0).aware);
  CHECK_FALSE(resolve_awareness(CudaAware::no, 1, 1).aware);
  CHECK(resolve_awareness(CudaAware::auto_detect, 1, -1).aware);
  CHECK_FALSE(resolve_awareness(CudaAware::auto_detect, 0, -1).aware);
  CHECK(resolve_awareness(CudaAware::auto_detect, 0, -1).how.find("MPIX_Query_cuda_support") !=
        std::string::npos);
  // Open MPI's answer first; MPICH's query when Open MPI's is absent.
  CHECK_FALSE(resolve_awareness(CudaAware::auto_detect, 0, 1).aware);
  CHECK(resolve_awareness(CudaAware::auto_detect, -1, 1).aware);
  CHECK_FALSE(resolve_awareness(CudaAware::auto_detect, -1, 0).aware);
  // Neither: staging, which is always correct.
  Awareness none = resolve_awareness(CudaAware::auto_detect, -1, -1);
  CHECK_FALSE(none.aware);
  CHECK_FALSE(none.how.empty());

  CudaAware v = CudaAware::no;
  CHECK(config::parse_cuda_aware("AUTO", &v));
  CHECK(v == CudaAware::auto_detect);
  CHECK(config::parse_cuda_aware("yes", &v));
  CHECK(v == CudaAware::yes);
  CHECK(config::parse_cuda_aware("0", &v));
  CHECK(v == CudaAware::no);
  CHECK_FALSE(config::parse_cuda_aware("maybe", &v));
  CHECK(v == CudaAware::no);

  setenv("STREAMCOLL_MPI_CUDA_AWARE", "off", 1);
  CHECK(config::read_settings().mpi_cuda_aware == CudaAware::no);
  setenv("STREAMCOLL_MPI_CUDA_AWARE", "sometimes", 1);
  config::Settings s = config::read_settings();
  CHECK(s.mpi_cuda_aware == CudaAware::auto_detect);
  REQUIRE(s.problems.size() == 1);
  CHECK(s.problems[0].find("STREAMCOLL_MPI_CUDA_AWARE") != std::string::npos);
  unsetenv("STREAMCOLL_MPI_CUDA_AWARE");
  CHECK(config::read_settings().mpi_cuda_aware == CudaAware::auto_detect);
}

TEST_CASE("type spans: contiguous, holes, negative extents") {
  CHECK(kInt.dense());
  CHECK(kInt.elements(0, 5) == R{0, 20});
  CHECK(kInt.elements(3, 2) == R{12, 20});
  CHECK(kInt.elements(-2, 1) == R{-8, -4});
  CHECK(kInt.elements(0, 0).empty());
  CHECK(kInt.elements(7, -1).empty());
  // MPI_Type_vector(2, 1, 3, MPI_INT): data at bytes 0-3 and 12-15, extent 16.
  const TypeSpan vec{8, 16, 0, 16};
  CHECK_FALSE(vec.dense());
  CHECK(vec.elements(0, 3) == R{0, 48});
  CHECK(vec.elements(1, 1) == R{16, 32});
  // MPI_INT resized to extent 8: every other int; the last element ends after 4 bytes.
  const TypeSpan every_other{4, 8, 0, 4};
  CHECK_FALSE(every_other.dense());
  CHECK(every_other.elements(0, 3) == R{0, 20});
  // MPI_DOUBLE_INT: 12 bytes of data, 16 bytes apart.
  const TypeSpan double_int{12, 16, 0, 12};
  CHECK_FALSE(double_int.dense());
  CHECK(double_int.elements(0, 2) == R{0, 28});
  // Data before the buffer address (true lower bound -8), and a negative extent.
  CHECK(TypeSpan{4, 4, -8, 4}.elements(0, 2) == R{-8, 0});
  CHECK(TypeSpan{4, -4, 0, 4}.elements(0, 3) == R{-8, 4});
  // A type without data moves nothing.
  CHECK(TypeSpan{0, 0, 0, 0}.elements(0, 10).empty());
}

TEST_CASE("extents: allreduce, reduce, bcast") {
  StagingExtents x = ext(reduction(Coll::allreduce, false, 10), 0, 4);
  CHECK(x.send == R{0, 40});
  CHECK(x.recv == R{0, 40});
  CHECK(x.recv_in.empty());
  CHECK(x.recv_out == Ranges{{0, 40}});

  x = ext(reduction(Coll::allreduce, true, 10), 1, 4);
  CHECK(x.send.empty());
  CHECK(x.recv_in == Ranges{{0, 40}});
  CHECK(x.recv_out == Ranges{{0, 40}});

  CHECK(ext(reduction(Coll::allreduce, false, 0), 0, 4).recv.empty());
  CHECK(ext(reduction(Coll::allreduce, false, 0), 0, 4).send.empty());

  // Reduce: recvbuf only at the root; MPI_IN_PLACE at the root reads it.
  CollArgs red = reduction(Coll::reduce, false, 3);
  red.root = 2;
  x = ext(red, 0, 3);
  CHECK(x.send == R{0, 12});
  CHECK(x.recv.empty());
  CHECK(x.recv_out.empty());
  x = ext(red, 2, 3);
  CHECK(x.send == R{0, 12});
  CHECK(x.recv_in.empty());
  CHECK(x.recv_out == Ranges{{0, 12}});
  red.sendbuf = MPI_IN_PLACE;
  x = ext(red, 2, 3);
  CHECK(x.send.empty());
  CHECK(x.recv_in == Ranges{{0, 12}});
  CHECK(x.recv_out == Ranges{{0, 12}});

  // Bcast: the root reads its buffer and writes nothing; the others only write.
  CollArgs bc = reduction(Coll::bcast, false, 6);
  bc.sendbuf = nullptr;
  bc.root = 1;
  x = ext(bc, 1, 2, kDouble, kDouble);
  CHECK(x.send.empty());
  CHECK(x.recv_in == Ranges{{0, 48}});
  CHECK(x.recv_out.empty());
  CHECK(x.recv == R{0, 48});
  x = ext(bc, 0, 2, kDouble, kDouble);
  CHECK(x.recv_in.empty());
  CHECK(x.recv_out == Ranges{{0, 48}});
  // A type with holes: the holes travel both ways, unchanged.
  const TypeSpan vec{8, 16, 0, 16};
  x = ext(bc, 0, 2, vec, vec);
  CHECK(x.recv_in == Ranges{{0, 96}});
  CHECK(x.recv_out == Ranges{{0, 96}});
}

TEST_CASE("extents: allgather and alltoall") {
  StagingExtents x = ext(gather(Coll::allgather, false, 5, 5), 2, 3);
  CHECK(x.send == R{0, 20});
  CHECK(x.recv_in.empty());
  CHECK(x.recv_out == Ranges{{0, 60}});
  // In place: this rank's block is the input.
  x = ext(gather(Coll::allgather, true, 0, 5), 2, 3);
  CHECK(x.send.empty());
  CHECK(x.recv_in == Ranges{{40, 60}});
  CHECK(x.recv_out == Ranges{{0, 60}});
  CHECK(x.recv == R{0, 60});
  // Send and receive types differ: 2 doubles sent as 4 ints.
  x = ext(gather(Coll::allgather, false, 2, 4), 0, 2, kDouble, kInt);
  CHECK(x.send == R{0, 16});
  CHECK(x.recv_out == Ranges{{0, 32}});
  // Receive type with holes: the whole receive span is read first.
  x = ext(gather(Coll::allgather, false, 1, 1), 0, 3, kInt, TypeSpan{4, 8, 0, 4});
  CHECK(x.recv_in == Ranges{{0, 20}});
  CHECK(x.recv_out == Ranges{{0, 20}});

  x = ext(gather(Coll::alltoall, false, 3, 3), 0, 4);
  CHECK(x.send == R{0, 48});
  CHECK(x.recv_in.empty());
  CHECK(x.recv_out == Ranges{{0, 48}});
  x = ext(gather(Coll::alltoall, true, 0, 3), 3, 4);
  CHECK(x.send.empty());
  CHECK(x.recv_in == Ranges{{0, 48}});
  CHECK(x.recv_out == Ranges{{0, 48}});
}

TEST_CASE("extents: allgatherv with gaps, out-of-order and negative displacements") {
  int counts[4] = {2, 0, 3, 1};
  int displs[4] = {10, 0, 0, -2};  // blocks [-2,-1], [0,2], [10,11]; rank 1 sends nothing
  CollArgs a = gather(Coll::allgatherv, false, 2, 0);
  a.recvcounts = counts;
  a.displs = displs;
  StagingExtents x = ext(a, 0, 4);
  CHECK(x.send == R{0, 8});
  CHECK(x.recv_in.empty());
  CHECK(x.recv_out == Ranges{{-8, -4}, {0, 12}, {40, 48}});
  CHECK(x.recv == R{-8, 48});
  a.sendcount = 0;
  x = ext(a, 1, 4);
  CHECK(x.send.empty());
  CHECK(x.recv_out.size() == 3);
  // In place: this rank's own block is read.
  a.sendbuf = MPI_IN_PLACE;
  x = ext(a, 2, 4);
  CHECK(x.send.empty());
  CHECK(x.recv_in == Ranges{{0, 12}});
  CHECK(x.recv_out == Ranges{{-8, -4}, {0, 12}, {40, 48}});
  // Adjacent blocks join: displacements that are the prefix sums give one range.
  int c2[3] = {1, 2, 3}, d2[3] = {0, 1, 3};
  a.sendbuf = g_send;
  a.sendcount = 2;
  a.recvcounts = c2;
  a.displs = d2;
  x = ext(a, 1, 3, kDouble, kDouble);
  CHECK(x.send == R{0, 16});
  CHECK(x.recv_out == Ranges{{0, 48}});
  // Nobody contributes: nothing to stage.
  int zero[2] = {0, 0}, dz[2] = {0, 0};
  a.recvcounts = zero;
  a.displs = dz;
  a.sendcount = 0;
  x = ext(a, 0, 2);
  CHECK(x.send.empty());
  CHECK(x.recv.empty());
}

TEST_CASE("extents: reduce_scatter_block and reduce_scatter") {
  StagingExtents x = ext(reduction(Coll::reduce_scatter_block, false, 4), 1, 3);
  CHECK(x.send == R{0, 48});
  CHECK(x.recv_in.empty());
  CHECK(x.recv_out == Ranges{{0, 16}});
  // In place: the whole input is read from recvbuf, the result is its first block.
  x = ext(reduction(Coll::reduce_scatter_block, true, 4), 1, 3);
  CHECK(x.send.empty());
  CHECK(x.recv_in == Ranges{{0, 48}});
  CHECK(x.recv_out == Ranges{{0, 16}});
  CHECK(x.recv == R{0, 48});

  int counts[3] = {2, 0, 5};
  CollArgs rs = reduction(Coll::reduce_scatter, false, 0);
  rs.recvcounts = counts;
  x = ext(rs, 2, 3);
  CHECK(x.send == R{0, 28});
  CHECK(x.recv_out == Ranges{{0, 20}});
  x = ext(rs, 1, 3);  // receives nothing
  CHECK(x.send == R{0, 28});
  CHECK(x.recv.empty());
  rs.sendbuf = MPI_IN_PLACE;
  x = ext(rs, 0, 3);
  CHECK(x.recv_in == Ranges{{0, 28}});
  CHECK(x.recv_out == Ranges{{0, 8}});
  x = ext(rs, 1, 3);
  CHECK(x.recv_in == Ranges{{0, 28}});
  CHECK(x.recv_out.empty());
}

TEST_CASE("extents: barrier moves nothing") {
  CollArgs b;
  b.coll = Coll::barrier;
  b.comm = MPI_COMM_WORLD;
  StagingExtents x = ext(b, 0, 4, TypeSpan{}, TypeSpan{});
  CHECK(x.send.empty());
  CHECK(x.recv.empty());
}

TEST_CASE("extents agree with the buffers the dispatcher classifies (predefined types)") {
  // For contiguous types, what is staged is exactly what significant_buffers reports.
  int counts[3] = {3, 1, 2}, displs[3] = {0, 3, 4};
  std::vector<CollArgs> calls;
  for (bool in_place : {false, true}) {
    for (Coll c : {Coll::allreduce, Coll::reduce, Coll::reduce_scatter_block}) {
      calls.push_back(reduction(c, in_place, 5));
    }
    CollArgs rs = reduction(Coll::reduce_scatter, in_place, 0);
    rs.recvcounts = counts;
    calls.push_back(rs);
    for (Coll c : {Coll::allgather, Coll::alltoall}) calls.push_back(gather(c, in_place, 2, 2));
    CollArgs agv = gather(Coll::allgatherv, in_place, 1, 0);
    agv.recvcounts = counts;
    agv.displs = displs;
    calls.push_back(agv);
  }
  CollArgs bc = reduction(Coll::bcast, false, 7);
  bc.sendbuf = nullptr;
  calls.push_back(bc);
  for (CollArgs a : calls) {
    for (int rank = 0; rank < 3; ++rank) {
      a.root = 1;
      CAPTURE(static_cast<int>(a.coll));
      CAPTURE(a.sendbuf == MPI_IN_PLACE);
      CAPTURE(rank);
      if (a.coll == Coll::reduce && rank != a.root && a.sendbuf == MPI_IN_PLACE) continue;
      if (a.coll == Coll::allgatherv && a.sendbuf != MPI_IN_PLACE) a.sendcount = counts[rank];
      BufferUse b[2];
      const int n = significant_buffers(a, rank, 3, 4, 4, b);
      uint64_t want_send = 0, want_recv = 0;
      for (int i = 0; i < n; ++i) (b[i].ptr == g_send ? want_send : want_recv) = b[i].bytes;
      const StagingExtents x = ext(a, rank, 3);
      CHECK(x.send.bytes() == want_send);
      CHECK(x.recv.bytes() == want_recv);
      if (!x.send.empty()) CHECK(x.send.lo == 0);
      if (!x.recv.empty()) CHECK(x.recv.lo == 0);
    }
  }
}
