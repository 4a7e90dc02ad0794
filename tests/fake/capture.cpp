// Stream-ordered collectives captured into a CUDA graph and replayed (shim/capture.hpp).
// A plain MPI program on the CUDA driver API, found with dlopen("libcuda.so.1"), so the
// same program runs against the fake driver (tests/fake) and on a GPU; streamcoll
// preloaded, the route chosen by STREAMCOLL_ROUTE.
//
// A step: for each collective, a copy of this launch's input from pinned host memory to
// the GPU, the collective on the communicator's attached stream, a copy of the result back.
// Modes (argv[1]):
//   all    every rank captures the step once and launches it 50 times, new inputs each
//          time, every value checked against the reduction computed here;
//   mixed  even ranks replay a graph, odd ranks make the same calls live, 50 times;
//   abort  a capture invalidated by an illegal query (cuStreamQuery on the capturing
//          stream) ends with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, and a collective
//          recorded into an invalidated capture fails with an MPI error (1 rank);
//          streamcoll is usable afterwards (live and captured steps exact);
//   freed  the communicator of a captured step is freed before the graph is launched
//          (every rank): the launch skips the calls, with a message, and does not hang;
//   inject every rank replays; before launch 3, the fake driver is told to fail rank 1's next
//          kernel launch (route nvgroup: its replayed allreduce): no rank hangs, the first
//          live call after that launch reports an error on every rank, and the steps after
//          it, live and replayed, are exact (fake driver only: skipped on a GPU);
//   crossed two communicators A and B, each with its own stream and a graph of the step;
//          at each launch even ranks launch A's graph then B's, odd ranks B's then A's
//          (each communicator's launches in one order everywhere, as the rules ask; the
//          two in different orders on different ranks), both streams synchronised, every
//          value checked; then the same with live calls in one order; no rank may hang;
//   threads two threads, each with its own communicator and stream, capturing and launching
//          its own graph 50 times (MPI_THREAD_MULTIPLE), values checked per thread;
//   threads-mixed  the same, but thread t replays where rank + t is even and calls live
//          where it is odd;
//   classic while a second thread holds a capture open in global mode on a stream of its own,
//          classic calls (no stream attached) on GPU buffers, at first use of their
//          route, exact; the capture is not invalidated and its graph runs (its stream
//          a blocking one with CAPTURE_BLOCKING=1: then the legacy stream may not be used);
//   bench  host time of a step of K small allreduces, live and replayed (no checks;
//          scripts/bench-capture.sh);
//   bench-classic  host time of a classic MPI_Allreduce of 8 doubles on GPU buffers (no
//          stream attached), median of 2000 (the price of the capture-mode guard).
// Modes crossed and threads*: CAPTURE_ROUNDS=R (default 1) runs the mode R times, on new
// communicators each round (a hang that comes one run in two comes in 1 - 2^-R); the
// replay lanes (one thread per communicator with captured calls: streamcoll_capture_counts)
// are checked: one started per communicator captured on, none left once they are freed.
// CAPTURE_PERSISTENT=1 adds a persistent allreduce to the step (initialised once per
// communicator before any capture, MPI_Start + MPI_Wait in the step, its handle checked).
// Exit status 0 when every check passed.
#include <cuda.h>
#include <dlfcn.h>
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "streamcoll/streamext.h"

#if defined(OPEN_MPI) && OPEN_MPI
#include <mpi-ext.h>
#define PCOLL(name) MPIX_##name
#else
#define PCOLL(name) MPI_##name
#endif

namespace {

int g_rank = 0, g_size = 1;
std::atomic<int> g_fail{0}, g_pass{0};  // (modes threads*: checks from two threads)

bool check(bool ok, const std::string& what) {
  if (ok) {
    ++g_pass;
  } else if (++g_fail <= 20) {
    std::fprintf(stderr, "[rank %d] FAIL: %s\n", g_rank, what.c_str());
  }
  return ok;
}

// The driver entry points the program uses, by the symbols cuda.h maps them to.
struct Cu {
#define CU_FN(name) decltype(&::name) name = nullptr;
#define CU_FNS(X)                                                                          \
  X(cuInit) X(cuDeviceGet) X(cuDeviceGetCount) X(cuDevicePrimaryCtxRetain) X(cuCtxPushCurrent)                 \
  X(cuStreamCreate) X(cuStreamSynchronize) X(cuStreamQuery) X(cuMemAlloc) X(cuMemFree)     \
  X(cuMemHostAlloc) X(cuMemFreeHost) X(cuMemcpyAsync) X(cuStreamBeginCapture)              \
  X(cuStreamEndCapture) X(cuGraphInstantiate) X(cuGraphLaunch) X(cuGraphExecDestroy)      \
  X(cuGraphDestroy) X(cuGetErrorString) X(cuCtxGetCurrent) X(cuCtxPopCurrent)
  CU_FNS(CU_FN)
#undef CU_FN
  bool load() {
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h) return false;
    bool ok = true;
#define STR2(x) #x
#define STR(x) STR2(x)
#define CU_LOAD(name) \
  ok = ok && (name = reinterpret_cast<decltype(name)>(dlsym(h, STR(name)))) != nullptr;
    CU_FNS(CU_LOAD)
#undef CU_LOAD
    return ok;
  }
} cu;

#define CU_OK(call)                                                                    \
  do {                                                                                 \
    CUresult r_ = (call);                                                              \
    if (r_ != CUDA_SUCCESS) {                                                          \
      const char* n_ = "?";                                                            \
      cu.cuGetErrorString(r_, &n_);                                                      \
      std::fprintf(stderr, "[rank %d] %s:%d %s: %s (%d)\n", g_rank, __FILE__, __LINE__, #call, n_, r_); \
      MPI_Abort(MPI_COMM_WORLD, 2);                                                    \
    }                                                                                  \
  } while (0)

constexpr int kN = 1000;  // elements per rank's block
constexpr int kLaunches = 50;

// One collective of the step: its pinned input/output and GPU buffers.
struct Case {
  const char* name;
  int in_elems, out_elems;
  double* h_in = nullptr;
  double* h_out = nullptr;
  CUdeviceptr d_in = 0, d_out = 0;
};

double input(int rank, int launch, int i) { return (rank + 1) * 1000.0 + launch * 7.0 + i % 97; }

// CAPTURE_PERSISTENT=1: the step also starts a persistent allreduce (MPI_Allreduce_init once
// per communicator, before any capture; MPI_Start and MPI_Wait in the step).
const bool g_persistent = std::getenv("CAPTURE_PERSISTENT") != nullptr;
std::map<MPI_Comm, MPI_Request> g_persistent_req;

std::vector<Case> make_cases() {
  std::vector<Case> cases = {{"allreduce", kN, kN},
                             {"iallreduce", kN, kN},
                             {"bcast", kN, kN},
                             {"allgather", kN, kN * g_size},
                             {"reduce_scatter_block", kN * g_size, kN},
                             {"reduce", kN, kN}};
  if (g_persistent) cases.push_back({"persistent", kN, kN});
  for (Case& c : cases) {
    CU_OK(cu.cuMemHostAlloc(reinterpret_cast<void**>(&c.h_in), c.in_elems * sizeof(double), 0));
    CU_OK(cu.cuMemHostAlloc(reinterpret_cast<void**>(&c.h_out), c.out_elems * sizeof(double), 0));
    CU_OK(cu.cuMemAlloc(&c.d_in, c.in_elems * sizeof(double)));
    CU_OK(cu.cuMemAlloc(&c.d_out, c.out_elems * sizeof(double)));
  }
  return cases;
}

void free_cases(std::vector<Case>& cases) {
  for (Case& c : cases) {
    cu.cuMemFree(c.d_in);
    cu.cuMemFree(c.d_out);
    cu.cuMemFreeHost(c.h_in);
    cu.cuMemFreeHost(c.h_out);
  }
  cases.clear();
}

void fill(std::vector<Case>& cases, int launch) {
  for (Case& c : cases) {
    for (int i = 0; i < c.in_elems; ++i) c.h_in[i] = input(g_rank, launch, i);
    for (int i = 0; i < c.out_elems; ++i) c.h_out[i] = -1;
  }
}

// The persistent allreduce of `cases` on comm, made once (collective: every rank calls
// this at the same point, never while capturing).
void init_persistent(std::vector<Case>& cases, MPI_Comm comm) {
  for (Case& c : cases) {
    if (std::string(c.name) != "persistent" || g_persistent_req.count(comm)) continue;
    MPI_Request& req = g_persistent_req[comm];
    check(PCOLL(Allreduce_init)(reinterpret_cast<void*>(c.d_in), reinterpret_cast<void*>(c.d_out), kN,
                                MPI_DOUBLE, MPI_SUM, comm, MPI_INFO_NULL, &req) == MPI_SUCCESS,
          "MPI_Allreduce_init");
  }
}

void free_persistent() {
  for (auto& [comm, req] : g_persistent_req) {
    MPI_Request h = req;
    check(MPI_Request_free(&req) == MPI_SUCCESS && req == MPI_REQUEST_NULL && h != MPI_REQUEST_NULL,
          "MPI_Request_free of the persistent allreduce");
  }
  g_persistent_req.clear();
}

// Collective c of the step on comm, from c.d_in into c.d_out.
int collective(Case& c, MPI_Comm comm) {
  void* in = reinterpret_cast<void*>(c.d_in);
  void* out = reinterpret_cast<void*>(c.d_out);
  const std::string n = c.name;
  if (n == "persistent") {
    MPI_Request& req = g_persistent_req.at(comm);  // (made before any thread starts)
    const MPI_Request h = req;
    int rc = MPI_Start(&req);
    if (rc == MPI_SUCCESS) rc = MPI_Wait(&req, MPI_STATUS_IGNORE);
    check(req == h && h != MPI_REQUEST_NULL, "the persistent handle is kept");
    return rc;
  }
  if (n == "allreduce") return MPI_Allreduce(in, out, kN, MPI_DOUBLE, MPI_SUM, comm);
  if (n == "iallreduce") {
    MPI_Request req;
    int rc = MPI_Iallreduce(in, out, kN, MPI_DOUBLE, MPI_MAX, comm, &req);
    return rc == MPI_SUCCESS ? MPI_Wait(&req, MPI_STATUS_IGNORE) : rc;
  }
  if (n == "bcast") return MPI_Bcast(out, kN, MPI_DOUBLE, 1 % g_size, comm);
  if (n == "allgather") return MPI_Allgather(in, kN, MPI_DOUBLE, out, kN, MPI_DOUBLE, comm);
  if (n == "reduce_scatter_block")
    return MPI_Reduce_scatter_block(in, out, kN, MPI_DOUBLE, MPI_SUM, comm);
  return MPI_Reduce(in, out, kN, MPI_DOUBLE, MPI_SUM, 0, comm);
}

// The step, on stream s (live, or recorded while s is captured), or with no stream
// attached to comm (classic calls), with s only for the program's copies, synchronised.
void step(std::vector<Case>& cases, MPI_Comm comm, CUstream s, bool classic = false) {
  for (Case& c : cases) {
    CU_OK(cu.cuMemcpyAsync(c.d_in, reinterpret_cast<CUdeviceptr>(c.h_in), c.in_elems * sizeof(double), s));
    // bcast: root 1 % size's input copied into the broadcast buffer first
    if (std::string(c.name) == "bcast") CU_OK(cu.cuMemcpyAsync(c.d_out, c.d_in, kN * sizeof(double), s));
    if (classic) CU_OK(cu.cuStreamSynchronize(s));
    const int rc = collective(c, comm);
    check(rc == MPI_SUCCESS, std::string(c.name) + " returned " + std::to_string(rc));
    CU_OK(cu.cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(c.h_out), c.d_out, c.out_elems * sizeof(double), s));
    if (classic) CU_OK(cu.cuStreamSynchronize(s));
  }
}

// The results of launch `launch`, against values computed here from every rank's input.
void verify(const std::vector<Case>& cases, int launch, const char* how) {
  for (const Case& c : cases) {
    const std::string n = c.name;
    int bad = 0;
    for (int i = 0; i < c.out_elems; ++i) {
      double want = 0;
      if (n == "allreduce" || n == "persistent" || (n == "reduce" && g_rank == 0)) {
        for (int r = 0; r < g_size; ++r) want += input(r, launch, i);
      } else if (n == "reduce") {
        continue;  // recvbuf insignificant off the root
      } else if (n == "iallreduce") {
        want = input(g_size - 1, launch, i);  // MPI_MAX: the last rank's is largest
      } else if (n == "bcast") {
        want = input(1 % g_size, launch, i);
      } else if (n == "allgather") {
        want = input(i / kN, launch, i % kN);
      } else {  // reduce_scatter_block: block g_rank of every rank's input, summed
        for (int r = 0; r < g_size; ++r) want += input(r, launch, g_rank * kN + i);
      }
      if (c.h_out[i] != want && bad++ == 0)
        check(false, std::string(how) + " launch " + std::to_string(launch) + ": " + n + "[" +
                         std::to_string(i) + "] = " + std::to_string(c.h_out[i]) + ", want " +
                         std::to_string(want));
    }
    if (!bad) check(true, n);
  }
}

CUgraphExec capture_step(std::vector<Case>& cases, MPI_Comm comm, CUstream s) {
  CUgraph g = nullptr;
  CUgraphExec ge = nullptr;
  init_persistent(cases, comm);
  CU_OK(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  step(cases, comm, s);
  CU_OK(cu.cuStreamEndCapture(s, &g));
  CU_OK(cu.cuGraphInstantiate(&ge, g, 0));
  CU_OK(cu.cuGraphDestroy(g));  // the executable graph keeps what it needs
  return ge;
}

// `launches` steps, replayed from a graph or made live; every value checked.
void run_steps(std::vector<Case>& cases, MPI_Comm comm, CUstream s, bool replay, int first) {
  init_persistent(cases, comm);
  CUgraphExec ge = replay ? capture_step(cases, comm, s) : nullptr;
  for (int k = first; k < first + kLaunches; ++k) {
    fill(cases, k);
    if (replay)
      CU_OK(cu.cuGraphLaunch(ge, s));
    else
      step(cases, comm, s);
    CU_OK(cu.cuStreamSynchronize(s));
    verify(cases, k, replay ? "replay" : "live");
  }
  if (ge) CU_OK(cu.cuGraphExecDestroy(ge));
}

MPI_Comm attached_dup(CUstream s) {
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  if (streamcoll_comm_attach_stream(comm, s) != MPI_SUCCESS) {
    std::fprintf(stderr, "[rank %d] streamcoll is not loaded\n", g_rank);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  return comm;
}

void aborted(std::vector<Case>& cases, MPI_Comm comm, CUstream s) {
  CU_OK(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  check(cu.cuStreamQuery(s) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "query during capture refused");
  if (g_size == 1) {  // one rank: no peer waits for the call that fails
    Case& c = cases[0];
    const int rc = MPI_Allreduce(reinterpret_cast<void*>(c.d_in), reinterpret_cast<void*>(c.d_out),
                                 kN, MPI_DOUBLE, MPI_SUM, comm);
    int cls = MPI_SUCCESS;
    MPI_Error_class(rc, &cls);
    check(rc != MPI_SUCCESS && cls == MPI_ERR_OTHER, "a call in an invalidated capture fails");
  }
  CUgraph g = nullptr;
  check(cu.cuStreamEndCapture(s, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED && !g,
        "the invalidated capture ends invalidated");
}

// mode inject: three exact launches, a failing one, then the communicator reports it once
// and works again.
void injected(std::vector<Case>& cases, MPI_Comm comm, CUstream s) {
  using fail_fn = int (*)(const char*, unsigned long long);
  auto fail_after = reinterpret_cast<fail_fn>(dlsym(RTLD_DEFAULT, "fake_cuda_fail_after"));
  if (!fail_after) {
    if (g_rank == 0) std::printf("inject: no fake driver to inject a failure into: skipped\n");
    return;
  }
  CUgraphExec ge = capture_step(cases, comm, s);
  for (int k = 0; k < 4; ++k) {
    fill(cases, k);
    if (k == 3 && g_rank == 1 % g_size) check(fail_after("cuLaunchKernel", 1) == 0, "failure armed");
    CU_OK(cu.cuGraphLaunch(ge, s));
    CU_OK(cu.cuStreamSynchronize(s));  // completes on every rank, failed or not
    if (k < 3) verify(cases, k, "replay before the failure");
  }
  CU_OK(cu.cuGraphExecDestroy(ge));
  // The failure, kept by the rank's replayed calls, is reported by the next call on the
  // communicator, on every rank (the failing rank's own, the others' from the kernels'
  // abort), and only once.
  Case& c = cases[0];
  void* in = reinterpret_cast<void*>(c.d_in);
  void* out = reinterpret_cast<void*>(c.d_out);
  int rc = MPI_Allreduce(in, out, kN, MPI_DOUBLE, MPI_SUM, comm);
  int cls = MPI_SUCCESS;
  MPI_Error_class(rc, &cls);
  check(rc != MPI_SUCCESS && cls != MPI_ERR_COMM && cls != MPI_ERR_ARG,
        "the call after the failed launch reports it (rc " + std::to_string(rc) + ")");
  rc = MPI_Allreduce(in, out, kN, MPI_DOUBLE, MPI_SUM, comm);
  check(rc == MPI_SUCCESS, "the failure is reported once");
  CU_OK(cu.cuStreamSynchronize(s));
  run_steps(cases, comm, s, false, 10);
  run_steps(cases, comm, s, true, 10 + kLaunches);
}

// mode classic: another thread's global capture survives classic calls on GPU buffers.
void classic_during_capture(std::vector<Case>& cases) {
  MPI_Comm plain;
  MPI_Comm_dup(MPI_COMM_WORLD, &plain);
  MPI_Comm_set_errhandler(plain, MPI_ERRORS_RETURN);
  std::atomic<int> phase{0};
  CUresult end_rc = CUDA_SUCCESS;
  CUdeviceptr marker = 0;
  CU_OK(cu.cuMemAlloc(&marker, sizeof(double)));
  double* h_marker = nullptr;
  CU_OK(cu.cuMemHostAlloc(reinterpret_cast<void**>(&h_marker), sizeof(double), 0));
  CUcontext ctx;
  CU_OK(cu.cuCtxGetCurrent(&ctx));
  std::thread capturer([&] {
    CU_OK(cu.cuCtxPushCurrent(ctx));
    CUstream s2;
    CU_OK(cu.cuStreamCreate(&s2, std::getenv("CAPTURE_BLOCKING") ? CU_STREAM_DEFAULT : CU_STREAM_NON_BLOCKING));
    CU_OK(cu.cuStreamBeginCapture(s2, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CU_OK(cu.cuMemcpyAsync(marker, reinterpret_cast<CUdeviceptr>(h_marker), sizeof(double), s2));
    phase = 1;
    while (phase.load() != 2) std::this_thread::yield();
    CUgraph g = nullptr;
    end_rc = cu.cuStreamEndCapture(s2, &g);
    if (end_rc == CUDA_SUCCESS) {
      CUgraphExec ge;
      *h_marker = 42;
      CU_OK(cu.cuGraphInstantiate(&ge, g, 0));
      CU_OK(cu.cuGraphLaunch(ge, s2));
      CU_OK(cu.cuStreamSynchronize(s2));
      CU_OK(cu.cuGraphExecDestroy(ge));
      CU_OK(cu.cuGraphDestroy(g));
    }
    CUcontext popped;
    cu.cuCtxPopCurrent(&popped);
  });
  CUstream copies;  // the program's own, for its copies around the calls
  CU_OK(cu.cuStreamCreate(&copies, CU_STREAM_NON_BLOCKING));
  while (phase.load() != 1) std::this_thread::yield();
  for (int k = 0; k < 3; ++k) {
    fill(cases, k);
    step(cases, plain, copies, true);
    verify(cases, k, "classic during another thread's capture");
  }
  phase = 2;
  capturer.join();
  check(end_rc == CUDA_SUCCESS, "the other thread's capture ends valid (" + std::to_string(end_rc) + ")");
  *h_marker = 0;
  CU_OK(cu.cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(h_marker), marker, sizeof(double), copies));
  CU_OK(cu.cuStreamSynchronize(copies));
  check(end_rc != CUDA_SUCCESS || *h_marker == 42, "its graph ran");
  cu.cuMemFree(marker);
  cu.cuMemFreeHost(h_marker);
  MPI_Comm_free(&plain);
}

// The lanes streamcoll started and has alive (streamcoll_capture_counts), or false when
// it is not loaded.
bool lane_counts(unsigned long long* started, unsigned long long* live) {
  using fn = void (*)(unsigned long long*, unsigned long long*, unsigned long long*,
                      unsigned long long*);
  auto counts = reinterpret_cast<fn>(dlsym(RTLD_DEFAULT, "streamcoll_capture_counts"));
  if (!counts) return false;
  counts(started, live, nullptr, nullptr);
  return true;
}

// After the communicators of a mode are freed: their lanes end (within 10 s).
void check_lanes_end(unsigned long long want_started) {
  unsigned long long started = 0, live = 1;
  if (!lane_counts(&started, &live)) return;
  for (int i = 0; i < 1000 && live != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    lane_counts(&started, &live);
  }
  check(started == want_started, "replay lanes started: " + std::to_string(started) + ", want " +
                                     std::to_string(want_started));
  check(live == 0, "replay lanes alive after MPI_Comm_free: " + std::to_string(live));
}

// mode crossed: communicators A (comm, s) and B, a graph each, launched in a rank-divergent
// order; B's inputs differ from A's (launch number + 1000), so a call matched across the
// two communicators shows.
void crossed(std::vector<Case>& a_cases, MPI_Comm a, CUstream sa) {
  CUstream sb;
  CU_OK(cu.cuStreamCreate(&sb, CU_STREAM_NON_BLOCKING));
  std::vector<Case> b_cases = make_cases();
  MPI_Comm b = attached_dup(sb);
  CUgraphExec ga = capture_step(a_cases, a, sa);  // captured in one order (persistent inits)
  CUgraphExec gb = capture_step(b_cases, b, sb);
  for (int k = 0; k < kLaunches; ++k) {
    fill(a_cases, k);
    fill(b_cases, k + 1000);
    if (g_rank % 2 == 0) {
      CU_OK(cu.cuGraphLaunch(ga, sa));
      CU_OK(cu.cuGraphLaunch(gb, sb));
    } else {
      CU_OK(cu.cuGraphLaunch(gb, sb));
      CU_OK(cu.cuGraphLaunch(ga, sa));
    }
    CU_OK(cu.cuStreamSynchronize(g_rank % 2 == 0 ? sb : sa));
    CU_OK(cu.cuStreamSynchronize(g_rank % 2 == 0 ? sa : sb));
    verify(a_cases, k, "crossed replay, A");
    verify(b_cases, k + 1000, "crossed replay, B");
  }
  CU_OK(cu.cuGraphExecDestroy(ga));
  CU_OK(cu.cuGraphExecDestroy(gb));
  // Live after the graphs, in one order (the replays are done: both streams synchronised).
  run_steps(a_cases, a, sa, false, kLaunches);
  run_steps(b_cases, b, sb, false, kLaunches + 1000);
  for (auto it = g_persistent_req.begin(); it != g_persistent_req.end();)
    if (it->first == b) {
      MPI_Request_free(&it->second);
      it = g_persistent_req.erase(it);
    } else {
      ++it;
    }
  MPI_Comm_free(&b);
  free_cases(b_cases);
}

// modes threads, threads-mixed: two threads, each on a communicator and stream of its own,
// its graph captured and launched by itself (or, threads-mixed, its calls made live where
// rank + thread is odd). Persistent requests are made before the threads start (in one
// order on every rank).
void threads(CUcontext ctx, bool mixed) {
  struct Side {
    CUstream s = nullptr;
    MPI_Comm comm = MPI_COMM_NULL;
    std::vector<Case> cases;
  } side[2];
  for (int t = 0; t < 2; ++t) {
    CU_OK(cu.cuStreamCreate(&side[t].s, CU_STREAM_NON_BLOCKING));
    side[t].cases = make_cases();
    side[t].comm = attached_dup(side[t].s);
    init_persistent(side[t].cases, side[t].comm);
  }
  std::thread worker[2];
  for (int t = 0; t < 2; ++t)
    worker[t] = std::thread([&, t] {
      CU_OK(cu.cuCtxPushCurrent(ctx));
      const bool replay = !mixed || (g_rank + t) % 2 == 0;
      run_steps(side[t].cases, side[t].comm, side[t].s, replay, t * 1000);
      CUcontext popped;
      cu.cuCtxPopCurrent(&popped);
    });
  for (std::thread& w : worker) w.join();
  for (Side& sd : side) {
    if (auto it = g_persistent_req.find(sd.comm); it != g_persistent_req.end()) {
      MPI_Request_free(&it->second);
      g_persistent_req.erase(it);
    }
    MPI_Comm_free(&sd.comm);
    free_cases(sd.cases);
  }
}

double now_us() { return MPI_Wtime() * 1e6; }

// bench: a step of K allreduces of 8 doubles on the stream, issued live or replayed from a
// graph; per step, the host time to issue it (the calls, or cuGraphLaunch) and to the end
// of the step (the stream synchronised), median of `reps` steps, on rank 0.
void bench(MPI_Comm comm, CUstream s) {
  const int reps = 200;
  CUdeviceptr buf;
  CU_OK(cu.cuMemAlloc(&buf, 64 * 8 * sizeof(double)));
  if (g_rank == 0) std::printf("%-6s %4s %14s %14s %16s\n", "mode", "K", "issue_us/step", "step_us", "issue_us/call");
  for (int k : {1, 4, 16, 64}) {
    auto issue = [&] {
      for (int j = 0; j < k; ++j) {
        void* p = reinterpret_cast<void*>(buf + j * 8 * sizeof(double));
        MPI_Allreduce(MPI_IN_PLACE, p, 8, MPI_DOUBLE, MPI_SUM, comm);
      }
    };
    for (bool replay : {false, true}) {
      CUgraphExec ge = nullptr;
      if (replay) {
        CUgraph g;
        CU_OK(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
        issue();
        CU_OK(cu.cuStreamEndCapture(s, &g));
        CU_OK(cu.cuGraphInstantiate(&ge, g, 0));
        CU_OK(cu.cuGraphDestroy(g));
      }
      std::vector<double> iss, tot;
      for (int r = 0; r < reps; ++r) {
        const double t0 = now_us();
        if (replay)
          CU_OK(cu.cuGraphLaunch(ge, s));
        else
          issue();
        const double t1 = now_us();
        CU_OK(cu.cuStreamSynchronize(s));
        const double t2 = now_us();
        iss.push_back(t1 - t0);
        tot.push_back(t2 - t0);
      }
      if (ge) CU_OK(cu.cuGraphExecDestroy(ge));
      std::sort(iss.begin(), iss.end());
      std::sort(tot.begin(), tot.end());
      if (g_rank == 0)
        std::printf("%-6s %4d %14.2f %14.2f %16.3f\n", replay ? "replay" : "live", k, iss[reps / 2],
                    tot[reps / 2], iss[reps / 2] / k);
    }
  }
  cu.cuMemFree(buf);
}

void bench_classic() {
  MPI_Comm plain;
  MPI_Comm_dup(MPI_COMM_WORLD, &plain);
  CUdeviceptr buf;
  CU_OK(cu.cuMemAlloc(&buf, 8 * sizeof(double)));
  void* p = reinterpret_cast<void*>(buf);
  std::vector<double> t;
  for (int r = 0; r < 2200; ++r) {
    const double t0 = now_us();
    MPI_Allreduce(MPI_IN_PLACE, p, 8, MPI_DOUBLE, MPI_SUM, plain);
    if (r >= 200) t.push_back(now_us() - t0);
  }
  std::sort(t.begin(), t.end());
  if (g_rank == 0)
    std::printf("classic MPI_Allreduce 64 B on GPU memory: median %.2f us, p90 %.2f us (%zu calls)\n",
                t[t.size() / 2], t[t.size() * 9 / 10], t.size());
  cu.cuMemFree(buf);
  MPI_Comm_free(&plain);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "all";
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  int devices = 0;
  if (!cu.load() || cu.cuInit(0) != CUDA_SUCCESS || cu.cuDeviceGetCount(&devices) != CUDA_SUCCESS ||
      devices == 0) {
    if (g_rank == 0) std::printf("SKIP: no CUDA driver with a device and graph capture\n");
    MPI_Finalize();
    return 77;
  }
  CUdevice dev;
  CUcontext ctx;
  CUstream s;
  CU_OK(cu.cuDeviceGet(&dev, g_rank % devices));  // (one GPU per rank where there are more)
  CU_OK(cu.cuDevicePrimaryCtxRetain(&ctx, dev));
  CU_OK(cu.cuCtxPushCurrent(ctx));
  CU_OK(cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  std::vector<Case> cases = make_cases();
  MPI_Comm comm = attached_dup(s);
  const char* rounds_env = std::getenv("CAPTURE_ROUNDS");
  const int rounds = rounds_env ? std::max(1, std::atoi(rounds_env)) : 1;

  if (mode == "all") {
    run_steps(cases, comm, s, true, 0);
    run_steps(cases, comm, s, false, kLaunches);  // live calls after the graph: in order
  } else if (mode == "mixed") {
    run_steps(cases, comm, s, g_rank % 2 == 0, 0);
    run_steps(cases, comm, s, g_rank % 2 == 1, kLaunches);  // the other way round
  } else if (mode == "abort") {
    aborted(cases, comm, s);
    run_steps(cases, comm, s, false, 0);
    run_steps(cases, comm, s, true, kLaunches);
  } else if (mode == "freed") {
    MPI_Comm doomed = attached_dup(s);
    CUgraphExec ge = capture_step(cases, doomed, s);
    MPI_Comm_free(&doomed);
    fill(cases, 0);  // h_out = -1, copied to the allreduce's output as a sentinel
    CU_OK(cu.cuMemcpyAsync(cases[0].d_out, reinterpret_cast<CUdeviceptr>(cases[0].h_out),
                           kN * sizeof(double), s));
    CU_OK(cu.cuGraphLaunch(ge, s));
    CU_OK(cu.cuStreamSynchronize(s));  // the skipped calls release the stream
    check(cases[0].h_out[0] == -1, "a call on a freed communicator is skipped");
    CU_OK(cu.cuGraphExecDestroy(ge));
    run_steps(cases, comm, s, true, 0);
  } else if (mode == "crossed") {
    for (int r = 0; r < rounds; ++r) crossed(cases, comm, s);
  } else if (mode == "threads" || mode == "threads-mixed") {
    for (int r = 0; r < rounds; ++r) threads(ctx, mode == "threads-mixed");
  } else if (mode == "classic") {
    classic_during_capture(cases);
  } else if (mode == "inject") {
    injected(cases, comm, s);
  } else if (mode == "bench") {
    bench(comm, s);
  } else if (mode == "bench-classic") {
    bench_classic();
  } else {
    std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
    return 2;
  }

  free_persistent();
  MPI_Comm_free(&comm);
  // A lane per communicator captured on (crossed: A's and each round's B's; threads-mixed:
  // one of a rank's two threads replays in each round).
  if (mode == "crossed") check_lanes_end(1 + rounds);
  if (mode == "threads") check_lanes_end(2 * rounds);
  if (mode == "threads-mixed") check_lanes_end(rounds);
  free_cases(cases);
  // Against the fake driver: no race and no CUDA call from a host function seen.
  using counter_fn = unsigned long long (*)(const char*);
  if (auto counter = reinterpret_cast<counter_fn>(dlsym(RTLD_DEFAULT, "fake_cuda_counter"))) {
    check(counter("races") == 0, "no race (fake driver)");
    check(counter("not_permitted") == 0, "no CUDA call from a host function (fake driver)");
    check(mode == "abort" || counter("capture_invalidated") == 0, "no capture invalidated");
  }
  // CAPTURE_EXPECT_FUSED=1: the MPI_Iallreduce calls were fused (a fuse= rule), replayed
  // and live alike (100 per rank).
  if (const char* e = std::getenv("CAPTURE_EXPECT_FUSED"); e && std::strcmp(e, "1") == 0) {
    using counts_fn = void (*)(unsigned long long*, unsigned long long*, unsigned long long*);
    auto counts = reinterpret_cast<counts_fn>(dlsym(RTLD_DEFAULT, "streamcoll_fusion_counts"));
    unsigned long long calls = 0, messages = 0;
    if (counts) counts(&calls, &messages, nullptr);
    check(calls >= 2 * kLaunches && messages > 0,
          "MPI_Iallreduce fused: " + std::to_string(calls) + " calls in " + std::to_string(messages) + " messages");
  }
  int fails = 0, mine = g_fail.load();
  MPI_Allreduce(&mine, &fails, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (g_rank == 0) std::printf("capture %s: %d ranks, %s\n", mode.c_str(), g_size, fails ? "FAILED" : "passed");
  MPI_Finalize();
  return fails ? 1 : 0;
}
