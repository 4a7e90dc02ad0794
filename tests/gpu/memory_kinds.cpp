// Memory classification on a real GPU: every allocation kind is recognised, and a
// collective on device buffers is counted as such in the statistics. Skips (exit 77,
// meson's skip code) with a clear line when no GPU is usable.
#define DOCTEST_CONFIG_IMPLEMENT
#include <cuda_runtime.h>
#include <doctest/doctest.h>
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "core/cuda_driver.hpp"
#include "streamcoll/streamcoll.h"

using namespace streamcoll;

TEST_CASE("every allocation kind is classified") {
  void *dev = nullptr, *pinned = nullptr, *managed = nullptr;
  REQUIRE(cudaMalloc(&dev, 4096) == cudaSuccess);
  REQUIRE(cudaMallocHost(&pinned, 4096) == cudaSuccess);
  REQUIRE(cudaMallocManaged(&managed, 4096) == cudaSuccess);
  std::vector<char> pageable(4096);
  std::vector<char> registered(1 << 16);
  REQUIRE(cudaHostRegister(registered.data(), registered.size(), cudaHostRegisterDefault) ==
          cudaSuccess);

  CHECK(cuda::classify(dev) == MemKind::device);
  CHECK(cuda::classify(static_cast<char*>(dev) + 100) == MemKind::device);
  CHECK(cuda::classify(pinned) == MemKind::pinned);
  CHECK(cuda::classify(managed) == MemKind::managed);
  CHECK(cuda::classify(pageable.data()) == MemKind::host);
  CHECK(cuda::classify(registered.data() + 10) == MemKind::pinned);
  CHECK(cuda::classify(nullptr) == MemKind::host);

  cudaHostUnregister(registered.data());
  cudaFree(managed);
  cudaFreeHost(pinned);
  cudaFree(dev);
}

TEST_CASE("a device-buffer allreduce is counted on device memory, with a correct result") {
  const int n = 1000;
  float* d = nullptr;
  REQUIRE(cudaMalloc(&d, n * sizeof(float)) == cudaSuccess);
  std::vector<float> h(n, 2.0f);
  cudaMemcpy(d, h.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  streamcoll_stat_t before{}, after{};
  REQUIRE(streamcoll_get_stats("allreduce", nullptr, "device", &before) == 0);
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  CHECK(MPI_Allreduce(MPI_IN_PLACE, d, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD) == MPI_SUCCESS);
  REQUIRE(streamcoll_get_stats("allreduce", nullptr, "device", &after) == 0);
  CHECK(after.calls == before.calls + 1);
  cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost);
  for (int i = 0; i < n; ++i) REQUIRE(h[i] == 2.0f * static_cast<float>(size));
  cudaFree(d);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  // The CUDA runtime first: streamcoll opens the driver only once the application has
  // loaded it (cuda::driver() before any runtime call says "not loaded").
  int ndev = 0;
  const bool runtime_ok = cudaGetDeviceCount(&ndev) == cudaSuccess && ndev > 0;
  const cuda::Driver& drv = cuda::driver();
  if (!drv.usable || !runtime_ok) {
    std::printf("SKIP: no usable GPU (%s)\n", drv.usable ? "CUDA runtime sees no device"
                                                          : drv.reason.c_str());
    MPI_Finalize();
    return 77;
  }
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  cudaSetDevice(rank % ndev);
  doctest::Context ctx(argc, argv);
  int rc = ctx.run();
  MPI_Finalize();
  return rc;
}
