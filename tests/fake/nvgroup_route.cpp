// Route nvgroup end to end on CPU: real MPI processes, streamcoll preloaded, the fake CUDA
// driver's shared "device" memory and IPC across processes, the kernel run as host code.
// Every rank passes device memory on its own GPU (FAKE_CUDA_DEVICES GPUs, rank r on GPU
// r % devices, so with FAKE_CUDA_BUS_ID=same several ranks share a GPU when there are
// fewer GPUs than ranks) and STREAMCOLL_ROUTE=allreduce:nvgroup forces the route.
//
//   nvgroup_route MODE
//   route    MPI_Allreduce (and MPI_Reduce_scatter_block likewise; MPI_Allgather of
//            every type, MPI_SHORT too, as bytes) of every datatype streamcoll maps to the kernel's types, with
//            MPI_SUM/PROD/MIN/MAX, counts 1, 7, 1000 and 100003 (odd, not divisible by
//            the group size; several rounds with the test's chunk), in place and not,
//            classic (the host must see the result complete: fake_cuda_host_access)
//            and on an attached stream (complete once the stream is); one 1 Mi-element
//            call; every call must take route nvgroup, and results must equal the
//            reduction computed here. MPI_Iallreduce takes the next rule (pmpi), exact,
//            or route nvgroup with STREAMCOLL_NVGROUP_NONBLOCKING=1 (in_flight below).
//            Buffers used again and again (reused_buffers below): read in place by the
//            peers once registered, with FAKE_CUDA_MALLOC_SHM=1.
//   off      the route must be off on every rank (the environment makes set-up fail on
//            one rank, or denies peer access): every call on pmpi, exact, none hangs.
//   launch   FAKE_CUDA_FAIL=cuLaunchKernel:N on one rank: that call fails on every rank
//            (MPI_ERRORS_RETURN), none hangs, and the calls after it are exact again.
//   held     a launch failing on one rank while its earlier stream-ordered call is still
//            queued (held_mode below).
//   enqueue [BATCHES]  a benchmark, not a test (enqueue_mode below).
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "harness.hpp"
#include "streamcoll/streamext.h"

namespace {

const OpCase kOps[] = {{"MPI_SUM", MPI_SUM, Op::sum}, {"MPI_PROD", MPI_PROD, Op::prod},
                       {"MPI_MIN", MPI_MIN, Op::min}, {"MPI_MAX", MPI_MAX, Op::max}};

std::vector<TypeCase> types() {
  return {{"MPI_INT8_T", MPI_INT8_T, Tag::i8},         {"MPI_UINT8_T", MPI_UINT8_T, Tag::u8},
          {"MPI_SIGNED_CHAR", MPI_SIGNED_CHAR, Tag::sc}, {"MPI_INT", MPI_INT, Tag::int_},
          {"MPI_UNSIGNED", MPI_UNSIGNED, Tag::uns},     {"MPI_LONG", MPI_LONG, Tag::lng},
          {"MPI_UNSIGNED_LONG", MPI_UNSIGNED_LONG, Tag::ulng},
          {"MPI_INT64_T", MPI_INT64_T, Tag::i64},       {"MPI_UINT64_T", MPI_UINT64_T, Tag::u64},
          {"MPI_FLOAT", MPI_FLOAT, Tag::flt},           {"MPI_DOUBLE", MPI_DOUBLE, Tag::dbl}};
}

int g_device = 0;
std::string g_expect = "nvgroup";
std::string g_nb_expect = "pmpi";  // where MPI_I* calls go (main: from the environment)
bool g_groups = false;  // several groups: the kernels run mostly on blueconnect's scratch
                        // (pool memory, which CUDA IPC cannot export): in-place reads of
                        // the inputs are not expected there

void* dev_alloc(size_t bytes) { return api.malloc_device(g_device, bytes ? bytes : 1); }

// One MPI_Allreduce (or MPI_Iallreduce + MPI_Wait) on device buffers, checked.
template <class T>
int one(MPI_Comm comm, const TypeCase& t, const OpCase& op, size_t n, bool in_place, void* stream,
        bool nonblocking, unsigned salt, bool expect_ok = true) {
  const int me = comm_rank(comm), p = comm_size(comm);
  const auto in = inputs<T>(me, n, op.kind, salt);
  const auto want = reduced<T>(p, n, op.kind, salt);
  const size_t bytes = n * sizeof(T);
  char* send = static_cast<char*>(dev_alloc(bytes));
  char* recv = static_cast<char*>(dev_alloc(bytes + sizeof(T)));
  std::memset(recv, 0x5a, bytes + sizeof(T));
  std::memcpy(in_place ? recv : send, in.data(), bytes);
  const std::string label = std::string(nonblocking ? "MPI_Iallreduce " : "MPI_Allreduce ") + t.name +
                            " " + op.name + " count " + std::to_string(n) +
                            (in_place ? " in place" : "") + (stream ? " on a stream" : "");
  const std::string route = nonblocking ? g_nb_expect : g_expect;
  const char* coll = nonblocking ? "iallreduce" : "allreduce";
  const unsigned long long before = stat_calls(coll, route.c_str(), "device");
  int rc;
  if (nonblocking) {
    MPI_Request r;
    rc = MPI_Iallreduce(in_place ? MPI_IN_PLACE : send, recv, static_cast<int>(n), t.type, op.op, comm, &r);
    if (rc == MPI_SUCCESS) rc = MPI_Wait(&r, MPI_STATUS_IGNORE);
  } else {
    rc = MPI_Allreduce(in_place ? MPI_IN_PLACE : send, recv, static_cast<int>(n), t.type, op.op, comm);
  }
  if (!expect_ok) {
    if (stream) api.stream_sync(static_cast<CUstream_st*>(stream));  // before freeing
    api.free(send);
    api.free(recv);
    return rc;
  }
  check(rc == MPI_SUCCESS, label + ": MPI_SUCCESS");
  check(stat_calls(coll, route.c_str(), "device") == before + 1, label + ": route " + route);
  if (stream) {
    check(api.stream_sync(static_cast<CUstream_st*>(stream)) == 0, label + ": stream completes");
  } else {
    // Classic semantics: the host may read the result now (the fake reports a race if
    // work that writes it is still unfinished, or not known finished by the host).
    const unsigned long long races = cu("races");
    api.host_access(recv, bytes, 0);
    check(cu("races") == races, label + ": complete when the call returns");
  }
  check(std::memcmp(recv, want.data(), bytes) == 0, label + ": exact");
  check(static_cast<unsigned char>(recv[bytes]) == 0x5a, label + ": nothing written past the end");
  if (!in_place) check(std::memcmp(send, in.data(), bytes) == 0, label + ": input unchanged");
  api.free(send);
  api.free(recv);
  return rc;
}

// MPI_Reduce_scatter_block (n per block) or MPI_Allgather (n per rank) on device buffers,
// checked like one(): route, completion, exact result, nothing else written.
template <class T>
void blocks(MPI_Comm comm, bool rsb, const TypeCase& t, const OpCase& op, size_t n, bool in_place,
            void* stream, unsigned salt) {
  const int me = comm_rank(comm), p = comm_size(comm);
  const size_t blk = n * sizeof(T), in_bytes = rsb ? blk * p : blk, out_bytes = rsb ? blk : blk * p;
  std::vector<char> in, want;
  if (rsb) {
    in = bytes_of(inputs<T>(me, n * p, op.kind, salt));
    const auto all = bytes_of(reduced<T>(p, n * p, op.kind, salt));
    want.assign(all.begin() + static_cast<long>(me * blk), all.begin() + static_cast<long>((me + 1) * blk));
  } else {
    in = pattern(me, 0, blk, salt);
    for (int q = 0; q < p; ++q) {
      const auto b = pattern(q, 0, blk, salt);
      want.insert(want.end(), b.begin(), b.end());
    }
  }
  // In place: rsb's input is the whole receive buffer (only its first block is written);
  // allgather's is this rank's block of it.
  const size_t recv_bytes = (in_place && rsb ? in_bytes : out_bytes) + sizeof(T);
  char* send = static_cast<char*>(dev_alloc(in_bytes));
  char* recv = static_cast<char*>(dev_alloc(recv_bytes));
  std::memset(recv, 0x5a, recv_bytes);
  std::memcpy(!in_place ? send : rsb ? recv : recv + me * blk, in.data(), in_bytes);
  const std::string label = std::string(rsb ? "MPI_Reduce_scatter_block " : "MPI_Allgather ") + t.name +
                            (rsb ? std::string(" ") + op.name : "") + " count " + std::to_string(n) +
                            (in_place ? " in place" : "") + (stream ? " on a stream" : "");
  const char* coll = rsb ? "reduce_scatter_block" : "allgather";
  const unsigned long long before = stat_calls(coll, g_expect.c_str(), "device");
  const void* sb = in_place ? MPI_IN_PLACE : send;
  const int rc = rsb ? MPI_Reduce_scatter_block(sb, recv, static_cast<int>(n), t.type, op.op, comm)
                     : MPI_Allgather(sb, static_cast<int>(n), t.type, recv, static_cast<int>(n), t.type, comm);
  check(rc == MPI_SUCCESS, label + ": MPI_SUCCESS");
  check(stat_calls(coll, g_expect.c_str(), "device") == before + 1, label + ": route " + g_expect);
  if (stream) {
    check(api.stream_sync(static_cast<CUstream_st*>(stream)) == 0, label + ": stream completes");
  } else {
    const unsigned long long races = cu("races");
    api.host_access(recv, recv_bytes - sizeof(T), 0);
    check(cu("races") == races, label + ": complete when the call returns");
  }
  check(std::memcmp(recv, want.data(), out_bytes) == 0, label + ": exact");
  if (in_place && rsb)
    check(std::memcmp(recv + blk, in.data() + blk, in_bytes - blk) == 0, label + ": the rest of recvbuf untouched");
  check(static_cast<unsigned char>(recv[recv_bytes - sizeof(T)]) == 0x5a, label + ": nothing written past the end");
  if (!in_place) check(std::memcmp(send, in.data(), in_bytes) == 0, label + ": input unchanged");
  api.free(send);
  api.free(recv);
}

// Several MPI_I* calls in flight at once on one communicator (allreduce of two types,
// in place and not, reduce_scatter_block, allgather), completed by one MPI_Waitall over
// them and an ordinary request, in reverse order; or polled with MPI_Testall. Each exact;
// classic: complete when the wait returns; on a stream: once the stream is.
void in_flight(MPI_Comm comm, CUstream_st* stream, unsigned salt) {
  const int me = comm_rank(comm), p = comm_size(comm);
  struct Pending {
    std::string label;
    char* send;
    char* recv;
    size_t bytes;
    std::vector<char> want;
  };
  std::vector<Pending> calls;
  std::vector<MPI_Request> reqs;
  const unsigned long long before = stat_calls(nullptr, "nvgroup", "device");
  auto start = [&](const std::string& label, std::vector<char> in, std::vector<char> want,
                   bool in_place, const std::function<int(const void*, void*, MPI_Request*)>& f) {
    Pending c{label, static_cast<char*>(dev_alloc(in.size())), nullptr, want.size(), std::move(want)};
    c.recv = static_cast<char*>(dev_alloc(std::max(c.bytes, in.size())));
    std::memcpy(in_place ? c.recv : c.send, in.data(), in.size());
    MPI_Request r = MPI_REQUEST_NULL;
    check(f(in_place ? MPI_IN_PLACE : c.send, c.recv, &r) == MPI_SUCCESS, label + ": starts");
    reqs.push_back(r);
    calls.push_back(std::move(c));
  };
  const size_t n = 3001;
  start("MPI_Iallreduce MPI_INT MPI_SUM", bytes_of(inputs<int>(me, n, Op::sum, salt)),
        bytes_of(reduced<int>(p, n, Op::sum, salt)), false, [&](const void* sb, void* rb, MPI_Request* r) {
          return MPI_Iallreduce(sb, rb, static_cast<int>(n), MPI_INT, MPI_SUM, comm, r);
        });
  start("MPI_Iallreduce MPI_DOUBLE MPI_MAX in place", bytes_of(inputs<double>(me, 7, Op::max, salt + 1)),
        bytes_of(reduced<double>(p, 7, Op::max, salt + 1)), true, [&](const void* sb, void* rb, MPI_Request* r) {
          return MPI_Iallreduce(sb, rb, 7, MPI_DOUBLE, MPI_MAX, comm, r);
        });
  {
    const auto all = bytes_of(reduced<float>(p, 100 * static_cast<size_t>(p), Op::prod, salt + 2));
    start("MPI_Ireduce_scatter_block MPI_FLOAT MPI_PROD",
          bytes_of(inputs<float>(me, 100 * static_cast<size_t>(p), Op::prod, salt + 2)),
          std::vector<char>(all.begin() + me * 400, all.begin() + (me + 1) * 400), false,
          [&](const void* sb, void* rb, MPI_Request* r) {
            return MPI_Ireduce_scatter_block(sb, rb, 100, MPI_FLOAT, MPI_PROD, comm, r);
          });
  }
  {
    std::vector<char> want;
    for (int q = 0; q < p; ++q) {
      const auto b = pattern(q, 0, 999, salt + 3);
      want.insert(want.end(), b.begin(), b.end());
    }
    start("MPI_Iallgather MPI_BYTE", pattern(me, 0, 999, salt + 3), want, false,
          [&](const void* sb, void* rb, MPI_Request* r) {
            return MPI_Iallgather(sb, 999, MPI_BYTE, rb, 999, MPI_BYTE, comm, r);
          });
  }
  check(stat_calls(nullptr, "nvgroup", "device") == before + calls.size(), "MPI_I* calls on route nvgroup");
  // An ordinary request among them: a self message.
  int token = me, got = -1;
  MPI_Request self[2];
  MPI_Irecv(&got, 1, MPI_INT, 0, 7, MPI_COMM_SELF, &self[0]);
  MPI_Isend(&token, 1, MPI_INT, 0, 7, MPI_COMM_SELF, &self[1]);
  std::vector<MPI_Request> all(reqs.rbegin(), reqs.rend());
  all.insert(all.begin() + 1, self, self + 2);
  if (salt % 2) {
    check(MPI_Waitall(static_cast<int>(all.size()), all.data(), MPI_STATUSES_IGNORE) == MPI_SUCCESS,
          "MPI_Waitall");
  } else {
    int done = 0;
    for (int i = 0; i < 10000000 && !done; ++i)
      check(MPI_Testall(static_cast<int>(all.size()), all.data(), &done, MPI_STATUSES_IGNORE) == MPI_SUCCESS,
            "MPI_Testall");
    check(done != 0, "MPI_Testall completes them");
  }
  check(got == me, "the ordinary request completed too");
  if (stream) check(api.stream_sync(stream) == 0, "the stream completes");
  const unsigned long long races = cu("races");
  for (Pending& c : calls) {
    const std::string label = c.label + (stream ? " on a stream" : "") + " (in flight together)";
    if (!stream) api.host_access(c.recv, c.bytes, 0);
    check(std::memcmp(c.recv, c.want.data(), c.bytes) == 0, label + ": exact");
    api.free(c.send);
    api.free(c.recv);
  }
  check(cu("races") == races, "complete when the wait returns (classic) or the stream is");
}

// The same buffers again and again (as a training loop does): from their second or third
// call on, each rank's input is read in place by its peers (registered: CUDA IPC of its
// allocation, mapped by every peer) when the fake's device memory can be exported
// (FAKE_CUDA_MALLOC_SHM=1); results exact throughout, in place and not; then more
// buffers than a rank registers at once (slots taken over once no kernel reads them).
void reused_buffers(MPI_Comm comm, CUstream_st* stream, unsigned salt) {
  const int me = comm_rank(comm), p = comm_size(comm);
  const unsigned long long direct0 = cu("nvgroup_direct_inputs");
  const size_t n = 5003;
  std::vector<char*> send, recv;
  const int buffers = 36;  // more than a rank registers at once (nvgroup::kSlots, 32)
  for (int i = 0; i < buffers; ++i) {
    send.push_back(static_cast<char*>(dev_alloc(n * sizeof(double) * p)));
    recv.push_back(static_cast<char*>(dev_alloc(n * sizeof(double) * p)));
  }
  auto call = [&](int b, bool rsb, bool in_place, unsigned s) {
    const std::string label = std::string(rsb ? "MPI_Reduce_scatter_block" : "MPI_Allreduce") +
                              " on reused buffers " + std::to_string(b) + (in_place ? " in place" : "") +
                              (stream ? " on a stream" : "");
    const size_t in_n = rsb ? n * p : n;
    const auto in = inputs<double>(me, in_n, Op::sum, s);
    const auto all = reduced<double>(p, in_n, Op::sum, s);
    std::memcpy(in_place ? recv[b] : send[b], in.data(), in_n * sizeof(double));
    const void* sb = in_place ? MPI_IN_PLACE : send[b];
    const int rc = rsb ? MPI_Reduce_scatter_block(sb, recv[b], static_cast<int>(n), MPI_DOUBLE, MPI_SUM, comm)
                       : MPI_Allreduce(sb, recv[b], static_cast<int>(n), MPI_DOUBLE, MPI_SUM, comm);
    check(rc == MPI_SUCCESS, label + ": MPI_SUCCESS");
    if (stream) check(api.stream_sync(stream) == 0, label + ": stream completes");
    else api.host_access(recv[b], n * sizeof(double), 0);
    const double* want = all.data() + (rsb ? static_cast<size_t>(me) * n : 0);
    check(std::memcmp(recv[b], want, n * sizeof(double)) == 0, label + ": exact");
    if (!in_place) check(std::memcmp(send[b], in.data(), in_n * sizeof(double)) == 0, label + ": input unchanged");
  };
  // Two inputs (send, and recv in place) of one allreduce, one of reduce_scatter_block:
  // each registered at its first call, mapped by the peers at their next, read in place
  // from its third at the latest (the peers' calls run a call behind at most: 6 of 10).
  for (int i = 0; i < 6; ++i) call(0, false, i % 2 == 1, salt + i);
  for (int i = 0; i < 4; ++i) call(1, true, false, salt + 10 + i);
  const char* shm = std::getenv("FAKE_CUDA_MALLOC_SHM");
  if (p > 1 && shm && std::strcmp(shm, "1") == 0 && g_expect == "nvgroup" && !g_groups)
    check(cu("nvgroup_direct_inputs") >= direct0 + 6, "inputs read in place by the peers");
  // More inputs than a rank registers in turn: slots taken over, exact throughout.
  for (int round = 0; round < 2; ++round)
    for (int b = 0; b < buffers; ++b)
      call(b, b % 3 == 0, b % 2 == 1 && b % 3 != 0, salt + 20 + round * buffers + b);
  for (int i = 0; i < buffers; ++i) {
    api.free(send[i]);
    api.free(recv[i]);
  }
}

void route_mode(MPI_Comm comm) {
  const unsigned long long races0 = cu("races");
  CUstream_st* s = api.stream_create(0);
  MPI_Comm attached;
  MPI_Comm_dup(comm, &attached);
  check(streamcoll_comm_attach_stream(attached, s) == MPI_SUCCESS, "attach a stream");
  unsigned salt = 1;
  for (const TypeCase& t : types())
    for (const OpCase& op : kOps)
      for (size_t n : {size_t{1}, size_t{7}, size_t{1000}, size_t{100003}})
        for (int variant = 0; variant < 2; ++variant) {
          const bool in_place = (variant + n) % 2 == 1;
          const bool on_stream = variant == 1;
          with_type(t.tag, [&](auto x) {
            using T = decltype(x);
            one<T>(on_stream ? attached : comm, t, op, n, in_place, on_stream ? s : nullptr,
                   false, ++salt);
          });
        }
  // reduce_scatter_block: every type and op; allgather: every type (any size moves).
  for (const TypeCase& t : types())
    for (size_t n : {size_t{1}, size_t{7}, size_t{3001}})
      for (int variant = 0; variant < 2; ++variant) {
        const bool in_place = (variant + n) % 2 == 1;
        const bool on_stream = variant == 1;
        with_type(t.tag, [&](auto x) {
          using T = decltype(x);
          for (const OpCase& op : kOps)
            blocks<T>(on_stream ? attached : comm, true, t, op, n, in_place, on_stream ? s : nullptr, ++salt);
          blocks<T>(on_stream ? attached : comm, false, t, kOps[0], n, !in_place, on_stream ? s : nullptr, ++salt);
        });
      }
  blocks<short>(comm, false, {"MPI_SHORT", MPI_SHORT, Tag::shrt}, kOps[0], 999, false, nullptr, ++salt);
  blocks<double>(comm, true, {"MPI_DOUBLE", MPI_DOUBLE, Tag::dbl}, kOps[0], size_t{1} << 18, false, nullptr, ++salt);
  blocks<double>(attached, false, {"MPI_DOUBLE", MPI_DOUBLE, Tag::dbl}, kOps[0], size_t{1} << 18, true, s, ++salt);
  one<float>(comm, {"MPI_FLOAT", MPI_FLOAT, Tag::flt}, kOps[0], size_t{1} << 20, false, nullptr, false, ++salt);
  one<double>(attached, {"MPI_DOUBLE", MPI_DOUBLE, Tag::dbl}, kOps[3], size_t{1} << 20, true, s, false, ++salt);
  // Non-blocking calls: route nvgroup with STREAMCOLL_NVGROUP_NONBLOCKING=1 (one group),
  // else the next rule (pmpi here); exact.
  one<int>(comm, {"MPI_INT", MPI_INT, Tag::int_}, kOps[0], 1000, false, nullptr, true, ++salt);
  if (g_nb_expect == "nvgroup") {
    one<double>(attached, {"MPI_DOUBLE", MPI_DOUBLE, Tag::dbl}, kOps[2], 4099, true, s, true, ++salt);
    in_flight(comm, nullptr, ++salt);
    in_flight(attached, s, ++salt);
  }
  reused_buffers(comm, nullptr, ++salt * 100);
  reused_buffers(attached, s, ++salt * 100);
  // Types and ops the kernel does not take: the next rule, exact.
  {
    const unsigned long long before = stat_calls("allreduce", "pmpi", "device");
    one<short>(comm, {"MPI_SHORT", MPI_SHORT, Tag::shrt}, kOps[0], 100, false, nullptr, false, ++salt,
               false);
    check(stat_calls("allreduce", "pmpi", "device") == before + 1, "MPI_SHORT: pmpi");
  }
  // A communicator freed right after a stream-ordered call: its scratch outlives it until
  // every member is through (no crash, no race; checked by the calls after it).
  {
    MPI_Comm tmp;
    MPI_Comm_dup(comm, &tmp);
    streamcoll_comm_attach_stream(tmp, s);
    one<double>(tmp, {"MPI_DOUBLE", MPI_DOUBLE, Tag::dbl}, kOps[0], 5000, false, s, false, ++salt);
    MPI_Comm_free(&tmp);
    one<double>(comm, {"MPI_DOUBLE", MPI_DOUBLE, Tag::dbl}, kOps[0], 5000, false, nullptr, false, ++salt);
  }
  MPI_Comm_free(&attached);
  api.stream_destroy(s);
  check(cu("races") == races0, "no races (fake CUDA driver)");
  check(cu("host_kernels") > 0, "kernels ran as host code");
}

void off_mode(MPI_Comm comm) {
  g_expect = "pmpi";
  unsigned salt = 100;
  for (const OpCase& op : kOps)
    for (size_t n : {size_t{7}, size_t{1000}})
      one<double>(comm, {"MPI_DOUBLE", MPI_DOUBLE, Tag::dbl}, op, n, false, nullptr, false, ++salt);
  check(cu("host_kernels") == 0, "no kernel ran");
}

void launch_mode(MPI_Comm comm) {
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  unsigned salt = 200;
  const TypeCase t{"MPI_INT", MPI_INT, Tag::int_};
  // FAKE_CUDA_FAIL=cuLaunchKernel:3 on one rank: the third call fails everywhere.
  for (int call = 1; call <= 6; ++call) {
    if (call == 3) {
      const int rc = one<int>(comm, t, kOps[0], 5000, false, nullptr, false, ++salt, false);
      check(rc != MPI_SUCCESS, "the call whose launch failed on one rank fails on every rank");
    } else {
      one<int>(comm, t, kOps[call % 4], 5000, call % 2, nullptr, false, ++salt);
    }
  }
}

// A stream-ordered call whose kernel launch fails on one rank (FAKE_CUDA_FAIL=
// cuLaunchKernel:2 there) while this rank's previous stream-ordered call still waits on
// the stream behind the program's own work (a gate the test holds): the earlier call must
// still be exact on every rank (the failing rank must not let its peers past rounds its
// queued kernel has yet to do), the failed call fails on its rank and is reported by the
// next call on the others, and the next calls are exact again.
void held_mode(MPI_Comm comm) {
  const int me = comm_rank(comm);
  const bool failing = std::getenv("FAKE_CUDA_FAIL_RANK") && std::atoi(std::getenv("FAKE_CUDA_FAIL_RANK")) == me;
  CUstream_st* s = api.stream_create(0);
  MPI_Comm attached;
  MPI_Comm_dup(comm, &attached);
  MPI_Comm_set_errhandler(attached, MPI_ERRORS_RETURN);
  streamcoll_comm_attach_stream(attached, s);
  auto* gate = static_cast<uint32_t*>(api.malloc_pinned(64));
  __atomic_store_n(gate, 0u, __ATOMIC_RELEASE);
  check(api.enqueue_wait(s, gate, 1) == 0, "the gate holds the stream");
  const size_t n = 3000;
  const TypeCase t{"MPI_INT", MPI_INT, Tag::int_};
  const auto in_a = inputs<int>(me, n, Op::sum, 31), want_a = reduced<int>(comm_size(comm), n, Op::sum, 31);
  const auto in_b = inputs<int>(me, n, Op::sum, 32);
  int* a_send = static_cast<int*>(dev_alloc(n * sizeof(int)));
  int* a_recv = static_cast<int*>(dev_alloc(n * sizeof(int)));
  int* b_buf = static_cast<int*>(dev_alloc(n * sizeof(int)));
  std::memcpy(a_send, in_a.data(), n * sizeof(int));
  std::memcpy(b_buf, in_b.data(), n * sizeof(int));
  const int rc_a = MPI_Allreduce(a_send, a_recv, static_cast<int>(n), MPI_INT, MPI_SUM, attached);
  const int rc_b = MPI_Allreduce(MPI_IN_PLACE, b_buf, static_cast<int>(n), MPI_INT, MPI_SUM, attached);
  check(rc_a == MPI_SUCCESS, "the held call starts");
  check(failing ? rc_b != MPI_SUCCESS : rc_b == MPI_SUCCESS,
        failing ? "the call whose launch failed fails here" : "the call starts here");
  MPI_Barrier(comm);
  __atomic_store_n(gate, 1u, __ATOMIC_RELEASE);
  check(api.stream_sync(s) == 0, "the stream completes (no hang)");
  check(std::memcmp(a_recv, want_a.data(), n * sizeof(int)) == 0,
        "the call queued before the failure is exact on every rank");
  // The next call runs (exact) and, on the ranks where it started, reports the failure.
  const int rc_c = one<int>(attached, t, kOps[0], 777, false, s, false, 33, false);
  check(failing ? rc_c == MPI_SUCCESS : rc_c != MPI_SUCCESS,
        failing ? "nothing more to report here" : "the next call reports the failed one");
  one<int>(attached, t, kOps[3], 777, true, s, false, 34);
  one<int>(comm, t, kOps[2], 777, false, nullptr, false, 35);
  api.free(a_send);
  api.free(a_recv);
  api.free(b_buf);
  api.free(gate);
  MPI_Comm_free(&attached);
  api.stream_destroy(s);
}

// Not a test: the host time of issuing one stream-ordered 8-byte MPI_Allreduce on route
// nvgroup (the enqueue cost: what the call costs the host before it returns), against the
// fake driver. Batches of 100 calls, each call timed, the stream synchronised after each
// batch (the kernels run then); the last batch's result is checked. Rank 0 prints
// min/median/p90/max over all timed calls. Run by scripts/bench-nvgroup-fake.sh.
void enqueue_mode(MPI_Comm comm, int batches) {
  CUstream_st* s = api.stream_create(0);
  MPI_Comm attached;
  MPI_Comm_dup(comm, &attached);
  streamcoll_comm_attach_stream(attached, s);
  const int me = comm_rank(comm), p = comm_size(comm);
  float* send = static_cast<float*>(dev_alloc(8));
  float* recv = static_cast<float*>(dev_alloc(8));
  send[0] = static_cast<float>(me + 1);
  send[1] = 2.0f;
  std::vector<double> us;
  for (int b = -2; b < batches; ++b) {  // two warm-up batches
    MPI_Barrier(comm);
    for (int i = 0; i < 100; ++i) {
      const double t0 = MPI_Wtime();
      MPI_Allreduce(send, recv, 2, MPI_FLOAT, MPI_SUM, attached);
      const double t1 = MPI_Wtime();
      if (b >= 0) us.push_back((t1 - t0) * 1e6);
    }
    api.stream_sync(s);
  }
  check(recv[0] == static_cast<float>(p * (p + 1) / 2) && recv[1] == 2.0f * p, "8-byte result exact");
  // Statistics are off (they cost per call): the fake's kernel launches say the route.
  check(cu("host_kernels") >= 100ull * static_cast<unsigned long long>(batches + 2),
        "the calls took route nvgroup (one kernel each)");
  const char* shm = std::getenv("FAKE_CUDA_MALLOC_SHM");
  const char* route = std::getenv("STREAMCOLL_ROUTE");
  if (p > 1 && shm && std::strcmp(shm, "1") == 0 && !(route && std::strstr(route, "direct=no")))
    check(cu("nvgroup_direct_inputs") >= 100ull * static_cast<unsigned long long>(batches),
          "the inputs were read in place (registered) from the first batches on");
  std::sort(us.begin(), us.end());
  if (me == 0 && !us.empty())
    std::printf("enqueue us/call (stream-ordered MPI_Allreduce, 8 B, %d ranks, %zu calls): "
                "min %.2f median %.2f p90 %.2f max %.2f\n",
                p, us.size(), us.front(), us[us.size() / 2], us[us.size() * 9 / 10], us.back());
  api.free(send);
  api.free(recv);
  MPI_Comm_free(&attached);
  api.stream_destroy(s);
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  const std::string mode = argc > 1 ? argv[1] : "route";
  int ok = load_api(false) ? 1 : 0, all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all_ok) {
    MPI_Finalize();
    return 1;
  }
  // The expectations below are those of one node: one NV-Group of every rank (or groups
  // imposed by a hierarchy on it). Ranks on several nodes (the test cluster,
  // scripts/cluster.sh) make the route BlueConnect's decomposition across nodes, which
  // needs route nccl, absent here (STREAMCOLL_NCCL_LIB): the calls take the next rule,
  // pmpi, which synchronises an attached stream (held mode's gate would then hold it for
  // ever). So on several nodes the program says so and skips.
  {
    const int leaders = job_nodes();
    if (leaders > 1) {
      if (g_rank == 0)
        std::printf("SKIP: the ranks are on %d nodes; this test's expectations are one node's\n", leaders);
      MPI_Finalize();
      return 77;
    }
  }
  // MPI_I*: route nvgroup when the program says so, on one group (several: the next rule).
  const char* nb = std::getenv("STREAMCOLL_NVGROUP_NONBLOCKING");
  const char* hier = std::getenv("STREAMCOLL_HIERARCHY");
  const char* rule = std::getenv("STREAMCOLL_ROUTE");
  const bool groups = (hier && std::strchr(hier, 'x')) || (rule && std::strstr(rule, "hierarchy="));
  if (nb && std::strcmp(nb, "1") == 0 && !groups) g_nb_expect = "nvgroup";
  g_groups = groups;
  const int devices = std::getenv("FAKE_CUDA_DEVICES") ? std::atoi(std::getenv("FAKE_CUDA_DEVICES")) : 1;
  g_device = g_rank % std::max(devices, 1);
  check(api.runtime_init() == 0, "runtime init");
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  if (mode == "route") route_mode(comm);
  else if (mode == "off") off_mode(comm);
  else if (mode == "launch") launch_mode(comm);
  else if (mode == "held") held_mode(comm);
  else if (mode == "enqueue") enqueue_mode(comm, argc > 2 ? std::atoi(argv[2]) : 50);
  else check(false, "unknown mode " + mode);
  MPI_Comm_free(&comm);
  check(cu("races") == 0, "no races (fake CUDA driver)");
  int fails = g_fail, total = 0;
  MPI_Allreduce(&fails, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (g_rank == 0)
    std::printf("nvgroup_route (%s, %d ranks): %d passed on rank 0, %d failed on all ranks\n",
                mode.c_str(), g_size, g_pass, total);
  api.runtime_fini();
  MPI_Finalize();
  return total == 0 ? 0 : 1;
}
