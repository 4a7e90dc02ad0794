// The wait/test family, MPI_Request_get_status and MPI_Request_free. When streamcoll
// owns no request (always, until a route hands out its own), each wrapper is one atomic
// load and the PMPI_ call. Otherwise (core/requests.hpp: the contract and why):
//  - test forms and MPI_Request_get_status: advance() to each owned request of the
//    array (on_test(), and once it is done its MPI request completed on this thread),
//    then the PMPI_ call;
//  - wait forms never block inside streamcoll. They poll (advance(): whether an owned
//    request, and its MPI request, is complete; then PMPI_Iprobe or a PMPI_ test form on the ordinary requests: calls
//    that drive MPI's progress) until the PMPI_ wait form can return at once, and then
//    call that wait form, so that what it returns is the MPI's own answer:
//      MPI_Wait, MPI_Waitall: until every owned request is complete (the wait form may
//        then still wait for ordinary requests, inside the MPI, which progresses);
//      MPI_Waitany, MPI_Waitsome: until an owned request is complete (then the wait
//        form), or until PMPI_Testany/PMPI_Testsome on a copy of the array holding the
//        ordinary requests alone finds some complete: with every owned request incomplete
//        that is the wait form's answer, returned as is (the copy's handles written back);
//  - MPI_Request_free: the owned request is polled to completion as for MPI_Wait (the
//    operation must complete; polling keeps MPI progressing meanwhile, so this blocks
//    but cannot deadlock on a peer that needs this process's progress), then on_free(),
//    then PMPI_Request_free.
// streamcoll's persistent requests (shim/persistent.hpp): while one is active, each wrapper
// hands the MPI (and the polling above) the request of its running operation in its place,
// and gives the caller the persistent handle back, inactive once that request completed;
// a free of one releases its plan (an active one: MPI_ERR_REQUEST).
// The Fortran bindings of the same calls (shim/fortran.cpp) use the same polling.
#include <mpi.h>

#include <cstddef>
#include <vector>

#include "core/next_mpi.hpp"
#include "core/requests.hpp"
#include "shim/dispatch.hpp"
#include "shim/export.hpp"
#include "shim/persistent.hpp"

namespace req = streamcoll::requests;
namespace pers = streamcoll::persistent;

namespace {

// `requests` with the owned ones replaced by MPI_REQUEST_NULL.
std::vector<MPI_Request> ordinary_only(int n, const MPI_Request* requests,
                                       const std::vector<req::Owned>& owned) {
  std::vector<MPI_Request> v(requests, requests + n);
  for (const req::Owned& o : owned) v[o.index] = MPI_REQUEST_NULL;
  return v;
}

// Copies the ordinary requests' handles back (a test form may have freed some).
void write_back(const std::vector<MPI_Request>& ordinary, const std::vector<req::Owned>& owned,
                MPI_Request* requests) {
  size_t k = 0;  // owned is in array order
  for (size_t i = 0; i < ordinary.size(); ++i) {
    if (k < owned.size() && owned[k].index == static_cast<int>(i)) {
      ++k;
      continue;
    }
    requests[i] = ordinary[i];
  }
}

void test_owned(int n, const MPI_Request* requests) {
  for (const req::Owned& o : req::find(n, requests)) o.op->advance();
}

// The wait/test family on requests the MPI is to see as they are (owned ones polled).
int owned_wait(MPI_Request* request, MPI_Status* status) {
  if (!req::any_owned() || request == nullptr) return SC_NEXT(MPI_Wait)(request, status);
  if (streamcoll::OwnedRequest* op = req::peek(*request)) req::complete_one(op);
  return SC_NEXT(MPI_Wait)(request, status);
}

int owned_test(MPI_Request* request, int* flag, MPI_Status* status) {
  if (!req::any_owned() || request == nullptr) return SC_NEXT(MPI_Test)(request, flag, status);
  if (streamcoll::OwnedRequest* op = req::peek(*request)) op->advance();
  return SC_NEXT(MPI_Test)(request, flag, status);
}

int owned_request_get_status(MPI_Request request, int* flag, MPI_Status* status) {
  if (!req::any_owned()) return SC_NEXT(MPI_Request_get_status)(request, flag, status);
  if (streamcoll::OwnedRequest* op = req::peek(request)) op->advance();
  return SC_NEXT(MPI_Request_get_status)(request, flag, status);
}

int owned_waitall(int count, MPI_Request requests[], MPI_Status statuses[]) {
  if (!req::any_owned() || requests == nullptr || count <= 0)
    return SC_NEXT(MPI_Waitall)(count, requests, statuses);
  std::vector<req::Owned> owned = req::find(count, requests);
  if (!owned.empty()) req::complete_all(owned);
  return SC_NEXT(MPI_Waitall)(count, requests, statuses);
}

int owned_testall(int count, MPI_Request requests[], int* flag, MPI_Status statuses[]) {
  if (!req::any_owned() || requests == nullptr || count <= 0)
    return SC_NEXT(MPI_Testall)(count, requests, flag, statuses);
  test_owned(count, requests);
  return SC_NEXT(MPI_Testall)(count, requests, flag, statuses);
}

int owned_waitany(int count, MPI_Request requests[], int* index, MPI_Status* status) {
  if (!req::any_owned() || requests == nullptr || count <= 0 || index == nullptr)
    return SC_NEXT(MPI_Waitany)(count, requests, index, status);
  std::vector<req::Owned> owned = req::find(count, requests);
  if (owned.empty()) return SC_NEXT(MPI_Waitany)(count, requests, index, status);
  std::vector<MPI_Request> ordinary = ordinary_only(count, requests, owned);
  // The status only changes with the answer (a test form that finds no active request
  // empties it).
  MPI_Status scratch;
  MPI_Status* st = MPI_STATUS_IGNORE;
  if (status != MPI_STATUS_IGNORE) {
    scratch = *status;
    st = &scratch;
  }
  bool ordinary_active = true;
  for (req::Backoff b;; b.pause()) {
    if (req::poll(owned) > 0) return SC_NEXT(MPI_Waitany)(count, requests, index, status);
    if (!ordinary_active) continue;
    int flag = 0;
    const int rc = PMPI_Testany(count, ordinary.data(), index, &flag, st);
    if (rc != MPI_SUCCESS || (flag && *index != MPI_UNDEFINED)) {
      write_back(ordinary, owned, requests);
      if (status != MPI_STATUS_IGNORE) *status = scratch;
      return rc;
    }
    if (flag) ordinary_active = false;  // no ordinary request is active
  }
}

int owned_testany(int count, MPI_Request requests[], int* index, int* flag,
                          MPI_Status* status) {
  if (!req::any_owned() || requests == nullptr || count <= 0)
    return SC_NEXT(MPI_Testany)(count, requests, index, flag, status);
  test_owned(count, requests);
  return SC_NEXT(MPI_Testany)(count, requests, index, flag, status);
}

int owned_waitsome(int incount, MPI_Request requests[], int* outcount, int indices[],
                           MPI_Status statuses[]) {
  if (!req::any_owned() || requests == nullptr || incount <= 0 || outcount == nullptr)
    return SC_NEXT(MPI_Waitsome)(incount, requests, outcount, indices, statuses);
  std::vector<req::Owned> owned = req::find(incount, requests);
  if (owned.empty()) return SC_NEXT(MPI_Waitsome)(incount, requests, outcount, indices, statuses);
  std::vector<MPI_Request> ordinary = ordinary_only(incount, requests, owned);
  // Statuses even when ignored: the MPI may then skip generalized requests' query
  // functions in a test form (Open MPI does), and with them their errors.
  std::vector<MPI_Status> scratch;
  MPI_Status* st = statuses;
  if (statuses == MPI_STATUSES_IGNORE) {
    scratch.resize(static_cast<size_t>(incount));
    st = scratch.data();
  }
  bool ordinary_active = true;
  for (req::Backoff b;; b.pause()) {
    if (req::poll(owned) > 0)
      return SC_NEXT(MPI_Waitsome)(incount, requests, outcount, indices, statuses);
    if (!ordinary_active) continue;
    const int rc = PMPI_Testsome(incount, ordinary.data(), outcount, indices, st);
    if (rc != MPI_SUCCESS || (*outcount != MPI_UNDEFINED && *outcount > 0)) {
      write_back(ordinary, owned, requests);
      return rc;
    }
    if (*outcount == MPI_UNDEFINED) ordinary_active = false;  // none active
  }
}

int owned_testsome(int incount, MPI_Request requests[], int* outcount, int indices[],
                           MPI_Status statuses[]) {
  if (!req::any_owned() || requests == nullptr || incount <= 0)
    return SC_NEXT(MPI_Testsome)(incount, requests, outcount, indices, statuses);
  test_owned(incount, requests);
  return SC_NEXT(MPI_Testsome)(incount, requests, outcount, indices, statuses);
}

}  // namespace

// Each wrapper: an active persistent request of streamcoll's is replaced by its
// operation's request (shim/persistent.hpp), also beneath a Fortran call (MPICH's
// binding comes back to these C wrappers, and the owned request behind a persistent
// handle was not polled there); otherwise, inside a Fortran binding or with no owned
// request, the next MPI_ definition at once.
namespace {
inline bool plain() { return streamcoll::g_in_binding || !req::any_owned(); }
}  // namespace

SC_EXPORT int MPI_Wait(MPI_Request* request, MPI_Status* status) {
  if (pers::any_active() && request != nullptr)
    if (MPI_Request r = pers::running(*request); r != MPI_REQUEST_NULL) {
      const int rc = owned_wait(&r, status);
      if (r == MPI_REQUEST_NULL) pers::finished(*request);
      return rc;
    }
  if (plain() || request == nullptr) return SC_NEXT(MPI_Wait)(request, status);
  return owned_wait(request, status);
}

SC_EXPORT int MPI_Test(MPI_Request* request, int* flag, MPI_Status* status) {
  if (pers::any_active() && request != nullptr)
    if (MPI_Request r = pers::running(*request); r != MPI_REQUEST_NULL) {
      const int rc = owned_test(&r, flag, status);
      if (r == MPI_REQUEST_NULL) pers::finished(*request);
      return rc;
    }
  if (plain() || request == nullptr) return SC_NEXT(MPI_Test)(request, flag, status);
  return owned_test(request, flag, status);
}

SC_EXPORT int MPI_Request_get_status(MPI_Request request, int* flag, MPI_Status* status) {
  if (pers::any_active())
    if (MPI_Request r = pers::running(request); r != MPI_REQUEST_NULL)
      return owned_request_get_status(r, flag, status);
  if (plain()) return SC_NEXT(MPI_Request_get_status)(request, flag, status);
  return owned_request_get_status(request, flag, status);
}

SC_EXPORT int MPI_Waitall(int count, MPI_Request requests[], MPI_Status statuses[]) {
  if (pers::Substituted s(count, requests); s.any()) {
    const int rc = owned_waitall(count, s.data(), statuses);
    s.restore(requests);
    return rc;
  }
  if (plain()) return SC_NEXT(MPI_Waitall)(count, requests, statuses);
  return owned_waitall(count, requests, statuses);
}

SC_EXPORT int MPI_Testall(int count, MPI_Request requests[], int* flag, MPI_Status statuses[]) {
  if (pers::Substituted s(count, requests); s.any()) {
    const int rc = owned_testall(count, s.data(), flag, statuses);
    s.restore(requests);
    return rc;
  }
  if (plain()) return SC_NEXT(MPI_Testall)(count, requests, flag, statuses);
  return owned_testall(count, requests, flag, statuses);
}

SC_EXPORT int MPI_Waitany(int count, MPI_Request requests[], int* index, MPI_Status* status) {
  if (pers::Substituted s(count, requests); s.any()) {
    const int rc = owned_waitany(count, s.data(), index, status);
    s.restore(requests);
    return rc;
  }
  if (plain()) return SC_NEXT(MPI_Waitany)(count, requests, index, status);
  return owned_waitany(count, requests, index, status);
}

SC_EXPORT int MPI_Testany(int count, MPI_Request requests[], int* index, int* flag,
                          MPI_Status* status) {
  if (pers::Substituted s(count, requests); s.any()) {
    const int rc = owned_testany(count, s.data(), index, flag, status);
    s.restore(requests);
    return rc;
  }
  if (plain()) return SC_NEXT(MPI_Testany)(count, requests, index, flag, status);
  return owned_testany(count, requests, index, flag, status);
}

SC_EXPORT int MPI_Waitsome(int incount, MPI_Request requests[], int* outcount, int indices[],
                           MPI_Status statuses[]) {
  if (pers::Substituted s(incount, requests); s.any()) {
    const int rc = owned_waitsome(incount, s.data(), outcount, indices, statuses);
    s.restore(requests);
    return rc;
  }
  if (plain()) return SC_NEXT(MPI_Waitsome)(incount, requests, outcount, indices, statuses);
  return owned_waitsome(incount, requests, outcount, indices, statuses);
}

SC_EXPORT int MPI_Testsome(int incount, MPI_Request requests[], int* outcount, int indices[],
                           MPI_Status statuses[]) {
  if (pers::Substituted s(incount, requests); s.any()) {
    const int rc = owned_testsome(incount, s.data(), outcount, indices, statuses);
    s.restore(requests);
    return rc;
  }
  if (plain()) return SC_NEXT(MPI_Testsome)(incount, requests, outcount, indices, statuses);
  return owned_testsome(incount, requests, outcount, indices, statuses);
}

SC_EXPORT int MPI_Request_free(MPI_Request* request) {
  if (int rc; pers::any_planned() && request != nullptr && pers::free_request(request, &rc))
    return rc;
  if (streamcoll::g_in_binding || !req::any_owned() || request == nullptr) return SC_NEXT(MPI_Request_free)(request);
  if (streamcoll::OwnedRequest* op = req::peek(*request)) {
    req::complete_one(op);
    op->on_free();
  }
  return SC_NEXT(MPI_Request_free)(request);
}
