// The NCCL route (algorithms/nccl.cpp) end to end without a GPU: real MPI processes,
// streamcoll preloaded, a fake CUDA driver (libcuda.so.1 from fake_cuda.cpp, through
// LD_LIBRARY_PATH) and a fake NCCL (fake_nccl.cpp, through STREAMCOLL_NCCL_LIB). Plain
// MPI + dl: the fakes' helpers (fake_api.h) and streamcoll's statistics are found with
// dlsym. Fake device memory is host memory, so calls that fall back to pmpi can run on
// it either way: through streamcoll's host staging (an MPI that is not CUDA-aware, the
// default here), or read by the MPI itself (STREAMCOLL_MPI_CUDA_AWARE=yes).
//
//   nccl_route MODE      (run under tests/mpi/run.sh preload; tests/fake/meson.build)
//   route        every supported call goes to NCCL (FAKE_CUDA_BUS_ID=per-rank):
//                allreduce, reduce (every root), bcast (every root), allgather,
//                reduce_scatter_block, alltoall; every datatype the route maps with SUM,
//                PROD, MIN, MAX; counts 1, 7, 1000, 100000; blocking, MPI_Wait, MPI_Test
//                loops, MPI_Waitall/Waitany/Testall/Waitsome mixed with point-to-point
//                requests, MPI_Request_free; in place or not; classic, attached stream,
//                attached legacy stream (0), input written on the legacy stream. Calls
//                the route does not take go to pmpi: MPI_SHORT SUM, MPI_UNSIGNED_SHORT
//                MAX, MPI_INT BAND, MPI_2INT, MPI_Allgatherv, MPI_Reduce_scatter; host,
//                pinned and managed buffers; 0 elements. Set-up order (non-blocking calls
//                before the first blocking one go to pmpi), MPI_COMM_WORLD, split and dup'ed
//                communicators (a dup inherits the stream), MPI_Comm_free with a request
//                in flight.
//   shared       ranks share a GPU (FAKE_CUDA_BUS_ID=same or mod:K): every communicator
//                with two ranks on one GPU sends everything to pmpi, correctly, without
//                starting NCCL, and an attached stream is synchronised first
//   fail-init    FAKE_NCCL_FAIL_INIT: ncclCommInitRank fails on one rank (or all); the
//                ranks agree, abort, and everything goes to pmpi
//   absent       STREAMCOLL_NCCL_LIB names no library: everything goes to pmpi
//   ccube        route ccube (C-Cube's tree as NCCL send/recv rounds and the reduction
//                kernel) forced on a duplicate: MPI_Allreduce on every datatype and op it
//                takes, counts 1 to 100000, chunks of the default size, 1 KiB, 24 bytes
//                (short last chunks) and 64 KiB, every completion and stream mode in
//                turn; no ncclAllReduce; MPI_SHORT and bcast go on to other routes
//   ccube-load-fails  FAKE_CUDA_FAIL=cuModuleLoadData:1 on one rank: route ccube's first
//                call fails on every rank, the next ones are right on another route
//   async-error  FAKE_NCCL_ASYNC_ERROR_AFTER=3, FAKE_CUDA_DEVICES=2: streamcoll's
//                watchdog aborts the NCCL communicator without any MPI call; the request in
//                flight fails (MPI_ERR_OTHER); the next call runs elsewhere, right; later calls
//                (MPI_I* and stream-ordered ones too) are right, without reaching NCCL
//                (nothing latched); unsupported calls still work; buffers on another device than the
//                NCCL communicator's go to pmpi, right, on every rank; a rank whose peer
//                never joins a (non-blocking) operation: its wait fails
//
// Every call is checked against values computed here, against streamcoll's statistics
// (route and memory kind), and against the fakes' counters (stream semantics: a call with
// an attached stream returns without the host waiting, and with FAKE_CUDA_DEFER=1 its
// work is still pending on the stream; completing its request makes the stream wait,
// not the host; a pmpi fallback with a stream synchronises it). The fake driver reports
// races (work not ordered after work it depends on, or the host reading results it has
// not seen complete); any race fails the test. At the end, after MPI_Finalize,
// streamcoll must have released every context, stream, event and allocation it made.
// Prints "N passed, N failed" on rank 0; exits nonzero on failure.
#include <dlfcn.h>
#include <mpi.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "fake_api.h"
#include "harness.hpp"
#include "streamcoll/streamcoll.h"
#include "streamcoll/streamext.h"

namespace {

// ---- buffers ---------------------------------------------------------------------------------

enum class Mem { device, host, managed, pinned, device1 };

// A buffer in fake device memory (or host, managed, device 1), freed at scope end.
class Buf {
 public:
  Buf() = default;
  Buf(size_t bytes, Mem m = Mem::device) : bytes_(bytes), mem_(m) {
    if (bytes == 0) return;
    switch (m) {
      case Mem::device: p_ = api.malloc(bytes); break;
      case Mem::managed: p_ = api.malloc_managed(bytes); break;
      case Mem::pinned: p_ = api.malloc_pinned(bytes); break;
      case Mem::device1: p_ = api.malloc_device(1, bytes); break;
      case Mem::host: p_ = std::malloc(bytes); break;
    }
    if (!p_) {
      std::fprintf(stderr, "[rank %d] out of (fake) memory\n", g_rank);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }
  ~Buf() {
    if (!p_) return;
    if (mem_ == Mem::host)
      std::free(p_);
    else
      api.free(p_);
  }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  Buf(Buf&& o) noexcept : p_(o.p_), bytes_(o.bytes_), mem_(o.mem_) { o.p_ = nullptr; }

  void* get() const { return p_; }
  size_t size() const { return bytes_; }
  bool fake() const { return mem_ != Mem::host; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
  Mem mem_ = Mem::device;
};

// The host writes/reads a fake device buffer: the fake driver checks that no stream work
// on it is unfinished as far as the host knows.
void host_write(void* dev, const std::vector<char>& data, bool fake, const std::string& label) {
  if (fake) check(api.host_access(dev, data.size(), 1) == 0, label + ": host write without a race");
  std::memcpy(dev, data.data(), data.size());
}
std::vector<char> host_read(const void* dev, size_t bytes, bool fake, const std::string& label) {
  if (fake) check(api.host_access(dev, bytes, 0) == 0, label + ": the host has seen the result complete");
  const char* p = static_cast<const char*>(dev);
  return std::vector<char>(p, p + bytes);
}

std::vector<char> garbage(size_t bytes) {
  std::vector<char> g(bytes);
  for (size_t i = 0; i < bytes; ++i) g[i] = static_cast<char>(0xA5 ^ (i * 29));
  return g;
}

// ---- call variants -----------------------------------------------------------------------

enum Completion { blocking, wait, test_loop, waitall_mixed, waitany_mixed, testall_mixed,
                  waitsome_mixed, request_free, kCompletions };
const char* const kCompletionNames[] = {"blocking", "MPI_Wait", "MPI_Test loop",
                                        "MPI_Waitall with p2p", "MPI_Waitany with p2p",
                                        "MPI_Testall with p2p", "MPI_Waitsome with p2p",
                                        "MPI_Request_free"};
enum StreamMode { no_stream, own_stream, legacy_stream, kStreamModes };
const char* const kStreamNames[] = {"classic", "attached stream", "attached legacy stream"};

struct Variant {
  Completion c = blocking;
  StreamMode s = no_stream;
  bool in_place = false;
  bool legacy_input = false;  // classic: the input is written on the legacy stream, unsynchronised
};
constexpr int kVariants = kCompletions * kStreamModes * 2;

Variant variant(int k, bool expect_nccl) {
  Variant v;
  v.c = static_cast<Completion>(k % kCompletions);
  v.s = static_cast<StreamMode>((k / kCompletions) % kStreamModes);
  v.in_place = (k / (kCompletions * kStreamModes)) % 2 == 1;
  if (v.c == request_free && !expect_nccl) v.c = wait;  // freeing an active MPI collective is erroneous
  // streamcoll orders its classic stream after the legacy stream; the real MPI (pmpi) does not.
  static unsigned n = 0;
  v.legacy_input = v.s == no_stream && expect_nccl && ++n % 3 == 0;
  return v;
}

std::string describe(const Variant& v) {
  std::string s = std::string(kCompletionNames[v.c]) + ", " + kStreamNames[v.s];
  if (v.in_place) s += ", in place";
  if (v.legacy_input) s += ", input on the legacy stream";
  return s;
}

streamcoll_stream_t g_stream = nullptr;  // the program's own stream (non-blocking)
bool g_defer = false;

// Point-to-point requests mixed with the collective's.
struct Ring {
  int send = 0, recv = -1, tag = 0, expect = 0;
  MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  void start(MPI_Comm comm, int t) {
    int rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    tag = t;
    send = rank * 1000 + t % 1000;
    expect = ((rank + size - 1) % size) * 1000 + t % 1000;
    MPI_Irecv(&recv, 1, MPI_INT, (rank + size - 1) % size, tag, comm, &req[0]);
    MPI_Isend(&send, 1, MPI_INT, (rank + 1) % size, tag, comm, &req[1]);
  }
};

// One collective call: its buffers and how to issue it.
struct Io {
  void* dev = nullptr;
  bool fake = true;
  std::vector<char> in;      // written before the call (empty: not written)
  std::vector<char> expect;  // compared after the call, as a prefix (empty: not read)
};

struct Spec {
  std::string label;
  std::string coll;           // statistics name of the blocking form
  MPI_Comm comm = MPI_COMM_NULL;
  Variant v;
  const char* route = "nccl";
  const char* mem = "device";
  std::vector<Io> io;
  std::function<int(MPI_Request*)> issue;  // request: null for the blocking form
};

int g_tag = 100;

void run(Spec& s) {
  const Variant& v = s.v;
  const std::string L = s.label + " [" + describe(v) + "]";
  const bool nb = v.c != blocking;
  // Routes on the NCCL communicator (nccl, and ccube's send/recv rounds): stream semantics.
  const bool nccl = std::strcmp(s.route, "nccl") == 0 || std::strcmp(s.route, "ccube") == 0;
  streamcoll_stream_t stream = v.s == own_stream ? g_stream : nullptr;

  // Only device and managed memory is ordered on the stream; host and pinned buffers keep
  // plain MPI semantics (streamext.h), so their input is written by the host.
  const bool on_gpu = std::strcmp(s.mem, "device") == 0 || std::strcmp(s.mem, "managed") == 0;
  for (Io& io : s.io) {
    if (io.in.empty()) continue;
    if (v.s != no_stream && io.fake && on_gpu)
      check(api.enqueue_copy(stream, io.dev, io.in.data(), io.in.size()) == 0, L + ": copy on the stream");
    else if (v.legacy_input && io.fake)
      check(api.enqueue_copy(nullptr, io.dev, io.in.data(), io.in.size()) == 0,
            L + ": copy on the legacy stream");
    else
      host_write(io.dev, io.in, io.fake, L);
  }
  if (v.s != no_stream)
    check(streamcoll_comm_attach_stream(s.comm, stream) == MPI_SUCCESS, L + ": attach the stream");

  const std::string name = (nb ? "i" : "") + s.coll;
  const unsigned long long route0 = stat_calls(name, s.route, s.mem);
  const unsigned long long all0 = stat_calls(name, nullptr, nullptr);
  const unsigned long long sync0 = api.sync_count();
  const unsigned long long wait0 =
      cu("cuStreamQuery") + cu("cuEventQuery") + cu("cuEventSynchronize") + sync0;

  const PendingLook pending0 = look_pending(stream);
  Ring ring;
  const bool mixed = v.c == waitall_mixed || v.c == waitany_mixed || v.c == testall_mixed ||
                     v.c == waitsome_mixed || v.c == request_free;
  // Every rank makes the same run() calls in the same order: the tag matches across ranks.
  const int tag = ++g_tag % 30000;
  if (mixed) ring.start(s.comm, tag);
  MPI_Request req = MPI_REQUEST_NULL;
  int rc = s.issue(nb ? &req : nullptr);
  check(rc == MPI_SUCCESS, L + ": returns MPI_SUCCESS");
  check(stat_calls(name, s.route, s.mem) == route0 + 1 && stat_calls(name, nullptr, nullptr) == all0 + 1,
        L + ": counted as " + name + " on route " + s.route + ", " + s.mem + " memory");
  if (nccl && v.s != no_stream) {
    check(cu("cuStreamQuery") + cu("cuEventQuery") + cu("cuEventSynchronize") + api.sync_count() == wait0,
          L + ": stream semantics: returned without the host waiting");
    if (g_defer)
      check(more_pending(pending0), L + ": stream semantics: enqueued on the stream, not yet run");
  }
  const PendingLook pending1 = look_pending(stream);

  switch (v.c) {
    case blocking: break;
    case wait: check(MPI_Wait(&req, MPI_STATUS_IGNORE) == MPI_SUCCESS, L + ": MPI_Wait"); break;
    case test_loop: {
      int flag = 0, rc = MPI_SUCCESS;
      long i = 0;
      for (; !flag && rc == MPI_SUCCESS && i < 20000000L; ++i) rc = MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
      check(rc == MPI_SUCCESS && flag == 1, L + ": MPI_Test completes");
      break;
    }
    case waitall_mixed: {
      MPI_Request all[3] = {ring.req[0], req, ring.req[1]};
      check(MPI_Waitall(3, all, MPI_STATUSES_IGNORE) == MPI_SUCCESS, L + ": MPI_Waitall");
      check(all[0] == MPI_REQUEST_NULL && all[1] == MPI_REQUEST_NULL && all[2] == MPI_REQUEST_NULL,
            L + ": MPI_Waitall frees every request");
      ring.req[0] = ring.req[1] = req = MPI_REQUEST_NULL;
      break;
    }
    case waitany_mixed: {
      MPI_Request all[3] = {ring.req[1], req, ring.req[0]};
      int seen = 0, index = 0, rc = MPI_SUCCESS;
      for (int i = 0; i < 4 && rc == MPI_SUCCESS; ++i) {
        rc = MPI_Waitany(3, all, &index, MPI_STATUS_IGNORE);
        if (index == MPI_UNDEFINED) break;
        seen |= 1 << index;
      }
      check(rc == MPI_SUCCESS && seen == 7 && index == MPI_UNDEFINED,
            L + ": MPI_Waitany completes each request once");
      ring.req[0] = ring.req[1] = req = MPI_REQUEST_NULL;
      break;
    }
    case testall_mixed: {
      MPI_Request all[3] = {req, ring.req[0], ring.req[1]};
      int flag = 0, rc = MPI_SUCCESS;
      long i = 0;
      for (; !flag && rc == MPI_SUCCESS && i < 20000000L; ++i)
        rc = MPI_Testall(3, all, &flag, MPI_STATUSES_IGNORE);
      check(rc == MPI_SUCCESS && flag == 1, L + ": MPI_Testall completes");
      ring.req[0] = ring.req[1] = req = MPI_REQUEST_NULL;
      break;
    }
    case waitsome_mixed: {
      MPI_Request all[3] = {ring.req[0], ring.req[1], req};
      int done = 0, out = 0, idx[3], rc = MPI_SUCCESS;
      for (int i = 0; i < 4 && done < 3 && rc == MPI_SUCCESS; ++i) {
        rc = MPI_Waitsome(3, all, &out, idx, MPI_STATUSES_IGNORE);
        if (out == MPI_UNDEFINED) break;
        done += out;
      }
      check(rc == MPI_SUCCESS && done == 3, L + ": MPI_Waitsome completes every request");
      ring.req[0] = ring.req[1] = req = MPI_REQUEST_NULL;
      break;
    }
    case request_free:
      // Erroneous for an MPI collective, defined by streamcoll for its own requests
      // (streamext.h): the operation still completes (classic: before the call returns).
      check(MPI_Request_free(&req) == MPI_SUCCESS && req == MPI_REQUEST_NULL, L + ": MPI_Request_free");
      break;
    default: break;
  }
  if (mixed && ring.req[0] != MPI_REQUEST_NULL) MPI_Waitall(2, ring.req, MPI_STATUSES_IGNORE);
  if (mixed) check(ring.recv == ring.expect, L + ": the point-to-point message arrived");
  if (nccl && nb && v.s != no_stream && g_defer)
    check(more_pending(pending1), L + ": stream semantics: completing the request made the stream wait, "
          "not the host");
  if (v.s != no_stream) {
    check(api.stream_sync(stream) == 0, L + ": synchronise the stream");
    check(streamcoll_comm_detach_stream(s.comm) == MPI_SUCCESS, L + ": detach the stream");
  }
  for (size_t i = 0; i < s.io.size(); ++i) {
    const Io& io = s.io[i];
    if (io.expect.empty()) continue;
    std::vector<char> got = host_read(io.dev, io.expect.size(), io.fake, L);
    size_t bad = 0;
    while (bad < got.size() && got[bad] == io.expect[bad]) ++bad;
    check(bad == got.size(), L + ": buffer " + std::to_string(i) + " correct" +
          (bad < got.size() ? " (first wrong byte " + std::to_string(bad) + " of " +
                                  std::to_string(got.size()) + ")"
                            : std::string()));
  }
  if (!nccl && std::strcmp(s.route, "self") != 0 && v.s != no_stream && on_gpu)
    check(api.sync_count() > sync0, L + ": pmpi with a stream synchronised the stream first");
}

// ---- datatypes and reference values ----------------------------------------------------

// Every datatype the route reduces (and so also moves); MPI_UNSIGNED_LONG_LONG beyond the
// brief's list.
std::vector<TypeCase> nccl_types() {
  return {{"MPI_INT8_T", MPI_INT8_T, Tag::i8},           {"MPI_UINT8_T", MPI_UINT8_T, Tag::u8},
          {"MPI_SIGNED_CHAR", MPI_SIGNED_CHAR, Tag::sc},   {"MPI_UNSIGNED_CHAR", MPI_UNSIGNED_CHAR, Tag::uc},
          {"MPI_INT", MPI_INT, Tag::int_},                 {"MPI_UNSIGNED", MPI_UNSIGNED, Tag::uns},
          {"MPI_LONG", MPI_LONG, Tag::lng},                {"MPI_UNSIGNED_LONG", MPI_UNSIGNED_LONG, Tag::ulng},
          {"MPI_LONG_LONG", MPI_LONG_LONG, Tag::ll},       {"MPI_UNSIGNED_LONG_LONG", MPI_UNSIGNED_LONG_LONG, Tag::ull},
          {"MPI_INT64_T", MPI_INT64_T, Tag::i64},          {"MPI_UINT64_T", MPI_UINT64_T, Tag::u64},
          {"MPI_FLOAT", MPI_FLOAT, Tag::flt},              {"MPI_DOUBLE", MPI_DOUBLE, Tag::dbl},
          {"MPI_INT32_T", MPI_INT32_T, Tag::i32},          {"MPI_UINT32_T", MPI_UINT32_T, Tag::u32}};
}

const OpCase kOps[] = {{"MPI_SUM", MPI_SUM, Op::sum}, {"MPI_PROD", MPI_PROD, Op::prod},
                       {"MPI_MIN", MPI_MIN, Op::min}, {"MPI_MAX", MPI_MAX, Op::max}};

// The mode (main): whether NCCL can be set up at all.
std::string g_mode;

// This rank's GPU as the fake driver numbers it from FAKE_CUDA_BUS_ID (fake_cuda.cpp).
int gpu_group() {
  const char* b = std::getenv("FAKE_CUDA_BUS_ID");
  const char* lr = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  if (!lr) lr = std::getenv("MPI_LOCALRANKID");
  const int local = lr ? std::atoi(lr) : 0;
  if (!b || !*b || std::strcmp(b, "same") == 0) return 0;
  if (std::strcmp(b, "per-rank") == 0) return local;
  if (std::strncmp(b, "mod:", 4) == 0) return std::atoi(b + 4) > 0 ? local % std::atoi(b + 4) : 0;
  return 0;  // a literal bus id: the same everywhere
}

// The route streamcoll must pick for supported calls on device buffers of `comm`: nccl
// unless two ranks share a GPU (the same fake bus id on the same host; on several nodes,
// scripts/cluster.sh, the hosts differ by name).
const char* route_for(MPI_Comm comm) {
  const int p = comm_size(comm);
  // A communicator of one rank takes route self (algorithms/self.cpp) unless the run
  // routes it as any other.
  const char* one = getenv("STREAMCOLL_ONE_RANK_SELF");
  if (p == 1 && !(one && std::strcmp(one, "0") == 0)) return "self";
  if (g_mode == "fail-init" || g_mode == "absent") return "pmpi";
  struct Gpu {
    char host[MPI_MAX_PROCESSOR_NAME];
    int group;
  } mine{};
  int len = 0;
  MPI_Get_processor_name(mine.host, &len);
  mine.group = gpu_group();
  std::vector<Gpu> all(static_cast<size_t>(p));
  MPI_Allgather(&mine, sizeof(Gpu), MPI_BYTE, all.data(), sizeof(Gpu), MPI_BYTE, comm);
  for (int i = 0; i < p; ++i)
    for (int j = i + 1; j < p; ++j)
      if (all[i].group == all[j].group && std::strcmp(all[i].host, all[j].host) == 0)
        return "pmpi";  // ranks share a GPU
  return "nccl";
}

std::string what(const char* coll, const char* type, const char* op, size_t count, int root = -1) {
  std::string s = std::string(coll) + " " + type + (op ? std::string(" ") + op : std::string()) +
                  " count " + std::to_string(count);
  if (root >= 0) s += " root " + std::to_string(root);
  return s;
}

// ---- the collectives ----------------------------------------------------------------------

struct Ctx {
  MPI_Comm comm;
  const char* route;  // expected for supported calls
  Mem mem = Mem::device;
  const char* mem_name = "device";
};

template <class T>
void allreduce(const Ctx& c, const TypeCase& t, const OpCase& op, size_t count, const Variant& v,
               unsigned salt) {
  const int me = comm_rank(c.comm), p = comm_size(c.comm);
  const size_t bytes = count * sizeof(T);
  auto in = bytes_of(inputs<T>(me, count, op.kind, salt));
  auto ref = bytes_of(reduced<T>(p, count, op.kind, salt));
  Buf send(v.in_place ? 0 : bytes, c.mem), recv(bytes, c.mem);
  host_write(recv.get(), garbage(bytes), recv.fake(), "prefill");
  Spec s;
  s.label = what("MPI_Allreduce", t.name, op.name, count);
  s.coll = "allreduce";
  s.comm = c.comm;
  s.v = v;
  s.route = c.route;
  s.mem = c.mem_name;
  if (v.in_place) {
    s.io = {{recv.get(), recv.fake(), in, ref}};
  } else {
    s.io = {{send.get(), send.fake(), in, in}, {recv.get(), recv.fake(), {}, ref}};
  }
  const void* sb = v.in_place ? MPI_IN_PLACE : send.get();
  void* rb = recv.get();
  s.issue = [&](MPI_Request* r) {
    return r ? MPI_Iallreduce(sb, rb, static_cast<int>(count), t.type, op.op, c.comm, r)
             : MPI_Allreduce(sb, rb, static_cast<int>(count), t.type, op.op, c.comm);
  };
  run(s);
}

// Whether an in-place MPI_Reduce at `root` reaches the MPI as it is (route pmpi with the
// MPI taken as CUDA-aware: no staging) where the MPI crashes on it
// (mpi_in_place_reduce_off_root0_crashes): such roots make the call not in place (each
// says so once). Asked by the root only.
bool mpi_crashes_on_in_place_reduce(const Ctx& c, int root) {
  static const char* aware = std::getenv("STREAMCOLL_MPI_CUDA_AWARE");
  const bool crashes = root != 0 && std::strcmp(c.route, "pmpi") == 0 && aware &&
                       std::strcmp(aware, "yes") == 0 && mpi_in_place_reduce_off_root0_crashes();
  static bool said = false;
  if (crashes && !said) {
    said = true;
    std::fprintf(stderr, "nccl_route: note: no in-place MPI_Reduce at roots other than 0 handed to "
                         "the MPI unstaged (MPICH 4.0/4.1 crash on it: pmodels/mpich#6540)\n");
  }
  return crashes;
}

template <class T>
void reduce(const Ctx& c, const TypeCase& t, const OpCase& op, size_t count, int root,
            const Variant& v, unsigned salt) {
  const int me = comm_rank(c.comm), p = comm_size(c.comm);
  const size_t bytes = count * sizeof(T);
  const bool is_root = me == root;
  const bool in_place = v.in_place && is_root && !mpi_crashes_on_in_place_reduce(c, root);
  // Non-roots: recvbuf is insignificant; half of the calls pass NULL, the others a buffer
  // that must stay untouched.
  const bool null_recv = !is_root && (salt % 2 == 0);
  auto in = bytes_of(inputs<T>(me, count, op.kind, salt));
  auto ref = bytes_of(reduced<T>(p, count, op.kind, salt));
  Buf send(in_place ? 0 : bytes, c.mem), recv(null_recv ? 0 : bytes, c.mem);
  const auto g = garbage(bytes);
  if (recv.get()) host_write(recv.get(), g, recv.fake(), "prefill");
  Spec s;
  s.label = what("MPI_Reduce", t.name, op.name, count, root);
  s.coll = "reduce";
  s.comm = c.comm;
  s.v = v;
  s.route = c.route;
  s.mem = c.mem_name;
  if (in_place) {
    s.io = {{recv.get(), recv.fake(), in, ref}};
  } else {
    s.io = {{send.get(), send.fake(), in, in}};
    if (recv.get()) s.io.push_back({recv.get(), recv.fake(), {}, is_root ? ref : g});
  }
  const void* sb = in_place ? MPI_IN_PLACE : send.get();
  void* rb = recv.get();
  s.issue = [&](MPI_Request* r) {
    return r ? MPI_Ireduce(sb, rb, static_cast<int>(count), t.type, op.op, root, c.comm, r)
             : MPI_Reduce(sb, rb, static_cast<int>(count), t.type, op.op, root, c.comm);
  };
  run(s);
}

template <class T>
void reduce_scatter_block(const Ctx& c, const TypeCase& t, const OpCase& op, size_t count,
                          const Variant& v, unsigned salt) {
  const int me = comm_rank(c.comm), p = comm_size(c.comm);
  const size_t total = count * static_cast<size_t>(p);
  auto in = bytes_of(inputs<T>(me, total, op.kind, salt));
  auto all = reduced<T>(p, total, op.kind, salt);
  std::vector<T> mine(all.begin() + static_cast<long>(me * count), all.begin() + static_cast<long>((me + 1) * count));
  auto ref = bytes_of(mine);
  Buf send(v.in_place ? 0 : total * sizeof(T), c.mem), recv((v.in_place ? total : count) * sizeof(T), c.mem);
  host_write(recv.get(), garbage(recv.size()), recv.fake(), "prefill");
  Spec s;
  s.label = what("MPI_Reduce_scatter_block", t.name, op.name, count);
  s.coll = "reduce_scatter_block";
  s.comm = c.comm;
  s.v = v;
  s.route = c.route;
  s.mem = c.mem_name;
  if (v.in_place) {
    s.io = {{recv.get(), recv.fake(), in, ref}};  // the result is the first block
  } else {
    s.io = {{send.get(), send.fake(), in, in}, {recv.get(), recv.fake(), {}, ref}};
  }
  const void* sb = v.in_place ? MPI_IN_PLACE : send.get();
  void* rb = recv.get();
  s.issue = [&](MPI_Request* r) {
    return r ? MPI_Ireduce_scatter_block(sb, rb, static_cast<int>(count), t.type, op.op, c.comm, r)
             : MPI_Reduce_scatter_block(sb, rb, static_cast<int>(count), t.type, op.op, c.comm);
  };
  run(s);
}

void bcast(const Ctx& c, const char* tname, MPI_Datatype type, size_t count, int root,
           const Variant& v, unsigned salt) {
  const int me = comm_rank(c.comm);
  const size_t bytes = count * static_cast<size_t>(type_size(type));
  auto data = pattern(root, 0, bytes, salt);
  Buf buf(bytes, c.mem);
  host_write(buf.get(), garbage(bytes), buf.fake(), "prefill");
  Spec s;
  s.label = what("MPI_Bcast", tname, nullptr, count, root);
  s.coll = "bcast";
  s.comm = c.comm;
  s.v = v;
  s.v.in_place = false;
  s.route = c.route;
  s.mem = c.mem_name;
  s.io = {{buf.get(), buf.fake(), me == root ? data : std::vector<char>(), data}};
  void* b = buf.get();
  s.issue = [&](MPI_Request* r) {
    return r ? MPI_Ibcast(b, static_cast<int>(count), type, root, c.comm, r)
             : MPI_Bcast(b, static_cast<int>(count), type, root, c.comm);
  };
  run(s);
}

void allgather(const Ctx& c, const char* tname, MPI_Datatype type, size_t count, const Variant& v,
               unsigned salt) {
  const int me = comm_rank(c.comm), p = comm_size(c.comm);
  const size_t block = count * static_cast<size_t>(type_size(type));
  auto mine = pattern(me, 0, block, salt);
  std::vector<char> all;
  for (int r = 0; r < p; ++r) {
    auto b = pattern(r, 0, block, salt);
    all.insert(all.end(), b.begin(), b.end());
  }
  Buf send(v.in_place ? 0 : block, c.mem), recv(block * p, c.mem);
  host_write(recv.get(), garbage(recv.size()), recv.fake(), "prefill");
  Spec s;
  s.label = what("MPI_Allgather", tname, nullptr, count);
  s.coll = "allgather";
  s.comm = c.comm;
  s.v = v;
  s.route = c.route;
  s.mem = c.mem_name;
  if (v.in_place) {
    auto in = garbage(recv.size());  // the rank's own block in place, the rest anything
    std::memcpy(in.data() + me * block, mine.data(), block);
    s.io = {{recv.get(), recv.fake(), in, all}};
  } else {
    s.io = {{send.get(), send.fake(), mine, mine}, {recv.get(), recv.fake(), {}, all}};
  }
  const void* sb = v.in_place ? MPI_IN_PLACE : send.get();
  void* rb = recv.get();
  const int n = static_cast<int>(count);
  s.issue = [&](MPI_Request* r) {
    return r ? MPI_Iallgather(sb, n, type, rb, n, type, c.comm, r)
             : MPI_Allgather(sb, n, type, rb, n, type, c.comm);
  };
  run(s);
}

void alltoall(const Ctx& c, const char* tname, MPI_Datatype type, size_t count, const Variant& v,
              unsigned salt) {
  const int me = comm_rank(c.comm), p = comm_size(c.comm);
  const size_t block = count * static_cast<size_t>(type_size(type));
  // Rank r sends block j of pattern(r) to rank j.
  auto out = pattern(me, 0, block * p, salt);
  std::vector<char> in;
  for (int r = 0; r < p; ++r) {
    auto b = pattern(r, me * block, block, salt);
    in.insert(in.end(), b.begin(), b.end());
  }
  Buf send(v.in_place ? 0 : block * p, c.mem), recv(block * p, c.mem);
  host_write(recv.get(), garbage(recv.size()), recv.fake(), "prefill");
  Spec s;
  s.label = what("MPI_Alltoall", tname, nullptr, count);
  s.coll = "alltoall";
  s.comm = c.comm;
  s.v = v;
  s.route = c.route;
  s.mem = c.mem_name;
  if (v.in_place)
    s.io = {{recv.get(), recv.fake(), out, in}};
  else
    s.io = {{send.get(), send.fake(), out, out}, {recv.get(), recv.fake(), {}, in}};
  const void* sb = v.in_place ? MPI_IN_PLACE : send.get();
  void* rb = recv.get();
  const int n = static_cast<int>(count);
  s.issue = [&](MPI_Request* r) {
    return r ? MPI_Ialltoall(sb, n, type, rb, n, type, c.comm, r)
             : MPI_Alltoall(sb, n, type, rb, n, type, c.comm);
  };
  run(s);
}

// ---- test groups ----------------------------------------------------------------------------

const size_t kCounts[] = {1, 7, 1000, 100000};

// Every reducible type x op x count on allreduce, reduce (rotating root) and
// reduce_scatter_block: one plain blocking call, and rotating variants (completion x
// stream x in place; two each, one for count 100000).
void reductions_grid(const Ctx& c, bool nccl, bool full) {
  const int p = comm_size(c.comm);
  unsigned k = 0;
  const auto types = nccl_types();
  for (size_t ti = 0; ti < types.size(); ++ti) {
    const TypeCase& t = types[ti];
    if (!full && ti % 3 != 0) continue;
    for (const OpCase& op : kOps)
      for (size_t count : kCounts) {
        if (!full && count == 100000) continue;
        with_type(t.tag, [&](auto z) {
          using T = decltype(z);
          ++k;
          std::vector<Variant> vs = {Variant{}, variant(static_cast<int>(k * 7), nccl)};
          if (count < 100000) vs.push_back(variant(static_cast<int>(k * 7 + kVariants / 2), nccl));
          unsigned salt = k * 3;
          for (const Variant& v : vs) {
            ++salt;
            allreduce<T>(c, t, op, count, v, salt);
            reduce<T>(c, t, op, count, static_cast<int>(salt % p), v, salt);
            reduce_scatter_block<T>(c, t, op, count, v, salt);
          }
        });
      }
  }
}

// Route ccube (C-Cube's tree as NCCL send/recv rounds and the reduction kernel), forced
// on a duplicate: MPI_Allreduce on every type and op the route takes, chunks of the
// default size (one chunk here), 1 KiB, 24 bytes (not a multiple of 16 or of most
// counts' bytes: the last chunk is short) and 64 KiB (a 100000-element vector in several
// chunks), every completion and stream mode in turn; calls it does not take go on.
void ccube_grid(bool nccl) {
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  const int p = comm_size(comm);
  const Ctx c{comm, nccl ? "ccube" : "pmpi"};
  const unsigned long long allreduces0 = nc("ncclAllReduce"), sends0 = nc("ncclSend"),
                           kernels0 = cu("host_kernels");
  unsigned k = 0;
  struct Chunking {
    const char* spec;
    std::vector<size_t> counts;
  };
  const Chunking chunkings[] = {{"allreduce:ccube", {1, 7, 1000}},
                                {"allreduce:ccube:chunk=1K", {1, 7, 1000, 4099}},
                                {"allreduce:ccube:chunk=24", {7, 1000}},
                                {"allreduce:ccube:chunk=64K", {100000}}};
  const auto types = nccl_types();
  for (const Chunking& ch : chunkings) {
    check(api.set_route(comm, ch.spec) == MPI_SUCCESS, std::string("set_route ") + ch.spec);
    // A blocking call first: it sets the route up (MPI_I* calls before it go to pmpi).
    allreduce<int>(c, {"MPI_INT", MPI_INT, Tag::int_}, kOps[0], 10, Variant{}, ++k);
    for (size_t ti = 0; ti < types.size(); ++ti) {
      const TypeCase& t = types[ti];
      for (const OpCase& op : kOps)
        for (size_t count : ch.counts) {
          if (count == 100000 && ti % 4 != 0) continue;  // a few types suffice for the length
          with_type(t.tag, [&](auto z) {
            using T = decltype(z);
            ++k;
            allreduce<T>(c, t, op, count, variant(static_cast<int>(k * 7), nccl), k);
          });
        }
    }
  }
  if (nccl) {
    check(nc("ncclAllReduce") == allreduces0, "ccube: no ncclAllReduce (the tree is send/recv)");
    if (p > 1) check(nc("ncclSend") > sends0, "ccube: NCCL sends ran");
    // The root reduces its children's chunks; leaves only send and receive.
    if (p > 1 && g_rank == 0) check(cu("host_kernels") > kernels0, "ccube: the reduction kernel ran");
  }
  // Not ccube's: another type (MPI_SHORT: no kernel type, nor NCCL's), another
  // collective (bcast: the default table's route).
  allreduce<short>({comm, "pmpi"}, {"MPI_SHORT", MPI_SHORT, Tag::shrt}, kOps[0], 100, Variant{}, 5);
  bcast({comm, nccl ? "nccl" : "pmpi"}, "MPI_FLOAT", MPI_FLOAT, 100, 0, Variant{}, 6);
  MPI_Comm_free(&comm);
}

// Route ccube's kernel failing to load on one rank (FAKE_CUDA_FAIL=cuModuleLoadData:1 on
// local rank FAKE_CUDA_FAIL_RANK): the route's first call fails on every rank, none
// hangs; the calls after it are right on every rank, on another route (that rank takes
// ccube out, and the aborted NCCL communicator takes nccl out).
int error_class(int rc);

void ccube_load_fails() {
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  check(api.set_route(comm, "allreduce:ccube") == MPI_SUCCESS, "set_route allreduce:ccube");
  const size_t n = 1000;
  const unsigned long long loads0 = cu("cuModuleLoadData");
  for (int call = 0; call < 4; ++call) {
    auto in = bytes_of(inputs<int>(g_rank, n, Op::sum, 40 + call));
    auto ref = bytes_of(reduced<int>(g_size, n, Op::sum, 40 + call));
    Buf send(n * sizeof(int)), recv(n * sizeof(int));
    host_write(send.get(), in, true, "input");
    host_write(recv.get(), garbage(recv.size()), true, "prefill");
    const unsigned long long ccube0 = stat_calls("allreduce", "ccube", "device");
    const int rc = MPI_Allreduce(send.get(), recv.get(), static_cast<int>(n), MPI_INT, MPI_SUM, comm);
    const std::string L = "kernel load failure, call " + std::to_string(call);
    if (call == 0) {
      check(rc != MPI_SUCCESS && error_class(rc) == MPI_ERR_OTHER,
            L + ": the first ccube call fails on every rank (MPI_ERR_OTHER)");
      check(stat_calls("allreduce", "ccube", "device") == ccube0 + 1, L + ": it was ccube's");
    } else {
      check(rc == MPI_SUCCESS, L + ": succeeds");
      check(host_read(recv.get(), recv.size(), true, L) == ref, L + ": right");
      check(stat_calls("allreduce", "ccube", "device") == ccube0, L + ": not on ccube");
    }
  }
  if (g_size > 1) {
    const char* fr = std::getenv("FAKE_CUDA_FAIL_RANK");
    if (fr && gpu_group() == std::atoi(fr))
      check(cu("cuModuleLoadData") == loads0 + 1 && cu("injected_failures") >= 1,
            "the kernel's load was tried once here, and failed");
  }
  MPI_Comm_free(&comm);
}

// Bcast, allgather, alltoall on every type (they move bytes), and a few more types the
// route moves but does not reduce.
void movers_grid(const Ctx& c, bool nccl, bool full) {
  const int p = comm_size(c.comm);
  struct Mover {
    const char* name;
    MPI_Datatype type;
  };
  std::vector<Mover> types;
  for (const TypeCase& t : nccl_types()) types.push_back({t.name, t.type});
  types.push_back({"MPI_SHORT", MPI_SHORT});
  types.push_back({"MPI_BYTE", MPI_BYTE});
  types.push_back({"MPI_CHAR", MPI_CHAR});
  types.push_back({"MPI_C_DOUBLE_COMPLEX", MPI_C_DOUBLE_COMPLEX});
  unsigned k = 0;
  for (size_t ti = 0; ti < types.size(); ++ti) {
    if (!full && ti % 3 != 0) continue;
    for (size_t count : kCounts) {
      if (!full && count == 100000) continue;
      ++k;
      std::vector<Variant> vs = {Variant{}, variant(static_cast<int>(k * 11 + 3), nccl)};
      if (count < 100000) vs.push_back(variant(static_cast<int>(k * 11 + 3 + kVariants / 2), nccl));
      unsigned salt = k * 3;
      for (const Variant& v : vs) {
        ++salt;
        bcast(c, types[ti].name, types[ti].type, count, static_cast<int>(salt % p), v, salt);
        allgather(c, types[ti].name, types[ti].type, count, v, salt);
        alltoall(c, types[ti].name, types[ti].type, count, v, salt);
      }
    }
  }
}

// Every variant (completion x stream x in place) of all six collectives on one type, and
// every root of reduce and bcast.
void variant_matrix(const Ctx& c, bool nccl, size_t count) {
  const int p = comm_size(c.comm);
  const TypeCase t{"MPI_INT", MPI_INT, Tag::int_};
  const OpCase& sum = kOps[0];
  for (int k = 0; k < kVariants; ++k) {
    const Variant v = variant(k, nccl);
    const unsigned salt = static_cast<unsigned>(k + 1000);
    allreduce<int>(c, t, sum, count, v, salt);
    reduce<int>(c, t, kOps[k % 4], count, k % p, v, salt);
    reduce_scatter_block<int>(c, t, kOps[k % 4], count, v, salt);
    if (!v.in_place) bcast(c, "MPI_INT", MPI_INT, count, k % p, v, salt);
    allgather(c, "MPI_INT", MPI_INT, count, v, salt);
    alltoall(c, "MPI_INT", MPI_INT, count, v, salt);
  }
  for (int root = 0; root < p; ++root)
    for (int k : {0, 9, 18, 29, 40}) {
      const Variant v = variant(k, nccl);
      reduce<double>(c, {"MPI_DOUBLE", MPI_DOUBLE, Tag::dbl}, kOps[root % 4], count, root, v,
                     static_cast<unsigned>(root + k));
      bcast(c, "MPI_DOUBLE", MPI_DOUBLE, count, root, v, static_cast<unsigned>(root + k));
    }
}

// Calls the route does not take go to pmpi, on any communicator, and are still right (the
// real MPI reads fake device memory directly: it is host memory). With a stream attached,
// streamcoll synchronises it first.
void unsupported(const Ctx& c) {
  const int me = comm_rank(c.comm), p = comm_size(c.comm);
  const Variant variants[] = {{blocking, no_stream, false, false}, {wait, own_stream, false, false},
                              {blocking, own_stream, false, false}, {test_loop, legacy_stream, false, false},
                              {waitall_mixed, no_stream, false, false}};
  unsigned salt = 0;
  for (const Variant& v : variants) {
    ++salt;
    Ctx pm = c;
    pm.route = "pmpi";
    // A 16-bit integer: NCCL has no such type.
    allreduce<short>(pm, {"MPI_SHORT", MPI_SHORT, Tag::shrt}, kOps[0], 1000, v, salt);
    reduce<unsigned short>(pm, {"MPI_UNSIGNED_SHORT", MPI_UNSIGNED_SHORT, Tag::ushrt}, kOps[3], 77,
                           p - 1, v, salt);
    // An op NCCL lacks.
    allreduce<int>(pm, {"MPI_INT", MPI_INT, Tag::int_}, {"MPI_BAND", MPI_BAND, Op::band}, 500, v, salt);
    // A pair type: not a contiguous basic type.
    bcast(pm, "MPI_2INT", MPI_2INT, 33, 0, v, salt);

    // Collectives NCCL does not carry: allgatherv, reduce_scatter.
    {
      std::vector<int> counts(p), displs(p);
      int total = 0;
      for (int r = 0; r < p; ++r) {
        counts[r] = (r * 37 + static_cast<int>(salt)) % 50 + 1;
        displs[r] = total;
        total += counts[r];
      }
      std::vector<int> mine(counts[me]), all(total);
      for (int r = 0; r < p; ++r)
        for (int i = 0; i < counts[r]; ++i) all[displs[r] + i] = r * 100000 + i + static_cast<int>(salt);
      for (int i = 0; i < counts[me]; ++i) mine[i] = all[displs[me] + i];
      Buf send(counts[me] * sizeof(int)), recv(total * sizeof(int));
      host_write(recv.get(), garbage(recv.size()), true, "prefill");
      Spec s;
      s.label = "MPI_Allgatherv MPI_INT";
      s.coll = "allgatherv";
      s.comm = c.comm;
      s.v = v;
      s.route = "pmpi";
      s.io = {{send.get(), true, bytes_of(mine), bytes_of(mine)}, {recv.get(), true, {}, bytes_of(all)}};
      s.issue = [&](MPI_Request* r) {
        return r ? MPI_Iallgatherv(send.get(), counts[me], MPI_INT, recv.get(), counts.data(),
                                   displs.data(), MPI_INT, c.comm, r)
                 : MPI_Allgatherv(send.get(), counts[me], MPI_INT, recv.get(), counts.data(),
                                  displs.data(), MPI_INT, c.comm);
      };
      run(s);
    }
    {
      std::vector<int> counts(p);
      int total = 0;
      for (int r = 0; r < p; ++r) total += counts[r] = (r * 13 + static_cast<int>(salt)) % 20 + 1;
      auto in = inputs<int>(me, total, Op::sum, salt);
      auto all = reduced<int>(p, total, Op::sum, salt);
      int off = 0;
      for (int r = 0; r < me; ++r) off += counts[r];
      std::vector<int> ref(all.begin() + off, all.begin() + off + counts[me]);
      Buf send(total * sizeof(int)), recv(counts[me] * sizeof(int));
      host_write(recv.get(), garbage(recv.size()), true, "prefill");
      Spec s;
      s.label = "MPI_Reduce_scatter MPI_INT MPI_SUM";
      s.coll = "reduce_scatter";
      s.comm = c.comm;
      s.v = v;
      s.route = "pmpi";
      s.io = {{send.get(), true, bytes_of(in), bytes_of(in)}, {recv.get(), true, {}, bytes_of(ref)}};
      s.issue = [&](MPI_Request* r) {
        return r ? MPI_Ireduce_scatter(send.get(), recv.get(), counts.data(), MPI_INT, MPI_SUM, c.comm, r)
                 : MPI_Reduce_scatter(send.get(), recv.get(), counts.data(), MPI_INT, MPI_SUM, c.comm);
      };
      run(s);
    }
  }
}

// Host, pinned and managed buffers go to pmpi by the default table. On a duplicate of
// `comm`: there the first call of each signature agrees at once (on `comm`, a signature
// last called stream-ordered on device memory would decide from those facts for a few
// calls, its host-memory calls staged through NCCL: shim/dispatch_agree.cpp, cacheable).
void other_memory(MPI_Comm parent) {
  MPI_Comm comm;
  MPI_Comm_dup(parent, &comm);
  const TypeCase t{"MPI_DOUBLE", MPI_DOUBLE, Tag::dbl};
  const Variant plain{}, nb{wait, no_stream, false, false}, st{blocking, own_stream, false, false};
  for (const Variant& v : {plain, nb, st}) {
    allreduce<double>({comm, "pmpi", Mem::host, "host"}, t, kOps[0], 1000, v, 3);
    allreduce<double>({comm, "pmpi", Mem::managed, "managed"}, t, kOps[2], 1000, v, 4);
    allreduce<double>({comm, "pmpi", Mem::pinned, "pinned"}, t, kOps[3], 1000, v, 6);
    allgather({comm, "pmpi", Mem::managed, "managed"}, "MPI_INT", MPI_INT, 100, v, 5);
  }
  MPI_Comm_free(&comm);
}

// Set-up happens at the first blocking call on a communicator: non-blocking calls before
// it go to pmpi (starting one must stay local), later ones to NCCL.
void setup_order() {
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  const bool nccl = std::strcmp(route_for(comm), "nccl") == 0;
  const TypeCase t{"MPI_FLOAT", MPI_FLOAT, Tag::flt};
  const Variant nbw{wait, no_stream, false, false};
  const unsigned long long inits0 = nc("ncclCommInitRank");
  allreduce<float>({comm, "pmpi"}, t, kOps[0], 100, nbw, 1);
  bcast({comm, "pmpi"}, "MPI_FLOAT", MPI_FLOAT, 100, 0, nbw, 2);
  check(nc("ncclCommInitRank") == inits0, "set-up: no NCCL communicator before a blocking call");
  const unsigned long long streams0 = cu("live_streams"), refs0 = cu("ctx_refs");
  allreduce<float>({comm, nccl ? "nccl" : "pmpi"}, t, kOps[0], 100, Variant{}, 3);
  if (g_mode == "shared" && !nccl)
    check(nc("ncclGetUniqueId") + nc("ncclCommInitRank") == 0,
          "ranks sharing a GPU: no NCCL communicator is even started");
  if (nccl) {
    check(nc("ncclCommInitRank") == inits0 + 1, "set-up: one ncclCommInitRank at the first blocking call");
    check(cu("live_streams") == streams0 + 2, "set-up: two streams of streamcoll's for the communicator");
    check(cu("ctx_refs") == refs0 + 1, "set-up: the primary context retained once");
  }
  allreduce<float>({comm, nccl ? "nccl" : "pmpi"}, t, kOps[0], 100, nbw, 4);
  bcast({comm, nccl ? "nccl" : "pmpi"}, "MPI_FLOAT", MPI_FLOAT, 100, 0, nbw, 5);
  const unsigned long long destroys0 = nc("ncclCommDestroy");
  MPI_Comm_free(&comm);
  // The NCCL communicator waits, idle, for a communicator over the same ranks (with its
  // streams and context); a duplicate made now reuses it, and its own goes.
  if (nccl)
    check(nc("ncclCommDestroy") == destroys0, "MPI_Comm_free keeps the NCCL communicator for reuse");
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  allreduce<float>({comm, nccl ? "nccl" : "pmpi"}, t, kOps[0], 100, Variant{}, 6);
  if (nccl)
    check(nc("ncclCommInitRank") == inits0 + 1, "a new duplicate reuses the idle NCCL communicator");
  MPI_Comm_free(&comm);
  check(eventually([&] {
          return cu("live_streams") == streams0 + (nccl ? 2 : 0) &&
                 cu("ctx_refs") == refs0 + (nccl ? 1 : 0);
        }),
        "MPI_Comm_free releases what the communicator used beyond the idle NCCL communicator's");

  // A communicator whose context exists (a blocking call the route declined: MPI_SHORT)
  // but whose NCCL state does not: a non-blocking call still goes to pmpi.
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  allreduce<short>({comm, "pmpi"}, {"MPI_SHORT", MPI_SHORT, Tag::shrt}, kOps[0], 100, Variant{}, 6);
  allreduce<float>({comm, "pmpi"}, t, kOps[0], 100, nbw, 7);
  allreduce<float>({comm, nccl ? "nccl" : "pmpi"}, t, kOps[0], 100, Variant{}, 8);
  allreduce<float>({comm, nccl ? "nccl" : "pmpi"}, t, kOps[0], 100, nbw, 9);
  MPI_Comm_free(&comm);
}

// MPI_COMM_WORLD itself, a split communicator (NCCL communicators of several sizes at
// once), each with its own route.
void communicators() {
  const TypeCase t{"MPI_INT64_T", MPI_INT64_T, Tag::i64};
  MPI_Comm split;
  MPI_Comm_split(MPI_COMM_WORLD, g_rank % 2, g_rank, &split);
  const char* world_route = route_for(MPI_COMM_WORLD);
  const char* split_route = route_for(split);
  allreduce<int64_t>({MPI_COMM_WORLD, world_route}, t, kOps[0], 1000, Variant{}, 1);
  for (int k = 0; k < 6; ++k) {
    const Variant v = variant(k * 5, std::strcmp(split_route, "nccl") == 0);
    allreduce<int64_t>({split, split_route}, t, kOps[k % 4], 999, v, static_cast<unsigned>(k));
    allreduce<int64_t>({MPI_COMM_WORLD, world_route}, t, kOps[k % 4], 999,
                       variant(k * 7, std::strcmp(world_route, "nccl") == 0), static_cast<unsigned>(k));
  }
  MPI_Comm_free(&split);

  // MPI_Comm_dup copies the attached stream: calls on the duplicate are stream-ordered
  // on it without attaching again.
  MPI_Comm base, dup;
  MPI_Comm_dup(MPI_COMM_WORLD, &base);
  check(streamcoll_comm_attach_stream(base, g_stream) == MPI_SUCCESS, "attach to the original");
  MPI_Comm_dup(base, &dup);
  {
    const char* route = route_for(dup);
    const bool nccl = std::strcmp(route, "nccl") == 0;
    const size_t n = 1000;
    auto in = bytes_of(inputs<int64_t>(g_rank, n, Op::sum, 77));
    auto ref = bytes_of(reduced<int64_t>(g_size, n, Op::sum, 77));
    Buf send(n * 8), recv(n * 8);
    host_write(recv.get(), garbage(recv.size()), true, "prefill");
    check(api.enqueue_copy(g_stream, send.get(), in.data(), in.size()) == 0, "copy on the stream");
    const unsigned long long sync0 = api.sync_count();
    const PendingLook pending0 = look_pending(g_stream);
    check(MPI_Allreduce(send.get(), recv.get(), static_cast<int>(n), MPI_INT64_T, MPI_SUM, dup) == MPI_SUCCESS,
          "MPI_Allreduce on the duplicate");
    if (nccl && g_defer) check(more_pending(pending0), "the duplicate's call went on the stream");
    if (!nccl) check(api.sync_count() > sync0, "the duplicate's pmpi call synchronised the stream");
    check(api.stream_sync(g_stream) == 0, "synchronise");
    check(host_read(recv.get(), recv.size(), true, "dup") == ref, "MPI_Allreduce on the duplicate: result");
  }
  MPI_Comm_free(&dup);
  streamcoll_comm_detach_stream(base);

  // MPI_Comm_free while a non-blocking call is in flight: the request keeps what it needs.
  // (Only on the NCCL route: Open MPI 4.1's own non-blocking collectives crash in
  // MPI_Wait after MPI_Comm_free.)
  if (std::strcmp(route_for(base), "nccl") != 0) {
    MPI_Comm_free(&base);
  } else {
    const char* route = "nccl";
    allreduce<int64_t>({base, route}, t, kOps[0], 10, Variant{}, 78);  // set up
    const size_t n = 1000;
    auto in = bytes_of(inputs<int64_t>(g_rank, n, Op::max, 79));
    auto ref = bytes_of(reduced<int64_t>(g_size, n, Op::max, 79));
    Buf send(n * 8), recv(n * 8);
    host_write(send.get(), in, true, "input");
    host_write(recv.get(), garbage(recv.size()), true, "prefill");
    MPI_Request req;
    check(MPI_Iallreduce(send.get(), recv.get(), static_cast<int>(n), MPI_INT64_T, MPI_MAX, base, &req) == MPI_SUCCESS,
          "MPI_Iallreduce, then MPI_Comm_free");
    MPI_Comm_free(&base);
    check(MPI_Wait(&req, MPI_STATUS_IGNORE) == MPI_SUCCESS, "MPI_Wait after MPI_Comm_free");
    check(host_read(recv.get(), recv.size(), true, "after free") == ref, "MPI_Wait after MPI_Comm_free: result");
  }

  // No data: not a call for any route (eligibility), even on device buffers.
  {
    Buf a(64), b(64);
    const unsigned long long before = stat_calls("allreduce", "pmpi", nullptr);
    check(MPI_Allreduce(a.get(), b.get(), 0, MPI_INT, MPI_SUM, MPI_COMM_WORLD) == MPI_SUCCESS,
          "MPI_Allreduce of 0 elements");
    check(stat_calls("allreduce", "pmpi", nullptr) == before + 1, "0 elements: pmpi");
  }
}

// ---- error paths (mode async-error) --------------------------------------------------------

int error_class(int rc) {
  int cls = rc;
  MPI_Error_class(rc, &cls);
  return cls;
}

void async_error() {
  const char* after = std::getenv("FAKE_NCCL_ASYNC_ERROR_AFTER");
  check(after && std::strcmp(after, "3") == 0, "async-error mode needs FAKE_NCCL_ASYNC_ERROR_AFTER=3");
  const TypeCase t{"MPI_INT", MPI_INT, Tag::int_};
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  // An error reported by MPI_Wait on a streamcoll request (a generalized request) goes to
  // the handler MPI uses for requests without a communicator: Open MPI's is
  // MPI_COMM_WORLD's.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  const Ctx c{comm, "nccl"};
  // Operations 1-3 succeed (the third, non-blocking, is the last the fake runs).
  allreduce<int>(c, t, kOps[0], 100, Variant{}, 1);
  allreduce<int>(c, t, kOps[1], 100, Variant{}, 2);

  const size_t n = 100;
  auto in = inputs<int>(g_rank, n, Op::sum, 3);
  auto ref = reduced<int>(g_size, n, Op::sum, 3);
  Buf send(n * sizeof(int)), recv(n * sizeof(int)), recv4(n * sizeof(int));
  host_write(send.get(), bytes_of(in), true, "input");
  host_write(recv.get(), garbage(recv.size()), true, "prefill");
  MPI_Request req;
  const unsigned long long aborts0 = nc("ncclCommAbort");
  check(MPI_Iallreduce(send.get(), recv.get(), static_cast<int>(n), MPI_INT, MPI_SUM, comm, &req) == MPI_SUCCESS,
        "operation 3 (MPI_Iallreduce) starts");
  const unsigned long long issued0 = api.nccl_calls();
  // NCCL now reports an asynchronous error. streamcoll's watchdog notices it without any
  // MPI call (it polls every 100 ms) and aborts the NCCL communicator.
  check(eventually([&] { return nc("ncclCommAbort") == aborts0 + 1; }),
        "the watchdog aborted the NCCL communicator while the program made no call");
  // Operation 4: every rank agrees that the aborted NCCL communicator cannot run it, so
  // the MPI carries it, right. (No stream-ordered operation ran on the communicator, so
  // nothing is owed a late report: operation 3's request reports its own failure.)
  host_write(recv4.get(), garbage(recv4.size()), true, "prefill");
  int rc = MPI_Allreduce(send.get(), recv4.get(), static_cast<int>(n), MPI_INT, MPI_SUM, comm);
  check(rc == MPI_SUCCESS, "after an asynchronous NCCL error: the next MPI_Allreduce succeeds");
  check(host_read(recv4.get(), n * sizeof(int), true, "the call after the abort") == bytes_of(ref),
        "after an asynchronous NCCL error: the next MPI_Allreduce is right (it ran elsewhere)");
  check(nc("ncclCommAbort") == aborts0 + 1, "the NCCL communicator was aborted (once)");
  rc = MPI_Wait(&req, MPI_STATUS_IGNORE);
  {
    auto got = host_read(recv.get(), n * sizeof(int), true, "MPI_Iallreduce in flight at the abort");
    const bool right = got == bytes_of(ref);
    // An operation still in flight when the communicator is aborted never ran (with
    // FAKE_CUDA_DEFER=1): either the result is right or MPI_Wait must fail.
    check(right || (rc != MPI_SUCCESS && error_class(rc) == MPI_ERR_OTHER),
              "a request in flight when its NCCL communicator is aborted completes with an error "
              "(MPI_Wait gave " + std::to_string(rc) + ", result " + (right ? "right" : "wrong") + ")");
    if (rc != MPI_SUCCESS) {
      char msg[MPI_MAX_ERROR_STRING] = {0};
      int len = 0;
      MPI_Error_string(rc, msg, &len);
      check(std::strstr(msg, "aborted") != nullptr, std::string("the error string says so: ") + msg);
    }
  }
  // Nothing is latched: later calls, routed from the agreement that left NCCL (the
  // non-blocking one from the blocking call before it), go elsewhere and are right,
  // without reaching NCCL.
  req = MPI_REQUEST_NULL;
  host_write(recv.get(), garbage(recv.size()), true, "prefill");
  rc = MPI_Iallreduce(send.get(), recv.get(), static_cast<int>(n), MPI_INT, MPI_SUM, comm, &req);
  check(rc == MPI_SUCCESS && MPI_Wait(&req, MPI_STATUS_IGNORE) == MPI_SUCCESS,
        "after the abort: MPI_Iallreduce succeeds");
  check(host_read(recv.get(), n * sizeof(int), true, "MPI_Iallreduce after the abort") == bytes_of(ref),
        "after the abort: MPI_Iallreduce is right");
  check(streamcoll_comm_attach_stream(comm, g_stream) == MPI_SUCCESS, "attach");
  rc = MPI_Bcast(recv.get(), static_cast<int>(n), MPI_INT, 0, comm);
  check(rc == MPI_SUCCESS, "after the abort: MPI_Bcast on a stream succeeds");
  check(host_read(recv.get(), n * sizeof(int), true, "MPI_Bcast after the abort") == bytes_of(ref),
        "after the abort: MPI_Bcast is right");
  streamcoll_comm_detach_stream(comm);
  check(api.nccl_calls() == issued0, "after the abort: nothing reaches NCCL");
  check(nc("ncclCommAbort") == aborts0 + 1, "aborted once only");
  // Calls the route does not take still work.
  allreduce<short>({comm, "pmpi"}, {"MPI_SHORT", MPI_SHORT, Tag::shrt}, kOps[0], 100, Variant{}, 9);
  const unsigned long long destroys0 = nc("ncclCommDestroy"), streams0 = cu("live_streams");
  MPI_Comm_free(&comm);
  check(eventually([&] { return cu("live_streams") == streams0 - 2; }),
        "MPI_Comm_free releases the aborted communicator's streams");
  check(nc("ncclCommDestroy") == destroys0, "an aborted NCCL communicator is not destroyed");

  // Another communicator has its own NCCL communicator, unaffected; a buffer on another
  // GPU than its NCCL communicator's: the ranks agree that nccl cannot run it, and the MPI
  // carries it, right.
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  allreduce<int>({comm, "nccl"}, t, kOps[0], 100, Variant{}, 11);
  {
    Buf a(n * sizeof(int), Mem::device1), b(n * sizeof(int), Mem::device1);
    host_write(a.get(), bytes_of(in), true, "input");
    const unsigned long long before = stat_calls("allreduce", "pmpi", "device");
    rc = MPI_Allreduce(a.get(), b.get(), static_cast<int>(n), MPI_INT, MPI_SUM, comm);
    check(rc == MPI_SUCCESS, "a buffer on device 1, NCCL communicator on device 0: succeeds");
    check(host_read(b.get(), n * sizeof(int), true, "device 1 result") == bytes_of(ref),
          "a buffer on device 1: the right sum");
    check(stat_calls("allreduce", "pmpi", "device") == before + 1, "that call was routed to pmpi");
  }
  allreduce<int>({comm, "nccl"}, t, kOps[3], 100, variant(8, true), 12);
  MPI_Comm_free(&comm);

  // A peer that never joins an operation (a dead or hung rank): the others' NCCL
  // operation cannot complete; their watchdog sees the asynchronous error, aborts, and
  // the wait must fail rather than return garbage. (Non-blocking, routed from the
  // blocking calls' agreement: a blocking call would first wait for the peer in that
  // agreement, as in any MPI collective.)
  // (Ranks in reverse order: another group than the communicators above, so a fresh NCCL
  // communicator, not an idle one reused with FAKE_NCCL_ASYNC_ERROR_AFTER's count run out.)
  if (g_size < 2) return;
  MPI_Comm_split(MPI_COMM_WORLD, 0, g_size - g_rank, &comm);
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  allreduce<int>({comm, "nccl"}, t, kOps[0], 100, Variant{}, 21);
  allreduce<int>({comm, "nccl"}, t, kOps[0], 100, Variant{}, 22);
  if (g_rank == 0) {
    host_write(recv.get(), garbage(recv.size()), true, "prefill");
    MPI_Request lone = MPI_REQUEST_NULL;
    rc = MPI_Iallreduce(send.get(), recv.get(), static_cast<int>(n), MPI_INT, MPI_SUM, comm, &lone);
    check(rc == MPI_SUCCESS, "MPI_Iallreduce without its peers starts");
    rc = MPI_Wait(&lone, MPI_STATUS_IGNORE);
    auto got = host_read(recv.get(), n * sizeof(int), true, "MPI_Iallreduce without its peers");
    const bool right = got == bytes_of(ref);
    check(!right, "the operation without its peers did not complete (the fake ran it alone?)");
    // The stream goes idle because the NCCL communicator was aborted meanwhile (by the
    // watchdog, or by the wait's own poll): not a completed operation, an error.
    check(rc != MPI_SUCCESS && error_class(rc) == MPI_ERR_OTHER,
              "a wait whose NCCL communicator is aborted while it waits fails "
              "(got " + std::to_string(rc) + ", result " + (right ? "right" : "garbage") + ")");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Comm_free(&comm);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  const std::string mode = argc > 1 ? argv[1] : "route";
  g_mode = mode;
  const bool known_mode = mode == "route" || mode == "shared" || mode == "fail-init" ||
                          mode == "absent" || mode == "async-error" || mode == "ccube" ||
                          mode == "ccube-load-fails";
  const bool nccl_loaded = mode != "absent";
  int ok = known_mode && load_api(nccl_loaded) ? 1 : 0, all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all_ok) {
    if (g_rank == 0)
      std::fprintf(stderr, "nccl_route: unknown mode '%s', or the fake CUDA/NCCL or streamcoll "
                   "not loaded (LD_LIBRARY_PATH, STREAMCOLL_NCCL_LIB, LD_PRELOAD)\n", mode.c_str());
    MPI_Finalize();
    return 1;
  }
  g_defer = api.deferred() != 0;
  check(cu("cuInit") >= 1, "streamcoll opened the fake CUDA driver");
  check(streamcoll_stream_available() == 1, "the stream attribute is available");
  // What a CUDA runtime program has: device 0's primary context current on this thread.
  check(api.runtime_init() == 0, "runtime init");
  g_stream = api.stream_create(1 /* CU_STREAM_NON_BLOCKING */);

  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  // Which route the supported calls take in this mode.
  const bool nccl = std::strcmp(route_for(comm), "nccl") == 0;
  const Ctx c{comm, nccl ? "nccl" : "pmpi"};
  const unsigned long long races0 = cu("races");

  if (mode == "async-error") {
    async_error();
  } else if (mode == "ccube-load-fails") {
    ccube_load_fails();
  } else if (mode == "ccube") {
    // On the test cluster the tree spans the nodes (ccube_tree maps it onto them).
    const int nodes = job_nodes();
    if (g_rank == 0) std::printf("nccl_route (ccube): %d ranks on %d node(s)\n", g_size, nodes);
    ccube_grid(nccl);
    check(nc("mismatches") == 0, "every rank ran matching NCCL operations");
    check(nc("errors") == 0, "the fake NCCL saw no bad argument");
  } else {
    setup_order();
    const bool full = mode == "route";
    reductions_grid(c, nccl, full);
    movers_grid(c, nccl, full);
    variant_matrix(c, nccl, 7);
    if (full) variant_matrix(c, nccl, 1000);
    unsupported(c);
    other_memory(comm);
    communicators();
    if (nccl) {
      check(api.nccl_calls() > 0, "NCCL ran operations");
      check(nc("mismatches") == 0, "every rank ran the same NCCL operations");
      check(nc("errors") == 0, "the fake NCCL saw no bad argument");
    } else if (mode == "fail-init") {
      check(api.nccl_calls() == 0, "NCCL ran nothing");
    }
    if (mode == "fail-init") {
      // FAKE_NCCL_FAIL_INIT=K fails NCCL rank K-1 of every communicator; the others
      // succeed, learn of it through streamcoll's agreement, and abort.
      const char* f = std::getenv("FAKE_NCCL_FAIL_INIT");
      check(nc("ncclCommInitRank") >= 1, "fail-init: ncclCommInitRank was called");
      if (f && g_rank == std::atoi(f) - 1) check(nc("init_failures") >= 1, "fail-init: this rank's init failed");
      check(nc("init_failures") + nc("ncclCommAbort") == nc("ncclCommInitRank"),
            "fail-init: every NCCL communicator that was created was aborted (agreement)");
    }
  }
  check(cu("races") == races0, "the fake driver saw no race");
  check(cu("errors") == 0 || mode == "async-error" || mode == "ccube-load-fails",
        "the fake driver returned no error");

  MPI_Comm_free(&comm);
  api.stream_destroy(g_stream);
  api.runtime_fini();

  int counts[2] = {g_pass, g_fail}, total[2] = {0, 0};
  MPI_Reduce(counts, total, 2, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
  MPI_Finalize();
  // After MPI_Finalize streamcoll has freed its communicator contexts: nothing of the
  // driver's may be left (contexts retained, streams, events, stream-ordered memory).
  bool clean = true;
  for (const char* gauge : {"ctx_refs", "live_streams", "live_events", "live_async_allocs", "live_allocs",
                            "live_host_allocs"})
    if (cu(gauge) != 0) {
      std::fprintf(stderr, "[rank %d] FAIL: after MPI_Finalize, %s = %llu (want 0)\n", g_rank, gauge,
                   cu(gauge));
      clean = false;
    }
  if (g_rank == 0) {
    std::printf("nccl_route (%s, %d ranks%s): %d passed, %d failed", mode.c_str(), g_size,
                g_defer ? ", deferred stream work" : "", total[0], total[1]);
    std::printf("\n");
  }
  return total[1] == 0 && g_fail == 0 && clean ? 0 : 1;
}
