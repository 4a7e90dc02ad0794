// Route nvgroup's group (nvgroup_group.hpp): its status words, the registered inputs
// (this rank's registrations, the peers' mapped, the input word a kernel reads), giving
// rounds up, and the graveyard where a gone communicator's group waits until no peer can
// still read its scratch.
#include "algorithms/nvgroup_group.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "base/log.hpp"
#include "core/cuda_driver.hpp"

namespace streamcoll::nvgroup_detail {

using cuda::driver;
using cuda::ScopedContext;

Group::StatusWord Group::take_status() {
  std::lock_guard<std::mutex> lock(mu);
  if (free_status.empty()) {
    const cuda::Driver& d = driver();
    void* page = nullptr;
    CUdeviceptr dev = 0;
    // Results: the caller reports a missing status word.
    if (SC_CU_RESULT(d.cuMemHostAlloc(&page, kStatusPerPage * sizeof(uint64_t),
                                      CU_MEMHOSTALLOC_DEVICEMAP)) != CUDA_SUCCESS)
      return StatusWord{nullptr, 0};
    if (SC_CU_RESULT(d.cuMemHostGetDevicePointer(&dev, page, 0)) != CUDA_SUCCESS) {
      SC_CU_TOLERATE(d.cuMemFreeHost(page));
      return StatusWord{nullptr, 0};
    }
    status_pages.push_back(page);
    for (size_t i = 0; i < kStatusPerPage; ++i)
      free_status.push_back(StatusWord{static_cast<uint64_t*>(page) + i, dev + i * sizeof(uint64_t)});
  }
  StatusWord w = free_status.back();
  free_status.pop_back();
  __atomic_store_n(w.host, 0, __ATOMIC_RELEASE);
  return w;
}

void Group::give_status(StatusWord w) {
  std::lock_guard<std::mutex> lock(mu);
  free_status.push_back(w);
}

bool Group::passed(uint64_t q) const {
  for (uint32_t m = 0; m < members; ++m) {
    if (__atomic_load_n(fail_host(m), __ATOMIC_ACQUIRE) >= q) continue;
    for (uint32_t b = 0; b < blocks; ++b) {
      const uint64_t v = __atomic_load_n(
          flags_host() + (static_cast<uint64_t>(m) * kMaxBlocks + b) * kFlagWords + nvgroup::kDone,
          __ATOMIC_ACQUIRE);
      if ((v & ~nvgroup::kFailBit) < q) return false;
    }
  }
  return true;
}

void Group::map_peers() {
  const cuda::Driver& d = driver();
  for (uint32_t m = 0; m < members; ++m) {
    if (m == me) continue;
    for (uint32_t j = 0; j < static_cast<uint32_t>(kSlots); ++j) {
      const uint64_t gen = __atomic_load_n(&reg(m, j)->gen, __ATOMIC_ACQUIRE);
      if (gen == opened_gen[m][j]) continue;
      maps_host[m * kSlots + j] = 0;
      if (opened[m][j]) SC_CU_TOLERATE(d.cuIpcCloseMemHandle(opened[m][j]));
      opened[m][j] = 0;
      opened_gen[m][j] = gen;
      if (!gen) continue;
      CUdeviceptr p = 0;
      // A result: a peer's input not mapped here is read through scratch (told in the ack).
      const bool ok = SC_CU_RESULT(d.cuIpcOpenMemHandle(&p, reg(m, j)->handle,
                                                        CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)) ==
                      CUDA_SUCCESS;
      if (ok) {
        opened[m][j] = p;
        __atomic_store_n(&maps_host[m * kSlots + j], static_cast<uint64_t>(p), __ATOMIC_RELEASE);
      }
      __atomic_store_n(ack(me, m, j), ok ? gen : gen | kNotMapped, __ATOMIC_RELEASE);
    }
  }
}

uint64_t Group::input_word(const void* ptr, uint64_t bytes, uint64_t last) {
  if (!direct || !maps_host || members < 2 || bytes == 0) return 0;
  const cuda::Driver& d = driver();
  CUdeviceptr base = 0;
  size_t size = 0;
  unsigned long long id = 0;
  bool ipc_capable = false;  // cudaMalloc memory; not pool (cudaMallocAsync) or managed memory
  CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                 CU_POINTER_ATTRIBUTE_BUFFER_ID,
                                 CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE};
  void* data[] = {&base, &size, &id, &ipc_capable};
  const auto addr = reinterpret_cast<CUdeviceptr>(ptr);
  // A probe: memory the driver cannot export is copied through scratch.
  if (SC_CU_RESULT(d.cuPointerGetAttributes(4, attrs, data, addr)) != CUDA_SUCCESS || !base || !id ||
      !ipc_capable || addr < base || addr + bytes > base + size)
    return 0;
  ++clock;
  for (uint32_t j = 0; j < static_cast<uint32_t>(kSlots); ++j) {
    Own& o = own[j];
    if (o.base != base || o.id != id) continue;
    o.used = clock;
    for (uint32_t m = 0; m < members; ++m)
      if (m != me && __atomic_load_n(ack(m, me, j), __ATOMIC_ACQUIRE) != o.gen) return 0;
    o.last_seq = std::max(o.last_seq, last);
    return nvgroup::input_word(j, addr - base);
  }
  if (std::find(not_exportable.begin(), not_exportable.end(), id) != not_exportable.end()) return 0;
  int slot = -1;
  for (uint32_t j = 0; j < static_cast<uint32_t>(kSlots); ++j)
    if (!own[j].gen || passed(own[j].last_seq))
      if (slot < 0 || !own[j].gen || (own[slot].gen && own[j].used < own[slot].used))
        slot = static_cast<int>(j);
  if (slot < 0) return 0;  // every slot may still be read: copy this time
  Registration* r = reg(me, static_cast<uint32_t>(slot));
  CUipcMemHandle h;
  if (SC_CU_RESULT(d.cuIpcGetMemHandle(&h, base)) != CUDA_SUCCESS) {  // probe: copied instead
    if (not_exportable.size() >= 64) not_exportable.erase(not_exportable.begin());
    not_exportable.push_back(id);
    return 0;
  }
  __atomic_store_n(&r->gen, 0, __ATOMIC_RELEASE);  // being rewritten
  r->bytes = size;
  r->handle = h;
  own[slot] = Own{base, size, id, ++next_gen, 0, clock};
  SC_TRACE("nvgroup: input allocation %p (buffer id %llu) registered in slot %d",
           reinterpret_cast<void*>(base), id, slot);
  __atomic_store_n(&r->gen, own[slot].gen, __ATOMIC_RELEASE);
  return 0;  // the peers map it at their next call
}

bool Group::quiet() const {
  if (!segment) return true;
  if (last_recorded && cuctx) {
    ScopedContext scope(cuctx);
    if (driver().cuEventQuery(last) == CUDA_ERROR_NOT_READY) return false;
  }
  return passed(last_seq);
}

void Group::give_up(uint64_t q) {
  const cuda::Driver& d = driver();
  CUevent behind = nullptr;
  if (last_recorded && cuctx) {
    ScopedContext scope(cuctx);
    if (SC_CU_RESULT(d.cuEventQuery(last)) == CUDA_ERROR_NOT_READY &&
        SC_CU_RESULT(d.cuEventCreate(&behind, CU_EVENT_DISABLE_TIMING)) == CUDA_SUCCESS &&
        SC_CU_RESULT(d.cuEventRecord(behind, last_stream)) != CUDA_SUCCESS) {
      SC_CU_TOLERATE(d.cuEventDestroy(behind));
      behind = nullptr;  // cannot tell: the kernel will never run (a failed context)
    }
  }
  if (!behind) return fail_through(q);
  std::thread([self = shared_from_this(), behind, q] {
    const cuda::Driver& dr = driver();
    {
      ScopedContext scope(self->cuctx);
      while (dr.cuEventQuery(behind) == CUDA_ERROR_NOT_READY) usleep(100);
      dr.cuEventDestroy(behind);
    }
    self->fail_through(q);
  }).detach();
}

void Group::fail_through(uint64_t q) {
  std::lock_guard<std::mutex> lock(mu);
  uint64_t* f = fail_host(me);
  if (__atomic_load_n(f, __ATOMIC_RELAXED) < q) __atomic_store_n(f, q, __ATOMIC_RELEASE);
  if (last_seq < q) last_seq = q;
}

void Group::close_peers() {
  if (!cuctx) return;
  ScopedContext scope(cuctx);
  for (CUdeviceptr& p : peer)
    if (p) {
      SC_CU_TOLERATE(driver().cuIpcCloseMemHandle(p));
      p = 0;
    }
}

Group::~Group() {
  const cuda::Driver& d = driver();
  if (cuctx) {
    ScopedContext scope(cuctx);
    for (CUdeviceptr p : peer)
      if (p) SC_CU_TOLERATE(d.cuIpcCloseMemHandle(p));
    if (scratch) SC_CU_TOLERATE(d.cuMemFree(scratch));
    for (auto& row : opened)
      for (CUdeviceptr p : row)
        if (p) SC_CU_TOLERATE(d.cuIpcCloseMemHandle(p));
    if (maps_host) SC_CU_TOLERATE(d.cuMemFreeHost(maps_host));
    if (registered) SC_CU_TOLERATE(d.cuMemHostUnregister(segment));
    for (void* page : status_pages) SC_CU_TOLERATE(d.cuMemFreeHost(page));
    if (classic) SC_CU_TOLERATE(d.cuStreamDestroy(classic));
    if (side) SC_CU_TOLERATE(d.cuStreamDestroy(side));
    if (copy) SC_CU_TOLERATE(d.cuStreamDestroy(copy));
    if (legacy) SC_CU_TOLERATE(d.cuEventDestroy(legacy));
    if (last) SC_CU_TOLERATE(d.cuEventDestroy(last));
    SC_CU_TOLERATE(d.cuDevicePrimaryCtxRelease(cudev));
  }
  if (segment) munmap(segment, kSegmentBytes);
}

namespace {

// Groups of gone communicators whose peers may still read their scratch.
std::mutex g_grave_mu;
std::vector<std::shared_ptr<Group>> g_grave;

}  // namespace

void bury(std::shared_ptr<Group> g) {
  std::vector<std::shared_ptr<Group>> done;
  {
    std::lock_guard<std::mutex> lock(g_grave_mu);
    if (g && !g->quiet()) g_grave.push_back(std::move(g));
    for (auto it = g_grave.begin(); it != g_grave.end();) {
      if (!(*it)->quiet()) {
        ++it;
        continue;
      }
      done.push_back(std::move(*it));
      it = g_grave.erase(it);
    }
  }
  done.clear();
  g.reset();  // (not buried: quiet already)
}

NvgroupState& state_of(CommContext& ctx) {
  auto& slot = ctx.route_state[static_cast<int>(RouteId::nvgroup)];
  if (!slot) slot = std::make_unique<NvgroupState>();
  return static_cast<NvgroupState&>(*slot);
}

void clear_grave() {
  std::lock_guard<std::mutex> lock(g_grave_mu);
  g_grave.clear();
}

}  // namespace streamcoll::nvgroup_detail
