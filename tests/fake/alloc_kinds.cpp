// Memory kinds asserted on a communicator (MPI 4.1 mpi_assert_memory_alloc_kinds,
// core/alloc_kinds.hpp, shim/comm_info.cpp), against the fake driver.
//   alloc_kinds assert   communicators made or changed with the info key on every rank
//                        alike, on some ranks only, with values not understood, cleared:
//                        every value right; where host memory alone is asserted on every
//                        rank, no buffer is classified (no cuPointerGetAttributes) and no
//                        agreement runs (streamcoll_agreement_counts); elsewhere both do.
//                        With STREAMCOLL_CHECK=1 the buffers are classified to check the
//                        assertion (values still right).
//   alloc_kinds violate  (STREAMCOLL_CHECK=1) rank 0 passes device memory on a
//                        communicator that asserts "system": streamcoll aborts the job
//                        (the program exits 0 only if it did not: a should_fail test).
#include <sys/mman.h>

#include "harness.hpp"

namespace {

using AgreementCountsFn = void (*)(unsigned long long*, unsigned long long*, unsigned long long*);
AgreementCountsFn g_counts = nullptr;

unsigned long long agreements() {
  unsigned long long blocking = 0, refreshes = 0, waited = 0;
  g_counts(&blocking, &refreshes, &waited);
  return blocking + refreshes;
}

MPI_Info info_with(const char* value) {
  MPI_Info info;
  MPI_Info_create(&info);
  if (value) MPI_Info_set(info, "mpi_assert_memory_alloc_kinds", value);
  return info;
}

MPI_Comm dup_with(const char* value) {
  MPI_Info info = info_with(value);
  MPI_Comm c;
  MPI_Comm_dup_with_info(MPI_COMM_WORLD, info, &c);
  MPI_Info_free(&info);
  return c;
}

// Host memory outside the heap and the stack (which streamcoll knows for host memory
// without asking the driver): mapped, as large arrays and other allocators' memory are.
constexpr size_t kMapped = 1 << 20;
void* host_alloc(size_t bytes) {
  if (bytes > kMapped) std::abort();
  void* p = mmap(nullptr, kMapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}
void* device_alloc(size_t bytes) { return api.malloc(bytes); }
void* pinned_alloc(size_t bytes) { return api.malloc_pinned(bytes); }

// Runs allreduce, reduce (root: the last rank), bcast (root 1 % size), allgather,
// reduce_scatter_block and an MPI_Iallreduce on `comm` with buffers from `alloc`, each
// `reps` times, and checks every value against the host's own sums.
void run_calls(MPI_Comm comm, const std::string& what, void* (*alloc)(size_t), int reps) {
  const int n = 64, p = g_size, r = g_rank;
  int* send = static_cast<int*>(alloc(sizeof(int) * n * p));
  int* recv = static_cast<int*>(alloc(sizeof(int) * n * p));
  auto sum_of = [&](int i, int rep) {  // of (rank + 1) * (i + rep + 1) over the ranks
    return p * (p + 1) / 2 * (i + rep + 1);
  };
  for (int rep = 0; rep < reps; ++rep) {
    for (int i = 0; i < n * p; ++i) send[i] = (r + 1) * (i % n + rep + 1);
    bool ok = true;
    MPI_Allreduce(send, recv, n, MPI_INT, MPI_SUM, comm);
    for (int i = 0; i < n; ++i) ok &= recv[i] == sum_of(i, rep);
    check(ok, what + ": allreduce");

    ok = true;
    MPI_Reduce(send, recv, n, MPI_INT, MPI_SUM, p - 1, comm);
    if (r == p - 1)
      for (int i = 0; i < n; ++i) ok &= recv[i] == sum_of(i, rep);
    check(ok, what + ": reduce at the last rank");

    ok = true;
    const int root = 1 % p;
    for (int i = 0; i < n; ++i) recv[i] = r == root ? 7 * i + rep : -1;
    MPI_Bcast(recv, n, MPI_INT, root, comm);
    for (int i = 0; i < n; ++i) ok &= recv[i] == 7 * i + rep;
    check(ok, what + ": bcast");

    ok = true;
    MPI_Allgather(send, n, MPI_INT, recv, n, MPI_INT, comm);
    for (int q = 0; q < p; ++q)
      for (int i = 0; i < n; ++i) ok &= recv[q * n + i] == (q + 1) * (i + rep + 1);
    check(ok, what + ": allgather");

    ok = true;
    MPI_Reduce_scatter_block(send, recv, n, MPI_INT, MPI_SUM, comm);
    for (int i = 0; i < n; ++i) ok &= recv[i] == sum_of(i, rep);
    check(ok, what + ": reduce_scatter_block");

    ok = true;
    MPI_Request req;
    MPI_Iallreduce(send, recv, n, MPI_INT, MPI_SUM, comm, &req);
    MPI_Wait(&req, MPI_STATUS_IGNORE);
    for (int i = 0; i < n; ++i) ok &= recv[i] == sum_of(i, rep);
    check(ok, what + ": iallreduce");
  }
  if (alloc == host_alloc) {
    munmap(send, kMapped);
    munmap(recv, kMapped);
  } else {
    api.free(send);
    api.free(recv);
  }
}

// The calls of run_calls on host memory; `asserted`: whether every rank asserted host
// memory alone (then no classification and no agreement may happen).
void host_calls(MPI_Comm comm, const std::string& what, bool asserted, bool check_on) {
  const unsigned long long classified = cu("cuPointerGetAttributes"), agreed = agreements();
  run_calls(comm, what, host_alloc, 20);
  const unsigned long long c = cu("cuPointerGetAttributes") - classified, g = agreements() - agreed;
  if (asserted && !check_on) {
    check(c == 0, what + ": no buffer classified (" + std::to_string(c) + ")");
    check(g == 0, what + ": no agreement (" + std::to_string(g) + ")");
  } else {
    check(c > 0, what + ": buffers classified (" + std::to_string(c) + ")");
  }
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  const std::string mode = argc > 1 ? argv[1] : "assert";
  g_counts = reinterpret_cast<AgreementCountsFn>(dlsym(RTLD_DEFAULT, "streamcoll_agreement_counts"));
  if (!load_api(false) || !g_counts) MPI_Abort(MPI_COMM_WORLD, 2);
  api.runtime_init();
  const bool check_on = std::getenv("STREAMCOLL_CHECK") && std::string(std::getenv("STREAMCOLL_CHECK")) == "1";

  if (mode == "violate") {
    MPI_Comm c = dup_with("system");
    run_calls(c, "system, rank 0 on device memory", g_rank == 0 ? device_alloc : host_alloc, 1);
    // Reached only when the check missed it: the test (should_fail) fails on exit 0.
    std::fprintf(stderr, "[rank %d] FAIL: the broken assertion was not caught\n", g_rank);
    MPI_Finalize();
    return 0;
  }

  // Asserted alike on every rank: by MPI_Comm_dup_with_info, MPI_Comm_split_type, and
  // MPI_Comm_set_info on a communicator that had none.
  MPI_Comm sys = dup_with("system");
  host_calls(sys, "dup_with_info system", true, check_on);
  MPI_Comm both = dup_with(" mpi:alloc_mem , system");
  host_calls(both, "dup_with_info mpi:alloc_mem,system", true, check_on);
  MPI_Info info = info_with("system");
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g_rank, info, &node);
  host_calls(node, "split_type system", true, check_on);
  MPI_Comm later;
  MPI_Comm_dup(MPI_COMM_WORLD, &later);
  host_calls(later, "no assertion", false, check_on);
  MPI_Comm_set_info(later, info);
  host_calls(later, "set_info system", true, check_on);
  // Cleared by an info without the key: classified and agreed again.
  MPI_Info none = info_with(nullptr);
  MPI_Comm_set_info(later, none);
  host_calls(later, "set_info without the key", false, check_on);

  // Not used: ranks that differ, a value not understood, device memory asserted.
  MPI_Comm differ = dup_with(g_rank == 0 ? "system" : nullptr);
  host_calls(differ, g_size > 1 ? "asserted on rank 0 only" : "asserted (1 rank)",
             g_size == 1, check_on);
  MPI_Comm differ2 = dup_with(g_rank == g_size - 1 ? "cuda:device" : "system");
  host_calls(differ2, "system, and cuda:device on the last rank", false, check_on);
  MPI_Comm rocm = dup_with("system,rocm:device");
  host_calls(rocm, "system,rocm:device (not understood)", false, check_on);
  MPI_Comm dev = dup_with("cuda:device");
  run_calls(dev, "cuda:device on device memory", device_alloc, 5);
  // Pinned memory asserted with cuda:host; system memory that happens to be pinned.
  MPI_Comm pinned = dup_with("cuda:host");
  run_calls(pinned, "cuda:host on pinned memory", pinned_alloc, 5);
  run_calls(sys, "system on pinned memory", pinned_alloc, 5);

  for (MPI_Comm* c : {&sys, &both, &node, &later, &differ, &differ2, &rocm, &dev, &pinned})
    MPI_Comm_free(c);
  MPI_Info_free(&info);
  MPI_Info_free(&none);
  int fails = g_fail;
  MPI_Allreduce(MPI_IN_PLACE, &fails, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (g_rank == 0)
    std::printf("alloc_kinds (%s, %d ranks%s): %d passed, %d failed on all ranks\n", mode.c_str(),
                g_size, check_on ? ", STREAMCOLL_CHECK=1" : "", g_pass, fails);
  api.runtime_fini();
  MPI_Finalize();
  return fails ? 1 : 0;
}
