// Route nvgroup's collective set-up on a communicator (nvgroup_setup.hpp; the steps in
// algorithms/nvgroup.cpp's file comment): this rank's GPU, streams, scratch and inbox
// (step 1), the exchange that finds the group and its grid (step 2), the flags segment
// and the peers' scratch opened through CUDA IPC (step 3), the agreed outcome (step 4).
#include "algorithms/nvgroup_setup.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "algorithms/nvgroup_kernel.hpp"
#include "algorithms/nvgroup_module.hpp"
#include "base/log.hpp"
#include "config/tuning_table.hpp"
#include "core/cuda_driver.hpp"
#include "core/service.hpp"

namespace streamcoll::nvgroup_detail {
namespace {

using cuda::driver;
using cuda::ScopedContext;

// Bytes per round (scratch: twice that). Each round costs a few flag exchanges whatever
// its size: on an H100, 2 and 4 ranks sharing it under MPS, 16 MiB allreduces ran at 1.8x
// (2 ranks) and 2.0x (4) the bandwidth of 1 MiB rounds, small ones alike
// (bench/results/gpu_h100_2026-11-25).
constexpr uint64_t kDefaultChunk = 4 << 20;
constexpr uint32_t kDefaultBlocks = 32;

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

}  // namespace

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

}  // namespace streamcoll::nvgroup_detail
