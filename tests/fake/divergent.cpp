// Legal MPI programs whose ranks differ, under streamcoll with the fake CUDA driver and
// the fake NCCL: every rank must finish, with the values computed here independently.
// Each hang fails within the watchdog's time (SIGALRM) instead of stalling the suite.
//
//   divergent MODE [SEEDS]      (run under tests/mpi/run.sh preload; tests/fake/meson.build)
//   cases    the patterns that hung or computed wrong sums before the routing decision was
//            made from rank-invariant facts (shim/dispatch.cpp):
//            - MPI_Reduce of device data into a host receive buffer at the root (the
//              root's buffers are device+host, the others' device only), every root;
//            - each collective with some ranks on host memory and the others on device
//              memory (then pinned and managed), blocking;
//            - non-blocking calls after a blocking all-device call agreed on NCCL, with
//              one rank passing host memory (it stages through the GPU), completed by
//              MPI_Wait, MPI_Waitall and MPI_Test loops;
//            - streamcoll_comm_set_route on a sub-communicator of some ranks, then calls
//              on MPI_COMM_WORLD's duplicate and on another sub-communicator;
//            - non-blocking calls on two communicators started in opposite orders on even
//              and odd ranks;
//            - classic calls whose input a copy on a blocking stream of the program's
//              wrote, unsynchronised (ordered as a legacy-stream copy would be);
//            - non-blocking bcast, allgather and alltoall where one rank describes its
//              data with derived datatypes (a strided vector, a contiguous type) of the
//              others' type signature, on device and host memory;
//            - blocking bcast and allgather with derived datatypes on one rank (their bytes
//              carried in band with the staging outcomes, or exchanged, by size);
//            - non-blocking bcast and allgather of pair types (one rank's MPI_2INT for
//              the others' twice as many MPI_INT; MPI_DOUBLE_INT on every rank);
//            - with FAKE_CUDA_DEVICES=2: one rank's buffer on the second GPU after the
//              NCCL communicator was set up on the first (blocking and non-blocking).
//   random   SEEDS seeded programs (default 2): each a sequence of 40 collectives with
//            sizes, roots, in-place use and blocking or not drawn alike on every rank,
//            and each rank's memory kind per buffer (host, device, pinned, managed)
//            drawn per rank; non-blocking calls completed in batches by a completion
//            call drawn per rank (Wait in order or reverse, Waitall, Waitany, Waitsome,
//            Test/Testall loops). Reproduce one with DIVERGENT_SEED_BASE.
//   signatures  SEEDS seeded programs (default 1) of few signatures called many times, so
//            that later calls decide from agreements of earlier ones (core/agreement.hpp:
//            SignatureAgreements): phases on host, device and host memory again, in which
//            each rank leaves the phase's kind on its own (about one buffer in six:
//            host, device, pinned or managed), blocking and non-blocking calls, and a
//            rank that arrives late (sleeps) now and then; then a steady phase of 300
//            calls of one signature on host memory on every rank, in which streamcoll may
//            start no blocking agreement and at most one refresh per 32 calls
//            (streamcoll_agreement_counts); with STREAMCOLL_MPI_CUDA_AWARE unset (an MPI
//            that is not CUDA-aware: GPU buffers staged) and DIVERGENT_FAIL_STAGING=1 or
//            fatal, the last rank alone on GPU memory, and losing its input once
//            (staging_failures).
//            DIVERGENT_STREAM=1: with a stream attached, which each rank detaches and
//            attaches again on its own; with route nccl, then stream-ordered bcast and
//            allgather where the last rank describes its data with derived datatypes now
//            and then, and once fails to read it (derived_adopted); with route nvgroup,
//            or blueconnect, a rank's staging copy fails once (staged_failure).
//   steady   the steady path (shim/steady.hpp): 300 calls of each collective with one set
//            of arguments, each rank passing device memory now and then on its own (and in
//            place every third call); host calls on the steady path between device calls
//            of another signature, each followed by an MPI_Iallreduce routed from them;
//            communicators freed and made again (split: another size); every rank moving
//            to device memory after 1100 host calls (DIVERGENT_ALLREDUCE_ROUTE: the route
//            the device calls must reach, with statistics on). Most calls must take the
//            steady path (streamcoll_steady_calls); with statistics off (tests/mpi/run.sh
//            quiet), the wrappers' inline form of it.
//   skew     stream-ordered MPI_Allreduce calls on route nccl (or ht), and on nccl MPI_Bcast,
//            MPI_Allgather and MPI_Alltoall too, with the last rank 300 ms late: rank 0's
//            host is back in well under 100 ms (skew_program).
// DIVERGENT_THREAD_MULTIPLE=1: the program asks for MPI_THREAD_MULTIPLE.
// DIVERGENT_ALLREDUCE_ROUTE: the route allreduce is forced to (STREAMCOLL_ROUTE; default
// nccl), which the cases check took the all-device calls and, with
// STREAMCOLL_NCCL_NONBLOCKING, the last rank's host-buffer MPI_Iallreduce calls.
// Prints "N passed, N failed" on rank 0; exits nonzero on failure.
#include <dlfcn.h>
#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "calls.hpp"
#include "streamcoll/streamext.h"
#include "harness.hpp"

namespace {

// ---- cases ------------------------------------------------------------------------------

void reduce_to_host_root(MPI_Comm comm) {
  const int size = comm_size(comm), rank = comm_rank(comm);
  for (int root = 0; root < size; ++root)
    for (size_t n : {1, 1000}) {
      // Non-root ranks pass a device receive buffer (not significant), the root a host one.
      Call c = make(Kind::reduce, n, root, false, 11 + root, comm);
      run_blocking(c, Mem::device, rank == root ? Mem::host : Mem::device);
      // And the same in place at the root, with a host buffer there (which streamcoll
      // hands to the MPI unchanged: not where the MPI crashes on it).
      if (root != 0 && mpi_in_place_reduce_off_root0_crashes()) {
        if (rank == 0 && n == 1)
          std::fprintf(stderr, "divergent: note: no in-place MPI_Reduce into host memory at root %d "
                               "(MPICH 4.0/4.1 crash on it: pmodels/mpich#6540)\n", root);
        continue;
      }
      Call d = make(Kind::reduce, n, root, true, 17 + root, comm);
      run_blocking(d, Mem::device, rank == root ? Mem::host : Mem::device);
    }
}


void mixed_kinds_blocking(MPI_Comm comm) {
  const int rank = comm_rank(comm), size = comm_size(comm);
  unsigned salt = 100;
  for (Kind k : kKinds)
    for (Mem other : {Mem::host, Mem::pinned, Mem::managed})
      for (int odd = 0; odd < 2; ++odd) {
        // Ranks of one parity on device memory, the others on `other`.
        const Mem m = (rank % 2 == odd) ? Mem::device : other;
        for (bool ip : {false, true}) {
          Call c = make(k, 333, size - 1, ip, ++salt, comm);
          run_blocking(c, m, m);
        }
      }
  // All on device: the route, for comparison, then one rank on host again.
  Call all = make(Kind::allreduce, 4096, 0, false, ++salt, comm);
  run_blocking(all, Mem::device, Mem::device);
  Call one = make(Kind::allreduce, 4096, 0, false, ++salt, comm);
  run_blocking(one, rank == size - 1 ? Mem::host : Mem::device, rank == size - 1 ? Mem::host : Mem::device);
}


void nonblocking_after_agreement(MPI_Comm comm) {
  const int rank = comm_rank(comm), size = comm_size(comm);
  unsigned salt = 300;
  for (Kind k : kKinds) {
    // A blocking all-device call of this collective: the ranks agree (NCCL when present).
    Call warm = make(k, 64, 0, false, ++salt, comm);
    run_blocking(warm, Mem::device, Mem::device);
    for (int how = 0; how < 7; ++how) {
      // Then three non-blocking ones; the last rank passes host memory to the middle one.
      std::vector<Call> calls;
      std::vector<MPI_Request> reqs(3, MPI_REQUEST_NULL);
      std::vector<Mem> mems;
      for (int j = 0; j < 3; ++j) {
        const Mem m = (j == 1 && rank == size - 1) ? (how % 2 ? Mem::pinned : Mem::host) : Mem::device;
        calls.push_back(make(k, 100 + j * 37, j % size, j == 2, ++salt, comm));
        calls.back().prepare(m, m);
        mems.push_back(m);
      }
      for (int j = 0; j < 3; ++j)
        check(calls[j].start(&reqs[j]) == MPI_SUCCESS, std::string(kind_name(k)) + " non-blocking start");
      complete(reqs, how);
      for (int j = 0; j < 3; ++j)
        calls[j].verify(label_of(calls[j], mems[j], mems[j], "non-blocking") + " completion " +
                        std::to_string(how));
    }
  }
}

void set_route_on_subcomm(MPI_Comm comm) {
  const int rank = comm_rank(comm), size = comm_size(comm);
  // The lower half of the ranks forces routes on their own communicator.
  MPI_Comm half;
  MPI_Comm_split(comm, rank < (size + 1) / 2 ? 0 : 1, rank, &half);
  if (rank < (size + 1) / 2) {
    check(api.set_route(half, "allreduce:pmpi,bcast:pmpi,allgather:pmpi") == MPI_SUCCESS,
          "set_route on the lower half");
  }
  unsigned salt = 500;
  for (MPI_Comm c : {comm, half}) {
    for (Kind k : {Kind::allreduce, Kind::bcast, Kind::allgather}) {
      Call b = make(k, 1000, 0, false, ++salt, c);
      run_blocking(b, Mem::device, Mem::device);
      Call nb = make(k, 1000, 0, false, ++salt, c);
      nb.prepare(Mem::device, Mem::device);
      MPI_Request r = MPI_REQUEST_NULL;
      check(nb.start(&r) == MPI_SUCCESS, "non-blocking start");
      MPI_Wait(&r, MPI_STATUS_IGNORE);
      nb.verify(label_of(nb, Mem::device, Mem::device, "non-blocking after set_route"));
    }
  }
  MPI_Comm_free(&half);
}

void other_gpu(MPI_Comm comm) {
  const int rank = comm_rank(comm), size = comm_size(comm);
  unsigned salt = 700;
  Call warm = make(Kind::allreduce, 256, 0, false, ++salt, comm);
  run_blocking(warm, Mem::device, Mem::device);
  const Mem m = rank == size - 1 ? Mem::device1 : Mem::device;
  Call b = make(Kind::allreduce, 256, 0, false, ++salt, comm);
  run_blocking(b, m, m);
  Call nb = make(Kind::allreduce, 256, 0, false, ++salt, comm);
  nb.prepare(m, m);
  MPI_Request r = MPI_REQUEST_NULL;
  check(nb.start(&r) == MPI_SUCCESS, "non-blocking start, other GPU");
  MPI_Wait(&r, MPI_STATUS_IGNORE);
  nb.verify(label_of(nb, m, m, "non-blocking"));
}

// Non-blocking calls on two communicators, started in opposite orders on even and odd
// ranks (legal MPI), completed together: nothing shared between communicators (a stream,
// a queue) may order them.
void opposite_orders(MPI_Comm comm) {
  const int rank = comm_rank(comm);
  MPI_Comm c1, c2;
  MPI_Comm_dup(comm, &c1);
  MPI_Comm_dup(comm, &c2);
  unsigned salt = 900;
  for (MPI_Comm c : {c1, c2}) {  // agree on each (the route its MPI_I* calls take)
    Call warm = make(Kind::allreduce, 512, 0, false, ++salt, c);
    run_blocking(warm, Mem::device, Mem::device);
  }
  for (int round = 0; round < 4; ++round) {
    Call a = make(Kind::allreduce, 512, 0, false, ++salt, c1);
    Call b = make(Kind::allreduce, 512, 0, false, ++salt, c2);
    a.prepare(Mem::device, Mem::device);
    b.prepare(Mem::device, Mem::device);
    MPI_Request reqs[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    if (rank % 2 == 0) {
      check(a.start(&reqs[0]) == MPI_SUCCESS, "start on the first communicator");
      check(b.start(&reqs[1]) == MPI_SUCCESS, "start on the second communicator");
    } else {
      check(b.start(&reqs[1]) == MPI_SUCCESS, "start on the second communicator");
      check(a.start(&reqs[0]) == MPI_SUCCESS, "start on the first communicator");
    }
    std::vector<MPI_Request> v(reqs, reqs + 2);
    complete(v, round % 2 ? 2 : 6);
    a.verify(label_of(a, Mem::device, Mem::device, "opposite orders, first communicator"));
    b.verify(label_of(b, Mem::device, Mem::device, "opposite orders, second communicator"));
  }
  MPI_Comm_free(&c1);
  MPI_Comm_free(&c2);
}

// Classic calls (no stream attribute) are ordered after the work the program enqueued on
// the legacy stream and on its own blocking streams, as a legacy-stream copy would be:
// the input written by a copy on a blocking stream, not synchronised, is what is reduced.
void classic_ordering(MPI_Comm comm) {
  const int size = comm_size(comm), rank = comm_rank(comm);
  CUstream_st* blocking = api.stream_create(0);
  unsigned salt = 1100;
  for (int j = 0; j < 3; ++j) {
    Call c = make(Kind::allreduce, 2048, 0, false, ++salt, comm);
    c.prepare(Mem::device, Mem::device);
    std::vector<int> v(c.n);
    for (size_t i = 0; i < c.n; ++i) v[i] = in_val(rank, i, c.salt);
    std::vector<int> stale(c.n, -1);
    c.send->put(stale.data(), stale.size() * sizeof(int));  // what the call must not see
    check(api.enqueue_copy(blocking, c.send->get(), v.data(), v.size() * sizeof(int)) == 0,
          "input copied on a blocking stream");
    check(c.start(nullptr) == MPI_SUCCESS, "classic allreduce after a blocking stream's copy");
    c.verify(label_of(c, Mem::device, Mem::device, "after a copy on a blocking stream"));
  }
  api.stream_sync(blocking);
  api.stream_destroy(blocking);
  (void)size;
}

// Non-blocking bcast, allgather and alltoall after a blocking call of theirs agreed on a
// route, with the last rank describing its data with derived datatypes of the same type
// signature (legal: MPI requires equal signatures, not equal datatypes): a strided vector
// (holes left as they were), a contiguous type. That rank's call is repacked to the
// others' MPI_INT (core/repack.hpp), on device and host memory, completed by MPI_Wait.
void derived_nonblocking(MPI_Comm comm) {
  const int rank = comm_rank(comm), size = comm_size(comm);
  const bool odd = rank == size - 1;
  const int n = 300;
  MPI_Datatype vec, contig;
  MPI_Type_vector(n, 1, 2, MPI_INT, &vec);  // n ints, every other one
  MPI_Type_commit(&vec);
  MPI_Type_contiguous(n, MPI_INT, &contig);
  MPI_Type_commit(&contig);
  int sentinel;
  std::memset(&sentinel, Buf::kSentinel, sizeof sentinel);
  unsigned salt = 1300;
  for (Mem m : {Mem::device, Mem::host}) {
    for (Kind k : {Kind::bcast, Kind::allgather, Kind::alltoall}) {
      Call warm = make(k, n, 0, false, ++salt, comm);
      run_blocking(warm, Mem::device, Mem::device);
      for (int root : {0, size - 1}) {
        if (k != Kind::bcast && root != 0) continue;
        ++salt;
        const std::string label = std::string("derived datatype on the last rank, ") + kind_name(k) +
                                  " root " + std::to_string(root) + " " + mem_name(m);
        MPI_Request r = MPI_REQUEST_NULL;
        std::vector<int> want;
        Buf* send = nullptr;
        Buf* recv = nullptr;
        int rc = MPI_ERR_OTHER;
        if (k == Kind::bcast) {
          // The last rank: `vec` over 2n ints; the others: n MPI_INTs.
          const size_t elems = odd ? 2 * n : n;
          recv = new Buf(elems * sizeof(int), m);
          std::vector<int> v(elems, sentinel);
          if (rank == root)
            for (int i = 0; i < n; ++i) v[odd ? 2 * i : i] = in_val(root, i, salt);
          recv->put(v.data(), v.size() * sizeof(int));
          want.assign(elems, sentinel);
          for (int i = 0; i < n; ++i) want[odd ? 2 * i : i] = in_val(root, i, salt);
          rc = odd ? MPI_Ibcast(recv->get(), 1, vec, root, comm, &r)
                   : MPI_Ibcast(recv->get(), n, MPI_INT, root, comm, &r);
        } else if (k == Kind::allgather) {
          // The last rank sends its block with `vec` (from 2n ints) and receives the
          // blocks with `contig`; the others use n MPI_INTs for both.
          const size_t selems = odd ? 2 * n : n;
          send = new Buf(selems * sizeof(int), m);
          std::vector<int> v(selems, sentinel);
          for (int i = 0; i < n; ++i) v[odd ? 2 * i : i] = in_val(rank, i, salt);
          send->put(v.data(), v.size() * sizeof(int));
          recv = new Buf(static_cast<size_t>(n) * size * sizeof(int), m);
          want.resize(static_cast<size_t>(n) * size);
          for (int q = 0; q < size; ++q)
            for (int i = 0; i < n; ++i) want[q * n + i] = in_val(q, i, salt);
          rc = odd ? MPI_Iallgather(send->get(), 1, vec, recv->get(), 1, contig, comm, &r)
                   : MPI_Iallgather(send->get(), n, MPI_INT, recv->get(), n, MPI_INT, comm, &r);
        } else {
          // alltoall: the last rank sends with `contig` (one per block).
          send = new Buf(static_cast<size_t>(n) * size * sizeof(int), m);
          std::vector<int> v(static_cast<size_t>(n) * size);
          for (size_t i = 0; i < v.size(); ++i) v[i] = in_val(rank, i, salt);
          send->put(v.data(), v.size() * sizeof(int));
          recv = new Buf(static_cast<size_t>(n) * size * sizeof(int), m);
          want.resize(static_cast<size_t>(n) * size);
          for (int q = 0; q < size; ++q)
            for (int i = 0; i < n; ++i) want[q * n + i] = in_val(q, static_cast<size_t>(rank) * n + i, salt);
          rc = odd ? MPI_Ialltoall(send->get(), 1, contig, recv->get(), n, MPI_INT, comm, &r)
                   : MPI_Ialltoall(send->get(), n, MPI_INT, recv->get(), n, MPI_INT, comm, &r);
        }
        check(rc == MPI_SUCCESS, label + ": starts");
        check(MPI_Wait(&r, MPI_STATUS_IGNORE) == MPI_SUCCESS, label + ": MPI_Wait");
        std::vector<char> got = recv->read();
        size_t bad = 0;
        for (size_t i = 0; i < want.size(); ++i) {
          int g;
          std::memcpy(&g, got.data() + i * sizeof(int), sizeof g);
          bad += g != want[i];
        }
        check(bad == 0, label + ": " + std::to_string(bad) + " wrong elements (holes included)");
        delete send;
        delete recv;
      }
    }
  }
  MPI_Type_free(&vec);
  MPI_Type_free(&contig);
}

// Elements of `b` (ints) that differ from `want`.
size_t count_wrong(Buf& b, const std::vector<int>& want) {
  const std::vector<char> got = b.read();
  size_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    int g;
    std::memcpy(&g, got.data() + i * sizeof(int), sizeof g);
    bad += g != want[i];
  }
  return bad;
}

// Blocking MPI_Bcast where the last rank describes its data with a strided vector and the
// others with MPI_INTs (same type signature), on device and host memory, every root, small
// and large: under an MPI that is not CUDA-aware a small one carries the root's staging
// outcome in band, as bytes that each rank packs or unpacks from its own description
// (core/host_staging.cpp), a large one exchanges it; values and holes checked.
void derived_blocking_bcast(MPI_Comm comm) {
  const int rank = comm_rank(comm), size = comm_size(comm);
  const bool odd = rank == size - 1;
  int sentinel;
  std::memset(&sentinel, Buf::kSentinel, sizeof sentinel);
  unsigned salt = 1500;
  for (int n : {3, 300, 20000}) {
    MPI_Datatype vec;
    MPI_Type_vector(n, 1, 2, MPI_INT, &vec);
    MPI_Type_commit(&vec);
    for (Mem m : {Mem::device, Mem::host})
      for (int root = 0; root < size; ++root) {
        ++salt;
        const std::string label = "blocking bcast, derived datatype on the last rank, n " +
                                  std::to_string(n) + " root " + std::to_string(root) + " " +
                                  mem_name(m);
        const size_t elems = odd ? 2 * static_cast<size_t>(n) : static_cast<size_t>(n);
        Buf recv(elems * sizeof(int), m);
        std::vector<int> v(elems, sentinel), want(elems, sentinel);
        for (int i = 0; i < n; ++i) {
          want[odd ? 2 * i : i] = in_val(root, i, salt);
          if (rank == root) v[odd ? 2 * i : i] = in_val(root, i, salt);
        }
        recv.put(v.data(), v.size() * sizeof(int));
        const int rc = odd ? MPI_Bcast(recv.get(), 1, vec, root, comm)
                           : MPI_Bcast(recv.get(), n, MPI_INT, root, comm);
        check(rc == MPI_SUCCESS, label + ": succeeds");
        check(count_wrong(recv, want) == 0, label + ": wrong elements (holes included)");
      }
    // Allgather: the last rank sends its block with `vec` (from 2n ints) and receives the
    // blocks as `contig`; the others send and receive MPI_INTs; then in place, the last
    // rank's blocks in `contig`.
    MPI_Datatype contig;
    MPI_Type_contiguous(n, MPI_INT, &contig);
    MPI_Type_commit(&contig);
    for (Mem m : {Mem::device, Mem::host})
      for (bool in_place : {false, true}) {
        ++salt;
        const std::string label = std::string("blocking allgather, derived datatypes on the ") +
                                  "last rank, n " + std::to_string(n) + (in_place ? " in place " : " ") +
                                  mem_name(m);
        const size_t selems = odd ? 2 * static_cast<size_t>(n) : static_cast<size_t>(n);
        Buf send(selems * sizeof(int), m);
        std::vector<int> v(selems, sentinel);
        for (int i = 0; i < n; ++i) v[odd ? 2 * i : i] = in_val(rank, i, salt);
        send.put(v.data(), v.size() * sizeof(int));
        Buf recv(static_cast<size_t>(n) * size * sizeof(int), m);
        std::vector<int> want(static_cast<size_t>(n) * size), init(want.size(), sentinel);
        for (int q = 0; q < size; ++q)
          for (int i = 0; i < n; ++i) want[q * n + i] = in_val(q, i, salt);
        if (in_place)
          for (int i = 0; i < n; ++i) init[rank * n + i] = in_val(rank, i, salt);
        recv.put(init.data(), init.size() * sizeof(int));
        const void* sb = in_place ? MPI_IN_PLACE : send.get();
        const int rc = odd ? MPI_Allgather(sb, 1, vec, recv.get(), 1, contig, comm)
                           : MPI_Allgather(sb, n, MPI_INT, recv.get(), n, MPI_INT, comm);
        check(rc == MPI_SUCCESS, label + ": succeeds");
        check(count_wrong(recv, want) == 0, label + ": wrong elements");
      }
    MPI_Type_free(&contig);
    MPI_Type_free(&vec);
  }
}

// Non-blocking bcast and allgather of MINLOC/MAXLOC pair types after a blocking call
// agreed on a route: the last rank passes n MPI_2INT where the others pass 2n MPI_INT
// (the same type signature), then every rank passes MPI_DOUBLE_INT (a signature that
// mixes named types, with padding in its extent). Pair types are not routed as they are:
// they are repacked (to MPI_INT, to bytes) and must arrive intact.
void pair_nonblocking(MPI_Comm comm) {
  const int rank = comm_rank(comm), size = comm_size(comm);
  const bool odd = rank == size - 1;
  const int n = 200;
  unsigned salt = 1700;
  struct DoubleInt {
    double d;
    int i;
  };
  for (Mem m : {Mem::device, Mem::host}) {
    for (Kind k : {Kind::bcast, Kind::allgather}) {
      Call warm = make(k, 2 * n, 0, false, ++salt, comm);
      run_blocking(warm, Mem::device, Mem::device);
      ++salt;
      const int root = size - 1;
      std::string label = std::string("MPI_2INT on the last rank, ") + kind_name(k) + " " + mem_name(m);
      MPI_Request r = MPI_REQUEST_NULL;
      std::vector<int> want;
      Buf* send = nullptr;
      Buf* recv = nullptr;
      int rc = MPI_ERR_OTHER;
      if (k == Kind::bcast) {
        recv = new Buf(2 * n * sizeof(int), m);
        std::vector<int> v(2 * n, 0);
        want.resize(2 * n);
        for (int i = 0; i < 2 * n; ++i) want[i] = in_val(root, i, salt);
        if (rank == root) v = want;
        recv->put(v.data(), v.size() * sizeof(int));
        rc = odd ? MPI_Ibcast(recv->get(), n, MPI_2INT, root, comm, &r)
                 : MPI_Ibcast(recv->get(), 2 * n, MPI_INT, root, comm, &r);
      } else {
        send = new Buf(2 * n * sizeof(int), m);
        std::vector<int> v(2 * n);
        for (int i = 0; i < 2 * n; ++i) v[i] = in_val(rank, i, salt);
        send->put(v.data(), v.size() * sizeof(int));
        recv = new Buf(static_cast<size_t>(2 * n) * size * sizeof(int), m);
        want.resize(static_cast<size_t>(2 * n) * size);
        for (int q = 0; q < size; ++q)
          for (int i = 0; i < 2 * n; ++i) want[q * 2 * n + i] = in_val(q, i, salt);
        rc = odd ? MPI_Iallgather(send->get(), n, MPI_2INT, recv->get(), n, MPI_2INT, comm, &r)
                 : MPI_Iallgather(send->get(), 2 * n, MPI_INT, recv->get(), 2 * n, MPI_INT, comm, &r);
      }
      check(rc == MPI_SUCCESS, label + ": starts");
      check(MPI_Wait(&r, MPI_STATUS_IGNORE) == MPI_SUCCESS, label + ": MPI_Wait");
      std::vector<char> got = recv->read();
      size_t bad = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        int g;
        std::memcpy(&g, got.data() + i * sizeof(int), sizeof g);
        bad += g != want[i];
      }
      check(bad == 0, label + ": " + std::to_string(bad) + " wrong elements");
      delete send;
      delete recv;

      // MPI_DOUBLE_INT on every rank.
      ++salt;
      label = std::string("MPI_DOUBLE_INT, ") + kind_name(k) + " " + mem_name(m);
      const int blocks = k == Kind::bcast ? 1 : size;
      std::vector<DoubleInt> mine(n), expect(static_cast<size_t>(n) * blocks);
      for (int b = 0; b < blocks; ++b)
        for (int i = 0; i < n; ++i)
          expect[static_cast<size_t>(b) * n + i] = {
              static_cast<double>(in_val(k == Kind::bcast ? root : b, i, salt)) / 4,
              in_val(k == Kind::bcast ? root : b, i, salt + 1)};
      for (int i = 0; i < n; ++i)
        mine[i] = {static_cast<double>(in_val(rank, i, salt)) / 4, in_val(rank, i, salt + 1)};
      r = MPI_REQUEST_NULL;
      recv = new Buf(expect.size() * sizeof(DoubleInt), m);
      send = nullptr;
      if (k == Kind::bcast) {
        std::vector<DoubleInt> v(n, DoubleInt{0, 0});
        if (rank == root) v = mine;
        recv->put(v.data(), v.size() * sizeof(DoubleInt));
        rc = MPI_Ibcast(recv->get(), n, MPI_DOUBLE_INT, root, comm, &r);
      } else {
        send = new Buf(mine.size() * sizeof(DoubleInt), m);
        send->put(mine.data(), mine.size() * sizeof(DoubleInt));
        rc = MPI_Iallgather(send->get(), n, MPI_DOUBLE_INT, recv->get(), n, MPI_DOUBLE_INT, comm, &r);
      }
      check(rc == MPI_SUCCESS, label + ": starts");
      check(MPI_Wait(&r, MPI_STATUS_IGNORE) == MPI_SUCCESS, label + ": MPI_Wait");
      got = recv->read();
      bad = 0;
      for (size_t i = 0; i < expect.size(); ++i) {
        DoubleInt g;
        std::memcpy(&g, got.data() + i * sizeof(DoubleInt), sizeof g);
        bad += g.d != expect[i].d || g.i != expect[i].i;
      }
      check(bad == 0, label + ": " + std::to_string(bad) + " wrong elements");
      delete send;
      delete recv;
    }
  }
}

// ---- random programs --------------------------------------------------------------------

void random_program(MPI_Comm world, unsigned seed) {
  const int rank = comm_rank(world), size = comm_size(world);
  std::mt19937 shared(seed);                       // equal on every rank
  std::mt19937 mine(seed * 7919u + rank * 104729u);  // this rank's own choices
  MPI_Comm comm;
  MPI_Comm_dup(world, &comm);
  const Mem kinds[] = {Mem::host, Mem::device, Mem::pinned, Mem::managed};
  std::vector<Call> batch;
  std::vector<MPI_Request> reqs;
  std::vector<std::string> labels;
  auto flush = [&] {
    if (batch.empty()) return;
    complete(reqs, static_cast<int>(mine() % 7));
    for (size_t j = 0; j < batch.size(); ++j) batch[j].verify(labels[j]);
    batch.clear();
    reqs.clear();
    labels.clear();
  };
  for (int step = 0; step < 40; ++step) {
    const Kind k = kKinds[shared() % 6];
    const size_t n = std::vector<size_t>{1, 7, 64, 1000, 4099}[shared() % 5];
    const int root = static_cast<int>(shared() % size);
    const bool ip = shared() % 4 == 0;
    const bool nb = shared() % 2 == 0;
    // Mostly device memory (where routes act), sometimes another kind, per rank and buffer.
    const Mem sm = mine() % 3 ? Mem::device : kinds[mine() % 4];
    const Mem rm = mine() % 4 ? sm : kinds[mine() % 4];
    Call c = make(k, n, root, ip, seed * 1000 + step, comm);
    const std::string label = "seed " + std::to_string(seed) + " step " + std::to_string(step) +
                              ": " + label_of(c, sm, rm, nb ? "non-blocking" : "blocking");
    if (!nb) {
      flush();
      c.prepare(sm, rm);
      check(c.start(nullptr) == MPI_SUCCESS, label + ": returns MPI_SUCCESS");
      c.verify(label);
      continue;
    }
    c.prepare(sm, rm);
    batch.push_back(c);
    reqs.push_back(MPI_REQUEST_NULL);
    labels.push_back(label);
    check(batch.back().start(&reqs.back()) == MPI_SUCCESS, label + ": start");
    if (shared() % 3 == 0) flush();
  }
  flush();
  MPI_Comm_free(&comm);
}

// ---- many calls of few signatures ---------------------------------------------------------

using AgreementCountsFn = void (*)(unsigned long long*, unsigned long long*, unsigned long long*);

// Staging failures on an MPI that is not CUDA-aware (DIVERGENT_FAIL_STAGING=1): the last
// rank alone passes GPU memory, and loses its input (its staging copy fails) once.
//  - Where the facts the call is decided from know of GPU memory (rounds 0-9 with the
//    last rank on GPU memory: the ranks agree at every call, and the outcome is
//    exchanged, in band): round 10 (the failure) fails on every rank that gets a result,
//    11 is exact, 12 on host memory everywhere is exact. MPI_Allreduce (each rank's
//    outcome in band), MPI_Bcast whose root is the last rank (the root's outcome),
//    MPI_Allgather (every rank's), MPI_Reduce to rank 0 (every rank's, seen at the root).
//  - Where they say host memory everywhere (rounds 0-9 on host memory: later calls decide
//    from those agreements and carry no outcome): round 10 with the last rank on GPU
//    memory is staged and exact, and so is everything after it.
// DIVERGENT_FAIL_STAGING=fatal: the second case with the failure at round 10 of an
// MPI_Allreduce: the last rank cannot tell its peers and aborts the job (no rank returns
// from the call; tests/tools/expect_abort.sh checks the message).
void staging_failures(MPI_Comm comm, unsigned seed, bool fatal) {
  const int rank = comm_rank(comm), size = comm_size(comm);
  auto fail_after = reinterpret_cast<fake_cuda_fail_after_fn>(
      dlsym(dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL), "fake_cuda_fail_after"));
  if (!fail_after) {
    check(false, "fake_cuda_fail_after not found");
    return;
  }
  const bool last = rank == size - 1;
  for (const bool known : {true, false}) {
    if (fatal && known) continue;
    for (Kind kind : {Kind::allreduce, Kind::bcast, Kind::allgather, Kind::reduce}) {
      if (fatal && kind != Kind::allreduce) continue;
      for (int round = 0; round < 13; ++round) {
        const bool failing = round == 10 && last && (known || fatal);
        // A size of its own per case, so that each starts a signature of its own.
        Call c = make(kind, known ? 16 : 24, kind == Kind::bcast ? size - 1 : 0, false,
                      seed * 10000 + 9000 + round, comm);
        const Mem m = last && (round < 12 && (known || round >= 10)) ? Mem::device : Mem::host;
        c.prepare(m, m);
        if (failing) fail_after("cuMemcpyAsync", 1);
        const int rc = c.start(nullptr);
        if (failing) fail_after("cuMemcpyAsync", 0);
        const std::string L = std::string(kind_name(kind)) + " staging failure (" +
                              (known ? "GPU memory known" : "host memory agreed") + ") round " +
                              std::to_string(round);
        if (fatal && round == 10) {
          check(false, L + ": returned (" + std::to_string(rc) + ") where the job must abort");
        } else if (round == 10 && known && kind == Kind::reduce && rank != 0 && !last) {
          // A reduce's ranks other than the root and the failing one get no result.
          check(rc == MPI_SUCCESS, L + ": a non-root rank's part succeeds");
        } else if (round == 10 && known) {
          check(rc != MPI_SUCCESS, L + ": the call fails on every rank that gets a result");
        } else {
          check(rc == MPI_SUCCESS, L + ": the call succeeds");
          c.verify(L);
        }
      }
    }
  }
}

void signature_program(MPI_Comm world, unsigned seed) {
  const int rank = comm_rank(world), size = comm_size(world);
  std::mt19937 shared(seed);
  std::mt19937 mine(seed * 7919u + rank * 104729u);
  MPI_Comm comm;
  MPI_Comm_dup(world, &comm);
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  const Mem kinds[] = {Mem::host, Mem::device, Mem::pinned, Mem::managed};
  struct Sig {
    Kind kind;
    size_t n;
    int root;
  };
  const Sig sigs[] = {{Kind::allreduce, 64, 0}, {Kind::bcast, 1000, size - 1},
                      {Kind::allgather, 7, 0}, {Kind::reduce, 64, size / 2},
                      {Kind::rsb, 7, 0}, {Kind::alltoall, 7, 0}};
  // DIVERGENT_STREAM=1: a stream attached to the communicator (GPU calls stream-ordered),
  // which each rank detaches and attaches again on its own now and then.
  CUstream_st* stream = std::getenv("DIVERGENT_STREAM") ? api.stream_create(1) : nullptr;
  bool attached = stream && streamcoll_comm_attach_stream(comm, stream) == MPI_SUCCESS;
  check(!stream || attached, "attach the stream");
  unsigned step = 0;
  auto toggle = [&] {
    attached = !attached;
    check((attached ? streamcoll_comm_attach_stream(comm, stream)
                    : streamcoll_comm_detach_stream(comm)) == MPI_SUCCESS,
          "attach or detach the stream");
  };
  // One call of `sg` with this rank's kinds, checked (after the stream, if any).
  auto one_call = [&](const Sig& sg, bool nb, Mem sm, Mem rm, const char* phase) {
    Call c = make(sg.kind, sg.n, sg.root, false, seed * 10000 + step, comm);
    const std::string label = std::string(phase) + " seed " + std::to_string(seed) + " step " +
                              std::to_string(step) + ": " +
                              label_of(c, sm, rm, nb ? "non-blocking" : "blocking");
    c.prepare(sm, rm);
    MPI_Request req = MPI_REQUEST_NULL;
    check(c.start(nb ? &req : nullptr) == MPI_SUCCESS, label + ": returns MPI_SUCCESS");
    if (nb) check(MPI_Wait(&req, MPI_STATUS_IGNORE) == MPI_SUCCESS, label + ": completes");
    if (stream) check(api.stream_sync(stream) == 0, label + ": synchronise the stream");
    c.verify(label);
  };
  for (const Mem phase : {Mem::host, Mem::device, Mem::host}) {
    for (int i = 0; i < 150; ++i, ++step) {
      const Sig& sg = sigs[shared() % 6];
      const bool nb = shared() % 4 == 0;
      const Mem sm = mine() % 6 ? phase : kinds[mine() % 4];
      const Mem rm = mine() % 6 ? sm : kinds[mine() % 4];
      const bool late = shared() % 25 == 0;  // (drawn on every rank: the draws stay alike)
      if (late && rank == size - 1) usleep(20000);
      if (stream && mine() % 10 == 0) {
        toggle();
      }
      one_call(sg, nb, sm, rm, "signatures");
    }
  }
  if (stream) {
    // The reductions' own signatures on device memory (route nccl where the fake NCCL is
    // loaded: DIVERGENT_STREAM runs force it), each rank leaving device memory and its
    // stream on its own: calls after each signature's first decide from earlier
    // agreements, and a rank whose buffers differ takes part staged through its GPU.
    const Sig reds[] = {{Kind::allreduce, 96, 0}, {Kind::reduce, 96, size - 1}, {Kind::rsb, 9, 0}};
    const char* forced = std::getenv("DIVERGENT_ALLREDUCE_ROUTE");
    const std::string route = forced ? forced : "";
    auto on_route = [&](const char* mem) { return stat_calls("allreduce", route.c_str(), mem); };
    const unsigned long long device0 = on_route("device"),
                             staged0 = on_route("host") + on_route("pinned") + on_route("mixed");
    for (int i = 0; i < 240; ++i, ++step) {
      const Sig& sg = reds[shared() % 3];
      const bool nb = shared() % 5 == 0;
      // (each buffer off device memory about once in 3 * size calls: the agreements
      // find every rank on device memory often enough to route nccl at any size)
      const unsigned leave = 3u * static_cast<unsigned>(size);
      const Mem sm = mine() % leave ? Mem::device : kinds[mine() % 4];
      const Mem rm = mine() % leave ? sm : kinds[mine() % 4];
      if (shared() % 40 == 0 && rank == size - 1) usleep(20000);
      // (a rank detaches its stream for one call now and then: "the stream attribute is
      // set on some ranks only" is not routable, and the agreements must see it rarely)
      if (!attached || mine() % (10u * static_cast<unsigned>(size)) == 0) {
        toggle();
      }
      one_call(sg, nb, sm, rm, "stream phase");
    }
    if (route == "nccl" || route == "ht" || route == "ccube" || route == "nvgroup" ||
        route == "blueconnect") {
      check(on_route("device") > device0, "stream phase: calls took route " + route);
      // Some rank took part in a route's allreduce with host memory while the facts its
      // call decided from said device memory (summed over the ranks).
      int mine_staged = static_cast<int>(on_route("host") + on_route("pinned") +
                                         on_route("mixed") - staged0),
          all_staged = 0;
      MPI_Allreduce(&mine_staged, &all_staged, 1, MPI_INT, MPI_SUM, world);
      check(all_staged > 0, "stream phase: a rank on host memory took part in route " + route);
    }
  }
  if (attached) streamcoll_comm_detach_stream(comm);
  if (stream) api.stream_destroy(stream);
  // Steady state: one signature on host memory everywhere. After its first call (which
  // agrees), no blocking agreement; refreshes only at the schedule's points.
  auto counts = reinterpret_cast<AgreementCountsFn>(dlsym(RTLD_DEFAULT, "streamcoll_agreement_counts"));
  check(counts != nullptr, "streamcoll_agreement_counts found");
  unsigned long long b0 = 0, r0 = 0, b1 = 0, r1 = 0;
  std::vector<int> in(16), out(16);
  for (int i = 0; i < 16; ++i) in[i] = rank + i;
  MPI_Allreduce(in.data(), out.data(), 16, MPI_INT, MPI_MAX, comm);  // the signature's first
  if (counts) counts(&b0, &r0, nullptr);
  using SteadyFn = unsigned long long (*)();
  auto steady = reinterpret_cast<SteadyFn>(dlsym(RTLD_DEFAULT, "streamcoll_steady_calls"));
  check(steady != nullptr, "streamcoll_steady_calls found");
  const unsigned long long steady0 = steady ? steady() : 0;
  const unsigned long long pmpi0 = stat_calls("allreduce", "pmpi", "host");
  bool exact = true;
  for (int k = 0; k < 300; ++k) {
    MPI_Allreduce(in.data(), out.data(), 16, MPI_INT, MPI_MAX, comm);
    for (int i = 0; i < 16; ++i) exact = exact && out[i] == size - 1 + i;
  }
  if (counts) counts(&b1, &r1, nullptr);
  const unsigned long long steady1 = steady ? steady() : 0;
  const unsigned long long pmpi1 = stat_calls("allreduce", "pmpi", "host");
  check(exact, "steady host phase: every result exact");
  // Those calls repeat the first one's decision on the steady path (shim/steady.hpp), but
  // for the refreshes' calls and their adoptions (about 20), unless STREAMCOLL_CHECK is
  // on (it sees every call) or they leave pmpi; counted in the statistics all the same.
  const bool check_on = std::getenv("STREAMCOLL_CHECK") && std::string(std::getenv("STREAMCOLL_CHECK")) == "1";
  if (pmpi1 - pmpi0 == 300 && !check_on)
    check(steady1 - steady0 >= 270, "steady host phase: " + std::to_string(steady1 - steady0) +
                                        " of 300 calls on the steady path");
  else
    check(steady1 == steady0, "steady host phase: no call on the steady path (" +
                                  std::to_string(steady1 - steady0) + ")");
  // DIVERGENT_SET_ROUTE=SPEC: the routes forced on the communicator change
  // (streamcoll_comm_set_route) while the signature decides from earlier agreements: its
  // next calls go where the new rules and this call's facts say, on every rank alike
  // (some ranks on GPU memory now and then), every result exact.
  if (const char* spec = std::getenv("DIVERGENT_SET_ROUTE")) {
    check(api.set_route(comm, spec) == MPI_SUCCESS, std::string("set_route ") + spec);
    const unsigned long long ht0 = stat_calls("allreduce", "ht", "host");
    for (int k = 0; k < 40; ++k) {
      const Mem m = mine() % 5 ? Mem::host : Mem::device;
      Buf sb(16 * sizeof(int), m), rb(16 * sizeof(int), m);
      sb.put(in.data(), 16 * sizeof(int));
      check(MPI_Allreduce(sb.get(), rb.get(), 16, MPI_INT, MPI_MAX, comm) == MPI_SUCCESS,
            "after set_route: the call succeeds");
      const std::vector<char> got = rb.read();
      bool right = true;
      for (int i = 0; i < 16; ++i) {
        int v;
        std::memcpy(&v, got.data() + i * sizeof(int), sizeof v);
        right = right && v == size - 1 + i;
      }
      check(right, "after set_route: call " + std::to_string(k) + " exact");
    }
    check(stat_calls("allreduce", "ht", "host") > ht0, "after set_route: calls took route ht");
  }
  check(b1 == b0, "steady host phase: no blocking agreement in 300 calls (" +
                      std::to_string(b1 - b0) + ")");
  // Calls 2 to 301 of the signature: refreshes at 2, 3, 5, ..., 65 (7), then every 64th (4).
  // (Routes forced onto host memory (DIVERGENT_STREAM runs with ht): a routed signature
  // refreshes every 8th call as well.)
  const unsigned long long limit = pmpi1 - pmpi0 == 300 ? 11 : 11 + 300 / 8;
  check(r1 - r0 <= limit, "steady host phase: " + std::to_string(r1 - r0) + " refreshes in 300 calls");
  if (const char* mode = std::getenv("DIVERGENT_FAIL_STAGING"))
    staging_failures(comm, seed, std::string(mode) == "fatal");
  MPI_Comm_free(&comm);
}

// ---- steady ------------------------------------------------------------------------------

// The steady path (shim/steady.hpp): blocking calls that repeat an earlier call's decision
// without deciding again, on some ranks while others decide in full.
unsigned long long steady_calls() {
  using Fn = unsigned long long (*)();
  static const auto fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "streamcoll_steady_calls"));
  return fn ? fn() : 0;
}

void steady_program(MPI_Comm world) {
  const int rank = comm_rank(world), size = comm_size(world);
  unsigned salt = 7000;
  const unsigned long long s0 = steady_calls();
  // 1. Each collective the steady path takes, 300 calls with the same arguments, where
  //    each rank passes device memory now and then on its own (a full decision there,
  //    from the same facts), in place every third call, every value checked.
  for (Kind k : kKinds)
    for (int i = 0; i < 300; ++i) {
      const Mem m = (i * 7 + rank * 3) % 11 == 0 ? Mem::device : Mem::host;
      const bool ip = k != Kind::alltoall && i % 3 == 0;
      Call c = make(k, 8, size - 1, ip, ++salt % 50, world);
      run_blocking(c, m, m);
    }
  const unsigned long long s1 = steady_calls();
  check(s1 - s0 >= 6 * 200, "steady: " + std::to_string(s1 - s0) +
                               " of 1800 calls on the steady path");
  // 2. Another signature of the same collective on device memory everywhere (routed
  //    away from the MPI by default), then the host one on the steady path, then an
  //    MPI_Iallreduce on host memory: routed from the facts of the last blocking
  //    allreduce, which must be the host call's on every rank, also where a rank decided
  //    it in full (its device buffer) and the others on the steady path.
  for (int i = 0; i < 60; ++i) {
    Call big = make(Kind::allreduce, 4096, 0, false, ++salt % 50, world);
    run_blocking(big, Mem::device, Mem::device);
    const Mem m = (i + rank) % 5 == 0 ? Mem::device : Mem::host;
    Call small = make(Kind::allreduce, 8, 0, false, ++salt % 50, world);
    run_blocking(small, m, m);
    Call nb = make(Kind::allreduce, 8, 0, false, ++salt % 50, world);
    nb.prepare(Mem::host, Mem::host);
    MPI_Request req = MPI_REQUEST_NULL;
    check(nb.start(&req) == MPI_SUCCESS, "steady: MPI_Iallreduce after the steady call starts");
    check(MPI_Wait(&req, MPI_STATUS_IGNORE) == MPI_SUCCESS, "steady: its wait succeeds");
    nb.verify("steady: MPI_Iallreduce after the steady call");
  }
  // 3. Communicators freed and made again (the MPI may give the new one the freed one's
  //    handle, with another size): nothing remembered of the old one is used.
  for (int round = 0; round < 12; ++round) {
    MPI_Comm c;
    if (round % 2) MPI_Comm_split(world, rank % 2, rank, &c);
    else MPI_Comm_dup(world, &c);
    for (int i = 0; i < 40; ++i) {
      Call a = make(Kind::allreduce, 8, 0, false, ++salt % 50, c);
      run_blocking(a, Mem::host, Mem::host);
      Call b = make(Kind::bcast, 8, 0, false, ++salt % 50, c);
      run_blocking(b, Mem::host, Mem::host);
    }
    MPI_Comm_free(&c);
  }
  // 4. Every rank moves from host to device memory after a long host phase (its refreshes
  //    1024 calls apart by then): the calls leave the MPI for the table's device route
  //    within kRefreshMax + kRunAhead calls, on every rank alike, every value exact.
  MPI_Comm c;
  MPI_Comm_dup(world, &c);
  for (int i = 0; i < 2100; ++i) {
    const Mem m = i < 1100 ? Mem::host : Mem::device;
    Call a = make(Kind::allreduce, 8, 0, false, ++salt % 50, c);
    run_blocking(a, m, m);
  }
  const char* route = std::getenv("DIVERGENT_ALLREDUCE_ROUTE");
  if (size > 1 && route && stat_calls("allreduce", route, "device") != ~0ull)  // (statistics on)
    check(stat_calls("allreduce", route, "device") > 0,
          std::string("steady: the device phase reached route ") + route);
  MPI_Comm_free(&c);
}

// Stream-ordered MPI_Allreduce calls on `route` (nvgroup, blueconnect) decided from their
// signature's earlier agreements (device memory everywhere): the last rank passes host
// memory at calls 4 and 5 (it stages through scratch on the route's GPU) and its copy in
// fails at call 4: that call fails on that rank at once; the peers go on without its data
// and a later call of theirs reports the failure (on nvgroup call 5, whose kernel reads
// the status word of call 4's; on blueconnect within the next calls, as the outcome
// exchange completes and the levels' aborted NCCL communicators are seen); a call's value
// is exact wherever it returned MPI_SUCCESS and no later call reported a failure (on
// nvgroup: the next call; a stream-ordered call's failure is a later call's to report),
// and calls 22 to 27 succeed and are exact on every rank (nothing latched).
void staged_failure(MPI_Comm world, unsigned seed, const std::string& route) {
  const int rank = comm_rank(world), size = comm_size(world);
  const bool last = rank == size - 1;
  constexpr int kCalls = 28, kFailing = 4, kSettled = 22;
  auto fail_after = reinterpret_cast<fake_cuda_fail_after_fn>(
      dlsym(dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL), "fake_cuda_fail_after"));
  check(fail_after != nullptr, "fake_cuda_fail_after found");
  if (!fail_after) return;
  MPI_Comm comm;
  MPI_Comm_dup(world, &comm);
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  CUstream_st* stream = api.stream_create(1);
  check(streamcoll_comm_attach_stream(comm, stream) == MPI_SUCCESS, "staged failure: attach the stream");
  const unsigned long long host0 = stat_calls("allreduce", route.c_str(), "host");
  std::vector<Call> calls;
  calls.reserve(kCalls);
  std::vector<int> rcs;
  for (int n = 0; n < kCalls; ++n) {
    calls.push_back(make(Kind::allreduce, 300, 0, false, seed * 10000 + 9700 + n, comm));
    const Mem m = last && (n == kFailing || n == kFailing + 1) ? Mem::host : Mem::device;
    calls.back().prepare(m, m);
    const bool failing = last && n == kFailing;
    if (failing) fail_after("cuMemcpyAsync", 1);
    rcs.push_back(calls.back().start(nullptr));
    if (failing) fail_after("cuMemcpyAsync", 0);
    check(api.stream_sync(stream) == 0, "staged failure: synchronise the stream");
  }
  bool reported = false;
  for (int n = 0; n < kCalls; ++n) {
    const std::string L = route + " staged failure call " + std::to_string(n);
    if (n > kFailing && rcs[n] != MPI_SUCCESS) reported = true;
    if (n == kFailing && last) check(rcs[n] != MPI_SUCCESS, L + ": fails on the rank whose copy failed");
    if (n < kFailing || n >= kSettled) check(rcs[n] == MPI_SUCCESS, L + ": succeeds");
    if (route == "nvgroup" && n == kFailing + 1 && !last)
      check(rcs[n] != MPI_SUCCESS, L + ": reports the earlier call's failure");
    // Exact where nothing after it reports a failure (blueconnect's report may come several
    // calls later), and always before the failing call and once settled.
    bool later_failed = false;
    for (int m = n + 1; m < (route == "nvgroup" ? std::min(n + 2, kCalls) : kCalls); ++m)
      later_failed = later_failed || rcs[m] != MPI_SUCCESS;
    if (rcs[n] == MPI_SUCCESS && (n < kFailing || n >= kSettled || !later_failed))
      calls[n].verify(L);
  }
  if (!last) check(reported, route + " staged failure: a later call reports the failure");
  if (last && size > 1)
    check(stat_calls("allreduce", route.c_str(), "host") == host0 + 2,
          route + " staged failure: the host-memory calls took part in the route");
  streamcoll_comm_detach_stream(comm);
  api.stream_destroy(stream);
  MPI_Comm_free(&comm);
}

// ---- a late rank under stream-ordered calls ----------------------------------------------

// Stream-ordered blocking MPI_Bcast and MPI_Allgather on device memory, routed to nccl (or
// ht: `route`) from their signatures' earlier agreements, while the last rank now and then describes
// its data with derived datatypes (a strided vector; a contiguous type), which the facts
// it decides from never saw: it takes part repacked (core/repack.hpp: run_blocking), its
// host waiting for its stream first; the others' calls stay stream-ordered. Where MPI runs
// at MPI_THREAD_MULTIPLE, once (call 30) that rank (the bcast's root) fails to read its
// input while repacking: the call fails on every rank (route nccl's failure notice, which
// the watchdog takes in while a peer's host waits in cudaStreamSynchronize; without
// MPI_THREAD_MULTIPLE only at the peer's next call into streamcoll, docs/design.md; on ht
// the taint its host collective carries, seen by the engine): on
// that rank at once, on a peer whose call had returned (stream-ordered) at its next call
// on the communicator, and no rank takes a wrong value without that report; then the calls
// succeed again (the route is left at the next agreement). Every value and every hole
// checked. Each collective on its own duplicate (an aborted NCCL communicator stays so).
void derived_adopted(MPI_Comm world, unsigned seed, const std::string& route) {
  const int rank = comm_rank(world), size = comm_size(world);
  const bool odd = rank == size - 1;
  std::mt19937 mine(seed * 31u + static_cast<unsigned>(rank) * 7u);
  CUstream_st* stream = api.stream_create(1);
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  auto fail_after = level == MPI_THREAD_MULTIPLE
                        ? reinterpret_cast<fake_cuda_fail_after_fn>(dlsym(
                              dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL), "fake_cuda_fail_after"))
                        : nullptr;
  const int n = 256, root = size - 1;
  MPI_Datatype vec, contig;
  MPI_Type_vector(n, 1, 2, MPI_INT, &vec);
  MPI_Type_commit(&vec);
  MPI_Type_contiguous(n, MPI_INT, &contig);
  MPI_Type_commit(&contig);
  int sentinel;
  std::memset(&sentinel, Buf::kSentinel, sizeof sentinel);
  for (Kind kind : {Kind::bcast, Kind::allgather}) {
    const std::string what = std::string("derived, adopted: ") + kind_name(kind);
    MPI_Comm comm;
    MPI_Comm_dup(world, &comm);
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    check(streamcoll_comm_attach_stream(comm, stream) == MPI_SUCCESS, what + ": attach");
    const unsigned long long routed0 = stat_calls(kind_name(kind), route.c_str(), "device");
    int repacked = 0, failed = 0, late_failures = 0;
    bool owed = false;  // the last call returned MPI_SUCCESS with wrong values
    for (int i = 0; i < 60; ++i) {
      const unsigned salt = seed * 1000 + 800 + static_cast<unsigned>(i) +
                            (kind == Kind::bcast ? 0u : 100u);
      const bool lose = i == 30 && odd && fail_after;
      const bool derived = odd && i > 0 && (lose || mine() % 3 == 0);
      const std::string L = what + " call " + std::to_string(i) + (derived ? " (derived)" : "");
      std::vector<int> want, init;
      Buf* send = nullptr;
      Buf* recv = nullptr;
      int rc;
      if (lose) fail_after("cuMemcpyAsync", 1);
      if (kind == Kind::bcast) {  // from the last rank, its data every other int of 2n
        const size_t elems = derived ? 2 * static_cast<size_t>(n) : static_cast<size_t>(n);
        init.assign(elems, sentinel);
        want.assign(elems, sentinel);
        for (int k = 0; k < n; ++k) {
          want[derived ? 2 * k : k] = in_val(root, k, salt);
          if (rank == root) init[derived ? 2 * k : k] = in_val(root, k, salt);
        }
        recv = new Buf(elems * sizeof(int), Mem::device);
        recv->put(init.data(), init.size() * sizeof(int));
        rc = derived ? MPI_Bcast(recv->get(), 1, vec, root, comm)
                     : MPI_Bcast(recv->get(), n, MPI_INT, root, comm);
      } else {  // the last rank sends with `vec`, receives blocks of `contig`
        const size_t selems = derived ? 2 * static_cast<size_t>(n) : static_cast<size_t>(n);
        std::vector<int> v(selems, sentinel);
        for (int k = 0; k < n; ++k) v[derived ? 2 * k : k] = in_val(rank, k, salt);
        send = new Buf(selems * sizeof(int), Mem::device);
        send->put(v.data(), v.size() * sizeof(int));
        want.resize(static_cast<size_t>(n) * size);
        for (int q = 0; q < size; ++q)
          for (int k = 0; k < n; ++k) want[q * n + k] = in_val(q, k, salt);
        recv = new Buf(want.size() * sizeof(int), Mem::device);
        rc = derived ? MPI_Allgather(send->get(), 1, vec, recv->get(), 1, contig, comm)
                     : MPI_Allgather(send->get(), n, MPI_INT, recv->get(), n, MPI_INT, comm);
      }
      if (lose) fail_after("cuMemcpyAsync", 0);
      check(api.stream_sync(stream) == 0, L + ": synchronise the stream");
      repacked += derived && rc == MPI_SUCCESS;
      if (owed) check(rc != MPI_SUCCESS, L + ": reports the failure of the call before");
      owed = false;
      if (rc == MPI_SUCCESS) {
        // Wrong values only where a stream-ordered operation failed after its call had
        // returned: the next call must report it (checked above), and never after call 30.
        const size_t wrong = count_wrong(*recv, want);
        check(wrong == 0 || (fail_after && i == 30 && !derived),
              L + ": " + std::to_string(wrong) + " wrong elements (holes included)");
        owed = wrong != 0;
      } else {
        ++failed;
        late_failures += i >= 46;
      }
      if (lose) check(rc != MPI_SUCCESS, L + ": fails where this rank could not read its input");
      delete send;
      delete recv;
    }
    // Every rank saw the failure (call 30, or a later call before the route was left).
    int any = failed > 0, all = 0;
    MPI_Allreduce(&any, &all, 1, MPI_INT, MPI_MIN, world);
    if (fail_after) check(all == 1, what + ": the lost input failed a call on every rank");
    check(late_failures == 0, what + ": calls 46 to 59 succeed");
    if (odd) check(repacked >= 5, what + ": " + std::to_string(repacked) + " repacked calls succeeded");
    check(stat_calls(kind_name(kind), route.c_str(), "device") >= routed0 + 30,
          what + ": most calls took route " + route);
    streamcoll_comm_detach_stream(comm);
    MPI_Comm_free(&comm);
  }
  MPI_Type_free(&vec);
  MPI_Type_free(&contig);
  api.stream_destroy(stream);
}

// One collective's stream-ordered calls with a late rank (skew_program).
void skew_calls(MPI_Comm comm, Kind kind, const std::string& route, unsigned salt) {
  const int rank = comm_rank(comm), size = comm_size(comm);
  constexpr int kLate = 6, kCalls = 30, kDeep = 16;
  constexpr double kSkew = 0.3, kBound = 0.1;
  const std::string what = std::string("skew: ") + kind_name(kind);
  const unsigned long long routed0 = stat_calls(kind_name(kind), route.c_str(), "device");
  CUstream_st* stream = api.stream_create(1);
  check(streamcoll_comm_attach_stream(comm, stream) == MPI_SUCCESS, what + ": attach the stream");
  std::vector<Call> calls;
  calls.reserve(kCalls);
  for (int n = 1; n <= kCalls; ++n) {
    calls.push_back(make(kind, kind == Kind::allreduce ? 4096 : 512, 0, false, salt + n, comm));
    Call& c = calls.back();
    c.prepare(Mem::device, Mem::device);
    if (rank == size - 1 && size > 1 && (n == kLate || n == kDeep)) usleep(static_cast<useconds_t>(kSkew * 1e6));
    const double t0 = MPI_Wtime();
    check(c.start(nullptr) == MPI_SUCCESS, what + " call " + std::to_string(n) + " returns MPI_SUCCESS");
    const double dt = MPI_Wtime() - t0;
    if (rank == 0 && size > 1 && n >= kLate && n <= kLate + 3)
      check(dt < kBound, what + " call " + std::to_string(n) + " returned after " +
                             std::to_string(static_cast<int>(dt * 1e3)) + " ms with a peer " +
                             std::to_string(static_cast<int>(kSkew * 1e3)) + " ms late (bound " +
                             std::to_string(static_cast<int>(kBound * 1e3)) + " ms)");
  }
  check(api.stream_sync(stream) == 0, what + ": synchronise the stream");
  for (int n = 1; n <= kCalls; ++n) calls[n - 1].verify(what + " call " + std::to_string(n));
  if (size > 1)
    check(stat_calls(kind_name(kind), route.c_str(), "device") == routed0 + kCalls,
          what + ": every call took route " + route);
  streamcoll_comm_detach_stream(comm);
  api.stream_destroy(stream);
}

// Stream-ordered blocking calls on device memory return once enqueued, whatever their
// peers do: after the signature's first call (which agrees at once), the last rank arrives
// 300 ms late at call kLate, and rank 0's calls kLate to kLate + 3 (within
// SignatureAgreements::kRunAhead of the last refresh the late rank started) return in
// under 100 ms; a second late arrival (kDeep) after a deep run-ahead. MPI_Allreduce on
// route nccl (or the route DIVERGENT_ALLREDUCE_ROUTE names and STREAMCOLL_ROUTE forces);
// on routes nccl and ht also MPI_Bcast and MPI_Allgather, on nccl MPI_Alltoall.
void skew_program(MPI_Comm world) {
  MPI_Comm comm;
  MPI_Comm_dup(world, &comm);
  const char* forced = std::getenv("DIVERGENT_ALLREDUCE_ROUTE");
  const std::string route = forced ? forced : "nccl";
  skew_calls(comm, Kind::allreduce, route, 5000);
  if (route == "nccl" || route == "ht") skew_calls(comm, Kind::bcast, route, 5100);
  if (route == "nccl" || route == "ht" || route == "nvgroup" || route == "blueconnect")
    skew_calls(comm, Kind::allgather, route, 5200);
  if (route == "nvgroup" || route == "blueconnect") skew_calls(comm, Kind::rsb, route, 5400);
  if (route == "nccl") skew_calls(comm, Kind::alltoall, route, 5300);
  MPI_Comm_free(&comm);
}

void on_alarm(int) {
  static const char msg[] = "divergent: watchdog expired: a call hung\n";
  (void)!write(2, msg, sizeof msg - 1);
  _exit(3);
}

}  // namespace

int main(int argc, char** argv) {
  // DIVERGENT_THREAD_MULTIPLE=1: the program asks for MPI_THREAD_MULTIPLE itself.
  if (std::getenv("DIVERGENT_THREAD_MULTIPLE")) {
    int provided = MPI_THREAD_SINGLE;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  } else {
    MPI_Init(&argc, &argv);
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  const std::string mode = argc > 1 ? argv[1] : "";
  const bool need_nccl = std::getenv("STREAMCOLL_NCCL_LIB") != nullptr &&
                         access(std::getenv("STREAMCOLL_NCCL_LIB"), R_OK) == 0;
  int ok = (mode == "cases" || mode == "random" || mode == "signatures" || mode == "skew" ||
            mode == "steady") &&
                   load_api(need_nccl)
               ? 1
               : 0,
      all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all_ok) {
    if (g_rank == 0) std::fprintf(stderr, "divergent: unknown mode '%s' or the fakes not loaded\n", mode.c_str());
    MPI_Finalize();
    return 1;
  }
  signal(SIGALRM, on_alarm);
  alarm(static_cast<unsigned>(std::getenv("DIVERGENT_TIMEOUT") ? std::atoi(std::getenv("DIVERGENT_TIMEOUT")) : 240));
  check(api.runtime_init() == 0, "runtime init");
  const unsigned long long races0 = cu("races");
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  if (mode == "cases") {
    reduce_to_host_root(comm);
    mixed_kinds_blocking(comm);
    nonblocking_after_agreement(comm);
    set_route_on_subcomm(comm);
    opposite_orders(comm);
    classic_ordering(comm);
    derived_nonblocking(comm);
    derived_blocking_bcast(comm);
    pair_nonblocking(comm);
    if (std::getenv("FAKE_CUDA_DEVICES") && std::atoi(std::getenv("FAKE_CUDA_DEVICES")) >= 2)
      other_gpu(comm);
    // The route allreduce takes (DIVERGENT_ALLREDUCE_ROUTE, where STREAMCOLL_ROUTE forces
    // another NCCL route: ccube), the others nccl.
    const char* ar = std::getenv("DIVERGENT_ALLREDUCE_ROUTE");
    const std::string ar_route = ar ? ar : "nccl";
    if (need_nccl && g_size > 1) {
      check(stat_calls("allreduce", ar_route.c_str(), "device") != ~0ull &&
                stat_calls("allreduce", ar_route.c_str(), nullptr) > 0,
            "all-device allreduce calls took route " + ar_route);
      check(stat_calls("bcast", "nccl", nullptr) > 0, "all-device bcast calls took route nccl");
      // The last rank's non-blocking calls on host buffers (nonblocking_after_agreement)
      // took part on that route, staged through its GPU.
      if (g_rank == g_size - 1 && std::getenv("STREAMCOLL_NCCL_NONBLOCKING"))
        check(stat_calls("iallreduce", ar_route.c_str(), "host") + stat_calls("iallreduce", ar_route.c_str(), "pinned") > 0,
              "host-buffer MPI_Iallreduce calls took part on route " + ar_route);
    }
  } else if (mode == "skew") {
    skew_program(comm);
  } else if (mode == "steady") {
    steady_program(comm);
  } else if (mode == "signatures") {
    const int seeds = argc > 2 ? std::atoi(argv[2]) : 1;
    const unsigned base = std::getenv("DIVERGENT_SEED_BASE")
                              ? static_cast<unsigned>(std::atoi(std::getenv("DIVERGENT_SEED_BASE")))
                              : 1u;
    for (int s = 0; s < seeds; ++s) signature_program(comm, base + s);
    const char* ar = std::getenv("DIVERGENT_ALLREDUCE_ROUTE");
    if (std::getenv("DIVERGENT_STREAM") && ar && (std::string(ar) == "nccl" || std::string(ar) == "ht") &&
        g_size > 1)
      derived_adopted(comm, base, ar);
    if (std::getenv("DIVERGENT_STREAM") && ar &&
        (std::string(ar) == "nvgroup" || std::string(ar) == "blueconnect") && g_size > 1)
      staged_failure(comm, base, ar);
  } else {
    const int seeds = argc > 2 ? std::atoi(argv[2]) : 2;
    const unsigned base = std::getenv("DIVERGENT_SEED_BASE")
                              ? static_cast<unsigned>(std::atoi(std::getenv("DIVERGENT_SEED_BASE")))
                              : 1u;
    for (int s = 0; s < seeds; ++s) random_program(comm, base + s);
  }
  check(cu("races") == races0, "the fake driver saw no race");
  if (need_nccl) check(nc("mismatches") == 0, "every rank ran the same NCCL operations");
  MPI_Comm_free(&comm);
  api.runtime_fini();
  alarm(0);
  int counts[2] = {g_pass, g_fail}, total[2] = {0, 0};
  MPI_Reduce(counts, total, 2, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
  MPI_Finalize();
  if (g_rank == 0) std::printf("divergent (%s, %d ranks): %d passed, %d failed\n", mode.c_str(), g_size, total[0], total[1]);
  return total[1] == 0 && g_fail == 0 ? 0 : 1;
}
