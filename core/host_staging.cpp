#include "core/host_staging.hpp"

#include "core/coll_shape.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "base/log.hpp"
#include "core/batch_copy.hpp"
#include "core/call_request.hpp"
#include "core/cuda_driver.hpp"
#include "core/datatypes.hpp"
#include "core/errors.hpp"
#include "core/outcome_in_band.hpp"
#include "core/pmpi_call.hpp"
#include "core/requests.hpp"
#include "core/runtime.hpp"
#include "core/service.hpp"
#include "core/stats.hpp"

namespace streamcoll::host_staging {

namespace {
std::atomic<KernelLoader> g_batch_copy_loader{nullptr};
}  // namespace

void set_batch_copy_loader(KernelLoader loader) {
  g_batch_copy_loader.store(loader, std::memory_order_release);
}

// ---- Pure logic ---------------------------------------------------------------------

bool should_stage(MemKind mem, bool fortran, bool mpi_cuda_aware) {
  if (mpi_cuda_aware || fortran) return false;
  // mixed: some buffer is not host memory of the same kind as the other; run() stages
  // the ones on a GPU and leaves host and pinned buffers alone.
  return mem == MemKind::device || mem == MemKind::managed || mem == MemKind::mixed;
}

Awareness resolve_awareness(config::CudaAware setting, int query_ompi, int query_mpich) {
  switch (setting) {
    case config::CudaAware::yes:
      return {true, "STREAMCOLL_MPI_CUDA_AWARE=yes"};
    case config::CudaAware::no:
      return {false, "STREAMCOLL_MPI_CUDA_AWARE=no"};
    case config::CudaAware::auto_detect:
      break;
  }
  if (query_ompi >= 0)
    return {query_ompi != 0, "MPIX_Query_cuda_support() = " + std::to_string(query_ompi)};
  if (query_mpich >= 0)
    return {query_mpich != 0, "MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA) says " +
                                  std::to_string(query_mpich)};
  return {false, "the MPI has neither MPIX_Query_cuda_support nor MPIX_GPU_query_support"};
}

ByteRange TypeSpan::elements(int64_t displ, int64_t count) const {
  if (count <= 0 || size <= 0) return {};
  const int64_t base = displ * extent + true_lb;
  const int64_t last = (count - 1) * extent;  // negative for a negative extent
  return {base + std::min<int64_t>(0, last), base + true_extent + std::max<int64_t>(0, last)};
}

namespace {

// Sorted, with overlapping and touching ranges joined.
std::vector<ByteRange> merged(std::vector<ByteRange> v) {
  std::sort(v.begin(), v.end(),
            [](const ByteRange& x, const ByteRange& y) { return x.lo < y.lo; });
  std::vector<ByteRange> out;
  for (const ByteRange& r : v) {
    if (r.empty()) continue;
    if (!out.empty() && r.lo <= out.back().hi)
      out.back().hi = std::max(out.back().hi, r.hi);
    else
      out.push_back(r);
  }
  return out;
}

}  // namespace

StagingExtents staging_extents(const CollArgs& a, int rank, int size, const TypeSpan& S,
                               const TypeSpan& R) {
  StagingExtents x;
  const bool in_place = a.sendbuf == MPI_IN_PLACE;
  std::vector<ByteRange> in, out;
  auto add = [](std::vector<ByteRange>& v, ByteRange r) {
    if (!r.empty()) v.push_back(r);
  };
  const CollTraits& t = traits(a.coll);
  if (!in_place && t.send != Ext::none && significant(t.send_at, a, rank))
    x.send = S.elements(0, static_cast<int64_t>(elements(t.send, a, size)));
  for_each_result(a, rank, size, [&](int64_t first, int64_t n) { add(out, R.elements(first, n)); });
  if (in_place_here(a, rank) || (t.in_place == Input::at_root && rank == a.root)) {
    if (t.in_place == Input::out) {
      in = out;
    } else {
      const ElemRange r = input_region(a, rank, size);
      add(in, R.elements(r.first, r.n));
    }
  }
  // Holes in the receive type: MPI leaves them alone, so the copy back must carry what
  // they held.
  if (!R.dense()) in.insert(in.end(), out.begin(), out.end());
  x.recv_in = merged(std::move(in));
  x.recv_out = merged(std::move(out));
  for (const auto* v : {&x.recv_in, &x.recv_out})
    for (const ByteRange& r : *v) {
      if (x.recv.empty()) {
        x.recv = r;
      } else {
        x.recv.lo = std::min(x.recv.lo, r.lo);
        x.recv.hi = std::max(x.recv.hi, r.hi);
      }
    }
  return x;
}

// ---- Running a staged call ----------------------------------------------------------

namespace {

bool on_gpu(MemKind k) { return k == MemKind::device || k == MemKind::managed; }

// p + off, as the MPI itself computes buffer addresses (off may be negative).
const void* at(const void* p, int64_t off) {
  return reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(p) +
                                       static_cast<uintptr_t>(off));
}
void* at(void* p, int64_t off) {
  return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(off));
}

bool span_of(MPI_Datatype t, TypeSpan* s) {
  int size = 0;
  MPI_Aint lb = 0, extent = 0, true_lb = 0, true_extent = 0;
  if (t == MPI_DATATYPE_NULL || PMPI_Type_size(t, &size) != MPI_SUCCESS ||
      PMPI_Type_get_extent(t, &lb, &extent) != MPI_SUCCESS ||
      PMPI_Type_get_true_extent(t, &true_lb, &true_extent) != MPI_SUCCESS)
    return false;
  *s = TypeSpan{size, extent, true_lb, true_extent};
  return true;
}

// The send and receive datatypes of `a` (reduction family and bcast: a.datatype).
bool spans_of(const CollArgs& a, TypeSpan* send, TypeSpan* recv) {
  switch (traits(a.coll).types) {
    case Types::none:
      *send = *recv = TypeSpan{};
      return true;
    case Types::one:
      if (!span_of(a.datatype, recv)) return false;
      *send = *recv;
      return true;
    case Types::two:
      if (!span_of(a.recvtype, recv)) return false;
      if (a.sendbuf == MPI_IN_PLACE) return *send = *recv, true;
      return span_of(a.sendtype, send);
  }
  return false;
}

// A non-blocking call on staged buffers (or with an outcome exchange): the MPI's request
// (on the host copies), the outcome allreduce's, and the copies back that complete it
// (a CallRequest's steps: staged_steps). Completed by MPI_Wait/MPI_Test (and the array
// forms) through the owned-request hooks, or by MPI_Request_free (which waits).
struct StagedCall {
  StagedCall(void* h, std::vector<Copy> b, Backend& e, int o)
      : host(h), back(std::move(b)), be(e), own(o) {}
  ~StagedCall() {
    // Unfinished (the call or start_request failed): the MPI's operations must end before
    // their buffers go.
    if (!done)
      for (MPI_Request& r : inner)
        if (r != MPI_REQUEST_NULL) PMPI_Wait(&r, MPI_STATUS_IGNORE);
    if (host) be.release(host);
  }
  /// The outcome allreduce, started before the call itself (every rank in that order).
  int start_outcome(MPI_Comm comm) {
    return service::start_any(own != MPI_SUCCESS, comm, &outcome, &inner[0]);
  }
  /// Once both requests are complete (`rc`: their error): the call's error, the copies
  /// back when every rank's input was staged, the host copies released.
  int finish(int rc) {
    if (own != MPI_SUCCESS) {
      rc = own;
    } else if (rc == MPI_SUCCESS && outcome.agreed) {
      log_error("another rank could not stage its GPU buffers for this collective; the "
                "result is not valid");
      rc = error_code(Failure::peer);
    }
    if (rc == MPI_SUCCESS && !back.empty()) rc = be.copy(back.data(), back.size());
    done = true;
    if (host) be.release(host);
    host = nullptr;
    return rc;
  }

  MPI_Request inner[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};  // outcome, the call
  void* host;
  std::vector<Copy> back;
  Backend& be;
  const int own;
  service::Flag outcome;  // every rank's staging outcome
  bool done = false;
};

CallSteps staged_steps(std::shared_ptr<StagedCall> c) {
  CallSteps st;
  st.test = [c](bool* finished) {
    int flag = 0;
    const int rc = PMPI_Testall(2, c->inner, &flag, MPI_STATUSES_IGNORE);
    *finished = rc != MPI_SUCCESS || flag;
    return rc;
  };
  st.wait = [c] { return PMPI_Waitall(2, c->inner, MPI_STATUSES_IGNORE); };
  st.after = [c](int rc) { return c->finish(rc); };
  return st;
}


}  // namespace

bool reduce_in_place_broken(const char* library_version) {
  // "MPICH Version:\t4.0.2\n...": MPICH 4.0 and 4.1 read MPI_IN_PLACE as the send buffer
  // in a blocking MPI_Reduce at a root other than 0 once its reduce-scatter-gather
  // algorithm runs (2 KiB and up), and crash (pmodels/mpich#6540, fixed by #6543 in 2023).
  const char* v = std::strstr(library_version, "MPICH Version:");
  if (!v) return false;
  v += std::strlen("MPICH Version:");
  while (*v == ' ' || *v == '\t') ++v;
  int major = 0, minor = 0;
  if (std::sscanf(v, "%d.%d", &major, &minor) != 2) return false;
  return major == 4 && minor <= 1;
}

namespace {
bool mpi_reduce_in_place_broken() {
  static const bool broken = [] {
    char lib[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
    int len = 0;
    return PMPI_Get_library_version(lib, &len) == MPI_SUCCESS && reduce_in_place_broken(lib);
  }();
  return broken;
}

// Outcomes::fatal: this rank lost its input, and no rank will learn of it within the call.
[[noreturn]] void abort_lost(const CollArgs& a, int rc) {
  abort_lost_input(a.comm, call_name(a.coll, a.nonblocking).c_str(), rc);
}

// One call's staging (run()): what this rank stages, the host block it stages into, the
// copies back after the call, and the call on the host copies.
struct Staged {
  int rank = 0, size = 1;
  StagingExtents x;
  bool send = false, recv = false;  // the send / receive buffer staged
  void* host = nullptr;             // the block: the send part, then the receive part
  uint64_t recv_off = 0;            // the receive part's offset in it (64-byte aligned)
  std::vector<Copy> back;           // host -> GPU after the call
  CollArgs b;                       // the call as the MPI gets it
  char* hbase() const { return static_cast<char*>(host); }
};

// The host block of `s`, its copies in, s.back, and s.b pointed at the copies. A failure to
// allocate or copy in loses this rank's input: with an outcome exchange it takes part
// anyway (*own set; the others learn of it); without one, or with a fatal outcome, the
// call ends here: false, *rc what it returns (or the job aborts).
bool stage_in(const CollArgs& a, Backend& be, Outcomes outcomes, Staged& s, int* own, int* rc) {
  const bool outcome = outcomes == Outcomes::exchanged, fatal = outcomes == Outcomes::fatal;
  const StagingExtents& x = s.x;
  const uint64_t send_bytes = s.send ? x.send.bytes() : 0;
  s.recv_off = (send_bytes + 63) & ~uint64_t{63};
  const uint64_t total = s.recv_off + (s.recv ? x.recv.bytes() : 0);
  s.host = be.alloc(total, s.send ? a.sendbuf : a.recvbuf);
  if (s.host == nullptr) {
    // Not even pageable memory. A blocking call with an outcome exchange still takes
    // part (the exchange makes every rank skip the call); otherwise there is no way to
    // take part without handing the MPI GPU pointers it cannot read (docs/design.md, limits).
    log_error("%s: no host memory to stage %llu bytes of GPU buffers",
              call_name(a.coll, a.nonblocking).c_str(), static_cast<unsigned long long>(total));
    if (fatal) abort_lost(a, MPI_ERR_NO_MEM);
    if (!outcome || a.nonblocking) return *rc = call_errhandler(a.comm, MPI_ERR_NO_MEM), false;
    if (*own == MPI_SUCCESS) *own = MPI_ERR_NO_MEM;
    return true;
  }
  char* hbase = s.hbase();
  // Host address of recvbuf + off (off inside x.recv).
  auto hrecv = [&](int64_t off) { return hbase + s.recv_off + (off - x.recv.lo); };
  std::vector<Copy> copies;
  if (s.send) copies.push_back({hbase, at(a.sendbuf, x.send.lo), x.send.bytes(), a.sendbuf});
  if (s.recv)
    for (const ByteRange& r : x.recv_in)
      copies.push_back({hrecv(r.lo), at(a.recvbuf, r.lo), r.bytes(), a.recvbuf});
  if (!copies.empty()) {
    if (int c = be.copy(copies.data(), copies.size()); c != MPI_SUCCESS) {
      if (fatal) abort_lost(a, c);
      if (!outcome) {
        be.release(s.host);
        return *rc = call_errhandler(a.comm, c), false;
      }
      if (*own == MPI_SUCCESS) *own = c;
    }
  }
  if (s.recv)
    for (const ByteRange& r : x.recv_out)
      s.back.push_back({at(a.recvbuf, r.lo), hrecv(r.lo), r.bytes(), a.recvbuf});
  if (s.send) s.b.sendbuf = at(static_cast<const void*>(hbase), -x.send.lo);
  if (s.recv) s.b.recvbuf = at(static_cast<void*>(hbase + s.recv_off), -x.recv.lo);
  if (!a.nonblocking) s.b.fortran = nullptr;  // (staged: a C call, on the converted handles)
  if (log_enabled(LogLevel::trace)) {
    uint64_t in = 0, out = 0;
    for (const Copy& c : copies) in += c.bytes;
    for (const Copy& c : s.back) out += c.bytes;
    SC_TRACE("%s: GPU buffers staged through host memory (%llu bytes to the host, %llu back)",
             call_name(a.coll, a.nonblocking).c_str(), static_cast<unsigned long long>(in),
             static_cast<unsigned long long>(out));
  }
  return true;
}

// A blocking call on the staged copies: every rank's staging outcome first (exchanged out
// of band, or in band: `form`), the call, the copies back.
int run_staged_blocking(const CollArgs& a, Backend& be, Staged& s, bool outcome,
                        const InBand& form, int own) {
  const bool in_band = form.taken();
  if (outcome && !in_band) {
    // If any rank's input is lost, no rank runs the call (all alike), and each reports an
    // error.
    if (service::any(own != MPI_SUCCESS, a.comm)) {
      if (s.host) be.release(s.host);
      if (own != MPI_SUCCESS) return call_errhandler(a.comm, own);
      log_error("%s: another rank could not stage its GPU buffers; the call did not run",
                call_name(a.coll, false).c_str());
      return call_errhandler(a.comm, error_code(Failure::peer));
    }
  }
  // An in-place MPI_Reduce at a root other than 0 on a staged buffer: its input as a
  // separate send buffer where the MPI cannot take MPI_IN_PLACE there (a copy, this
  // rank's own affair).
  CollArgs& b = s.b;
  std::vector<char> input;
  if (b.coll == Coll::reduce && b.sendbuf == MPI_IN_PLACE && s.rank == b.root && b.root != 0 &&
      s.recv && s.host && !b.fortran && mpi_reduce_in_place_broken()) {
    input.assign(s.hbase() + s.recv_off, s.hbase() + s.recv_off + s.x.recv.bytes());
    b.sendbuf = at(static_cast<const void*>(input.data()), -s.x.recv.lo);
  }
  const bool readable = s.host != nullptr || (!s.send && !s.recv);
  int rc = in_band ? call_in_band(form, a, b, own, readable, s.rank, s.size) : run_pmpi(b);
  if (rc == MPI_SUCCESS && !s.back.empty()) {
    rc = be.copy(s.back.data(), s.back.size());
    if (rc != MPI_SUCCESS) call_errhandler(a.comm, rc);
  }
  if (s.host) be.release(s.host);
  return rc;
}

// A non-blocking call on the staged copies: a request of streamcoll's that completes with
// the MPI's (and the outcome exchange's) and then copies back.
int start_staged(const CollArgs& a, Backend& be, Staged& s, bool outcome, int own) {
  // Until start_call_request, `call` alone holds it: its destructor waits for what started.
  auto call = std::make_shared<StagedCall>(s.host, std::move(s.back), be, own);
  if (outcome)
    if (int rc = call->start_outcome(a.comm); rc != MPI_SUCCESS) return rc;  // the MPI raised it
  CollArgs& b = s.b;
  if (b.fortran) {
    // The MPI's own Fortran binding sets the Fortran request; its C form is wrapped, and
    // the wrapper's handle goes back to the caller (shim/fortran.cpp converts it).
    int rc = run_pmpi(b);
    if (rc == MPI_SUCCESS && b.fortran->request) call->inner[1] = PMPI_Request_f2c(*b.fortran->request);
    if (rc != MPI_SUCCESS) return rc;  // (the destructor waits for the outcome allreduce)
  } else {
    b.request = &call->inner[1];
    if (int rc = run_pmpi(b); rc != MPI_SUCCESS) return rc;
  }
  // On failure start_call_request drops the steps, and with them the call, which waits.
  return start_call_request(staged_steps(std::move(call)), a.request);
}

}  // namespace

int run(const CollArgs& a, Backend& be, Outcomes outcomes, int own, const KnownKinds* known) {
  const bool outcome = outcomes == Outcomes::exchanged, fatal = outcomes == Outcomes::fatal;
  auto classify = [&](const void* p) {
    for (int i = 0; known && i < known->n; ++i)
      if (known->ptr[i] == p) return known->kind[i];
    return be.classify(p);
  };
  if (int rc; outcome && host_in_band(a, own, known, &rc)) return rc;
  // What this rank stages: C calls with GPU buffers (Fortran calls go to the MPI's own
  // binding as they are).
  Staged s;
  s.b = a;
  TypeSpan S, R;
  // A blocking call that carries the outcome in band runs as a C call (reduction_in_band,
  // data_in_band), so a Fortran one is staged there as a C one is; so does one with no
  // outcome at all (Outcomes::fatal); otherwise the MPI's Fortran binding runs it as it
  // was made.
  const bool ranked = PMPI_Comm_rank(a.comm, &s.rank) == MPI_SUCCESS &&
                      PMPI_Comm_size(a.comm, &s.size) == MPI_SUCCESS;
  const InBand form = outcome && ranked ? in_band_form(a, s.size) : InBand{};
  const bool as_c = !a.fortran || form.taken() || (fatal && !a.nonblocking);
  if (as_c && ranked && spans_of(a, &S, &R)) {
    s.x = staging_extents(a, s.rank, s.size, S, R);
    s.send = a.sendbuf != MPI_IN_PLACE && a.coll != Coll::bcast && !s.x.send.empty() &&
             on_gpu(classify(at(a.sendbuf, s.x.send.lo)));
    s.recv = !s.x.recv.empty() && on_gpu(classify(at(a.recvbuf, s.x.recv.lo)));
  }
  if (!s.send && !s.recv && !outcome) {
    const int rc = run_pmpi(a);  // the MPI raises whatever is wrong
    return own != MPI_SUCCESS ? call_errhandler(a.comm, own) : rc;
  }
  if (int rc; (s.send || s.recv) && !stage_in(a, be, outcomes, s, &own, &rc)) return rc;
  if (fatal && own != MPI_SUCCESS) abort_lost(a, own);  // (its stream's work failed)
  return a.nonblocking ? start_staged(a, be, s, outcome, own)
                       : run_staged_blocking(a, be, s, outcome, form, own);
}

// ---- The CUDA backend and process-wide state ----------------------------------------

namespace {
std::atomic<bool> g_enabled{false};

// A symbol of the MPI library: in the global scope, else in the library that holds
// PMPI_Init (an MPI opened with RTLD_LOCAL, e.g. by a language runtime).
void* mpi_symbol(const char* name) {
  if (void* s = dlsym(RTLD_DEFAULT, name)) return s;
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&PMPI_Init), &info) && info.dli_fname) {
    if (void* lib = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD)) {
      void* s = dlsym(lib, name);
      dlclose(lib);  // stays loaded: the application holds it
      return s;
    }
  }
  return nullptr;
}

#if STREAMCOLL_HAVE_CUDA
// Copies run on the per-thread default stream of the GPU's primary context, ordered after
// the legacy stream (so after the application's blocking streams' earlier work, as a
// CUDA-aware MPI's copies would be), then the host waits for that stream alone: the result
// is in GPU memory before the call returns, and later work on any stream sees it. Host
// blocks are pinned (portable), cached.
class CudaBackend final : public Backend {
 public:
  MemKind classify(const void* p) override { return cuda::classify(p); }

  void* alloc(uint64_t bytes, const void* gpu) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (;;) {
        auto best = free_.end();
        for (auto it = free_.begin(); it != free_.end(); ++it)
          if (it->bytes >= bytes && (best == free_.end() || it->bytes < best->bytes)) best = it;
        if (best == free_.end()) break;
        Block b = *best;
        free_.erase(best);
        // A context destroyed behind our back (cudaDeviceReset) took the block with it.
        if (cuda::classify(b.p) != MemKind::pinned) continue;
        used_[b.p] = b;
        return b.p;
      }
    }
    // Sizes that can be reused: powers of two from 64 KiB, 16 MiB steps above 64 MiB.
    constexpr uint64_t kStep = uint64_t{16} << 20;
    Block b{nullptr, 0, nullptr, true};
    b.bytes = bytes <= (uint64_t{64} << 20) ? std::max(round_pow2(bytes), uint64_t{64} << 10)
                                            : (bytes + kStep - 1) / kStep * kStep;
    if (context_for(gpu, &b.ctx, false) == MPI_SUCCESS) {
      cuda::ScopedContext scope(b.ctx);
      if (SC_CU_RESULT(cuda::driver().cuMemHostAlloc(&b.p, b.bytes, CU_MEMHOSTALLOC_PORTABLE)) !=
          CUDA_SUCCESS)  // not an error: pageable memory below
        b.p = nullptr;
    }
    if (b.p == nullptr) {  // pageable memory: slower copies, same results
      b = Block{std::malloc(bytes), bytes, nullptr, false};
      if (b.p == nullptr) return nullptr;
    }
    std::lock_guard<std::mutex> lock(mu_);
    used_[b.p] = b;
    return b.p;
  }

  // The blocks given up are freed after the lock is let go: cuMemFreeHost may wait for the
  // device, whose other work (another communicator's kernel) may wait for peers, while
  // other threads (the progress thread's staging among them) need the lock.
  void release(void* host) override {
    std::vector<Block> dropped;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = used_.find(host);
      if (it == used_.end()) return;
      Block b = it->second;
      used_.erase(it);
      if (!b.pinned) {
        std::free(b.p);
        return;
      }
      if (stopped_) {
        dropped.push_back(b);
      } else {
        free_.push_back(b);
        uint64_t cached = 0;
        for (const Block& f : free_) cached += f.bytes;
        while (free_.size() > kMaxCached || cached > kMaxCachedBytes) {
          // Too many: drop the smallest; too large: drop the largest.
          auto victim = free_.size() > kMaxCached
                            ? std::min_element(free_.begin(), free_.end(), by_size)
                            : std::max_element(free_.begin(), free_.end(), by_size);
          cached -= victim->bytes;
          dropped.push_back(*victim);
          free_.erase(victim);
        }
      }
    }
    for (const Block& b : dropped) free_block(b);
  }

  // The copies of one GPU's primary context go on its per-thread stream, after the
  // legacy stream's work: one kernel launch per kBatchMax of them (streamcoll_batch_copy)
  // when there are kBatchMin or more and every host end is a pinned block of ours (with
  // unified addressing a kernel reads and writes it at its host address), else a
  // cuMemcpyAsync each; then one synchronisation. STREAMCOLL_STAGING_KERNEL=no keeps the
  // copies.
  int copy(const Copy* c, size_t n) override {
    const cuda::Driver& d = cuda::driver();
    size_t i = 0;
    while (i < n) {
      CUcontext ctx = nullptr;
      int dev = 0;
      if (int rc = context_for(c[i].gpu, &ctx, true, &dev); rc != MPI_SUCCESS) return rc;
      size_t j = i + 1;  // [i, j): the copies of this context
      for (; j < n; ++j) {
        if (c[j].gpu == c[j - 1].gpu) continue;
        CUcontext next = nullptr;
        if (context_for(c[j].gpu, &next, false) != MPI_SUCCESS || next != ctx) break;
      }
      cuda::ScopedContext scope(ctx);
      int rc = after_legacy(dev);
      if (rc == MPI_SUCCESS) {
        const CUfunction batch = batch_kernel_for(c + i, j - i);
        rc = batch ? launch_batches(batch, c + i, j - i) : issue_copies(c + i, j - i);
      }
      // Even after a failure: nothing may still be copying when the caller frees memory.
      const CUresult r = d.cuStreamSynchronize(CU_STREAM_PER_THREAD);
      if (rc == MPI_SUCCESS) rc = SC_CU_CHECK(r, "cuStreamSynchronize (staging)");
      if (rc != MPI_SUCCESS) return rc;
      i = j;
    }
    return MPI_SUCCESS;
  }

  // `stream` (of any context) after the legacy stream of the GPU that holds `gpu`.
  int order_after_legacy(const void* gpu, CUstream stream) {
    CUcontext ctx = nullptr;
    int dev = 0;
    if (int rc = context_for(gpu, &ctx, true, &dev); rc != MPI_SUCCESS) return rc;
    cuda::ScopedContext scope(ctx);
    return after_legacy(dev, stream);
  }

  void stop() {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
    for (const Block& b : free_) free_block(b);
    free_.clear();
    if (!used_.empty()) return;  // blocks of requests still in flight need their contexts
    std::lock_guard<std::mutex> ctx_lock(ctx_mu_);
    std::lock_guard<std::mutex> legacy_lock(legacy_mu_);
    for (size_t dev = 0; dev < primary_.size(); ++dev)
      if (primary_[dev]) {
        if (dev < legacy_.size() && legacy_[dev]) {
          cuda::ScopedContext scope(primary_[dev]);
          SC_CU_TOLERATE(cuda::driver().cuEventDestroy(legacy_[dev]));
          legacy_[dev] = nullptr;
        }
        CUdevice cudev;
        if (SC_CU_RESULT(cuda::driver().cuDeviceGet(&cudev, static_cast<int>(dev))) == CUDA_SUCCESS)
          SC_CU_TOLERATE(cuda::driver().cuDevicePrimaryCtxRelease(cudev));
        primary_[dev] = nullptr;
      }
  }

 private:
  struct Block {
    void* p;
    uint64_t bytes;
    CUcontext ctx;  // where a pinned block was allocated
    bool pinned;
  };
  static constexpr size_t kMaxCached = 4;
  static constexpr uint64_t kMaxCachedBytes = uint64_t{1} << 30;
  static bool by_size(const Block& x, const Block& y) { return x.bytes < y.bytes; }
  static uint64_t round_pow2(uint64_t v) {
    uint64_t p = 1;
    while (p < v) p <<= 1;
    return p;
  }

  static constexpr size_t kBatchMin = 4;

  // `stream` (this thread's per-thread stream of the current context by default) waits
  // for the legacy stream's work of the current context, device `dev`
  // (cuda::wait_for_legacy), through one event per device, recorded by one thread at a
  // time (another thread's later recording would only order its wait after more work). A
  // context reset (cudaDeviceReset) takes the event with it: a use that finds the handle
  // gone makes a new one, once.
  int after_legacy(int dev, CUstream stream = CU_STREAM_PER_THREAD) {
    const cuda::Driver& d = cuda::driver();
    std::lock_guard<std::mutex> lock(legacy_mu_);
    if (legacy_.size() <= static_cast<size_t>(dev)) legacy_.resize(static_cast<size_t>(dev) + 1, nullptr);
    CUevent& ev = legacy_[static_cast<size_t>(dev)];
    CUresult r = CUDA_SUCCESS;
    for (int attempt = 0; attempt < 2; ++attempt) {
      // Results, not checks: a reset's CUDA_ERROR_INVALID_HANDLE is retried once.
      if (!ev && (r = SC_CU_RESULT(d.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING))) != CUDA_SUCCESS) {
        ev = nullptr;
        continue;
      }
      if ((r = SC_CU_RESULT(cuda::wait_for_legacy(stream, ev))) == CUDA_SUCCESS) return MPI_SUCCESS;
      if (r != CUDA_ERROR_INVALID_HANDLE && r != CUDA_ERROR_CONTEXT_IS_DESTROYED) break;
      ev = nullptr;  // the reset destroyed it
    }
    return SC_CU_FAIL(r, "staging: ordering after the legacy stream");
  }

  int issue_copies(const Copy* c, size_t n) {
    for (size_t k = 0; k < n; ++k) {
      if (const int rc = SC_CU_CHECK(cuda::driver().cuMemcpyAsync(
                                         reinterpret_cast<CUdeviceptr>(c[k].dst),
                                         reinterpret_cast<CUdeviceptr>(c[k].src), c[k].bytes,
                                         CU_STREAM_PER_THREAD),
                                     "cuMemcpyAsync (staging a GPU buffer)"))
        return rc;
    }
    return MPI_SUCCESS;
  }

  // Whether [p, p + n) lies in a pinned block of ours that is in use.
  bool own_pinned(const void* p, uint64_t n) {
    const auto a = reinterpret_cast<uintptr_t>(p);
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [base, b] : used_) {
      const auto lo = reinterpret_cast<uintptr_t>(base);
      if (b.pinned && a >= lo && a + n <= lo + b.bytes) return true;
    }
    return false;
  }

  // The batched-copy kernel when the copies [c, c + n) of the current context go by
  // kernel, else null: enough of them, allowed, each between GPU memory (its `gpu` end,
  // on this context's GPU or managed) and one of our pinned blocks or GPU memory the
  // caller vouches for (Copy::device_ends), and the kernel loadable on this context's GPU.
  CUfunction batch_kernel_for(const Copy* c, size_t n) {
#if STREAMCOLL_HAVE_CUDA
    const KernelLoader load = g_batch_copy_loader.load(std::memory_order_acquire);
    if (!load || n < kBatchMin || !Runtime::get().settings().staging_kernel) return nullptr;
    for (size_t k = 0; k < n; ++k)  // one end ours and pinned (the other the GPU's), or both the GPU's
      if (!c[k].device_ends && !own_pinned(c[k].dst, c[k].bytes) &&
          !own_pinned(c[k].src, c[k].bytes))
        return nullptr;
    CUdevice dev = 0;
    if (SC_CU_RESULT(cuda::driver().cuCtxGetDevice(&dev)) != CUDA_SUCCESS) return nullptr;  // plain copies
    std::string why;
    return load(static_cast<int>(dev), &why);
#else
    (void)c, (void)n;
    return nullptr;
#endif
  }

  // One streamcoll_batch_copy launch per kBatchMax copies, on the per-thread stream.
  int launch_batches(CUfunction fn, const Copy* c, size_t n) {
#if STREAMCOLL_HAVE_CUDA
    namespace nv = kernels;
    nv::BatchCopyParams p{};
    for (size_t k = 0; k < n; k += nv::kBatchMax) {
      p.n = static_cast<uint32_t>(std::min<size_t>(nv::kBatchMax, n - k));
      for (uint32_t s = 0; s < p.n; ++s)
        p.seg[s] = {reinterpret_cast<uint64_t>(c[k + s].dst),
                    reinterpret_cast<uint64_t>(c[k + s].src), c[k + s].bytes};
      void* args[] = {&p};
      if (const int rc = SC_CU_CHECK(cuda::driver().cuLaunchKernel(fn, p.n, 1, 1, nv::kBatchThreads,
                                                                   1, 1, 0, CU_STREAM_PER_THREAD,
                                                                   args, nullptr),
                                     "cuLaunchKernel (staging copies)"))
        return rc;
    }
    return MPI_SUCCESS;
#else
    (void)fn;
    return issue_copies(c, n);
#endif
  }

  void free_block(const Block& b) {
    cuda::ScopedContext scope(b.ctx);
    SC_CU_TOLERATE(cuda::driver().cuMemFreeHost(b.p));  // fails harmlessly if the context is gone
  }

  // The primary context of the device that holds `gpu` (managed memory without one: the
  // current context's device, else device 0), retained once per device; *ordinal: that
  // device.
  int context_for(const void* gpu, CUcontext* out, bool report, int* ordinal = nullptr) {
    const cuda::Driver& d = cuda::driver();
    int dev = cuda::device_of(gpu);
    if (dev < 0) {
      CUcontext current = nullptr;
      CUdevice cur = -1;
      if (SC_CU_RESULT(d.cuCtxGetCurrent(&current)) == CUDA_SUCCESS && current &&  // probes
          SC_CU_RESULT(d.cuCtxGetDevice(&cur)) == CUDA_SUCCESS)
        dev = cur;
    }
    if (dev < 0 || dev >= d.device_count) dev = 0;
    std::lock_guard<std::mutex> lock(ctx_mu_);
    if (primary_.size() < static_cast<size_t>(d.device_count))
      primary_.resize(static_cast<size_t>(d.device_count), nullptr);
    if (!primary_[dev]) {
      CUdevice cudev;
      CUcontext ctx = nullptr;
      // A result: an error only where the caller wants one reported.
      CUresult r = SC_CU_RESULT(d.cuDeviceGet(&cudev, dev));
      if (r == CUDA_SUCCESS) r = d.cuDevicePrimaryCtxRetain(&ctx, cudev);
      if (r != CUDA_SUCCESS)
        return report ? SC_CU_FAIL(r, "cuDevicePrimaryCtxRetain (staging)") : MPI_ERR_OTHER;
      primary_[dev] = ctx;
    }
    *out = primary_[dev];
    if (ordinal) *ordinal = dev;
    return MPI_SUCCESS;
  }

  std::mutex mu_;  // free_, used_, stopped_
  std::vector<Block> free_;
  std::unordered_map<void*, Block> used_;
  bool stopped_ = false;
  std::mutex ctx_mu_;
  std::vector<CUcontext> primary_;  // by device ordinal
  std::mutex legacy_mu_;
  std::vector<CUevent> legacy_;  // by device ordinal: after_legacy's events
};

CudaBackend& cuda_backend() {
  static CudaBackend* b = new CudaBackend;  // never destroyed: requests may outlive main
  return *b;
}
#endif  // STREAMCOLL_HAVE_CUDA

}  // namespace

bool enabled() { return g_enabled.load(std::memory_order_relaxed); }

Awareness query(config::CudaAware setting) {
  int query_ompi = -1, query_mpich = -1;
  if (setting == config::CudaAware::auto_detect) {
    if (auto ompi = reinterpret_cast<int (*)()>(mpi_symbol("MPIX_Query_cuda_support"))) {
      query_ompi = ompi() ? 1 : 0;
    } else if (auto mpich = reinterpret_cast<int (*)(int, int*)>(
                   mpi_symbol("MPIX_GPU_query_support"))) {
      int supported = 0;
      const int kCuda = 0;  // MPIX_GPU_SUPPORT_CUDA (MPICH's mpi.h / mpix.h)
      if (mpich(kCuda, &supported) == MPI_SUCCESS) query_mpich = supported ? 1 : 0;
    }
  }
  return resolve_awareness(setting, query_ompi, query_mpich);
}

bool start(const Awareness& aw) {
  const bool on = !aw.aware && STREAMCOLL_HAVE_CUDA;
  if (on)
    SC_INFO("the MPI is not CUDA-aware (%s): GPU buffers of calls it carries are staged "
            "through host memory",
            aw.how.c_str());
  else
    SC_INFO("the MPI is CUDA-aware (%s): GPU buffers go to it as they are", aw.how.c_str());
  g_enabled.store(on, std::memory_order_relaxed);
  return on;
}

void stop() {
#if STREAMCOLL_HAVE_CUDA
  cuda_backend().stop();  // also where only wait_for_legacy_of used it
#endif
}

int wait_for_legacy_of(const void* gpu, void* stream) {
#if STREAMCOLL_HAVE_CUDA
  return cuda_backend().order_after_legacy(gpu, static_cast<CUstream>(stream));
#else
  (void)gpu, (void)stream;
  return MPI_SUCCESS;
#endif
}

Backend* gpu_backend() {
#if STREAMCOLL_HAVE_CUDA
  return &cuda_backend();
#else
  return nullptr;
#endif
}

int run(const CollArgs& a, Outcomes outcomes, int own, const KnownKinds* known) {
#if STREAMCOLL_HAVE_CUDA
  return run(a, cuda_backend(), outcomes, own, known);
#else
  (void)outcomes, (void)known;
  const int rc = run_pmpi(a);
  if (own != MPI_SUCCESS) PMPI_Comm_call_errhandler(a.comm, own);
  return own != MPI_SUCCESS ? own : rc;
#endif
}

}  // namespace streamcoll::host_staging
