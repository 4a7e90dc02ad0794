#include "algorithms/ccube.hpp"

#include <algorithm>

#include "algorithms/nccl_lib.hpp"
#include "algorithms/schedule.hpp"
#include "config/cost_model.hpp"
#include "core/cuda_driver.hpp"
#include "core/datatypes.hpp"
#if STREAMCOLL_HAVE_NVGROUP
#include "algorithms/nvgroup.hpp"
#endif

namespace streamcoll {

using cuda::driver;

// Whether route ccube's kernels reduce `a` (an allreduce of a type and op they take).
bool ccube_takes(const CollArgs& a) {
#if STREAMCOLL_HAVE_NVGROUP
  if (a.coll != Coll::allreduce) return false;
  const TypeInfo* t = find_type(a.datatype);
  const OpInfo* op = find_op(a.op);
  return t && op && nvgroup_kernels::type_of(*t) && nvgroup_kernels::op_of(op->kind);
#else
  (void)a;
  return false;
#endif
}

#if STREAMCOLL_HAVE_NVGROUP
ncclResult_t enqueue_ccube(const CollArgs& a, const CommContext& ctx, const nccl::NcclComm& c,
                           CUstream s, const Ccube& cc, CUresult* cu) {
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
  const uint64_t chunk = cc.chunk_bytes ? cc.chunk_bytes : model::ccube_device_chunk(p.count * ts);
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
        *cu = d.cuLaunchKernel(cc.reduce, nvgroup::reduce_blocks(o.count), 1, 1,
                               nvgroup::kReduceThreads, 1, 1, 0, s, args, nullptr);
      }
    }
  }
  if (tmp)
    if (CUresult f = d.cuMemFreeAsync(tmp, s); *cu == CUDA_SUCCESS) *cu = f;
  return r;
}
#else
ncclResult_t enqueue_ccube(const CollArgs&, const CommContext&, const nccl::NcclComm&, CUstream,
                           const Ccube&, CUresult*) {
  return ncclInvalidUsage;  // no kernels in this build: the route is not offered
}
#endif

}  // namespace streamcoll
