// streamcoll demo: the collective pattern of a data-parallel training step, written as
// an ordinary CUDA-aware MPI program. Run it under the shim (scripts/demo.sh) to see
// every call intercepted and routed.
//
//   demo [--iters N] [--count N] [--host] [--stream [--compute-us N]]
//
// Buffers are on the GPU when one is present (and --host is not given), on the host
// otherwise. Every result is checked against a value computed locally; the program
// exits nonzero on a wrong result.
//
// --stream (device buffers only; with host buffers it says it has no effect and runs as
// without it): the training step is enqueued on one CUDA stream, which is attached to
// the step's communicator (a duplicate of MPI_COMM_WORLD) with
// streamcoll_comm_attach_stream (streamcoll/streamext.h). The "compute" (a small kernel
// that writes each step's inputs, after spinning --compute-us microseconds, default 100,
// so that a collective which did not wait for the stream would read stale data), the
// uploads, the collectives and the copies of the results to the host all go on that
// stream, with no host synchronisation between them: MPI_Iallreduce + MPI_Waitall make
// the stream, not the host, wait. The host synchronises once per step, to check the
// results. If streamcoll does not take the stream (STREAMCOLL_ERR_ABSENT: not loaded,
// disabled, or without stream support), the demo says so and keeps the classic pattern:
// cudaStreamSynchronize before each collective. The kernel is PTX, loaded at run time
// (no nvcc needed); if the driver cannot load it, the inputs are uploaded from pinned
// memory on the stream instead, and the demo says so.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#if STREAMCOLL_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include "streamcoll/streamext.h"

namespace {

bool g_device = false;

#if STREAMCOLL_HAVE_CUDA
void cuda_ok(cudaError_t e, const char* what, int line) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "demo: %s failed (demo.cpp:%d): %s\n", what, line, cudaGetErrorString(e));
  MPI_Abort(MPI_COMM_WORLD, 1);
}
#define CUDA_OK(call) cuda_ok((call), #call, __LINE__)

// The stream mode's "compute": y[i] = a + b * (i % m) for i < n, after every thread has
// spun spin_ns nanoseconds on the GPU's global timer. Hand-written PTX (the CUDA C
// equivalent compiles to the same code), JIT-compiled by the driver for the GPU present.
const char kComputePtx[] = R"(
.version 7.0
.target sm_75
.address_size 64

.visible .entry demo_compute(
	.param .u64 demo_compute_y,
	.param .u64 demo_compute_n,
	.param .f32 demo_compute_a,
	.param .f32 demo_compute_b,
	.param .u64 demo_compute_m,
	.param .u64 demo_compute_spin_ns)
{
	.reg .pred 	%p<3>;
	.reg .b32 	%r<5>;
	.reg .f32 	%f<4>;
	.reg .b64 	%rd<15>;

	ld.param.u64 	%rd1, [demo_compute_y];
	ld.param.u64 	%rd2, [demo_compute_n];
	ld.param.f32 	%f1, [demo_compute_a];
	ld.param.f32 	%f2, [demo_compute_b];
	ld.param.u64 	%rd3, [demo_compute_m];
	ld.param.u64 	%rd4, [demo_compute_spin_ns];
	cvta.to.global.u64 	%rd5, %rd1;
	mov.u64 	%rd6, %globaltimer;
	add.u64 	%rd7, %rd6, %rd4;
$L_spin:
	mov.u64 	%rd8, %globaltimer;
	setp.lt.u64 	%p1, %rd8, %rd7;
	@%p1 bra 	$L_spin;
	mov.u32 	%r1, %ctaid.x;
	mov.u32 	%r2, %ntid.x;
	mov.u32 	%r3, %tid.x;
	mov.u32 	%r4, %nctaid.x;
	cvt.u64.u32 	%rd9, %r3;
	mad.wide.u32 	%rd10, %r1, %r2, %rd9;
	mul.wide.u32 	%rd11, %r4, %r2;
$L_loop:
	setp.ge.u64 	%p2, %rd10, %rd2;
	@%p2 bra 	$L_done;
	rem.u64 	%rd12, %rd10, %rd3;
	cvt.rn.f32.u64 	%f3, %rd12;
	fma.rn.f32 	%f3, %f2, %f3, %f1;
	shl.b64 	%rd13, %rd10, 2;
	add.s64 	%rd14, %rd5, %rd13;
	st.global.f32 	[%rd14], %f3;
	add.s64 	%rd10, %rd10, %rd11;
	bra.uni 	$L_loop;
$L_done:
	ret;
}
)";

// Pinned host memory for the stream mode's uploads and result copies (a copy to pageable
// memory would make the host wait for the stream). Handed out in order and reset after
// each step's cudaStreamSynchronize; every step needs the same amount, so it is
// allocated during the first step only.
class Pinned {
 public:
  void* get(size_t bytes) {
    bytes = (bytes + 63) / 64 * 64;
    while (cur_ < chunks_.size() && chunks_[cur_].size - used_ < bytes) {
      ++cur_;
      used_ = 0;
    }
    if (cur_ == chunks_.size()) {
      Chunk c{nullptr, std::max<size_t>(bytes, 1 << 20)};
      CUDA_OK(cudaMallocHost(&c.p, c.size));
      chunks_.push_back(c);
      used_ = 0;
    }
    void* p = chunks_[cur_].p + used_;
    used_ += bytes;
    return p;
  }
  void reset() { cur_ = used_ = 0; }
  void release() {
    for (Chunk& c : chunks_) cudaFreeHost(c.p);
    chunks_.clear();
    reset();
  }

 private:
  struct Chunk {
    char* p;
    size_t size;
  };
  std::vector<Chunk> chunks_;
  size_t cur_ = 0, used_ = 0;
};
#endif

// The --stream machinery; `on` only with device buffers.
struct StreamMode {
  bool on = false;
  bool attached = false;  // streamcoll took the stream: no synchronisation before calls
#if STREAMCOLL_HAVE_CUDA
  cudaStream_t s = nullptr;
  cudaLibrary_t lib = nullptr;
  cudaKernel_t compute = nullptr;  // null: inputs uploaded from pinned memory instead
  unsigned long long spin_ns = 0;
  Pinned pinned;
#endif
  std::vector<std::function<void()>> checks;  // run after the step's synchronisation
} g_stream;

#if STREAMCOLL_HAVE_CUDA
// Enqueues the compute kernel on the stream: y[i] = a + b * (i % m), i < n.
cudaError_t launch_compute(void* y, size_t n, float a, float b, unsigned long long m,
                           unsigned long long spin_ns) {
  unsigned long long count = n;
  void* args[] = {&y, &count, &a, &b, &m, &spin_ns};
  const size_t blocks = std::max<size_t>(1, std::min<size_t>((n + 255) / 256, 1024));
  return cudaLaunchKernel(reinterpret_cast<const void*>(g_stream.compute),
                          dim3(static_cast<unsigned>(blocks)), dim3(256), args, 0, g_stream.s);
}
#endif

int g_errors = 0;
template <class T>
void expect(const char* what, const std::vector<T>& got, const std::vector<T>& want) {
  for (size_t i = 0; i < want.size(); ++i)
    if (got[i] != want[i]) {
      std::fprintf(stderr, "demo: wrong %s result at element %zu: %g, expected %g\n", what, i,
                   static_cast<double>(got[i]), static_cast<double>(want[i]));
      ++g_errors;
      return;
    }
}

// A buffer of T, on the GPU or the host, filled and read through host vectors. In stream
// mode every operation is enqueued on the stream and checks complete at end_step().
template <class T>
class Buffer {
 public:
  explicit Buffer(size_t n) {
#if STREAMCOLL_HAVE_CUDA
    if (g_device) {
      if (cudaMalloc(&p_, n * sizeof(T) + 1) != cudaSuccess) std::abort();
      return;
    }
#endif
    p_ = static_cast<T*>(std::malloc(n * sizeof(T) + 1));
  }
  ~Buffer() {
#if STREAMCOLL_HAVE_CUDA
    if (g_device) {
      cudaFree(p_);
      return;
    }
#endif
    std::free(p_);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  T* get() { return p_; }

  void put(const std::vector<T>& v) {
#if STREAMCOLL_HAVE_CUDA
    if (g_stream.on) {
      void* staged = g_stream.pinned.get(v.size() * sizeof(T));
      std::memcpy(staged, v.data(), v.size() * sizeof(T));
      CUDA_OK(cudaMemcpyAsync(p_, staged, v.size() * sizeof(T), cudaMemcpyHostToDevice,
                              g_stream.s));
      return;
    }
#endif
    copy(p_, v.data(), v.size());
  }

  // The "compute": element i of the first n becomes a + b * (i % m).
  void compute(size_t n, float a, float b, unsigned long long m, bool spin = false) {
#if STREAMCOLL_HAVE_CUDA
    if (g_stream.on && g_stream.compute) {
      CUDA_OK(launch_compute(p_, n, a, b, m, spin ? g_stream.spin_ns : 0));
      return;
    }
#endif
    (void)spin;
    std::vector<T> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<T>(a + b * static_cast<float>(i % m));
    put(v);
  }

  // n elements of src from src_off to this buffer at off.
  void copy_from(const Buffer& src, size_t src_off, size_t off, size_t n) {
#if STREAMCOLL_HAVE_CUDA
    if (g_stream.on) {
      CUDA_OK(cudaMemcpyAsync(p_ + off, src.p_ + src_off, n * sizeof(T), cudaMemcpyDefault,
                              g_stream.s));
      return;
    }
#endif
    copy(p_ + off, src.p_ + src_off, n);
  }

  // Compares the first want.size() elements with want: now, or in stream mode after the
  // step's synchronisation (the copy to the host is enqueued now).
  void check(const char* what, std::vector<T> want) {
    const size_t n = want.size();
#if STREAMCOLL_HAVE_CUDA
    if (g_stream.on) {
      T* snap = static_cast<T*>(g_stream.pinned.get(n * sizeof(T)));
      CUDA_OK(cudaMemcpyAsync(snap, p_, n * sizeof(T), cudaMemcpyDeviceToHost, g_stream.s));
      g_stream.checks.push_back([what, snap, w = std::move(want)] {
        expect(what, std::vector<T>(snap, snap + w.size()), w);
      });
      return;
    }
#endif
    std::vector<T> got(n);
    copy(got.data(), p_, n);
    expect(what, got, want);
  }

 private:
  static void copy(T* dst, const T* src, size_t n) {
#if STREAMCOLL_HAVE_CUDA
    if (g_device) {
      cudaMemcpy(dst, src, n * sizeof(T), cudaMemcpyDefault);
      return;
    }
#endif
    std::memcpy(dst, src, n * sizeof(T));
  }
  T* p_ = nullptr;
};

// Stream mode without streamcoll taking the stream: the classic CUDA-aware MPI pattern,
// the input must be ready before the call.
void before_collective() {
#if STREAMCOLL_HAVE_CUDA
  if (g_stream.on && !g_stream.attached) CUDA_OK(cudaStreamSynchronize(g_stream.s));
#endif
}

// Stream mode: the one host synchronisation of the step, then its checks.
void end_step() {
#if STREAMCOLL_HAVE_CUDA
  if (!g_stream.on) return;
  CUDA_OK(cudaStreamSynchronize(g_stream.s));
  for (auto& c : g_stream.checks) c();
  g_stream.checks.clear();
  g_stream.pinned.reset();
#endif
}

#if STREAMCOLL_HAVE_CUDA
// Loads the compute kernel and runs it once, checked; on failure the reason, and the
// stream mode uploads its inputs instead.
std::string load_compute_kernel() {
  cudaError_t e = cudaLibraryLoadData(&g_stream.lib, kComputePtx, nullptr, nullptr, 0, nullptr,
                                      nullptr, 0);
  if (e == cudaSuccess) e = cudaLibraryGetKernel(&g_stream.compute, g_stream.lib, "demo_compute");
  if (e != cudaSuccess) {
    g_stream.compute = nullptr;
    return std::string("loading the PTX kernel: ") + cudaGetErrorString(e);
  }
  // Lazy module loading JIT-compiles at the first launch: try it on a few elements.
  Buffer<float> probe(7);
  e = launch_compute(probe.get(), 7, 2.0f, 1.0f, 5, 0);
  if (e == cudaSuccess) e = cudaStreamSynchronize(g_stream.s);
  if (e != cudaSuccess) {
    cudaGetLastError();  // JIT and launch errors are not sticky: clear, go on without
    g_stream.compute = nullptr;
    return std::string("running the PTX kernel: ") + cudaGetErrorString(e);
  }
  probe.check("compute kernel probe", {2, 3, 4, 5, 6, 2, 3});
  const int before = g_errors;
  end_step();
  if (g_errors != before) {  // reported above; the demo goes on without the kernel
    g_errors = before;
    g_stream.compute = nullptr;
    return "the PTX kernel computed a wrong result";
  }
  return "";
}
#endif

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  int iters = 20, count = 1 << 16, compute_us = 100;
  bool host = false, stream = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--iters" && i + 1 < argc) iters = std::atoi(argv[++i]);
    else if (a == "--count" && i + 1 < argc) count = std::atoi(argv[++i]);
    else if (a == "--compute-us" && i + 1 < argc) compute_us = std::atoi(argv[++i]);
    else if (a == "--host") host = true;
    else if (a == "--stream") stream = true;
  }
#if STREAMCOLL_HAVE_CUDA
  int ndev = 0;
  if (!host && cudaGetDeviceCount(&ndev) == cudaSuccess && ndev > 0) {
    cudaSetDevice(rank % ndev);
    g_device = true;
  }
#endif
  (void)host;
  (void)compute_us;
  if (rank == 0)
    std::printf("demo: %d ranks, %d iterations, %d floats per gradient, %s buffers\n", size,
                iters, count, g_device ? "device" : "host");

  // The step's communicator: MPI_COMM_WORLD, or in stream mode a duplicate carrying the
  // stream (an attribute on MPI_COMM_WORLD would order every library's collectives on it).
  MPI_Comm comm = MPI_COMM_WORLD;
  if (stream && !g_device) {
    if (rank == 0) std::printf("demo: --stream has no effect with host buffers\n");
  }
#if STREAMCOLL_HAVE_CUDA
  if (stream && g_device) {
    g_stream.on = true;
    g_stream.spin_ns = static_cast<unsigned long long>(std::max(compute_us, 0)) * 1000ull;
    CUDA_OK(cudaStreamCreateWithFlags(&g_stream.s, cudaStreamNonBlocking));
    MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    const int rc = streamcoll_comm_attach_stream(comm, g_stream.s);
    if (rc != MPI_SUCCESS && rc != STREAMCOLL_ERR_ABSENT) {
      std::fprintf(stderr, "demo: streamcoll_comm_attach_stream failed with MPI error %d\n", rc);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    // Every rank must use the same pattern: stream-ordered only if all ranks attached.
    int mine = rc == MPI_SUCCESS, all = 0;
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, comm);
    if (mine && !all) streamcoll_comm_detach_stream(comm);
    g_stream.attached = all != 0;
    const std::string kernel = load_compute_kernel();
    if (rank == 0) {
      if (g_stream.attached)
        std::printf("demo: stream mode: streamcoll took the CUDA stream; compute and "
                    "collectives are enqueued on it, the host synchronises once per step\n");
      else
        std::printf("demo: stream mode: streamcoll did not take the CUDA stream (%s); "
                    "synchronising the stream before each collective instead\n",
                    rc == STREAMCOLL_ERR_ABSENT
                        ? "STREAMCOLL_ERR_ABSENT: not loaded, disabled, or no stream support"
                        : "not every rank could attach it");
      if (kernel.empty())
        std::printf("demo: stream mode: compute kernel loaded, %d us of simulated compute "
                    "per gradient\n", compute_us);
      else
        std::printf("demo: stream mode: no compute kernel (%s); inputs are uploaded from "
                    "pinned memory on the stream instead\n", kernel.c_str());
    }
  }
#endif

  const size_t n = static_cast<size_t>(count);
  const size_t p = static_cast<size_t>(size);
  Buffer<float> grad(n), params(n), shard(n / p + 1), stats(2 * p);
  Buffer<int> tokens(p * 4), routed(p * 4), sizes(p);

  const auto t0 = std::chrono::steady_clock::now();
  for (int it = 0; it < iters; ++it) {
    // Gradients: every rank contributes rank + it + (i % 5); the sum is known.
    std::vector<float> want(n);
    for (size_t i = 0; i < n; ++i)
      want[i] = static_cast<float>(size * (it + static_cast<int>(i % 5)) + size * (size - 1) / 2);
    grad.compute(n, static_cast<float>(rank + it), 1.0f, 5, true);
    before_collective();
    MPI_Allreduce(MPI_IN_PLACE, grad.get(), count, MPI_FLOAT, MPI_SUM, comm);
    grad.check("allreduce", want);

    // Parameters from a rotating root.
    const int root = it % size;
    params.compute(n, static_cast<float>(rank == root ? it * 2 + 1 : -1), 0.0f, 1);
    before_collective();
    MPI_Bcast(params.get(), count, MPI_FLOAT, root, comm);
    params.check("bcast", std::vector<float>(n, static_cast<float>(it * 2 + 1)));

    // Sharded optimizer step: reduce-scatter the gradients, all-gather the shards.
    const int block = count / size;
    const size_t b = static_cast<size_t>(block), r = static_cast<size_t>(rank);
    grad.compute(n, static_cast<float>(rank + it), 1.0f, 5, true);
    before_collective();
    MPI_Reduce_scatter_block(grad.get(), shard.get(), block, MPI_FLOAT, MPI_SUM, comm);
    shard.check("reduce_scatter_block",
                std::vector<float>(want.begin() + r * b, want.begin() + (r + 1) * b));
    params.compute(n, -1.0f, 0.0f, 1);
    params.copy_from(shard, 0, r * b, b);
    before_collective();
    MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, params.get(), block, MPI_FLOAT, comm);
    params.check("allgather", std::vector<float>(want.begin(), want.begin() + b * p));

    // Mixture-of-experts style token exchange.
    std::vector<int> tok(p * 4), tok_want(p * 4);
    for (size_t d = 0; d < p; ++d)
      for (size_t k = 0; k < 4; ++k) {
        tok[d * 4 + k] = rank * 1000 + static_cast<int>(d * 10 + k);
        tok_want[d * 4 + k] = static_cast<int>(d) * 1000 + rank * 10 + static_cast<int>(k);
      }
    tokens.put(tok);
    before_collective();
    MPI_Alltoall(tokens.get(), 4, MPI_INT, routed.get(), 4, MPI_INT, comm);
    routed.check("alltoall", tok_want);

    // Loss and norm statistics, overlapped with a halo exchange. With the stream
    // attached, MPI_Waitall makes the stream wait for the reduction, not the host.
    stats.compute(2, static_cast<float>(rank + 1), 0.0f, 1);
    before_collective();
    MPI_Request reqs[3];
    MPI_Iallreduce(MPI_IN_PLACE, stats.get(), 2, MPI_FLOAT, MPI_MAX, comm, &reqs[0]);
    int left = (rank + size - 1) % size, right = (rank + 1) % size, halo_in = -1, halo_out = rank;
    MPI_Irecv(&halo_in, 1, MPI_INT, left, 7, MPI_COMM_WORLD, &reqs[1]);
    MPI_Isend(&halo_out, 1, MPI_INT, right, 7, MPI_COMM_WORLD, &reqs[2]);
    MPI_Waitall(3, reqs, MPI_STATUSES_IGNORE);
    stats.check("iallreduce", std::vector<float>(2, static_cast<float>(size)));
    expect("halo", std::vector<int>{halo_in}, std::vector<int>{left});

    // Batch sizes, then a step barrier.
    std::vector<int> sz(p, -1), sz_want(p);
    sz[r] = rank + it;
    for (size_t q = 0; q < p; ++q) sz_want[q] = static_cast<int>(q) + it;
    sizes.put(sz);
    before_collective();
    MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, sizes.get(), 1, MPI_INT, comm);
    sizes.check("allgather", sz_want);
    MPI_Barrier(comm);
    end_step();
  }
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

#if STREAMCOLL_HAVE_CUDA
  if (g_stream.on) {
    if (g_stream.attached) streamcoll_comm_detach_stream(comm);
    MPI_Comm_free(&comm);
    cudaStreamDestroy(g_stream.s);
    if (g_stream.lib) cudaLibraryUnload(g_stream.lib);
    g_stream.pinned.release();
  }
#endif

  int errors = 0;
  MPI_Allreduce(&g_errors, &errors, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) {
    std::printf("demo: %d steps in %.1f ms on rank 0 (checks included)\n", iters, ms);
    std::printf("demo: %s\n", errors ? "WRONG RESULTS (see above)" : "all results verified");
  }
  MPI_Finalize();
  return errors ? 1 : 0;
}
