// Route nvgroup's kernels' module (nvgroup_module.hpp): the kernels' element types and
// ops, the driver entry points they need, the module loaded once per device and process
// (the route's kernel, route ccube's reduction, host staging's batched copies), and the
// public interface to it (nvgroup_kernels in algorithms/nvgroup.hpp).
#include "algorithms/nvgroup_module.hpp"

#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include "algorithms/nvgroup.hpp"
#include "algorithms/nvgroup_kernel.hpp"
#include "base/log.hpp"
#include "core/cuda_driver.hpp"
#include "core/datatypes.hpp"
#include "core/host_staging.hpp"

namespace streamcoll {

extern const unsigned char kNvgroupFatbin[];
extern const unsigned long kNvgroupFatbin_size;

namespace {
using cuda::driver;
using cuda::ScopedContext;
}  // namespace

namespace nvgroup_detail {

std::optional<nvgroup::DType> kernel_type(const TypeInfo& t) {
  using nvgroup::DType;
  switch (numeric(t)) {
    case Numeric::signed_int:
      if (t.size == 1) return DType::i8;
      if (t.size == 4) return DType::i32;
      if (t.size == 8) return DType::i64;
      return std::nullopt;
    case Numeric::unsigned_int:
      if (t.size == 1) return DType::u8;
      if (t.size == 4) return DType::u32;
      if (t.size == 8) return DType::u64;
      return std::nullopt;
    case Numeric::ieee_float:
      if (t.size == 2) return DType::f16;
      if (t.size == 4) return DType::f32;
      if (t.size == 8) return DType::f64;
      return std::nullopt;
    case Numeric::bfloat16:
      return t.size == 2 ? std::optional<DType>(DType::bf16) : std::nullopt;
    default:
      return std::nullopt;
  }
}

std::optional<nvgroup::ROp> kernel_op(OpKind k) {
  switch (k) {
    case OpKind::sum: return nvgroup::ROp::sum;
    case OpKind::prod: return nvgroup::ROp::prod;
    case OpKind::min: return nvgroup::ROp::min;
    case OpKind::max: return nvgroup::ROp::max;
    default: return std::nullopt;
  }
}

bool driver_has_entry_points() {
  const cuda::Driver& d = driver();
  return d.usable && d.cuModuleLoadData && d.cuModuleGetFunction && d.cuLaunchKernel &&
         d.cuEventSynchronize && d.cuStreamWaitEvent && d.cuMemHostAlloc && d.cuMemFreeHost &&
         d.cuDeviceGetAttribute && d.cuDeviceGetByPCIBusId && d.cuDeviceCanAccessPeer &&
         d.cuMemAlloc && d.cuMemFree && d.cuIpcGetMemHandle && d.cuIpcOpenMemHandle &&
         d.cuIpcCloseMemHandle && d.cuMemHostRegister && d.cuMemHostUnregister &&
         d.cuMemHostGetDevicePointer;
}

}  // namespace nvgroup_detail

namespace {

using nvgroup_detail::driver_has_entry_points;

// The kernels' module, one per device (in its primary context) and process, loaded at the
// first set-up on the device (or route ccube's first call there) and unloaded at
// MPI_Finalize (routes_release).
struct Module {
  CUmodule module = nullptr;
  CUfunction allreduce = nullptr;
  CUfunction reduce = nullptr;  // route ccube's elementwise reduction
  CUfunction batch_copy = nullptr;  // host staging's batched copies
  CUcontext ctx = nullptr;      // retained here: the module lives in it
  CUdevice dev = 0;
};
std::mutex g_modules_mu;
std::map<int, Module> g_modules;
std::set<int> g_module_failed;  // devices where a load failed (route ccube leaves them)
std::map<int, bool> g_capable;  // devices: driver and compute capability fit the fatbin

const Module* module_for(int device, CUdevice dev, std::string* why) {
  std::lock_guard<std::mutex> lock(g_modules_mu);
  Module& m = g_modules[device];
  if (m.allreduce) return &m;
  const cuda::Driver& d = driver();
  if (CUresult r = d.cuDevicePrimaryCtxRetain(&m.ctx, dev); r != CUDA_SUCCESS) {
    m = Module{};
    g_module_failed.insert(device);
    *why = SC_CU_WHY(r, "cuDevicePrimaryCtxRetain");
    return nullptr;
  }
  m.dev = dev;
  CUresult r;
  {
    ScopedContext scope(m.ctx);
    r = d.cuModuleLoadData(&m.module, kNvgroupFatbin);
    if (r != CUDA_SUCCESS) {
      m.module = nullptr;
      *why = SC_CU_WHY(r, "cuModuleLoadData (nvgroup kernels)");
    } else if ((r = d.cuModuleGetFunction(&m.allreduce, m.module,
                                          "streamcoll_nvgroup_allreduce")) != CUDA_SUCCESS) {
      SC_CU_TOLERATE(d.cuModuleUnload(m.module));
      *why = SC_CU_WHY(r, "cuModuleGetFunction (streamcoll_nvgroup_allreduce)");
    } else if ((r = d.cuModuleGetFunction(&m.reduce, m.module, "streamcoll_reduce")) !=
               CUDA_SUCCESS) {
      SC_CU_TOLERATE(d.cuModuleUnload(m.module));
      *why = SC_CU_WHY(r, "cuModuleGetFunction (streamcoll_reduce)");
    } else if ((r = d.cuModuleGetFunction(&m.batch_copy, m.module, "streamcoll_batch_copy")) !=
               CUDA_SUCCESS) {
      SC_CU_TOLERATE(d.cuModuleUnload(m.module));
      *why = SC_CU_WHY(r, "cuModuleGetFunction (streamcoll_batch_copy)");
    }
  }
  if (r != CUDA_SUCCESS) {
    SC_CU_TOLERATE(d.cuDevicePrimaryCtxRelease(dev));
    m = Module{};
    g_module_failed.insert(device);
    return nullptr;
  }
  return &m;
}

}  // namespace

namespace nvgroup_detail {

CUfunction kernel_for(int device, CUdevice dev, std::string* why) {
  const Module* m = module_for(device, dev, why);
  return m ? m->allreduce : nullptr;
}

void unload_modules() {
  std::lock_guard<std::mutex> lock(g_modules_mu);
  for (auto& [device, m] : g_modules) {
    if (!m.module) continue;
    {
      ScopedContext scope(m.ctx);
      SC_CU_TOLERATE(driver().cuModuleUnload(m.module));
    }
    SC_CU_TOLERATE(driver().cuDevicePrimaryCtxRelease(m.dev));
  }
  g_modules.clear();
}

}  // namespace nvgroup_detail

namespace nvgroup_kernels {

std::optional<nvgroup::DType> type_of(const TypeInfo& t) { return nvgroup_detail::kernel_type(t); }
std::optional<nvgroup::ROp> op_of(OpKind k) { return nvgroup_detail::kernel_op(k); }

bool reduce_kernel_may_load(int device) {
  const cuda::Driver& d = driver();
  {
    std::lock_guard<std::mutex> lock(g_modules_mu);
    if (auto it = g_modules.find(device); it != g_modules.end() && it->second.reduce) return true;
    if (g_module_failed.count(device)) return false;
    if (auto it = g_capable.find(device); it != g_capable.end()) return it->second;
  }
  CUdevice dev = 0;
  int major = 0;
  const bool capable =
      driver_has_entry_points() && SC_CU_RESULT(d.cuDeviceGet(&dev, device)) == CUDA_SUCCESS &&
      SC_CU_RESULT(d.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                                          dev)) == CUDA_SUCCESS &&
      major >= 8;
  std::lock_guard<std::mutex> lock(g_modules_mu);
  g_capable[device] = capable;  // asked at every blocking call on device buffers: once
  return capable;
}

// The kernels' module on `device`, loaded there once (module_for); null, with the reason.
const Module* loaded_module(int device, std::string* why) {
  const cuda::Driver& d = driver();
  if (!driver_has_entry_points()) {
    *why = "the CUDA driver lacks the entry points of streamcoll's kernels";
    return nullptr;
  }
  CUdevice dev = 0;
  if (CUresult r = d.cuDeviceGet(&dev, device); r != CUDA_SUCCESS) {
    *why = SC_CU_WHY(r, "cuDeviceGet");
    return nullptr;
  }
  return module_for(device, dev, why);
}

CUfunction reduce_kernel(int device, std::string* why) {
  const Module* m = loaded_module(device, why);
  return m ? m->reduce : nullptr;
}

CUfunction batch_copy_kernel(int device, std::string* why) {
  if (!reduce_kernel_may_load(device)) {  // the same module, the same conditions
    *why = "no kernels for this GPU or driver";
    return nullptr;
  }
  const Module* m = loaded_module(device, why);
  return m ? m->batch_copy : nullptr;
}

namespace {
// Host staging (core) launches the batched copies of this module: it is told where they
// are when the library loads.
[[maybe_unused]] const bool g_batch_copy_registered = [] {
  host_staging::set_batch_copy_loader(&batch_copy_kernel);
  return true;
}();
}  // namespace

}  // namespace nvgroup_kernels

}  // namespace streamcoll
