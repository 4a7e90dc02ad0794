// Route nccl's set-up (algorithms/nccl_detail.hpp): a communicator's NCCL state, made
// collectively at its first blocking call (steps 1 and 2 of algorithms/nccl.cpp's file
// comment: the ranks' GPUs gathered, an idle NCCL communicator reused or a new one made,
// within the budget), and the NCCL communicators split from a parent's at MPI's
// communicator constructors (nccl_derive, below).
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "algorithms/nccl_detail.hpp"
#include "algorithms/nccl_lib.hpp"
#include "algorithms/nccl_map.hpp"
#include "base/log.hpp"
#include "core/cuda_driver.hpp"
#include "core/errors.hpp"
#include "core/runtime.hpp"
#include "core/service.hpp"

namespace streamcoll {
namespace nccl_detail {

namespace {

// FNV-1a over bytes.
uint64_t hash_bytes(const void* p, size_t n, uint64_t h) {
  for (size_t i = 0; i < n; ++i) {
    h ^= static_cast<const unsigned char*>(p)[i];
    h *= 1099511628211ull;
  }
  return h;
}

// This host, as NCCL tells hosts apart: host name and boot id (containers on one host
// share the boot id, not always the host name).
uint64_t host_hash() {
  char name[256] = {0};
  gethostname(name, sizeof(name) - 1);
  uint64_t h = nccl::hash(name);
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (boot >> id) h = nccl::hash(id.c_str(), h);
  return h;
}

// Local half of the set-up: CUDA objects on the buffer's device. Returns false, with the
// reason, if this rank cannot take part.
bool open_device(NcclComm& c, int buffer_device, nccl::GpuId* id, std::string* why) {
  const cuda::Driver& d = driver();
  // A set-up at a call on host memory (the fusion queue's, algorithms/fusion.cpp) may come
  // before the process has loaded CUDA: no driver, no GPU for NCCL.
  if (!d.usable) return *why = "no usable CUDA driver (" + d.reason + ")", false;
  c.device = buffer_device;
  char bus[64] = {0};
  CUresult r;
  if (c.device < 0) {  // managed memory may have no device: the thread's current one
    CUcontext current = nullptr;
    CUdevice dev = -1;
    if (SC_CU_RESULT(d.cuCtxGetCurrent(&current)) == CUDA_SUCCESS && current &&  // probes
        SC_CU_RESULT(d.cuCtxGetDevice(&dev)) == CUDA_SUCCESS)
      c.device = dev;
  }
  if (c.device < 0) return *why = "no GPU for the buffer and no current CUDA context", false;
  if ((r = d.cuDeviceGet(&c.cudev, c.device)) != CUDA_SUCCESS ||
      (r = d.cuDeviceGetPCIBusId(bus, sizeof(bus) - 1, c.cudev)) != CUDA_SUCCESS)
    return *why = SC_CU_WHY(r, "cuDeviceGetPCIBusId"), false;
  if ((r = d.cuDevicePrimaryCtxRetain(&c.cuctx, c.cudev)) != CUDA_SUCCESS) {
    c.cuctx = nullptr;
    return *why = SC_CU_WHY(r, "cuDevicePrimaryCtxRetain"), false;
  }
  ScopedContext scope(c.cuctx);
  if ((r = d.cuStreamCreate(&c.classic, CU_STREAM_NON_BLOCKING)) != CUDA_SUCCESS ||
      (r = d.cuStreamCreate(&c.side, CU_STREAM_NON_BLOCKING)) != CUDA_SUCCESS)
    return *why = SC_CU_WHY(r, "cuStreamCreate"), false;
  id->host = host_hash();
  id->bus = nccl::hash(bus);
  return true;
}

// One rank's entry in set_up's exchange: its GPU (host and PCI bus), whether it can use
// NCCL, and its rank in MPI_COMM_WORLD (with the others', the group an NCCL communicator
// serves: Pool).
struct GpuEntry {
  uint64_t host, bus, ok, world;
};

// Set-up step 1, collective: every rank's GPU (*all, in rank order), c's device opened on
// this rank. False (NCCL off for the communicator, on every rank alike) when a rank cannot
// use NCCL, two ranks share a GPU, or MPI fails.
bool gather_gpus(NcclComm& c, const nccl::Library& lib, const CallEnv& env, const CommContext& ctx,
                 std::vector<GpuEntry>* all) {
  GpuEntry mine{0, 0, 0, 0};
  {
    int w = 0;
    MPI_Group g, wg;
    if (PMPI_Comm_group(ctx.comm, &g) == MPI_SUCCESS) {
      if (PMPI_Comm_group(MPI_COMM_WORLD, &wg) == MPI_SUCCESS) {
        PMPI_Group_translate_ranks(g, 1, &ctx.rank, wg, &w);
        PMPI_Group_free(&wg);
      }
      PMPI_Group_free(&g);
    }
    mine.world = static_cast<uint64_t>(w);
  }
  std::string why;
  nccl::GpuId id;
  if (!lib.usable) {
    why = lib.reason;
  } else if (open_device(c, env.device, &id, &why)) {
    mine.host = id.host;
    mine.bus = id.bus;
    mine.ok = 1;
  }
  all->assign(static_cast<size_t>(ctx.size), GpuEntry{});
  if (PMPI_Allgather(&mine, 4, MPI_UINT64_T, all->data(), 4, MPI_UINT64_T, ctx.comm) !=
      MPI_SUCCESS)
    return false;
  std::vector<nccl::GpuId> gpus;
  for (int r = 0; r < ctx.size; ++r) {
    if (!(*all)[r].ok) {
      if (!mine.ok) SC_WARN("nccl: off for a communicator of %d ranks: %s", ctx.size, why.c_str());
      else SC_INFO("nccl: off for a communicator of %d ranks: rank %d cannot use it", ctx.size, r);
      return false;
    }
    gpus.push_back({(*all)[r].host, (*all)[r].bus});
  }
  if (auto pair = nccl::shared_gpu(gpus)) {
    SC_INFO("nccl: off for a communicator of %d ranks: ranks %d and %d share one GPU; its "
            "calls go to pmpi", ctx.size, pair->first, pair->second);
    return false;
  }
  return true;
}

// Set-up step 2, collective: an idle NCCL communicator over the same ranks, in the same
// order, on the same GPUs (Pool, `key`), reused if every rank has it (st ready); in the
// same exchange, whether every rank has room in its budget for a new one (Pool::room:
// a rank's count and memory are its own, so they are agreed before any rank calls
// ncclCommInitRank, which would wait forever for a rank that did not). Returns 1 when
// reused, 0 when a new one is to be made, -1 when MPI failed or a rank has no room (NCCL
// off for the communicator, on every rank alike).
int reuse_idle(NcclState& st, const CommContext& ctx, uint64_t key, CUcontext cuctx) {
  std::shared_ptr<NcclComm> idle = Pool::get().take(key);
  const int64_t cand = idle ? static_cast<int64_t>(idle->id & INT64_MAX) : 0;
  std::string why;
  int64_t room = 1;
  {
    ScopedContext scope(cuctx);
    room = Pool::get().room(true, &why) ? 1 : 0;
  }
  int64_t in[3] = {cand, -cand, -room}, out[3] = {0, 0, 0};
  if (PMPI_Allreduce(in, out, 3, MPI_INT64_T, MPI_MAX, ctx.comm) != MPI_SUCCESS) {
    Pool::get().give_back(std::move(idle));
    return -1;
  }
  if (idle && out[0] == cand && -out[1] == cand) {
    idle->async_error = ctx.async_error;
    idle->stream_ordered.store(false);
    SC_INFO("nccl: reusing an idle NCCL communicator of %d ranks on device %d", ctx.size,
            idle->device);
    st.comm = std::move(idle);
    st.status = NcclState::ready;
    return 1;
  }
  Pool::get().give_back(std::move(idle));
  if (out[2] < 0) return 0;  // every rank has room
  nccl::usage().refused.fetch_add(1);
  if (!room)
    SC_INFO("nccl: the budget turns away a new NCCL communicator of %d ranks: %s; its calls "
            "take the table's next rule", ctx.size, why.c_str());
  else
    SC_INFO("nccl: another rank's budget turns away a new NCCL communicator of %d ranks; its "
            "calls take the table's next rule", ctx.size);
  return -1;
}

// Set-up step 3, collective: a new NCCL communicator in `c` (rank 0's ncclUniqueId, the
// failure notices' communicator, ncclCommInitRank), and *id, equal on every rank. False,
// with nothing left behind, unless every rank has one.
bool create_comm(NcclComm& c, const nccl::Library& lib, const CommContext& ctx, uint64_t* id) {
  struct {
    ncclUniqueId id;
    int ok;
  } root{};
  if (ctx.rank == 0) {
    ncclResult_t r = lib.ncclGetUniqueId(&root.id);
    root.ok = r == ncclSuccess;
    if (!root.ok) log_error("%s", lib.describe("ncclGetUniqueId", r).c_str());
  }
  if (PMPI_Bcast(&root, sizeof(root), MPI_BYTE, 0, ctx.comm) != MPI_SUCCESS || !root.ok)
    return false;
  // The failure notices' communicator first (collective: every rank gets here).
  int ok = c.open_faults(ctx.comm) ? 1 : 0;
  if (ok) {
    ScopedContext scope(c.cuctx);
    uint64_t free0 = 0, free1 = 0, total = 0;
    const bool measured = nccl::memory_info(&free0, &total);
    ncclResult_t r = lib.ncclCommInitRank(&c.comm, ctx.size, root.id, ctx.rank);
    ok = r == ncclSuccess;
    if (!ok) {
      log_error("%s", lib.describe("ncclCommInitRank", r).c_str());
      c.comm = nullptr;
    } else if (measured && nccl::memory_info(&free1, &total)) {
      c.bytes = free0 > free1 ? free0 - free1 : 0;
    }
  }
  if (!service::all(ok, ctx.comm)) {
    if (c.comm) {
      ScopedContext scope(c.cuctx);
      lib.ncclCommAbort(c.comm);
      c.comm = nullptr;
    }
    c.close_faults();
    c.bytes = 0;
    SC_WARN("nccl: could not create an NCCL communicator of %d ranks; its calls go to pmpi",
            ctx.size);
    return false;
  }
  *id = hash_bytes(root.id.internal, sizeof root.id.internal, 1469598103934665603ull);
  nccl::usage().made_own.fetch_add(1);
  nccl::usage().take(c.bytes);
  nccl::usage().last_own_bytes.store(c.bytes);
  return true;
}

}  // namespace

// The collective set-up (file comment). Every rank reaches it at the same call: the
// communicator's NCCL state ready with an NCCL communicator, reused or new, or off.
void set_up(NcclState& st, const CallEnv& env, const CommContext& ctx) {
  st.status = NcclState::off;
  const nccl::Library& lib = nccl::library(Runtime::get().settings().nccl_lib);
  auto c = std::make_shared<NcclComm>();
  c->lib = &lib;
  c->size = ctx.size;
  c->async_error = ctx.async_error;
  std::vector<GpuEntry> all;
  if (!gather_gpus(*c, lib, env, ctx, &all)) return;
  uint64_t key = nccl::hash(lib.path.c_str());
  for (const GpuEntry& e : all)
    for (uint64_t v : {e.host, e.bus, e.world}) key = hash_bytes(&v, sizeof v, key);
  if (reuse_idle(st, ctx, key, c->cuctx) != 0) return;  // reused (`c`, never initialised, goes), or off
  uint64_t id = 0;
  if (!create_comm(*c, lib, ctx, &id)) return;
  SC_INFO("nccl: NCCL %d communicator of %d ranks on device %d", lib.version, ctx.size,
          c->device);
  g_live_nccl.fetch_add(1);
  c->key = key;
  c->id = id;
  Watchdog::get().watch(c);
  st.comm = std::move(c);
  st.status = NcclState::ready;
}

NcclState& state_of(CommContext& ctx) {
  auto& slot = ctx.route_state[static_cast<int>(RouteId::nccl)];
  if (!slot) slot = std::make_unique<NcclState>();
  return static_cast<NcclState&>(*slot);
}

namespace {

// ---- Communicators made from one with an NCCL communicator --------------------------------
//
// MPI's communicator constructors (MPI_Comm_dup, _split, _split_type, _create,
// MPI_Cart_create, _sub, ...: shim/comm_ctor.cpp) are collective over the parent, so every
// rank of it is there: where the parent has an NCCL communicator, the child's is split
// from it at once (ncclCommSplit, splitShare = 1: it shares the parent's buffers and
// channels instead of taking its own, NVIDIA/nccl#986), color the child's rank 0's rank in
// the parent (equal on the child's ranks, distinct between children), key the rank in the
// child (NCCL ranks = MPI ranks), NCCL_SPLIT_NOCOLOR where the rank gets MPI_COMM_NULL. A
// parent without one costs nothing here: the child sets up lazily, at its first call, as
// any communicator. Three steps, each agreed over the parent (a rank that cannot take part
// would leave the others inside ncclCommSplit): every rank can split (its parent not
// aborted, NCCL has ncclCommSplit, room in its budget); the split, the child's context
// and failure notices; every rank has its child. Any failure: the child gets nothing (its
// first call sets up as usual), and what was made is freed.

// Step 1 on this rank: may it split `p`? (*why: why not.)
bool may_split(const NcclComm& p, std::string* why) {
  if (!p.lib->ncclCommSplit) return *why = p.lib->path + " has no ncclCommSplit", false;
  if (p.aborted()) return *why = "the parent's NCCL communicator is aborted", false;
  return Pool::get().room(false, why);
}

// Step 2 on a rank of `child`: the split and the CUDA objects around it, in `c` (device,
// context and streams on the parent's GPU). False with *why on a failure.
bool split_into(NcclComm& c, NcclComm& p, MPI_Comm parent, MPI_Comm child, std::string* why) {
  const cuda::Driver& d = driver();
  int color = NCCL_SPLIT_NOCOLOR, key = 0, size = 0;
  if (child != MPI_COMM_NULL) PMPI_Comm_size(child, &size);
  if (size > 1) {  // (a child of one rank takes route self: no NCCL communicator)
    MPI_Group pg, cg;
    const int zero = 0;
    PMPI_Comm_rank(child, &key);
    PMPI_Comm_group(parent, &pg);
    PMPI_Comm_group(child, &cg);
    PMPI_Group_translate_ranks(cg, 1, &zero, pg, &color);
    PMPI_Group_free(&pg);
    PMPI_Group_free(&cg);
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.splitShare = 1;
  ncclResult_t r;
  {
    auto use = p.use();  // holds off an abort of the parent while NCCL uses it
    ScopedContext scope(p.cuctx);
    r = p.aborted() ? ncclInvalidUsage : p.lib->ncclCommSplit(p.comm, color, key, &c.comm, &config);
  }
  if (r != ncclSuccess) {
    c.comm = nullptr;
    return *why = p.lib->describe("ncclCommSplit", r, p.comm), false;
  }
  if (size < 2) return true;
  // The child NCCL made must be the MPI one: its ranks, in its order.
  int n = size, me = key;
  if ((p.lib->ncclCommCount && p.lib->ncclCommCount(c.comm, &n) != ncclSuccess) ||
      (p.lib->ncclCommUserRank && p.lib->ncclCommUserRank(c.comm, &me) != ncclSuccess) ||
      n != size || me != key)
    return *why = "ncclCommSplit made a communicator of " + std::to_string(n) +
                  " ranks where this one is rank " + std::to_string(me) + "; the MPI's has " +
                  std::to_string(size) + " and this one is rank " + std::to_string(key),
           false;
  c.device = p.device;
  c.cudev = p.cudev;
  CUresult cr = d.cuDevicePrimaryCtxRetain(&c.cuctx, c.cudev);
  if (cr != CUDA_SUCCESS) {
    c.cuctx = nullptr;
    return *why = SC_CU_WHY(cr, "cuDevicePrimaryCtxRetain"), false;
  }
  ScopedContext scope(c.cuctx);
  if ((cr = d.cuStreamCreate(&c.classic, CU_STREAM_NON_BLOCKING)) != CUDA_SUCCESS ||
      (cr = d.cuStreamCreate(&c.side, CU_STREAM_NON_BLOCKING)) != CUDA_SUCCESS)
    return *why = SC_CU_WHY(cr, "cuStreamCreate"), false;
  return true;
}

// The split's last step on every rank of the parent: whether every rank has its part
// (`ok`), and on the child's ranks the NCCL state it hands to the child's context.
void adopt_split(std::shared_ptr<NcclComm> c, bool ok, const std::string& why, MPI_Comm parent,
                 MPI_Comm child, const CommContext* cctx) {
  if (!service::all(ok, parent)) {
    if (c->comm) {
      c->lib->ncclCommAbort(c->comm);  // (NCCL makes the communicator's device current)
      c->comm = nullptr;
    }
    c->close_faults();
    if (!ok) SC_WARN("nccl: could not split an NCCL communicator for a new communicator: %s; "
                     "it sets up at its first call", why.c_str());
    return;
  }
  if (child == MPI_COMM_NULL || !cctx) {  // NCCL_SPLIT_NOCOLOR: nothing was made here
    c->comm = nullptr;
    return;
  }
  g_live_nccl.fetch_add(1);
  nccl::usage().made_shared.fetch_add(1);
  c->shared = true;
  SC_INFO("nccl: a communicator of %d ranks shares its parent's NCCL resources (ncclCommSplit)",
          cctx->size);
  auto& slot = const_cast<CommContext*>(cctx)->route_state[static_cast<int>(RouteId::nccl)];
  auto st = std::make_unique<NcclState>();
  st->status = NcclState::ready;
  st->comm = std::move(c);
  Watchdog::get().watch(st->comm);
  slot = std::move(st);
}

}  // namespace
}  // namespace nccl_detail

void nccl_derive(CommContext& parent, MPI_Comm child) {
  using namespace nccl_detail;
  auto& slot = parent.route_state[static_cast<int>(RouteId::nccl)];
  if (!slot) return;
  auto& pst = static_cast<NcclState&>(*slot);
  // Ready on every rank of the parent or on none (set up collectively, never reset).
  if (pst.status != NcclState::ready || !pst.comm) return;
  std::shared_ptr<NcclComm> p = pst.comm;
  std::string why;
  const bool can = may_split(*p, &why);
  if (!service::all(can, parent.comm)) {
    if (!can) SC_INFO("nccl: no NCCL split for a new communicator: %s", why.c_str());
    return;
  }
  auto c = std::make_shared<NcclComm>();
  c->lib = p->lib;
  bool ok = split_into(*c, *p, parent.comm, child, &why);
  CommContext* cctx = nullptr;
  int size = 0;
  if (child != MPI_COMM_NULL) PMPI_Comm_size(child, &size);
  if (size > 1) {
    // Collective over the child (all its ranks are here, whatever `ok` is on each).
    cctx = comm_context(child, true);
    if (cctx) {
      c->size = cctx->size;
      c->async_error = cctx->async_error;
    }
    const bool faults = c->open_faults(child);
    if (ok && (!cctx || !faults)) {
      why = "the MPI failed to set up the new communicator's state";
      ok = false;
    }
  }
  adopt_split(std::move(c), ok, why, parent.comm, child, cctx);
}

}  // namespace streamcoll
