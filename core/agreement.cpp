#include "core/agreement.hpp"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <iterator>
#include <list>
#include <mutex>
#include <string>

#include "base/log.hpp"
#include "core/service.hpp"
#include "core/stats.hpp"
#include "core/trace.hpp"

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
      "from %s to %s. Aborting.",
      call.c_str(), rank, describe(in[0]).c_str(), describe(-out[1]).c_str(),
      describe(out[0]).c_str());
  PMPI_Abort(comm, MPI_ERR_OTHER);
}

// Completes pending checks: all of them when `wait_comm` is MPI_COMM_NULL and `wait` is
// set, those on `wait_comm` when it is given, otherwise only those already done. The lock
// is not held while waiting (a thread waiting for one communicator's check must not keep
// another thread from starting the check its peers wait for on theirs): the checks to
// wait for are taken out of the list first.
void settle(MPI_Comm wait_comm, bool wait) {
  std::list<Pending> taken, done;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    for (auto it = g_pending.begin(); it != g_pending.end();) {
      auto next = std::next(it);
      int flag = 0;
      if (wait && (wait_comm == MPI_COMM_NULL || it->comm == wait_comm)) {
        taken.splice(taken.end(), g_pending, it);
      } else if (PMPI_Test(&it->req, &flag, MPI_STATUS_IGNORE), flag) {
        done.splice(done.end(), g_pending, it);
      }
      it = next;
    }
  }
  for (Pending& p : taken) PMPI_Wait(&p.req, MPI_STATUS_IGNORE);
  done.splice(done.end(), taken);
  for (const Pending& p : done) verify(p.comm, p.call, p.rank, p.in, p.out);
}

}  // namespace

void check_agreement(MPI_Comm comm, MPI_Comm private_comm, Coll coll, bool nonblocking,
                     RouteId route, MemKind mem, int rank) {
  const int v = encode(route, mem);
  const std::string call = call_name(coll, nonblocking);
  if (!nonblocking) {
    // Earlier checks of this communicator's calls first, in call order.
    if (private_comm != MPI_COMM_NULL) settle(private_comm, true);
    int in[2] = {v, -v}, out[2] = {0, 0};
    if (PMPI_Allreduce(in, out, 2, MPI_INT, MPI_MAX, comm) == MPI_SUCCESS)
      verify(comm, call, rank, in, out);
    settle(MPI_COMM_NULL, false);
    return;
  }
  if (private_comm == MPI_COMM_NULL) {
    // No checked blocking call on the communicator yet (so no duplicate): such a call has
    // no agreed facts and goes to pmpi on every rank; nothing of streamcoll's set up.
    SC_TRACE("STREAMCOLL_CHECK: %s not checked (no blocking call on its communicator yet)",
             call.c_str());
    return;
  }
  {
    std::lock_guard<std::mutex> lock(g_mu);
    Pending& p = g_pending.emplace_back(
        Pending{private_comm, call, rank, {v, -v}, {0, 0}, MPI_REQUEST_NULL});
    if (PMPI_Iallreduce(p.in, p.out, 2, MPI_INT, MPI_MAX, private_comm, &p.req) != MPI_SUCCESS)
      g_pending.pop_back();
  }
  settle(MPI_COMM_NULL, false);
}

namespace {

// The exchanged form of LocalFacts: each int is OR-ed over the ranks ("some rank has ...").
enum { k_host, k_pinned, k_device, k_managed, k_mixed, k_inelig, k_stream, k_nostream,
       k_unable, k_n };

void encode(const LocalFacts& mine, int in[k_n]) {
  std::fill(in, in + k_n, 0);
  switch (mine.mem) {
    case MemKind::host: in[k_host] = 1; break;
    case MemKind::pinned: in[k_pinned] = 1; break;
    case MemKind::device: in[k_device] = 1; break;
    case MemKind::managed: in[k_managed] = 1; break;
    case MemKind::mixed: in[k_mixed] = 1; break;
  }
  in[k_inelig] = mine.ineligible;
  in[k_stream] = mine.stream;
  in[k_nostream] = !mine.stream;
  in[k_unable] = static_cast<int>(mine.unable);
}

AgreedFacts decode(const int out[k_n]) {
  AgreedFacts f;
  f.valid = true;
  f.unable = static_cast<uint32_t>(out[k_unable]);
  f.stream = out[k_stream] && !out[k_nostream];
  const int kinds = out[k_host] + out[k_pinned] + out[k_device] + out[k_managed];
  f.host_only = !out[k_mixed] && !out[k_device] && !out[k_managed];
  if (out[k_mixed] || kinds > 1) {
    // Host and pinned memory are both host memory to every route.
    f.mem = (!out[k_mixed] && !out[k_device] && !out[k_managed]) ? MemKind::host
                                                                    : MemKind::mixed;
  } else {
    f.mem = out[k_device] ? MemKind::device : out[k_managed] ? MemKind::managed
          : out[k_pinned] ? MemKind::pinned : MemKind::host;
  }
  if (out[k_inelig]) {
    f.why = "a rank's arguments suit only pmpi (binding, datatype or memory kinds)";
  } else if (f.mem == MemKind::mixed) {
    f.why = "ranks pass buffers of different memory kinds";
  } else if (out[k_stream] && out[k_nostream]) {
    f.why = "the stream attribute is set on some ranks of the communicator only";
  } else {
    f.routable = true;
  }
  return f;
}

}  // namespace

std::atomic<uint64_t> g_blocking{0}, g_refreshes{0}, g_waited{0};

AgreementCounts agreement_counts() {
  AgreementCounts c;
  c.blocking = g_blocking.load(std::memory_order_relaxed);
  c.refreshes = g_refreshes.load(std::memory_order_relaxed);
  c.waited = g_waited.load(std::memory_order_relaxed);
  return c;
}

AgreedFacts agree_call(MPI_Comm comm, int size, const LocalFacts& mine) {
  int in[k_n], out[k_n] = {};
  encode(mine, in);
  if (size == 1) return decode(in);
  g_blocking.fetch_add(1, std::memory_order_relaxed);
  trace::Range range("agreement (blocking)");
  if (PMPI_Allreduce(in, out, k_n, MPI_INT, MPI_BOR, comm) != MPI_SUCCESS) {
    AgreedFacts f;
    f.valid = true;
    f.why = "the agreement failed";
    return f;
  }
  return decode(out);
}

// ---- SignatureAgreements ------------------------------------------------------------

static_assert(SignatureAgreements::kInts == k_n, "the exchanged form of LocalFacts");

SignatureAgreements::~SignatureAgreements() { drain(); }

namespace {
// Whether two agreements say the same (the refresh schedule backs off while they do).
bool same_facts(const AgreedFacts& a, const AgreedFacts& b) {
  return a.valid == b.valid && a.routable == b.routable && a.mem == b.mem &&
         a.host_only == b.host_only && a.stream == b.stream && a.unable == b.unable;
}
}  // namespace

void SignatureAgreements::schedule() {
  const uint64_t n = calls_;
  if (n - 1 < kRefreshEvery) {
    next_refresh_ = 2 * n - 1;  // 2, 3, 5, 9, ..., 1 + kRefreshEvery
    return;
  }
  gap_ = stable_ ? std::min(2 * gap_, kRefreshMax) : kRefreshEvery;
  next_refresh_ = n + gap_;
}

bool SignatureAgreements::begin_call() {
  ++calls_;
  due_ = calls_ == next_refresh_;
  if (due_) schedule();
  return calls_ == 1 || !cached_;
}

void SignatureAgreements::unsettled() {
  stable_ = false;
  next_refresh_ = std::min(next_refresh_, calls_ + kRefreshEvery);
}

const AgreedFacts& SignatureAgreements::agree(MPI_Comm comm, int size, const LocalFacts& mine) {
  drain();
  facts_ = agree_call(comm, size, mine);
  unsettled();
  return facts_;
}

const AgreedFacts& SignatureAgreements::adopt() {
  // Every pending refresh started kRunAhead or more calls ago, oldest first: the newest
  // one's facts stand.
  while (!pending_.empty() && pending_.front()->at + kRunAhead <= calls_) {
    Pending& p = *pending_.front();
    if (!p.failed) {
      int done = 0;
      if (PMPI_Test(&p.req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
        p.failed = true;
      } else if (!done) {
        ++waited_;
        g_waited.fetch_add(1, std::memory_order_relaxed);
        if (PMPI_Wait(&p.req, MPI_STATUS_IGNORE) != MPI_SUCCESS) p.failed = true;
      }
    }
    if (p.failed) {
      // Not routable from here on (the MPI raised its own error on the communicator);
      // the calls go to pmpi, which takes anything, and the agreement is tried again at
      // the next refresh.
      facts_ = AgreedFacts{};
      facts_.valid = true;
      facts_.why = "the agreement failed";
      unsettled();
    } else {
      const AgreedFacts found = decode(p.out);
      if (same_facts(found, facts_)) stable_ = true;
      else unsettled();
      facts_ = found;
    }
    pending_.erase(pending_.begin());
  }
  return facts_;
}

bool SignatureAgreements::refreshes() const {
  return cached_ && (due_ || (routed_ && calls_ % kRefreshRouted == 0));
}

void SignatureAgreements::decided(bool cacheable, bool routed, bool steady) {
  cached_ = cacheable;
  routed_ = routed;
  steady_until_ = 0;
  if (!steady || !cacheable) return;
  // The next call that starts a refresh, or adopts the oldest one pending.
  uint64_t until = next_refresh_;
  if (routed) until = std::min(until, (calls_ / kRefreshRouted + 1) * kRefreshRouted);
  if (!pending_.empty()) until = std::min(until, pending_.front()->at + kRunAhead);
  steady_until_ = until;
}

void SignatureAgreements::refresh(MPI_Comm comm, int size, const LocalFacts& mine) {
  auto p = std::make_unique<Pending>();
  p->at = calls_;
  encode(mine, p->in);
  if (size == 1) {
    std::copy(p->in, p->in + k_n, p->out);
  } else if (comm == MPI_COMM_NULL) {
    p->failed = true;  // no communicator to agree on: adopted as not routable
  } else {
    g_refreshes.fetch_add(1, std::memory_order_relaxed);
    if (PMPI_Iallreduce(p->in, p->out, k_n, MPI_INT, MPI_BOR, comm, &p->req) != MPI_SUCCESS)
      p->failed = true;
  }
  ++started_;
  pending_.push_back(std::move(p));
}

void SignatureAgreements::drain() {
  for (auto& p : pending_)
    if (!p->failed && p->req != MPI_REQUEST_NULL) PMPI_Wait(&p->req, MPI_STATUS_IGNORE);
  pending_.clear();
}

void check_inputs(MPI_Comm comm, MPI_Comm private_comm, Coll coll, uint64_t bytes, int root,
                  bool candidate, int rank) {
  // Earlier checks of this communicator's calls first, in call order.
  if (private_comm != MPI_COMM_NULL) settle(private_comm, true);
  const int64_t v[4] = {static_cast<int64_t>(coll), static_cast<int64_t>(bytes & INT64_MAX),
                        root, candidate ? 1 : 0};
  int64_t lo[4], hi[4];
  if (service::ranges(v, 4, comm, lo, hi) != MPI_SUCCESS) return;
  static const char* const what[4] = {"the collective", "the size in bytes", "the root",
                                      "whether streamcoll may route it"};
  for (int i = 0; i < 4; ++i) {
    if (lo[i] == hi[i]) continue;
    log_error(
        "STREAMCOLL_CHECK: ranks disagree on %s of %s: rank %d has %lld; the ranks' values "
        "range from %lld to %lld. Every rank must make the same collective call (and call "
        "streamcoll_comm_set_route alike). Aborting.",
        what[i], call_name(coll, false).c_str(), rank, static_cast<long long>(v[i]),
        static_cast<long long>(lo[i]), static_cast<long long>(hi[i]));
    PMPI_Abort(comm, MPI_ERR_OTHER);
  }
}

void finish_agreement_checks(MPI_Comm private_comm) { settle(private_comm, true); }

}  // namespace streamcoll
