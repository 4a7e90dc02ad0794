// nvgroup: allreduce, reduce_scatter_block and allgather by the GPUs of one NVLink group
// reading each other's memory (one kernel, three modes: nvgroup_kernel.hpp).
//
// Source: NV-Group (Chu et al., OSU), sections 3-4 (its cost model: algorithms/
// cost_model.cpp, nvgroup_allreduce). The kernel and its protocol: nvgroup_kernel.hpp.
//
// Group: every rank of the communicator, when they all run on one node (ctx.nodes == 1),
// there are at most kMaxMembers of them, and every rank can reach every other rank's GPU:
// the same GPU (CUDA IPC between processes on one device), a GPU this rank's driver sees
// (cuDeviceGetByPCIBusId) with peer access (cuDeviceCanAccessPeer), or a GPU it cannot
// see (one GPU per rank, CUDA_VISIBLE_DEVICES) whose memory it opens: the set-up opens
// every peer's scratch through its IPC handle anyway (step 3), and that open is the probe
// (the driver enables peer access lazily, and fails where the two GPUs have none; UCX's
// cuda_ipc decides the same way). The probe's outcome is agreed with the rest (step 4):
// a pair that fails turns the route off on every rank. NVML is not needed: the bus ids
// the ranks exchange already tell the same GPU apart from another one.
//
// Several groups (a communicator over several nodes, or a hierarchy imposed by the rule's
// hierarchy= or STREAMCOLL_HIERARCHY with two levels or more): the route is BlueConnect's
// decomposition (algorithms/blueconnect.cpp) with this route's kernels as the stage
// backend of its innermost level: reduce-scatter inside each group (the kernel's first
// half), the cross-group step on each rank's slice by route nccl or ht (cross=, one
// allreduce across the groups at the outermost level), all-gather inside each group (the
// kernel's second half). The groups are the hierarchy's innermost level.
//
// Set-up, per communicator, at its first blocking call routed here (collective; every
// rank gets there at the same call, and the outcome is agreed, so either every rank
// uses the route on this communicator or none does):
//   1. local: the buffer's GPU, its primary context, a stream, the kernels' module (one
//      per device and process), a scratch area of 2 x chunk bytes and an inbox of flags
//      (cuMemAlloc; the inbox zeroed) and its IPC handle;
//   2. PMPI_Allgather of (ok, bus id, SM count, IPC handle): the group and the grid size
//      (min of `blocks` and every member's SM count, so that every block can be resident:
//      blocks wait for their peers' blocks) follow from it alike on every rank;
//   3. rank 0 makes the flags segment (POSIX shared memory), PMPI_Bcast its name; every
//      rank maps it, registers it with its device (cuMemHostRegister), opens the peers'
//      IPC handles;
//   4. PMPI_Allreduce(MIN, ok): ready, or off for good (the calls take the next rule).
//
// Registered inputs (the kernel's side: nvgroup_kernel.hpp). A rank whose input buffer
// lies in a CUDA IPC capable allocation (cudaMalloc's; not pool or managed memory)
// registers the allocation in one of its kSlots slots of the flags segment (its IPC
// handle, a generation), at the first call that passes it; each peer maps it at its next
// call (cuIpcOpenMemHandle, into a device-mapped table the kernels read) and acknowledges
// the generation. From then on, once every peer has acknowledged, the rank's kernel skips
// copying its input into scratch and tells the peers (its input word) to read it in
// place: per call, per rank, a local choice, so nothing needs agreeing. Allocations are
// known by base address and buffer id (CU_POINTER_ATTRIBUTE_BUFFER_ID), so one freed and
// another made at the same address is registered anew. A slot goes to another allocation
// (least recently used) only once every member is past the last round that may read it;
// a peer's old mapping is closed when it sees the new generation. A failure anywhere in
// this (attributes, export, mapping, the table's memory) only means copying, as before.
//
// Per call (blocking calls; MPI_I* below):
//   classic   the kernel on an internal stream ordered after the legacy stream (as a
//             legacy-stream copy would be); the host waits for it and reads the status
//             word, so a failure seen by the kernel is this call's error.
//   attached  the kernel on the communicator's stream; returns at once. A failure the
//             kernel saw is reported by the next call on the communicator.
// MPI_I* calls (only with STREAMCOLL_NVGROUP_NONBLOCKING=1; otherwise the table's next
// rule): each member's kernel waits for its peers' kernels, so operations of two
// communicators started in different orders on different ranks, which MPI allows for
// non-blocking calls, could wait for each other on the GPU (the hazard NCCL's user guide
// describes for its own kernels); a program that starts them in one order everywhere may
// say so. Classic: the kernel goes on the internal stream, and the request completes once
// an event behind it has (its own status word says whether it failed). Stream-ordered:
// the kernel goes on a side stream that waits for the attached stream, and MPI_Wait makes
// the attached stream wait for it (the host does not).
// Calls decided from earlier agreements (stream-ordered: Route::adapts; MPI_I*): a rank
// whose buffers are not on the group's GPU (host memory, another GPU) copies its input to
// scratch there and runs its kernel classic, the results copied back after it (Staged,
// run_staged); a rank without the stream runs classic.
// The kernels of one communicator run one after the other on this rank's GPU, whatever
// streams they go on (each waits for an event behind the previous one): every kernel
// waits for the previous call's rounds, and two resident at once could starve each other.
//
// Failures stay collective: a rank that cannot launch its kernel (or whose stream fails)
// writes its failure word in the flags segment (Group::give_up: once its own earlier
// kernels are done): the peers' kernels waiting for it see it, go on without its data,
// finish, and report the call failed (their status words). A
// rank never frees its scratch while a peer may still read it: a gone communicator's
// resources wait until every member's flags say it is done (or MPI_Finalize).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "algorithms/nvgroup.hpp"
#include "algorithms/nvgroup_kernel.hpp"
#include "algorithms/route.hpp"
#include "base/log.hpp"
#include "core/coll_args.hpp"
#include "core/call_request.hpp"
#include "core/cuda_driver.hpp"
#include "core/datatypes.hpp"
#include "core/staging.hpp"
#include "core/errors.hpp"
#include "core/host_staging.hpp"
#include "core/requests.hpp"
#include "core/runtime.hpp"
#include "core/service.hpp"
#include "core/stats.hpp"
#include "core/topology.hpp"

namespace streamcoll {

extern const unsigned char kNvgroupFatbin[];
extern const unsigned long kNvgroupFatbin_size;

namespace {

using cuda::driver;
using cuda::ScopedContext;
using nvgroup::kFlagWords;
using nvgroup::kMaxBlocks;
using nvgroup::kMaxMembers;

// Bytes per round (scratch: twice that). Each round costs a few flag exchanges whatever
// its size: on an H100, 2 and 4 ranks sharing it under MPS, 16 MiB allreduces ran at 1.8x
// (2 ranks) and 2.0x (4) the bandwidth of 1 MiB rounds, small ones alike
// (bench/results/gpu_h100_2026-11-25).
constexpr uint64_t kDefaultChunk = 4 << 20;
constexpr uint32_t kDefaultBlocks = 32;
constexpr unsigned kThreads = 256;

// The flags segment: flags[member][block][kFlagWords], then each member's failure word
// (written by its host only) and status word (written by its kernel).
constexpr size_t kFlagsBytes = sizeof(uint64_t) * kMaxMembers * kMaxBlocks * kFlagWords;
constexpr size_t kFailOffset = kFlagsBytes;
constexpr size_t kStatusOffset = kFailOffset + sizeof(uint64_t) * kMaxMembers;
// Registered inputs (nvgroup_kernel.hpp): each member's registry of exported allocations,
// reg[member][slot], written by its host; and acks[peer][member][slot], the generation of
// that registration the peer's host has mapped (kNotMapped added when it could not).
using nvgroup::kSlots;
struct Registration {
  uint64_t gen;  // 0: empty; written last (release)
  uint64_t bytes;
  CUipcMemHandle handle;
};
constexpr size_t kRegOffset = kStatusOffset + sizeof(uint64_t) * kMaxMembers;
constexpr size_t kAckOffset = kRegOffset + sizeof(Registration) * kMaxMembers * kSlots;
constexpr uint64_t kNotMapped = 1ull << 63;
constexpr size_t kSegmentBytes =
    (kAckOffset + sizeof(uint64_t) * kMaxMembers * kMaxMembers * kSlots + 4095) / 4096 * 4096;

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

CUfunction kernel_for(int device, CUdevice dev, std::string* why) {
  const Module* m = module_for(device, dev, why);
  return m ? m->allreduce : nullptr;
}

// One communicator's group: what this rank set up, shared with the graveyard so that it
// outlives the communicator until no peer can still read its scratch.
struct Group : std::enable_shared_from_this<Group> {
  int device = -1;
  CUdevice cudev = 0;
  CUcontext cuctx = nullptr;
  CUstream classic = nullptr;
  CUevent legacy = nullptr;
  CUevent last = nullptr;  // recorded after each kernel: this rank's own work is done
  bool last_recorded = false;
  CUstream last_stream = nullptr;  // where the last kernel went
  CUfunction fn = nullptr;
  CUdeviceptr scratch = 0;
  uint64_t chunk_bytes = 0;
  CUdeviceptr peer[kMaxMembers] = {};  // opened IPC mappings (0 for this rank)
  char* segment = nullptr;             // the flags segment, mapped here
  bool registered = false;
  CUdeviceptr segment_dev = 0;
  uint32_t members = 0, me = 0, blocks = 0;
  uint64_t next_seq = 1;  // the next round's number
  uint64_t last_seq = 0;  // the last round launched (or failed)
  std::mutex mu;          // next_seq, failure words, status words
  CUstream side = nullptr;  // stream-ordered MPI_I*: after the attached stream
  // Staged calls' copies back (Staged): made at the first, used by nothing else, so that
  // waiting for it waits for no kernel (and so for no other rank).
  CUstream copy = nullptr;
  std::once_flag copy_once;
  // Status words of classic MPI_I* calls, one per call in flight (a request completes
  // only once its kernel is done, so its word is free again after it): pinned,
  // device-mapped pages of kStatusPerPage words, made as needed.
  struct StatusWord {
    uint64_t* host;
    CUdeviceptr dev;
  };
  std::vector<void*> status_pages;
  std::vector<StatusWord> free_status;
  static constexpr size_t kStatusPerPage = 512;

  // A cleared status word, or {nullptr, 0} when no page can be had; cuctx is current.
  StatusWord take_status() {
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
  void give_status(StatusWord w) {
    std::lock_guard<std::mutex> lock(mu);
    free_status.push_back(w);
  }

  uint64_t* flags_host() const { return reinterpret_cast<uint64_t*>(segment); }
  uint64_t* fail_host(uint32_t m) const {
    return reinterpret_cast<uint64_t*>(segment + kFailOffset) + m;
  }
  uint64_t* status_host(uint32_t m) const {
    return reinterpret_cast<uint64_t*>(segment + kStatusOffset) + m;
  }
  Registration* reg(uint32_t member, uint32_t slot) const {
    return reinterpret_cast<Registration*>(segment + kRegOffset) + member * kSlots + slot;
  }
  uint64_t* ack(uint32_t peer, uint32_t member, uint32_t slot) const {
    return reinterpret_cast<uint64_t*>(segment + kAckOffset) + (peer * kMaxMembers + member) * kSlots + slot;
  }

  // ---- registered inputs ----
  bool direct = true;  // the rule allows them (direct=yes)
  // This rank's registrations: the allocation in each slot, and the last round a kernel
  // of any member may read it in (it may be given to another allocation once every member
  // is past that round).
  struct Own {
    CUdeviceptr base = 0;
    uint64_t bytes = 0;
    unsigned long long id = 0;  // CU_POINTER_ATTRIBUTE_BUFFER_ID
    uint64_t gen = 0;
    uint64_t last_seq = 0;
    uint64_t used = 0;  // for least-recently-used replacement
  } own[kSlots];
  uint64_t next_gen = 0, clock = 0;
  std::vector<unsigned long long> not_exportable;  // buffer ids cuIpcGetMemHandle refused
  // The peers' registrations as mapped here: the table the kernels read (pinned,
  // device-mapped: Params::maps), the mappings and their generations.
  uint64_t* maps_host = nullptr;
  CUdeviceptr maps_dev = 0;
  CUdeviceptr opened[kMaxMembers][kSlots] = {};
  uint64_t opened_gen[kMaxMembers][kSlots] = {};

  // Whether every member is past round q (its kernel's done flags, or its host gave up).
  bool passed(uint64_t q) const {
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

  // Maps what the peers registered since the last call and says so (acks). A peer gives
  // a slot to another allocation only once no kernel can still read the old one (passed),
  // so the old mapping may go now. cuctx is current.
  void map_peers() {
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

  // The input word for an input of `bytes` at `ptr` that rounds up to `last` may read:
  // the slot of its allocation once every peer has mapped it; 0 (copied through scratch)
  // until then, or when it cannot be exported. Registers a new allocation, in a free slot
  // or the least recently used one no kernel can still read. cuctx is current.
  uint64_t input_word(const void* ptr, uint64_t bytes, uint64_t last) {
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

  // Whether no member can still touch what this rank shares: its own kernels are done
  // and every member is past the last round (or said it failed it).
  bool quiet() const {
    if (!segment) return true;
    if (last_recorded && cuctx) {
      ScopedContext scope(cuctx);
      if (driver().cuEventQuery(last) == CUDA_ERROR_NOT_READY) return false;
    }
    return passed(last_seq);
  }

  // This rank cannot take its part in rounds up to `q` (a call's kernel did not launch):
  // its peers' kernels must not wait for it. Its own earlier kernels may not have run yet
  // (stream-ordered calls queued behind the application's work): a failure word written
  // now would let the peers go past their rounds too, and those kernels would then read
  // scratch that had moved on. So the word is written once this rank's last launched
  // kernel is done (every earlier one waits for its predecessor's rounds, so it is done
  // last): at once when it is, otherwise by a thread that waits for an event recorded
  // behind it. Its peers' kernels for the failed rounds wait until then, not forever.
  void give_up(uint64_t q) {
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

  void fail_through(uint64_t q) {
    std::lock_guard<std::mutex> lock(mu);
    uint64_t* f = fail_host(me);
    if (__atomic_load_n(f, __ATOMIC_RELAXED) < q) __atomic_store_n(f, q, __ATOMIC_RELEASE);
    if (last_seq < q) last_seq = q;
  }

  // Unmaps the peers' scratch areas (before a failed set-up frees this rank's own).
  void close_peers() {
    if (!cuctx) return;
    ScopedContext scope(cuctx);
    for (CUdeviceptr& p : peer)
      if (p) {
        SC_CU_TOLERATE(driver().cuIpcCloseMemHandle(p));
        p = 0;
      }
  }

  ~Group() {
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
};

// Groups of gone communicators whose peers may still read their scratch.
std::mutex g_grave_mu;
std::vector<std::shared_ptr<Group>> g_grave;

// The groups found quiet are destroyed after the lock is let go: ~Group frees GPU memory,
// which may wait for the device, whose other work (another communicator's kernels) may
// wait for peers, while another thread's MPI_Comm_free needs the lock.
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

struct NvgroupState final : RouteState {
  enum Status { unset, ready, off } status = unset;
  std::shared_ptr<Group> group;
  ~NvgroupState() override { bury(std::move(group)); }
};

NvgroupState& state_of(CommContext& ctx) {
  auto& slot = ctx.route_state[static_cast<int>(RouteId::nvgroup)];
  if (!slot) slot = std::make_unique<NvgroupState>();
  return static_cast<NvgroupState&>(*slot);
}

uint64_t chunk_of(const config::RouteChoice& choice) {
  if (auto v = choice.param("chunk"))
    if (auto n = config::parse_size(*v); n && *n >= 256) return *n / 64 * 64;
  return kDefaultChunk;
}

uint32_t blocks_of(const config::RouteChoice& choice) {
  if (auto v = choice.param("blocks")) {
    const int n = std::atoi(std::string(*v).c_str());
    if (n >= 1 && n <= kMaxBlocks) return static_cast<uint32_t>(n);
  }
  return kDefaultBlocks;
}

// What each rank tells the others at set-up (step 2).
struct Entry {
  int32_t ok;
  int32_t sms;
  char bus[32];
  CUipcMemHandle handle;
};

// Step 1. Returns false, with the reason, when this rank cannot take part.
bool open_local(Group& g, int device, uint64_t chunk, Entry* e, std::string* why) {
  const cuda::Driver& d = driver();
  if (!driver_has_entry_points()) return *why = "the CUDA driver lacks entry points it needs", false;
  if (device < 0) return *why = "the buffer has no device", false;
  CUresult r;
  if ((r = d.cuDeviceGet(&g.cudev, device)) != CUDA_SUCCESS ||
      (r = d.cuDeviceGetPCIBusId(e->bus, sizeof e->bus - 1, g.cudev)) != CUDA_SUCCESS)
    return *why = SC_CU_WHY(r, "cuDeviceGetPCIBusId"), false;
  if ((r = d.cuDevicePrimaryCtxRetain(&g.cuctx, g.cudev)) != CUDA_SUCCESS) {
    g.cuctx = nullptr;
    return *why = SC_CU_WHY(r, "cuDevicePrimaryCtxRetain"), false;
  }
  g.device = device;
  ScopedContext scope(g.cuctx);
  if ((r = d.cuDeviceGetAttribute(&e->sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, g.cudev)) !=
          CUDA_SUCCESS ||
      e->sms < 1)
    return *why = SC_CU_WHY(r, "cuDeviceGetAttribute (multiprocessors)"), false;
  if ((r = d.cuStreamCreate(&g.classic, CU_STREAM_NON_BLOCKING)) != CUDA_SUCCESS)
    return g.classic = nullptr, *why = SC_CU_WHY(r, "cuStreamCreate"), false;
  if ((r = d.cuStreamCreate(&g.side, CU_STREAM_NON_BLOCKING)) != CUDA_SUCCESS)
    return g.side = nullptr, *why = SC_CU_WHY(r, "cuStreamCreate"), false;
  if ((r = d.cuEventCreate(&g.legacy, CU_EVENT_DISABLE_TIMING)) != CUDA_SUCCESS)
    return g.legacy = nullptr, *why = SC_CU_WHY(r, "cuEventCreate"), false;
  if ((r = d.cuEventCreate(&g.last, CU_EVENT_DISABLE_TIMING)) != CUDA_SUCCESS)
    return g.last = nullptr, *why = SC_CU_WHY(r, "cuEventCreate"), false;
  if (!(g.fn = kernel_for(device, g.cudev, why))) return false;
  if ((r = d.cuMemAlloc(&g.scratch, 2 * chunk + nvgroup::kInboxBytes)) != CUDA_SUCCESS)
    return g.scratch = 0, *why = SC_CU_WHY(r, "cuMemAlloc (nvgroup scratch)"), false;
  g.chunk_bytes = chunk;
  // The inbox starts at zero (no round passed), before any peer can learn its address.
  {
    const std::vector<uint64_t> zero(nvgroup::kInboxBytes / sizeof(uint64_t), 0);
    r = d.cuMemcpyAsync(g.scratch + 2 * chunk, reinterpret_cast<CUdeviceptr>(zero.data()),
                        nvgroup::kInboxBytes, g.classic);
    if (r == CUDA_SUCCESS) r = d.cuStreamSynchronize(g.classic);
    if (r != CUDA_SUCCESS) return *why = SC_CU_WHY(r, "zeroing the nvgroup inbox"), false;
  }
  if ((r = d.cuIpcGetMemHandle(&e->handle, g.scratch)) != CUDA_SUCCESS)
    return *why = SC_CU_WHY(r, "cuIpcGetMemHandle"), false;
  // The table of the peers' registered inputs mapped here; without it this rank copies
  // its inputs through scratch and reads its peers' there (a local choice: the input
  // words say which, call by call).
  void* maps = nullptr;
  const size_t maps_bytes = sizeof(uint64_t) * kMaxMembers * kSlots;
  if (SC_CU_RESULT(d.cuMemHostAlloc(&maps, maps_bytes, CU_MEMHOSTALLOC_DEVICEMAP)) == CUDA_SUCCESS) {
    std::memset(maps, 0, maps_bytes);
    if (SC_CU_RESULT(d.cuMemHostGetDevicePointer(&g.maps_dev, maps, 0)) == CUDA_SUCCESS) {
      g.maps_host = static_cast<uint64_t*>(maps);
    } else {
      SC_CU_TOLERATE(d.cuMemFreeHost(maps));
      g.maps_dev = 0;
    }
  }
  return true;
}

// How this rank reaches the GPU with PCI bus id `bus`: its own; one it sees, with peer
// access or not; one it cannot see, left to the IPC probe of step 3.
enum class Reach { same, peer, none, probe };

Reach reaches(const Group& g, const char* mine, const char* bus) {
  if (std::strcmp(mine, bus) == 0) return Reach::same;
  const cuda::Driver& d = driver();
  CUdevice other = 0;
  int can = 0;
  if (SC_CU_RESULT(d.cuDeviceGetByPCIBusId(&other, bus)) != CUDA_SUCCESS) return Reach::probe;
  return SC_CU_RESULT(d.cuDeviceCanAccessPeer(&can, g.cudev, other)) == CUDA_SUCCESS && can
             ? Reach::peer
             : Reach::none;
}

// Step 3, local part: map the flags segment, register it, open the peers' scratch.
bool open_shared(Group& g, const std::vector<Entry>& all, const char* name, std::string* why) {
  const cuda::Driver& d = driver();
  const int fd = shm_open(name, O_RDWR, 0600);
  if (fd < 0) return *why = std::string("shm_open ") + name + ": " + std::strerror(errno), false;
  void* p = mmap(nullptr, kSegmentBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return *why = std::string("mmap: ") + std::strerror(errno), false;
  g.segment = static_cast<char*>(p);
  ScopedContext scope(g.cuctx);
  CUresult r;
  if ((r = d.cuMemHostRegister(g.segment, kSegmentBytes,
                               CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE)) !=
      CUDA_SUCCESS)
    return *why = SC_CU_WHY(r, "cuMemHostRegister (nvgroup flags)"), false;
  g.registered = true;
  if ((r = d.cuMemHostGetDevicePointer(&g.segment_dev, g.segment, 0)) != CUDA_SUCCESS)
    return *why = SC_CU_WHY(r, "cuMemHostGetDevicePointer (nvgroup flags)"), false;
  for (uint32_t m = 0; m < g.members; ++m) {
    if (m == g.me) continue;
    if ((r = d.cuIpcOpenMemHandle(&g.peer[m], all[m].handle,
                                  CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)) != CUDA_SUCCESS) {
      g.peer[m] = 0;
      const std::string what = std::string("cuIpcOpenMemHandle of the scratch of ") + all[m].bus +
                               " (no peer access from " + all[g.me].bus + "?)";
      return *why = SC_CU_WHY(r, what.c_str()), false;
    }
  }
  return true;
}

std::atomic<unsigned> g_segments{0};

// The collective set-up (file comment). Every rank of ctx reaches it at the same call.
void set_up(NvgroupState& st, const CallEnv& env, const CommContext& ctx,
            const config::RouteChoice& choice) {
  st.status = NvgroupState::off;
  auto g = std::make_shared<Group>();
  g->members = static_cast<uint32_t>(ctx.size);
  g->me = static_cast<uint32_t>(ctx.rank);
  Entry mine{};
  std::string why;
  mine.ok = open_local(*g, env.device, chunk_of(choice), &mine, &why) ? 1 : 0;
  std::vector<Entry> all(static_cast<size_t>(ctx.size));
  if (PMPI_Allgather(&mine, sizeof mine, MPI_BYTE, all.data(), sizeof mine, MPI_BYTE, ctx.comm) !=
      MPI_SUCCESS)
    return;  // MPI failed alike on every rank (or raised its error): off
  int sms = kMaxBlocks;
  for (const Entry& e : all) {
    if (!e.ok) {
      if (!mine.ok) SC_INFO("nvgroup: off for this communicator: %s", why.c_str());
      else SC_INFO("nvgroup: off for this communicator: another rank cannot take part");
      return;  // every rank saw the same entries
    }
    sms = std::min(sms, e.sms);
  }
  g->blocks = std::min(blocks_of(choice), static_cast<uint32_t>(sms));
  g->direct = choice.param("direct").value_or("yes") != "no";
  // Reachability is each rank's own view; step 4 agrees on it. GPUs this rank cannot see
  // are probed in step 3 (opening their scratch).
  int ok = 1, probed = 0;
  for (int r = 0; r < ctx.size && ok; ++r) {
    const Reach how = reaches(*g, mine.bus, all[static_cast<size_t>(r)].bus);
    probed += how == Reach::probe;
    if (how == Reach::none) {
      why = std::string("no peer access from ") + mine.bus + " to " + all[static_cast<size_t>(r)].bus;
      ok = 0;
    }
  }
  char name[64] = {0};
  if (ctx.rank == 0) {
    std::snprintf(name, sizeof name, "/streamcoll-nvgroup-%d-%u", static_cast<int>(getpid()),
                  g_segments.fetch_add(1));
    const int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(kSegmentBytes)) != 0) {
      why = std::string("shm_open/ftruncate ") + name + ": " + std::strerror(errno);
      if (fd >= 0) shm_unlink(name);
      name[0] = 0;
    }
    if (fd >= 0) close(fd);
  }
  if (PMPI_Bcast(name, sizeof name, MPI_CHAR, 0, ctx.comm) != MPI_SUCCESS) return;
  if (!name[0]) {
    if (ctx.rank != 0) why = "rank 0 could not make the flags segment";
    ok = 0;
  } else if (ok) {
    ok = open_shared(*g, all, name, &why) ? 1 : 0;
  }
  int agreed = MPI_SUCCESS;
  const bool all_ok = service::all(ok, ctx.comm, &agreed);
  if (ctx.rank == 0 && name[0]) shm_unlink(name);  // every rank has opened it, or failed to
  if (!all_ok) {
    if (!ok) SC_INFO("nvgroup: off for this communicator: %s", why.c_str());
    else SC_INFO("nvgroup: off for this communicator: another rank cannot take part");
    // Some ranks may have mapped this rank's scratch: every mapping goes before any
    // scratch does.
    g->close_peers();
    if (agreed == MPI_SUCCESS) PMPI_Barrier(ctx.comm);
    return;
  }
  SC_INFO("nvgroup: group of %u ranks on device %d, %u blocks, %llu-byte rounds%s", g->members,
          g->device, g->blocks, static_cast<unsigned long long>(g->chunk_bytes),
          probed ? "; GPUs not visible here reached through CUDA IPC" : "");
  st.group = std::move(g);
  st.status = NvgroupState::ready;
}

// The kernel's parameters for `a` on `g`, all but the addresses; *rounds: how many.
nvgroup::Params shape_of(const CollArgs& a, const Group& g, uint64_t* rounds) {
  // The kernel's element type: the reduction's, or for allgather an unsigned type of the
  // datatype's size (bytes when there is none).
  nvgroup::Params p{};
  const bool gather = a.coll == Coll::allgather;
  const TypeInfo* t = find_type(gather ? a.recvtype : a.datatype);
  uint64_t count = static_cast<uint64_t>(gather ? a.recvcount : a.count);  // per block but allreduce
  nvgroup::DType dt;
  if (!gather) {
    dt = *kernel_type(*t);
    p.op = static_cast<uint32_t>(*kernel_op(find_op(a.op)->kind));
  } else if (t->size == 4 || t->size == 8) {
    dt = t->size == 4 ? nvgroup::DType::u32 : nvgroup::DType::u64;
  } else {
    dt = nvgroup::DType::u8;
    count *= static_cast<uint64_t>(t->size);
  }
  p.dtype = static_cast<uint32_t>(dt);
  p.mode = static_cast<uint32_t>(a.coll == Coll::allreduce ? nvgroup::Mode::allreduce
                                 : gather                  ? nvgroup::Mode::allgather
                                                           : nvgroup::Mode::reduce_scatter_block);
  p.count = count;
  p.chunk = g.chunk_bytes / nvgroup::dtype_size(dt);
  p.members = g.members;
  p.me = g.me;
  p.blocks = g.blocks;
  *rounds = nvgroup::rounds_of(p);
  return p;
}

// Rounds [seq, seq + rounds) for the next call, in call order (equal on every rank).
uint64_t reserve(Group& g, uint64_t rounds) {
  std::lock_guard<std::mutex> lock(g.mu);
  const uint64_t seq = g.next_seq;
  g.next_seq += rounds;
  g.last_seq = seq + rounds - 1;
  return seq;
}

// A rank's part staged through scratch on the group's GPU (core/staging.hpp): its
// buffers are elsewhere (host memory, another GPU) while the call was routed from facts
// agreed at an earlier call that said device memory. The input goes to scratch on the
// classic stream before the kernel, which runs in place on it; the results come back on
// the group's copy stream once the kernel is done (back(): after a blocking call's host
// wait, or when a classic MPI_I* request completes), so that nothing here waits for
// another rank. The scratch goes with the Staged, by which time no kernel reads it (done,
// or never launched).
struct Staged {
  std::shared_ptr<Group> g;  // its context outlives the scratch
  staging::GpuStage stage;

  int back() { return stage.finish(g->copy); }
};

// A classic MPI_I* call: complete once the event behind its kernel is (never blocking in
// MPI_Test), with the error its status word holds; a staged one once its results are back.
// The staged scratch goes after the event (the release waits for it when unfinished).
CallSteps classic_steps(std::shared_ptr<Group> g, CUevent done, Group::StatusWord w,
                        std::string what, std::shared_ptr<Staged> staged) {
  auto outcome = [g, w, what](CUresult r) {
    if (r != CUDA_SUCCESS) return SC_CU_FAIL(r, what + " (nvgroup)");
    if (__atomic_load_n(w.host, __ATOMIC_ACQUIRE))
      return fail(Failure::cuda, what + " (nvgroup): a rank of the group could not take its part");
    return MPI_SUCCESS;
  };
  CallSteps st;
  st.test = [g, done, outcome](bool* finished) {
    ScopedContext scope(g->cuctx);
    const CUresult r = SC_CU_RESULT(driver().cuEventQuery(done));
    *finished = r != CUDA_ERROR_NOT_READY;
    return *finished ? outcome(r) : MPI_SUCCESS;
  };
  st.wait = [g, done, outcome] {
    ScopedContext scope(g->cuctx);
    return outcome(SC_CU_RESULT(driver().cuEventSynchronize(done)));
  };
  if (staged) st.after = [staged](int rc) { return rc != MPI_SUCCESS ? rc : staged->back(); };
  st.release = [g, done, w, staged](bool finished) {
    ScopedContext scope(g->cuctx);
    if (!finished) SC_CU_TOLERATE(driver().cuEventSynchronize(done));  // the kernel may still use the word
    SC_CU_TOLERATE(driver().cuEventDestroy(done));
    g->give_status(w);
  };
  return st;
}

// A stream-ordered MPI_I* call: MPI_Wait makes the attached stream wait for the event
// behind the kernel (on the side stream) and completes at once.
CallSteps stream_steps(std::shared_ptr<Group> g, CUevent done, CUstream user) {
  CallSteps st;
  st.test = [g, done, user](bool* finished) {
    *finished = true;
    ScopedContext scope(g->cuctx);
    return SC_CU_CHECK(driver().cuStreamWaitEvent(user, done, 0), "nvgroup: cuStreamWaitEvent (MPI_Wait)");
  };
  st.release = [g, done](bool) {
    ScopedContext scope(g->cuctx);
    SC_CU_TOLERATE(driver().cuEventDestroy(done));  // its last record stays valid for waits made on it
  };
  return st;
}

// Whether `choice` on ctx means several groups (file comment): facts equal on every rank
// (the rule, the settings agreed at MPI_Init, the communicator's layout).
bool several_groups(const CommContext& ctx, const config::RouteChoice& choice) {
  if (choice.param("cross").value_or("") == "none") return false;  // a stage of blueconnect
  auto levels = [&](const std::vector<int>& f) {
    long product = 1;
    int n = 0;
    for (int x : f) {
      product *= x;
      n += x > 1;
    }
    return product == ctx.size ? n : -1;
  };
  if (auto v = choice.param("hierarchy")) {
    auto f = topo::parse_factors(*v);
    return f && levels(*f) >= 2;
  }
  const std::vector<int>& env = Runtime::get().settings().hierarchy;
  if (!env.empty() && levels(env) >= 0) return levels(env) >= 2;
  return ctx.nodes > 1;
}

// The blueconnect rule that carries a call over several groups: this route's kernels
// inside the groups (the innermost level), route cross= (nccl by default) above.
config::RouteChoice across(const config::RouteChoice& choice) {
  config::RouteChoice bc;
  bc.route = RouteId::blueconnect;
  const std::string cross(choice.param("cross").value_or("nccl"));
  bc.params.emplace_back("backend", "nvgroup/" + cross);
  for (const char* key : {"hierarchy", "chunk", "blocks", "direct"})
    if (auto v = choice.param(key)) bc.params.emplace_back(key, std::string(*v));
  return bc;
}

bool valid_cross(const config::RouteChoice& choice) {
  const std::string_view c = choice.param("cross").value_or("nccl");
  return c == "nccl" || c == "ht";
}

// One call's kernel on this rank (the route's run(), below, for buffers the group's GPU
// reaches; `staged`: the scratch of a staged call, whose results it brings back). The
// forms of the file comment: classic, attached, MPI_I* classic or stream-ordered.
int launch(const CollArgs& a, const CallEnv& env, std::shared_ptr<Group> g,
           std::shared_ptr<Staged> staged) {
  const cuda::Driver& d = driver();
  uint64_t rounds = 0;
  nvgroup::Params p = shape_of(a, *g, &rounds);
  const uint64_t seq = reserve(*g, rounds);
  const uint64_t ts = nvgroup::dtype_size(static_cast<nvgroup::DType>(p.dtype));
  // A failure the kernel of an earlier stream-ordered call saw: reported now.
  int late = MPI_SUCCESS;
  if (env.has_stream && __atomic_exchange_n(g->status_host(g->me), 0, __ATOMIC_ACQ_REL))
    late = fail(Failure::cuda, "nvgroup: an earlier stream-ordered call on this "
                               "communicator failed on a rank of the group");
  const std::string what = call_name(a.coll, a.nonblocking);
  const bool classic_request = a.nonblocking && !env.has_stream;
  CUstream user = static_cast<CUstream>(env.stream);
  CUstream s = !env.has_stream ? g->classic : a.nonblocking ? g->side : user;
  ScopedContext scope(g->cuctx);
  // This rank cannot take its part: its peers' kernels go on without it (they report
  // the call failed). Its own earlier kernels may still run: they never wait for a
  // failure word, only peers do, so writing it now cannot stop them.
  Group::StatusWord word{nullptr, 0};
  auto lost = [&](int rc) {
    if (word.host) g->give_status(word);
    g->give_up(seq + rounds - 1);
    if (!env.has_stream) d.cuStreamSynchronize(s);  // nothing may still use the buffers
    if (a.nonblocking) *a.request = MPI_REQUEST_NULL;
    return rc;
  };
  // (A rank that has no input to give: a repacked call's that it could not read, or a
  // staged call's that it could not copy.)
  if (env.input_failure != MPI_SUCCESS) return lost(env.input_failure);
  // Ordered after the work the caller's semantics put before it: the legacy stream
  // (classic), the attached stream (a stream-ordered MPI_I*, on the side stream); and
  // after this communicator's previous kernel on this rank, whatever its stream.
  if (!env.has_stream || a.nonblocking) {
    const char* ordering = "nvgroup: ordering the kernel's stream";
    int rc;
    if (!env.has_stream)
      rc = SC_CU_CHECK(cuda::wait_for_legacy(s, g->legacy), ordering);
    else if ((rc = SC_CU_CHECK(d.cuEventRecord(g->legacy, user), ordering)) == MPI_SUCCESS)
      rc = SC_CU_CHECK(d.cuStreamWaitEvent(s, g->legacy, 0), ordering);
    if (rc != MPI_SUCCESS) return lost(rc);
  }
  if (g->last_recorded && g->last_stream != s)
    if (const int rc = SC_CU_CHECK(d.cuStreamWaitEvent(s, g->last, 0), "nvgroup: cuStreamWaitEvent (previous kernel)"))
      return lost(rc);
  // In place: the input is in the output buffer (allgather: this rank's block of it).
  const bool gather = a.coll == Coll::allgather;
  p.send = a.sendbuf != MPI_IN_PLACE ? a.sendbuf
           : gather ? static_cast<const char*>(a.recvbuf) + g->me * p.count * ts
                    : a.recvbuf;
  p.recv = a.recvbuf;
  p.seq = seq;
  for (uint32_t m = 0; m < g->members; ++m)
    p.scratch[m] = reinterpret_cast<char*>(m == g->me ? g->scratch : g->peer[m]);
  p.flags = reinterpret_cast<uint64_t*>(g->segment_dev);
  p.inbox = 2 * g->chunk_bytes;
  p.fails = reinterpret_cast<uint64_t*>(g->segment_dev + kFailOffset);
  p.status = reinterpret_cast<uint64_t*>(g->segment_dev + kStatusOffset) + g->me;
  // Registered inputs: the peers' new registrations mapped, and this rank's input read
  // in place where every peer has its allocation mapped (reduce_scatter_block: unless
  // its output is another block of its input, which a peer reads; never a staged call's
  // scratch, which goes after the call).
  if (g->maps_host) {
    g->map_peers();
    p.maps = reinterpret_cast<const uint64_t*>(g->maps_dev);
    const uint64_t in_bytes = p.count * ts * (a.coll == Coll::reduce_scatter_block ? g->members : 1);
    const auto in = reinterpret_cast<uintptr_t>(p.send), out = reinterpret_cast<uintptr_t>(p.recv);
    const uint64_t out_bytes = p.count * ts;
    const bool clash = a.coll == Coll::reduce_scatter_block && out < in + in_bytes &&
                       in < out + out_bytes && out != in + g->me * out_bytes;
    if (a.coll != Coll::allgather && !clash && !staged)
      p.input = g->input_word(p.send, in_bytes, seq + rounds - 1);
  }
  CUevent done = nullptr;
  if (a.nonblocking) {
    if (classic_request) {
      word = g->take_status();
      if (!word.host)
        return lost(fail(Failure::cuda, "nvgroup: cuMemHostAlloc (status words) failed"));
      p.status = reinterpret_cast<uint64_t*>(word.dev);
    }
    if (const int rc = SC_CU_CHECK(d.cuEventCreate(&done, CU_EVENT_DISABLE_TIMING), "nvgroup: cuEventCreate"))
      return lost(rc);
  }
  void* params[] = {&p};
  if (const int rc = SC_CU_CHECK(d.cuLaunchKernel(g->fn, g->blocks, 1, 1, kThreads, 1, 1, 0, s,
                                                  params, nullptr),
                                 what + " (nvgroup kernel launch)")) {
    if (done) SC_CU_TOLERATE(d.cuEventDestroy(done));
    return lost(rc);
  }
  // Unrecorded, the next call on another stream is not ordered after this one (seen at warn).
  g->last_recorded = SC_CU_TOLERATE(d.cuEventRecord(g->last, s)) == CUDA_SUCCESS;
  g->last_stream = s;
  if (a.nonblocking) {
    // The kernel runs: the request is how the caller learns when its buffers are free.
    // Without one the operation is lost to it, and a classic caller waits here.
    int rc = SC_CU_CHECK(d.cuEventRecord(done, s), "nvgroup: cuEventRecord");
    if (rc != MPI_SUCCESS) {
      SC_CU_TOLERATE(d.cuEventDestroy(done));
    } else if (classic_request) {
      rc = start_call_request(classic_steps(g, done, word, what, std::move(staged)), a.request);
      word = Group::StatusWord{nullptr, 0};  // the request's now (or given back with it)
    } else {
      rc = start_call_request(stream_steps(g, done, user), a.request);
    }
    if (rc != MPI_SUCCESS) {
      if (word.host) g->give_status(word);
      if (!env.has_stream) d.cuStreamSynchronize(s);
      *a.request = MPI_REQUEST_NULL;
      return rc;
    }
    return late;
  }
  if (env.has_stream) return late;
  if (const int rc = SC_CU_CHECK(d.cuStreamSynchronize(s), what + " (nvgroup)")) return lost(rc);
  if (__atomic_exchange_n(g->status_host(g->me), 0, __ATOMIC_ACQ_REL))
    return fail(Failure::cuda, what + " (nvgroup): a rank of the group could not take its part");
  return MPI_SUCCESS;
}

// A call whose buffers here are not on the group's GPU (Staged): the input copied to
// scratch on the classic stream, after the application's work on the buffers' GPUs and on
// the stream attached here, then the kernel as a classic call on this rank (the host
// waits for a blocking call, as for any call on buffers it must find final at return; an
// MPI_I* completes once the results are back). A failure before the kernel still takes
// this call's rounds (launch: input_failure), so the peers' kernels go on without it.
int run_staged(const CollArgs& a, CommContext& ctx, const CallEnv& env, std::shared_ptr<Group> g) {
  auto st = std::make_shared<Staged>();
  st->g = g;
  int rc = MPI_SUCCESS;
  {
    const cuda::Driver& d = driver();
    ScopedContext scope(g->cuctx);
    CUresult made = CUDA_SUCCESS;
    std::call_once(g->copy_once, [&] { made = d.cuStreamCreate(&g->copy, CU_STREAM_NON_BLOCKING); });
    if (!g->copy)
      rc = SC_CU_FAIL(made ? made : CUDA_ERROR_INVALID_HANDLE, "nvgroup: cuStreamCreate (staging)");
    if (rc == MPI_SUCCESS)
      rc = st->stage.in(a, ctx.rank, ctx.size, g->cuctx, g->classic,
                        env.has_stream ? static_cast<CUstream>(env.stream) : nullptr, "nvgroup");
  }
  // A failure: the kernel is not launched, and this rank gives its rounds up.
  if (rc != MPI_SUCCESS) return launch(a, staged_env(env, g->device, rc), g, nullptr);
  rc = launch(st->stage.args(a), staged_env(env, g->device, MPI_SUCCESS), g, st);
  if (a.nonblocking || rc != MPI_SUCCESS) return rc;  // (an MPI_I*'s request brings them back)
  return st->back();
}

class NvgroupRoute final : public Route {
 public:
  RouteId id() const override { return RouteId::nvgroup; }

  bool able_here(const CollArgs& a, CommContext& ctx, const CallEnv& local) override {
    if (local.mem != MemKind::device || local.device < 0) return false;
    auto& slot = ctx.route_state[static_cast<int>(RouteId::nvgroup)];
    if (slot) {
      auto& st = static_cast<NvgroupState&>(*slot);
      if (st.status == NvgroupState::ready) return local.device == st.group->device;
    }
    // Several groups: blueconnect's stages (its levels' routes on this rank's GPU).
    if (ctx.route_state[static_cast<int>(RouteId::blueconnect)] &&
        !find_route(RouteId::blueconnect)->able_here(a, ctx, local))
      return false;
    return driver_has_entry_points();
  }

  bool accepts(const CollArgs& a, CommContext& ctx, const config::RouteChoice& choice,
               const CallEnv& agreed) override {
    if (a.nonblocking && !Runtime::get().settings().nvgroup_nonblocking) return false;
    if (agreed.mem != MemKind::device) return false;
    if (a.coll != Coll::allreduce && a.coll != Coll::reduce_scatter_block &&
        a.coll != Coll::allgather)
      return false;
    if (!nvgroup_stage::supports(a)) return false;
    if (several_groups(ctx, choice)) {
      if (a.nonblocking || !valid_cross(choice)) return false;
      return find_route(RouteId::blueconnect)->accepts(a, ctx, across(choice), agreed);
    }
    if (ctx.nodes != 1 || ctx.size > kMaxMembers) return false;
    NvgroupState& st = state_of(ctx);
    if (st.status == NvgroupState::unset) {
      if (!collective_point(a)) return false;  // set-up is collective: at a blocking call or a persistent init
      set_up(st, agreed, ctx, choice);
    }
    return st.status == NvgroupState::ready;
  }

  // Stream-ordered calls on one group: a rank whose buffers are not on the group's GPU
  // stages them (run_staged), one without the stream runs classic, one that cannot read
  // a repacked input gives its rounds up: the peers' kernels report the call failed.
  // Classic calls agree at every call (their host waits for the peers anyway). Several
  // groups: as BlueConnect's decomposition says.
  bool adapts(const CollArgs& a, CommContext& ctx, const config::RouteChoice& choice,
              const CallEnv& agreed) override {
    if (several_groups(ctx, choice))
      return find_route(RouteId::blueconnect)->adapts(a, ctx, across(choice), agreed);
    return agreed.has_stream;
  }

  int run(const CollArgs& a, CommContext& ctx, const config::RouteChoice& choice,
          const CallEnv& env) override {
    if (several_groups(ctx, choice)) return find_route(RouteId::blueconnect)->run(a, ctx, across(choice), env);
    bury(nullptr);  // frees what gone communicators left, once their peers are through
    std::shared_ptr<Group> g = state_of(ctx).group;
    // Managed memory is reachable from the group's GPU; device memory only from its own.
    const bool reachable = env.mem == MemKind::managed ||
                           (env.mem == MemKind::device && env.device == g->device);
    return reachable ? launch(a, env, g, nullptr) : run_staged(a, ctx, env, g);
  }
};

}  // namespace

Route* nvgroup_route();
void nvgroup_release();
extern const RouteEntry nvgroup_entry = {nvgroup_route, nullptr, nvgroup_release};

Route* nvgroup_route() {
  static NvgroupRoute r;
  return &r;
}

namespace nvgroup_kernels {

std::optional<nvgroup::DType> type_of(const TypeInfo& t) { return kernel_type(t); }
std::optional<nvgroup::ROp> op_of(OpKind k) { return kernel_op(k); }

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

namespace nvgroup_stage {

bool supports(const CollArgs& a) {
  if (a.coll == Coll::allgather) {
    const TypeInfo* t = find_type(a.recvtype);  // eligibility: contiguous, = sendtype
    return t && t->size > 0;
  }
  if (a.coll != Coll::allreduce && a.coll != Coll::reduce_scatter_block) return false;
  const TypeInfo* t = find_type(a.datatype);
  const OpInfo* op = find_op(a.op);
  return t && op && kernel_type(*t) && kernel_op(op->kind);
}

void give_up(CommContext& ctx, const CollArgs& a) {
  auto& slot = ctx.route_state[static_cast<int>(RouteId::nvgroup)];
  if (!slot || static_cast<NvgroupState&>(*slot).status != NvgroupState::ready) return;
  Group& g = *static_cast<NvgroupState&>(*slot).group;
  uint64_t rounds = 0;
  shape_of(a, g, &rounds);
  if (rounds) g.give_up(reserve(g, rounds) + rounds - 1);
}

bool take_failure(CommContext& ctx) {
  auto& slot = ctx.route_state[static_cast<int>(RouteId::nvgroup)];
  if (!slot || static_cast<NvgroupState&>(*slot).status != NvgroupState::ready) return false;
  Group& g = *static_cast<NvgroupState&>(*slot).group;
  return __atomic_exchange_n(g.status_host(g.me), 0, __ATOMIC_ACQ_REL) != 0;
}

}  // namespace nvgroup_stage

// At MPI_Finalize, after every communicator context is gone: what gone communicators left
// (their peers are in MPI_Finalize too) and the kernels' modules.
void nvgroup_release() {
  {
    std::lock_guard<std::mutex> lock(g_grave_mu);
    g_grave.clear();
  }
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

}  // namespace streamcoll
