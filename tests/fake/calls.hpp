// Collectives on MPI_INT with MPI_SUM whose buffers are in a chosen memory kind of the
// fake CUDA driver, each rank's input computed from (rank, index, salt), and the values
// every rank must end with computed independently on the host; plus every way to
// complete a batch of requests. Shared by the fake-driver programs whose ranks differ
// (divergent.cpp) and the failure walk (failures.cpp). Include after harness.hpp, in one
// translation unit per program.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "harness.hpp"

namespace {

enum class Mem { host, device, pinned, managed, device1 };
inline const char* mem_name(Mem m) {
  switch (m) {
    case Mem::host: return "host";
    case Mem::device: return "device";
    case Mem::pinned: return "pinned";
    case Mem::managed: return "managed";
    case Mem::device1: return "device1";
  }
  return "?";
}

// A buffer of `bytes` in memory kind `m`, filled with a sentinel byte.
class Buf {
 public:
  Buf(size_t bytes, Mem m) : bytes_(bytes ? bytes : 1), mem_(m) {
    switch (m) {
      case Mem::host: p_ = std::malloc(bytes_); break;
      case Mem::device: p_ = api.malloc(bytes_); break;
      case Mem::pinned: p_ = api.malloc_pinned(bytes_); break;
      case Mem::managed: p_ = api.malloc_managed(bytes_); break;
      case Mem::device1: p_ = api.malloc_device(1, bytes_); break;
    }
    if (!p_) {
      std::fprintf(stderr, "[rank %d] out of (fake) memory\n", g_rank);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    std::memset(p_, kSentinel, bytes_);
  }
  ~Buf() {
    if (mem_ == Mem::host) std::free(p_);
    else api.free(p_);
  }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  template <class T>
  T* as() const { return static_cast<T*>(p_); }
  void* get() const { return p_; }
  void put(const void* src, size_t n) {
    if (mem_ != Mem::host) check(api.host_access(p_, n, 1) == 0, "host write without a race");
    std::memcpy(p_, src, n);
  }
  std::vector<char> read() const {
    if (mem_ != Mem::host) check(api.host_access(p_, bytes_, 0) == 0, "result complete for the host");
    const char* c = static_cast<const char*>(p_);
    return std::vector<char>(c, c + bytes_);
  }
  static constexpr char kSentinel = 0x5a;

 private:
  void* p_ = nullptr;
  size_t bytes_;
  Mem mem_;
};

// Rank r's int input element i for a call salted `salt`.
inline int in_val(int r, size_t i, unsigned salt) { return static_cast<int>((r + 1) * 1000 + i * 7 + salt * 3) % 100003; }

enum class Kind { allreduce, reduce, bcast, allgather, rsb, alltoall };
inline const char* kind_name(Kind k) {
  static const char* n[] = {"allreduce", "reduce", "bcast", "allgather", "reduce_scatter_block",
                            "alltoall"};
  return n[static_cast<int>(k)];
}

// One collective on MPI_INT with MPI_SUM: its buffers on this rank, started by start()
// (blocking, or non-blocking with *req), verified by verify() against values computed
// here. `n` is the count per rank (per block for the gather family and rsb).
struct Call {
  Kind kind;
  size_t n;
  int root;
  bool in_place;
  unsigned salt;
  MPI_Comm comm;
  int rank, size;
  Buf* send = nullptr;
  Buf* recv = nullptr;

  size_t send_elems() const {
    switch (kind) {
      case Kind::allreduce: case Kind::reduce: case Kind::bcast: case Kind::allgather: return n;
      case Kind::rsb: case Kind::alltoall: return n * size;
    }
    return n;
  }
  size_t recv_elems() const {
    switch (kind) {
      case Kind::allreduce: case Kind::reduce: case Kind::bcast: case Kind::rsb: return n;
      case Kind::allgather: case Kind::alltoall: return n * size;
    }
    return n;
  }
  // In place, the input is in the receive buffer (rsb: the whole vector; allgather: this
  // rank's block; reduce: the root only).
  bool uses_in_place() const {
    if (!in_place) return false;
    if (kind == Kind::reduce) return rank == root;
    return kind != Kind::bcast;
  }
  size_t recv_alloc() const { return kind == Kind::rsb && uses_in_place() ? n * size : recv_elems(); }

  void prepare(Mem send_mem, Mem recv_mem) {
    if (kind != Kind::bcast && !uses_in_place()) send = new Buf(send_elems() * sizeof(int), send_mem);
    recv = new Buf(recv_alloc() * sizeof(int), recv_mem);
    std::vector<int> v;
    if (kind == Kind::bcast) {
      if (rank == root) {
        v.resize(n);
        for (size_t i = 0; i < n; ++i) v[i] = in_val(root, i, salt);
        recv->put(v.data(), v.size() * sizeof(int));
      }
      return;
    }
    v.resize(send_elems());
    for (size_t i = 0; i < v.size(); ++i) v[i] = in_val(rank, i, salt);
    if (!uses_in_place()) {
      send->put(v.data(), v.size() * sizeof(int));
    } else if (kind == Kind::allgather) {
      std::vector<char> all(recv_alloc() * sizeof(int), Buf::kSentinel);
      std::memcpy(all.data() + rank * n * sizeof(int), v.data(), n * sizeof(int));
      recv->put(all.data(), all.size());
    } else {
      recv->put(v.data(), v.size() * sizeof(int));
    }
  }

  int start(MPI_Request* req) {
    const void* s = uses_in_place() ? MPI_IN_PLACE : (send ? send->get() : nullptr);
    void* r = recv->get();
    const int c = static_cast<int>(n);
    switch (kind) {
      case Kind::allreduce:
        return req ? MPI_Iallreduce(s, r, c, MPI_INT, MPI_SUM, comm, req)
                   : MPI_Allreduce(s, r, c, MPI_INT, MPI_SUM, comm);
      case Kind::reduce:
        return req ? MPI_Ireduce(s, r, c, MPI_INT, MPI_SUM, root, comm, req)
                   : MPI_Reduce(s, r, c, MPI_INT, MPI_SUM, root, comm);
      case Kind::bcast:
        return req ? MPI_Ibcast(r, c, MPI_INT, root, comm, req) : MPI_Bcast(r, c, MPI_INT, root, comm);
      case Kind::allgather:
        return req ? MPI_Iallgather(s, c, MPI_INT, r, c, MPI_INT, comm, req)
                   : MPI_Allgather(s, c, MPI_INT, r, c, MPI_INT, comm);
      case Kind::rsb:
        return req ? MPI_Ireduce_scatter_block(s, r, c, MPI_INT, MPI_SUM, comm, req)
                   : MPI_Reduce_scatter_block(s, r, c, MPI_INT, MPI_SUM, comm);
      case Kind::alltoall:
        return req ? MPI_Ialltoall(s, c, MPI_INT, r, c, MPI_INT, comm, req)
                   : MPI_Alltoall(s, c, MPI_INT, r, c, MPI_INT, comm);
    }
    return MPI_ERR_OTHER;
  }

  // Expected receive buffer contents (as ints; kSentinel bytes where MPI writes nothing).
  std::vector<int> expected() const {
    int sentinel;
    std::memset(&sentinel, Buf::kSentinel, sizeof sentinel);
    std::vector<int> e(recv_alloc(), sentinel);
    auto sum = [&](size_t i) {
      long long t = 0;
      for (int r = 0; r < size; ++r) t += in_val(r, i, salt);
      return static_cast<int>(t);
    };
    switch (kind) {
      case Kind::allreduce:
        for (size_t i = 0; i < n; ++i) e[i] = sum(i);
        break;
      case Kind::reduce:
        if (rank == root)
          for (size_t i = 0; i < n; ++i) e[i] = sum(i);
        else if (uses_in_place())
          break;
        break;
      case Kind::bcast:
        for (size_t i = 0; i < n; ++i) e[i] = in_val(root, i, salt);
        break;
      case Kind::allgather:
        for (int r = 0; r < size; ++r)
          for (size_t i = 0; i < n; ++i) e[r * n + i] = in_val(r, i, salt);
        break;
      case Kind::rsb:
        for (size_t i = 0; i < n; ++i) e[i] = sum(rank * n + i);
        // in place: the rest of the vector stays as the caller left it (its input)
        if (uses_in_place())
          for (size_t i = n; i < n * size; ++i) e[i] = in_val(rank, i, salt);
        break;
      case Kind::alltoall:
        for (int r = 0; r < size; ++r)
          for (size_t i = 0; i < n; ++i) e[r * n + i] = in_val(r, rank * n + i, salt);
        break;
    }
    return e;
  }

  // The number of receive-buffer elements that differ from expected() (*first: the first).
  size_t wrong(size_t* first) const {
    std::vector<char> got = recv->read();
    std::vector<int> want = expected();
    size_t bad = 0;
    *first = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      int g;
      std::memcpy(&g, got.data() + i * sizeof(int), sizeof g);
      if (g != want[i] && bad++ == 0) *first = i;
    }
    return bad;
  }
  void release() {
    delete send;
    delete recv;
    send = recv = nullptr;
  }
  void verify(const std::string& label) {
    size_t first = 0;
    const size_t bad = wrong(&first);
    check(bad == 0, label + ": " + std::to_string(bad) + " wrong elements (first at " +
                        std::to_string(first) + ")");
    release();
  }
};

inline std::string label_of(const Call& c, Mem sm, Mem rm, const char* how) {
  return std::string(kind_name(c.kind)) + " n=" + std::to_string(c.n) + " root=" +
         std::to_string(c.root) + (c.in_place ? " in place" : "") + " " + how + " send=" +
         mem_name(sm) + " recv=" + mem_name(rm);
}

inline void run_blocking(Call c, Mem sm, Mem rm) {
  c.prepare(sm, rm);
  const int rc = c.start(nullptr);
  check(rc == MPI_SUCCESS, label_of(c, sm, rm, "blocking") + ": returns MPI_SUCCESS");
  c.verify(label_of(c, sm, rm, "blocking"));
}

inline Call make(Kind k, size_t n, int root, bool in_place, unsigned salt, MPI_Comm comm) {
  Call c{k, n, root, in_place, salt, comm, comm_rank(comm), comm_size(comm)};
  return c;
}


const Kind kKinds[] = {Kind::allreduce, Kind::reduce, Kind::bcast, Kind::allgather, Kind::rsb,
                       Kind::alltoall};

// Completes `reqs` with the completion call `how` (0..6).
inline void complete(std::vector<MPI_Request>& reqs, int how) {
  const int n = static_cast<int>(reqs.size());
  switch (how) {
    case 0:
      for (auto& r : reqs) check(MPI_Wait(&r, MPI_STATUS_IGNORE) == MPI_SUCCESS, "MPI_Wait");
      break;
    case 1:
      for (int i = n - 1; i >= 0; --i)
        check(MPI_Wait(&reqs[i], MPI_STATUS_IGNORE) == MPI_SUCCESS, "MPI_Wait (reverse)");
      break;
    case 2:
      check(MPI_Waitall(n, reqs.data(), MPI_STATUSES_IGNORE) == MPI_SUCCESS, "MPI_Waitall");
      break;
    case 3:
      for (int k = 0; k < n; ++k) {
        int idx = -1;
        check(MPI_Waitany(n, reqs.data(), &idx, MPI_STATUS_IGNORE) == MPI_SUCCESS, "MPI_Waitany");
      }
      break;
    case 4: {
      int left = n;
      std::vector<int> idx(n);
      while (left > 0) {
        int out = 0;
        check(MPI_Waitsome(n, reqs.data(), &out, idx.data(), MPI_STATUSES_IGNORE) == MPI_SUCCESS,
              "MPI_Waitsome");
        if (out == MPI_UNDEFINED) break;
        left -= out;
      }
      break;
    }
    case 5:  // polling loops: one check per loop, not per poll
      for (auto& r : reqs) {
        int flag = 0, rc = MPI_SUCCESS;
        while (!flag && rc == MPI_SUCCESS) rc = MPI_Test(&r, &flag, MPI_STATUS_IGNORE);
        check(rc == MPI_SUCCESS, "MPI_Test");
      }
      break;
    default: {
      int flag = 0, rc = MPI_SUCCESS;
      while (!flag && rc == MPI_SUCCESS) rc = MPI_Testall(n, reqs.data(), &flag, MPI_STATUSES_IGNORE);
      check(rc == MPI_SUCCESS, "MPI_Testall");
    }
  }
  for (auto& r : reqs) check(r == MPI_REQUEST_NULL, "request freed by its completion");
}

}  // namespace
