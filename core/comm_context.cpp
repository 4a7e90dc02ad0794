#include "core/comm_context.hpp"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <unordered_set>
#include <vector>

#include "base/log.hpp"

namespace streamcoll {
namespace {

int g_keyval = MPI_KEYVAL_INVALID;
std::mutex g_mu;                              // guards creation and the live set
std::unordered_set<CommContext*> g_live;      // contexts not yet deleted
uint64_t g_seq = 0;                           // contexts created so far

// A thread's last lookup that found a context: the MPI's attribute lookup costs tens of
// nanoseconds, a large part of a small host call's price (bench/passthrough_latency).
struct Remembered {
  MPI_Comm comm = MPI_COMM_NULL;
  CommContext* ctx = nullptr;
  uint64_t generation = 0;
};
thread_local Remembered t_last;

void destroy(CommContext* ctx) {
  forget_remembered();
  ctx->alive->store(false, std::memory_order_release);
  ctx->finish_agreements();  // before their communicator goes
  if (ctx->local != MPI_COMM_NULL) PMPI_Comm_free(&ctx->local);
  delete ctx;
}

int delete_fn(MPI_Comm, int, void* value, void*) {
  auto* ctx = static_cast<CommContext*>(value);
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_live.erase(ctx);
  }
  destroy(ctx);
  return MPI_SUCCESS;
}

// Collective over comm. Fills the node layout.
bool build(CommContext* ctx) {
  MPI_Comm comm = ctx->comm;
  int inter = 0;
  if (PMPI_Comm_test_inter(comm, &inter) != MPI_SUCCESS) return false;
  ctx->inter = inter != 0;
  if (ctx->inter) return true;
  PMPI_Comm_rank(comm, &ctx->rank);
  PMPI_Comm_size(comm, &ctx->size);
  if (PMPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, ctx->rank, MPI_INFO_NULL, &ctx->local) !=
      MPI_SUCCESS)
    return false;
  PMPI_Comm_rank(ctx->local, &ctx->local_rank);
  PMPI_Comm_size(ctx->local, &ctx->local_size);
  // Every rank's node, named by the node's lowest rank in comm (local rank 0: the split
  // kept comm's order); from them the nodes, the largest and the smallest node.
  int lowest = ctx->rank;
  {
    MPI_Group local_group = MPI_GROUP_NULL, group = MPI_GROUP_NULL;
    const int zero = 0;
    if (PMPI_Comm_group(ctx->local, &local_group) != MPI_SUCCESS ||
        PMPI_Comm_group(comm, &group) != MPI_SUCCESS ||
        PMPI_Group_translate_ranks(local_group, 1, &zero, group, &lowest) != MPI_SUCCESS)
      lowest = -1;  // every rank learns of it below and gives up alike
    if (local_group != MPI_GROUP_NULL) PMPI_Group_free(&local_group);
    if (group != MPI_GROUP_NULL) PMPI_Group_free(&group);
  }
  ctx->node_of.assign(static_cast<size_t>(ctx->size), 0);
  if (PMPI_Allgather(&lowest, 1, MPI_INT, ctx->node_of.data(), 1, MPI_INT, comm) != MPI_SUCCESS)
    return false;
  std::map<int, int> per_node;
  for (int n : ctx->node_of) {
    if (n < 0 || n >= ctx->size) return false;
    ++per_node[n];
  }
  int most = 0, fewest = ctx->size;
  for (const auto& [node, ranks] : per_node) {
    most = std::max(most, ranks);
    fewest = std::min(fewest, ranks);
  }
  ctx->nodes = static_cast<int>(per_node.size());
  ctx->ppn = most;
  ctx->uniform = most == fewest;
  SC_INFO("communicator of %d ranks: %d node(s), %d..%d ranks per node", ctx->size, ctx->nodes,
          fewest, most);
  return true;
}

}  // namespace

size_t DecisionCache::KeyHash::operator()(const config::CallKey& k) const {
  uint64_t h = k.bytes * 0x9E3779B97F4A7C15ull;
  h ^= (static_cast<uint64_t>(k.coll) << 1 | (k.stream ? 1u : 0u)) +
       (static_cast<uint64_t>(k.mem) << 8) + (h << 6) + (h >> 2);
  h ^= static_cast<uint64_t>(k.ranks) * 0xC2B2AE3D27D4EB4Full + static_cast<uint64_t>(k.nodes) +
       (static_cast<uint64_t>(k.ppn) << 32);
  return static_cast<size_t>(h ^ (h >> 29));
}

bool DecisionCache::KeyEq::operator()(const config::CallKey& a, const config::CallKey& b) const {
  return a.coll == b.coll && a.bytes == b.bytes && a.ranks == b.ranks && a.nodes == b.nodes &&
         a.ppn == b.ppn && a.mem == b.mem && a.stream == b.stream;
}

DecisionCache::Rules DecisionCache::lookup(const config::CallKey& key,
                                           const std::shared_ptr<const config::TuningTable>& forced,
                                           const config::TuningTable& table,
                                           uint64_t table_generation) {
  std::lock_guard<std::mutex> lock(mu_);
  if (forced != forced_ || table_generation != generation_ || map_.size() >= kMaxKeys) {
    map_.clear();
    forced_ = forced;
    generation_ = table_generation;
  }
  if (auto it = map_.find(key); it != map_.end()) {
    hits_.fetch_add(1, std::memory_order_relaxed);
    return it->second;
  }
  misses_.fetch_add(1, std::memory_order_relaxed);
  Rules r;
  if (forced) r.forced = forced->match(key);
  if (!r.forced) {
    for (const config::Rule* m = table.match(key); m; m = table.match(key, m)) {
      if (r.count == kMaxRules) {
        r.overflow = true;
        break;
      }
      r.table[r.count++] = m;
    }
  }
  map_.emplace(key, r);
  return r;
}

// Bumped whenever a context goes (its communicator freed, or every context at stop), so
// that no thread's remembered lookup (comm_context) outlives it: an MPI may hand a freed
// communicator's handle to the next one it makes; and by forget_remembered().
std::atomic<uint64_t> detail::g_remembered{0};

void forget_remembered() { detail::g_remembered.fetch_add(1, std::memory_order_acq_rel); }

CommContext* comm_context(MPI_Comm comm, bool create) {
  if (g_keyval == MPI_KEYVAL_INVALID) return nullptr;
  const uint64_t generation = remembered_generation();
  if (t_last.comm == comm && t_last.generation == generation && comm != MPI_COMM_NULL)
    return t_last.ctx;
  void* value = nullptr;
  int found = 0;
  if (PMPI_Comm_get_attr(comm, g_keyval, &value, &found) != MPI_SUCCESS) return nullptr;
  if (found) {
    t_last = Remembered{comm, static_cast<CommContext*>(value), generation};
    return t_last.ctx;
  }
  if (!create) return nullptr;

  // Not yet created. Every rank arrives here at the same call on comm, so the collective
  // operations in build() match up. Different communicators may be set up concurrently
  // by different threads; each thread only builds its own.
  auto* ctx = new CommContext;
  ctx->comm = comm;
  if (!build(ctx)) {
    SC_WARN("could not set up a context for a communicator; its calls pass through");
    destroy(ctx);
    return nullptr;
  }
  if (PMPI_Comm_set_attr(comm, g_keyval, ctx) != MPI_SUCCESS) {
    destroy(ctx);
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(g_mu);
  ctx->seq = g_seq++;
  g_live.insert(ctx);
  return ctx;
}

size_t CommContext::SignatureHash::operator()(const CallSignature& s) const {
  uint64_t h = s.bytes * 0x9E3779B97F4A7C15ull;
  h ^= (static_cast<uint64_t>(s.coll) << 48) ^ (static_cast<uint64_t>(s.op) << 40) ^
       static_cast<uint64_t>(static_cast<uint32_t>(s.root));
  return static_cast<size_t>(h ^ (h >> 29));
}

SignatureAgreements& CommContext::signature(const CallSignature& s) {
  if (last_signature_ && s == last_key_) return *last_signature_;  // a run of one signature
  auto it = signatures_.find(s);
  if (it == signatures_.end()) {
    if (signatures_.size() >= kMaxSignatures) {  // equal on every rank
      forget_remembered();  // (the steady path's entries point at the agreements)
      signatures_.clear();
    }
    it = signatures_.emplace(s, std::make_unique<SignatureAgreements>()).first;
  }
  last_key_ = s;
  last_signature_ = it->second.get();
  return *last_signature_;
}

void CommContext::finish_agreements() {
  for (auto& [sig, agreements] : signatures_) agreements->finish();
  if (agree_comm_ == MPI_COMM_NULL) return;
  finish_agreement_checks(agree_comm_);  // STREAMCOLL_CHECK's, of non-blocking calls
  PMPI_Comm_free(&agree_comm_);
}

MPI_Comm CommContext::agreement_comm() {
  if (agree_comm_ == MPI_COMM_NULL && PMPI_Comm_dup(comm, &agree_comm_) == MPI_SUCCESS)
    PMPI_Comm_set_errhandler(agree_comm_, MPI_ERRORS_RETURN);
  return agree_comm_;
}

size_t comm_contexts_live() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_live.size();
}

void comm_contexts_start() {
  if (g_keyval == MPI_KEYVAL_INVALID)
    PMPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, delete_fn, &g_keyval, nullptr);
}

void comm_contexts_stop() {
  if (g_keyval == MPI_KEYVAL_INVALID) return;
  // Deleting the attribute runs delete_fn, which removes the entry; take one at a time,
  // oldest first. Tearing down route state (an NCCL communicator) may synchronise with
  // the other ranks of the communicator, so every rank goes in the same order: creation
  // order, which MPI's ordering of collective calls makes consistent across ranks.
  for (;;) {
    MPI_Comm comm;
    {
      std::lock_guard<std::mutex> lock(g_mu);
      if (g_live.empty()) break;
      comm = (*std::min_element(g_live.begin(), g_live.end(),
                                [](const CommContext* x, const CommContext* y) {
                                  return x->seq < y->seq;
                                }))->comm;
    }
    if (PMPI_Comm_delete_attr(comm, g_keyval) != MPI_SUCCESS) {
      // The communicator is gone without its callback having run; drop the entry.
      CommContext* stale = nullptr;
      {
        std::lock_guard<std::mutex> lock(g_mu);
        for (CommContext* c : g_live)
          if (c->comm == comm) stale = c;
        g_live.erase(stale);
      }
      if (stale) destroy(stale);
    }
  }
  PMPI_Comm_free_keyval(&g_keyval);
  g_keyval = MPI_KEYVAL_INVALID;
}

}  // namespace streamcoll
