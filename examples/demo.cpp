// streamcoll demo: the collective pattern of a data-parallel training step, written as
// an ordinary CUDA-aware MPI program that knows nothing of streamcoll. Run it under the
// shim (scripts/demo.sh) to see every call intercepted and routed.
//
//   demo [--iters N] [--count N] [--host]
//
// Buffers are on the GPU when one is present (and --host is not given), on the host
// otherwise. Every result is checked against a value computed locally; the program
// exits nonzero on a wrong result.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#if STREAMCOLL_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace {

bool g_device = false;

// A buffer of T, on the GPU or the host, filled and read through host vectors.
template <class T>
class Buffer {
 public:
  explicit Buffer(size_t n) : n_(n) {
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
  void put(const std::vector<T>& v) { copy(p_, v.data(), v.size()); }
  std::vector<T> read() const {
    std::vector<T> v(n_);
    copy(v.data(), p_, n_);
    return v;
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
  size_t n_;
};

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

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  int iters = 20, count = 1 << 16;
  bool host = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--iters" && i + 1 < argc) iters = std::atoi(argv[++i]);
    else if (a == "--count" && i + 1 < argc) count = std::atoi(argv[++i]);
    else if (a == "--host") host = true;
  }
#if STREAMCOLL_HAVE_CUDA
  int ndev = 0;
  if (!host && cudaGetDeviceCount(&ndev) == cudaSuccess && ndev > 0) {
    cudaSetDevice(rank % ndev);
    g_device = true;
  }
#endif
  (void)host;
  if (rank == 0)
    std::printf("demo: %d ranks, %d iterations, %d floats per gradient, %s buffers\n", size,
                iters, count, g_device ? "device" : "host");

  const size_t n = static_cast<size_t>(count);
  const size_t p = static_cast<size_t>(size);
  Buffer<float> grad(n), params(n), shard(n / p + 1), stats(2 * p);
  Buffer<int> tokens(p * 4), routed(p * 4), sizes(p);

  for (int it = 0; it < iters; ++it) {
    // Gradients: every rank contributes rank + it + (i % 5); the sum is known.
    std::vector<float> g(n), want(n);
    for (size_t i = 0; i < n; ++i) {
      g[i] = static_cast<float>(rank + it + static_cast<int>(i % 5));
      want[i] = static_cast<float>(size * (it + static_cast<int>(i % 5)) + size * (size - 1) / 2);
    }
    grad.put(g);
    MPI_Allreduce(MPI_IN_PLACE, grad.get(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    expect("allreduce", grad.read(), want);

    // Parameters from a rotating root.
    const int root = it % size;
    std::vector<float> prm(n, static_cast<float>(rank == root ? it * 2 + 1 : -1));
    params.put(prm);
    MPI_Bcast(params.get(), count, MPI_FLOAT, root, MPI_COMM_WORLD);
    expect("bcast", params.read(), std::vector<float>(n, static_cast<float>(it * 2 + 1)));

    // Sharded optimizer step: reduce-scatter the gradients, all-gather the shards.
    const int block = count / size;
    grad.put(g);
    MPI_Reduce_scatter_block(grad.get(), shard.get(), block, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    std::vector<float> shard_want(want.begin() + rank * block, want.begin() + (rank + 1) * block);
    auto got_shard = shard.read();
    got_shard.resize(static_cast<size_t>(block));
    expect("reduce_scatter_block", got_shard, shard_want);
    std::vector<float> gathered(n, -1.0f);
    std::copy(got_shard.begin(), got_shard.end(), gathered.begin() + rank * block);
    params.put(gathered);
    MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, params.get(), block, MPI_FLOAT,
                  MPI_COMM_WORLD);
    auto full = params.read();
    full.resize(static_cast<size_t>(block) * p);
    expect("allgather", full, std::vector<float>(want.begin(), want.begin() + block * size));

    // Mixture-of-experts style token exchange.
    std::vector<int> tok(p * 4), tok_want(p * 4);
    for (size_t d = 0; d < p; ++d)
      for (size_t k = 0; k < 4; ++k) {
        tok[d * 4 + k] = rank * 1000 + static_cast<int>(d * 10 + k);
        tok_want[d * 4 + k] = static_cast<int>(d) * 1000 + rank * 10 + static_cast<int>(k);
      }
    tokens.put(tok);
    MPI_Alltoall(tokens.get(), 4, MPI_INT, routed.get(), 4, MPI_INT, MPI_COMM_WORLD);
    expect("alltoall", routed.read(), tok_want);

    // Loss and norm statistics, overlapped with a halo exchange.
    std::vector<float> st(2, static_cast<float>(rank + 1));
    stats.put(st);
    MPI_Request reqs[3];
    MPI_Iallreduce(MPI_IN_PLACE, stats.get(), 2, MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD, &reqs[0]);
    int left = (rank + size - 1) % size, right = (rank + 1) % size, halo_in = -1, halo_out = rank;
    MPI_Irecv(&halo_in, 1, MPI_INT, left, 7, MPI_COMM_WORLD, &reqs[1]);
    MPI_Isend(&halo_out, 1, MPI_INT, right, 7, MPI_COMM_WORLD, &reqs[2]);
    MPI_Waitall(3, reqs, MPI_STATUSES_IGNORE);
    auto st_got = stats.read();
    st_got.resize(2);
    expect("iallreduce", st_got, std::vector<float>(2, static_cast<float>(size)));
    expect("halo", std::vector<int>{halo_in}, std::vector<int>{left});

    // Batch sizes, then a step barrier.
    std::vector<int> sz(p, -1), sz_want(p);
    sz[static_cast<size_t>(rank)] = rank + it;
    for (size_t r = 0; r < p; ++r) sz_want[r] = static_cast<int>(r) + it;
    sizes.put(sz);
    MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, sizes.get(), 1, MPI_INT, MPI_COMM_WORLD);
    expect("allgather", sizes.read(), sz_want);
    MPI_Barrier(MPI_COMM_WORLD);
  }

  int errors = 0;
  MPI_Allreduce(&g_errors, &errors, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0)
    std::printf("demo: %s\n", errors ? "WRONG RESULTS (see above)" : "all results verified");
  MPI_Finalize();
  return errors ? 1 : 0;
}
