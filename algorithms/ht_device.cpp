#include "algorithms/ht_device.hpp"

#if STREAMCOLL_HAVE_CUDA

#include <algorithm>

#include "base/log.hpp"
#include "core/cuda_driver.hpp"

namespace streamcoll::ht_device {
namespace {

// A one-thread kernel that spins until (int32)(*flag - value) >= 0, the semantics of
// cuStreamWaitValue32 with CU_STREAM_WAIT_VALUE_GEQ; for drivers and devices without
// stream memory operations. PTX, compiled by the driver for whatever GPU it runs on.
constexpr const char kWaitKernelPtx[] = R"(
.version 6.0
.target sm_50
.address_size 64
.visible .entry streamcoll_wait_geq(.param .u64 flag, .param .u32 value)
{
  .reg .pred p;
  .reg .b32 v, want, d;
  .reg .b64 a;
  ld.param.u64 a, [flag];
  ld.param.u32 want, [value];
WAIT:
  ld.volatile.global.u32 v, [a];
  sub.s32 d, v, want;
  setp.lt.s32 p, d, 0;
  @p bra WAIT;
  membar.sys;
  ret;
}
)";

}  // namespace

bool invalidated(CUresult r) {
  return r == CUDA_ERROR_INVALID_HANDLE || r == CUDA_ERROR_CONTEXT_IS_DESTROYED ||
         r == CUDA_ERROR_INVALID_CONTEXT;
}

thread_local const Device* t_checked = nullptr;

// ---- PinnedPool ---------------------------------------------------------------------------

void* PinnedPool::get(size_t bytes) {
  const size_t cls = size_class(bytes);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto& list = free_[cls];
    while (!list.empty()) {
      void* p = list.back();
      list.pop_back();
      // A context reset (cudaDeviceReset) took the buffer with it: forget it.
      if (cuda::classify(p) == MemKind::pinned) return p;
      forget_locked(p);
    }
  }
  void* p = nullptr;
  // Results: a caller without pinned memory stages through pageable memory or fails (its
  // report says where).
  if (SC_CU_RESULT(cuda::driver().cuMemHostAlloc(
          &p, cls, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP)) != CUDA_SUCCESS)
    return nullptr;
  CUcontext ctx = nullptr;
  cuda::driver().cuCtxGetCurrent(&ctx);
  std::lock_guard<std::mutex> lock(mu_);
  all_.push_back(p);
  sizes_[p] = cls;
  owner_[p] = ctx;
  return p;
}

void PinnedPool::put(void* p) {
  if (!p) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sizes_.find(p);
  if (it != sizes_.end()) free_[it->second].push_back(p);  // else: forgotten (a reset took it)
}

void PinnedPool::forget_context(CUcontext ctx) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = owner_.begin(); it != owner_.end();) {
    if (it->second != ctx) {
      ++it;
      continue;
    }
    void* p = it->first;
    it = owner_.erase(it);
    if (auto sz = sizes_.find(p); sz != sizes_.end()) {
      auto& list = free_[sz->second];
      list.erase(std::remove(list.begin(), list.end(), p), list.end());
      sizes_.erase(sz);
    }
    all_.erase(std::remove(all_.begin(), all_.end(), p), all_.end());
    slabs_.erase(static_cast<uint32_t*>(p));
    free_flags_.erase(std::remove_if(free_flags_.begin(), free_flags_.end(),
                                     [&](const auto& f) { return slab_of(f.first) == nullptr; }),
                      free_flags_.end());
  }
}

void PinnedPool::forget_locked(void* p) {
  sizes_.erase(p);
  owner_.erase(p);
  all_.erase(std::remove(all_.begin(), all_.end(), p), all_.end());
}

bool PinnedPool::get_flag(uint32_t** host, CUdeviceptr* dev) {
  std::lock_guard<std::mutex> lock(mu_);
  if (free_flags_.empty()) {
    void* slab = nullptr;
    const cuda::Driver& d = cuda::driver();
    CUdeviceptr base = 0;
    if (SC_CU_RESULT(d.cuMemHostAlloc(&slab, kFlags * sizeof(uint32_t),
                                      CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP)) !=
        CUDA_SUCCESS)  // the caller reports it
      return false;
    if (SC_CU_RESULT(d.cuMemHostGetDevicePointer(&base, slab, 0)) != CUDA_SUCCESS) {
      SC_CU_TOLERATE(d.cuMemFreeHost(slab));
      return false;
    }
    all_.push_back(slab);
    CUcontext ctx = nullptr;
    d.cuCtxGetCurrent(&ctx);
    owner_[slab] = ctx;
    slabs_.insert(static_cast<uint32_t*>(slab));
    for (size_t i = 0; i < kFlags; ++i)
      free_flags_.push_back({static_cast<uint32_t*>(slab) + i, base + i * sizeof(uint32_t)});
  }
  auto f = free_flags_.back();
  free_flags_.pop_back();
  *host = f.first;
  *dev = f.second;
  __atomic_store_n(*host, 0u, __ATOMIC_RELEASE);
  return true;
}

void PinnedPool::put_flag(uint32_t* host, CUdeviceptr dev) {
  std::lock_guard<std::mutex> lock(mu_);
  if (slab_of(host)) free_flags_.push_back({host, dev});  // else: a reset took its slab
}

void PinnedPool::release_all() {
  std::lock_guard<std::mutex> lock(mu_);
  for (void* p : all_) SC_CU_TOLERATE(cuda::driver().cuMemFreeHost(p));
  all_.clear();
  free_.clear();
  sizes_.clear();
  owner_.clear();
  slabs_.clear();
  free_flags_.clear();
}

size_t PinnedPool::size_class(size_t bytes) {
  size_t c = 4096;
  while (c < bytes) c <<= 1;
  return c;
}

uint32_t* PinnedPool::slab_of(uint32_t* f) const {
  auto it = slabs_.upper_bound(f);
  if (it == slabs_.begin()) return nullptr;
  --it;
  return f < *it + kFlags ? *it : nullptr;
}

// ---- DeviceSide ---------------------------------------------------------------------------

DeviceSide& DeviceSide::get() {
  static DeviceSide* d = new DeviceSide;  // lives to the end of the process
  return *d;
}

void DeviceSide::revalidate(Device& g) {
  const cuda::Driver& d = cuda::driver();
  if (g.sentinel) {
    if (!invalidated(d.cuEventQuery(g.sentinel))) return;
    SC_INFO("ht: a context reset took GPU %d's events, side streams and pinned memory; made anew",
            static_cast<int>(g.dev));
    g.events.clear();
    g.sides.clear();
    g.lent.clear();
    g.sentinel = nullptr;
    g.unvouched = false;
    g.module = nullptr;  // the spin kernel's module went too
    g.wait_kernel = nullptr;
    pool.forget_context(g.ctx);
  }
  if (g.unvouched) return;
  cuda::ScopedContext scope(g.ctx);
  if (SC_CU_RESULT(d.cuEventCreate(&g.sentinel, CU_EVENT_DISABLE_TIMING)) != CUDA_SUCCESS)
    g.sentinel = nullptr;  // nothing is vouched for then
  // Pooled objects older than a new sentinel (none in the common case: it is made at
  // the GPU's first check) are never vouched for.
  g.unvouched = !g.sentinel || !g.events.empty() || !g.sides.empty() || !g.lent.empty();
}

Device* DeviceSide::device(int ordinal) {
  if (ordinal < 0 || ordinal >= kMaxDevices) return nullptr;
  Device& g = gpus_[ordinal];
  std::lock_guard<std::mutex> lock(g.mu);
  if (g.ready) return &g;
  if (g.failed) return nullptr;
  const cuda::Driver& d = cuda::driver();
  if (SC_CU_RESULT(d.cuDeviceGet(&g.dev, ordinal)) != CUDA_SUCCESS ||  // warned below
      SC_CU_RESULT(d.cuDevicePrimaryCtxRetain(&g.ctx, g.dev)) != CUDA_SUCCESS) {
    g.failed = true;
    SC_WARN("ht: GPU %d has no usable context; its calls go elsewhere", ordinal);
    return nullptr;
  }
  revalidate(g);  // the sentinel, before any pooled object
  g.ready = true;
  return &g;
}

CUstream DeviceSide::side(Device& g, uint64_t comm_id) {
  std::lock_guard<std::mutex> lock(g.mu);
  cuda::ScopedContext scope(g.ctx);
  const bool vouched = checked(g);
  if (auto it = g.sides.find(comm_id); it != g.sides.end()) {
    if (vouched || !invalidated(cuda::driver().cuStreamQuery(it->second))) return it->second;
    g.sides.erase(it);
  }
  CUstream s = nullptr;
  if (SC_CU_RESULT(cuda::driver().cuStreamCreate(&s, CU_STREAM_NON_BLOCKING)) != CUDA_SUCCESS)
    return nullptr;  // the caller reports it
  g.sides.emplace(comm_id, s);
  return s;
}

void DeviceSide::drop(uint64_t comm_id) {
  const cuda::Driver& d = cuda::driver();
  if (!d.usable) return;
  for (Device& g : gpus_) {
    std::lock_guard<std::mutex> lock(g.mu);
    if (!g.ready) continue;
    auto it = g.sides.find(comm_id);
    if (it == g.sides.end()) continue;
    cuda::ScopedContext scope(g.ctx);
    SC_CU_TOLERATE(d.cuStreamDestroy(it->second));
    g.sides.erase(it);
  }
}

CUevent DeviceSide::event(Device& g) {
  std::lock_guard<std::mutex> lock(g.mu);
  const bool vouched = checked(g);
  CUevent e = nullptr;
  while (!g.events.empty() && !e) {
    e = g.events.back();
    g.events.pop_back();
    if (!vouched && invalidated(cuda::driver().cuEventQuery(e))) e = nullptr;  // a reset took it
  }
  if (!e && SC_CU_RESULT(cuda::driver().cuEventCreate(&e, CU_EVENT_DISABLE_TIMING)) != CUDA_SUCCESS)
    return nullptr;  // the caller reports it
  g.lent.insert(e);
  return e;
}

void DeviceSide::put_event(Device& g, CUevent e) {
  if (!e) return;
  std::lock_guard<std::mutex> lock(g.mu);
  if (g.lent.erase(e)) g.events.push_back(e);  // else lent before a reset: gone with it
}

CUresult DeviceSide::hold_stream(Device& g, CUstream stream, CUdeviceptr dev_flag, config::HtWait mode) {
  const cuda::Driver& d = cuda::driver();
  if (mode != config::HtWait::kernel && d.cuStreamWaitValue32 &&
      !memops_unsupported_.load(std::memory_order_relaxed)) {
    CUresult r = d.cuStreamWaitValue32(stream, dev_flag, 1, CU_STREAM_WAIT_VALUE_GEQ);
    if (r != CUDA_ERROR_NOT_SUPPORTED || mode == config::HtWait::memop) return r;
    memops_unsupported_.store(true);
    SC_INFO("ht: stream memory operations are not supported here; using the spin kernel");
  }
  if (mode == config::HtWait::memop) return CUDA_ERROR_NOT_SUPPORTED;
  CUfunction fn = wait_kernel(g);
  if (!fn) return CUDA_ERROR_NOT_SUPPORTED;
  uint32_t value = 1;
  void* params[] = {&dev_flag, &value};
  return d.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, stream, params, nullptr);
}

bool DeviceSide::can_hold(config::HtWait mode) {
  const cuda::Driver& d = cuda::driver();
  const bool kernel = d.cuModuleLoadData && d.cuModuleGetFunction && d.cuLaunchKernel &&
                      d.cuModuleUnload;
  const bool memop = d.cuStreamWaitValue32 != nullptr;
  if (!d.cuMemHostGetDevicePointer) return false;
  switch (mode) {
    case config::HtWait::memop: return memop;
    case config::HtWait::kernel: return kernel;
    default: return memop || kernel;
  }
}

void DeviceSide::shutdown() {
  const cuda::Driver& d = cuda::driver();
  if (!d.usable) return;
  for (Device& g : gpus_) {
    std::lock_guard<std::mutex> lock(g.mu);
    if (!g.ready) continue;
    {
      cuda::ScopedContext scope(g.ctx);
      for (auto& [id, side] : g.sides) d.cuStreamSynchronize(side);
      for (CUevent e : g.events) SC_CU_TOLERATE(d.cuEventDestroy(e));
      g.events.clear();
      g.lent.clear();
      if (g.sentinel) SC_CU_TOLERATE(d.cuEventDestroy(g.sentinel));
      g.sentinel = nullptr;
      g.unvouched = false;
      for (auto& [id, side] : g.sides) SC_CU_TOLERATE(d.cuStreamDestroy(side));
      g.sides.clear();
      if (g.module) SC_CU_TOLERATE(d.cuModuleUnload(g.module));
    }
    g.module = nullptr;
    g.wait_kernel = nullptr;
    SC_CU_TOLERATE(d.cuDevicePrimaryCtxRelease(g.dev));
    g.ready = false;
  }
  pool.release_all();
}

CUfunction DeviceSide::wait_kernel(Device& g) {
  std::lock_guard<std::mutex> lock(g.mu);
  if (g.wait_kernel) return g.wait_kernel;
  const cuda::Driver& d = cuda::driver();
  if (!d.cuModuleLoadData || !d.cuModuleGetFunction) return nullptr;
  if (SC_CU_CHECK(d.cuModuleLoadData(&g.module, kWaitKernelPtx), "ht: loading the spin-wait kernel"))
    return nullptr;  // logged; no spin kernel
  if (SC_CU_RESULT(d.cuModuleGetFunction(&g.wait_kernel, g.module, "streamcoll_wait_geq")) !=
      CUDA_SUCCESS)
    g.wait_kernel = nullptr;
  return g.wait_kernel;
}

}  // namespace streamcoll::ht_device

#endif  // STREAMCOLL_HAVE_CUDA
