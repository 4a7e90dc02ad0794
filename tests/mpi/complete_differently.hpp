// Completing a set of requests the way ranks differ in doing it, for tests whose ranks
// must not agree on where they wait: `how` % 3 picks MPI_Waitall, MPI_Wait on each in
// reverse order, or an MPI_Testall loop. Stops at the first error and returns it (MPI
// error code); MPI_SUCCESS once all are complete. Header-only; plain MPI.
#pragma once

#include <mpi.h>

#include <vector>

namespace sctest {

inline int complete_differently(std::vector<MPI_Request>& reqs, int how) {
  const int n = static_cast<int>(reqs.size());
  int rc = MPI_SUCCESS;
  switch (how % 3) {
    case 0: rc = MPI_Waitall(n, reqs.data(), MPI_STATUSES_IGNORE); break;
    case 1:
      for (int i = n - 1; i >= 0 && rc == MPI_SUCCESS; --i) rc = MPI_Wait(&reqs[i], MPI_STATUS_IGNORE);
      break;
    default:
      for (int flag = 0; !flag && rc == MPI_SUCCESS;)
        rc = MPI_Testall(n, reqs.data(), &flag, MPI_STATUSES_IGNORE);
      break;
  }
  return rc;
}

}  // namespace sctest
