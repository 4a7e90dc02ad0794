// Route nccl's parts (algorithms/nccl.cpp holds the route class and its stage interface;
// its file comment says how the route works): what they share.
//   nccl_setup.cpp    a communicator's NCCL state and its collective set-up (steps 1 and 2
//                     of the file comment), and the splits made at communicator
//                     constructors (nccl_derive)
//   nccl_enqueue.cpp  a call's NCCL operation (enqueue), a staged call (run_staged) and the
//                     MPI_I* requests' steps (nccl_steps)
// Only in builds with NCCL.
#pragma once

#include <cuda.h>
#include <nccl.h>

#include <functional>
#include <memory>

#include "algorithms/nccl.hpp"
#include "algorithms/nccl_comm.hpp"
#include "algorithms/route.hpp"
#include "core/call_request.hpp"
#include "core/cuda_driver.hpp"
#include "core/coll_args.hpp"
#include "core/comm_context.hpp"
#include "core/datatypes.hpp"

namespace streamcoll::nccl_detail {

// The names route nccl's files use (all three: nccl.cpp through `using namespace`): the
// driver, and the NCCL communicators, their watchdog, pool and reaper (algorithms/nccl_comm).
using cuda::driver;
using cuda::ScopedContext;

// The NCCL communicators, their watchdog, pool and reaper: algorithms/nccl_comm.
using nccl::g_live_nccl;
using nccl::NcclComm;
using nccl::Pool;
using nccl::Reaper;
using nccl::Watchdog;

class NcclState final : public RouteState {
 public:
  enum Status { unset, ready, off };
  Status status = unset;
  std::shared_ptr<nccl::NcclComm> comm;
  ~NcclState() override { nccl::Pool::get().give_back(std::move(comm)); }  // an MPI thread
};

/// ctx's NCCL state (route nccl's slot), made unset at the first ask.
NcclState& state_of(CommContext& ctx);

/// The collective set-up (nccl_setup.cpp): every rank reaches it at the same call; st is
/// then ready with an NCCL communicator, reused or new, or off.
void set_up(NcclState& st, const CallEnv& env, const CommContext& ctx);

/// The type a call's buffers are counted in: the reduction family's and bcast's
/// datatype, the others' receive type.
inline const TypeInfo* call_type(const CollArgs& a) {
  return find_type(takes_op(a.coll) || a.coll == Coll::bcast ? a.datatype : a.recvtype);
}

/// Enqueues the collective on `s` (nccl_enqueue.cpp; `own`: a subclass's operation in
/// its place). Returns the NCCL result; *cu gets a CUDA failure of the copies and kernels
/// around it.
ncclResult_t enqueue(const CollArgs& a, const CommContext& ctx, const nccl::NcclComm& c,
                     CUstream s, CUresult* cu, const NcclRoute::Own* own = nullptr);

/// A call whose buffers on this rank are not on the NCCL communicator's GPU, staged
/// through it (nccl_enqueue.cpp, its comment).
int run_staged(const CollArgs& a, const CommContext& ctx, const std::shared_ptr<nccl::NcclComm>& c,
               const NcclRoute::Own* own, const CallEnv& env);

/// A non-blocking call in flight, as a request's steps (nccl_enqueue.cpp).
CallSteps nccl_steps(std::shared_ptr<nccl::NcclComm> c, CUevent done, bool stream_mode, CUstream user,
                     std::function<int()> after = nullptr);

}  // namespace streamcoll::nccl_detail
