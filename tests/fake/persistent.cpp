// Persistent collectives (MPI 4.0 MPI_*_init; Open MPI 4.1 MPIX_*_init) under streamcoll:
// every collective streamcoll routes, initialised once, started PERSIST_STARTS times
// (default 100) with new inputs each time, every value checked against what this program
// computes itself. The fake CUDA driver (tests/fake) provides GPU memory and streams;
// streamcoll is preloaded.
//
// Each round starts all of them with one MPI_Startall together with an ordinary persistent
// send/receive pair of the MPI's (a ring) and an ordinary MPI_Iallreduce, then completes the
// whole array by one of five forms in turn: MPI_Waitall; MPI_Wait on each; MPI_Testall
// polled (MPI_Test on each under MPICH: below); MPI_Waitany until MPI_UNDEFINED (under MPICH
// n times on a copy: below); MPI_Testsome polled until MPI_UNDEFINED (the same). Round 0
// also polls MPI_Request_get_status first. After every round each persistent handle is
// still the handle MPI_*_init gave (never MPI_REQUEST_NULL), and a wait on the inactive
// handles returns at once.
//
// Modes (argv[1]): buffers and streams per rank
//   host          host memory everywhere
//   device        GPU memory everywhere, no stream (classic CUDA-aware semantics)
//   stream        GPU memory and a stream attached on every rank: starts stream-ordered (the
//                 program syncs the stream after completion before reading)
//   mixed         even ranks GPU memory, odd ranks host memory
//   stream-mixed  even ranks GPU memory with a stream, odd ranks GPU memory without
// Environment: PERSIST_ROUTE=r  the statistics must show every start of an allreduce on
//                               route r (MPI_Iallreduce calls on r >= the starts)
//              PERSIST_MISUSE=1 also: MPI_Start of an active request and MPI_Request_free
//                               of an active one fail with MPI_ERR_REQUEST (streamcoll's
//                               own requests; the MPI's may behave otherwise)
//              PERSIST_FREED=1  also: a persistent allreduce on a duplicate communicator
//                               freed before its starts (MPI allows it; Open MPI 4.1's own
//                               persistent collectives crash in libnbc's start then, so
//                               only where streamcoll routes the starts)
//              PERSIST_BENCH=1  instead: the benchmark (bench() below; scripts/bench-persistent.sh)
// Also, in every mode: init and free without a start. Exit status 0 when every check
// passed.
#include <algorithm>
#include <functional>
#include <memory>

#include "harness.hpp"
#include "streamcoll/streamext.h"

#if defined(OPEN_MPI) && OPEN_MPI
#include <mpi-ext.h>
#define PCOLL(name) MPIX_##name
#else
#define PCOLL(name) MPI_##name
#endif

namespace {

std::string g_mode;
struct CUstream_st* g_stream = nullptr;
bool g_gpu = false;     // this rank's buffers are in GPU memory
bool g_attach = false;  // this rank attaches a stream

void* alloc(size_t bytes) {
  bytes = bytes ? bytes : 8;
  return g_gpu ? api.malloc_device(0, bytes) : std::calloc(1, bytes);
}
void release(void* p) {
  if (g_gpu) api.free(p);
  else std::free(p);
}
// The host touches a buffer: with GPU memory, the fake driver checks no stream work on it
// is pending (a race otherwise).
void touch(const void* p, size_t bytes, bool write) {
  if (g_gpu) api.host_access(p, bytes, write ? 1 : 0);
}

// The input of element j on rank r in round k (exact in double and int).
int value(int r, int j, int k) { return (r + 1) * 100 + j % 97 + 3 * k; }

// One persistent collective: its buffers, its request, and how to fill and check them.
struct Case {
  std::string name;
  MPI_Request req = MPI_REQUEST_NULL;
  MPI_Request handle = MPI_REQUEST_NULL;  // as init gave it
  std::vector<void*> bufs;
  std::vector<int> counts, displs;  // a v-variant's arrays: MPI says they stay until the free
  std::function<void(int)> fill;
  std::function<void(int)> verify;
  ~Case() {
    for (void* p : bufs) release(p);
  }
};

constexpr int kN = 96;  // elements per rank

template <class T>
T* buf(Case& c, size_t n) {
  auto* p = static_cast<T*>(alloc(n * sizeof(T)));
  c.bufs.push_back(p);
  return p;
}

template <class T>
void write(T* p, size_t n, int k, int r) {
  touch(p, n * sizeof(T), true);
  for (size_t j = 0; j < n; ++j) p[j] = static_cast<T>(value(r, static_cast<int>(j), k));
}

void add_cases(std::vector<std::unique_ptr<Case>>& cases, MPI_Comm comm) {
  const int n = kN, P = g_size, me = g_rank;
  {  // allreduce, double sum
    auto c = std::make_unique<Case>();
    c->name = "allreduce";
    double* s = buf<double>(*c, n);
    double* r = buf<double>(*c, n);
    c->fill = [=](int k) { write(s, n, k, me); };
    c->verify = [=, cp = c.get()](int k) {
      touch(r, n * sizeof(double), false);
      for (int j = 0; j < n; ++j) {
        double want = 0;
        for (int q = 0; q < P; ++q) want += value(q, j, k);
        if (!check(r[j] == want, cp->name + " round " + std::to_string(k))) break;
      }
    };
    check(PCOLL(Allreduce_init)(s, r, n, MPI_DOUBLE, MPI_SUM, comm, MPI_INFO_NULL, &c->req) ==
              MPI_SUCCESS, "MPI_Allreduce_init");
    cases.push_back(std::move(c));
  }
  {  // allreduce in place, int max
    auto c = std::make_unique<Case>();
    c->name = "allreduce-in-place-max";
    int* r = buf<int>(*c, n);
    c->fill = [=](int k) { write(r, n, k, me); };
    c->verify = [=, cp = c.get()](int k) {
      touch(r, n * sizeof(int), false);
      for (int j = 0; j < n; ++j)
        if (!check(r[j] == value(P - 1, j, k), cp->name + " round " + std::to_string(k))) break;
    };
    check(PCOLL(Allreduce_init)(MPI_IN_PLACE, r, n, MPI_INT, MPI_MAX, comm, MPI_INFO_NULL,
                                &c->req) == MPI_SUCCESS, "MPI_Allreduce_init in place");
    cases.push_back(std::move(c));
  }
  {  // reduce to the last rank, double sum
    auto c = std::make_unique<Case>();
    c->name = "reduce";
    double* s = buf<double>(*c, n);
    double* r = buf<double>(*c, n);
    const int root = P - 1;
    c->fill = [=](int k) { write(s, n, k, me); };
    c->verify = [=, cp = c.get()](int k) {
      if (me != root) return;
      touch(r, n * sizeof(double), false);
      for (int j = 0; j < n; ++j) {
        double want = 0;
        for (int q = 0; q < P; ++q) want += value(q, j, k);
        if (!check(r[j] == want, cp->name + " round " + std::to_string(k))) break;
      }
    };
    check(PCOLL(Reduce_init)(s, r, n, MPI_DOUBLE, MPI_SUM, root, comm, MPI_INFO_NULL, &c->req) ==
              MPI_SUCCESS, "MPI_Reduce_init");
    cases.push_back(std::move(c));
  }
  {  // bcast from the middle rank
    auto c = std::make_unique<Case>();
    c->name = "bcast";
    int* b = buf<int>(*c, n);
    const int root = P / 2;
    c->fill = [=](int k) {
      if (me == root) write(b, n, k, me);
      else write(b, n, k + 1000, me);  // overwritten by the root's
    };
    c->verify = [=, cp = c.get()](int k) {
      touch(b, n * sizeof(int), false);
      for (int j = 0; j < n; ++j)
        if (!check(b[j] == value(root, j, k), cp->name + " round " + std::to_string(k))) break;
    };
    check(PCOLL(Bcast_init)(b, n, MPI_INT, root, comm, MPI_INFO_NULL, &c->req) == MPI_SUCCESS,
          "MPI_Bcast_init");
    cases.push_back(std::move(c));
  }
  {  // allgather
    auto c = std::make_unique<Case>();
    c->name = "allgather";
    int* s = buf<int>(*c, n);
    int* r = buf<int>(*c, static_cast<size_t>(n) * P);
    c->fill = [=](int k) { write(s, n, k, me); };
    c->verify = [=, cp = c.get()](int k) {
      touch(r, sizeof(int) * n * P, false);
      for (int q = 0; q < P; ++q)
        for (int j = 0; j < n; ++j)
          if (!check(r[q * n + j] == value(q, j, k), cp->name + " round " + std::to_string(k)))
            return;
    };
    check(PCOLL(Allgather_init)(s, n, MPI_INT, r, n, MPI_INT, comm, MPI_INFO_NULL, &c->req) ==
              MPI_SUCCESS, "MPI_Allgather_init");
    cases.push_back(std::move(c));
  }
  {  // allgatherv: rank q sends q + 1 elements
    auto c = std::make_unique<Case>();
    c->name = "allgatherv";
    std::vector<int>& counts = c->counts;
    std::vector<int>& displs = c->displs;
    counts.resize(P);
    displs.resize(P);
    int total = 0;
    for (int q = 0; q < P; ++q) {
      counts[q] = q + 1;
      displs[q] = total;
      total += q + 1;
    }
    double* s = buf<double>(*c, me + 1);
    double* r = buf<double>(*c, total);
    c->fill = [=](int k) { write(s, me + 1, k, me); };
    c->verify = [=, cp = c.get()](int k) {
      touch(r, sizeof(double) * total, false);
      for (int q = 0, at = 0; q < P; at += q + 1, ++q)
        for (int j = 0; j <= q; ++j)
          if (!check(r[at + j] == value(q, j, k), cp->name + " round " + std::to_string(k)))
            return;
    };
    check(PCOLL(Allgatherv_init)(s, me + 1, MPI_DOUBLE, r, counts.data(), displs.data(),
                                 MPI_DOUBLE, comm, MPI_INFO_NULL, &c->req) == MPI_SUCCESS,
          "MPI_Allgatherv_init");
    cases.push_back(std::move(c));
  }
  {  // reduce_scatter_block, double sum
    auto c = std::make_unique<Case>();
    c->name = "reduce_scatter_block";
    double* s = buf<double>(*c, static_cast<size_t>(n) * P);
    double* r = buf<double>(*c, n);
    c->fill = [=](int k) { write(s, static_cast<size_t>(n) * P, k, me); };
    c->verify = [=, cp = c.get()](int k) {
      touch(r, n * sizeof(double), false);
      for (int j = 0; j < n; ++j) {
        double want = 0;
        for (int q = 0; q < P; ++q) want += value(q, me * n + j, k);
        if (!check(r[j] == want, cp->name + " round " + std::to_string(k))) break;
      }
    };
    check(PCOLL(Reduce_scatter_block_init)(s, r, n, MPI_DOUBLE, MPI_SUM, comm, MPI_INFO_NULL,
                                           &c->req) == MPI_SUCCESS,
          "MPI_Reduce_scatter_block_init");
    cases.push_back(std::move(c));
  }
  {  // reduce_scatter, int sum, rank q receives q % 2 + 1 elements
    auto c = std::make_unique<Case>();
    c->name = "reduce_scatter";
    std::vector<int>& counts = c->counts;
    counts.resize(P);
    int total = 0, mine_at = 0;
    for (int q = 0; q < P; ++q) {
      counts[q] = q % 2 + 1;
      if (q == me) mine_at = total;
      total += counts[q];
    }
    const int mine = counts[me];
    int* s = buf<int>(*c, total);
    int* r = buf<int>(*c, mine);
    c->fill = [=](int k) { write(s, total, k, me); };
    c->verify = [=, cp = c.get()](int k) {
      touch(r, sizeof(int) * mine, false);
      for (int j = 0; j < mine; ++j) {
        int want = 0;
        for (int q = 0; q < P; ++q) want += value(q, mine_at + j, k);
        if (!check(r[j] == want, cp->name + " round " + std::to_string(k))) break;
      }
    };
    check(PCOLL(Reduce_scatter_init)(s, r, counts.data(), MPI_INT, MPI_SUM, comm, MPI_INFO_NULL,
                                     &c->req) == MPI_SUCCESS, "MPI_Reduce_scatter_init");
    cases.push_back(std::move(c));
  }
  {  // alltoall
    auto c = std::make_unique<Case>();
    c->name = "alltoall";
    const int m = 8;
    int* s = buf<int>(*c, static_cast<size_t>(m) * P);
    int* r = buf<int>(*c, static_cast<size_t>(m) * P);
    c->fill = [=](int k) { write(s, static_cast<size_t>(m) * P, k, me); };
    c->verify = [=, cp = c.get()](int k) {
      touch(r, sizeof(int) * m * P, false);
      for (int q = 0; q < P; ++q)
        for (int j = 0; j < m; ++j)
          if (!check(r[q * m + j] == value(q, me * m + j, k), cp->name + " round " + std::to_string(k)))
            return;
    };
    check(PCOLL(Alltoall_init)(s, m, MPI_INT, r, m, MPI_INT, comm, MPI_INFO_NULL, &c->req) ==
              MPI_SUCCESS, "MPI_Alltoall_init");
    cases.push_back(std::move(c));
  }
  {  // barrier
    auto c = std::make_unique<Case>();
    c->name = "barrier";
    c->fill = [](int) {};
    c->verify = [](int) {};
    check(PCOLL(Barrier_init)(comm, MPI_INFO_NULL, &c->req) == MPI_SUCCESS, "MPI_Barrier_init");
    cases.push_back(std::move(c));
  }
  for (auto& c : cases) {
    c->handle = c->req;
    check(c->req != MPI_REQUEST_NULL, c->name + ": init gave a request");
  }
}

// Completes every request of `reqs` by form `how`; returns how many completions were seen.
int complete(std::vector<MPI_Request>& reqs, int how) {
  const int n = static_cast<int>(reqs.size());
  int done = 0;
  switch (how) {
    case 0:
      check(MPI_Waitall(n, reqs.data(), MPI_STATUSES_IGNORE) == MPI_SUCCESS, "MPI_Waitall");
      return n;
    case 1:
      for (auto& r : reqs) check(MPI_Wait(&r, MPI_STATUS_IGNORE) == MPI_SUCCESS, "MPI_Wait");
      return n;
    case 2:
#if defined(MPICH_VERSION)
      // MPICH 4.0's MPI_Testall returns MPI_ERR_IN_STATUS, every status MPI_SUCCESS, for an
      // array holding a persistent collective request of its own (seen without streamcoll):
      // MPI_Test polled on each instead.
      for (auto& r : reqs)
        for (int flag = 0; !flag;)
          if (!check(MPI_Test(&r, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS, "MPI_Test")) break;
      return n;
#endif
      for (int flag = 0; !flag;)
        if (!check(MPI_Testall(n, reqs.data(), &flag, MPI_STATUSES_IGNORE) == MPI_SUCCESS, "MPI_Testall"))
          break;
      return n;
    case 3:
#if defined(MPICH_VERSION)
      {
        // MPICH 4.0's MPI_Waitany returns an inactive persistent request as complete again
        // (seen without streamcoll): each completed one leaves a working copy of the array.
        std::vector<MPI_Request> w = reqs;
        for (int i = 0; i < n; ++i) {
          int index = 0;
          if (!check(MPI_Waitany(n, w.data(), &index, MPI_STATUS_IGNORE) == MPI_SUCCESS &&
                         index != MPI_UNDEFINED, "MPI_Waitany"))
            break;
          reqs[index] = w[index];  // null for the ordinary request, else the persistent handle
          w[index] = MPI_REQUEST_NULL;
          ++done;
        }
        return done;
      }
#endif
      for (;;) {
        int index = 0;
        if (!check(MPI_Waitany(n, reqs.data(), &index, MPI_STATUS_IGNORE) == MPI_SUCCESS, "MPI_Waitany"))
          break;
        if (index == MPI_UNDEFINED) break;
        if (!check(++done <= n, "MPI_Waitany: no more completions than requests")) break;
      }
      return done;
    default:
      std::vector<int> idx(n);
#if defined(MPICH_VERSION)
      {
        // MPICH 4.0's MPI_Testsome, as its MPI_Waitany: a working copy (above).
        std::vector<MPI_Request> w = reqs;
        while (done < n) {
          int out = 0;
          if (!check(MPI_Testsome(n, w.data(), &out, idx.data(), MPI_STATUSES_IGNORE) == MPI_SUCCESS &&
                         out != MPI_UNDEFINED, "MPI_Testsome"))
            break;
          for (int i = 0; i < out; ++i) {
            reqs[idx[i]] = w[idx[i]];
            w[idx[i]] = MPI_REQUEST_NULL;
          }
          done += out;
        }
        return done;
      }
#endif
      for (;;) {
        int out = 0;
        if (!check(MPI_Testsome(n, reqs.data(), &out, idx.data(), MPI_STATUSES_IGNORE) == MPI_SUCCESS,
                   "MPI_Testsome"))
          break;
        if (out == MPI_UNDEFINED) break;
        done += out;
        if (!check(done <= n, "MPI_Testsome: no more completions than requests")) break;
      }
      return done;
  }
}

void rounds(std::vector<std::unique_ptr<Case>>& cases, int starts) {
  // The MPI's own persistent requests and an ordinary non-blocking call beside them.
  int out = 0, in = -1, ia = 0, ia_sum = 0;
  MPI_Request send = MPI_REQUEST_NULL, recv = MPI_REQUEST_NULL;
  MPI_Send_init(&out, 1, MPI_INT, (g_rank + 1) % g_size, 7, MPI_COMM_WORLD, &send);
  MPI_Recv_init(&in, 1, MPI_INT, (g_rank + g_size - 1) % g_size, 7, MPI_COMM_WORLD, &recv);
  for (int k = 0; k < starts; ++k) {
    for (auto& c : cases) c->fill(k);
    out = g_rank * 1000 + k;
    std::vector<MPI_Request> reqs;
    for (auto& c : cases) reqs.push_back(c->req);
    reqs.push_back(send);
    reqs.push_back(recv);
    check(MPI_Startall(static_cast<int>(reqs.size()), reqs.data()) == MPI_SUCCESS, "MPI_Startall");
    ia = k + g_rank;
    MPI_Request ireq = MPI_REQUEST_NULL;
    MPI_Iallreduce(&ia, &ia_sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &ireq);
    reqs.push_back(ireq);
    if (k == 0) {
      for (int flag = 0; !flag;)
        check(MPI_Request_get_status(reqs[0], &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS,
              "MPI_Request_get_status");
    }
    const int n = static_cast<int>(reqs.size());
    check(complete(reqs, k % 5) == n, "every request completed once (form " + std::to_string(k % 5) + ")");
    for (size_t i = 0; i < cases.size(); ++i)
      check(reqs[i] == cases[i]->handle, cases[i]->name + ": the persistent handle is kept");
    check(reqs[cases.size()] == send && reqs[cases.size() + 1] == recv, "the MPI's persistent handles kept");
    check(reqs[cases.size() + 2] == MPI_REQUEST_NULL, "the ordinary request freed");
    if (g_attach) api.stream_sync(g_stream);
    for (auto& c : cases) c->verify(k);
    check(in == ((g_rank + g_size - 1) % g_size) * 1000 + k, "the ring's value");
    int want = 0;
    for (int q = 0; q < g_size; ++q) want += k + q;
    check(ia_sum == want, "MPI_Iallreduce beside them");
    // Inactive now: a wait returns at once.
    std::vector<MPI_Request> again;
    for (auto& c : cases) again.push_back(c->req);
    check(MPI_Waitall(static_cast<int>(again.size()), again.data(), MPI_STATUSES_IGNORE) == MPI_SUCCESS,
          "MPI_Waitall on inactive requests");
  }
  MPI_Request_free(&send);
  MPI_Request_free(&recv);
}

// MPI_Start of an active request, and MPI_Request_free of one, are errors (MPI_ERR_REQUEST).
void misuse(Case& c, MPI_Comm comm) {
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  c.fill(1000);
  check(MPI_Start(&c.req) == MPI_SUCCESS, "start");
  int cls = 0;
  MPI_Error_class(MPI_Start(&c.req), &cls);
  check(cls == MPI_ERR_REQUEST, c.name + ": MPI_Start of an active request: MPI_ERR_REQUEST");
  MPI_Request copy = c.req;
  MPI_Error_class(MPI_Request_free(&copy), &cls);
  check(cls == MPI_ERR_REQUEST, c.name + ": MPI_Request_free of an active request: MPI_ERR_REQUEST");
  check(MPI_Wait(&c.req, MPI_STATUS_IGNORE) == MPI_SUCCESS && c.req == c.handle, "wait after misuse");
  if (g_attach) api.stream_sync(g_stream);
  c.verify(1000);
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_ARE_FATAL);
}

// A persistent allreduce whose communicator is freed before its starts.
void freed_comm() {
  MPI_Comm dup;
  MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  if (g_attach) streamcoll_comm_attach_stream(dup, g_stream);
  Case c;
  c.name = "allreduce on a freed communicator";
  int* s = buf<int>(c, kN);
  int* r = buf<int>(c, kN);
  MPI_Request req = MPI_REQUEST_NULL;
  check(PCOLL(Allreduce_init)(s, r, kN, MPI_INT, MPI_SUM, dup, MPI_INFO_NULL, &req) == MPI_SUCCESS,
        "init on the duplicate");
  MPI_Comm_free(&dup);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  for (int k = 0; k < 3; ++k) {
    write(s, kN, k, g_rank);
    const int rc = MPI_Start(&req);
#if defined(OPEN_MPI) && OPEN_MPI
    // Open MPI 4.1 deletes the communicator's state at MPI_Comm_free: streamcoll fails the
    // start on every rank (the MPI's own persistent collectives crash there).
    int cls = 0;
    MPI_Error_class(rc, &cls);
    check(cls == MPI_ERR_COMM, "start after MPI_Comm_free (Open MPI): MPI_ERR_COMM");
    check(MPI_Wait(&req, MPI_STATUS_IGNORE) == MPI_SUCCESS && req != MPI_REQUEST_NULL,
          "wait on the failed start returns at once");
    continue;
#endif
    check(rc == MPI_SUCCESS, "start after MPI_Comm_free");
    check(MPI_Wait(&req, MPI_STATUS_IGNORE) == MPI_SUCCESS, "wait after MPI_Comm_free");
    if (g_attach) api.stream_sync(g_stream);
    touch(r, kN * sizeof(int), false);
    for (int j = 0; j < kN; ++j) {
      int want = 0;
      for (int q = 0; q < g_size; ++q) want += value(q, j, k);
      if (!check(r[j] == want, c.name)) break;
    }
  }
  check(MPI_Request_free(&req) == MPI_SUCCESS && req == MPI_REQUEST_NULL, "free after MPI_Comm_free");
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
}

// bench: this process's host time per call (median of PERSIST_STARTS rounds, each timed
// alone: no barrier before it) of an allreduce of `n` doubles three ways: the blocking
// MPI_Allreduce, MPI_Iallreduce + MPI_Wait, and MPI_Start + MPI_Wait of a persistent one
// on the same buffers. One line per form on rank 0.
void bench(MPI_Comm comm, int rounds) {
  for (int n : {1, 1024}) {
    auto* s = static_cast<double*>(alloc(n * sizeof(double)));
    auto* r = static_cast<double*>(alloc(n * sizeof(double)));
    write(s, n, 0, g_rank);
    MPI_Request p = MPI_REQUEST_NULL;
    PCOLL(Allreduce_init)(s, r, n, MPI_DOUBLE, MPI_SUM, comm, MPI_INFO_NULL, &p);
    const char* forms[] = {"blocking", "nonblocking", "persistent"};
    for (int form = 0; form < 3; ++form) {
      std::vector<double> t;
      for (int k = 0; k < rounds; ++k) {
        const double t0 = MPI_Wtime();
        if (form == 0) {
          MPI_Allreduce(s, r, n, MPI_DOUBLE, MPI_SUM, comm);
        } else {
          MPI_Request q = p;
          if (form == 1) MPI_Iallreduce(s, r, n, MPI_DOUBLE, MPI_SUM, comm, &q);
          else MPI_Start(&q);
          MPI_Wait(&q, MPI_STATUS_IGNORE);
        }
        t.push_back(MPI_Wtime() - t0);
      }
      if (g_attach) api.stream_sync(g_stream);
      std::sort(t.begin(), t.end());
      if (g_rank == 0)
        std::printf("bench %s ranks=%d bytes=%zu form=%s median_us=%.2f p90_us=%.2f\n",
                    g_mode.c_str(), g_size, n * sizeof(double), forms[form], t[t.size() / 2] * 1e6,
                    t[t.size() * 9 / 10] * 1e6);
    }
    MPI_Request_free(&p);
    release(s);
    release(r);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  g_mode = argc > 1 ? argv[1] : "host";
  const bool known = g_mode == "host" || g_mode == "device" || g_mode == "stream" ||
                     g_mode == "mixed" || g_mode == "stream-mixed";
  int ok = known && load_api(false) ? 1 : 0, all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all_ok) {
    if (g_rank == 0) std::fprintf(stderr, "persistent: unknown mode '%s', or no fake driver\n", g_mode.c_str());
    MPI_Finalize();
    return 1;
  }
  check(api.runtime_init() == 0, "runtime init");
  g_stream = api.stream_create(1 /* CU_STREAM_NON_BLOCKING */);
  const bool even = g_rank % 2 == 0;
  g_gpu = g_mode == "device" || g_mode == "stream" || g_mode == "stream-mixed" ||
          (g_mode == "mixed" && even);
  g_attach = g_mode == "stream" || (g_mode == "stream-mixed" && even);
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  if (g_attach) check(streamcoll_comm_attach_stream(comm, g_stream) == MPI_SUCCESS, "attach");
  const char* s = std::getenv("PERSIST_STARTS");
  const int starts = s ? std::atoi(s) : 100;
  if (std::getenv("PERSIST_BENCH")) {
    bench(comm, starts);
    MPI_Comm_free(&comm);
    MPI_Finalize();
    return 0;
  }
  const char* route = std::getenv("PERSIST_ROUTE");
  const unsigned long long routed0 = route ? stat_calls("iallreduce", route, nullptr) : 0;
  {
    std::vector<std::unique_ptr<Case>> cases;
    add_cases(cases, comm);
    rounds(cases, starts);
    if (route)
      check(stat_calls("iallreduce", route, nullptr) - routed0 >= 2ull * starts,
            std::string("the allreduce starts took route ") + route);
    const char* m = std::getenv("PERSIST_MISUSE");
    if (m && std::atoi(m)) misuse(*cases[0], comm);
    for (auto& c : cases) {
      check(MPI_Request_free(&c->req) == MPI_SUCCESS, c->name + ": free");
      check(c->req == MPI_REQUEST_NULL, c->name + ": freed handle is null");
    }
  }
  {  // init and free without a start
    std::vector<std::unique_ptr<Case>> cases;
    add_cases(cases, comm);
    for (auto& c : cases) check(MPI_Request_free(&c->req) == MPI_SUCCESS, c->name + ": free unstarted");
  }
  const char* f = std::getenv("PERSIST_FREED");
  if (f && std::atoi(f)) freed_comm();
  MPI_Comm_free(&comm);
  int fails = g_fail, all = 0;
  MPI_Allreduce(&fails, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (g_rank == 0)
    std::printf("persistent %s (%d ranks, %d starts): %s, %d checks on rank 0\n", g_mode.c_str(),
                g_size, starts, all ? "FAILED" : "OK", g_pass);
  api.stream_destroy(g_stream);
  MPI_Finalize();
  return all ? 1 : 0;
}
