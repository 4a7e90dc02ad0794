// The driver-call checks (core/cuda_driver.hpp, SC_CU_*): a success is MPI_SUCCESS and
// silent; a failure is streamcoll's CUDA error code, logged with the caller's file:line.
// No driver needed: the checks take a CUresult, here made up.
#include <doctest/doctest.h>
#include <mpi.h>

#include <stdio.h>
#include <unistd.h>

#include <string>

#include "base/log.hpp"
#include "core/cuda_driver.hpp"
#include "core/errors.hpp"

#if STREAMCOLL_HAVE_CUDA
using namespace streamcoll;

namespace {

// What the scope writes to stderr (fd 2: the log's one write(2) per line).
class StderrCapture {
 public:
  StderrCapture() : file_(tmpfile()), saved_(dup(2)) { dup2(fileno(file_), 2); }
  ~StderrCapture() {
    restore();
    fclose(file_);
  }
  std::string text() {
    restore();
    std::string s;
    rewind(file_);
    for (int c; (c = fgetc(file_)) != EOF;) s += static_cast<char>(c);
    return s;
  }

 private:
  void restore() {
    if (saved_ < 0) return;
    dup2(saved_, 2);
    close(saved_);
    saved_ = -1;
  }
  FILE* file_;
  int saved_;
};

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("SC_CU_CHECK: MPI_SUCCESS on success, silent") {
  StderrCapture cap;
  CHECK(SC_CU_CHECK(CUDA_SUCCESS, "unit: cuNothing") == MPI_SUCCESS);
  CHECK(cap.text().empty());
}

TEST_CASE("SC_CU_CHECK: a failure is the CUDA error code, logged with file:line") {
  int calls = 0;
  auto call = [&] { return ++calls, CUDA_ERROR_INVALID_VALUE; };
  StderrCapture cap;
  const int line = __LINE__; const int rc = SC_CU_CHECK(call(), "unit: cuFake");
  const std::string err = cap.text();
  CHECK(calls == 1);  // the call evaluated once
  CHECK(rc == error_code(Failure::cuda));
  int cls = MPI_SUCCESS;
  MPI_Error_class(rc, &cls);
  CHECK(cls == MPI_ERR_OTHER);
  INFO("stderr: " << err);
  CHECK(has(err, "tests/unit/test_cuda_check.cpp:" + std::to_string(line) + ": unit: cuFake: "));
  CHECK(has(err, "(error 1)"));
  CHECK(!has(err, "../"));  // the path from the source root
}

TEST_CASE("SC_CU_FAIL and SC_CU_WHY: located, for a result in hand") {
  StderrCapture cap;
  const int line = __LINE__; const int rc = SC_CU_FAIL(CUDA_ERROR_OUT_OF_MEMORY, std::string("unit: alloc"));
  const std::string err = cap.text();
  CHECK(rc == error_code(Failure::cuda));
  CHECK(has(err, "test_cuda_check.cpp:" + std::to_string(line) + ": unit: alloc: "));
  const std::string why = SC_CU_WHY(CUDA_ERROR_INVALID_DEVICE, "unit: probe");
  CHECK(has(why, "tests/unit/test_cuda_check.cpp:"));
  CHECK(has(why, ": unit: probe: "));
  CHECK(has(why, "(error 101)"));
}

TEST_CASE("SC_CU_TOLERATE: the CUresult back, a failure seen at warn level only") {
  const LogLevel before = static_cast<LogLevel>(log_detail::level.load());
  {
    set_log_level(LogLevel::none);
    StderrCapture cap;
    CHECK(SC_CU_TOLERATE(CUDA_ERROR_INVALID_HANDLE) == CUDA_ERROR_INVALID_HANDLE);
    CHECK(cap.text().empty());
  }
  {
    set_log_level(LogLevel::warn);
    StderrCapture cap;
    const int line = __LINE__; const CUresult r = SC_CU_TOLERATE(CUDA_ERROR_INVALID_HANDLE);
    CHECK(SC_CU_TOLERATE(CUDA_SUCCESS) == CUDA_SUCCESS);
    const std::string err = cap.text();
    CHECK(r == CUDA_ERROR_INVALID_HANDLE);
    CHECK(has(err, "test_cuda_check.cpp:" + std::to_string(line) + ": CUDA_ERROR_INVALID_HANDLE: "));
    CHECK(has(err, "warn"));
    CHECK(has(err, "(error 400)"));
  }
  set_log_level(before);
}

TEST_CASE("source_path: __FILE__ from the source root") {
  CHECK(std::string(cuda::source_path("../core/staging.cpp")) == "core/staging.cpp");
  CHECK(std::string(cuda::source_path("./../algorithms/ht.cpp")) == "algorithms/ht.cpp");
  CHECK(std::string(cuda::source_path("core/x.cpp")) == "core/x.cpp");
  CHECK(std::string(cuda::source_path("/src/streamcoll/core/host_staging.cpp")) ==
        "core/host_staging.cpp");
  CHECK(std::string(cuda::source_path("/home/core/repo/shim/capture.cpp")) == "shim/capture.cpp");
}
#endif
