// Route ht's host side: the host collective of one call in the schedule's terms, run
// blocking on the calling thread or one non-blocking step at a time on the progress
// thread (algorithms/ht_host.hpp).
#include "algorithms/ht_host.hpp"

#include <algorithm>

#include "base/log.hpp"
#include "core/datatypes.hpp"
#include "core/errors.hpp"

namespace streamcoll::ht_detail {
namespace {

// ccube's chunk when the table gives none (docs/guide.md, "C-Cube").
constexpr uint64_t kCcubeChunk = 256 * 1024;

// The schedule's parameters for `h` on `hc`.
sched::Params schedule_params(const HostCall& h, const HtComm& hc) {
  sched::Params p{h.coll, h.algo.algo, hc.rank, hc.size, h.root, h.count, h.send == nullptr};
  if (h.algo == Algo::ccube) {
    p.chunk = std::max<uint64_t>(1, h.algo.chunk_bytes / static_cast<uint64_t>(std::max(h.extent, 1)));
    p.node_of = &hc.node_of;
  }
  return p;
}

// Starts the MPI's own non-blocking collective for `h` on `comm`.
int start_mpi(const HostCall& h, MPI_Comm comm, MPI_Request* req) {
  const void* s = h.send ? h.send : MPI_IN_PLACE;
  const int n = static_cast<int>(h.count);
  switch (h.coll) {
    case Coll::allreduce: return PMPI_Iallreduce(s, h.recv, n, h.type, h.op, comm, req);
    case Coll::reduce: return PMPI_Ireduce(s, h.recv, n, h.type, h.op, h.root, comm, req);
    case Coll::bcast: return PMPI_Ibcast(h.recv, n, h.type, h.root, comm, req);
    case Coll::allgather:
      return PMPI_Iallgather(s, h.send ? n : 0, h.type, h.recv, n, h.type, comm, req);
    case Coll::reduce_scatter_block:
      return PMPI_Ireduce_scatter_block(s, h.recv, n, h.type, h.op, comm, req);
    default: return MPI_ERR_INTERN;
  }
}

// The MPI's own blocking collective for `h` on `comm`. (Blocking, as the host path's
// run_pmpi is: ranks of one call may take either, and MPI matches a blocking collective
// with a blocking one only.)
int call_mpi(const HostCall& h, MPI_Comm comm) {
  const void* s = h.send ? h.send : MPI_IN_PLACE;
  const int n = static_cast<int>(h.count);
  switch (h.coll) {
    case Coll::allreduce: return PMPI_Allreduce(s, h.recv, n, h.type, h.op, comm);
    case Coll::reduce: return PMPI_Reduce(s, h.recv, n, h.type, h.op, h.root, comm);
    case Coll::bcast: return PMPI_Bcast(h.recv, n, h.type, h.root, comm);
    case Coll::allgather:
      return PMPI_Allgather(s, h.send ? n : 0, h.type, h.recv, n, h.type, comm);
    case Coll::reduce_scatter_block:
      return PMPI_Reduce_scatter_block(s, h.recv, n, h.type, h.op, comm);
    default: return MPI_ERR_INTERN;
  }
}

MPI_Datatype call_type(const CollArgs& a) {
  return a.coll == Coll::allgather ? a.recvtype : a.datatype;
}

uint64_t call_count(const CollArgs& a) {
  return a.coll == Coll::allgather ? static_cast<uint64_t>(a.recvcount)
                                   : static_cast<uint64_t>(a.count);
}

}  // namespace

std::atomic<uint64_t> g_next_comm_id{0};

int outcome(int own, int collective, bool tainted) {
  if (own != MPI_SUCCESS) return own;
  if (collective != MPI_SUCCESS) return collective;
  if (tainted) {
    log_error("ht: another rank's part of this collective failed; this rank's result is "
              "not valid");
    return error_code(Failure::peer);
  }
  return MPI_SUCCESS;
}

int run_blocking(const HostCall& h, HtComm& hc, MPI_Comm comm) {
  if (h.algo == Algo::mpi) {
    if (h.tainted && !h.status) abort_lost_input(comm, "ht", error_code(Failure::cuda));
    const int rc = call_mpi(h, comm);
    const bool any = h.status && service::any(h.tainted, comm);
    return outcome(MPI_SUCCESS, rc, any);
  }
  const sched::Params p = schedule_params(h, hc);
  sched::ScheduleRun run(hc.schedule(p), h.send, h.recv, h.type, h.extent, h.op, hc.p2p,
                         hc.tag());
  if (h.tainted) run.taint();
  const int rc = run.run();
  return outcome(MPI_SUCCESS, rc, run.tainted());
}

HostPart::HostPart(std::shared_ptr<HtComm> c, const HostCall& h) : comm_(std::move(c)), h_(h) {
  if (h.algo == Algo::mpi) {
    ticket_ = comm_->next_ticket++;
  } else {
    const sched::Params p = schedule_params(h, *comm_);
    run_ = std::make_unique<sched::ScheduleRun>(comm_->schedule(p), h.send, h.recv, h.type,
                                                h.extent, h.op, comm_->p2p, comm_->tag());
    if (h.tainted) run_->taint();
  }
}

HostPart::~HostPart() {
  for (MPI_Request& r : reqs_)
    if (r != MPI_REQUEST_NULL) PMPI_Wait(&r, MPI_STATUS_IGNORE);
}

int HostPart::step(bool* done) {
  if (run_) return run_->step(done);
  *done = false;
  if (!started_) {
    if (comm_->turn.load(std::memory_order_acquire) != ticket_) return MPI_SUCCESS;
    if (h_.tainted && !h_.status)
      abort_lost_input(comm_->p2p, "ht", error_code(Failure::cuda));
    int rc = start_mpi(h_, comm_->p2p, &reqs_[0]);
    if (h_.status) service::start_any(h_.tainted, comm_->p2p, &flags_, &reqs_[1]);
    started_ = true;
    comm_->turn.fetch_add(1, std::memory_order_release);
    if (rc != MPI_SUCCESS) {
      *done = true;
      return rc;
    }
  }
  int flag = 0;
  int rc = PMPI_Testall(2, reqs_, &flag, MPI_STATUSES_IGNORE);
  if (rc != MPI_SUCCESS || flag) *done = true;
  return rc;
}

bool HostTask::step() {
  bool done = false;
  int rc = part_->step(&done);
  if (!done) return false;
  rc = outcome(MPI_SUCCESS, rc, part_->tainted());
  part_.reset();  // its MPI request is finished before the application hears of it
  req_->finish(rc);
  return true;
}

AlgoSel choose_algo(const CollArgs& a, const config::RouteChoice& choice, uint64_t bytes,
                    int size) {
  AlgoSel sel{sched::default_algo(a.coll, bytes, size), 0};
  if (auto v = choice.param("algo")) {
    if (*v == "rd") sel.algo = Algo::rd;
    if (*v == "rabenseifner") sel.algo = Algo::rabenseifner;
    if (*v == "ring") sel.algo = Algo::ring;
    if (*v == "mpi") sel.algo = Algo::mpi;
    if (*v == "ccube" && a.coll == Coll::allreduce) sel.algo = Algo::ccube;
  }
  if (sel.algo == Algo::ccube) {
    auto c = choice.param("chunk");
    auto v = c ? config::parse_size(*c) : std::nullopt;
    sel.chunk_bytes = v && *v > 0 ? *v : kCcubeChunk;
  }
  return sel;
}

int element_size(const CollArgs& a) {
  const TypeInfo* t = find_type(call_type(a));
  return t ? t->size : 0;
}

HostCall host_call(const CollArgs& a, AlgoSel algo, int rank, int extent, void* staging) {
  HostCall h;
  h.coll = a.coll;
  h.algo = algo;
  h.root = a.root;
  h.count = call_count(a);
  h.type = call_type(a);
  h.extent = extent;
  h.op = a.op;
  if (staging) {
    h.recv = staging;
    if (a.coll == Coll::reduce) {
      // Input in the first half, the root's result in the second (plan_copies): no
      // MPI_IN_PLACE of ours reaches the MPI, which MPICH 4.0-4.1 cannot take at a root
      // other than 0 (reduce_in_place_broken).
      h.send = staging;
      h.recv = rank == a.root ? static_cast<char*>(staging) + h.count * static_cast<uint64_t>(extent)
                              : nullptr;
    }
    return h;
  }
  h.recv = a.recvbuf;
  const bool in_place = a.sendbuf == MPI_IN_PLACE && (a.coll != Coll::reduce || rank == a.root);
  h.send = (a.coll == Coll::bcast || in_place) ? nullptr : a.sendbuf;
  if (a.coll == Coll::reduce && rank != a.root) h.recv = nullptr;  // insignificant
  return h;
}

}  // namespace streamcoll::ht_detail
