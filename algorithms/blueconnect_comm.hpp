// Route blueconnect's per-communicator state (algorithms/blueconnect.cpp): the levels'
// backends, a hierarchy's layout on a communicator (its sub-communicators and tickets, and
// for GPU buffers the levels' contexts, streams and events), the stages of a call shape,
// and the stream-ordered calls' outcome exchanges. Internal to the route's files.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "algorithms/blueconnect_plan.hpp"
#include "algorithms/route.hpp"
#include "algorithms/schedule.hpp"
#include "base/types.hpp"
#include "core/comm_context.hpp"
#include "core/cuda_driver.hpp"
#include "core/private_comm.hpp"
#include "core/service.hpp"
#include "core/topology.hpp"

namespace streamcoll::bc_detail {

enum class Backend : uint8_t { sched, mpi, nccl, nvgroup, ht };

// The backend of `level`: one per level, innermost first; the last serves every level
// above the list's end (so one name serves them all).
inline Backend backend_at(const std::vector<Backend>& b, int level) {
  return b[std::min(static_cast<size_t>(level), b.size() - 1)];
}

// One hierarchy in use on a communicator, with what the mpi backend needs.
struct Layout {
  topo::Hierarchy h;
  bool identity_slots = true;  // tree slot of every rank's position == rank
  std::vector<MPI_Comm> sub;   // per level, MPI_COMM_NULL until the mpi backend needs it
  std::vector<uint64_t> next_ticket;                   // application thread
  std::unique_ptr<std::atomic<uint64_t>[]> turn;       // per level: ticket allowed to start
  // GPU buffers: a route (nccl, nvgroup, ht) on each level's sub-communicator.
  enum Ready : uint8_t { unset, ready, off };
  Ready gpu = unset;  // the sub-communicators, their contexts, the device, the classic stream
  std::map<std::pair<int, Backend>, Ready> stage_ready;  // per level and backend, agreed
  std::vector<CommContext*> sub_ctx;  // the sub-communicators' contexts (owned by MPI)
#if STREAMCOLL_HAVE_CUDA
  int device = -1;
  CUdevice cudev = 0;
  CUcontext cuctx = nullptr;  // the device's primary context (retained)
  CUstream classic = nullptr; // classic calls: ordered after the legacy default stream
  CUevent legacy = nullptr;   // ... through this event (cuda::wait_for_legacy)
  // Recorded behind each GPU call's work on this rank: the next call, on another stream
  // (classic after stream-ordered, or another attached stream), waits for it, so that
  // the levels' operations of this communicator run in call order on every rank.
  CUevent last = nullptr;
  CUstream last_stream = nullptr;  // where `last` was recorded; null: not yet
  void* staging = nullptr;    // pinned host memory for host stages (classic calls only)
  uint64_t staging_bytes = 0;

  /// Pinned staging of at least `bytes`, or nullptr; the caller has cuctx current.
  char* pinned(uint64_t bytes);
#endif

  explicit Layout(topo::Hierarchy hier);
  ~Layout();
  bool has_subs() const { return sub.empty() || sub[0] != MPI_COMM_NULL; }

  // Collective over p2p: one sub-communicator per level, ranks ordered by coordinate.
  bool make_subs(MPI_Comm p2p, int rank);
};

// The stages of one call shape, built once and cached.
struct Prepared {
  bc::Plan plan;
  std::vector<std::shared_ptr<const sched::Schedule>> rs, ag;  // per stage (sched backend)
  std::vector<std::vector<int>> counts, displs;  // per stage, mpi backend: in elements,
                                                 // displs relative to the segment
  uint64_t scratch_elems = 0;                    // largest own block (mpi reduce-scatter)
};

// Per communicator; shared with the operations in flight, so that they outlive
// MPI_Comm_free of the application's communicator.
struct BcComm : PrivateComm {
  bool discovery_done = false;
  std::optional<topo::Hierarchy> discovered;
  std::string why_not;    // why there is no discovered hierarchy
  bool told = false;      // the reason was logged

  std::mutex mu;
  std::map<std::string, std::shared_ptr<Layout>> layouts;  // by hierarchy source
  std::map<std::tuple<const Layout*, int, uint64_t, bool, bool>, std::shared_ptr<const Prepared>>
      prepared;

  // Stream-ordered calls' outcomes (GpuCall::finish): each rank's failure flag, MAX-reduced
  // over p2p by an MPI_Iallreduce that no call waits for (a peer may sit in
  // cudaStreamSynchronize, making no MPI progress, behind work that needs this rank's next
  // call), completed at a later call of this communicator (take_outcomes, RouteState::
  // poll) or at MPI_Finalize (blueconnect_release). Every rank starts them in call order.
  struct Outcome {
    service::Flag flag;
    MPI_Request req = MPI_REQUEST_NULL;
  };
  std::mutex outcomes_mu;
  std::list<Outcome> outcomes;

  // Starts the exchange of this rank's flag.
  int exchange_outcome(int mine);

  // The earlier exchanges that have completed: a peer's failure in one of them is
  // reported once, as an earlier stream-ordered call's.
  int take_outcomes();

  ~BcComm();

  std::shared_ptr<const Prepared> prepare(const std::shared_ptr<Layout>& lay, Coll coll,
                                          uint64_t vec, bool from_send, bool ring_only);
};

struct BcState final : RouteState {
  std::shared_ptr<BcComm> comm;
  // Stream-ordered calls' outcome exchanges still open (BcComm::take_outcomes).
  int poll(bool* pending) override;
};

// The bytes of one element of `t` (core/datatypes.hpp), or 0 when it is not known there.
int element_size(MPI_Datatype t);

}  // namespace streamcoll::bc_detail
