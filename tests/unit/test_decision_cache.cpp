// DecisionCache (core/comm_context.hpp): the cached rules of a call signature are the ones
// a walk of the forced routes and the table finds, in order; entries go when the forced
// routes are replaced or the table reloaded; more matches than it keeps fall back to the walk.
#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <vector>

#include "config/tuning_table.hpp"
#include "core/comm_context.hpp"

using namespace streamcoll;
using config::CallKey;
using config::Rule;
using config::TuningTable;

namespace {

TuningTable table_of(const std::string& text) {
  std::optional<config::ParseError> err;
  TuningTable t = TuningTable::parse(text, "t.conf", &err);
  REQUIRE_FALSE(err.has_value());
  return t;
}

// Every match of `key` in `t`, in order (the walk the cache stands for).
std::vector<const Rule*> walk(const TuningTable& t, const CallKey& key) {
  std::vector<const Rule*> v;
  for (const Rule* r = t.match(key); r; r = t.match(key, r)) v.push_back(r);
  return v;
}

CallKey key_of(Coll c, uint64_t bytes, MemKind mem = MemKind::host, bool stream = false) {
  CallKey k;
  k.coll = c;
  k.bytes = bytes;
  k.ranks = 4;
  k.nodes = 2;
  k.ppn = 2;
  k.mem = mem;
  k.stream = stream;
  return k;
}

}  // namespace

TEST_CASE("decision cache: the same rules as the walk, hits on repeats") {
  const TuningTable t = table_of(
      "allreduce 0-1023 * * * host * ht algo=rd\n"
      "allreduce 1024- 4- * * host * ht algo=ccube\n"
      "allreduce * * 2- * host * blueconnect\n"
      "allreduce,bcast * * * * device * nccl\n"
      "* * * * * * * pmpi\n");
  DecisionCache c;
  const std::vector<CallKey> keys = {
      key_of(Coll::allreduce, 8),       key_of(Coll::allreduce, 4096),
      key_of(Coll::allreduce, 8, MemKind::device), key_of(Coll::bcast, 8, MemKind::device, true),
      key_of(Coll::reduce, 100),        key_of(Coll::allgather, 1 << 20)};
  for (int pass = 0; pass < 3; ++pass) {
    for (const CallKey& k : keys) {
      const DecisionCache::Rules r = c.lookup(k, nullptr, t, 1);
      const std::vector<const Rule*> want = walk(t, k);
      CHECK(r.forced == nullptr);
      CHECK_FALSE(r.overflow);
      REQUIRE(r.count == static_cast<int>(want.size()));
      for (int i = 0; i < r.count; ++i) CHECK(r.table[i] == want[static_cast<size_t>(i)]);
    }
  }
  CHECK(c.misses() == keys.size());
  CHECK(c.hits() == 2 * keys.size());
  // Every field of the key counts: another rank count or stream flag is another entry.
  CallKey other = keys[0];
  other.ranks = 8;
  c.lookup(other, nullptr, t, 1);
  other = keys[2];
  other.stream = true;
  c.lookup(other, nullptr, t, 1);
  CHECK(c.misses() == keys.size() + 2);
}

TEST_CASE("decision cache: forced routes first; replaced forced routes or a reloaded table start over") {
  const TuningTable t = table_of("allreduce * * * * host * ht algo=rd\n* * * * * * * pmpi\n");
  auto forced2 = std::make_shared<const TuningTable>(table_of("allreduce * * * * host * ht algo=ring\n"));
  DecisionCache c;
  const CallKey k = key_of(Coll::allreduce, 64);
  DecisionCache::Rules r = c.lookup(k, forced2, t, 1);
  CHECK(r.forced == forced2->match(k));
  CHECK(r.count == 0);
  r = c.lookup(k, forced2, t, 1);
  CHECK(c.hits() == 1);
  // Other forced routes (or none): a miss, and the table's rules.
  r = c.lookup(k, nullptr, t, 1);
  CHECK(c.misses() == 2);
  CHECK(r.forced == nullptr);
  REQUIRE(r.count == 2);
  CHECK(r.table[0] == t.match(k));
  // A forced table that matches nothing: the table's rules.
  const CallKey b = key_of(Coll::bcast, 64);
  r = c.lookup(b, forced2, t, 1);
  CHECK(r.forced == nullptr);
  CHECK(r.count == 1);
  // The table reloaded (a new generation): a miss again.
  const uint64_t misses = c.misses();
  c.lookup(b, forced2, t, 1);
  CHECK(c.misses() == misses);
  c.lookup(b, forced2, t, 2);
  CHECK(c.misses() == misses + 1);
}

TEST_CASE("decision cache: more matching rules than it keeps go on with the walk") {
  std::string text;
  for (int i = 0; i < DecisionCache::kMaxRules + 3; ++i) text += "allreduce * * * * host * ht algo=rd\n";
  const TuningTable t = table_of(text);
  DecisionCache c;
  const CallKey k = key_of(Coll::allreduce, 64);
  const DecisionCache::Rules r = c.lookup(k, nullptr, t, 1);
  CHECK(r.overflow);
  CHECK(r.count == DecisionCache::kMaxRules);
  const std::vector<const Rule*> want = walk(t, k);
  for (int i = 0; i < r.count; ++i) CHECK(r.table[i] == want[static_cast<size_t>(i)]);
  // The rest from the last kept one, as decide() walks on.
  CHECK(t.match(k, r.table[r.count - 1]) == want[static_cast<size_t>(r.count)]);
}
