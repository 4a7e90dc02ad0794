// NCCL, opened with dlopen at the first call the table routes to it: libnccl.so.2 from
// the loader's search path, or the file STREAMCOLL_NCCL_LIB names. A node without NCCL
// (or whose NCCL is older than 2.12, which lacks a needed entry point) gets usable=false
// and a reason, and the route falls back to pmpi; nothing links against NCCL.
// Thread-safe: loaded once; read-only afterwards.
#pragma once

#include <nccl.h>

#include <string>

#define STREAMCOLL_NCCL_ENTRY_POINTS(X)                                                    \
  X(ncclGetVersion) X(ncclGetErrorString) X(ncclGetLastError) X(ncclGetUniqueId)           \
  X(ncclCommInitRank) X(ncclCommDestroy) X(ncclCommAbort) X(ncclCommGetAsyncError)         \
  X(ncclAllReduce) X(ncclReduce) X(ncclBroadcast) X(ncclAllGather) X(ncclReduceScatter)    \
  X(ncclSend) X(ncclRecv) X(ncclGroupStart) X(ncclGroupEnd)

// Looked up too, but not needed: without them (NCCL before 2.18) an MPI communicator made
// from one with an NCCL communicator gets its own at its first call (ncclCommInitRank)
// instead of a split sharing the parent's resources.
#define STREAMCOLL_NCCL_OPTIONAL_ENTRY_POINTS(X) \
  X(ncclCommSplit) X(ncclCommCount) X(ncclCommUserRank)

namespace streamcoll::nccl {

struct Library {
  bool usable = false;
  int version = 0;      ///< ncclGetVersion, e.g. 22809 for 2.28.9
  std::string path;     ///< what was opened
  std::string reason;   ///< why not usable
#define STREAMCOLL_NCCL_MEMBER(fn) decltype(&::fn) fn = nullptr;
  STREAMCOLL_NCCL_ENTRY_POINTS(STREAMCOLL_NCCL_MEMBER)
  STREAMCOLL_NCCL_OPTIONAL_ENTRY_POINTS(STREAMCOLL_NCCL_MEMBER)
#undef STREAMCOLL_NCCL_MEMBER

  /// "ncclAllReduce: unhandled cuda error (run with NCCL_DEBUG=INFO for details) [last
  /// error: ...]"
  std::string describe(const char* what, ncclResult_t r, ncclComm_t comm = nullptr) const;
};

/// Loads NCCL on first call (`path` empty: libnccl.so.2); later calls return the same.
const Library& library(const std::string& path);

}  // namespace streamcoll::nccl
