#include "core/errors.hpp"

#include <mpi.h>

#include <cstdlib>
#include <cstring>
#include <mutex>

#include "base/log.hpp"

namespace streamcoll {

int fail(Failure f, const std::string& detail) {
  log_error("%s", detail.c_str());
  return error_code(f);
}

namespace {

std::mutex g_mu;
int g_codes[kNumFailures] = {-1, -1, -1, -1};
// The codes whose string the MPI does not give back (MPICH before 4.2: a code added to a
// predefined class lacks its dynamic-code bit, so MPI_Error_string reads it as an error
// stack and prints another error's message; pmodels/mpich commit 0b7f962e, 2023).
bool g_string_lost[kNumFailures] = {};

const struct {
  int cls;
  const char* text;
} kKinds[kNumFailures] = {
      {MPI_ERR_OTHER, "streamcoll: a CUDA call failed (details on stderr)"},
      {MPI_ERR_OTHER, "streamcoll: an NCCL call failed (details on stderr)"},
      {MPI_ERR_OTHER,
       "streamcoll: the communicator's NCCL communicator was aborted: a rank could not take "
       "its part in an NCCL operation, or NCCL reported an asynchronous error (details on "
       "stderr)"},
      {MPI_ERR_OTHER,
       "streamcoll: another rank's part of this collective failed; the result is not valid "
       "(details on that rank's stderr)"},
};

}  // namespace

int error_code(Failure f) {
  const int i = static_cast<int>(f);
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_codes[i] < 0) {
    int code = kKinds[i].cls;
    if (PMPI_Add_error_code(kKinds[i].cls, &code) != MPI_SUCCESS ||
        PMPI_Add_error_string(code, const_cast<char*>(kKinds[i].text)) != MPI_SUCCESS) {
      code = kKinds[i].cls;
    } else {
      char text[MPI_MAX_ERROR_STRING] = {0};
      int len = 0;
      g_string_lost[i] = PMPI_Error_string(code, text, &len) != MPI_SUCCESS ||
                         std::strcmp(text, kKinds[i].text) != 0;
    }
    g_codes[i] = code;
  }
  return g_codes[i];
}

const char* lost_error_string(int code) {
  std::lock_guard<std::mutex> lock(g_mu);
  for (int i = 0; i < kNumFailures; ++i)
    if (g_string_lost[i] && g_codes[i] == code) return kKinds[i].text;
  return nullptr;
}

void abort_lost_input(MPI_Comm comm, const char* what, int rc) {
  char why[MPI_MAX_ERROR_STRING] = "?";
  int len = 0;
  PMPI_Error_string(rc, why, &len);
  log_error("%s: this rank lost its GPU input (%s) in a call that carries no failure flags "
            "(when the ranks last agreed, every one passed host memory): aborting the job, "
            "as a CUDA-aware MPI does when it cannot copy a device buffer",
            what, why);
  PMPI_Abort(comm, rc);
  std::abort();
}

}  // namespace streamcoll
