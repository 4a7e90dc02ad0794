// What the real-MPI test programs (collectives_check.cpp, host_routes.cpp) share besides
// the value model (value_model.hpp): aligned buffers, and completing a batch of requests
// with each of the eight completion calls.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

// Aligned storage, zeroed (so padding inside elements is defined for memcmp), never
// empty (data() is valid for zero elements).
class Buffer {
 public:
  Buffer() : Buffer(0, 1) {}
  Buffer(size_t elems, size_t elem_size)
      : elem_(elem_size),
        n_(elems),
        store_(new std::max_align_t[elems * elem_size / sizeof(std::max_align_t) + 1]()) {}
  Buffer copy() const {
    Buffer b(n_, elem_);
    std::memcpy(b.data(), data(), bytes());
    return b;
  }
  unsigned char* data() { return reinterpret_cast<unsigned char*>(store_.get()); }
  const unsigned char* data() const { return reinterpret_cast<const unsigned char*>(store_.get()); }
  unsigned char* at(size_t k) { return data() + k * elem_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * elem_; }

 private:
  size_t elem_ = 0, n_ = 0;
  std::unique_ptr<std::max_align_t[]> store_;
};

enum class Completion { wait, test, waitall, testall, waitany, testany, waitsome, testsome };
constexpr int kNumCompletions = 8;

inline const char* describe(Completion c) {
  static const char* names[] = {"MPI_Wait",         "MPI_Test loop",    "MPI_Waitall",
                                "MPI_Testall loop", "MPI_Waitany",      "MPI_Testany loop",
                                "MPI_Waitsome",     "MPI_Testsome loop"};
  return names[static_cast<int>(c)];
}

// Completes every request of `reqs` the way `how` says. Returns "" when each was reported
// done exactly once and ended up MPI_REQUEST_NULL, else what went wrong; *rc_out is the
// first error a completion call returned (then the requests are not checked further).
// Wait and Test go backwards through the array, so a later request completes before an
// earlier one; the test loops yield between polls (ranks may outnumber cores).
inline std::string complete_requests(std::vector<MPI_Request>& reqs, Completion how, int* rc_out) {
  const int n = static_cast<int>(reqs.size());
  std::vector<int> done(reqs.size(), 0);
  std::string problem;
  auto mark = [&](int i) {
    if (i < 0 || i >= n)
      problem = "reported index " + std::to_string(i) + " of " + std::to_string(n);
    else if (done[i]++)
      problem = "reported request " + std::to_string(i) + " done twice";
  };
  int rc = MPI_SUCCESS, finished = 0;
  std::vector<int> indices(reqs.size() + 1);
  switch (how) {
    case Completion::wait:
      for (int i = n - 1; i >= 0 && rc == MPI_SUCCESS; --i, ++finished) {
        rc = MPI_Wait(&reqs[i], MPI_STATUS_IGNORE);
        mark(i);
      }
      break;
    case Completion::test:
      while (finished < n && rc == MPI_SUCCESS) {
        for (int i = n - 1; i >= 0 && rc == MPI_SUCCESS; --i) {
          if (done[i]) continue;
          int flag = 0;
          rc = MPI_Test(&reqs[i], &flag, MPI_STATUS_IGNORE);
          if (flag) mark(i), ++finished;
        }
        std::this_thread::yield();
      }
      break;
    case Completion::waitall:
      rc = MPI_Waitall(n, reqs.data(), MPI_STATUSES_IGNORE);
      for (int i = 0; i < n; ++i) mark(i);
      break;
    case Completion::testall: {
      int flag = 0;
      while (!flag && rc == MPI_SUCCESS) {
        rc = MPI_Testall(n, reqs.data(), &flag, MPI_STATUSES_IGNORE);
        if (!flag) std::this_thread::yield();
      }
      for (int i = 0; i < n; ++i) mark(i);
      break;
    }
    case Completion::waitany:
      for (; finished < n && rc == MPI_SUCCESS; ++finished) {
        int index = -1;
        rc = MPI_Waitany(n, reqs.data(), &index, MPI_STATUS_IGNORE);
        mark(index);
      }
      break;
    case Completion::testany:
      while (finished < n && rc == MPI_SUCCESS) {
        int index = -1, flag = 0;
        rc = MPI_Testany(n, reqs.data(), &index, &flag, MPI_STATUS_IGNORE);
        if (flag && index == MPI_UNDEFINED) {
          problem =
              "MPI_Testany found no active request with " + std::to_string(n - finished) + " left";
          break;
        }
        if (flag)
          mark(index), ++finished;
        else
          std::this_thread::yield();
      }
      break;
    case Completion::waitsome:
    case Completion::testsome:
      while (finished < n && rc == MPI_SUCCESS) {
        int outcount = 0;
        rc = how == Completion::waitsome
                 ? MPI_Waitsome(n, reqs.data(), &outcount, indices.data(), MPI_STATUSES_IGNORE)
                 : MPI_Testsome(n, reqs.data(), &outcount, indices.data(), MPI_STATUSES_IGNORE);
        if (outcount == MPI_UNDEFINED) {
          problem = "no active request with " + std::to_string(n - finished) + " left";
          break;
        }
        for (int j = 0; j < outcount; ++j) mark(indices[j]);
        finished += outcount;
        if (outcount == 0) std::this_thread::yield();
      }
      break;
  }
  *rc_out = rc;
  if (rc != MPI_SUCCESS) return problem;
  for (int i = 0; i < n && problem.empty(); ++i) {
    if (done[i] != 1)
      problem = "request " + std::to_string(i) + " never reported done";
    else if (reqs[i] != MPI_REQUEST_NULL)
      problem = "request " + std::to_string(i) + " not MPI_REQUEST_NULL";
  }
  return problem;
}

}  // namespace
