// Classic calls (no stream attached) on GPU buffers whose input the program wrote on one of
// its own streams without synchronising the host: the CUDA-aware MPI pattern that a
// legacy-stream copy inside the MPI makes legal. Whatever route a call takes (pmpi with host
// staging, nccl, ht, blueconnect, nvgroup, fusion's packing), it must read the input after,
// and write the result after, the work already enqueued on
//   legacy      the legacy default stream,
//   blocking    a stream created with default flags (a blocking stream, which the legacy
//               stream synchronises with),
//   per-thread  the calling thread's per-thread default stream (a blocking stream too),
//   event       a non-blocking stream whose last work the program makes the legacy stream
//               wait for (cudaStreamWaitEvent(0, event)),
// and later work on a blocking stream must see its writes. Streamcoll preloaded, the fake
// CUDA driver with FAKE_CUDA_DEFER=1 (stream work runs only when something waits for it),
// the route from the environment (STREAMCOLL_ROUTE, the default table, the fake NCCL or
// none).
//
//   classic_order [--expect=COLL:ROUTE,...] [--fused-on=ROUTE [--packed-on-gpu]]
//                 [--rounds=N] [--reset] [--device=D] [--ipc-errors-ok]
//
// Per writer, per collective (MPI_Allreduce, in place too, MPI_Reduce at every root in
// turn, MPI_Bcast, MPI_Allgather, in place too, MPI_Allgatherv with gaps, MPI_Alltoall,
// MPI_Reduce_scatter_block, MPI_Reduce_scatter, and MPI_Bcast of a strided datatype, which
// MPI_Ibcast repacks through GPU copies), blocking and MPI_I* + MPI_Wait: the writer's
// stream fills the receive buffer with a sentinel and then writes the input; the call
// runs; a copy on another blocking stream reads the receive buffer back, the host
// synchronises that stream only. Checked: every element against values computed here (the
// sentinel where MPI writes nothing), and no race reported by the fake driver (its
// happens-before check: a read or write not ordered after the writer's work).
//   --expect       the statistics show COLL on ROUTE on device memory (the test tests the
//                  route it names)
//   --fused-on     MPI_Iallreduce calls were fused into messages on ROUTE
//                  (streamcoll_fusion_messages_on; --packed-on-gpu: some packed in GPU
//                  memory)
//   --rounds       the whole set N times
//   --reset        cudaDeviceReset (fake_cuda_device_reset) between rounds: what streamcoll
//                  keeps for the ordering (events, pinned blocks) must be made anew
//   --device=D     the MPI_I* calls' buffers on fake GPU D (FAKE_CUDA_DEVICES > D); the
//                  blocking calls' (each just before the MPI_I* call of the same shape) and
//                  the program's streams on GPU 0: route nccl, set up on GPU 0, routes the
//                  MPI_I* call as the blocking call of its signature agreed and takes part
//                  through copies between the GPUs
// The fake driver must return no error (one after --reset: streamcoll finds its event gone;
// --ipc-errors-ok: not checked, as route nvgroup opens the IPC handles of buffers a peer
// registered at its last call, which this program frees after every call, finds some gone,
// and copies through scratch). Prints "N passed, N failed" on rank 0; exits nonzero on
// failure.
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

#include "fake_api.h"
#include "harness.hpp"

namespace {

CUstream_st* const kLegacy = reinterpret_cast<CUstream_st*>(0x1);     // CU_STREAM_LEGACY
CUstream_st* const kPerThread = reinterpret_cast<CUstream_st*>(0x2);  // CU_STREAM_PER_THREAD
constexpr unsigned kNonBlocking = 0x1;                                // CU_STREAM_NON_BLOCKING

// The fake driver's entry points this program calls itself.
struct Cu {
  int (*memcpy_async)(unsigned long long, unsigned long long, size_t, CUstream_st*) = nullptr;
  fake_cuda_event_new_fn event_new = nullptr;
  fake_cuda_event_record_fn event_record = nullptr;
  fake_cuda_stream_wait_fn stream_wait = nullptr;
  fake_cuda_event_delete_fn event_delete = nullptr;
} cuapi;

bool load_cu() {
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  return h && sym(h, cuapi.memcpy_async, "cuMemcpyAsync") &&
         sym(h, cuapi.event_new, "fake_cuda_event_new") &&
         sym(h, cuapi.event_record, "fake_cuda_event_record") &&
         sym(h, cuapi.stream_wait, "fake_cuda_stream_wait") &&
         sym(h, cuapi.event_delete, "fake_cuda_event_delete");
}

enum class Writer { legacy, blocking, per_thread, event };
const char* name_of(Writer w) {
  switch (w) {
    case Writer::legacy: return "legacy stream";
    case Writer::blocking: return "blocking stream";
    case Writer::per_thread: return "per-thread stream";
    case Writer::event: return "non-blocking stream + legacy-stream event wait";
  }
  return "?";
}

enum class Coll { allreduce, allreduce_in_place, reduce, bcast, bcast_strided, allgather,
                  allgather_in_place, allgatherv, alltoall, reduce_scatter_block, reduce_scatter };
const Coll kColls[] = {Coll::allreduce, Coll::allreduce_in_place, Coll::reduce, Coll::bcast,
                       Coll::bcast_strided, Coll::allgather, Coll::allgather_in_place,
                       Coll::allgatherv, Coll::alltoall, Coll::reduce_scatter_block,
                       Coll::reduce_scatter};
MPI_Datatype g_every_other_int = MPI_DATATYPE_NULL;  // MPI_INT with an extent of two
const char* name_of(Coll c) {
  switch (c) {
    case Coll::allreduce: return "allreduce";
    case Coll::allreduce_in_place: return "allreduce (in place)";
    case Coll::reduce: return "reduce";
    case Coll::bcast: return "bcast";
    case Coll::bcast_strided: return "bcast (strided type)";
    case Coll::allgather: return "allgather";
    case Coll::allgather_in_place: return "allgather (in place)";
    case Coll::allgatherv: return "allgatherv";
    case Coll::alltoall: return "alltoall";
    case Coll::reduce_scatter_block: return "reduce_scatter_block";
    case Coll::reduce_scatter: return "reduce_scatter";
  }
  return "?";
}

// Rank r's input element i (send buffer, or the in-place receive buffer).
int value(int r, size_t i, unsigned salt) {
  return (r + 1) * 1000003 + static_cast<int>(i) * 7 + static_cast<int>(salt) * 11;
}
constexpr int kSentinel = -77;

// One case: buffers, what the writer puts in them, the call, the expected receive buffer.
struct Case {
  Coll coll;
  bool nonblocking;
  unsigned salt;
  size_t n = 0;  // elements per block
  int root = 0;
  std::vector<int> counts, displs;  // allgatherv, reduce_scatter
  std::vector<int> send, recv_in;   // what the writer writes (send empty: in place / none)
  std::vector<int> expect;          // the receive buffer after the call
};

Case make_case(Coll coll, bool nonblocking, unsigned salt) {
  Case c;
  c.coll = coll;
  c.nonblocking = nonblocking;
  c.salt = salt;
  const unsigned shape = salt / 2;  // the same for a blocking call and the MPI_I* after it
  c.n = 257 + shape % 5;  // 1 KiB and a bit: not a multiple of anything
  const int p = g_size, me = g_rank;
  const size_t n = c.n, P = static_cast<size_t>(p);
  auto in = [&](int r, size_t len) {
    std::vector<int> v(len);
    for (size_t i = 0; i < len; ++i) v[i] = value(r, i, salt);
    return v;
  };
  c.counts.resize(P);
  c.displs.resize(P);
  int off = 0;
  for (int r = 0; r < p; ++r) {  // uneven counts, a one-element gap after each block
    c.counts[r] = static_cast<int>(n) / 2 + 3 * r + 1;
    c.displs[r] = off;
    off += c.counts[r] + 1;
  }
  switch (coll) {
    case Coll::allreduce:
    case Coll::allreduce_in_place: {
      (coll == Coll::allreduce ? c.send : c.recv_in) = in(me, n);
      if (coll == Coll::allreduce) c.recv_in.assign(n, kSentinel);
      c.expect.assign(n, 0);
      for (int r = 0; r < p; ++r)
        for (size_t i = 0; i < n; ++i) c.expect[i] += value(r, i, salt);
      break;
    }
    case Coll::reduce:
      c.root = static_cast<int>(shape % P);
      c.send = in(me, n);
      c.recv_in.assign(n, kSentinel);
      c.expect = c.recv_in;
      if (me == c.root) {
        c.expect.assign(n, 0);
        for (int r = 0; r < p; ++r)
          for (size_t i = 0; i < n; ++i) c.expect[i] += value(r, i, salt);
      }
      break;
    case Coll::bcast:
      c.root = static_cast<int>((shape + 1) % P);
      c.recv_in = me == c.root ? in(me, n) : std::vector<int>(n, kSentinel);
      c.expect = in(c.root, n);
      break;
    case Coll::bcast_strided:  // n ints, every other one moved, the holes left alone
      c.root = static_cast<int>((shape + 1) % P);
      c.recv_in = me == c.root ? in(me, n) : std::vector<int>(n, kSentinel);
      c.expect = c.recv_in;
      for (size_t i = 0; i < n; i += 2) c.expect[i] = value(c.root, i, salt);
      break;
    case Coll::allgather:
    case Coll::allgather_in_place:
      c.recv_in.assign(n * P, kSentinel);
      if (coll == Coll::allgather) {
        c.send = in(me, n);
      } else {
        for (size_t i = 0; i < n; ++i) c.recv_in[me * n + i] = value(me, i, salt);
      }
      c.expect.resize(n * P);
      for (int r = 0; r < p; ++r)
        for (size_t i = 0; i < n; ++i) c.expect[r * n + i] = value(r, i, salt);
      break;
    case Coll::allgatherv:
      c.send = in(me, static_cast<size_t>(c.counts[me]));
      c.recv_in.assign(static_cast<size_t>(off), kSentinel);
      c.expect = c.recv_in;
      for (int r = 0; r < p; ++r)
        for (int i = 0; i < c.counts[r]; ++i) c.expect[c.displs[r] + i] = value(r, i, salt);
      break;
    case Coll::alltoall:
      c.send = in(me, n * P);
      c.recv_in.assign(n * P, kSentinel);
      c.expect.resize(n * P);
      for (int r = 0; r < p; ++r)  // block r comes from rank r's block me
        for (size_t i = 0; i < n; ++i) c.expect[r * n + i] = value(r, me * n + i, salt);
      break;
    case Coll::reduce_scatter_block:
      c.send = in(me, n * P);
      c.recv_in.assign(n, kSentinel);
      c.expect.assign(n, 0);
      for (int r = 0; r < p; ++r)
        for (size_t i = 0; i < n; ++i) c.expect[i] += value(r, me * n + i, salt);
      break;
    case Coll::reduce_scatter: {
      int total = 0, mine = 0;
      for (int r = 0; r < p; ++r) {
        if (r == me) mine = total;
        total += c.counts[r];
      }
      c.send = in(me, static_cast<size_t>(total));
      c.recv_in.assign(static_cast<size_t>(c.counts[me]), kSentinel);
      c.expect.assign(static_cast<size_t>(c.counts[me]), 0);
      for (int r = 0; r < p; ++r)
        for (int i = 0; i < c.counts[me]; ++i) c.expect[i] += value(r, mine + i, salt);
      break;
    }
  }
  return c;
}

int call(const Case& c, const void* send, void* recv, MPI_Comm comm) {
  MPI_Request req = MPI_REQUEST_NULL;
  MPI_Request* r = c.nonblocking ? &req : nullptr;
  const int n = static_cast<int>(c.n);
  const void* s = send ? send : MPI_IN_PLACE;
  int rc = MPI_SUCCESS;
  switch (c.coll) {
    case Coll::allreduce:
    case Coll::allreduce_in_place:
      rc = r ? MPI_Iallreduce(s, recv, n, MPI_INT, MPI_SUM, comm, r)
             : MPI_Allreduce(s, recv, n, MPI_INT, MPI_SUM, comm);
      break;
    case Coll::reduce:
      rc = r ? MPI_Ireduce(s, recv, n, MPI_INT, MPI_SUM, c.root, comm, r)
             : MPI_Reduce(s, recv, n, MPI_INT, MPI_SUM, c.root, comm);
      break;
    case Coll::bcast:
      rc = r ? MPI_Ibcast(recv, n, MPI_INT, c.root, comm, r) : MPI_Bcast(recv, n, MPI_INT, c.root, comm);
      break;
    case Coll::bcast_strided: {
      const int k = (n + 1) / 2;
      rc = r ? MPI_Ibcast(recv, k, g_every_other_int, c.root, comm, r)
             : MPI_Bcast(recv, k, g_every_other_int, c.root, comm);
      break;
    }
    case Coll::allgather:
    case Coll::allgather_in_place:
      rc = r ? MPI_Iallgather(s, send ? n : 0, MPI_INT, recv, n, MPI_INT, comm, r)
             : MPI_Allgather(s, send ? n : 0, MPI_INT, recv, n, MPI_INT, comm);
      break;
    case Coll::allgatherv:
      rc = r ? MPI_Iallgatherv(s, c.counts[g_rank], MPI_INT, recv, c.counts.data(), c.displs.data(),
                               MPI_INT, comm, r)
             : MPI_Allgatherv(s, c.counts[g_rank], MPI_INT, recv, c.counts.data(), c.displs.data(),
                              MPI_INT, comm);
      break;
    case Coll::alltoall:
      rc = r ? MPI_Ialltoall(s, n, MPI_INT, recv, n, MPI_INT, comm, r)
             : MPI_Alltoall(s, n, MPI_INT, recv, n, MPI_INT, comm);
      break;
    case Coll::reduce_scatter_block:
      rc = r ? MPI_Ireduce_scatter_block(s, recv, n, MPI_INT, MPI_SUM, comm, r)
             : MPI_Reduce_scatter_block(s, recv, n, MPI_INT, MPI_SUM, comm);
      break;
    case Coll::reduce_scatter:
      rc = r ? MPI_Ireduce_scatter(s, recv, c.counts.data(), MPI_INT, MPI_SUM, comm, r)
             : MPI_Reduce_scatter(s, recv, c.counts.data(), MPI_INT, MPI_SUM, comm);
      break;
  }
  if (rc == MPI_SUCCESS && r) rc = MPI_Wait(r, MPI_STATUS_IGNORE);
  return rc;
}

struct Streams {
  CUstream_st* blocking = nullptr;    // a writer
  CUstream_st* nonblocking = nullptr; // a writer (with the legacy stream's event wait)
  CUstream_st* reader = nullptr;      // another blocking stream: reads the result back
};

CUstream_st* stream_of(Writer w, const Streams& s) {
  switch (w) {
    case Writer::legacy: return kLegacy;
    case Writer::blocking: return s.blocking;
    case Writer::per_thread: return kPerThread;
    case Writer::event: return s.nonblocking;
  }
  return nullptr;
}

int g_device = 0;  // where the MPI_I* calls' buffers are

void run_case(Writer w, const Case& c, const Streams& st) {
  const std::string what = std::string(name_of(c.coll)) + (c.nonblocking ? " (MPI_I*)" : "") +
                           ", input written on the " + name_of(w) + ", salt " +
                           std::to_string(c.salt);
  const unsigned long long races0 = cu("races");
  const size_t sbytes = c.send.size() * sizeof(int), rbytes = c.recv_in.size() * sizeof(int);
  const int dev = c.nonblocking ? g_device : 0;
  void* send = sbytes ? api.malloc_device(dev, sbytes) : nullptr;
  void* recv = api.malloc_device(dev, rbytes);
  int* back = static_cast<int*>(api.malloc_pinned(rbytes));
  CUstream_st* ws = stream_of(w, st);
  // The writer: the receive buffer's old contents, then the input; nothing synchronised.
  const unsigned long long gpu0 = cu("gpu_progress_executed");
  bool ok = api.enqueue_copy(ws, recv, c.recv_in.data(), rbytes) == 0 &&
            (!send || api.enqueue_copy(ws, send, c.send.data(), sbytes) == 0);
  CUevent_st* ev = nullptr;
  if (w == Writer::event) {
    ev = cuapi.event_new();
    ok = ok && ev && cuapi.event_record(ev, ws, 1) == 0 && cuapi.stream_wait(kLegacy, ev, 1) == 0;
  }
  check(ok, what + ": the program's own stream work could be enqueued");
  // (Deferred: the input is still pending when the call starts, so a call that does not
  // order itself after it reads the old contents; the fake GPU runs it on its own only
  // once it has waited FAKE_CUDA_GPU_PROGRESS_MS.)
  if (api.deferred()) check(still_pending(PendingLook{ws, 0, gpu0}), what + ": the input is still pending (deferred)");
  check(call(c, send, recv, MPI_COMM_WORLD) == MPI_SUCCESS, what + ": the call succeeds");
  // Read back on another blocking stream, without synchronising anything else first.
  check(cuapi.memcpy_async(reinterpret_cast<unsigned long long>(back),
                           reinterpret_cast<unsigned long long>(recv), rbytes, st.reader) == 0,
        what + ": the read-back copy");
  api.stream_sync(st.reader);
  check(api.host_access(back, rbytes, 0) == 0, what + ": the host reads what it has seen done");
  std::vector<int> got(c.expect.size());
  std::memcpy(got.data(), back, rbytes);
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != c.expect[i] && bad++ == 0) first = i;
  check(bad == 0, what + ": " + std::to_string(bad) + " wrong elements" +
                      (bad ? " (first at " + std::to_string(first) + ": " + std::to_string(got[first]) +
                                 ", expected " + std::to_string(c.expect[first]) + ")"
                           : std::string()));
  // The writer's stream is through before its buffers go (the program's own duty).
  api.stream_sync(ws);
  if (ev) cuapi.event_delete(ev);
  const unsigned long long races = cu("races") - races0;
  check(races == 0, what + ": " + std::to_string(races) + " races reported by the fake driver");
  api.free(back);
  api.free(recv);
  if (send) api.free(send);
}

void on_alarm(int) {
  const char msg[] = "classic_order: time limit reached (a hang)\n";
  if (write(2, msg, sizeof msg - 1) < 0) {
  }
  _exit(3);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  std::string expect;
  int rounds = 1;
  int device = 0;
  bool ipc_errors_ok = false, packed_on_gpu = false, reset = false;
  std::string fused_on;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--expect=", 0) == 0) expect = a.substr(9);
    else if (a.rfind("--rounds=", 0) == 0) rounds = std::atoi(a.c_str() + 9);
    else if (a == "--ipc-errors-ok") ipc_errors_ok = true;
    else if (a == "--packed-on-gpu") packed_on_gpu = true;
    else if (a == "--reset") reset = true;
    else if (a.rfind("--fused-on=", 0) == 0) fused_on = a.substr(11);
    else if (a.rfind("--device=", 0) == 0) device = std::atoi(a.c_str() + 9);
  }
  // A CUDA program: its device (and context) chosen before its first MPI call.
  int ok = load_api(false) && load_cu() && api.runtime_init() == 0 ? 1 : 0, all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all_ok) {
    if (g_rank == 0) std::fprintf(stderr, "classic_order: the fake driver is not loaded\n");
    MPI_Finalize();
    return 1;
  }
  signal(SIGALRM, on_alarm);
  alarm(240);
  g_device = device;
  MPI_Type_create_resized(MPI_INT, 0, 2 * sizeof(int), &g_every_other_int);
  MPI_Type_commit(&g_every_other_int);
  auto device_reset = reinterpret_cast<fake_cuda_device_reset_fn>(
      dlsym(dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL), "fake_cuda_device_reset"));
  Streams st;
  unsigned salt = 0;
  for (int round = 0; round < rounds; ++round) {
    if (round > 0 && reset) {  // the program's streams go with the reset
      api.stream_destroy(st.blocking);
      api.stream_destroy(st.nonblocking);
      api.stream_destroy(st.reader);
      check(device_reset && device_reset(0) == 0, "cudaDeviceReset");
    }
    if (round == 0 || reset) {
      st.blocking = api.stream_create(0);
      st.nonblocking = api.stream_create(kNonBlocking);
      st.reader = api.stream_create(0);
      check(st.blocking && st.nonblocking && st.reader, "the program's streams");
    }
    for (Writer w : {Writer::legacy, Writer::blocking, Writer::per_thread, Writer::event})
      for (Coll coll : kColls)
        for (bool nonblocking : {false, true}) run_case(w, make_case(coll, nonblocking, salt++), st);
  }
  // The routes the run was meant to test.
  size_t pos = 0;
  while (pos < expect.size()) {
    size_t end = expect.find(',', pos);
    if (end == std::string::npos) end = expect.size();
    const std::string item = expect.substr(pos, end - pos);
    const size_t colon = item.find(':');
    if (colon != std::string::npos) {
      const std::string coll = item.substr(0, colon), route = item.substr(colon + 1);
      const unsigned long long n = stat_calls(coll, route.c_str(), "device");
      check(n > 0 && n != ~0ull, coll + " ran on route " + route + " on device memory (" +
                                     std::to_string(n == ~0ull ? 0 : n) + " calls)");
    }
    pos = end + 1;
  }
  if (!fused_on.empty()) {
    auto on = reinterpret_cast<unsigned long long (*)(const char*)>(
        dlsym(RTLD_DEFAULT, "streamcoll_fusion_messages_on"));
    auto gpu = reinterpret_cast<unsigned long long (*)()>(
        dlsym(RTLD_DEFAULT, "streamcoll_fusion_messages_packed_on_gpu"));
    const unsigned long long n = on ? on(fused_on.c_str()) : 0, g = gpu ? gpu() : 0;
    check(n > 0, "fused messages on route " + fused_on + " (" + std::to_string(n) + ")");
    if (packed_on_gpu) check(g > 0, "fused messages packed in GPU memory (" + std::to_string(g) + ")");
  }
  // After a reset, streamcoll finds its ordering event gone once (one error), and makes
  // a new one.
  const unsigned long long errors = cu("errors"), expected_errors = reset && rounds > 1 ? 1 : 0;
  if (!ipc_errors_ok)
    check(errors == expected_errors, "the fake driver returned " + std::to_string(errors) +
                                         " errors (expected " + std::to_string(expected_errors) + ")");
  api.stream_destroy(st.blocking);
  api.stream_destroy(st.nonblocking);
  api.stream_destroy(st.reader);
  api.runtime_fini();
  MPI_Type_free(&g_every_other_int);
  alarm(0);
  int counts[2] = {g_pass, g_fail}, total[2] = {0, 0};
  MPI_Reduce(counts, total, 2, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
  MPI_Finalize();
  if (g_rank == 0)
    std::printf("classic_order (%d ranks): %d passed, %d failed\n", g_size, total[0], total[1]);
  return total[1] == 0 && g_fail == 0 ? 0 : 1;
}
