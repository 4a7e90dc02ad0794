// Route ccube: C-Cube's overlapped tree (Jo, Son, Kim et al., KAIST, section III; the
// rounds and the tree mapped onto the nodes: algorithms/schedule.cpp, allreduce_ccube)
// run on the NCCL communicator. A round is one
// NCCL group of its sends and receives (byte messages, matched per pair of ranks in issue
// order, as a round's messages are posted by both ends in the same round), then its
// copies (cuMemcpyDtoDAsync) and reductions (streamcoll_reduce, dst = src op dst), all on
// the call's stream; the children's chunks land in stream-ordered scratch (one chunk per
// child). Why NCCL point-to-point plus a kernel and not NV-Group's kernels: the tree's
// edges cross nodes, which NCCL's send/recv reach (over NVLink, PCIe or the network)
// while NV-Group's kernels are one node's (CUDA IPC); and NCCL's groups let a round's
// messages run concurrently, which is what overlaps a chunk's broadcast down with the
// next chunk's reduction up. Cost: a group launch per round and a kernel per child and
// round, so chunks are large: the table's chunk=, else model::ccube_device_chunk (about
// sqrt(n · 20 KiB), from the α-β model, not measured on a GPU).
// The route is route nccl's class (algorithms/nccl.hpp, NcclRoute: the NCCL communicator,
// staging, failure handling and stream semantics are nccl's) with three hooks of its own:
// the allreduces its kernels reduce (takes), its kernel loadable on this rank's GPU
// (able_beyond), and the tree in place of NCCL's allreduce (prepare, enqueue_tree).
#include <cuda.h>
#include <nccl.h>

#include <algorithm>
#include <string>

#include "algorithms/nccl.hpp"
#include "algorithms/nccl_comm.hpp"
#include "algorithms/nccl_lib.hpp"
#include "algorithms/route.hpp"
#include "algorithms/schedule.hpp"
#include "config/cost_model.hpp"
#include "config/tuning_table.hpp"
#include "core/cuda_driver.hpp"
#include "core/datatypes.hpp"
#if STREAMCOLL_HAVE_NVGROUP
#include "algorithms/nvgroup.hpp"
#endif

namespace streamcoll {

#if STREAMCOLL_HAVE_NVGROUP
namespace {

using cuda::driver;

// Enqueues C-Cube's allreduce of `a` on stream `s` over `c`'s NCCL communicator: the
// rounds of sched::build (algo ccube, the tree mapped onto ctx's nodes) as NCCL groups of
// byte sends and receives, then the round's copies and reductions (own.kernel: the
// reduction kernel of c's GPU; own.param: the chunk in bytes, 0 for the model's). Returns
// the NCCL result; *cu gets the first failed CUDA call (scratch, copies, kernels), left
// as it was when none failed. Never waits on the host.
ncclResult_t enqueue_tree(const CollArgs& a, const CommContext& ctx, const nccl::NcclComm& c,
                          CUstream s, const NcclRoute::Own& own, CUresult* cu) {
  const nccl::Library& L = *c.lib;
  const cuda::Driver& d = driver();
  const TypeInfo* t = find_type(a.datatype);
  const uint64_t ts = static_cast<uint64_t>(t->size);
  sched::Params p;
  p.coll = Coll::allreduce;
  p.algo = sched::Algo::ccube;
  p.rank = ctx.rank;
  p.size = ctx.size;
  p.count = static_cast<uint64_t>(a.count);
  p.in_place = a.sendbuf == MPI_IN_PLACE;
  const uint64_t chunk = own.param ? own.param : model::ccube_device_chunk(p.count * ts);
  p.chunk = std::max<uint64_t>(1, chunk / ts);
  p.node_of = &ctx.node_of;
  const sched::Schedule sch = sched::build(p);
  nvgroup::ReduceParams rp{};
  rp.dtype = static_cast<uint32_t>(*nvgroup_kernels::type_of(*t));
  rp.op = static_cast<uint32_t>(*nvgroup_kernels::op_of(find_op(a.op)->kind));
  CUdeviceptr tmp = 0;
  if (sch.tmp_elems &&
      (*cu = d.cuMemAllocAsync(&tmp, sch.tmp_elems * ts, s)) != CUDA_SUCCESS)
    return ncclSuccess;
  auto base = [&](sched::Buf b) -> char* {
    switch (b) {
      case sched::Buf::send: return static_cast<char*>(const_cast<void*>(a.sendbuf));
      case sched::Buf::recv: return static_cast<char*>(a.recvbuf);
      default: return reinterpret_cast<char*>(tmp);
    }
  };
  ncclResult_t r = ncclSuccess;
  for (size_t i = 0; i < sch.num_rounds() && r == ncclSuccess && *cu == CUDA_SUCCESS; ++i) {
    const uint32_t lo = sch.round_begin(i), hi = sch.round_end(i);
    bool messages = false;
    for (uint32_t k = lo; k < hi; ++k)
      messages = messages || sch.ops[k].kind == sched::Op::Kind::send ||
                 sch.ops[k].kind == sched::Op::Kind::recv;
    if (messages) {
      r = L.ncclGroupStart();
      for (uint32_t k = lo; k < hi && r == ncclSuccess; ++k) {
        const sched::Op& o = sch.ops[k];
        char* at = base(o.buf) + o.off * ts;
        if (o.kind == sched::Op::Kind::send)
          r = L.ncclSend(at, o.count * ts, ncclUint8, o.peer, c.comm, s);
        else if (o.kind == sched::Op::Kind::recv)
          r = L.ncclRecv(at, o.count * ts, ncclUint8, o.peer, c.comm, s);
      }
      const ncclResult_t end = L.ncclGroupEnd();
      if (r == ncclSuccess) r = end;
    }
    for (uint32_t k = lo; k < hi && r == ncclSuccess && *cu == CUDA_SUCCESS; ++k) {
      const sched::Op& o = sch.ops[k];
      char* dst = base(o.buf) + o.off * ts;
      const char* src = base(o.src) + o.src_off * ts;
      if (o.kind == sched::Op::Kind::copy) {
        *cu = d.cuMemcpyDtoDAsync(reinterpret_cast<CUdeviceptr>(dst),
                                  reinterpret_cast<CUdeviceptr>(src), o.count * ts, s);
      } else if (o.kind == sched::Op::Kind::reduce) {
        rp.dst = dst;
        rp.src = src;
        rp.count = o.count;
        void* args[] = {&rp};
        *cu = d.cuLaunchKernel(own.kernel, nvgroup::reduce_blocks(o.count), 1, 1,
                               nvgroup::kReduceThreads, 1, 1, 0, s, args, nullptr);
      }
    }
  }
  if (tmp)
    if (CUresult f = d.cuMemFreeAsync(tmp, s); *cu == CUDA_SUCCESS) *cu = f;
  return r;
}

class CcubeRoute final : public NcclRoute {
 public:
  CcubeRoute() : NcclRoute(RouteId::ccube) {}

 protected:
  // An allreduce of a type and op the kernels reduce: from the call's arguments.
  bool takes(const CollArgs& a) const override {
    if (a.coll != Coll::allreduce) return false;
    const TypeInfo* t = find_type(a.datatype);
    const OpInfo* op = find_op(a.op);
    return t && op && nvgroup_kernels::type_of(*t) && nvgroup_kernels::op_of(op->kind);
  }

  // The reduction kernel on this rank's GPU. Asked at every blocking call on device
  // buffers, whatever the table says, so nothing is loaded here: the GPU and driver are
  // checked (reduce_kernel_may_load), the kernel is loaded at the route's first call
  // (prepare); a load that fails there fails that call on every rank (its peers are
  // told) and makes this rank answer no from then on, so the ranks leave ccube together.
  bool able_beyond(const CollArgs& a, const CallEnv& local, int device) override {
    if (a.coll != Coll::allreduce || (local.mem != MemKind::device && local.mem != MemKind::managed))
      return true;
    if (device < 0) {  // managed memory before the set-up: the thread's current GPU
      CUdevice cur = 0;
      if (!driver().usable || SC_CU_RESULT(driver().cuCtxGetDevice(&cur)) != CUDA_SUCCESS) return false;
      device = static_cast<int>(cur);
    }
    return nvgroup_kernels::reduce_kernel_may_load(device);
  }

  // The tree, with the rule's chunk (else model::ccube_device_chunk) and the kernel.
  bool prepare(const CollArgs&, const config::RouteChoice& choice, int device, Own* own,
               std::string* why) override {
    own->enqueue = enqueue_tree;
    if (auto v = choice.param("chunk"))
      if (auto b = config::parse_size(*v)) own->param = *b;
    own->kernel = nvgroup_kernels::reduce_kernel(device, why);
    if (own->kernel) return true;
    *why = "ccube's reduction kernel: " + *why;
    return false;
  }
};

Route* ccube_route() {
  static CcubeRoute r;
  return &r;
}

}  // namespace

extern const RouteEntry ccube_entry = {ccube_route};
#else
// Without the kernels (a build without route nvgroup's nvcc) the route is not built.
extern const RouteEntry ccube_entry = {nullptr};
#endif

}  // namespace streamcoll
