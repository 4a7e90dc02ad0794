// The wait/test family. When streamcoll owns no request (always, until a route hands
// out its own), each wrapper is one atomic load and the PMPI_ call. Otherwise the owned
// requests in the array get their on_wait()/on_test() first (core/requests.hpp), then
// the real call does the rest for owned and ordinary requests alike.
#include <mpi.h>

#include <vector>

#include "core/requests.hpp"
#include "shim/export.hpp"

namespace req = streamcoll::requests;

namespace {

// Handles before the call, so that owners can be forgotten once MPI has freed them.
std::vector<MPI_Request> snapshot(int n, const MPI_Request* reqs) {
  return std::vector<MPI_Request>(reqs, reqs + (n > 0 ? n : 0));
}

void forget_if_freed(MPI_Request before, MPI_Request after) {
  if (before != MPI_REQUEST_NULL && after == MPI_REQUEST_NULL) req::take(before);
}

void forget_freed(const std::vector<MPI_Request>& before, const MPI_Request* after) {
  for (size_t i = 0; i < before.size(); ++i) forget_if_freed(before[i], after[i]);
}

// Owned requests of the array, given a chance to act. `wait`: on_wait, else on_test.
// Returns true if the array holds at least one owned request.
bool prod(int n, const MPI_Request* reqs, bool wait) {
  bool any = false;
  for (int i = 0; i < n; ++i)
    if (streamcoll::OwnedRequest* op = req::peek(reqs[i])) {
      any = true;
      wait ? op->on_wait() : op->on_test();
    }
  return any;
}

}  // namespace

SC_EXPORT int MPI_Wait(MPI_Request* request, MPI_Status* status) {
  if (!req::any_owned() || request == nullptr) return PMPI_Wait(request, status);
  MPI_Request before = *request;
  prod(1, request, true);
  int rc = PMPI_Wait(request, status);
  forget_if_freed(before, *request);
  return rc;
}

SC_EXPORT int MPI_Test(MPI_Request* request, int* flag, MPI_Status* status) {
  if (!req::any_owned() || request == nullptr) return PMPI_Test(request, flag, status);
  MPI_Request before = *request;
  prod(1, request, false);
  int rc = PMPI_Test(request, flag, status);
  forget_if_freed(before, *request);
  return rc;
}

SC_EXPORT int MPI_Waitall(int count, MPI_Request requests[], MPI_Status statuses[]) {
  if (!req::any_owned() || requests == nullptr || count <= 0)
    return PMPI_Waitall(count, requests, statuses);
  auto before = snapshot(count, requests);
  prod(count, requests, true);
  int rc = PMPI_Waitall(count, requests, statuses);
  forget_freed(before, requests);
  return rc;
}

SC_EXPORT int MPI_Testall(int count, MPI_Request requests[], int* flag, MPI_Status statuses[]) {
  if (!req::any_owned() || requests == nullptr || count <= 0)
    return PMPI_Testall(count, requests, flag, statuses);
  auto before = snapshot(count, requests);
  prod(count, requests, false);
  int rc = PMPI_Testall(count, requests, flag, statuses);
  forget_freed(before, requests);
  return rc;
}

// Waitany/Waitsome must not block on one owned request while another request could
// finish first, so with owned requests in the array they poll: test, give owners a turn,
// test again.
SC_EXPORT int MPI_Waitany(int count, MPI_Request requests[], int* index, MPI_Status* status) {
  if (!req::any_owned() || requests == nullptr || count <= 0 || index == nullptr)
    return PMPI_Waitany(count, requests, index, status);
  auto before = snapshot(count, requests);
  if (!prod(count, requests, false)) return PMPI_Waitany(count, requests, index, status);
  int flag = 0, rc;
  for (;;) {
    rc = PMPI_Testany(count, requests, index, &flag, status);
    if (rc != MPI_SUCCESS || flag) break;
    prod(count, requests, false);
  }
  forget_freed(before, requests);
  return rc;
}

SC_EXPORT int MPI_Testany(int count, MPI_Request requests[], int* index, int* flag,
                          MPI_Status* status) {
  if (!req::any_owned() || requests == nullptr || count <= 0)
    return PMPI_Testany(count, requests, index, flag, status);
  auto before = snapshot(count, requests);
  prod(count, requests, false);
  int rc = PMPI_Testany(count, requests, index, flag, status);
  forget_freed(before, requests);
  return rc;
}

SC_EXPORT int MPI_Waitsome(int incount, MPI_Request requests[], int* outcount, int indices[],
                           MPI_Status statuses[]) {
  if (!req::any_owned() || requests == nullptr || incount <= 0 || outcount == nullptr)
    return PMPI_Waitsome(incount, requests, outcount, indices, statuses);
  auto before = snapshot(incount, requests);
  if (!prod(incount, requests, false))
    return PMPI_Waitsome(incount, requests, outcount, indices, statuses);
  int rc;
  for (;;) {
    rc = PMPI_Testsome(incount, requests, outcount, indices, statuses);
    if (rc != MPI_SUCCESS || *outcount != 0) break;  // MPI_UNDEFINED or some done
    prod(incount, requests, false);
  }
  forget_freed(before, requests);
  return rc;
}

SC_EXPORT int MPI_Testsome(int incount, MPI_Request requests[], int* outcount, int indices[],
                           MPI_Status statuses[]) {
  if (!req::any_owned() || requests == nullptr || incount <= 0)
    return PMPI_Testsome(incount, requests, outcount, indices, statuses);
  auto before = snapshot(incount, requests);
  prod(incount, requests, false);
  int rc = PMPI_Testsome(incount, requests, outcount, indices, statuses);
  forget_freed(before, requests);
  return rc;
}

SC_EXPORT int MPI_Request_free(MPI_Request* request) {
  if (!req::any_owned() || request == nullptr) return PMPI_Request_free(request);
  MPI_Request before = *request;
  if (streamcoll::OwnedRequest* op = req::peek(before)) op->on_free();
  int rc = PMPI_Request_free(request);
  forget_if_freed(before, *request);
  return rc;
}
