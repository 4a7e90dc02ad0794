// MPI_Comm_set_info, MPI_Comm_dup_with_info, MPI_Comm_split_type: the MPI's own call, then
// the memory kinds the info asserts (mpi_assert_memory_alloc_kinds, core/alloc_kinds.hpp)
// recorded on the communicator's context, where every rank of it asserted the same.
//
// The info object of these collective calls may differ between ranks, so the kinds are
// agreed over the communicator in one small allreduce at the call (not on any
// collective's critical path), in a job with a CUDA driver somewhere (the only one where
// the assertion saves anything; agreed at MPI_Init, so equal on every rank). Ranks that
// assert different kinds, or kinds streamcoll does not understand, keep none. A call
// without the key clears an earlier assertion (MPI_Comm_set_info), so a program that
// drops the hint never leaves a stale one behind. Not intercepted: MPI_Comm_idup_with_info
// (non-blocking: nothing collective may run at its start) and communicators created from
// groups; their calls are classified and agreed as any others. Open MPI's Fortran
// bindings call PMPI_ directly, so the assertion is seen from C (and MPICH's Fortran).
#include <mpi.h>

#include <cstdint>
#include <string>

#include "base/log.hpp"
#include "core/alloc_kinds.hpp"
#include "core/comm_context.hpp"
#include "core/next_mpi.hpp"
#include "core/runtime.hpp"
#include "core/service.hpp"
#include "shim/dispatch.hpp"
#include "shim/export.hpp"

namespace streamcoll {
namespace {

// This rank's asserted kinds in `info` (0: the key is absent or not understood).
uint32_t asserted_in(MPI_Info info) {
  if (info == MPI_INFO_NULL) return 0;
  char value[MPI_MAX_INFO_VAL + 1] = {0};
  int flag = 0;
#if MPI_VERSION >= 4
  int len = sizeof value;
  if (PMPI_Info_get_string(info, alloc_kinds::kAssertKey, &len, value, &flag) != MPI_SUCCESS)
    return 0;
#else
  if (PMPI_Info_get(info, alloc_kinds::kAssertKey, MPI_MAX_INFO_VAL, value, &flag) != MPI_SUCCESS)
    return 0;
#endif
  if (!flag) return 0;
  const uint32_t kinds = alloc_kinds::parse(value);
  if (!kinds) SC_INFO("%s=%s: not understood; not used", alloc_kinds::kAssertKey, value);
  return kinds;
}

// Records `info`'s assertion on `comm` (collective over it, after the MPI's own call has
// succeeded on every rank of it).
void record(MPI_Comm comm, MPI_Info info) {
  Runtime& rt = Runtime::get();
  if (comm == MPI_COMM_NULL || g_in_binding || !rt.active() || !rt.job_gpu()) return;
  int inter = 0;
  if (PMPI_Comm_test_inter(comm, &inter) != MPI_SUCCESS || inter) return;
  const uint32_t mine = asserted_in(info);
  const int64_t v = mine;
  int64_t lo = 0, hi = 0;
  if (service::ranges(&v, 1, comm, &lo, &hi) != MPI_SUCCESS) return;
  const bool same = lo == hi;
  const uint32_t kinds = same ? static_cast<uint32_t>(hi) : 0;
  if (!same && mine) SC_INFO("%s differs between ranks: not used", alloc_kinds::kAssertKey);
  CommContext* ctx = comm_context(comm, kinds != 0);  // collective the first time
  if (ctx) ctx->set_asserted_kinds(kinds);
}

}  // namespace
}  // namespace streamcoll

SC_EXPORT int MPI_Comm_set_info(MPI_Comm comm, MPI_Info info) {
  const int rc = SC_NEXT(MPI_Comm_set_info)(comm, info);
  if (rc == MPI_SUCCESS) streamcoll::record(comm, info);
  return rc;
}

SC_EXPORT int MPI_Comm_dup_with_info(MPI_Comm comm, MPI_Info info, MPI_Comm* newcomm) {
  const int rc = SC_NEXT(MPI_Comm_dup_with_info)(comm, info, newcomm);
  if (rc == MPI_SUCCESS) streamcoll::record(*newcomm, info);
  streamcoll::derive_child(comm, rc, *newcomm);  // shim/comm_ctor.cpp
  return rc;
}

SC_EXPORT int MPI_Comm_split_type(MPI_Comm comm, int split_type, int key, MPI_Info info,
                                  MPI_Comm* newcomm) {
  const int rc = SC_NEXT(MPI_Comm_split_type)(comm, split_type, key, info, newcomm);
  if (rc == MPI_SUCCESS) streamcoll::record(*newcomm, info);
  streamcoll::derive_child(comm, rc, *newcomm);  // shim/comm_ctor.cpp
  return rc;
}
