// Route nccl's interfaces for other routes: its class, which a route running an operation
// of its own on nccl's NCCL communicators extends (route ccube); its failure handling,
// for routes that run NCCL operations as stages of their own (blueconnect; see
// algorithms/nccl.cpp, "Failures stay collective"); and GPU memory for fusion's messages
// packed on the GPU. Only in builds with NCCL (STREAMCOLL_HAVE_NCCL); call from threads
// that may call MPI.
#pragma once

#include <cuda.h>
#include <nccl.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "algorithms/route.hpp"
#include "core/comm_context.hpp"

namespace streamcoll {

namespace nccl {
class NcclComm;
}

/// Route nccl (algorithms/nccl.cpp): the collective on the communicator's NCCL
/// communicator, set up at its first blocking call. A route that runs an operation of
/// its own on those communicators (route ccube, algorithms/ccube.cpp) is this class with
/// its RouteId and three hooks: which calls it takes, what this rank needs beyond nccl's
/// conditions, and the operation it enqueues. Everything else (the set-up and its
/// agreement, a rank's buffers elsewhere staged through the GPU, classic and
/// stream-ordered semantics, the collective failure path, the requests) is route nccl's.
/// One instance per route and process; thread-safe as every route.
class NcclRoute : public Route {
 public:
  /// An operation enqueued in place of NCCL's own collective: `enqueue` puts it on stream
  /// `s` over `c`'s NCCL communicator and returns the NCCL result, *cu the first failed
  /// CUDA call (left as it is when none failed); never waits on the host. `param` and
  /// `kernel` are the subclass's (prepare() sets them).
  struct Own {
    ncclResult_t (*enqueue)(const CollArgs& a, const CommContext& ctx, const nccl::NcclComm& c,
                            CUstream s, const Own& own, CUresult* cu) = nullptr;
    uint64_t param = 0;
    CUfunction kernel = nullptr;
  };

  explicit NcclRoute(RouteId id) : id_(id) {}
  RouteId id() const final { return id_; }
  bool adapts(const CollArgs& a, CommContext& ctx, const config::RouteChoice& choice,
              const CallEnv& agreed) final;
  bool accepts(const CollArgs& a, CommContext& ctx, const config::RouteChoice& choice,
               const CallEnv& agreed) final;
  bool able_here(const CollArgs& a, CommContext& ctx, const CallEnv& local) final;
  int run(const CollArgs& a, CommContext& ctx, const config::RouteChoice& choice,
          const CallEnv& env) final;

 protected:
  /// Whether the route takes `a` at all, besides NCCL's support of it: from the call's
  /// arguments only (equal on every rank). Route nccl: yes.
  virtual bool takes(const CollArgs& a) const {
    (void)a;
    return true;
  }
  /// This rank's own check beyond route nccl's (able_here: local, never blocking), with
  /// the GPU the call would run on (`device`: the NCCL communicator's, or before it is
  /// set up the buffer's; -1 for managed memory then). Route nccl: yes.
  virtual bool able_beyond(const CollArgs& a, const CallEnv& local, int device) {
    (void)a, (void)local, (void)device;
    return true;
  }
  /// The operation for `a` on GPU `device` with the rule's parameters `choice`:
  /// own->enqueue left null runs NCCL's own collective. False (with *why) fails the call
  /// on every rank through route nccl's failure path. Route nccl: its own collective.
  virtual bool prepare(const CollArgs& a, const config::RouteChoice& choice, int device,
                       Own* own, std::string* why) {
    (void)a, (void)choice, (void)device, (void)own, (void)why;
    return true;
  }

 private:
  RouteId id_;
};

}  // namespace streamcoll

namespace streamcoll::nccl_stage {

/// This rank cannot take its part in an operation on `ctx`'s NCCL communicator (route
/// nccl set up there): abort it and tell the peers, so that their kernels end too and
/// they report an error. Nothing happens where route nccl has no communicator.
void fail_collectively(CommContext& ctx, int rc, const std::string& why);

/// Waits on the host until stream `stream` (a CUstream of the current CUDA context) is
/// idle, polling the failure notices and asynchronous errors of the NCCL communicators
/// of `ctxs` (a peer that failed makes this rank abort, which ends its kernels). Returns
/// MPI_SUCCESS, or an error code when the wait failed or one of them is aborted.
int wait_stream(const std::vector<CommContext*>& ctxs, void* stream);

/// GPU memory for a message route nccl will run on `ctx` (a fused message packed on the
/// GPU, algorithms/fusion.hpp): `bytes` (> 0) bytes on the GPU route nccl runs ctx's
/// operations on (*device: its ordinal), freed when the last copy of the pointer goes,
/// by which time the operation on it and every copy from or to it must be complete.
/// Null: route nccl is not set up on `ctx`, or the memory cannot be had. Local and
/// never waits for other ranks.
std::shared_ptr<void> device_buffer(CommContext& ctx, uint64_t bytes, int* device);

}  // namespace streamcoll::nccl_stage
