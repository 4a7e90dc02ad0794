// The CUDA driver, opened with dlopen("libcuda.so.1") at first need. A node without a
// driver, without a device, or with only the toolkit's stub library gets usable()==false
// and a reason; nothing in libstreamcoll links against CUDA.
// Thread-safe: the first call to driver() loads it once; afterwards it is read-only.
#pragma once

#include <string>

#include "core/types.hpp"

#if STREAMCOLL_HAVE_CUDA
#include <cuda.h>
#endif

namespace streamcoll::cuda {

struct Driver {
  bool usable = false;
  int device_count = 0;
  int version = 0;     ///< cuDriverGetVersion, e.g. 13000
  std::string reason;  ///< why not usable
#if STREAMCOLL_HAVE_CUDA
  CUresult (*cuInit)(unsigned) = nullptr;
  CUresult (*cuDriverGetVersion)(int*) = nullptr;
  CUresult (*cuDeviceGetCount)(int*) = nullptr;
  CUresult (*cuPointerGetAttributes)(unsigned, CUpointer_attribute*, void**, CUdeviceptr) = nullptr;
  CUresult (*cuGetErrorString)(CUresult, const char**) = nullptr;
#endif
};

/// Loads the driver on first call. Honors nothing from the environment except what the
/// CUDA driver itself reads (CUDA_VISIBLE_DEVICES).
const Driver& driver();

/// Where `p` lives. Host when the driver is not usable, for nullptr, and for pointers the
/// driver does not know. Cost: one cuPointerGetAttributes (no context needed).
MemKind classify(const void* p);

}  // namespace streamcoll::cuda
