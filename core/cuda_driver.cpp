#include "core/cuda_driver.hpp"

#include <dlfcn.h>

#include <type_traits>

namespace streamcoll::cuda {
namespace {

Driver load() {
  Driver d;
#if !STREAMCOLL_HAVE_CUDA
  d.reason = "built without the CUDA headers";
#else
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* e = dlerror();
    d.reason = std::string("libcuda.so.1 not loadable: ") + (e ? e : "unknown");
    return d;
  }
  auto sym = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
    return fn != nullptr;
  };
  if (!sym(d.cuInit, "cuInit") || !sym(d.cuDriverGetVersion, "cuDriverGetVersion") ||
      !sym(d.cuDeviceGetCount, "cuDeviceGetCount") ||
      !sym(d.cuPointerGetAttributes, "cuPointerGetAttributes") ||
      !sym(d.cuGetErrorString, "cuGetErrorString")) {
    d.reason = "libcuda.so.1 lacks a needed entry point";
    return d;
  }
  if (CUresult r = d.cuInit(0); r != CUDA_SUCCESS) {
    const char* msg = nullptr;
    d.cuGetErrorString(r, &msg);
    d.reason = std::string("cuInit failed: ") + (msg ? msg : "error " + std::to_string(r));
    return d;
  }
  d.cuDriverGetVersion(&d.version);
  if (d.cuDeviceGetCount(&d.device_count) != CUDA_SUCCESS || d.device_count == 0) {
    d.reason = "no CUDA device visible";
    return d;
  }
  d.usable = true;
  // The library stays open for the life of the process: CUDA cannot be unloaded safely.
#endif
  return d;
}

}  // namespace

const Driver& driver() {
  static const Driver d = load();
  return d;
}

MemKind classify(const void* p) {
#if STREAMCOLL_HAVE_CUDA
  const Driver& d = driver();
  if (!d.usable || p == nullptr) return MemKind::host;
  // Zero-initialised so that a driver writing a narrower type (IS_MANAGED is a bool)
  // still leaves a correct value.
  unsigned int mem_type = 0, is_managed = 0;
  CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                 CU_POINTER_ATTRIBUTE_IS_MANAGED};
  void* data[] = {&mem_type, &is_managed};
  if (d.cuPointerGetAttributes(2, attrs, data, reinterpret_cast<CUdeviceptr>(p)) !=
      CUDA_SUCCESS)
    return MemKind::host;
  if (is_managed) return MemKind::managed;
  if (mem_type == CU_MEMORYTYPE_DEVICE) return MemKind::device;
  if (mem_type == CU_MEMORYTYPE_HOST) return MemKind::pinned;
  return MemKind::host;
#else
  (void)p;
  return MemKind::host;
#endif
}

}  // namespace streamcoll::cuda
