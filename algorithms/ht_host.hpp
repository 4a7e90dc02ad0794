// Route ht's host side (algorithms/ht.cpp): per communicator the private duplicate, tags,
// the order of MPI-collective starts and a cache of schedules (HtComm); the host
// collective of one call in the schedule's terms (HostCall), run blocking on the calling
// thread or one non-blocking step at a time on the progress thread (HostPart, HostTask).
// Internal to route ht (ht.cpp, ht_staged.cpp, ht_stream.cpp).
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "algorithms/route.hpp"
#include "algorithms/schedule.hpp"
#include "algorithms/schedule_exec.hpp"
#include "core/engine_request.hpp"
#include "core/private_comm.hpp"
#include "core/progress.hpp"
#include "core/service.hpp"

namespace streamcoll::ht_detail {

using sched::Algo;

// The algorithm of a call with its parameters (the tuning table's algo= and chunk=).
struct AlgoSel {
  Algo algo = Algo::rd;
  uint64_t chunk_bytes = 0;  // ccube: bytes per chunk (0: kCcubeChunk)
  bool operator==(Algo a) const { return algo == a; }
  bool operator!=(Algo a) const { return algo != a; }
};

// ---------------------------------------------------------------------------------------
// Per communicator: the private duplicate, tags, the order of MPI-collective starts, and a
// cache of schedules. Shared by the context and the operations in flight, so that an
// operation outlives MPI_Comm_free of the application's communicator.

// The side streams of communicator `id` (one per GPU it used) are destroyed: it is gone.
void drop_side_streams(uint64_t id);
// Names side streams: a communicator's one (HtComm::id), a stream-ordered user's two
// (ht_stream::Streams).
extern std::atomic<uint64_t> g_next_comm_id;

struct HtComm : PrivateComm {
  const uint64_t id = g_next_comm_id.fetch_add(1);  // names its side streams
  ~HtComm() { drop_side_streams(id); }
  uint64_t next_ticket = 0;    // application thread: MPI-collective starts, in call order
  std::atomic<uint64_t> turn{0};  // the ticket allowed to start its MPI collective now
  /// The communicator context's (CommContext::async_error): where a stream-ordered
  /// operation's failure found on the engine goes, for the next call to report.
  std::shared_ptr<std::atomic<int>> async_error;

  /// The node of every rank (CommContext::node_of), for ccube's tree.
  std::vector<int> node_of;

  std::mutex cache_mu;
  std::map<std::tuple<int, int, int, uint64_t, bool, uint64_t>,
           std::shared_ptr<const sched::Schedule>>
      cache;

  std::shared_ptr<const sched::Schedule> schedule(const sched::Params& p) {
    auto key = std::make_tuple(static_cast<int>(p.coll), static_cast<int>(p.algo), p.root,
                               p.count, p.in_place, p.chunk);
    std::lock_guard<std::mutex> lock(cache_mu);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    if (cache.size() >= 256) cache.clear();
    auto s = std::make_shared<const sched::Schedule>(sched::build(p));
    cache.emplace(key, s);
    return s;
  }
};

struct HtState final : RouteState {
  std::shared_ptr<HtComm> comm;
};

// What the host collective of one call needs, in the schedule's terms.
struct HostCall {
  Coll coll;
  AlgoSel algo;
  int root = 0;
  uint64_t count = 0;  // schedule.hpp's Params::count
  MPI_Datatype type;
  int extent = 0;
  MPI_Op op = MPI_OP_NULL;
  const void* send = nullptr;  // null: in place
  void* recv = nullptr;
  bool tainted = false;  // this rank's input is unusable (a local failure before the collective)
  // algo=mpi: exchange the taint with the collective (every rank alike: the agreed facts
  // say GPU memory). Without it, a tainted rank aborts the job (abort_lost_input): the
  // agreed facts said host memory, and this rank's GPU input was lost.
  bool status = false;
};

// The error a rank reports after its host collective: its own failure first, else a
// peer's that reached it (taint), else success.
int outcome(int own, int collective, bool tainted);

// The host collective of `h` on the calling thread, blocking: a schedule on hc's private
// communicator, or the MPI's collective on the application's `comm` (in call order there;
// with h.status followed by the failure flags' allreduce there). Returns the MPI's error,
// or, for a rank whose result a tainted peer spoiled, Failure::peer (outcome()).
int run_blocking(const HostCall& h, HtComm& hc, MPI_Comm comm);

// The host collective of one operation, advanced one non-blocking step at a time: a
// schedule, or the MPI's collective started in ticket order.
// With h.status (algo=mpi), the failure flags' MPI_Iallreduce starts with the collective,
// at the same ticket, so every rank starts the two in the same order.
class HostPart {
 public:
  HostPart(std::shared_ptr<HtComm> c, const HostCall& h);
  ~HostPart();

  /// This rank's input turned out unusable (a failure on the stream before the
  /// collective): called before the first step().
  void taint() {
    h_.tainted = true;
    if (run_) run_->taint();
  }
  /// After *done: whether the result is spoiled (this rank's or a peer's taint).
  bool tainted() const { return run_ ? run_->tainted() : (h_.tainted || flags_.agreed != 0); }

  /// Non-blocking; *done when finished. Returns an MPI error code.
  int step(bool* done);

 private:
  std::shared_ptr<HtComm> comm_;
  HostCall h_;
  std::unique_ptr<sched::ScheduleRun> run_;
  uint64_t ticket_ = 0;
  bool started_ = false;
  MPI_Request reqs_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};  // the collective, the flags
  service::Flag flags_;  // the failure flags' exchange
};

class HostTask final : public progress::Task {
 public:
  HostTask(std::unique_ptr<HostPart> part, HostRequest* req)
      : part_(std::move(part)), req_(req) {}
  const char* what() const override { return "ht: host collective (progress thread)"; }
  bool step() override;

 private:
  std::unique_ptr<HostPart> part_;
  HostRequest* req_;  // deleted by MPI once complete and waited for
};

// ---------------------------------------------------------------------------------------
// The call in the schedule's terms.

// ccube is an allreduce: the other collectives of an algo=ccube rule take the default.
AlgoSel choose_algo(const CollArgs& a, const config::RouteChoice& choice, uint64_t bytes,
                    int size);

// Bytes per element. The route only gets predefined contiguous types (core/eligibility),
// whose extent is their size: the datatype table has it, no MPI call needed.
int element_size(const CollArgs& a);

// The host collective of a call: on the caller's buffers, or, with `staging`, in place on
// a staging buffer that holds the call's whole vector (for reduce on a non-root rank the
// staging buffer is the input and there is no result).
HostCall host_call(const CollArgs& a, AlgoSel algo, int rank, int extent, void* staging = nullptr);

}  // namespace streamcoll::ht_detail
