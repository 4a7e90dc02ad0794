// Staging (core/staging.hpp): the layout of a staged call, and its copies.
#include "core/staging.hpp"

#include "core/coll_shape.hpp"
#include "core/cuda_driver.hpp"
#include "core/datatypes.hpp"
#include "core/errors.hpp"
#include "core/host_staging.hpp"
#include "core/stats.hpp"

#include <algorithm>
#include <string>

namespace streamcoll::staging {

bool layout(const CollArgs& a, int rank, int size, Layout* l, bool result_apart) {
  const CollTraits& tr = traits(a.coll);
  if (tr.recv == Recv::none) return false;
  const TypeInfo* t = find_type(tr.types == Types::one ? a.datatype : a.recvtype);
  if (!t) return false;
  const int64_t ts = t->size;
  *l = Layout{};
  // Scratch mirrors recvbuf: the result ranges at their own offsets, the input where the
  // row says it lies (in recvbuf when in place, copied from sendbuf otherwise).
  const bool in_place = in_place_here(a, rank);
  const ElemRange input = input_region(a, rank, size);
  const bool own_block = in_place && tr.in_place == Input::own_block;
  bool ok = input.first >= 0 && input.n >= 0;
  uint64_t end = 0;
  for_each_result(a, rank, size, [&](int64_t first, int64_t n) {
    ok = ok && first >= 0 && n >= 0;
    if (!ok || n == 0) return;
    end = std::max(end, static_cast<uint64_t>((first + n) * ts));
    if (!own_block) return l->out.push_back({static_cast<uint64_t>(first * ts), static_cast<uint64_t>(n * ts)});
    // In place, this rank's block is the input: left alone.
    if (first < input.first) {
      const int64_t below = std::min(n, input.first - first);
      l->out.push_back({static_cast<uint64_t>(first * ts), static_cast<uint64_t>(below * ts)});
    }
    const int64_t lo = std::max(first, input.first + input.n);
    if (first + n > lo)
      l->out.push_back({static_cast<uint64_t>(lo * ts), static_cast<uint64_t>((first + n - lo) * ts)});
  });
  if (!ok) return false;
  for (Layout::Range& r : l->out) r.from = r.off;
  l->in_off = static_cast<uint64_t>(input.first * ts);
  l->in_bytes = static_cast<uint64_t>(input.n * ts);
  l->scratch = std::max(end, l->in_off + l->in_bytes);
  // (MPI_IN_PLACE on a rank where it means nothing, a reduce's non-root, reads recvbuf
  // as well: never the sentinel's address.)
  const bool marked = a.sendbuf == MPI_IN_PLACE;
  const bool from_recv = marked || tr.in_place == Input::at_root;
  l->in = static_cast<const char*>(from_recv ? a.recvbuf : a.sendbuf) + (marked ? l->in_off : 0);
  if (result_apart && tr.op && tr.rooted && !l->out.empty()) {
    // The root of a reduce for a host schedule that does not reduce in place: its result
    // after the input.
    for (Layout::Range& r : l->out) r.from += l->in_bytes;
    l->scratch += l->in_bytes;
  }
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
