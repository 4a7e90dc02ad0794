// Route ht (algorithms/ht.cpp, host transfer) end to end without a GPU: real MPI
// processes, streamcoll preloaded, the fake CUDA driver (libcuda.so.1 from fake_cuda.cpp,
// through LD_LIBRARY_PATH): fake device memory is host memory, stream work is deferred
// until something waits for it (FAKE_CUDA_DEFER=1) or runs at once, host waits
// (cuStreamWaitValue32, or the streamcoll_wait_geq kernel) hold a stream until the
// progress thread stores the flag, and a race detector checks the ordering of every
// piece of stream work, of the program's reads, and of the host's work on the staging
// buffers against the flag (fake_cuda.cpp, "Host waits").
//
//   ht_route MODE         (run under tests/mpi/run.sh preload; tests/fake/meson.build)
//   route     routes forced per communicator with streamcoll_comm_set_route, one
//             duplicate of MPI_COMM_WORLD per host algorithm (rd, rabenseifner, ring,
//             mpi): allreduce, reduce (rotating root), bcast (rotating root), allgather,
//             reduce_scatter_block on device buffers; MPI_INT, MPI_INT64_T, MPI_UINT8_T,
//             MPI_FLOAT, MPI_DOUBLE (and MPI_INT32_T, MPI_LONG, MPI_SHORT, MPI_BYTE in the
//             variant matrix) with MPI_SUM, MPI_PROD, MPI_MIN, MPI_MAX and, on integers,
//             MPI_BAND; counts 1, 7, 1000, 100000; blocking, MPI_Wait, MPI_Test loops,
//             MPI_Waitall/Waitany/Testall/Waitsome mixed with point-to-point requests,
//             MPI_Request_free; in place or not; classic (no stream: the result is in the
//             buffer, and seen complete by the host, when the call or its completion
//             returns; every third classic call has its input written on the legacy
//             stream without synchronisation), an attached stream and the attached
//             legacy stream. Set-up order:
//             a non-blocking call before the first blocking one on a communicator goes to
//             pmpi (ht sets up at a blocking call only).
//   shared    the same (smaller) with every rank on one GPU (FAKE_CUDA_BUS_ID=same): ht
//             does not care
//   kernel    the spin-kernel fallback (FAKE_CUDA_NO_STREAM_MEMOPS=1 or
//             STREAMCOLL_HT_WAIT=kernel): every hold is a streamcoll_wait_geq launch
//   env       routes from STREAMCOLL_ROUTE (set by the meson test) on MPI_COMM_WORLD
//   request-free  MPI_Request_free on a classic (no stream) MPI_I* call of each
//             collective: the result must be in the buffer when it returns, as with the
//             nccl route (in the other modes classic MPI_Request_free is MPI_Wait)
//   local-failure  a CUDA failure on one rank only (FAKE_CUDA_FAIL, set by the meson
//             test) in a stream-ordered call: no hang; the rank reports it at once, the
//             others (whose host collectives ran with its tainted part) at their next
//             call on the communicator; every later call is right everywhere (nothing
//             latched). tests/fake/failures.cpp walks every failure point.
//   comm-free MPI_Comm_free while a non-blocking call is in flight, 100 times (the meson
//             test runs it under STREAMCOLL_CHECK=1, whose own non-blocking check is then
//             in flight on the freed communicator too)
//   Also (route, shared, kernel): MPI_Comm_free while a non-blocking call is in flight,
//   classic and stream-ordered; six non-blocking calls in flight on two communicators
//   (different algorithms), completed in reverse order; bad streamcoll_comm_set_route
//   specs (route).
//
// Stream-ordered calls are checked by behaviour: before the input is written on the
// stream the test holds the stream with its own host wait (a "gate"); the call (and
// MPI_Wait/Test/... of a non-blocking one) must return while the stream is held, so it
// cannot have waited for the stream; a watchdog opens the gate after 10 s so that a
// route that waits fails instead of hanging. Then the gate opens, the stream is
// synchronised, and the result read. The counters show no cuStreamSynchronize or
// cuEventSynchronize by streamcoll during a stream-ordered call.
// Every call is checked against values computed here, against streamcoll's statistics
// (route ht, device memory), and against the fake driver's counters (holds by
// cuStreamWaitValue32 or by the kernel, as the mode says). Any race fails the test. After
// MPI_Finalize nothing of the driver's may be left: contexts, streams, events, pinned
// staging buffers and flags, modules, waits.
// Prints "N passed, N failed" on rank 0; exits nonzero on failure.
#include <dlfcn.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "fake_api.h"
#include "harness.hpp"
#include "streamcoll/streamcoll.h"
#include "streamcoll/streamext.h"

namespace {

// ---- buffers ---------------------------------------------------------------------------------

// A buffer in fake device memory, freed at scope end.
class Buf {
 public:
  Buf() = default;
  explicit Buf(size_t bytes) : bytes_(bytes) {
    if (bytes == 0) return;
    p_ = api.malloc(bytes);
    if (!p_) {
      std::fprintf(stderr, "[rank %d] out of (fake) memory\n", g_rank);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }
  ~Buf() {
    if (p_) api.free(p_);
  }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  void* get() const { return p_; }
  size_t size() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// The host writes/reads a fake device buffer: the fake driver checks that no stream work
// on it is unfinished as far as the host knows.
void host_write(void* dev, const std::vector<char>& data, const std::string& label) {
  check(api.host_access(dev, data.size(), 1) == 0, label + ": host write without a race");
  std::memcpy(dev, data.data(), data.size());
}
std::vector<char> host_read(const void* dev, size_t bytes, const std::string& label) {
  check(api.host_access(dev, bytes, 0) == 0, label + ": the host has seen the result complete");
  const char* p = static_cast<const char*>(dev);
  return std::vector<char>(p, p + bytes);
}

std::vector<char> garbage(size_t bytes) {
  std::vector<char> g(bytes);
  for (size_t i = 0; i < bytes; ++i) g[i] = static_cast<char>(0xA5 ^ (i * 29));
  return g;
}

// Receive buffers are kTail bytes longer than the call's result, and the call must leave
// those bytes (and, in place, the input it does not overwrite with the result) as they were.
constexpr size_t kTail = 64;

// `front` written over the start of `back`.
std::vector<char> over(const std::vector<char>& front, std::vector<char> back) {
  std::copy(front.begin(), front.begin() + static_cast<long>(std::min(front.size(), back.size())),
            back.begin());
  return back;
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

Variant variant(int k) {
  Variant v;
  v.c = static_cast<Completion>(k % kCompletions);
  v.s = static_cast<StreamMode>((k / kCompletions) % kStreamModes);
  v.in_place = (k / (kCompletions * kStreamModes)) % 2 == 1;
  // Classic MPI_Request_free has its own mode (request-free): the grid keeps going.
  if (v.c == request_free && v.s == no_stream) v.c = wait;
  // ht orders its classic work after the legacy default stream (as a CUDA-aware MPI does).
  static unsigned n = 0;
  v.legacy_input = v.s == no_stream && ++n % 3 == 0;
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
std::string g_mode;
StreamGate* g_gate = nullptr;

// Point-to-point requests mixed with the collective's. start() returns once the
// message from the previous rank has arrived (MPI_Iprobe sees it before the receive is
// posted), so that completing these requests waits for nothing but this rank's own
// progress: the gate's watchdog, armed after start(), then times this rank alone. (When
// it armed before the peers had sent, a peer held up elsewhere, e.g. a node's rank not
// scheduled for seconds on the test cluster, fired it: "the host waited for the stream"
// where the host waited for a peer.)
struct Ring {
  int send = 0, recv = -1, tag = 0, expect = 0;
  MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  void start(MPI_Comm comm, int t, const std::string& L) {
    int rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    tag = t;
    send = rank * 1000 + t % 1000;
    const int from = (rank + size - 1) % size;
    expect = from * 1000 + t % 1000;
    MPI_Isend(&send, 1, MPI_INT, (rank + 1) % size, tag, comm, &req[1]);
    // Every rank sends before it waits here: no cycle. Bounded, so a lost message fails.
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(300);
    int arrived = 0;
    while (!arrived && std::chrono::steady_clock::now() < end) {
      MPI_Iprobe(from, tag, comm, &arrived, MPI_STATUS_IGNORE);
      if (!arrived) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    check(arrived != 0, L + ": the point-to-point message from the previous rank arrives");
    MPI_Irecv(&recv, 1, MPI_INT, from, tag, comm, &req[0]);
  }
};

struct Io {
  void* dev = nullptr;
  std::vector<char> in;      // written before the call (empty: not written)
  std::vector<char> expect;  // compared after the call, as a prefix (empty: not read)
};

struct Spec {
  std::string label;
  std::string coll;  // statistics name of the blocking form
  MPI_Comm comm = MPI_COMM_NULL;
  Variant v;
  const char* route = "ht";
  std::vector<Io> io;
  std::function<int(MPI_Request*)> issue;  // request: null for the blocking form
};

int g_tag = 100;

void complete(const Variant& v, MPI_Request& req, Ring& ring, const std::string& L) {
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
      check(rc == MPI_SUCCESS && seen == 7 && index == MPI_UNDEFINED, L + ": MPI_Waitany completes each request once");
      ring.req[0] = ring.req[1] = req = MPI_REQUEST_NULL;
      break;
    }
    case testall_mixed: {
      MPI_Request all[3] = {req, ring.req[0], ring.req[1]};
      int flag = 0, rc = MPI_SUCCESS;
      long i = 0;
      for (; !flag && rc == MPI_SUCCESS && i < 20000000L; ++i) rc = MPI_Testall(3, all, &flag, MPI_STATUSES_IGNORE);
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
      // Defined by streamcoll for its own requests (streamext.h): with a stream, the
      // stream waits; classic, the operation completes before the call returns (as the
      // nccl route does).
      check(MPI_Request_free(&req) == MPI_SUCCESS && req == MPI_REQUEST_NULL, L + ": MPI_Request_free");
      break;
    default: break;
  }
}

void run(Spec& s) {
  const Variant& v = s.v;
  const std::string L = s.label + " [" + describe(v) + "]";
  const bool nb = v.c != blocking;
  const bool ht = std::strcmp(s.route, "ht") == 0;
  const bool on_stream = v.s != no_stream;
  streamcoll_stream_t stream = v.s == own_stream ? g_stream : nullptr;

  // Stream-ordered: the stream is held by the gate before the input is written on it.
  const bool gated = on_stream && ht;
  if (gated) check(g_gate->close(stream), L + ": close the gate");
  for (Io& io : s.io) {
    if (io.in.empty()) continue;
    if (on_stream)
      check(api.enqueue_copy(stream, io.dev, io.in.data(), io.in.size()) == 0, L + ": copy on the stream");
    else if (v.legacy_input)
      check(api.enqueue_copy(nullptr, io.dev, io.in.data(), io.in.size()) == 0, L + ": copy on the legacy stream");
    else
      host_write(io.dev, io.in, L);
  }
  if (on_stream) check(streamcoll_comm_attach_stream(s.comm, stream) == MPI_SUCCESS, L + ": attach the stream");

  const std::string name = (nb ? "i" : "") + s.coll;
  const unsigned long long route0 = stat_calls(name, s.route, "device");
  const unsigned long long all0 = stat_calls(name, nullptr, nullptr);
  const unsigned long long syncs0 = cu("cuStreamSynchronize") + cu("cuEventSynchronize");
  Ring ring;
  const bool mixed = v.c == waitall_mixed || v.c == waitany_mixed || v.c == testall_mixed ||
                     v.c == waitsome_mixed || v.c == request_free;
  const int tag = ++g_tag % 30000;
  if (mixed) ring.start(s.comm, tag, L);
  if (gated) g_gate->arm(10.0);
  MPI_Request req = MPI_REQUEST_NULL;
  const int rc = s.issue(nb ? &req : nullptr);
  check(rc == MPI_SUCCESS, L + ": returns MPI_SUCCESS");
  check(stat_calls(name, s.route, "device") == route0 + 1 && stat_calls(name, nullptr, nullptr) == all0 + 1,
        L + ": counted as " + name + " on route " + s.route + ", device memory");
  complete(v, req, ring, L);
  if (gated) {
    const bool waited = g_gate->disarm();
    check(!waited, L + ": stream semantics: the call and its completion returned while the stream was held "
          "(a watchdog had to release the stream: the host waited for it)");
    check(cu("cuStreamSynchronize") + cu("cuEventSynchronize") == syncs0,
          L + ": stream semantics: no cuStreamSynchronize/cuEventSynchronize by streamcoll");
    g_gate->open();
  }
  if (mixed && ring.req[0] != MPI_REQUEST_NULL) MPI_Waitall(2, ring.req, MPI_STATUSES_IGNORE);
  if (mixed) check(ring.recv == ring.expect, L + ": the point-to-point message arrived");
  if (on_stream) {
    check(api.stream_sync(stream) == 0, L + ": synchronise the stream");
    check(streamcoll_comm_detach_stream(s.comm) == MPI_SUCCESS, L + ": detach the stream");
  }
  for (size_t i = 0; i < s.io.size(); ++i) {
    const Io& io = s.io[i];
    if (io.expect.empty()) continue;
    std::vector<char> got = host_read(io.dev, io.expect.size(), L);
    size_t bad = 0;
    while (bad < got.size() && got[bad] == io.expect[bad]) ++bad;
    check(bad == got.size(), L + ": buffer " + std::to_string(i) + " correct" +
                                 (bad < got.size() ? " (first wrong byte " + std::to_string(bad) + " of " +
                                                         std::to_string(got.size()) + ")"
                                                   : std::string()));
  }
}

// ---- datatypes and reference values ----------------------------------------------------

const OpCase kOps[] = {{"MPI_SUM", MPI_SUM, Op::sum}, {"MPI_PROD", MPI_PROD, Op::prod},
                       {"MPI_MIN", MPI_MIN, Op::min}, {"MPI_MAX", MPI_MAX, Op::max},
                       {"MPI_BAND", MPI_BAND, Op::band}};

bool integral(Tag t) { return t != Tag::flt && t != Tag::dbl; }

std::string what(const char* coll, const char* type, const char* op, size_t count, int root = -1) {
  std::string s = std::string(coll) + " " + type + (op ? std::string(" ") + op : std::string()) +
                  " count " + std::to_string(count);
  if (root >= 0) s += " root " + std::to_string(root);
  return s;
}

// ---- the collectives ----------------------------------------------------------------------

struct Ctx {
  MPI_Comm comm;
  const char* route;
  std::string where;  // label suffix: the algorithm
};

template <class T>
void allreduce(const Ctx& c, const TypeCase& t, const OpCase& op, size_t count, const Variant& v, unsigned salt) {
  const int me = comm_rank(c.comm), p = comm_size(c.comm);
  const size_t bytes = count * sizeof(T);
  auto in = bytes_of(inputs<T>(me, count, op.kind, salt));
  auto ref = bytes_of(reduced<T>(p, count, op.kind, salt));
  Buf send(v.in_place ? 0 : bytes), recv(bytes + kTail);
  const auto g = garbage(bytes + kTail);
  host_write(recv.get(), g, "prefill");
  Spec s;
  s.label = what("MPI_Allreduce", t.name, op.name, count) + c.where;
  s.coll = "allreduce";
  s.comm = c.comm;
  s.v = v;
  s.route = c.route;
  if (v.in_place)
    s.io = {{recv.get(), in, over(ref, g)}};
  else
    s.io = {{send.get(), in, in}, {recv.get(), {}, over(ref, g)}};
  const void* sb = v.in_place ? MPI_IN_PLACE : send.get();
  void* rb = recv.get();
  s.issue = [&](MPI_Request* r) {
    return r ? MPI_Iallreduce(sb, rb, static_cast<int>(count), t.type, op.op, c.comm, r)
             : MPI_Allreduce(sb, rb, static_cast<int>(count), t.type, op.op, c.comm);
  };
  run(s);
}

template <class T>
void reduce(const Ctx& c, const TypeCase& t, const OpCase& op, size_t count, int root, const Variant& v,
            unsigned salt) {
  const int me = comm_rank(c.comm), p = comm_size(c.comm);
  const size_t bytes = count * sizeof(T);
  const bool is_root = me == root, in_place = v.in_place && is_root;
  const bool null_recv = !is_root && (salt % 2 == 0);
  auto in = bytes_of(inputs<T>(me, count, op.kind, salt));
  auto ref = bytes_of(reduced<T>(p, count, op.kind, salt));
  Buf send(in_place ? 0 : bytes), recv(null_recv ? 0 : bytes + kTail);
  const auto g = garbage(bytes + kTail);
  if (recv.get()) host_write(recv.get(), g, "prefill");
  Spec s;
  s.label = what("MPI_Reduce", t.name, op.name, count, root) + c.where;
  s.coll = "reduce";
  s.comm = c.comm;
  s.v = v;
  s.route = c.route;
  if (in_place) {
    s.io = {{recv.get(), in, over(ref, g)}};
  } else {
    s.io = {{send.get(), in, in}};
    if (recv.get()) s.io.push_back({recv.get(), {}, is_root ? over(ref, g) : g});
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
void reduce_scatter_block(const Ctx& c, const TypeCase& t, const OpCase& op, size_t count, const Variant& v,
                          unsigned salt) {
  const int me = comm_rank(c.comm), p = comm_size(c.comm);
  const size_t total = count * static_cast<size_t>(p);
  auto in = bytes_of(inputs<T>(me, total, op.kind, salt));
  auto all = reduced<T>(p, total, op.kind, salt);
  std::vector<T> mine(all.begin() + static_cast<long>(me * count), all.begin() + static_cast<long>((me + 1) * count));
  auto ref = bytes_of(mine);
  Buf send(v.in_place ? 0 : total * sizeof(T)), recv((v.in_place ? total : count) * sizeof(T) + kTail);
  const auto g = garbage(recv.size());
  host_write(recv.get(), g, "prefill");
  Spec s;
  s.label = what("MPI_Reduce_scatter_block", t.name, op.name, count) + c.where;
  s.coll = "reduce_scatter_block";
  s.comm = c.comm;
  s.v = v;
  s.route = c.route;
  // In place only the first block is the result: the other blocks keep their input.
  if (v.in_place)
    s.io = {{recv.get(), in, over(ref, over(in, g))}};
  else
    s.io = {{send.get(), in, in}, {recv.get(), {}, over(ref, g)}};
  const void* sb = v.in_place ? MPI_IN_PLACE : send.get();
  void* rb = recv.get();
  s.issue = [&](MPI_Request* r) {
    return r ? MPI_Ireduce_scatter_block(sb, rb, static_cast<int>(count), t.type, op.op, c.comm, r)
             : MPI_Reduce_scatter_block(sb, rb, static_cast<int>(count), t.type, op.op, c.comm);
  };
  run(s);
}

void bcast(const Ctx& c, const char* tname, MPI_Datatype type, size_t count, int root, const Variant& v,
           unsigned salt) {
  const int me = comm_rank(c.comm);
  const size_t bytes = count * static_cast<size_t>(type_size(type));
  auto data = pattern(root, 0, bytes, salt);
  Buf buf(bytes + kTail);
  const auto g = garbage(bytes + kTail);
  host_write(buf.get(), g, "prefill");
  Spec s;
  s.label = what("MPI_Bcast", tname, nullptr, count, root) + c.where;
  s.coll = "bcast";
  s.comm = c.comm;
  s.v = v;
  s.v.in_place = false;
  s.route = c.route;
  s.io = {{buf.get(), me == root ? data : std::vector<char>(), over(data, g)}};
  void* b = buf.get();
  s.issue = [&](MPI_Request* r) {
    return r ? MPI_Ibcast(b, static_cast<int>(count), type, root, c.comm, r)
             : MPI_Bcast(b, static_cast<int>(count), type, root, c.comm);
  };
  run(s);
}

void allgather(const Ctx& c, const char* tname, MPI_Datatype type, size_t count, const Variant& v, unsigned salt) {
  const int me = comm_rank(c.comm), p = comm_size(c.comm);
  const size_t block = count * static_cast<size_t>(type_size(type));
  auto mine = pattern(me, 0, block, salt);
  std::vector<char> all;
  for (int r = 0; r < p; ++r) {
    auto b = pattern(r, 0, block, salt);
    all.insert(all.end(), b.begin(), b.end());
  }
  Buf send(v.in_place ? 0 : block), recv(block * p + kTail);
  const auto g = garbage(recv.size());
  host_write(recv.get(), g, "prefill");
  Spec s;
  s.label = what("MPI_Allgather", tname, nullptr, count) + c.where;
  s.coll = "allgather";
  s.comm = c.comm;
  s.v = v;
  s.route = c.route;
  if (v.in_place) {
    auto in = garbage(block * p);
    std::memcpy(in.data() + me * block, mine.data(), block);
    s.io = {{recv.get(), in, over(all, g)}};
  } else {
    s.io = {{send.get(), mine, mine}, {recv.get(), {}, over(all, g)}};
  }
  const void* sb = v.in_place ? MPI_IN_PLACE : send.get();
  void* rb = recv.get();
  const int n = static_cast<int>(count);
  s.issue = [&](MPI_Request* r) {
    return r ? MPI_Iallgather(sb, n, type, rb, n, type, c.comm, r) : MPI_Allgather(sb, n, type, rb, n, type, c.comm);
  };
  run(s);
}

// ---- test groups ----------------------------------------------------------------------------

const size_t kCounts[] = {1, 7, 1000, 100000};
const char* const kAlgos[] = {"rd", "rabenseifner", "ring", "mpi", "ccube:chunk=1000"};

std::vector<TypeCase> grid_types() {
  return {{"MPI_INT", MPI_INT, Tag::int_}, {"MPI_INT64_T", MPI_INT64_T, Tag::i64},
          {"MPI_UINT8_T", MPI_UINT8_T, Tag::u8}, {"MPI_FLOAT", MPI_FLOAT, Tag::flt},
          {"MPI_DOUBLE", MPI_DOUBLE, Tag::dbl}};
}

// Every type x op x count on allreduce, reduce (rotating root), reduce_scatter_block:
// one plain blocking classic call, and rotating variants. `density` 1: everything; 2:
// every other type, no 100000.
void reductions_grid(const Ctx& c, int density, unsigned seed) {
  const int p = comm_size(c.comm);
  unsigned k = seed;
  const auto types = grid_types();
  for (size_t ti = 0; ti < types.size(); ++ti) {
    const TypeCase& t = types[ti];
    if (density > 1 && (ti + seed) % density != 0) continue;
    for (const OpCase& op : kOps) {
      if (op.kind == Op::band && !integral(t.tag)) continue;
      for (size_t count : kCounts) {
        if (density > 1 && count == 100000) continue;
        with_type(t.tag, [&](auto z) {
          using T = decltype(z);
          ++k;
          std::vector<Variant> vs = {Variant{}, variant(static_cast<int>(k * 7))};
          if (count < 100000) vs.push_back(variant(static_cast<int>(k * 7 + kVariants / 2)));
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
}

// Bcast and allgather move bytes: every grid type and a few more.
void movers_grid(const Ctx& c, int density, unsigned seed) {
  const int p = comm_size(c.comm);
  std::vector<TypeCase> types = grid_types();
  types.push_back({"MPI_SHORT", MPI_SHORT, Tag::i16});
  types.push_back({"MPI_BYTE", MPI_BYTE, Tag::byte});
  unsigned k = seed;
  for (size_t ti = 0; ti < types.size(); ++ti) {
    if (density > 1 && (ti + seed) % density != 0) continue;
    for (size_t count : kCounts) {
      if (density > 1 && count == 100000) continue;
      ++k;
      std::vector<Variant> vs = {Variant{}, variant(static_cast<int>(k * 11 + 3))};
      if (count < 100000) vs.push_back(variant(static_cast<int>(k * 11 + 3 + kVariants / 2)));
      unsigned salt = k * 3;
      for (const Variant& v : vs) {
        ++salt;
        bcast(c, types[ti].name, types[ti].type, count, static_cast<int>(salt % p), v, salt);
        allgather(c, types[ti].name, types[ti].type, count, v, salt);
      }
    }
  }
}

// Every variant (completion x stream x in place) of all five collectives, more types.
void variant_matrix(const Ctx& c, size_t count) {
  const int p = comm_size(c.comm);
  const TypeCase types[] = {{"MPI_INT32_T", MPI_INT32_T, Tag::i32}, {"MPI_LONG", MPI_LONG, Tag::lng},
                            {"MPI_SHORT", MPI_SHORT, Tag::i16}, {"MPI_DOUBLE", MPI_DOUBLE, Tag::dbl}};
  for (int k = 0; k < kVariants; ++k) {
    const Variant v = variant(k);
    const unsigned salt = static_cast<unsigned>(k + 1000);
    const TypeCase& t = types[k % 4];
    const OpCase& op = kOps[(k / 4) % (integral(t.tag) ? 5 : 4)];
    with_type(t.tag, [&](auto z) {
      using T = decltype(z);
      allreduce<T>(c, t, op, count, v, salt);
      reduce<T>(c, t, kOps[k % 4], count, k % p, v, salt);
      reduce_scatter_block<T>(c, t, op, count, v, salt);
    });
    if (!v.in_place) bcast(c, t.name, t.type, count, k % p, v, salt);
    allgather(c, t.name, t.type, count, v, salt);
  }
}

std::string spec_for(const char* algo) {
  std::string s;
  for (const char* coll : {"allreduce", "reduce", "bcast", "allgather", "reduce_scatter_block"})
    s += std::string(s.empty() ? "" : ",") + coll + ":ht:algo=" + algo;
  return s;
}

// A duplicate of MPI_COMM_WORLD with ht forced for `algo`; a non-blocking call before the
// first blocking one goes to pmpi; the first blocking call sets ht up.
MPI_Comm ht_comm(const char* algo, bool check_setup_order) {
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  const std::string spec = spec_for(algo);
  check(api.set_route(comm, spec.c_str()) == MPI_SUCCESS, "streamcoll_comm_set_route(" + spec + ")");
  const Ctx c{comm, "ht", std::string(" algo=") + algo};
  const TypeCase t{"MPI_FLOAT", MPI_FLOAT, Tag::flt};
  if (check_setup_order) {
    Ctx pm = c;
    pm.route = "pmpi";
    allreduce<float>(pm, t, kOps[0], 100, {wait, no_stream, false}, 1);
  }
  allreduce<float>(c, t, kOps[0], 100, Variant{}, 2);
  return comm;
}

// MPI_Comm_free while a non-blocking call is in flight: the operation keeps what it needs
// (classic: MPI_Wait gives the result; stream: the stream gets it).
void comm_free_in_flight(const char* algo) {
  MPI_Comm comm = ht_comm(algo, false);
  const size_t n = 1000;
  auto in = bytes_of(inputs<int64_t>(g_rank, n, Op::max, 79));
  auto ref = bytes_of(reduced<int64_t>(g_size, n, Op::max, 79));
  for (bool stream : {false, true}) {
    const std::string L = std::string("MPI_Iallreduce, MPI_Comm_free, MPI_Wait (algo=") + algo +
                          (stream ? ", attached stream)" : ", classic)");
    MPI_Comm c;
    MPI_Comm_dup(comm, &c);  // set_route is per communicator: set it on the duplicate too
    check(api.set_route(c, spec_for(algo).c_str()) == MPI_SUCCESS, L + ": set_route");
    Buf send(n * 8), recv(n * 8);
    host_write(send.get(), in, L);
    host_write(recv.get(), garbage(recv.size()), L);
    allreduce<float>({c, "ht", L}, {"MPI_FLOAT", MPI_FLOAT, Tag::flt}, kOps[0], 10, Variant{}, 3);  // set up
    if (stream) check(streamcoll_comm_attach_stream(c, g_stream) == MPI_SUCCESS, L + ": attach");
    MPI_Request req = MPI_REQUEST_NULL;
    const unsigned long long before = stat_calls("iallreduce", "ht", "device");
    check(MPI_Iallreduce(send.get(), recv.get(), static_cast<int>(n), MPI_INT64_T, MPI_MAX, c, &req) == MPI_SUCCESS,
          L + ": MPI_Iallreduce");
    check(stat_calls("iallreduce", "ht", "device") == before + 1, L + ": on route ht");
    MPI_Comm_free(&c);
    check(MPI_Wait(&req, MPI_STATUS_IGNORE) == MPI_SUCCESS, L + ": MPI_Wait after MPI_Comm_free");
    if (stream) check(api.stream_sync(g_stream) == 0, L + ": synchronise");
    check(host_read(recv.get(), recv.size(), L) == ref, L + ": result");
  }
  MPI_Comm_free(&comm);
}

// Several non-blocking calls in flight at once, on two communicators with different
// algorithms, completed in reverse order (one MPI_Waitall, or MPI_Wait one by one);
// classic and on the attached stream.
void many_in_flight(const char* algo_a, const char* algo_b) {
  MPI_Comm a = ht_comm(algo_a, false), b = ht_comm(algo_b, false);
  const size_t n = 777;
  const int p = g_size;
  for (int mode = 0; mode < 4; ++mode) {
    const bool stream = mode & 1, waitall = (mode & 2) != 0;
    const std::string L = std::string("6 calls in flight on algo=") + algo_a + " and algo=" + algo_b +
                          (stream ? ", attached stream" : ", classic") + (waitall ? ", MPI_Waitall" : ", MPI_Wait");
    struct Call {
      MPI_Comm comm;
      Buf send, recv;
      std::vector<char> ref;
      MPI_Request req = MPI_REQUEST_NULL;
      Call(MPI_Comm c, size_t sb, size_t rb) : comm(c), send(sb), recv(rb) {}
    };
    std::vector<std::unique_ptr<Call>> calls;
    if (stream) {
      check(streamcoll_comm_attach_stream(a, g_stream) == MPI_SUCCESS, L + ": attach");
      check(streamcoll_comm_attach_stream(b, g_stream) == MPI_SUCCESS, L + ": attach");
    }
    for (int k = 0; k < 6; ++k) {
      MPI_Comm c = k % 2 ? b : a;
      const unsigned salt = static_cast<unsigned>(900 + 10 * mode + k);
      auto call = std::make_unique<Call>(c, n * 8 * p, n * 8 * p);
      host_write(call->recv.get(), garbage(n * 8 * p), L);
      int rc = MPI_SUCCESS;
      switch (k % 3) {
        case 0: {
          host_write(call->send.get(), bytes_of(inputs<double>(g_rank, n, Op::sum, salt)), L);
          call->ref = bytes_of(reduced<double>(p, n, Op::sum, salt));
          rc = MPI_Iallreduce(call->send.get(), call->recv.get(), n, MPI_DOUBLE, MPI_SUM, c, &call->req);
          break;
        }
        case 1: {
          const int root = k % p;
          call->ref = pattern(root, 0, n * 8, salt);
          if (g_rank == root) host_write(call->recv.get(), call->ref, L);
          rc = MPI_Ibcast(call->recv.get(), n, MPI_DOUBLE, root, c, &call->req);
          break;
        }
        default: {
          host_write(call->send.get(), pattern(g_rank, 0, n * 8, salt), L);
          for (int r = 0; r < p; ++r) {
            auto blk = pattern(r, 0, n * 8, salt);
            call->ref.insert(call->ref.end(), blk.begin(), blk.end());
          }
          rc = MPI_Iallgather(call->send.get(), n, MPI_DOUBLE, call->recv.get(), n, MPI_DOUBLE, c, &call->req);
        }
      }
      check(rc == MPI_SUCCESS, L + ": call " + std::to_string(k) + " starts");
      calls.push_back(std::move(call));
    }
    if (waitall) {
      std::vector<MPI_Request> reqs;
      for (auto it = calls.rbegin(); it != calls.rend(); ++it) reqs.push_back((*it)->req);
      check(MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE) == MPI_SUCCESS,
            L + ": MPI_Waitall");
    } else {
      for (auto it = calls.rbegin(); it != calls.rend(); ++it)
        check(MPI_Wait(&(*it)->req, MPI_STATUS_IGNORE) == MPI_SUCCESS, L + ": MPI_Wait");
    }
    if (stream) {
      check(api.stream_sync(g_stream) == 0, L + ": synchronise");
      streamcoll_comm_detach_stream(a);
      streamcoll_comm_detach_stream(b);
    }
    for (size_t k = 0; k < calls.size(); ++k)
      check(host_read(calls[k]->recv.get(), calls[k]->ref.size(), L) == calls[k]->ref,
            L + ": call " + std::to_string(k) + " result");
  }
  MPI_Comm_free(&a);
  MPI_Comm_free(&b);
}

// MPI_Request_free on a classic (no stream) non-blocking call: streamcoll defines it for
// its own requests; as with the nccl route, the operation is complete when it returns
// (the program has no other way to learn when it may read or free the buffers).
void request_free_classic() {
  MPI_Comm comm = ht_comm("rd", false);
  const int p = g_size;
  const size_t n = 1000;
  unsigned salt = 500;
  for (int k = 0; k < 5; ++k) {
    ++salt;
    const TypeCase t{"MPI_INT", MPI_INT, Tag::int_};
    const int root = k % p;
    Buf send(n * 4 * p), recv(n * 4 * p);
    std::vector<char> in, ref;
    size_t check_bytes = 0;
    const char* name = "";
    std::function<int(MPI_Request*)> issue;
    host_write(recv.get(), garbage(recv.size()), "prefill");
    switch (k) {
      case 0:
        name = "MPI_Iallreduce";
        in = bytes_of(inputs<int>(g_rank, n, Op::sum, salt));
        ref = bytes_of(reduced<int>(p, n, Op::sum, salt));
        issue = [&](MPI_Request* r) { return MPI_Iallreduce(send.get(), recv.get(), n, MPI_INT, MPI_SUM, comm, r); };
        break;
      case 1:
        name = "MPI_Ireduce";
        in = bytes_of(inputs<int>(g_rank, n, Op::max, salt));
        ref = g_rank == root ? bytes_of(reduced<int>(p, n, Op::max, salt)) : garbage(n * 4);
        issue = [&](MPI_Request* r) { return MPI_Ireduce(send.get(), recv.get(), n, MPI_INT, MPI_MAX, root, comm, r); };
        break;
      case 2:
        name = "MPI_Ibcast";
        ref = pattern(root, 0, n * 4, salt);
        if (g_rank == root) host_write(recv.get(), ref, "bcast input");
        issue = [&](MPI_Request* r) { return MPI_Ibcast(recv.get(), n, MPI_INT, root, comm, r); };
        break;
      case 3: {
        name = "MPI_Iallgather";
        in = pattern(g_rank, 0, n * 4, salt);
        for (int r = 0; r < p; ++r) {
          auto b = pattern(r, 0, n * 4, salt);
          ref.insert(ref.end(), b.begin(), b.end());
        }
        issue = [&](MPI_Request* r) { return MPI_Iallgather(send.get(), n, MPI_INT, recv.get(), n, MPI_INT, comm, r); };
        break;
      }
      default: {
        name = "MPI_Ireduce_scatter_block";
        in = bytes_of(inputs<int>(g_rank, n * p, Op::sum, salt));
        auto all = reduced<int>(p, n * p, Op::sum, salt);
        ref = bytes_of(std::vector<int>(all.begin() + g_rank * n, all.begin() + (g_rank + 1) * n));
        issue = [&](MPI_Request* r) {
          return MPI_Ireduce_scatter_block(send.get(), recv.get(), n, MPI_INT, MPI_SUM, comm, r);
        };
      }
    }
    (void)t;
    check_bytes = ref.size();
    if (!in.empty()) host_write(send.get(), in, name);
    const std::string L = std::string(name) + " + MPI_Request_free, classic (algo=rd)";
    MPI_Request req = MPI_REQUEST_NULL;
    check(issue(&req) == MPI_SUCCESS, L + ": starts");
    check(MPI_Request_free(&req) == MPI_SUCCESS && req == MPI_REQUEST_NULL, L + ": MPI_Request_free");
    check(host_read(recv.get(), check_bytes, L) == ref,
          L + ": the result is in the buffer when MPI_Request_free returns");
    // Whatever the route did, let it finish before the buffers go.
    usleep(200000);
    MPI_Barrier(MPI_COMM_WORLD);
    usleep(200000);
  }
  MPI_Comm_free(&comm);
}

// A CUDA failure on one rank only (FAKE_CUDA_FAIL=cuMemHostAlloc:2, FAKE_CUDA_FAIL_RANK=1:
// its pinned staging buffer for the second size class) in a stream-ordered call. That
// rank's call fails; whatever the others get for that call, nobody may hang, and the
// next call (every rank healthy) must be right, or fail, on every rank: never a result
// of operations matched across ranks out of order.
void local_failure() {
  MPI_Comm c;
  MPI_Comm_dup(MPI_COMM_WORLD, &c);
  MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
  check(api.set_route(c, "allreduce:ht:algo=rd") == MPI_SUCCESS, "set_route");
  const size_t n = size_t(1) << 18;
  Buf a(n * 4), b(n * 4);
  auto call = [&](unsigned salt, bool stream, const std::string& L) {
    host_write(a.get(), bytes_of(inputs<int>(g_rank, n, Op::sum, salt)), L);
    host_write(b.get(), garbage(n * 4), L);
    const int count = stream ? static_cast<int>(n) : 1;
    const int rc = MPI_Allreduce(a.get(), b.get(), count, MPI_INT, MPI_SUM, c);
    if (stream) {
      // A watchdog: a stream still held after 20 s will never be released.
      std::atomic<bool> done{false};
      std::thread dog([&] {
        for (int i = 0; i < 2000 && !done.load(); ++i) usleep(10000);
        if (!done.load()) {
          std::fprintf(stderr, "[rank %d] FAIL: %s: the stream is still held 20 s after the call (its host "
                       "collective never completes): hang\n", g_rank, L.c_str());
          std::fflush(stderr);
          _exit(1);
        }
      });
      api.stream_sync(g_stream);
      done = true;
      dog.join();
    }
    auto ref = bytes_of(reduced<int>(g_size, static_cast<size_t>(count), Op::sum, salt));
    const bool right = host_read(b.get(), ref.size(), L) == ref;
    int mine[2] = {rc != MPI_SUCCESS, right}, all[2] = {0, 0};
    PMPI_Allreduce(mine, all, 2, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    // ranks that returned an error, ranks whose buffer holds the right value
    return std::pair<int, int>(all[0], all[1]);
  };
  auto [f0, r0] = call(1, false, "set-up call (classic)");
  check(f0 == 0 && r0 == g_size, "the set-up call is right everywhere");
  check(streamcoll_comm_attach_stream(c, g_stream) == MPI_SUCCESS, "attach");
  auto [f1, r1] = call(2, true, "the call that fails on rank 1");
  check(f1 >= 1, "the failing call reports an error on the rank where it failed");
  (void)r1;  // whatever the buffers hold: every rank is told (at once, or at its next call)
  auto [f2, r2] = call(3, true, "the call after it");
  check(r2 == g_size, "the call after a local failure is right on every rank (" +
                          std::to_string(r2) + " of " + std::to_string(g_size) + ")");
  check(f2 == g_size - 1, "the ranks that returned success for the spoilt call report it now (" +
                              std::to_string(f2) + " of " + std::to_string(g_size - 1) + ")");
  auto [f3, r3] = call(4, true, "the call after that");
  check(f3 == 0 && r3 == g_size, "then every call is right everywhere, no error left over");
  streamcoll_comm_detach_stream(c);
  MPI_Comm_free(&c);
}

void bad_spec() {
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  check(api.set_route(comm, "allreduce:ht:algo=nosuch") == MPI_ERR_ARG,
        "streamcoll_comm_set_route with an unknown algorithm: MPI_ERR_ARG");
  check(api.set_route(MPI_COMM_NULL, "allreduce:ht") == MPI_ERR_COMM, "streamcoll_comm_set_route(MPI_COMM_NULL): MPI_ERR_COMM");
  MPI_Comm_free(&comm);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  g_mode = argc > 1 ? argv[1] : "route";
  const bool known = g_mode == "route" || g_mode == "shared" || g_mode == "kernel" || g_mode == "env" ||
                     g_mode == "request-free" || g_mode == "comm-free" || g_mode == "local-failure";
  int ok = known && load_api(false) ? 1 : 0, all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all_ok) {
    if (g_rank == 0)
      std::fprintf(stderr, "ht_route: unknown mode '%s', or the fake CUDA driver or streamcoll not loaded "
                   "(LD_LIBRARY_PATH, LD_PRELOAD)\n", g_mode.c_str());
    MPI_Finalize();
    return 1;
  }
  g_defer = api.deferred() != 0;
  check(cu("cuInit") >= 1, "streamcoll opened the fake CUDA driver");
  check(streamcoll_stream_available() == 1, "the stream attribute is available");
  check(api.runtime_init() == 0, "runtime init");
  g_stream = api.stream_create(1 /* CU_STREAM_NON_BLOCKING */);
  g_gate = new StreamGate;
  const unsigned long long races0 = cu("races");
  const bool kernel_expected = g_mode == "kernel";

  if (g_mode == "request-free") {
    request_free_classic();
  } else if (g_mode == "local-failure") {
    local_failure();
  } else if (g_mode == "comm-free") {
    for (int i = 0; i < 100; ++i) comm_free_in_flight(i % 2 ? "ring" : "rd");
  } else if (g_mode == "env") {
    // STREAMCOLL_ROUTE (meson): allreduce:ht:algo=ring,reduce:ht:algo=rd,...
    const Ctx c{MPI_COMM_WORLD, "ht", " (STREAMCOLL_ROUTE)"};
    reductions_grid(c, 2, 0);
    movers_grid(c, 2, 0);
    variant_matrix(c, 7);
  } else {
    if (g_mode == "route") bad_spec();
    for (size_t a = 0; a < sizeof kAlgos / sizeof kAlgos[0]; ++a) {
      const char* algo = kAlgos[a];
      MPI_Comm comm = ht_comm(algo, a == 0);
      const Ctx c{comm, "ht", std::string(" algo=") + algo};
      const int density = g_mode == "route" ? 1 : 2;
      reductions_grid(c, density, static_cast<unsigned>(a));
      movers_grid(c, density, static_cast<unsigned>(a));
      variant_matrix(c, 7);
      if (g_mode == "route") variant_matrix(c, 1000);
      MPI_Comm_free(&comm);
    }
    comm_free_in_flight("rd");
    comm_free_in_flight("ring");
    many_in_flight("rd", "mpi");
    many_in_flight("mpi", "rabenseifner");
    many_in_flight("ring", "ring");
  }
  // How the streams were held.
  if (kernel_expected) {
    const char* nm = std::getenv("FAKE_CUDA_NO_STREAM_MEMOPS");
    if (nm && std::strcmp(nm, "1") == 0)
      check(cu("cuStreamWaitValue32") >= 1 && cu("not_supported") == cu("cuStreamWaitValue32"),
            "cuStreamWaitValue32 was tried, said not supported, and the route fell back");
    check(cu("kernel_waits") > 0, "the spin kernel held the streams");
    check(cu("memop_waits") == 0, "no cuStreamWaitValue32 hold succeeded");
    check(cu("cuModuleLoadData") >= 1 && cu("cuLaunchKernel") == cu("kernel_waits"),
          "the kernel was loaded and every launch was a hold");
  } else {
    check(cu("memop_waits") > 0, "cuStreamWaitValue32 held the streams");  // classic MPI_I* too
    check(cu("kernel_waits") == 0 && cu("cuLaunchKernel") == 0, "no spin kernel was launched");
  }
  const bool small = g_mode == "request-free" || g_mode == "comm-free" || g_mode == "local-failure";
  if (!small) check(cu("held_queries") > 0 || !g_defer, "the progress thread found streams held (deferred work)");
  check(cu("races") == races0, "the fake driver saw no race");
  check(cu("errors") == 0, "the fake driver returned no error");
  check(stat_calls("allreduce", "ht", "device") > 0, "route ht counted device calls");

  api.stream_destroy(g_stream);
  delete g_gate;
  g_gate = nullptr;
  api.runtime_fini();
  int counts[2] = {g_pass, g_fail}, total[2] = {0, 0};
  MPI_Reduce(counts, total, 2, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
  MPI_Finalize();
  // After MPI_Finalize streamcoll has released everything: the pinned pool (staging
  // buffers, flags), its modules, events, streams, contexts; no stream is still held.
  bool clean = true;
  for (const char* gauge : {"ctx_refs", "live_streams", "live_events", "live_async_allocs", "live_allocs",
                            "live_host_allocs", "live_modules", "pending_waits"})
    if (cu(gauge) != 0) {
      std::fprintf(stderr, "[rank %d] FAIL: after MPI_Finalize, %s = %llu (want 0)\n", g_rank, gauge, cu(gauge));
      clean = false;
    }
  if (g_rank == 0)
    std::printf("ht_route (%s, %d ranks%s%s): %d passed, %d failed\n", g_mode.c_str(), g_size,
                g_defer ? ", deferred stream work" : "", kernel_expected ? ", spin kernel" : "", total[0], total[1]);
  return total[1] == 0 && g_fail == 0 && clean ? 0 : 1;
}
