// fusion_stream: stream-ordered MPI_Iallreduce fusion (algorithms/fusion.hpp, docs/guide.md "Fusion")
// on a real GPU, every rank on GPU 0 (ranks share it; the fused messages run on the host,
// route pmpi or ht, so NCCL's one-rank-per-GPU rule does not apply).
//
// Per route (pmpi, ht): a duplicate of MPI_COMM_WORLD with "allreduce:ROUTE:fuse=64K"
// forced, a stream attached on every rank (so the agreed facts have one), then 10 rounds
// of 24 MPI_Iallreduce calls (MPI_DOUBLE and, every eighth call, MPI_INT, both MPI_SUM;
// 1-300 elements; every third in place), completed with MPI_Waitall, MPI_Wait in reverse
// or an MPI_Testall loop, differing between ranks and rounds:
//   - odd rounds, the host does not wait: every rank's input is written on the stream by
//     copy kernels behind a kernel that spins 200 ms (the buffers poisoned before), and
//     the 24 calls are started and completed while the stream is held. The host must be
//     back within 50 ms and the stream still busy (cudaStreamQuery: not ready); the
//     results are read on the stream after the calls;
//   - even rounds: the input written by cudaMemcpyAsync on the stream just before each
//     call; on the last rank (with 2 or more) every third call passes host buffers
//     (plain semantics, mixed with the stream-ordered ones).
// Every result is compared with the sum computed on the host; the calls must have been
// fused (streamcoll_fusion_counts: fewer messages than calls), and on route ht the fused
// messages counted there. Run with STREAMCOLL_HT_WAIT=auto (cuStreamWaitValue32 holds)
// and =kernel (the spin-kernel holds): tests/gpu/meson.build. With
// STREAMCOLL_FUSION_NCCL=1 (one rank: NCCL takes one rank per GPU) the route is nccl
// alone: every fused message must run on NCCL (algorithms/fusion.hpp, ROUTE). Skips (exit 77)
// without a GPU or without the test kernels.
#include <unistd.h>

#include <string>
#include <vector>

#include "../mpi/complete_differently.hpp"
#include "gpu_common.hpp"

using namespace gputest;

namespace {

using SetRouteFn = int (*)(MPI_Comm, const char*);
using FusionCountsFn = void (*)(unsigned long long*, unsigned long long*, unsigned long long*);
using MessagesOnFn = unsigned long long (*)(const char*);

constexpr int kCalls = 24;
constexpr int kRounds = 10;
constexpr size_t kMaxCount = 300;
constexpr double kSpinMs = 200.0;
constexpr double kHostLimitMs = 50.0;
constexpr double kLateMs = 300.0;  // the last rank's lateness in the held rounds

// Call `id`'s input on `rank`, element j: small integers, so that sums are exact.
long input(int rank, int id, size_t j) { return (rank + 1) * static_cast<long>((id * 7 + j) % 101); }
long expected_sum(int nranks, int id, size_t j) {
  return static_cast<long>(nranks) * (nranks + 1) / 2 * static_cast<long>((id * 7 + j) % 101);
}

struct Slot {
  void *d_in = nullptr, *d_out = nullptr, *d_stage = nullptr;  // device (cudaMalloc)
  void *h_in = nullptr, *h_res = nullptr;                        // pinned host
  std::vector<unsigned char> p_in, p_out;                         // pageable host
};

struct Call {
  int id = 0;
  bool is_int = false, in_place = false, host = false;
  size_t n = 0;
  MPI_Request req = MPI_REQUEST_NULL;
  size_t bytes() const { return n * (is_int ? sizeof(int) : sizeof(double)); }
};

void fill(void* dst, const Call& c, int rank) {
  for (size_t j = 0; j < c.n; ++j) {
    if (c.is_int)
      static_cast<int*>(dst)[j] = static_cast<int>(input(rank, c.id, j));
    else
      static_cast<double*>(dst)[j] = static_cast<double>(input(rank, c.id, j));
  }
}

// Empty when `got` holds call c's sum; else the first difference.
std::string compare(const void* got, const Call& c, int nranks) {
  for (size_t j = 0; j < c.n; ++j) {
    const long want = expected_sum(nranks, c.id, j);
    const double g = c.is_int ? static_cast<const int*>(got)[j] : static_cast<const double*>(got)[j];
    if (g != static_cast<double>(want))
      return "element " + std::to_string(j) + " is " + std::to_string(g) + ", expected " +
             std::to_string(want);
  }
  return "";
}

int complete(std::vector<Call>& calls, int how) {
  std::vector<MPI_Request> reqs;
  for (Call& c : calls) reqs.push_back(c.req);
  const int rc = sctest::complete_differently(reqs, how);
  for (Call& c : calls) c.req = MPI_REQUEST_NULL;
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  skip_if(gpu_unusable_reason(0));  // every rank on GPU 0
  require_streamcoll();
  Kernels k;
  require_kernels(k);
  const auto set_route = reinterpret_cast<SetRouteFn>(dlsym(RTLD_DEFAULT, "streamcoll_comm_set_route"));
  const auto counts = reinterpret_cast<FusionCountsFn>(dlsym(RTLD_DEFAULT, "streamcoll_fusion_counts"));
  const auto messages_on = reinterpret_cast<MessagesOnFn>(dlsym(RTLD_DEFAULT, "streamcoll_fusion_messages_on"));
  fail_if(set_route && counts && messages_on
              ? ""
              : "streamcoll lacks streamcoll_comm_set_route or the fusion counters");
  fail_if(provided == MPI_THREAD_MULTIPLE ? "" : "fusion needs MPI_THREAD_MULTIPLE");
  const int rank = world_rank(), nranks = world_size();
  const char* wait = std::getenv("STREAMCOLL_HT_WAIT");
  if (rank == 0)
    std::printf("fusion_stream: %d rank(s) on GPU 0, STREAMCOLL_HT_WAIT=%s\n", nranks,
                wait ? wait : "(unset: auto)");

  Tally t("fusion_stream");
  {
    const size_t cap = kMaxCount * sizeof(double);
    std::vector<Slot> slots(kCalls);
    for (Slot& s : slots) {
      for (void** d : {&s.d_in, &s.d_out, &s.d_stage}) GT_CUDA(cudaMalloc(d, cap));
      for (void** h : {&s.h_in, &s.h_res}) GT_CUDA(cudaMallocHost(h, cap));
      s.p_in.resize(cap);
      s.p_out.resize(cap);
    }
    cudaStream_t s = nullptr;
    GT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int next_id = 1;
    std::vector<const char*> routes = {"pmpi", "ht"};
    if (const char* fn = std::getenv("STREAMCOLL_FUSION_NCCL"); fn && std::string(fn) == "1") {
      fail_if(nranks == 1 ? "" : "fused messages on NCCL: one rank (NCCL takes one rank per GPU)");
      routes = {"nccl"};
    }
    for (const char* route : routes) {
      MPI_Comm comm = MPI_COMM_NULL;
      GT_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
      const std::string spec = std::string("allreduce:") + route + ":fuse=64K";
      fail_if(set_route(comm, spec.c_str()) == MPI_SUCCESS ? "" : "streamcoll_comm_set_route(" + spec + ") failed");
      t.check(streamcoll_comm_attach_stream(comm, s) == MPI_SUCCESS, "attaching the stream failed");
      {  // a blocking call after the attachment: the facts later calls use have the stream
        double one = 1, *d = static_cast<double*>(slots[0].d_out);
        GT_CUDA(cudaMemcpyAsync(d, &one, sizeof one, cudaMemcpyHostToDevice, s));
        GT_MPI(MPI_Allreduce(MPI_IN_PLACE, d, 1, MPI_DOUBLE, MPI_SUM, comm));
        GT_CUDA(cudaMemcpyAsync(slots[0].h_res, d, sizeof one, cudaMemcpyDeviceToHost, s));
        GT_CUDA(cudaStreamSynchronize(s));
        t.check(*static_cast<double*>(slots[0].h_res) == nranks, "route %s: the warm-up allreduce", route);
      }
      unsigned long long calls0 = 0, msgs0 = 0, agr = 0, calls1 = 0, msgs1 = 0;
      counts(&calls0, &msgs0, &agr);
      const unsigned long long on0 = messages_on(route);
      double worst_ms = 0;
      for (int round = 0; round < kRounds; ++round) {
        const bool held = round % 2 == 1;
        const std::string where = std::string("route ") + route + ", round " + std::to_string(round) +
                                  (held ? " (stream held)" : "");
        std::vector<Call> calls(kCalls);
        for (int i = 0; i < kCalls; ++i) {
          Call& c = calls[i];
          c.id = next_id++;
          c.is_int = i % 8 == 5;
          c.in_place = (i + round) % 3 == 0;
          c.host = !held && nranks > 1 && rank == nranks - 1 && (i + round) % 3 == 1;
          c.n = 1 + static_cast<size_t>((i * 37 + round * 11) % kMaxCount);
        }
        if (held) {  // inputs to the staging buffers, the real ones poisoned, synchronously
          for (int i = 0; i < kCalls; ++i) {
            fill(slots[i].h_in, calls[i], rank);
            GT_CUDA(cudaMemcpy(slots[i].d_stage, slots[i].h_in, calls[i].bytes(), cudaMemcpyHostToDevice));
            GT_CUDA(cudaMemset(slots[i].d_in, 0xEE, cap));
            GT_CUDA(cudaMemset(slots[i].d_out, 0xEE, cap));
          }
          GT_CUDA(cudaDeviceSynchronize());
          k.spin(s, kSpinMs);
          for (int i = 0; i < kCalls; ++i)
            k.copy(s, calls[i].in_place ? slots[i].d_out : slots[i].d_in, slots[i].d_stage, calls[i].bytes());
          // No barrier: the last rank arrives kLateMs late, and the others' hosts must
          // not wait for it (stream-ordered starts and waits).
          if (nranks > 1 && rank == nranks - 1) usleep(static_cast<useconds_t>(kLateMs * 1000));
        }
        const double t0 = now_ms();
        int rc = MPI_SUCCESS;
        for (int i = 0; i < kCalls && rc == MPI_SUCCESS; ++i) {
          Call& c = calls[i];
          Slot& sl = slots[i];
          void* out = c.host ? sl.p_out.data() : sl.d_out;
          void* in = c.host ? sl.p_in.data() : sl.d_in;
          if (!held) {
            if (c.host) {
              fill(c.in_place ? out : in, c, rank);
            } else {
              fill(sl.h_in, c, rank);
              GT_CUDA(cudaMemcpyAsync(c.in_place ? out : in, sl.h_in, c.bytes(), cudaMemcpyHostToDevice, s));
            }
          }
          rc = MPI_Iallreduce(c.in_place ? MPI_IN_PLACE : in, out, static_cast<int>(c.n),
                              c.is_int ? MPI_INT : MPI_DOUBLE, MPI_SUM, comm, &c.req);
        }
        t.check(rc == MPI_SUCCESS, "%s: MPI_Iallreduce returned %d", where.c_str(), rc);
        if (rc != MPI_SUCCESS) break;  // the other ranks' calls would wait for ours
        rc = complete(calls, rank + round);
        const double ms = now_ms() - t0;
        t.check(rc == MPI_SUCCESS, "%s: completion returned %d", where.c_str(), rc);
        if (held) {
          const cudaError_t q = cudaStreamQuery(s);
          worst_ms = std::max(worst_ms, ms);
          t.check(ms < kHostLimitMs, "%s: %d calls took the host %.3f ms (limit %.0f ms; the stream is held %.0f ms)",
                  where.c_str(), kCalls, ms, kHostLimitMs, kSpinMs);
          t.check(q == cudaErrorNotReady,
                  "%s: the stream had finished when the calls completed (cudaStreamQuery: %s): the host waited",
                  where.c_str(), cudaGetErrorString(q));
        }
        // The results, read on the stream after the calls.
        for (int i = 0; i < kCalls; ++i)
          if (!calls[i].host)
            GT_CUDA(cudaMemcpyAsync(slots[i].h_res, slots[i].d_out, calls[i].bytes(), cudaMemcpyDeviceToHost, s));
        GT_CUDA(cudaStreamSynchronize(s));
        for (int i = 0; i < kCalls; ++i) {
          const Call& c = calls[i];
          const std::string diff = compare(c.host ? slots[i].p_out.data() : slots[i].h_res, c, nranks);
          t.check(diff.empty(), "%s: call %d (%s, n=%zu%s%s): %s", where.c_str(), i, c.is_int ? "MPI_INT" : "MPI_DOUBLE",
                  c.n, c.in_place ? ", in place" : "", c.host ? ", host buffers" : "", diff.c_str());
        }
      }
      counts(&calls1, &msgs1, &agr);
      const unsigned long long on = messages_on(route) - on0;
      if (rank == 0)
        std::printf("route %s: %llu calls in %llu fused messages (%llu counted on %s); held rounds: the host "
                    "back after at most %.3f ms for %d calls\n",
                    route, calls1 - calls0, msgs1 - msgs0, on, route, worst_ms, kCalls);
      t.check(calls1 - calls0 == static_cast<unsigned long long>(kCalls) * kRounds,
              "route %s: %llu fused calls counted, %d made", route, calls1 - calls0, kCalls * kRounds);
      t.check(msgs1 - msgs0 < calls1 - calls0, "route %s: not fused (%llu calls in %llu messages)", route,
              calls1 - calls0, msgs1 - msgs0);
      t.check(on == msgs1 - msgs0, "route %s: %llu of %llu fused messages counted there", route, on, msgs1 - msgs0);
      t.check(streamcoll_comm_detach_stream(comm) == MPI_SUCCESS, "detaching the stream failed");
      GT_MPI(MPI_Comm_free(&comm));
    }
    GT_CUDA(cudaDeviceSynchronize());
    GT_CUDA(cudaStreamDestroy(s));
    for (Slot& sl : slots) {
      for (void* d : {sl.d_in, sl.d_out, sl.d_stage}) cudaFree(d);
      for (void* h : {sl.h_in, sl.h_res}) cudaFreeHost(h);
    }
  }
  return t.finish();
}
