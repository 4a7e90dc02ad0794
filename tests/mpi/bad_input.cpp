// Bad input through the shim must give the same MPI error class as the real MPI, and
// never crash. Each case is run twice in the same process: through MPI_X (the shim, when
// it is loaded) and through PMPI_X (the real MPI). With MPI_ERRORS_RETURN on
// MPI_COMM_WORLD and MPI_COMM_SELF both return their error code.
// Calls that crash the real MPI are the exception: see Case::shim_raises.
// Prints "N passed, N failed" on rank 0; exits nonzero on any failure.
#include <dlfcn.h>
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "streamcoll/streamcoll.h"

namespace {

struct Api {
  decltype(&MPI_Allreduce) allreduce;
  decltype(&MPI_Reduce) reduce;
  decltype(&MPI_Bcast) bcast;
  decltype(&MPI_Allgather) allgather;
  decltype(&MPI_Allgatherv) allgatherv;
  decltype(&MPI_Reduce_scatter_block) reduce_scatter_block;
  decltype(&MPI_Reduce_scatter) reduce_scatter;
  decltype(&MPI_Alltoall) alltoall;
  decltype(&MPI_Barrier) barrier;
  decltype(&MPI_Iallreduce) iallreduce;
  decltype(&MPI_Ireduce) ireduce;
  decltype(&MPI_Ibcast) ibcast;
  decltype(&MPI_Iallgather) iallgather;
  decltype(&MPI_Ireduce_scatter_block) ireduce_scatter_block;
  decltype(&MPI_Ialltoall) ialltoall;
};
const Api kShim = {MPI_Allreduce, MPI_Reduce, MPI_Bcast, MPI_Allgather, MPI_Allgatherv,
                   MPI_Reduce_scatter_block, MPI_Reduce_scatter, MPI_Alltoall, MPI_Barrier,
                   MPI_Iallreduce, MPI_Ireduce, MPI_Ibcast, MPI_Iallgather,
                   MPI_Ireduce_scatter_block, MPI_Ialltoall};
const Api kReal = {PMPI_Allreduce, PMPI_Reduce, PMPI_Bcast, PMPI_Allgather, PMPI_Allgatherv,
                   PMPI_Reduce_scatter_block, PMPI_Reduce_scatter, PMPI_Alltoall, PMPI_Barrier,
                   PMPI_Iallreduce, PMPI_Ireduce, PMPI_Ibcast, PMPI_Iallgather,
                   PMPI_Ireduce_scatter_block, PMPI_Ialltoall};

struct Case {
  std::string name;
  std::string counter;  // statistics name of the call
  std::function<int(const Api&)> call;
  // Nonzero where the real MPI is known to crash instead of returning an error (Open
  // MPI 4.1 does not check null data buffers or null request pointers, MPI_Allgather
  // dereferences MPI_COMM_NULL, MPI_Allgatherv copies negative counts): streamcoll
  // raises this class itself. The real call is not made; without the shim the case is
  // skipped.
  int shim_raises = 0;
};

int error_class(int rc) {
  int cls = rc;
  if (rc != MPI_SUCCESS) MPI_Error_class(rc, &cls);
  return cls;
}

std::string class_name(int cls) {
  char s[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(cls, s, &len);
  return std::to_string(cls) + " (" + std::string(s, static_cast<size_t>(len)) + ")";
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  using Get = int (*)(const char*, const char*, const char*, streamcoll_stat_t*);
  auto get = reinterpret_cast<Get>(dlsym(RTLD_DEFAULT, "streamcoll_get_stats"));
  const char* expect = std::getenv("STREAMCOLL_EXPECT_INTERCEPT");
  const bool check_stats = expect && std::string(expect) == "1";

  std::vector<int> buf(64 * static_cast<size_t>(size), 1), out(64 * static_cast<size_t>(size));
  std::vector<int> counts(static_cast<size_t>(size), 1), displs(static_cast<size_t>(size));
  for (int i = 0; i < size; ++i) displs[static_cast<size_t>(i)] = i;
  std::vector<int> neg_counts(static_cast<size_t>(size), -1);
  int* b = buf.data();
  int* o = out.data();
  MPI_Comm W = MPI_COMM_WORLD, N = MPI_COMM_NULL;
  MPI_Datatype I = MPI_INT, DN = MPI_DATATYPE_NULL;
  MPI_Request req;

  std::vector<Case> cases = {
      {"allreduce negative count", "allreduce", [&](const Api& m) { return m.allreduce(b, o, -1, I, MPI_SUM, W); }},
      {"allreduce MPI_COMM_NULL", "allreduce", [&](const Api& m) { return m.allreduce(b, o, 4, I, MPI_SUM, N); }},
      {"allreduce MPI_DATATYPE_NULL", "allreduce", [&](const Api& m) { return m.allreduce(b, o, 4, DN, MPI_SUM, W); }},
      {"allreduce MPI_OP_NULL", "allreduce", [&](const Api& m) { return m.allreduce(b, o, 4, I, MPI_OP_NULL, W); }},
      {"allreduce null recvbuf", "allreduce", [&](const Api& m) { return m.allreduce(b, nullptr, 4, I, MPI_SUM, W); }, MPI_ERR_BUFFER},
      {"allreduce null sendbuf", "allreduce", [&](const Api& m) { return m.allreduce(nullptr, o, 4, I, MPI_SUM, W); }, MPI_ERR_BUFFER},
      {"allreduce MPI_IN_PLACE as recvbuf", "allreduce", [&](const Api& m) { return m.allreduce(b, MPI_IN_PLACE, 4, I, MPI_SUM, W); }},
      {"reduce negative count", "reduce", [&](const Api& m) { return m.reduce(b, o, -5, I, MPI_MAX, 0, W); }},
      {"reduce root out of range", "reduce", [&](const Api& m) { return m.reduce(b, o, 4, I, MPI_MAX, size, W); }},
      {"reduce negative root", "reduce", [&](const Api& m) { return m.reduce(b, o, 4, I, MPI_MAX, -3, W); }},
      {"reduce MPI_COMM_NULL", "reduce", [&](const Api& m) { return m.reduce(b, o, 4, I, MPI_MAX, 0, N); }},
      {"reduce MPI_DATATYPE_NULL", "reduce", [&](const Api& m) { return m.reduce(b, o, 4, DN, MPI_MAX, 0, W); }},
      {"bcast negative count", "bcast", [&](const Api& m) { return m.bcast(b, -1, I, 0, W); }},
      {"bcast root out of range", "bcast", [&](const Api& m) { return m.bcast(b, 4, I, size + 2, W); }},
      {"bcast MPI_COMM_NULL", "bcast", [&](const Api& m) { return m.bcast(b, 4, I, 0, N); }},
      {"bcast MPI_DATATYPE_NULL", "bcast", [&](const Api& m) { return m.bcast(b, 4, DN, 0, W); }},
      {"bcast null buffer", "bcast", [&](const Api& m) { return m.bcast(nullptr, 4, I, 0, W); }, MPI_ERR_BUFFER},
      {"allgather negative sendcount", "allgather", [&](const Api& m) { return m.allgather(b, -1, I, o, 1, I, W); }},
      {"allgather negative recvcount", "allgather", [&](const Api& m) { return m.allgather(b, 1, I, o, -1, I, W); }},
      {"allgather MPI_COMM_NULL", "allgather", [&](const Api& m) { return m.allgather(b, 1, I, o, 1, I, N); }, MPI_ERR_COMM},
      {"allgather MPI_DATATYPE_NULL", "allgather", [&](const Api& m) { return m.allgather(b, 1, DN, o, 1, I, W); }},
      {"allgather null recvbuf", "allgather", [&](const Api& m) { return m.allgather(b, 1, I, nullptr, 1, I, W); }, MPI_ERR_BUFFER},
      {"allgatherv MPI_COMM_NULL", "allgatherv", [&](const Api& m) { return m.allgatherv(b, 1, I, o, counts.data(), displs.data(), I, N); }},
      {"allgatherv negative sendcount", "allgatherv", [&](const Api& m) { return m.allgatherv(b, -1, I, o, counts.data(), displs.data(), I, W); }},
      {"allgatherv negative recvcounts", "allgatherv", [&](const Api& m) { return m.allgatherv(b, 1, I, o, neg_counts.data(), displs.data(), I, W); }, MPI_ERR_COUNT},
      {"allgatherv MPI_DATATYPE_NULL", "allgatherv", [&](const Api& m) { return m.allgatherv(b, 1, I, o, counts.data(), displs.data(), DN, W); }},
      {"reduce_scatter_block negative count", "reduce_scatter_block", [&](const Api& m) { return m.reduce_scatter_block(b, o, -2, I, MPI_SUM, W); }},
      {"reduce_scatter_block MPI_COMM_NULL", "reduce_scatter_block", [&](const Api& m) { return m.reduce_scatter_block(b, o, 2, I, MPI_SUM, N); }},
      {"reduce_scatter_block MPI_DATATYPE_NULL", "reduce_scatter_block", [&](const Api& m) { return m.reduce_scatter_block(b, o, 2, DN, MPI_SUM, W); }},
      {"reduce_scatter negative recvcounts", "reduce_scatter", [&](const Api& m) { return m.reduce_scatter(b, o, neg_counts.data(), I, MPI_SUM, W); }, MPI_ERR_COUNT},
      {"reduce_scatter MPI_COMM_NULL", "reduce_scatter", [&](const Api& m) { return m.reduce_scatter(b, o, counts.data(), I, MPI_SUM, N); }},
      {"reduce_scatter MPI_OP_NULL", "reduce_scatter", [&](const Api& m) { return m.reduce_scatter(b, o, counts.data(), I, MPI_OP_NULL, W); }},
      {"alltoall negative count", "alltoall", [&](const Api& m) { return m.alltoall(b, -1, I, o, 1, I, W); }},
      {"alltoall MPI_COMM_NULL", "alltoall", [&](const Api& m) { return m.alltoall(b, 1, I, o, 1, I, N); }},
      {"alltoall MPI_DATATYPE_NULL", "alltoall", [&](const Api& m) { return m.alltoall(b, 1, I, o, 1, DN, W); }},
      {"barrier MPI_COMM_NULL", "barrier", [&](const Api& m) { return m.barrier(N); }},
      {"iallreduce negative count", "iallreduce", [&](const Api& m) { return m.iallreduce(b, o, -1, I, MPI_SUM, W, &req); }},
      {"iallreduce MPI_COMM_NULL", "iallreduce", [&](const Api& m) { return m.iallreduce(b, o, 4, I, MPI_SUM, N, &req); }},
      {"iallreduce MPI_DATATYPE_NULL", "iallreduce", [&](const Api& m) { return m.iallreduce(b, o, 4, DN, MPI_SUM, W, &req); }},
      {"iallreduce null request", "iallreduce", [&](const Api& m) { return m.iallreduce(b, o, 4, I, MPI_SUM, W, nullptr); }, MPI_ERR_REQUEST},
      {"ireduce root out of range", "ireduce", [&](const Api& m) { return m.ireduce(b, o, 4, I, MPI_SUM, size, W, &req); }},
      {"ibcast negative count", "ibcast", [&](const Api& m) { return m.ibcast(b, -1, I, 0, W, &req); }},
      {"ibcast MPI_COMM_NULL", "ibcast", [&](const Api& m) { return m.ibcast(b, 4, I, 0, N, &req); }},
      {"iallgather MPI_DATATYPE_NULL", "iallgather", [&](const Api& m) { return m.iallgather(b, 1, DN, o, 1, I, W, &req); }},
      {"ireduce_scatter_block negative count", "ireduce_scatter_block", [&](const Api& m) { return m.ireduce_scatter_block(b, o, -1, I, MPI_SUM, W, &req); }},
      {"ialltoall MPI_COMM_NULL", "ialltoall", [&](const Api& m) { return m.ialltoall(b, 1, I, o, 1, I, N, &req); }},
  };

  // MPICH 4.0 takes negative counts of MPI_Allreduce, MPI_Reduce, MPI_Reduce_scatter_block
  // and their MPI_I* forms without an error (MPI_Allreduce then writes outside its
  // buffers): streamcoll raises MPI_ERR_COUNT itself, as Open MPI does; the real call is
  // not made there.
  char lib[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  int lib_len = 0;
  MPI_Get_library_version(lib, &lib_len);
  if (std::strstr(lib, "MPICH Version:"))
    for (Case& c : cases)
      if (!c.shim_raises && c.name.find(" negative ") != std::string::npos &&
          c.name.find("count") != std::string::npos)
        c.shim_raises = MPI_ERR_COUNT;

  int passed = 0, failed = 0;
  for (const Case& c : cases) {
    streamcoll_stat_t before{}, after{};
    if (check_stats && get) get(c.counter.c_str(), nullptr, nullptr, &before);
    if (const char* only = std::getenv("BAD_INPUT_ONLY"); only && c.name.find(only) == std::string::npos)
      continue;  // one case (or a few) alone, to find what a failure comes from
    if (std::getenv("BAD_INPUT_VERBOSE")) std::fprintf(stderr, "case: %s\n", c.name.c_str());
    if (c.shim_raises && !get) continue;  // no shim loaded: the real call would crash
    // A call the MPI accepts (MPICH 4.0 takes negative counts) may start a request: it is
    // completed before the next call.
    auto finish = [&](int rc) {
      if (rc == MPI_SUCCESS && req != MPI_REQUEST_NULL) MPI_Wait(&req, MPI_STATUS_IGNORE);
      req = MPI_REQUEST_NULL;
      return rc;
    };
    req = MPI_REQUEST_NULL;
    int shim = error_class(finish(c.call(kShim)));
    if (check_stats && get) get(c.counter.c_str(), nullptr, nullptr, &after);
    int real = c.shim_raises ? c.shim_raises : error_class(finish(c.call(kReal)));
    // The same class as the MPI's; where the MPI takes the input without an error, the
    // shim must too (said once, so that a case that tests nothing shows).
    bool ok = shim == real;
    if (ok && real == MPI_SUCCESS && rank == 0)
      std::fprintf(stderr, "note: %s: the MPI accepts it, and so does the shim\n", c.name.c_str());
    if (!ok)
      std::fprintf(stderr, "rank %d FAIL %s: through the shim %s, real MPI %s\n", rank,
                   c.name.c_str(), class_name(shim).c_str(), class_name(real).c_str());
    ok ? ++passed : ++failed;
    if (check_stats) {
      bool counted = get && after.calls == before.calls + 1;
      if (!counted)
        std::fprintf(stderr, "rank %d FAIL %s: not counted as a '%s' call\n", rank,
                     c.name.c_str(), c.counter.c_str());
      counted ? ++passed : ++failed;
    }
  }

  int local[2] = {passed, failed}, total[2] = {0, 0};
  PMPI_Reduce(local, total, 2, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
  if (rank == 0) std::printf("%d passed, %d failed\n", total[0], total[1]);
  MPI_Finalize();
  return failed ? 1 : 0;
}
