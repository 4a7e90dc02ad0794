#include "core/service.hpp"

namespace streamcoll::service {

bool all(bool mine, MPI_Comm comm, int* rc) {
  int in = mine ? 1 : 0, out = 0;
  const int r = PMPI_Allreduce(&in, &out, 1, MPI_INT, MPI_MIN, comm);
  if (rc) *rc = r;
  return r == MPI_SUCCESS && out == 1;
}

bool any(bool mine, MPI_Comm comm) {
  int in = mine ? 1 : 0, out = 1;
  return PMPI_Allreduce(&in, &out, 1, MPI_INT, MPI_MAX, comm) != MPI_SUCCESS || out != 0;
}

bool all_equal(int64_t v, MPI_Comm comm, int64_t* agreed) {
  int64_t lo = 0, hi = 0;
  if (ranges(&v, 1, comm, &lo, &hi) != MPI_SUCCESS) return false;
  if (agreed) *agreed = hi;
  return lo == hi;
}

int ranges(const int64_t* v, int n, MPI_Comm comm, int64_t* lo, int64_t* hi) {
  if (n < 1 || n > kMaxRanges) return MPI_ERR_COUNT;
  int64_t x[2 * kMaxRanges];
  for (int i = 0; i < n; ++i) {
    x[i] = v[i];
    x[n + i] = -v[i];
  }
  const int rc = PMPI_Allreduce(MPI_IN_PLACE, x, 2 * n, MPI_INT64_T, MPI_MAX, comm);
  if (rc != MPI_SUCCESS) return rc;
  for (int i = 0; i < n; ++i) {
    hi[i] = x[i];
    lo[i] = -x[n + i];
  }
  return MPI_SUCCESS;
}

namespace {
int start(bool mine, MPI_Op op, int failed, MPI_Comm comm, Flag* f, MPI_Request* req) {
  f->mine = mine ? 1 : 0;
  f->agreed = failed ? 0 : 1;  // until the exchange completes: the answer that does not stop
  const int rc = PMPI_Iallreduce(&f->mine, &f->agreed, 1, MPI_INT, op, comm, req);
  if (rc != MPI_SUCCESS) {
    *req = MPI_REQUEST_NULL;
    f->agreed = failed;
  }
  return rc;
}
}  // namespace

int start_any(bool mine, MPI_Comm comm, Flag* f, MPI_Request* req) {
  return start(mine, MPI_MAX, 1, comm, f, req);
}

int start_all(bool mine, MPI_Comm comm, Flag* f, MPI_Request* req) {
  return start(mine, MPI_MIN, 0, comm, f, req);
}

}  // namespace streamcoll::service
