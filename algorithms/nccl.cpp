// nccl: the collective on the communicator's NCCL communicator.
//
// Source: NCCL (NVIDIA) picks ring or tree per call; ring allreduce costs
// 2(p-1)·α + 2(p-1)/p·n·β for n bytes on p ranks, tree 2·log2(p)·α + 2·n·β (pipelined).
// Stream semantics: Aluminum (Dryden et al., MLHPC 2018), sections IV-B and V-A.
//
// Per communicator (route state, created at the first blocking call routed here, a
// collective step on every rank):
//   1. the rank's GPU is the device of the call's buffer; every rank's (host, PCI bus id)
//      is gathered, and ranks sharing a GPU turn the route off for the communicator
//      (NCCL refuses them; the calls fall back to pmpi, on every rank alike);
//   2. rank 0 makes an ncclUniqueId, PMPI_Bcast carries it, ncclCommInitRank; one
//      PMPI_Allreduce agrees on success, so either every rank uses NCCL or none does.
// Non-blocking calls on a communicator without NCCL state yet go to pmpi: setting up is
// collective, and starting a non-blocking call must stay local.
//
// Streams per call:
//   classic blocking        NCCL on an internal (non-blocking) stream made to wait for an
//                           event recorded on the legacy default stream, so it runs after
//                           the application's legacy and blocking streams' earlier work,
//                           as a legacy-stream copy would; the host waits for it (polling
//                           NCCL's asynchronous errors).
//   classic non-blocking    the same stream; MPI_Test queries an event, MPI_Wait waits.
//   attached S, blocking    NCCL on S; returns at once.
//   attached S, MPI_I*      an internal stream waits for S, runs NCCL, records an event;
//                           MPI_Wait/MPI_Test make S wait for that event (host never).
// Across communicators. NCCL serialises the operations of one NCCL communicator in issue
// order, whatever stream each is on, and MPI makes every rank start the collectives of
// one communicator in the same order, so those cannot deadlock each other. Across NCCL
// communicators NCCL promises nothing (its user guide, "Using multiple NCCL communicators
// concurrently": NCCL kernels block waiting for their peers, so operations of different
// communicators must be launched in the same order on every rank, or be able to run
// concurrently on the GPU, which NCCL does not guarantee; NCCL_LAUNCH_ORDER_IMPLICIT=1
// and CUDA_DEVICE_MAX_CONNECTIONS=1 make them run in launch order). Blocking calls are
// safe: in a legal program the blocking collectives of all communicators happen in one
// order consistent across ranks (or the program would deadlock under any MPI), and our
// launches follow it. MPI_I* calls are not: MPI lets ranks start them on different
// communicators in different orders. So the route takes blocking calls only, unless
// STREAMCOLL_NCCL_NONBLOCKING=1 says the program starts them in one order everywhere
// (a job-wide setting, so every rank decides alike); MPI_I* calls go to the table's next
// rule (pmpi, or ht, whose operations progress independently of each other).
//
// Failures stay collective. A rank that cannot take its part in an NCCL operation (a
// CUDA call before it fails, NCCL refuses it, its wait sees a fault) would leave the
// others' kernels waiting for it forever. So it aborts its NCCL communicator and tells
// every peer, on a private duplicate of the communicator (one small message each; every
// rank keeps one receive posted there); a peer that sees the notice (while it waits for an
// operation, at its next blocking call, or from the watchdog when MPI runs at
// MPI_THREAD_MULTIPLE) aborts its own, which ends its kernels: the operation fails on
// every rank, with MPI_ERR_OTHER, none hangs. An aborted communicator is unusable, which
// every rank reports at the next blocking call's agreement (able_here), so from then on
// the communicator's calls take the table's next rule on every rank alike; nothing else
// is latched. Asynchronous NCCL errors (ncclCommGetAsyncError) are handled the same way.
#include <nccl.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "algorithms/nccl.hpp"
#include "algorithms/nccl_comm.hpp"
#include "algorithms/nccl_lib.hpp"
#include "algorithms/nccl_map.hpp"
#include "algorithms/route.hpp"
#include "base/log.hpp"
#include "core/call_request.hpp"
#include "core/cuda_driver.hpp"
#include "core/staging.hpp"
#include "core/errors.hpp"
#include "core/host_staging.hpp"
#include "core/requests.hpp"
#include "core/runtime.hpp"
#include "core/service.hpp"

namespace streamcoll {
namespace {

using cuda::driver;
using cuda::ScopedContext;

// The NCCL communicators, their watchdog, pool and reaper: algorithms/nccl_comm.
using nccl::g_live_nccl;
using nccl::NcclComm;
using nccl::Pool;
using nccl::Reaper;
using nccl::Watchdog;

// FNV-1a over bytes.
uint64_t hash_bytes(const void* p, size_t n, uint64_t h) {
  for (size_t i = 0; i < n; ++i) {
    h ^= static_cast<const unsigned char*>(p)[i];
    h *= 1099511628211ull;
  }
  return h;
}

class NcclState final : public RouteState {
 public:
  enum Status { unset, ready, off };
  Status status = unset;
  std::shared_ptr<NcclComm> comm;
  ~NcclState() override { Pool::get().give_back(std::move(comm)); }  // an MPI thread
};

// A non-blocking call in flight: complete once the event on the stream that ran it is
// (stream-ordered: the attached stream waits for it, and the request completes at once);
// `after` (a staged call's copies back) runs once it is over, whatever its outcome.
CallSteps nccl_steps(std::shared_ptr<NcclComm> c, CUevent done, bool stream_mode, CUstream user,
                     std::function<int()> after = nullptr) {
  CallSteps st;
  if (stream_mode) {
    // Stream semantics: the attached stream waits for the operation; the host does not.
    st.test = [c, done, user](bool* finished) {
      *finished = true;
      ScopedContext scope(c->cuctx);
      const int rc = SC_CU_CHECK(driver().cuStreamWaitEvent(user, done, 0), "cuStreamWaitEvent");
      const int polled = c->poll();
      return rc != MPI_SUCCESS ? rc : polled;
    };
  } else {
    st.test = [c, done](bool* finished) {
      ScopedContext scope(c->cuctx);
      const bool aborted_before = c->aborted();
      const CUresult r = SC_CU_RESULT(driver().cuEventQuery(done));
      *finished = r != CUDA_ERROR_NOT_READY;
      if (r == CUDA_SUCCESS) return c->completed(aborted_before);
      if (*finished) return SC_CU_FAIL(r, "cuEventQuery");
      // Pending: a failure notice or an asynchronous error aborts the communicator here,
      // which ends its kernels; the request completes, with the error, once the event says
      // the GPU is done with the buffers (completed()).
      c->poll();
      return MPI_SUCCESS;
    };
    st.wait = [c, done] {
      ScopedContext scope(c->cuctx);
      return c->wait(done, nullptr);
    };
  }
  if (after)
    st.after = [after](int rc) {
      const int back = after();  // the operation is over: the staged results to the caller
      return rc != MPI_SUCCESS ? rc : back;
    };
  st.release = [c, done, after](bool finished) {
    if (!finished && after) {  // never completed (start_request failed): in flight
      ScopedContext scope(c->cuctx);
      c->wait(done, nullptr);
      after();
    }
    c->give_event(done);
  };
  return st;
}

const TypeInfo* call_type(const CollArgs& a) {
  return find_type(takes_op(a.coll) || a.coll == Coll::bcast ? a.datatype : a.recvtype);
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

// Enqueues the collective on `s` (with `own`, a subclass's operation in its place: route
// ccube's allreduce). Returns the NCCL result; *cu gets a CUDA failure of the copies and
// kernels around it (in-place reduce-scatter, alltoall, the subclass's).
ncclResult_t enqueue(const CollArgs& a, const CommContext& ctx, const NcclComm& c, CUstream s,
                     CUresult* cu, const NcclRoute::Own* own = nullptr) {
  const nccl::Library& L = *c.lib;
  const TypeInfo* t = call_type(a);
  const size_t ts = static_cast<size_t>(t->size);
  const int p = ctx.size, me = ctx.rank;
  auto* rbuf = static_cast<char*>(a.recvbuf);
  const void* sbuf = a.sendbuf;
  *cu = CUDA_SUCCESS;
  if (own) return own->enqueue(a, ctx, c, s, *own, cu);
  switch (a.coll) {
    case Coll::allreduce: {
      auto type = *nccl::reduction_type(*t);
      auto op = *nccl::reduction_op(find_op(a.op)->kind);
      return L.ncclAllReduce(sbuf == MPI_IN_PLACE ? rbuf : sbuf, rbuf, a.count, type, op,
                             c.comm, s);
    }
    case Coll::reduce: {
      auto type = *nccl::reduction_type(*t);
      auto op = *nccl::reduction_op(find_op(a.op)->kind);
      // MPI_IN_PLACE is only valid at the root, where the input is the receive buffer.
      return L.ncclReduce(sbuf == MPI_IN_PLACE ? rbuf : sbuf, rbuf, a.count, type, op, a.root,
                          c.comm, s);
    }
    case Coll::bcast:
      return L.ncclBroadcast(rbuf, rbuf, a.count * ts, ncclUint8, a.root, c.comm, s);
    case Coll::allgather: {
      const size_t block = static_cast<size_t>(a.recvcount) * ts;
      // MPI in place: this rank's block is already at its place in recvbuf, which is
      // NCCL's in-place condition (sendbuff == recvbuff + rank * block).
      const void* src = sbuf == MPI_IN_PLACE ? rbuf + me * block : sbuf;
      return L.ncclAllGather(src, rbuf, block, ncclUint8, c.comm, s);
    }
    case Coll::reduce_scatter_block: {
      auto type = *nccl::reduction_type(*t);
      auto op = *nccl::reduction_op(find_op(a.op)->kind);
      if (sbuf != MPI_IN_PLACE)
        return L.ncclReduceScatter(sbuf, rbuf, a.count, type, op, c.comm, s);
      // MPI in place: input is all of recvbuf, the result goes to its start, and the rest
      // of recvbuf stays as it was (MPI writes nothing there). NCCL's in place would leave
      // the result over this rank's input block, so reduce into a stream-ordered scratch
      // block and copy it down (rank 0's block is the start: no scratch).
      const size_t block = static_cast<size_t>(a.count) * ts;
      if (me == 0) return L.ncclReduceScatter(rbuf, rbuf, a.count, type, op, c.comm, s);
      CUdeviceptr tmp = 0;
      if ((*cu = driver().cuMemAllocAsync(&tmp, block, s)) != CUDA_SUCCESS) return ncclSuccess;
      ncclResult_t r = L.ncclReduceScatter(rbuf, reinterpret_cast<void*>(tmp), a.count, type,
                                           op, c.comm, s);
      if (r == ncclSuccess)
        *cu = driver().cuMemcpyDtoDAsync(reinterpret_cast<CUdeviceptr>(rbuf), tmp, block, s);
      if (CUresult f = driver().cuMemFreeAsync(tmp, s); *cu == CUDA_SUCCESS) *cu = f;
      return r;
    }
    case Coll::alltoall: {
      const size_t block = static_cast<size_t>(a.recvcount) * ts;
      CUdeviceptr copy = 0;
      const char* src = static_cast<const char*>(sbuf);
      if (sbuf == MPI_IN_PLACE) {  // send from a stream-ordered copy of recvbuf
        if ((*cu = driver().cuMemAllocAsync(&copy, block * p, s)) != CUDA_SUCCESS)
          return ncclSuccess;
        if ((*cu = driver().cuMemcpyDtoDAsync(copy, reinterpret_cast<CUdeviceptr>(rbuf),
                                              block * p, s)) != CUDA_SUCCESS) {
          driver().cuMemFreeAsync(copy, s);
          return ncclSuccess;
        }
        src = reinterpret_cast<const char*>(copy);
      }
      ncclResult_t r = L.ncclGroupStart();
      for (int peer = 0; peer < p && r == ncclSuccess; ++peer) {
        r = L.ncclSend(src + peer * block, block, ncclUint8, peer, c.comm, s);
        if (r == ncclSuccess) r = L.ncclRecv(rbuf + peer * block, block, ncclUint8, peer, c.comm, s);
      }
      ncclResult_t end = L.ncclGroupEnd();
      if (r == ncclSuccess) r = end;
      if (copy) *cu = driver().cuMemFreeAsync(copy, s);
      return r;
    }
    default:
      return ncclInvalidUsage;  // accepts() lets no other collective through
  }
}

// A call whose buffers on this rank are not on the NCCL communicator's GPU (host memory,
// another GPU's, or a mix) while the other ranks' are: it was routed from memory kinds
// agreed at an earlier call (shim/dispatch.cpp), so this rank takes part through device
// copies. The inputs go to a scratch buffer on the classic stream before the collective.
// Non-blocking: the results come back (on the copy stream, waited for) when the request
// completes, so that nothing here waits for other ranks. Blocking: the host waits for the
// collective (polling for failure notices, as a classic call does), then for the copies
// back. This rank keeps plain MPI semantics: its buffers are final when the call returns or
// MPI_Wait/MPI_Test report it, and buffers on another GPU are read and written after the
// work already on that GPU's legacy stream and the application's blocking streams there,
// and after the work on the stream attached to the communicator (env.has_stream). Only
// the bytes MPI says the call writes on this rank are written.
int run_staged(const CollArgs& a, const CommContext& ctx, const std::shared_ptr<NcclComm>& c,
               const NcclRoute::Own* own, const CallEnv& env) {
  const cuda::Driver& d = driver();
  ScopedContext scope(c->cuctx);
  // Any failure before the collective is enqueued leaves this rank out: its peers are told.
  auto lost = [&](int rc) {
    c->fail_collectively(rc, call_name(a.coll, a.nonblocking) + " (staged) could not take its part on this rank");
    d.cuStreamSynchronize(c->classic);  // nothing enqueued may still read the caller's buffers
    return rc;
  };
  CUresult made = CUDA_SUCCESS;
  std::call_once(c->copy_once, [&] { made = d.cuStreamCreate(&c->copy, CU_STREAM_NON_BLOCKING); });
  if (!c->copy)
    return lost(SC_CU_FAIL(made ? made : CUDA_ERROR_INVALID_HANDLE, "cuStreamCreate (staging)"));
  CUstream s = c->classic;
  // After the work on the buffers' GPUs and on the attached stream, which itself goes on.
  auto stage = std::make_shared<staging::GpuStage>();
  if (const int rc = stage->in(a, ctx.rank, ctx.size, c->cuctx, s,
                               env.has_stream ? static_cast<CUstream>(env.stream) : nullptr, "nccl")) {
    stage->drop(s);
    return lost(rc);
  }
  const CollArgs staged = stage->args(a);
  CUresult cu = CUDA_SUCCESS;
  ncclResult_t nr;
  {
    auto use = c->use();
    if (c->aborted()) {
      stage->drop(s);
      return c->poll();
    }
    nr = enqueue(staged, ctx, *c, s, &cu, own);
  }
  int rc = MPI_SUCCESS;
  if (nr != ncclSuccess || cu != CUDA_SUCCESS) {
    stage->drop(s);
    return lost(nr != ncclSuccess
                    ? fail(Failure::nccl, c->lib->describe(call_name(a.coll, true).c_str(), nr, c->comm))
                    : SC_CU_FAIL(cu, call_name(a.coll, true)));
  }
  c->note(s);
  // Runs once the collective is done (or the request is dropped unstarted): results back
  // on the copy stream, which nothing else uses, so waiting for it waits for no other rank.
  auto back = [c, stage]() -> int { return stage->finish(c->copy); };
  if (!a.nonblocking) {
    if (rc = c->wait(nullptr, s); rc != MPI_SUCCESS) {
      stage->drop(s);  // after whatever of the operation is still on s
      return rc;
    }
    return back();
  }
  // Enqueued, but without a request the caller cannot wait for it: lost to it, so its
  // peers are told (the scratch buffer goes once the stream is through).
  CUevent done = c->take_event(&rc);
  if (!done) {
    *a.request = MPI_REQUEST_NULL;
    rc = lost(rc);
    stage->drop(s);
    return rc;
  }
  if (const int er = SC_CU_CHECK(d.cuEventRecord(done, s), "cuEventRecord")) {
    c->give_event(done);
    *a.request = MPI_REQUEST_NULL;
    rc = lost(er);
    stage->drop(s);
    return rc;
  }
  return start_call_request(nccl_steps(c, done, false, nullptr, std::move(back)), a.request);
}

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

// Routes nccl and ccube: one class (ccube's hooks: algorithms/ccube.cpp), one NCCL
// communicator per communicator (route nccl's state, set up by whichever of them is first
// asked), so they share its set-up, failure handling and stream semantics.

// A rank stages host, managed, mixed and other-GPU memory through the communicator's GPU
// (run_staged) and runs classic or stream-ordered on its own: one NCCL operation on
// every rank whatever each passes. A subclass stages so too, and a rank whose operation
// cannot be prepared (ccube's reduction kernel does not load) fails the call on every
// rank through nccl's failure path. A rank that describes a bcast, allgather or alltoall
// with a derived datatype runs repacked to the others' datatype (core/repack.hpp), and
// one that cannot read its data fails the call on every rank (CallEnv::input_failure).
bool NcclRoute::adapts(const CollArgs& a, CommContext&, const config::RouteChoice&, const CallEnv&) {
  return takes(a) && (takes_op(a.coll) || a.coll == Coll::bcast || a.coll == Coll::allgather ||
                      a.coll == Coll::alltoall);
}

bool NcclRoute::accepts(const CollArgs& a, CommContext& ctx, const config::RouteChoice&,
                        const CallEnv& env) {
  if (!takes(a)) return false;
  // MPI_I*: only where the program promises one start order on all communicators
  // (file comment; a job-wide setting, equal on every rank); fused messages where the
  // site allows them on NCCL (STREAMCOLL_FUSION_NCCL, algorithms/fusion.hpp).
  const config::Settings& set = Runtime::get().settings();
  if (ctx.inter || (ctx.size == 1 && set.one_rank_self)) return false;  // one rank: self
  if (a.nonblocking && !(env.fused ? set.fusion_nccl : set.nccl_nonblocking)) return false;
  const OpInfo* op = takes_op(a.coll) ? find_op(a.op) : nullptr;
  if (nccl::Support s = nccl::supports(a.coll, env.mem, call_type(a), op);
      s != nccl::Support::ok) {
    SC_TRACE("nccl: %s", nccl::describe(s));
    return false;
  }
  NcclState& st = state_of(ctx);
  if (st.status == NcclState::unset) {
    if (!collective_point(a)) return false;  // set up at a blocking call or a persistent init
    set_up(st, env, ctx);
  }
  return st.status == NcclState::ready;
}

// The communicator's NCCL communicator must not be aborted (a failure notice taken in
// here, at a blocking call, makes every rank agree to leave it), and this rank's GPU
// buffers must be on its GPU (set up at its first call, on that call's GPU). Managed
// memory is reachable from any. A subclass adds its own check (able_beyond).
bool NcclRoute::able_here(const CollArgs& a, CommContext& ctx, const CallEnv& local) {
  auto& slot = ctx.route_state[static_cast<int>(RouteId::nccl)];
  const NcclState* st = slot ? static_cast<const NcclState*>(slot.get()) : nullptr;
  if (st && st->status == NcclState::ready) {
    if (st->comm->check_faults(true)) return false;
    if (local.mem == MemKind::device && st->comm->device != local.device) return false;
  }
  return able_beyond(a, local, st && st->status == NcclState::ready ? st->comm->device : local.device);
}

int NcclRoute::run(const CollArgs& a, CommContext& ctx, const config::RouteChoice& choice,
                   const CallEnv& env) {
  std::shared_ptr<NcclComm> c = state_of(ctx).comm;
  // Aborted (a peer's notice, an asynchronous error): the peers have aborted or are
  // told to, so none waits for this rank's part.
  if (int rc = c->poll(); rc != MPI_SUCCESS) return rc;
  const std::string what = call_name(a.coll, a.nonblocking);
  CUstream s = nullptr;  // the stream the operation goes on (set below)
  // Every failure below leaves this rank out of the operation: it tells its peers, and
  // (the abort ends whatever of it was enqueued) a classic call waits for our stream to
  // be through with the caller's buffers before returning. A stream-ordered one does
  // not: the application's stream may hold work the application releases only later,
  // and it cannot reuse the buffers before that stream is through anyway.
  auto lost = [&](int rc) {
    c->fail_collectively(rc, what + " could not take its part on this rank");
    if (s && !env.has_stream) driver().cuStreamSynchronize(s);
    return rc;
  };
  if (env.input_failure != MPI_SUCCESS) return lost(env.input_failure);
  // Managed memory is reachable from any GPU; device memory only from its own. A call
  // routed from an earlier agreement (non-blocking, or blocking from its signature's:
  // shim/dispatch.cpp) whose buffers here are elsewhere stages them.
  const bool reachable = env.mem == MemKind::managed ||
                         (env.mem == MemKind::device && env.device == c->device);
  // A subclass's operation (route ccube's tree), or NCCL's own collective (none).
  Own own;
  if (std::string why; !prepare(a, choice, c->device, &own, &why))
    return lost(fail(Failure::cuda, what + ": " + why));
  const Own* op = own.enqueue ? &own : nullptr;
  if (!reachable) return run_staged(a, ctx, c, op, env);
  const cuda::Driver& d = driver();
  ScopedContext scope(c->cuctx);
  auto user = static_cast<CUstream>(env.stream);
  s = c->classic;
  int rc = MPI_SUCCESS;
  if (env.has_stream) c->stream_ordered.store(true);
  if (env.has_stream && a.nonblocking) {
    // Ordered after the work on the attached stream, which itself goes on.
    CUevent ready = c->take_event(&rc);
    if (!ready) return lost(rc);
    int wr = SC_CU_CHECK(d.cuEventRecord(ready, user), "cuStreamWaitEvent");
    if (wr == MPI_SUCCESS) wr = SC_CU_CHECK(d.cuStreamWaitEvent(c->side, ready, 0), "cuStreamWaitEvent");
    c->give_event(ready);  // the wait has captured it; the event may be recorded again
    if (wr != MPI_SUCCESS) return lost(wr);
    s = c->side;
  } else if (env.has_stream) {
    s = user;
  } else {
    // Classic: ordered after the legacy stream and every blocking stream of the
    // application, as a copy on the legacy stream would be: an event recorded on the
    // legacy stream is after every blocking stream's earlier work. Our stream is not a
    // blocking stream, so nothing of another communicator's is in that event's past.
    CUevent legacy = c->take_event(&rc);
    if (!legacy) return lost(rc);
    const int wr = SC_CU_CHECK(cuda::wait_for_legacy(s, legacy), "cuStreamWaitEvent (legacy stream)");
    c->give_event(legacy);
    if (wr != MPI_SUCCESS) return lost(wr);
  }

  CUresult cu;
  ncclResult_t nr;
  {
    auto use = c->use();
    if (c->aborted()) return c->poll();
    nr = enqueue(a, ctx, *c, s, &cu, op);
  }
  if (nr != ncclSuccess)
    return lost(fail(Failure::nccl, c->lib->describe(what.c_str(), nr, c->comm)));
  if (cu != CUDA_SUCCESS) return lost(SC_CU_FAIL(cu, what));
  c->note(s);

  if (!a.nonblocking) return env.has_stream ? MPI_SUCCESS : c->wait(nullptr, s);
  // Enqueued, but without a request the caller cannot wait for it (nor know when its
  // buffers are free): the operation is lost to it, so its peers are told.
  CUevent done = c->take_event(&rc);
  if (!done) {
    *a.request = MPI_REQUEST_NULL;
    return lost(rc);
  }
  if (const int er = SC_CU_CHECK(d.cuEventRecord(done, s), "cuEventRecord")) {
    c->give_event(done);
    *a.request = MPI_REQUEST_NULL;
    return lost(er);
  }
  if (int src = start_call_request(nccl_steps(c, done, env.has_stream, user), a.request);
      src != MPI_SUCCESS)
    return lost(src);
  return MPI_SUCCESS;
}


void nccl_derive(CommContext& parent, MPI_Comm child) {
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

Route* nccl_route();
void nccl_shutdown();
void nccl_release();
void nccl_resources(ResourceCounts* c);
extern const RouteEntry nccl_entry = {nccl_route, nccl_shutdown, nccl_release, nccl_derive,
                                      nccl_resources};

Route* nccl_route() {
  static NcclRoute r(RouteId::nccl);
  return &r;
}


namespace nccl_stage {

void fail_collectively(CommContext& ctx, int rc, const std::string& why) {
  auto& slot = ctx.route_state[static_cast<int>(RouteId::nccl)];
  if (!slot) return;
  auto& st = static_cast<NcclState&>(*slot);
  if (st.status == NcclState::ready && st.comm) st.comm->fail_collectively(rc, why);
}

int wait_stream(const std::vector<CommContext*>& ctxs, void* stream) {
  std::vector<std::shared_ptr<NcclComm>> comms;
  for (CommContext* c : ctxs) {
    if (!c) continue;
    auto& slot = c->route_state[static_cast<int>(RouteId::nccl)];
    if (!slot) continue;
    auto& st = static_cast<NcclState&>(*slot);
    if (st.status == NcclState::ready && st.comm) comms.push_back(st.comm);
  }
  auto s = static_cast<CUstream>(stream);
  auto aborted = [&] {
    int rc = MPI_SUCCESS;
    for (auto& c : comms)
      if (int e = c->poll(); e != MPI_SUCCESS && rc == MPI_SUCCESS) rc = e;
    return rc;
  };
  for (unsigned i = 1;; ++i) {
    const CUresult r = SC_CU_RESULT(driver().cuStreamQuery(s));  // NOT_READY: not yet
    if (r == CUDA_SUCCESS) return aborted();
    if (r != CUDA_ERROR_NOT_READY) {
      const int rc = SC_CU_FAIL(r, "cuStreamQuery");
      for (auto& c : comms) c->fail_collectively(rc, "a wait for NCCL stages failed on this rank");
      return rc;
    }
    if (i % 1024 == 0) {
      if (int rc = aborted(); rc != MPI_SUCCESS) {
        driver().cuStreamSynchronize(s);  // the aborted kernels end
        return rc;
      }
      if (i >= 64 * 1024) sched_yield();
    }
  }
}

// From the GPU's memory pool, stream-ordered on the copy stream, so that neither the
// allocation nor the free waits for the GPU's other work (cuMemFree may synchronise the
// device, whose work may wait for other ranks): that stream holds only staged results,
// each copied and waited for at once, so synchronising it after the allocation waits
// for no other rank.
std::shared_ptr<void> device_buffer(CommContext& ctx, uint64_t bytes, int* device) {
  auto& slot = ctx.route_state[static_cast<int>(RouteId::nccl)];
  if (!slot || bytes == 0) return nullptr;
  auto& st = static_cast<NcclState&>(*slot);
  if (st.status != NcclState::ready || !st.comm) return nullptr;
  std::shared_ptr<NcclComm> c = st.comm;
  const cuda::Driver& d = driver();
  ScopedContext scope(c->cuctx);
  // Results: without GPU memory the message is packed in host memory (logged at info).
  CUresult r = CUDA_SUCCESS;
  std::call_once(c->copy_once, [&] { r = d.cuStreamCreate(&c->copy, CU_STREAM_NON_BLOCKING); });
  CUdeviceptr p = 0;
  if (c->copy) r = SC_CU_RESULT(d.cuMemAllocAsync(&p, bytes, c->copy));
  if (c->copy && r == CUDA_SUCCESS) {
    r = d.cuStreamSynchronize(c->copy);
    if (r != CUDA_SUCCESS) d.cuMemFreeAsync(p, c->copy);
  }
  if (!c->copy || r != CUDA_SUCCESS) {
    SC_INFO("nccl: no GPU memory for a fused message (%s); it is packed in host memory",
            SC_CU_WHY(r ? r : CUDA_ERROR_INVALID_HANDLE, "cuMemAllocAsync").c_str());
    return nullptr;
  }
  *device = c->device;
  return std::shared_ptr<void>(reinterpret_cast<void*>(p), [c](void* q) {
    ScopedContext free_scope(c->cuctx);
    driver().cuMemFreeAsync(reinterpret_cast<CUdeviceptr>(q), c->copy);
  });
}

}  // namespace nccl_stage

void nccl_shutdown() { Watchdog::get().stop(); }

void nccl_resources(ResourceCounts* c) {
  const nccl::Usage& u = nccl::usage();
  c->nccl_own = u.made_own.load();
  c->nccl_shared = u.made_shared.load();
  c->nccl_live = static_cast<uint64_t>(std::max(0, g_live_nccl.load()));
  c->nccl_refused = u.refused.load();
  c->nccl_bytes = u.bytes.load();
  c->nccl_peak_bytes = u.peak_bytes.load();
}

void nccl_release() {
  Pool::get().stop();
  Reaper::get().drain();
}

}  // namespace streamcoll
