#include "core/errors.hpp"

#include <mpi.h>

#include <mutex>

#include "core/log.hpp"

namespace streamcoll {

int fail(Failure f, const std::string& detail) {
  log_error("%s", detail.c_str());
  return error_code(f);
}

int error_code(Failure f) {
  static std::mutex mu;
  static int codes[kNumFailures] = {-1, -1, -1, -1, -1};
  static const struct {
    int cls;
    const char* text;
  } kinds[kNumFailures] = {
      {MPI_ERR_OTHER, "streamcoll: a CUDA call failed (details on stderr)"},
      {MPI_ERR_OTHER, "streamcoll: an NCCL call failed (details on stderr)"},
      {MPI_ERR_OTHER,
       "streamcoll: the communicator's NCCL communicator was aborted: a rank could not take "
       "its part in an NCCL operation, or NCCL reported an asynchronous error (details on "
       "stderr)"},
      {MPI_ERR_BUFFER,
       "streamcoll: a buffer is on another GPU than the communicator's NCCL communicator"},
      {MPI_ERR_OTHER,
       "streamcoll: another rank's part of this collective failed; the result is not valid "
       "(details on that rank's stderr)"},
  };
  const int i = static_cast<int>(f);
  std::lock_guard<std::mutex> lock(mu);
  if (codes[i] < 0) {
    int code = kinds[i].cls;
    if (PMPI_Add_error_code(kinds[i].cls, &code) != MPI_SUCCESS ||
        PMPI_Add_error_string(code, const_cast<char*>(kinds[i].text)) != MPI_SUCCESS)
      code = kinds[i].cls;
    codes[i] = code;
  }
  return codes[i];
}

}  // namespace streamcoll
