// progress_waits: waits on streamcoll's own requests keep MPI progressing
// (shim/requests.cpp, core/requests.hpp). Real MPI processes, streamcoll preloaded, the
// fake CUDA driver and (route nccl) the fake NCCL, as in nccl_route.cpp.
//
//   progress_waits ROUTE [CALL]  (tests/mpi/run.sh preload, 2 or more ranks; CALL, e.g.
//                                 MPI_Waitall: that completion call only)
//   nccl   streamcoll_comm_set_route(comm, "allreduce:nccl") on every rank: MPI_Iallreduce
//          on fake device memory gives a request that completes through NCCL (an event)
//   ht     "allreduce:ht:algo=rd": the request completes through the progress engine
//
// The scenario MPI's progress rule makes legal, for each completion call, classic (no
// stream attribute) and with an attached stream, with ranks A and B taking turns as
// ranks 0 and 1:
//   A: MPI_Iallreduce(device buffers), MPI_Irecv of 1 MiB from B, a small ring exchange;
//      all completed with the call under test;
//   B: the ring exchange, MPI_Send of 1 MiB to A (rendezvous: it needs A's progress),
//      then MPI_Iallreduce; completed with the same call;
//   other ranks: the ring exchange and MPI_Iallreduce.
// A's collective cannot finish before B has joined it, and B joins only after A's MPI
// has progressed its receive. On a GPU, A's NCCL kernel would wait for B; the fakes run
// stream work on the host thread that queries it instead, so A's work is held by a
// gate, a host wait on the stream it runs after (classic: the legacy stream; attached:
// the attached stream), which a thread of A opens (classic) only when B's message has
// reached A's receive buffer, without calling MPI. A completion call that blocks in
// streamcoll instead of driving MPI's progress therefore hangs; an alarm fails the test
// after 20 s ("HANG" on stderr). With an attached stream the gate opens only after the
// completion call has returned: the call must make the stream wait, never the host.
//
// The calls: MPI_Wait (on A's collective first, with ordinary requests outstanding),
// MPI_Waitall, MPI_Waitany and MPI_Waitsome (until MPI_UNDEFINED), MPI_Test loops,
// MPI_Testall, MPI_Testany and MPI_Testsome loops, MPI_Request_get_status loops (the
// request stays allocated until an MPI_Wait). Checked: every call's return code, that
// each request is completed once and freed, the receives' statuses (source, tag, count),
// the received data and the allreduce result against values computed here, streamcoll's
// statistics (each MPI_Iallreduce on the route, device memory), no race seen by the fake
// driver, and nothing left allocated after MPI_Finalize.
// Prints "N passed, N failed" on rank 0; exits nonzero on failure.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "harness.hpp"
#include "streamcoll/streamext.h"

namespace {

std::string g_route;
streamcoll_stream_t g_stream = nullptr;
bool g_defer = false;

// ---- the watchdog: a hang fails the test --------------------------------------------------

char g_hang_msg[512];
size_t g_hang_len = 0;

void on_alarm(int) {
  ssize_t w = write(2, g_hang_msg, g_hang_len);
  (void)w;
  _exit(3);
}

void watch(const std::string& what, unsigned seconds = 20) {
  g_hang_len = static_cast<size_t>(std::snprintf(g_hang_msg, sizeof g_hang_msg,
                                                 "[rank %d] HANG: %s did not finish in %u s\n",
                                                 g_rank, what.c_str(), seconds));
  g_hang_len = std::min(g_hang_len, sizeof g_hang_msg - 1);
  alarm(seconds);
}
void unwatch() { alarm(0); }

// ---- the gate: a host wait on a stream, opened by this program ------------------------------

class Gate {
 public:
  Gate() : flag_(static_cast<uint32_t*>(api.malloc_pinned(64))) {}
  ~Gate() { api.free(flag_); }
  bool close(streamcoll_stream_t s) {
    __atomic_store_n(flag_, 0u, __ATOMIC_RELEASE);
    return api.enqueue_wait(s, flag_, 1) == 0;
  }
  void open() { __atomic_store_n(flag_, 1u, __ATOMIC_RELEASE); }
  bool is_open() const { return __atomic_load_n(flag_, __ATOMIC_ACQUIRE) != 0; }

 private:
  uint32_t* flag_;
};
Gate* g_gate = nullptr;

// ---- the completion calls -----------------------------------------------------------------

enum Call { c_wait, c_waitall, c_waitany, c_waitsome, c_test, c_testall, c_testany, c_testsome,
            c_get_status, kCalls };
const char* const kCallNames[] = {"MPI_Wait", "MPI_Waitall", "MPI_Waitany", "MPI_Waitsome",
                                  "MPI_Test", "MPI_Testall", "MPI_Testany", "MPI_Testsome",
                                  "MPI_Request_get_status"};

// Completes every request of r with `call`; st[i]: request i's status. r[owned] is
// streamcoll's.
void complete(Call call, std::vector<MPI_Request>& r, int owned, std::vector<MPI_Status>& st,
              const std::string& L) {
  const int n = static_cast<int>(r.size());
  std::vector<int> seen(static_cast<size_t>(n), 0);
  auto mark = [&](int i, const MPI_Status& s, const char* how) {
    if (!check(i >= 0 && i < n && seen[static_cast<size_t>(i)] == 0,
               L + ": " + how + " reports request " + std::to_string(i) + " once"))
      return;
    seen[static_cast<size_t>(i)] = 1;
    st[static_cast<size_t>(i)] = s;
  };
  switch (call) {
    case c_wait: {
      // The collective first, while the ordinary requests are still outstanding.
      MPI_Status s;
      check(MPI_Wait(&r[owned], &s) == MPI_SUCCESS, L + ": MPI_Wait on the collective");
      mark(owned, s, "MPI_Wait");
      for (int i = 0; i < n; ++i)
        if (i != owned) {
          check(MPI_Wait(&r[i], &s) == MPI_SUCCESS, L + ": MPI_Wait");
          mark(i, s, "MPI_Wait");
        }
      break;
    }
    case c_waitall: {
      std::vector<MPI_Status> all(static_cast<size_t>(n));
      check(MPI_Waitall(n, r.data(), all.data()) == MPI_SUCCESS, L + ": MPI_Waitall");
      for (int i = 0; i < n; ++i) mark(i, all[static_cast<size_t>(i)], "MPI_Waitall");
      break;
    }
    case c_waitany:
      for (int k = 0;; ++k) {
        int index = -7;
        MPI_Status s;
        if (!check(MPI_Waitany(n, r.data(), &index, &s) == MPI_SUCCESS, L + ": MPI_Waitany")) break;
        if (index == MPI_UNDEFINED) {
          check(k == n, L + ": MPI_Waitany says MPI_UNDEFINED once every request is done");
          break;
        }
        mark(index, s, "MPI_Waitany");
        if (k > n) break;
      }
      break;
    case c_waitsome:
      for (int k = 0;; ++k) {
        int out = -7;
        std::vector<int> idx(static_cast<size_t>(n), -1);
        std::vector<MPI_Status> s(static_cast<size_t>(n));
        if (!check(MPI_Waitsome(n, r.data(), &out, idx.data(), s.data()) == MPI_SUCCESS,
                   L + ": MPI_Waitsome"))
          break;
        if (out == MPI_UNDEFINED) {
          check(std::count(seen.begin(), seen.end(), 1) == n,
                L + ": MPI_Waitsome says MPI_UNDEFINED once every request is done");
          break;
        }
        check(out >= 1 && out <= n, L + ": MPI_Waitsome completes at least one request");
        for (int j = 0; j < out && j < n; ++j) mark(idx[static_cast<size_t>(j)], s[static_cast<size_t>(j)], "MPI_Waitsome");
        if (k > n) break;
      }
      break;
    case c_test: {
      // The collective first, then the rest, one at a time.
      std::vector<int> order{owned};
      for (int i = 0; i < n; ++i)
        if (i != owned) order.push_back(i);
      for (int i : order) {
        int flag = 0, rc = MPI_SUCCESS;
        MPI_Status s;
        while (!flag && rc == MPI_SUCCESS) rc = MPI_Test(&r[i], &flag, &s);
        check(rc == MPI_SUCCESS, L + ": MPI_Test");
        if (flag) mark(i, s, "MPI_Test");
      }
      break;
    }
    case c_testall: {
      std::vector<MPI_Status> all(static_cast<size_t>(n));
      int flag = 0, rc = MPI_SUCCESS;
      while (!flag && rc == MPI_SUCCESS) rc = MPI_Testall(n, r.data(), &flag, all.data());
      check(rc == MPI_SUCCESS && flag, L + ": MPI_Testall");
      for (int i = 0; i < n; ++i) mark(i, all[static_cast<size_t>(i)], "MPI_Testall");
      break;
    }
    case c_testany:
      for (int k = 0; k <= n + 1; ++k) {
        int index = -7, flag = 0, rc = MPI_SUCCESS;
        MPI_Status s;
        while (!flag && rc == MPI_SUCCESS) rc = MPI_Testany(n, r.data(), &index, &flag, &s);
        if (!check(rc == MPI_SUCCESS, L + ": MPI_Testany")) break;
        if (index == MPI_UNDEFINED) {
          check(k == n, L + ": MPI_Testany says MPI_UNDEFINED once every request is done");
          break;
        }
        mark(index, s, "MPI_Testany");
      }
      break;
    case c_testsome:
      for (int k = 0; k <= n + 1; ++k) {
        int out = 0, rc = MPI_SUCCESS;
        std::vector<int> idx(static_cast<size_t>(n), -1);
        std::vector<MPI_Status> s(static_cast<size_t>(n));
        while (out == 0 && rc == MPI_SUCCESS) rc = MPI_Testsome(n, r.data(), &out, idx.data(), s.data());
        if (!check(rc == MPI_SUCCESS, L + ": MPI_Testsome")) break;
        if (out == MPI_UNDEFINED) {
          check(std::count(seen.begin(), seen.end(), 1) == n,
                L + ": MPI_Testsome says MPI_UNDEFINED once every request is done");
          break;
        }
        for (int j = 0; j < out && j < n; ++j) mark(idx[static_cast<size_t>(j)], s[static_cast<size_t>(j)], "MPI_Testsome");
      }
      break;
    case c_get_status: {
      // Polls the collective without freeing it, then the rest the same way.
      std::vector<int> order{owned};
      for (int i = 0; i < n; ++i)
        if (i != owned) order.push_back(i);
      for (int i : order) {
        int flag = 0, rc = MPI_SUCCESS;
        MPI_Status s;
        while (!flag && rc == MPI_SUCCESS) rc = MPI_Request_get_status(r[i], &flag, &s);
        check(rc == MPI_SUCCESS && flag, L + ": MPI_Request_get_status");
        check(r[i] != MPI_REQUEST_NULL, L + ": MPI_Request_get_status leaves the request allocated");
        flag = 0;
        check(MPI_Request_get_status(r[i], &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag,
              L + ": MPI_Request_get_status again: still complete");
        MPI_Status w;
        check(MPI_Wait(&r[i], &w) == MPI_SUCCESS, L + ": MPI_Wait after MPI_Request_get_status");
        mark(i, i == owned ? w : s, "MPI_Request_get_status");
      }
      break;
    }
    default: break;
  }
  for (int i = 0; i < n; ++i)
    check(r[static_cast<size_t>(i)] == MPI_REQUEST_NULL, L + ": request " + std::to_string(i) + " freed");
}

// ---- one case -----------------------------------------------------------------------------

constexpr int kCount = 1000;          // allreduce elements (int32)
constexpr int kBig = 256 * 1024;      // ints from B to A: 1 MiB, well past the eager limit
constexpr int kTagBig = 7, kTagRing = 8;

int g_case = 0;

std::vector<char> garbage_bytes(size_t bytes) {
  std::vector<char> g(bytes);
  for (size_t i = 0; i < bytes; ++i) g[i] = static_cast<char>(0xA5 ^ (i * 29));
  return g;
}

std::vector<int32_t> big_message(int salt) {
  std::vector<int32_t> v(kBig);
  for (int i = 0; i < kBig; ++i) v[static_cast<size_t>(i)] = i * 7 + salt;
  return v;
}

void run_case(MPI_Comm comm, Call call, bool stream, int a) {
  const int b = 1 - a;
  const std::string who = g_rank == a ? "A" : g_rank == b ? "B" : "other";
  const std::string L = g_route + " " + kCallNames[call] + (stream ? ", attached stream" : ", classic") +
                        ", A = rank " + std::to_string(a) + " (this rank: " + who + ")";
  const unsigned salt = static_cast<unsigned>(++g_case);
  const size_t bytes = kCount * sizeof(int32_t);
  const std::vector<char> in = bytes_of(inputs<int32_t>(g_rank, kCount, Op::sum, salt));
  const std::vector<char> expect = bytes_of(reduced<int32_t>(g_size, kCount, Op::sum, salt));
  void* send = api.malloc(bytes);
  void* recv = api.malloc(bytes);
  std::memcpy(recv, garbage_bytes(bytes).data(), bytes);
  streamcoll_stream_t s = stream ? g_stream : nullptr;

  watch(L);
  // Input: written by the host (classic) or on the stream (attached).
  if (stream) {
    if (g_rank == a) check(g_gate->close(s), L + ": close the gate on the attached stream");
    check(api.enqueue_copy(s, send, in.data(), bytes) == 0, L + ": input copied on the stream");
    check(streamcoll_comm_attach_stream(comm, s) == MPI_SUCCESS, L + ": attach the stream");
  } else {
    check(api.host_access(send, bytes, 1) == 0, L + ": host writes the input without a race");
    std::memcpy(send, in.data(), bytes);
    if (g_rank == a) check(g_gate->close(nullptr), L + ": close the gate on the legacy stream");
  }

  // The ring: every rank sends one int to the next.
  int ring_in = -1, ring_out = g_rank * 100 + g_case % 100;
  const int prev = (g_rank + g_size - 1) % g_size, next = (g_rank + 1) % g_size;
  std::vector<MPI_Request> r;
  MPI_Request ring_recv, ring_send;
  MPI_Irecv(&ring_in, 1, MPI_INT, prev, kTagRing, MPI_COMM_WORLD, &ring_recv);
  MPI_Isend(&ring_out, 1, MPI_INT, next, kTagRing, MPI_COMM_WORLD, &ring_send);

  const unsigned long long routed0 = stat_calls("iallreduce", g_route.c_str(), "device");
  std::vector<int32_t> big_in, big_out;
  MPI_Request coll = MPI_REQUEST_NULL, big_recv = MPI_REQUEST_NULL;
  std::thread opener;
  std::atomic<bool> stop{false};
  if (g_rank == b) {
    big_out = big_message(static_cast<int>(salt));
    check(MPI_Send(big_out.data(), kBig, MPI_INT, a, kTagBig, MPI_COMM_WORLD) == MPI_SUCCESS,
          L + ": B's MPI_Send");
  }
  check(MPI_Iallreduce(send, recv, kCount, MPI_INT32_T, MPI_SUM, comm, &coll) == MPI_SUCCESS,
        L + ": MPI_Iallreduce");
  check(stat_calls("iallreduce", g_route.c_str(), "device") == routed0 + 1,
        L + ": MPI_Iallreduce went to route " + g_route);
  if (g_rank == a) {
    big_in.assign(kBig, -1);
    const int32_t last = big_message(static_cast<int>(salt)).back();
    MPI_Irecv(big_in.data(), kBig, MPI_INT, b, kTagBig, MPI_COMM_WORLD, &big_recv);
    // Classic: the gate opens once B's message is here, i.e. once this rank's MPI has
    // progressed it. Watched without MPI calls.
    if (!stream)
      opener = std::thread([&stop, &big_in, last] {
        while (!stop.load() && __atomic_load_n(&big_in[kBig - 1], __ATOMIC_ACQUIRE) != last) usleep(50);
        g_gate->open();
      });
  }

  // The array: the collective at a position that varies with the call.
  r = {ring_recv, ring_send};
  if (big_recv != MPI_REQUEST_NULL) r.push_back(big_recv);
  const int owned = static_cast<int>(call) % (static_cast<int>(r.size()) + 1);
  r.insert(r.begin() + owned, coll);
  const int i_ring = owned == 0 ? 1 : 0;  // ring_recv's position
  const int i_big = big_recv == MPI_REQUEST_NULL ? -1 : (owned <= 2 ? 3 : 2);
  std::vector<MPI_Status> st(r.size());
  const unsigned long long host_waits0 = cu("cuStreamSynchronize") + cu("cuEventSynchronize") + api.sync_count();
  const PendingLook pending0 = stream ? look_pending(s) : PendingLook{};

  complete(call, r, owned, st, L);

  if (stream && g_rank == a)
    check(!g_gate->is_open(), L + ": the call returned while the stream was held (the stream waits, not the host)");
  if (stream && g_route == "nccl") {
    check(cu("cuStreamSynchronize") + cu("cuEventSynchronize") + api.sync_count() == host_waits0,
          L + ": no host wait for the stream");
    if (g_defer && g_rank != a) check(still_pending(pending0),
                                      L + ": the collective's work is still pending on the stream");
  }
  if (g_rank == a) {
    if (stream) g_gate->open();
    stop = true;
    if (opener.joinable()) opener.join();
  }
  if (stream) {
    check(api.stream_sync(s) == 0, L + ": synchronise the stream");
    check(streamcoll_comm_detach_stream(comm) == MPI_SUCCESS, L + ": detach the stream");
  }

  // Results.
  check(api.host_access(recv, bytes, 0) == 0, L + ": the host has seen the result complete");
  check(std::memcmp(recv, expect.data(), bytes) == 0, L + ": allreduce result");
  check(ring_in == prev * 100 + g_case % 100, L + ": ring message");
  const MPI_Status& rs = st[static_cast<size_t>(i_ring)];
  int got = -1;
  MPI_Get_count(&rs, MPI_INT, &got);
  check(rs.MPI_SOURCE == prev && rs.MPI_TAG == kTagRing && got == 1, L + ": ring receive's status");
  if (i_big >= 0) {
    check(big_in == big_message(static_cast<int>(salt)), L + ": B's 1 MiB message");
    const MPI_Status& bs = st[static_cast<size_t>(i_big)];
    MPI_Get_count(&bs, MPI_INT, &got);
    check(bs.MPI_SOURCE == b && bs.MPI_TAG == kTagBig && got == kBig, L + ": 1 MiB receive's status");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  unwatch();
  api.free(send);
  api.free(recv);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  g_route = argc > 1 ? argv[1] : "";
  const std::string only = argc > 2 ? argv[2] : "";  // one call only, e.g. MPI_Waitall
  const bool known = g_route == "nccl" || g_route == "ht";
  int ok = known && g_size >= 2 && load_api(g_route == "nccl") ? 1 : 0, all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all_ok) {
    if (g_rank == 0)
      std::fprintf(stderr, "progress_waits: route must be nccl or ht, with 2 or more ranks, the fake CUDA "
                   "driver (and NCCL) and streamcoll loaded (LD_LIBRARY_PATH, LD_PRELOAD)\n");
    MPI_Finalize();
    return 1;
  }
  signal(SIGALRM, on_alarm);
  g_defer = api.deferred() != 0;
  check(api.runtime_init() == 0, "runtime init");
  g_stream = api.stream_create(1 /* CU_STREAM_NON_BLOCKING */);
  g_gate = new Gate;

  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  const char* spec = g_route == "nccl" ? "allreduce:nccl" : "allreduce:ht:algo=rd";
  check(api.set_route(comm, spec) == MPI_SUCCESS, std::string("streamcoll_comm_set_route ") + spec);
  // A blocking call first: route nccl sets itself up there (MPI_I* calls before it go to pmpi).
  {
    watch("the first blocking MPI_Allreduce");
    const size_t bytes = kCount * sizeof(int32_t);
    void* send = api.malloc(bytes);
    void* recv = api.malloc(bytes);
    std::memcpy(send, bytes_of(inputs<int32_t>(g_rank, kCount, Op::sum, 0)).data(), bytes);
    const unsigned long long routed0 = stat_calls("allreduce", g_route.c_str(), "device");
    check(MPI_Allreduce(send, recv, kCount, MPI_INT32_T, MPI_SUM, comm) == MPI_SUCCESS, "blocking MPI_Allreduce");
    check(stat_calls("allreduce", g_route.c_str(), "device") == routed0 + 1, "blocking MPI_Allreduce on the route");
    check(api.host_access(recv, bytes, 0) == 0 &&
              std::memcmp(recv, bytes_of(reduced<int32_t>(g_size, kCount, Op::sum, 0)).data(), bytes) == 0,
          "blocking MPI_Allreduce result");
    api.free(send);
    api.free(recv);
    unwatch();
  }
  const unsigned long long races0 = cu("races");

  for (bool stream : {false, true})
    for (int c = 0; c < kCalls; ++c) {
      if (!only.empty() && only != kCallNames[c]) continue;
      for (int a : {0, 1}) run_case(comm, static_cast<Call>(c), stream, a);
    }

  MPI_Comm_free(&comm);
  check(cu("races") == races0, "the fake driver saw no race");
  check(cu("errors") == 0, "the fake driver returned no error");
  api.stream_destroy(g_stream);
  delete g_gate;
  g_gate = nullptr;
  api.runtime_fini();
  int counts[2] = {g_pass, g_fail}, total[2] = {0, 0};
  MPI_Reduce(counts, total, 2, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
  MPI_Finalize();
  bool clean = true;
  for (const char* gauge : {"ctx_refs", "live_streams", "live_events", "live_async_allocs", "live_allocs",
                            "live_host_allocs", "pending_waits"})
    if (cu(gauge) != 0) {
      std::fprintf(stderr, "[rank %d] FAIL: after MPI_Finalize, %s = %llu (want 0)\n", g_rank, gauge, cu(gauge));
      clean = false;
    }
  if (g_rank == 0)
    std::printf("progress_waits (%s, %d ranks%s): %d passed, %d failed\n", g_route.c_str(), g_size,
                g_defer ? ", deferred stream work" : "", total[0], total[1]);
  return total[1] == 0 && g_fail == 0 && clean ? 0 : 1;
}
