// Staging (core/staging.hpp): the layout of a staged call, and its copies.
#include "core/staging.hpp"

#include "core/cuda_driver.hpp"
#include "core/datatypes.hpp"
#include "core/errors.hpp"
#include "core/host_staging.hpp"
#include "core/stats.hpp"

#include <string>

namespace streamcoll::staging {

bool layout(const CollArgs& a, int rank, int size, Layout* l, bool result_apart) {
  const TypeInfo* t =
      find_type(takes_op(a.coll) || a.coll == Coll::bcast ? a.datatype : a.recvtype);
  if (!t) return false;
  const uint64_t ts = static_cast<uint64_t>(t->size);
  const uint64_t p = static_cast<uint64_t>(size), me = static_cast<uint64_t>(rank);
  const bool in_place = a.sendbuf == MPI_IN_PLACE;
  const char* in = static_cast<const char*>(in_place ? a.recvbuf : a.sendbuf);
  *l = Layout{};
  std::vector<Layout::Range>& out = l->out;
  switch (a.coll) {
    case Coll::allreduce:
      l->scratch = l->in_bytes = static_cast<uint64_t>(a.count) * ts;
      out.push_back({0, l->scratch});
      break;
    case Coll::reduce:
      l->scratch = l->in_bytes = static_cast<uint64_t>(a.count) * ts;
      if (rank == a.root && result_apart) {
        out.push_back({0, l->in_bytes, l->in_bytes});
        l->scratch = 2 * l->in_bytes;
      } else if (rank == a.root) {
        out.push_back({0, l->scratch});
      }
      break;
    case Coll::bcast:
      l->scratch = static_cast<uint64_t>(a.count) * ts;
      in = static_cast<const char*>(a.recvbuf);
      if (rank == a.root)
        l->in_bytes = l->scratch;
      else
        out.push_back({0, l->scratch});
      break;
    case Coll::allgather: {
      const uint64_t block = static_cast<uint64_t>(a.recvcount) * ts;
      l->scratch = p * block;
      l->in_off = me * block;
      l->in_bytes = block;
      if (in_place) {  // this rank's block is the input: left alone
        in += me * block;
        if (me > 0) out.push_back({0, me * block, 0});
        if (me + 1 < p) out.push_back({(me + 1) * block, (p - me - 1) * block, (me + 1) * block});
      } else {
        out.push_back({0, l->scratch});
      }
      break;
    }
    case Coll::reduce_scatter_block:
      l->scratch = l->in_bytes = p * static_cast<uint64_t>(a.count) * ts;
      out.push_back({0, static_cast<uint64_t>(a.count) * ts});
      break;
    case Coll::alltoall:
      l->scratch = l->in_bytes = p * static_cast<uint64_t>(a.recvcount) * ts;
      out.push_back({0, l->scratch});
      break;
    default:
      return false;
  }
  l->in = in;
  return true;
}

#if STREAMCOLL_HAVE_CUDA
int order_after(const void* in, const void* out, CUstream s, CUstream attached) {
  const cuda::Driver& d = cuda::driver();
  int ordered_after = -1;  // the device whose legacy stream s waits for already
  for (const void* b : {in, out}) {
    int dev = -1;
    const MemKind k = b ? cuda::classify(b, &dev) : MemKind::host;
    if ((k != MemKind::device && k != MemKind::managed) || (dev >= 0 && dev == ordered_after))
      continue;
    if (const int rc = host_staging::wait_for_legacy_of(b, s); rc != MPI_SUCCESS) return rc;
    ordered_after = dev;
  }
  if (!attached) return MPI_SUCCESS;
  CUevent ready = nullptr;
  const char* what = "cuStreamWaitEvent (staging after the attached stream)";
  int rc = SC_CU_CHECK(d.cuEventCreate(&ready, CU_EVENT_DISABLE_TIMING), what);
  if (rc == MPI_SUCCESS) rc = SC_CU_CHECK(d.cuEventRecord(ready, attached), what);
  if (rc == MPI_SUCCESS) rc = SC_CU_CHECK(d.cuStreamWaitEvent(s, ready, 0), what);
  if (ready) SC_CU_TOLERATE(d.cuEventDestroy(ready));  // the wait has captured its record
  return rc;
}

int copy_in(const Layout& l, CUdeviceptr buf, CUstream s) {
  if (!l.in_bytes) return MPI_SUCCESS;
  return SC_CU_CHECK(cuda::driver().cuMemcpyAsync(buf + l.in_off, reinterpret_cast<CUdeviceptr>(l.in),
                                                  l.in_bytes, s),
                     "cuMemcpyAsync (staging in)");
}

int copy_out(const Layout& l, CUdeviceptr buf, void* recvbuf, CUstream s) {
  const cuda::Driver& d = cuda::driver();
  auto* user = static_cast<char*>(recvbuf);
  int rc = MPI_SUCCESS;
  for (const Layout::Range& r : l.out) {
    if (!r.bytes) continue;
    const CUresult e = d.cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(user + r.off), buf + r.from,
                                       r.bytes, s);
    if (rc == MPI_SUCCESS) rc = SC_CU_CHECK(e, "cuMemcpyAsync (staging out)");  // the first
  }
  return rc;
}

GpuStage::~GpuStage() {
  if (buf_) drop(free_on_);
}

int GpuStage::in(const CollArgs& a, int rank, int size, CUcontext ctx, CUstream s,
                 CUstream attached, const char* what) {
  const cuda::Driver& d = cuda::driver();
  ctx_ = ctx;
  free_on_ = s;
  what_ = what;
  recvbuf_ = a.recvbuf;
  if (!layout(a, rank, size, &l_))
    return fail(Failure::cuda, call_name(a.coll, a.nonblocking) + " (" + what + "): no staged form");
  cuda::ScopedContext scope(ctx);
  if (const int rc = order_after(l_.in, a.recvbuf, s, attached)) return rc;
  if (l_.scratch) {
    if (const int rc = SC_CU_CHECK(d.cuMemAllocAsync(&buf_, l_.scratch, s),
                                   std::string(what) + ": cuMemAllocAsync (staging)")) {
      buf_ = 0;
      return rc;
    }
  }
  return buf_ ? copy_in(l_, buf_, s) : MPI_SUCCESS;
}

CollArgs GpuStage::args(const CollArgs& a) const {
  CollArgs staged = a;
  staged.sendbuf = MPI_IN_PLACE;
  staged.recvbuf = reinterpret_cast<void*>(buf_);
  return staged;
}

int GpuStage::finish(CUstream s, bool copy_back) {
  const cuda::Driver& d = cuda::driver();
  cuda::ScopedContext scope(ctx_);
  int rc = copy_back && buf_ ? copy_out(l_, buf_, recvbuf_, s) : MPI_SUCCESS;
  drop(s);
  const int synced = SC_CU_CHECK(d.cuStreamSynchronize(s),
                                 std::string(what_) + ": cuStreamSynchronize (staging out)");
  if (rc == MPI_SUCCESS) rc = synced;
  return rc;
}

void GpuStage::drop(CUstream s) {
  if (!buf_) return;
  cuda::ScopedContext scope(ctx_);
  SC_CU_TOLERATE(cuda::driver().cuMemFreeAsync(buf_, s));
  buf_ = 0;
}
#endif

}  // namespace streamcoll::staging
