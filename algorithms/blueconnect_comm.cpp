// Route blueconnect's per-communicator state (blueconnect_comm.hpp): a hierarchy's layout
// and its sub-communicators, the cached stages of a call shape, and the stream-ordered
// calls' outcome exchanges, with those left open by a gone communicator (waited for at
// MPI_Finalize, blueconnect_release).
#include "algorithms/blueconnect_comm.hpp"

#include <mpi.h>

#include <list>
#include <mutex>
#include <vector>

#include "base/log.hpp"
#include "core/cuda_driver.hpp"
#include "core/datatypes.hpp"
#include "core/errors.hpp"
#include "core/service.hpp"

namespace streamcoll {
namespace bc_detail {

#if STREAMCOLL_HAVE_CUDA
char* Layout::pinned(uint64_t bytes) {
  if (bytes > staging_bytes) {
    if (staging) SC_CU_TOLERATE(cuda::driver().cuMemFreeHost(staging));
    staging = nullptr;
    staging_bytes = 0;
    if (SC_CU_RESULT(cuda::driver().cuMemHostAlloc(&staging, std::max<uint64_t>(bytes, 1), 0)) !=
        CUDA_SUCCESS)  // the caller's to handle (pageable memory)
      return staging = nullptr, nullptr;
    staging_bytes = bytes;
  }
  return static_cast<char*>(staging);
}
#endif

Layout::Layout(topo::Hierarchy hier) : h(std::move(hier)) {
  const size_t L = static_cast<size_t>(h.levels());
  sub.assign(L, MPI_COMM_NULL);
  next_ticket.assign(L, 0);
  turn.reset(new std::atomic<uint64_t>[L]);
  for (size_t i = 0; i < L; ++i) turn[i].store(0);
  for (int r = 0; r < h.ranks(); ++r)
    identity_slots = identity_slots &&
                     bc::tree_slot(h.factors, h.position_of[static_cast<size_t>(r)]) == r;
}

Layout::~Layout() {
  for (MPI_Comm& c : sub)
    if (c != MPI_COMM_NULL) PMPI_Comm_free(&c);  // frees their contexts too
#if STREAMCOLL_HAVE_CUDA
  if (classic || legacy || last || staging) {
    cuda::ScopedContext scope(cuctx);
    if (classic) SC_CU_TOLERATE(cuda::driver().cuStreamDestroy(classic));
    if (legacy) SC_CU_TOLERATE(cuda::driver().cuEventDestroy(legacy));
    if (last) SC_CU_TOLERATE(cuda::driver().cuEventDestroy(last));
    if (staging) SC_CU_TOLERATE(cuda::driver().cuMemFreeHost(staging));
  }
  if (cuctx) SC_CU_TOLERATE(cuda::driver().cuDevicePrimaryCtxRelease(cudev));
#endif
}

bool Layout::make_subs(MPI_Comm p2p, int rank) {
  const int pos = h.position_of[static_cast<size_t>(rank)];
  int stride = 1;
  for (int l = 0; l < h.levels(); ++l) {
    const int m = h.factors[static_cast<size_t>(l)];
    const int c = (pos / stride) % m;
    if (PMPI_Comm_split(p2p, pos - c * stride, c, &sub[static_cast<size_t>(l)]) != MPI_SUCCESS) {
      sub[static_cast<size_t>(l)] = MPI_COMM_NULL;
      return false;
    }
    PMPI_Comm_set_errhandler(sub[static_cast<size_t>(l)], MPI_ERRORS_RETURN);
    stride *= m;
  }
  return true;
}

int BcComm::exchange_outcome(int mine) {
  std::lock_guard<std::mutex> lock(outcomes_mu);
  Outcome& o = outcomes.emplace_back();
  if (service::start_any(mine != 0, p2p, &o.flag, &o.req) != MPI_SUCCESS) {
    outcomes.pop_back();
    return fail(Failure::peer, "blueconnect: the outcome exchange could not start");
  }
  return MPI_SUCCESS;
}

int BcComm::take_outcomes() {
  std::lock_guard<std::mutex> lock(outcomes_mu);
  int rc = MPI_SUCCESS;
  for (auto it = outcomes.begin(); it != outcomes.end();) {
    int done = 0;
    const int trc = PMPI_Test(&it->req, &done, MPI_STATUS_IGNORE);
    if (trc == MPI_SUCCESS && !done) {
      ++it;
      continue;
    }
    if ((trc != MPI_SUCCESS || (it->flag.agreed && !it->flag.mine)) && rc == MPI_SUCCESS)
      rc = fail(Failure::peer, "blueconnect: another rank's part of an earlier stream-ordered "
                               "call on this communicator failed; its result is not valid");
    it = outcomes.erase(it);
  }
  return rc;
}

std::shared_ptr<const Prepared> BcComm::prepare(const std::shared_ptr<Layout>& lay, Coll coll,
                                                uint64_t vec, bool from_send, bool ring_only) {
  auto key = std::make_tuple(lay.get(), static_cast<int>(coll), vec, from_send, ring_only);
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = prepared.find(key); it != prepared.end()) return it->second;
  auto p = std::make_shared<Prepared>();
  p->plan = bc::plan(lay->h, rank, vec, ring_only);
  for (size_t i = 0; i < p->plan.stages.size(); ++i) {
    const bc::Stage& st = p->plan.stages[i];
    p->rs.push_back(std::make_shared<const sched::Schedule>(
        sched::build_stage_reduce_scatter(st, from_send && i == 0)));
    p->ag.push_back(std::make_shared<const sched::Schedule>(sched::build_stage_all_gather(st)));
    std::vector<int> c, d;
    for (int j = 0; j < st.size(); ++j) {
      c.push_back(static_cast<int>(st.block_len(j)));
      d.push_back(static_cast<int>(st.block_off(j) - st.seg_off));
    }
    p->counts.push_back(std::move(c));
    p->displs.push_back(std::move(d));
    p->scratch_elems = std::max(p->scratch_elems, st.block_len(st.me));
  }
  if (prepared.size() >= 256) prepared.clear();
  prepared.emplace(key, p);
  return p;
}

namespace {

// Outcome exchanges still open when their communicator went, with the duplicate they run
// on (freeing it under a pending exchange crashes Open MPI 4.1's libnbc, and waiting for
// them there could wait for a peer that makes no MPI call before it needs this rank's
// next one): waited for, and the duplicates freed, at MPI_Finalize, where every rank is
// in MPI (blueconnect_release).
std::mutex g_orphans_mu;
std::list<BcComm::Outcome> g_orphans;
std::vector<MPI_Comm> g_orphan_comms;

}  // namespace

BcComm::~BcComm() {
  take_outcomes();  // (the finished ones; their failures have no call left to report them)
  layouts.clear();  // the levels' communicators before the duplicate
  if (outcomes.empty()) return;
  std::lock_guard<std::mutex> lock(g_orphans_mu);
  g_orphans.splice(g_orphans.end(), outcomes);  // (the nodes, and so the buffers, move)
  g_orphan_comms.push_back(p2p);
  p2p = MPI_COMM_NULL;  // not freed by ~PrivateComm
}

int BcState::poll(bool* pending) {
  const int rc = comm->take_outcomes();
  std::lock_guard<std::mutex> lock(comm->outcomes_mu);
  *pending = !comm->outcomes.empty();
  return rc;
}

int element_size(MPI_Datatype t) {
  const TypeInfo* info = find_type(t);
  return info ? info->size : 0;
}

}  // namespace bc_detail

void blueconnect_release() {
  using namespace bc_detail;
  std::lock_guard<std::mutex> lock(g_orphans_mu);
  for (BcComm::Outcome& o : g_orphans) PMPI_Wait(&o.req, MPI_STATUS_IGNORE);
  g_orphans.clear();
  for (MPI_Comm& c : g_orphan_comms) PMPI_Comm_free(&c);
  g_orphan_comms.clear();
}

}  // namespace streamcoll
