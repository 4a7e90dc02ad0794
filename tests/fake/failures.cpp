// Every failure point of a route, on one rank at a time, under streamcoll with the fake
// CUDA driver and the fake NCCL: a local failure must not hang any rank, must not give
// any rank a wrong value reported as a success, and must leave nothing behind.
//
//   failures ROUTE [PARAM]     (under tests/mpi/run.sh preload; tests/fake/meson.build)
//   ROUTE  nccl         the default table (device memory: route nccl); MPI_I* too when
//                       STREAMCOLL_NCCL_NONBLOCKING=1
//          ccube [C]    route ccube (allreduce: C-Cube's tree on NCCL send/recv and the
//                       reduction kernel), chunk=C; MPI_I* too when
//                       STREAMCOLL_NCCL_NONBLOCKING=1
//          ht PARAM     route ht with algo=PARAM (rd, ring, rabenseifner, mpi)
//          bc PARAM     route blueconnect, backend=PARAM, on the hierarchy 2x... of the
//                       rank count (allreduce, reduce_scatter_block, allgather)
//          nvgroup [X]  route nvgroup (allreduce, reduce_scatter_block, allgather; the
//                       ranks on one fake GPU: FAKE_CUDA_BUS_ID=same); MPI_I* too when
//                       STREAMCOLL_NVGROUP_NONBLOCKING=1. With X: groups of 2 ranks
//                       (hierarchy 2x...), the step across them on route X (cross=X)
//          pmpi         route pmpi: the MPI (not CUDA-aware) on staged GPU buffers
//          fusion-nccl  MPI_Iallreduce fused (allreduce:nccl:fuse=64K) with
//                       STREAMCOLL_FUSION_NCCL=1: the fused messages on route nccl, on the
//                       fusion queue's own NCCL communicator (algorithms/fusion.hpp); MPI_I*
//                       calls (stream-ordered fused calls: fusion_device.cpp). After an
//                       abort the next groups run on the host, so the next call must
//                       succeed and be right
//
// For each collective the route carries, each way of calling it (blocking; MPI_I* +
// MPI_Wait; blocking on a communicator that carries a stream), each entry point of the
// fake driver (and of the fake NCCL) that can fail, and each of the first and the last
// rank: the k-th call of that entry point on that rank fails (fake_cuda_fail_after,
// fake_nccl_fail_after), for k = 1, 2, ... until the collective makes fewer than k such
// calls. Each try runs on a fresh duplicate of MPI_COMM_WORLD (so the communicator's set-up
// is walked too), with MPI_ERRORS_RETURN, and checks on every rank:
//   - the call returns (a watchdog fails the run if any rank hangs);
//   - a call that returns MPI_SUCCESS holds the value computed here, except a
//     stream-ordered one, whose failure found later may be reported by the next call;
//   - the next call on the communicator is right on every rank and succeeds (a
//     stream-ordered try's next calls may report that late failure once; MPI_I* calls on
//     route nccl fail everywhere until the next blocking call agrees on another route):
//     nothing is latched, no rank diverges;
// FAILURES_ONLY=<text> runs only the tries whose label contains it (to reproduce one).
// and at the end: no race seen by the fake driver, every rank ran the same NCCL
// operations. Prints "N passed, N failed" on rank 0; exits nonzero on failure.
#include <dlfcn.h>
#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "calls.hpp"
#include "harness.hpp"
#include "streamcoll/streamext.h"

namespace {

enum class How { blocking, nonblocking, stream };
const char* how_name(How h) {
  return h == How::blocking ? "blocking" : h == How::nonblocking ? "MPI_I*+MPI_Wait" : "stream-ordered";
}

// The entry points the fakes can make fail (fake_cuda.cpp's and fake_nccl.cpp's lists).
const char* const kCudaApis[] = {
    "cuMemHostAlloc", "cuMemcpyAsync", "cuMemcpyDtoDAsync", "cuMemAllocAsync", "cuEventCreate",
    "cuEventRecord", "cuEventQuery", "cuEventSynchronize", "cuStreamCreate", "cuStreamWaitEvent",
    "cuStreamQuery", "cuStreamSynchronize", "cuStreamWaitValue32", "cuLaunchKernel",
    "cuModuleLoadData", "cuMemHostGetDevicePointer", "cuDevicePrimaryCtxRetain", "cuMemAlloc",
    "cuIpcGetMemHandle", "cuIpcOpenMemHandle", "cuMemHostRegister"};
const char* const kNcclApis[] = {"ncclAllReduce", "ncclReduce", "ncclBroadcast", "ncclAllGather",
                                 "ncclReduceScatter", "ncclSend", "ncclRecv", "ncclGroupEnd"};

struct Setup {
  std::string route;   // as the statistics name it
  std::string spec;    // for streamcoll_comm_set_route; empty: the table's routes
  std::vector<Kind> kinds;
  std::vector<How> hows;
  bool nccl = false;   // the route uses NCCL: its entry points are walked too
  bool fused = false;  // MPI_Iallreduce calls fused (fuse=): the fusion queue's agreement
                       // takes the next groups off an aborted NCCL communicator
};

fake_cuda_fail_after_fn g_cuda_fail = nullptr;
fake_nccl_fail_after_fn g_nccl_fail = nullptr;
CUstream_st* g_stream = nullptr;
unsigned g_salt = 1;
long g_tries = 0, g_fired = 0, g_errors = 0, g_late = 0, g_owed = 0;
char g_now[512] = "";  // the try under way, for the watchdog's message

int error_class(int rc) {
  int c = rc;
  MPI_Error_class(rc, &c);
  return c;
}

struct Outcome {
  int rc = MPI_SUCCESS;
  bool right = false;
  size_t bad = 0, first = 0;
};
Outcome call_once(MPI_Comm comm, Kind k, How how, bool in_place);
std::string describe(const Outcome& o);

// A fresh duplicate of MPI_COMM_WORLD for one try. MPI_I* calls are routed from what an
// earlier blocking call of theirs agreed: one clean blocking call first. It must succeed
// on `fail_rank` (the failure is armed there after it); on another rank it may fail
// instead when that rank is still in it while `fail_rank` has gone on to the try and
// failed (its abort and notice end this rank's operation too), but never succeed wrong.
MPI_Comm fresh(const Setup& s, Kind k, How how, bool in_place, int fail_rank = -1) {
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  if (!s.spec.empty()) check(api.set_route(comm, s.spec.c_str()) == MPI_SUCCESS, "set_route " + s.spec);
  if (how == How::stream)
    check(streamcoll_comm_attach_stream(comm, g_stream) == MPI_SUCCESS, "attach the stream");
  if (how == How::nonblocking) {
    const Outcome o = call_once(comm, k, How::blocking, in_place);
    const bool ok = o.rc == MPI_SUCCESS ? o.right : fail_rank >= 0 && g_rank != fail_rank;
    check(ok, std::string("the blocking call before MPI_I* calls is right (") + kind_name(k) + ", " +
                  describe(o) + ")");
  }
  return comm;
}

// One call of `k`, made `how`, on device buffers; the value checked after the stream (if
// any) is synchronised.
Outcome call_once(MPI_Comm comm, Kind k, How how, bool in_place) {
  const int size = comm_size(comm);
  Call c = make(k, 1000, size - 1, in_place, ++g_salt, comm);
  c.prepare(Mem::device, Mem::device);
  Outcome o;
  if (how == How::nonblocking) {
    MPI_Request r = MPI_REQUEST_NULL;
    o.rc = c.start(&r);
    if (r != MPI_REQUEST_NULL) {
      const int w = MPI_Wait(&r, MPI_STATUS_IGNORE);
      if (o.rc == MPI_SUCCESS) o.rc = w;
    }
  } else {
    o.rc = c.start(nullptr);
    if (how == How::stream) api.stream_sync(g_stream);
  }
  o.bad = c.wrong(&o.first);
  o.right = o.bad == 0;
  c.release();
  return o;
}

std::string describe(const Outcome& o) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  if (o.rc != MPI_SUCCESS) MPI_Error_string(o.rc, text, &len);
  return "rc " + std::to_string(o.rc) + " (class " + std::to_string(error_class(o.rc)) +
         (o.rc != MPI_SUCCESS ? std::string(": ") + text : std::string()) + "), " +
         (o.right ? "right" : std::to_string(o.bad) + " wrong elements from " + std::to_string(o.first));
}

// Arms the failure on this rank: the k-th call of `api_name` from now.
void arm(bool nccl_api, const char* api_name, unsigned long long k) {
  if (nccl_api) g_nccl_fail(api_name, k);
  else g_cuda_fail(api_name, k);
}

unsigned long long fired_count() { return cu("injected_failures") + nc("injected_failures"); }

// One try: the k-th call of `api_name` fails on `fail_rank`. Returns whether it fired.
bool one_try(const Setup& s, Kind k, How how, bool in_place, bool nccl_api, const char* api_name,
             int fail_rank, unsigned long long nth) {
  const std::string label = s.route + " " + kind_name(k) + (in_place ? " in place" : "") + " " +
                            how_name(how) + ", call " + std::to_string(nth) + " of " + api_name +
                            " fails on rank " + std::to_string(fail_rank);
  if (const char* only = std::getenv("FAILURES_ONLY"); only && label.find(only) == std::string::npos)
    return nth < 8;  // reproducing one try: skip the others (walking a few calls on)
  std::snprintf(g_now, sizeof g_now, "%s", label.c_str());
  alarm(60);
  MPI_Comm comm = fresh(s, k, how, in_place, fail_rank);
  const unsigned long long before = fired_count();
  if (g_rank == fail_rank) arm(nccl_api, api_name, nth);
  const Outcome o = call_once(comm, k, how, in_place);
  if (g_rank == fail_rank) arm(nccl_api, api_name, 0);
  int fired = fired_count() > before ? 1 : 0;
  MPI_Bcast(&fired, 1, MPI_INT, fail_rank, MPI_COMM_WORLD);
  ++g_tries;
  if (fired) ++g_fired;
  if (o.rc != MPI_SUCCESS) ++g_errors;

  // A success is a right value; a stream-ordered call may instead owe a late report.
  const bool owes = how == How::stream && o.rc == MPI_SUCCESS && !o.right;
  if (owes) ++g_owed;
  check(o.rc != MPI_SUCCESS || o.right || how == How::stream,
        label + ": a call that returns MPI_SUCCESS is right (" + describe(o) + ")");
  check(o.rc == MPI_SUCCESS || error_class(o.rc) != MPI_SUCCESS, label + ": an MPI error code");

  // The next call: right everywhere, and it succeeds. Stream-ordered: a failure found
  // after the call returned is reported by a later call once (the next one, when it was
  // found before the stream went on; a later one when only the stream's end could show
  // it): of three calls, all right, one fails at most.
  // Blocking reductions on route nccl (allreduce on ccube; bcast, allgather and alltoall
  // on nccl too) decide from their signature's earlier agreements (shim/dispatch_agree.cpp:
  // cacheable): the calls still routed to the aborted NCCL
  // communicator fail on every rank (none can know of the abort in time to go elsewhere
  // alone) until a refresh agreed without it is adopted, at most kRefreshRouted (8) +
  // kRunAhead (4) calls on; never a wrong value reported as a success. The same number
  // of calls on every rank (collective); the last ones succeed and are right.
  // Stream-ordered calls on route blueconnect (and nvgroup over several groups, which is
  // BlueConnect's decomposition) too: the calls still routed to a level's aborted NCCL
  // communicator fail on every rank, and a peer's failure comes with the outcome
  // exchange, which completes at a later call.
  const bool decomposed = s.route == "blueconnect" ||
                          (s.route == "nvgroup" && s.spec.find("cross=") != std::string::npos);
  const bool cached_nccl = s.route == "nccl" ||  // (every collective of Kind)
                           (s.route == "ccube" && k == Kind::allreduce) ||
                           (decomposed && how == How::stream);
  auto window = [&](How how) {
    constexpr int kWindow = 8 + 4, kCalls = kWindow + 2;
    int failed = 0;
    for (int i = 0; i < kCalls; ++i) {
      const Outcome next = call_once(comm, k, how, in_place);
      if (how == How::stream && next.rc == MPI_SUCCESS && !next.right) {
        // A stream-ordered call spoilt after it returned owes a late report.
        check(i + 1 < kCalls, label + ": a spoilt stream-ordered call is not the last");
      } else {
        check(next.rc != MPI_SUCCESS || next.right,
              label + ": a call after it that succeeds is right (" + describe(next) + ")");
      }
      if (next.rc != MPI_SUCCESS) ++failed;
      if (i >= kWindow)
        check(next.rc == MPI_SUCCESS && next.right,
              label + ": call " + std::to_string(i + 1) + " after it succeeds and is right (" +
                  describe(next) + ")");
    }
    g_late += failed;
  };
  if (how == How::nonblocking && !s.fused && (s.route == "nccl" || s.route == "ccube")) {
    // MPI_I* on route nccl (STREAMCOLL_NCCL_NONBLOCKING=1): those started before the next
    // blocking call are still routed to the aborted NCCL communicator, and fail on every
    // rank (none can know of the abort in time to go elsewhere alone); the next blocking
    // call agrees on another route, and later MPI_I* calls follow it.
    const Outcome stale = call_once(comm, k, how, in_place);
    check(stale.rc != MPI_SUCCESS || stale.right,
          label + ": an MPI_I* call after it fails or is right (" + describe(stale) + ")");
    if (cached_nccl) {
      window(How::blocking);
    } else {
      const Outcome blocking = call_once(comm, k, How::blocking, in_place);
      check(blocking.rc == MPI_SUCCESS && blocking.right,
            label + ": the next blocking call succeeds and is right (" + describe(blocking) + ")");
    }
    const Outcome next = call_once(comm, k, how, in_place);
    check(next.rc == MPI_SUCCESS && next.right,
          label + ": MPI_I* after it succeeds and is right (" + describe(next) + ")");
  } else if (cached_nccl && how != How::nonblocking) {
    window(how);
  } else if (how != How::stream) {
    const Outcome next = call_once(comm, k, how, in_place);
    check(next.right, label + ": the next call is right (" + describe(next) + ")");
    check(next.rc == MPI_SUCCESS, label + ": the next call succeeds (" + describe(next) + ")");
  } else {
    // Three calls on every rank (collective: the same number everywhere).
    int late = 0;
    for (int i = 0; i < 3; ++i) {
      const Outcome next = call_once(comm, k, how, in_place);
      check(next.right, label + ": the call after it is right (" + describe(next) + ")");
      if (next.rc != MPI_SUCCESS) ++late;
      if (i == 0 && owes)
        check(next.rc != MPI_SUCCESS, label + ": the spoilt stream-ordered call is reported by the next call");
    }
    g_late += late;
    check(late <= 1, label + ": one late report at most (" + std::to_string(late) + " of 3 calls failed)");
  }
  if (how == How::stream) streamcoll_comm_detach_stream(comm);
  MPI_Comm_free(&comm);
  alarm(0);
  return fired != 0;
}

void walk(const Setup& s) {
  std::vector<int> ranks = {0};
  if (g_size > 1) ranks.push_back(g_size - 1);
  for (Kind k : s.kinds)
    for (How how : s.hows)
      for (bool in_place : {false, true}) {
        // In place where the route treats it apart (scratch and copies).
        if (in_place && k != Kind::allreduce && k != Kind::rsb && k != Kind::alltoall) continue;
        // A clean call first: the route under test carries it.
        {
          alarm(60);
          MPI_Comm comm = fresh(s, k, how, in_place);
          const std::string kn = kind_name(k);
          const std::string stat = how == How::nonblocking ? "i" + kn : kn;
          const unsigned long long before = stat_calls(stat, s.route.c_str(), "device");
          using MessagesOn = unsigned long long (*)(const char*);
          static const auto messages_on =
              reinterpret_cast<MessagesOn>(dlsym(RTLD_DEFAULT, "streamcoll_fusion_messages_on"));
          const unsigned long long fused0 = s.fused && messages_on ? messages_on("nccl") : 0;
          const Outcome o = call_once(comm, k, how, in_place);
          check(o.rc == MPI_SUCCESS && o.right, s.route + " " + kn + " " + how_name(how) +
                                                    ": a clean call is right (" + describe(o) + ")");
          check(stat_calls(stat, s.route.c_str(), "device") == before + 1,
                s.route + " " + kn + " " + how_name(how) + ": the clean call took route " + s.route);
          if (s.fused)  // fused, its fused message on NCCL
            check(messages_on && messages_on("nccl") == fused0 + 1,
                  s.route + " " + kn + " " + how_name(how) + ": the clean call's fused message ran on NCCL");
          if (how == How::stream) streamcoll_comm_detach_stream(comm);
          MPI_Comm_free(&comm);
          alarm(0);
        }
        for (int fail_rank : ranks) {
          for (const char* a : kCudaApis)
            for (unsigned long long n = 1; one_try(s, k, how, in_place, false, a, fail_rank, n); ++n) {
            }
          if (s.nccl)
            for (const char* a : kNcclApis)
              for (unsigned long long n = 1; one_try(s, k, how, in_place, true, a, fail_rank, n); ++n) {
              }
        }
      }
}

void on_alarm(int) {
  static const char msg[] = "failures: watchdog expired: a call hung in: ";
  (void)!write(2, msg, sizeof msg - 1);
  (void)!write(2, g_now, strlen(g_now));
  (void)!write(2, "\n", 1);
  _exit(3);
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  const std::string route = argc > 1 ? argv[1] : "";
  const std::string param = argc > 2 ? argv[2] : "";
  const bool need_nccl = std::getenv("STREAMCOLL_NCCL_LIB") != nullptr &&
                         access(std::getenv("STREAMCOLL_NCCL_LIB"), R_OK) == 0;
  Setup s;
  s.route = route;
  const std::vector<Kind> all = {Kind::allreduce, Kind::reduce, Kind::bcast, Kind::allgather,
                                 Kind::rsb, Kind::alltoall};
  bool known = true;
  if (route == "nccl") {
    s.kinds = all;
    s.hows = {How::blocking, How::stream};
    const char* nb = std::getenv("STREAMCOLL_NCCL_NONBLOCKING");
    if (nb && std::strcmp(nb, "1") == 0) s.hows.push_back(How::nonblocking);
    s.nccl = true;
  } else if (route == "ccube") {
    // Route ccube (C-Cube's tree on NCCL send/recv and the reduction kernel), chunk=PARAM.
    s.spec = "allreduce:ccube" + (param.empty() ? std::string() : ":chunk=" + param);
    s.kinds = {Kind::allreduce};
    s.hows = {How::blocking, How::stream};
    const char* nb = std::getenv("STREAMCOLL_NCCL_NONBLOCKING");
    if (nb && std::strcmp(nb, "1") == 0) s.hows.push_back(How::nonblocking);
    s.nccl = true;
  } else if (route == "ht") {
    for (const char* c : {"allreduce", "reduce", "bcast", "allgather", "reduce_scatter_block"})
      s.spec += std::string(s.spec.empty() ? "" : ",") + c + ":ht:algo=" + param;
    s.kinds = {Kind::allreduce, Kind::reduce, Kind::bcast, Kind::allgather, Kind::rsb};
    s.hows = {How::blocking, How::nonblocking, How::stream};
  } else if (route == "bc") {
    s.route = "blueconnect";
    std::string h = "2";
    for (int p = g_size / 2; p > 1; p /= 2) h += "x2";
    for (const char* c : {"allreduce", "reduce_scatter_block", "allgather"})
      s.spec += std::string(s.spec.empty() ? "" : ",") + c + ":blueconnect:hierarchy=" + h +
                ":backend=" + param;
    s.kinds = {Kind::allreduce, Kind::rsb, Kind::allgather};
    s.hows = {How::blocking};
    if (param.find("sched") == std::string::npos) s.hows.push_back(How::stream);
    s.nccl = true;
  } else if (route == "nvgroup") {
    // PARAM: cross=PARAM over groups of 2 (hierarchy 2x...); none: one group, which only
    // ranks of one node make (on several nodes, the test cluster: the route needs route
    // nccl across them, and the test expects the group): skipped there.
    if (param.empty()) {
      const int leaders = job_nodes();
      if (leaders > 1) {
        if (g_rank == 0)
          std::printf("SKIP: the ranks are on %d nodes; one NV-Group is one node's\n", leaders);
        MPI_Finalize();
        return 77;
      }
    }
    std::string extra;
    if (!param.empty()) {
      std::string h = "2";
      for (int p = g_size / 2; p > 1; p /= 2) h += "x2";
      extra = ":hierarchy=" + h + ":cross=" + param;
      s.nccl = param == "nccl";
    }
    for (const char* c : {"allreduce", "reduce_scatter_block", "allgather"})
      s.spec += std::string(s.spec.empty() ? "" : ",") + c + ":nvgroup:chunk=4K:blocks=4" + extra;
    s.kinds = {Kind::allreduce, Kind::rsb, Kind::allgather};
    s.hows = {How::blocking, How::stream};
    const char* nb = std::getenv("STREAMCOLL_NVGROUP_NONBLOCKING");
    if (param.empty() && nb && std::strcmp(nb, "1") == 0) s.hows.push_back(How::nonblocking);
  } else if (route == "fusion-nccl") {
    s.route = "nccl";  // as the statistics name a fused call of a nccl rule
    s.spec = "allreduce:nccl:fuse=64K";
    s.kinds = {Kind::allreduce};
    s.hows = {How::nonblocking};  // (How::stream is a blocking call: never fused)
    s.nccl = true;
    s.fused = true;
  } else if (route == "pmpi") {
    s.spec = "*:pmpi";
    s.kinds = all;
    s.hows = {How::blocking, How::nonblocking, How::stream};
  } else {
    known = false;
  }
  int ok = known && load_api(s.nccl) ? 1 : 0, all_ok = 0;
  if (ok) {
    void* cu_lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    g_cuda_fail = reinterpret_cast<fake_cuda_fail_after_fn>(dlsym(cu_lib, "fake_cuda_fail_after"));
    if (s.nccl) {
      void* nc_lib = dlopen(std::getenv("STREAMCOLL_NCCL_LIB"), RTLD_NOW | RTLD_LOCAL);
      g_nccl_fail = reinterpret_cast<fake_nccl_fail_after_fn>(dlsym(nc_lib, "fake_nccl_fail_after"));
    }
    ok = g_cuda_fail && (!s.nccl || g_nccl_fail) && (!s.nccl || need_nccl);
  }
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all_ok) {
    if (g_rank == 0)
      std::fprintf(stderr, "failures: unknown route '%s', or the fakes (with failure injection) "
                   "not loaded\n", route.c_str());
    MPI_Finalize();
    return 1;
  }
  signal(SIGALRM, on_alarm);
  check(api.runtime_init() == 0, "runtime init");
  g_stream = api.stream_create(0);
  const unsigned long long races0 = cu("races");
  walk(s);
  check(cu("races") == races0, "the fake driver saw no race");
  if (s.nccl) check(nc("mismatches") == 0, "every rank ran the same NCCL operations");
  api.stream_destroy(g_stream);
  api.runtime_fini();
  long counts[6] = {g_pass, g_fail, g_tries, g_fired, g_errors, g_late}, total[6] = {0};
  MPI_Reduce(counts, total, 6, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
  MPI_Finalize();
  if (g_rank == 0)
    std::printf("failures (%s%s%s, %d ranks): %ld tries per rank, %ld injected failures fired, "
                "%ld calls reported an error, %ld late reports; %ld passed, %ld failed\n",
                route.c_str(), param.empty() ? "" : " ", param.c_str(), g_size,
                total[2] / g_size, total[3] / g_size, total[4], total[5], total[0], total[1]);
  return total[1] == 0 && g_fail == 0 ? 0 : 1;
}
