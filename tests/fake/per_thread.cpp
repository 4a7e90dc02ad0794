// cudaStreamPerThread as the attached stream, from two threads at once, under streamcoll
// with the fake CUDA driver (which gives every host thread its own per-thread default
// stream) and the fake NCCL.
//
//   per_thread ROUTE     ROUTE: ht (allreduce:ht:algo=rd) or nccl (the default table)
//
// Each rank runs two threads, each with its own duplicate of MPI_COMM_WORLD carrying
// CU_STREAM_PER_THREAD. Thread A holds its per-thread stream with a host wait (a gate),
// writes its input on it, calls MPI_Allreduce (stream-ordered: it must return while the
// gate is closed), and keeps the gate closed until thread B is done. Thread B does the
// same on its own stream without a gate, synchronises its per-thread stream and checks
// its sum: that can only finish if the collective went on B's own per-thread stream (on
// A's, or on the legacy stream, which waits for every blocking stream, it would wait for
// A's gate, which B's end opens: a hang, caught by the watchdog). Then A opens its gate,
// synchronises and checks. Repeated; MPI_Iallreduce + MPI_Wait too (the wait makes the
// calling thread's per-thread stream wait). Prints "N passed, N failed" on rank 0.
#include <dlfcn.h>
#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "harness.hpp"
#include "streamcoll/streamext.h"

namespace {

CUstream_st* const kPerThread = reinterpret_cast<CUstream_st*>(0x2);  // CU_STREAM_PER_THREAD
std::atomic<int> g_b_done{0};
std::atomic<int> g_thread_fail{0};

void fail_thread(const std::string& what) {
  g_thread_fail.fetch_add(1);
  std::fprintf(stderr, "[rank %d] FAIL: %s\n", g_rank, what.c_str());
}

// One stream-ordered allreduce on this thread's per-thread stream. `gated`: the stream is
// held until thread B of this rank has finished its round.
void round_trip(MPI_Comm comm, bool gated, bool nonblocking, unsigned salt, const char* who) {
  const size_t n = 512;
  void* in = api.malloc(n * sizeof(int));
  void* out = api.malloc(n * sizeof(int));
  void* flag = api.malloc(sizeof(unsigned));
  std::memset(flag, 0, sizeof(unsigned));
  if (gated && api.enqueue_wait(kPerThread, flag, 1) != 0) fail_thread(std::string(who) + ": gate");
  auto v = inputs<int>(g_rank, n, Op::sum, salt);
  if (api.enqueue_copy(kPerThread, in, v.data(), n * sizeof(int)) != 0)
    fail_thread(std::string(who) + ": input copy on the per-thread stream");
  int rc;
  if (nonblocking) {
    MPI_Request r = MPI_REQUEST_NULL;
    rc = MPI_Iallreduce(in, out, static_cast<int>(n), MPI_INT, MPI_SUM, comm, &r);
    if (rc == MPI_SUCCESS) rc = MPI_Wait(&r, MPI_STATUS_IGNORE);
  } else {
    rc = MPI_Allreduce(in, out, static_cast<int>(n), MPI_INT, MPI_SUM, comm);
  }
  if (rc != MPI_SUCCESS) fail_thread(std::string(who) + ": the call fails");
  if (gated) {
    // Returned with the gate closed: the host did not wait for the stream. Keep it
    // closed until B, on its own stream, is through.
    while (g_b_done.load() == 0) usleep(1000);
    __atomic_store_n(static_cast<unsigned*>(flag), 1u, __ATOMIC_RELEASE);
  }
  api.stream_sync(kPerThread);
  if (!gated) g_b_done.store(1);
  std::vector<int> got(n);
  std::memcpy(got.data(), out, n * sizeof(int));
  if (got != reduced<int>(g_size, n, Op::sum, salt))
    fail_thread(std::string(who) + ": wrong sum (salt " + std::to_string(salt) + ")");
  api.free(in);
  api.free(out);
  api.free(flag);
}

void on_alarm(int) {
  static const char msg[] = "per_thread: watchdog expired: a per-thread stream waited for another's\n";
  (void)!write(2, msg, sizeof msg - 1);
  _exit(3);
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  const std::string route = argc > 1 ? argv[1] : "";
  int ok = (route == "ht" || route == "nccl") && provided == MPI_THREAD_MULTIPLE &&
                   load_api(route == "nccl")
               ? 1
               : 0;
  int all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all_ok) {
    if (g_rank == 0)
      std::fprintf(stderr, "per_thread: unknown route, no MPI_THREAD_MULTIPLE, or the fakes not loaded\n");
    MPI_Finalize();
    return 1;
  }
  signal(SIGALRM, on_alarm);
  alarm(120);
  check(api.runtime_init() == 0, "runtime init");
  MPI_Comm ca, cb;
  MPI_Comm_dup(MPI_COMM_WORLD, &ca);
  MPI_Comm_dup(MPI_COMM_WORLD, &cb);
  for (MPI_Comm c : {ca, cb}) {
    if (route == "ht") check(api.set_route(c, "allreduce:ht:algo=rd") == MPI_SUCCESS, "set_route");
    // A classic call first: every rank agrees on the route (MPI_I* calls follow it).
    std::vector<int> x(16, 1), y(16, 0);
    void* d = api.malloc(sizeof(int) * 16);
    std::memcpy(d, x.data(), sizeof(int) * 16);
    check(MPI_Allreduce(MPI_IN_PLACE, d, 16, MPI_INT, MPI_SUM, c) == MPI_SUCCESS, "set-up call");
    api.free(d);
    check(streamcoll_comm_attach_stream(c, kPerThread) == MPI_SUCCESS, "attach cudaStreamPerThread");
  }
  const unsigned long long before = stat_calls("allreduce", route.c_str(), "device") +
                                    stat_calls("iallreduce", route.c_str(), "device");
  const int rounds = 6;
  for (int i = 0; i < rounds; ++i) {
    g_b_done.store(0);
    // MPI_I* on route nccl only where the program promises one start order (it does not
    // here: two threads): those rounds are blocking.
    const bool nb = i % 2 == 1 && route == "ht";
    std::thread a([&] {
      api.runtime_init();  // this thread's current context (cudaSetDevice)
      round_trip(ca, true, nb, 10 + i, "thread A");
      api.runtime_fini();
    });
    std::thread b([&] {
      api.runtime_init();
      round_trip(cb, false, nb, 100 + i, "thread B");
      api.runtime_fini();
    });
    a.join();
    b.join();
  }
  alarm(0);
  check(g_thread_fail.load() == 0, "every round right, no thread failed");
  const unsigned long long after = stat_calls("allreduce", route.c_str(), "device") +
                                   stat_calls("iallreduce", route.c_str(), "device");
  check(after - before == 2 * rounds, "every call took route " + route + " (" +
                                          std::to_string(after - before) + " of " +
                                          std::to_string(2 * rounds) + ")");
  for (MPI_Comm c : {ca, cb}) {
    streamcoll_comm_detach_stream(c);
    MPI_Comm_free(&c);
  }
  api.runtime_fini();
  int counts[2] = {g_pass, g_fail}, total[2] = {0, 0};
  MPI_Reduce(counts, total, 2, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
  MPI_Finalize();
  if (g_rank == 0)
    std::printf("per_thread (%s, %d ranks): %d passed, %d failed\n", route.c_str(), g_size, total[0], total[1]);
  return total[1] == 0 && g_fail == 0 ? 0 : 1;
}
