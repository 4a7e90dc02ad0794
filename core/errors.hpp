// streamcoll's own MPI error codes, for failures that no MPI call of the application's
// would produce: a CUDA or NCCL failure, an aborted NCCL communicator, a peer's failure.
// Each is a code of an existing MPI error class (MPI_Error_class gives that
// class) with its own string (MPI_Error_string), added with MPI_Add_error_code at first
// use. The detailed message (which call, which communicator) goes to stderr, rank-tagged.
#pragma once

#include <mpi.h>

#include <string>

namespace streamcoll {

enum class Failure {
  cuda,          ///< a CUDA driver call failed                  (class MPI_ERR_OTHER)
  nccl,          ///< an NCCL call failed                         (class MPI_ERR_OTHER)
  nccl_aborted,  ///< the communicator's NCCL communicator was aborted: a rank could
                 ///< not take its part, or an asynchronous error (class MPI_ERR_OTHER)
  peer,          ///< another rank's part of the collective failed, so this rank's
                 ///< result is not valid (the details are on that rank's stderr)
                 ///<                                             (class MPI_ERR_OTHER)
};
inline constexpr int kNumFailures = 4;

/// Logs `detail` (always, not only under STREAMCOLL_DEBUG) and returns the MPI error code
/// for `f`, to be raised through the communicator's error handler. Thread-safe; calls
/// MPI (the first time per kind), so only from threads that may call MPI.
int fail(Failure f, const std::string& detail);

/// The MPI error code for `f`, without logging. Same threading rule as fail().
int error_code(Failure f);

/// Raises `rc` (not MPI_SUCCESS) through `comm`'s error handler, as the MPI raises its own
/// errors (the application's handler may abort, or return), and returns it.
inline int call_errhandler(MPI_Comm comm, int rc) {
  PMPI_Comm_call_errhandler(comm, rc);
  return rc;
}

/// A rank that lost its input (error code `rc`, already logged where it arose) in a call
/// that carries no failure flags, because the facts the ranks decided it from say no rank
/// could lose one (every rank passed host memory when they last agreed; this rank's
/// buffers changed since): it can neither take part without handing its peers a result
/// built on garbage nor tell them within the call, so it aborts the job (PMPI_Abort on
/// `comm`) with the reason, as a CUDA-aware MPI does when it cannot copy a device buffer
/// (Open MPI's datatype engine and coll/cuda abort on a failed cuMemcpy). `what`: the
/// call, for the message. Never returns. Thread-safe at MPI_THREAD_MULTIPLE.
[[noreturn]] void abort_lost_input(MPI_Comm comm, const char* what, int rc);

/// streamcoll's string for `code` when it is one of its codes whose string the MPI
/// cannot give back (checked when the code is made), else null: MPI_Error_string answers
/// with it (shim/init.cpp). Thread-safe.
const char* lost_error_string(int code);

}  // namespace streamcoll
