#include "core/agreement.hpp"

#include <list>
#include <mutex>
#include <string>

#include "core/log.hpp"
#include "core/stats.hpp"

namespace streamcoll {
namespace {

int encode(RouteId r, MemKind m) { return static_cast<int>(r) * kNumMemKinds + static_cast<int>(m); }
std::string describe(int x) {
  return std::string(name(static_cast<RouteId>(x / kNumMemKinds))) + " on " +
         std::string(name(static_cast<MemKind>(x % kNumMemKinds))) + " memory";
}

struct Pending {
  MPI_Comm comm;
  std::string call;
  int rank;
  int in[2];
  int out[2];
  MPI_Request req;
};
std::mutex g_mu;
std::list<Pending> g_pending;  // stable addresses: the requests write into out[]

void verify(MPI_Comm comm, const std::string& call, int rank, const int in[2], const int out[2]) {
  if (out[0] == -out[1]) return;
  log_error(
      "STREAMCOLL_CHECK: ranks disagree on %s: rank %d chose %s; the ranks' choices range "
      "from %s to %s. All ranks must pass buffers of the same kind. Aborting.",
      call.c_str(), rank, describe(in[0]).c_str(), describe(-out[1]).c_str(),
      describe(out[0]).c_str());
  PMPI_Abort(comm, MPI_ERR_OTHER);
}

// Completes pending checks: all of them when `wait_comm` is MPI_COMM_NULL and `wait` is
// set, those on `wait_comm` when it is given, otherwise only those already done.
void settle(MPI_Comm wait_comm, bool wait) {
  std::lock_guard<std::mutex> lock(g_mu);
  for (auto it = g_pending.begin(); it != g_pending.end();) {
    int done = 0;
    if (wait && (wait_comm == MPI_COMM_NULL || it->comm == wait_comm)) {
      PMPI_Wait(&it->req, MPI_STATUS_IGNORE);
      done = 1;
    } else {
      PMPI_Test(&it->req, &done, MPI_STATUS_IGNORE);
    }
    if (!done) {
      ++it;
      continue;
    }
    verify(it->comm, it->call, it->rank, it->in, it->out);
    it = g_pending.erase(it);
  }
}

}  // namespace

void check_agreement(MPI_Comm comm, Coll coll, bool nonblocking, RouteId route, MemKind mem,
                     int rank) {
  const int v = encode(route, mem);
  const std::string call = call_name(coll, nonblocking);
  if (!nonblocking) {
    settle(comm, true);  // earlier checks on this communicator first, in call order
    int in[2] = {v, -v}, out[2] = {0, 0};
    if (PMPI_Allreduce(in, out, 2, MPI_INT, MPI_MAX, comm) == MPI_SUCCESS)
      verify(comm, call, rank, in, out);
    settle(MPI_COMM_NULL, false);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(g_mu);
    Pending& p = g_pending.emplace_back(Pending{comm, call, rank, {v, -v}, {0, 0}, MPI_REQUEST_NULL});
    if (PMPI_Iallreduce(p.in, p.out, 2, MPI_INT, MPI_MAX, comm, &p.req) != MPI_SUCCESS)
      g_pending.pop_back();
  }
  settle(MPI_COMM_NULL, false);
}

void finish_agreement_checks() { settle(MPI_COMM_NULL, true); }

}  // namespace streamcoll
