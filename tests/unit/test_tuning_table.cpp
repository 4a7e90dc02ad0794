#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "config/tuning_table.hpp"
#include "streamcoll/streamcoll.h"
#include "reference_doc.hpp"

using namespace streamcoll;
using namespace streamcoll::config;

namespace {
TuningTable parse_ok(std::string_view text) {
  std::optional<ParseError> err;
  TuningTable t = TuningTable::parse(text, "t.conf", &err);
  REQUIRE_MESSAGE(!err, (err ? err->to_string() : ""));
  return t;
}
ParseError parse_bad(std::string_view text) {
  std::optional<ParseError> err;
  TuningTable t = TuningTable::parse(text, "t.conf", &err);
  REQUIRE(err);
  CHECK(t.rules().empty());
  return *err;
}
CallKey key(Coll c, uint64_t bytes, int ranks, MemKind m, bool stream = false) {
  CallKey k;
  k.coll = c;
  k.bytes = bytes;
  k.ranks = ranks;
  k.nodes = 1;
  k.ppn = ranks;
  k.mem = m;
  k.stream = stream;
  return k;
}
}  // namespace

TEST_CASE("sizes and ranges") {
  CHECK(parse_size("0") == 0u);
  CHECK(parse_size("7") == 7u);
  CHECK(parse_size("4K") == 4096u);
  CHECK(parse_size("4KiB") == 4096u);
  CHECK(parse_size("1M") == 1048576u);
  CHECK(parse_size("2G") == 2147483648u);
  CHECK_FALSE(parse_size(""));
  CHECK_FALSE(parse_size("K"));
  CHECK_FALSE(parse_size("4X"));
  CHECK_FALSE(parse_size("-4"));
  CHECK_FALSE(parse_size("99999999999999999999"));
  CHECK_FALSE(parse_size("18446744073709551615G"));

  auto any = parse_range("*");
  REQUIRE(any);
  CHECK(any->contains(0));
  CHECK(any->contains(~0ull));
  auto one = parse_range("8");
  REQUIRE(one);
  CHECK(one->contains(8));
  CHECK_FALSE(one->contains(9));
  auto closed = parse_range("1K-4K");
  REQUIRE(closed);
  CHECK(closed->contains(1024));
  CHECK(closed->contains(4096));
  CHECK_FALSE(closed->contains(4097));
  CHECK_FALSE(closed->contains(1023));
  auto open = parse_range("64-");
  REQUIRE(open);
  CHECK(open->contains(64));
  CHECK(open->contains(1ull << 40));
  CHECK_FALSE(open->contains(63));
  CHECK_FALSE(parse_range("4K-1K"));
  CHECK_FALSE(parse_range("-4"));
  CHECK_FALSE(parse_range("a-b"));
}

TEST_CASE("first matching rule wins") {
  TuningTable t = parse_ok(R"(
# a comment line
allreduce   0-32K  64-  *  *  device  *  ht algo=rd   # trailing comment
allreduce   *      *    *  *  device  *  nccl
bcast,reduce *     *    *  *  *       yes ht
*           *      *    *  *  *       *  pmpi
)");
  REQUIRE(t.rules().size() == 4);
  const Rule* r = t.match(key(Coll::allreduce, 1024, 64, MemKind::device));
  REQUIRE(r);
  CHECK(r->choice.route == RouteId::ht);
  CHECK(r->choice.param("algo") == std::string_view("rd"));
  CHECK_FALSE(r->choice.param("chunk"));
  CHECK(r->origin == "t.conf:3");

  // Too few ranks for the first rule, too many bytes: the second.
  CHECK(t.match(key(Coll::allreduce, 1024, 8, MemKind::device))->choice.route == RouteId::nccl);
  CHECK(t.match(key(Coll::allreduce, 32769, 64, MemKind::device))->choice.route ==
        RouteId::nccl);
  // Host memory falls to the catch-all.
  CHECK(t.match(key(Coll::allreduce, 8, 64, MemKind::host))->choice.route == RouteId::pmpi);
  // The stream column.
  CHECK(t.match(key(Coll::bcast, 8, 2, MemKind::host, true))->choice.route == RouteId::ht);
  CHECK(t.match(key(Coll::reduce, 8, 2, MemKind::host, true))->choice.route == RouteId::ht);
  CHECK(t.match(key(Coll::bcast, 8, 2, MemKind::host, false))->choice.route == RouteId::pmpi);
}

TEST_CASE("no match means pmpi, and the fast-path index is exact enough") {
  TuningTable t = parse_ok("allreduce * * * * device * nccl\nbcast * * * * host,pinned * ht\n");
  CHECK(t.match(key(Coll::alltoall, 8, 2, MemKind::device)) == nullptr);
  CHECK(t.may_leave_pmpi(Coll::allreduce, MemKind::device));
  CHECK_FALSE(t.may_leave_pmpi(Coll::allreduce, MemKind::host));
  CHECK_FALSE(t.may_leave_pmpi(Coll::allreduce, MemKind::managed));
  CHECK_FALSE(t.routes_host(Coll::allreduce));
  CHECK(t.routes_host(Coll::bcast));
  CHECK_FALSE(t.may_leave_pmpi(Coll::barrier, MemKind::device));
}

TEST_CASE("fuse= on any route: MPI_Iallreduce fusion") {
  TuningTable t = parse_ok("allreduce 0-1K * * * host * pmpi fuse=64K\n"
                           "allreduce * * * * device * ht algo=rd fuse=1K\n");
  CHECK(t.fuses());
  CHECK(t.may_leave_pmpi(Coll::allreduce, MemKind::host));  // a pmpi rule that fuses
  CHECK_FALSE(t.may_leave_pmpi(Coll::bcast, MemKind::host));
  CHECK(t.uses_progress_thread(false));  // fusion runs on the progress thread
  const Rule* r = t.match(key(Coll::allreduce, 8, 4, MemKind::host));
  REQUIRE(r);
  CHECK(r->choice.route == RouteId::pmpi);
  CHECK(r->choice.param("fuse") == std::optional<std::string_view>("64K"));
  CHECK(parse_ok(r->to_string()).rules()[0].choice.param("fuse") == r->choice.param("fuse"));
  // A fuse= on a rule without allreduce fuses nothing.
  TuningTable b = parse_ok("bcast * * * * host * pmpi fuse=1K\n");
  CHECK_FALSE(b.fuses());
  CHECK_FALSE(b.may_leave_pmpi(Coll::bcast, MemKind::host));
  CHECK_FALSE(parse_ok("allreduce * * * * host * ht\n").fuses());
  CHECK(parse_bad("allreduce * * * * host * pmpi fuse=0\n").reason.find("fuse") != std::string::npos);
  CHECK(parse_bad("allreduce * * * * host * ht fuse=lots\n").reason.find("fuse") != std::string::npos);
  // Forced routes take it too.
  std::optional<ParseError> err;
  auto forced = TuningTable::parse_forced("allreduce:pmpi:fuse=4K", &err);
  REQUIRE_FALSE(err);
  REQUIRE(forced.size() == 1);
  CHECK(forced[0].choice.param("fuse") == std::optional<std::string_view>("4K"));
}

TEST_CASE("mixed memory never matches, not even '*'") {
  TuningTable t = parse_ok("* * * * * * * nccl\n");
  CHECK(t.match(key(Coll::allreduce, 8, 2, MemKind::mixed)) == nullptr);
  CHECK(t.match(key(Coll::allreduce, 8, 2, MemKind::managed)) != nullptr);
}

TEST_CASE("nodes and ppn columns") {
  TuningTable t = parse_ok("allreduce * * 2- 4 * * blueconnect hierarchy=4x2 chunk=1M\n");
  CallKey k = key(Coll::allreduce, 8, 8, MemKind::device);
  k.nodes = 2;
  k.ppn = 4;
  const Rule* r = t.match(k);
  REQUIRE(r);
  CHECK(r->choice.param("hierarchy") == std::string_view("4x2"));
  CHECK(r->choice.param("chunk") == std::string_view("1M"));
  k.nodes = 1;
  CHECK(t.match(k) == nullptr);
  k.nodes = 2;
  k.ppn = 2;
  CHECK(t.match(k) == nullptr);
}

TEST_CASE("blueconnect parameters: hierarchy, backends per level, stage algorithm") {
  TuningTable t = parse_ok(
      "allreduce * * * * host * blueconnect hierarchy=2x2x2 backend=sched/mpi/sched algo=ring\n"
      "allgather * * * * device * blueconnect backend=nccl\n");
  const Rule* r = t.match(key(Coll::allreduce, 8, 8, MemKind::host));
  REQUIRE(r);
  CHECK(r->choice.route == RouteId::blueconnect);
  CHECK(r->choice.param("hierarchy") == std::string_view("2x2x2"));
  CHECK(r->choice.param("backend") == std::string_view("sched/mpi/sched"));
  CHECK(r->choice.param("algo") == std::string_view("ring"));
  r = t.match(key(Coll::allgather, 8, 8, MemKind::device));
  REQUIRE(r);
  CHECK(r->choice.param("backend") == std::string_view("nccl"));
  CHECK_FALSE(r->choice.param("hierarchy"));
}

TEST_CASE("nvgroup parameters: across groups, and as blueconnect's innermost backend") {
  TuningTable t = parse_ok(
      "allreduce * * * * device * nvgroup chunk=4M blocks=64 cross=ht hierarchy=4x2\n"
      "allgather * * * * device * blueconnect backend=nvgroup/nccl\n");
  const Rule* r = t.match(key(Coll::allreduce, 8, 8, MemKind::device));
  REQUIRE(r);
  CHECK(r->choice.route == RouteId::nvgroup);
  CHECK(r->choice.param("cross") == std::string_view("ht"));
  CHECK(r->choice.param("hierarchy") == std::string_view("4x2"));
  CHECK(r->choice.param("blocks") == std::string_view("64"));
  r = t.match(key(Coll::allgather, 8, 8, MemKind::device));
  REQUIRE(r);
  CHECK(r->choice.param("backend") == std::string_view("nvgroup/nccl"));
}

TEST_CASE("malformed tables name the line and the reason") {
  struct Case {
    const char* text;
    int line;
    const char* reason_part;
  } cases[] = {
      {"allreduce * * * * device *\n", 1, "expected 8 columns"},
      {"\n# c\nallreduse * * * * device * nccl\n", 3, "unknown collective 'allreduse'"},
      {"allreduce 4Q * * * device * nccl\n", 1, "bad bytes range '4Q'"},
      {"allreduce * 9-2 * * device * nccl\n", 1, "bad ranks range '9-2'"},
      {"allreduce * * x * device * nccl\n", 1, "bad nodes range"},
      {"allreduce * * * y device * nccl\n", 1, "bad ppn range"},
      {"allreduce * * * * gpu * nccl\n", 1, "unknown memory kind 'gpu'"},
      {"allreduce * * * * device maybe nccl\n", 1, "stream must be yes, no or *"},
      {"allreduce * * * * device * mpich\n", 1, "unknown route 'mpich'"},
      {"allreduce * * * * device * ht algo=tree\n", 1, "'algo' must be one of rd|rabenseifner|ring|mpi|ccube"},
      {"allreduce * * * * device * ht chunk=big\n", 1, "'chunk' needs a byte size"},
      {"allreduce * * * * device * ht algo\n", 1, "is not key=value"},
      {"allreduce * * * * device * nccl algo=rd\n", 1, "takes no parameter 'algo'"},
      {"allreduce * * * * device * blueconnect hierarchy=2x0\n", 1, "needs factors like 2x4"},
      {"allreduce * * * * host * blueconnect backend=ucx\n", 1,
       "'backend' takes sched|mpi|nccl|nvgroup|ht or a '/'-separated list of them, got 'ucx'"},
      {"allreduce * * * * device * nvgroup cross=mpi\n", 1, "'cross' must be one of nccl|ht"},
      {"allreduce * * * * device * nvgroup hierarchy=2x\n", 1, "needs factors like 2x4"},
      {"allreduce * * * * host * blueconnect backend=sched//mpi\n", 1, "got 'sched//mpi'"},
      {"allreduce * * * * host * blueconnect backend=\n", 1, "got ''"},
      {"allreduce * * * * host * blueconnect algo=rd\n", 1, "'algo' must be one of auto|ring"},
      {"* * * * * * * pmpi\nbcast * * * * host * pmpi extra\n", 2, "is not key=value"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.text);
    ParseError e = parse_bad(c.text);
    CHECK(e.source == "t.conf");
    CHECK(e.line == c.line);
    CHECK(e.reason.find(c.reason_part) != std::string::npos);
    CHECK(e.to_string().rfind("t.conf:" + std::to_string(c.line) + ": ", 0) == 0);
  }
}

TEST_CASE("STREAMCOLL_ROUTE forces routes in front of the table") {
  std::optional<ParseError> err;
  auto forced = TuningTable::parse_forced("allreduce:nccl, bcast:pmpi ,reduce:ht:algo=ring:chunk=64K", &err);
  REQUIRE_FALSE(err);
  REQUIRE(forced.size() == 3);
  TuningTable t = parse_ok("* * * * * * * pmpi\n");
  t.prepend(std::move(forced));
  REQUIRE(t.rules().size() == 4);
  CHECK(t.match(key(Coll::allreduce, 1 << 30, 4096, MemKind::host))->choice.route ==
        RouteId::nccl);
  CHECK(t.match(key(Coll::bcast, 0, 1, MemKind::device))->choice.route == RouteId::pmpi);
  const Rule* r = t.match(key(Coll::reduce, 8, 2, MemKind::pinned));
  CHECK(r->choice.route == RouteId::ht);
  CHECK(r->choice.param("algo") == std::string_view("ring"));
  CHECK(r->choice.param("chunk") == std::string_view("64K"));
  CHECK(r->origin == "STREAMCOLL_ROUTE");
  CHECK(r->forced);  // declining, it sends the call to pmpi
  CHECK(t.match(key(Coll::alltoall, 8, 2, MemKind::device))->choice.route == RouteId::pmpi);
  CHECK_FALSE(t.match(key(Coll::alltoall, 8, 2, MemKind::device))->forced);  // the file's rule
  CHECK(t.routes_host(Coll::allreduce));
  CHECK_FALSE(t.routes_host(Coll::alltoall));

  auto all = TuningTable::parse_forced("*:nccl", &err);
  REQUIRE(all.size() == 1);
  for (int c = 0; c < kNumColls; ++c) CHECK(((all[0].colls >> c) & 1u) == 1u);

  for (const char* bad : {"allreduce", "allreduce:", "allreduce:foo", "foo:nccl",
                          "allreduce:ht:algo=x", "allreduce:nccl,bcast"}) {
    CAPTURE(bad);
    std::optional<ParseError> e;
    CHECK(TuningTable::parse_forced(bad, &e).empty());
    REQUIRE(e);
    CHECK(e->source == "STREAMCOLL_ROUTE");
  }
}

TEST_CASE("the embedded default table: NCCL's six collectives on device memory, else pmpi") {
  std::optional<ParseError> err;
  TuningTable t = TuningTable::parse(default_table_text(), "<default>", &err);
  REQUIRE_FALSE(err);
  CHECK_FALSE(t.rules().empty());
  const Coll nccl_colls[] = {Coll::allreduce, Coll::reduce,
                             Coll::bcast,     Coll::allgather,
                             Coll::reduce_scatter_block, Coll::alltoall};
  for (int c = 0; c < kNumColls; ++c)
    for (MemKind m : {MemKind::host, MemKind::pinned, MemKind::device, MemKind::managed})
      for (uint64_t bytes : {uint64_t{8}, uint64_t{1} << 30}) {
        const Coll coll = static_cast<Coll>(c);
        const Rule* r = t.match(key(coll, bytes, 4, m));
        REQUIRE(r);
        bool nccl = m == MemKind::device;
        nccl = nccl && std::find(std::begin(nccl_colls), std::end(nccl_colls), coll) !=
                           std::end(nccl_colls);
        CAPTURE(name(coll));
        CAPTURE(name(m));
        CHECK(r->choice.route == (nccl ? RouteId::nccl : RouteId::pmpi));
      }
  // Host memory never leaves pmpi by default: the pass-through fast path stays on.
  for (int c = 0; c < kNumColls; ++c) {
    CHECK_FALSE(t.may_leave_pmpi(static_cast<Coll>(c), MemKind::host));
    CHECK_FALSE(t.routes_host(static_cast<Coll>(c)));
  }
}

TEST_CASE("the route table has one row per route, in RouteId order") {
  REQUIRE(route_table().size() == static_cast<size_t>(kNumRoutes));
  for (int r = 0; r < kNumRoutes; ++r) {
    const RouteInfo& info = route_table()[static_cast<size_t>(r)];
    CHECK(info.id == static_cast<RouteId>(r));
    CHECK_FALSE(info.name.empty());
    CHECK_FALSE(info.summary.empty());
    for (const ParamSpec& p : info.params) CHECK(p.key != "fuse");  // every route's, not one's
  }
}

TEST_CASE("streamcoll_route_name lists the route table's names, then NULL") {
  for (int r = 0; r < kNumRoutes; ++r) {
    REQUIRE(streamcoll_route_name(r) != nullptr);
    CHECK(std::string(streamcoll_route_name(r)) == std::string(name(static_cast<RouteId>(r))));
  }
  CHECK(streamcoll_route_name(kNumRoutes) == nullptr);
  CHECK(streamcoll_route_name(-1) == nullptr);
}

TEST_CASE("docs/reference.md's routes table is the one the route table generates") {
  // Regenerate: streamcoll-info --routes prints the table to paste between the markers.
  CHECK(reference_doc_section("routes") == config::routes_markdown());
}

TEST_CASE("names round-trip") {
  for (int c = 0; c < kNumColls; ++c)
    CHECK(parse_coll(name(static_cast<Coll>(c))) == static_cast<Coll>(c));
  for (int r = 0; r < kNumRoutes; ++r)
    CHECK(parse_route(name(static_cast<RouteId>(r))) == static_cast<RouteId>(r));
  for (int m = 0; m < kNumMemKinds; ++m)
    CHECK(parse_mem(name(static_cast<MemKind>(m))) == static_cast<MemKind>(m));
  CHECK_FALSE(parse_coll("iallreduce"));
  CHECK_FALSE(parse_route("NCCL"));
}

TEST_CASE("match after a rule: the next matching rule, for a route that declined") {
  auto t = parse_ok(
      "allreduce 0-1K * * * host * blueconnect hierarchy=3x3\n"
      "bcast     *    * * * host * ht\n"
      "allreduce *    * * * host * ht algo=ring\n"
      "*         *    * * * *    * pmpi\n");
  auto k = key(Coll::allreduce, 64, 2, MemKind::host);
  const Rule* first = t.match(k);
  REQUIRE(first == &t.rules()[0]);
  const Rule* second = t.match(k, first);
  REQUIRE(second == &t.rules()[2]);  // the bcast rule does not match
  CHECK(t.match(k, second) == &t.rules()[3]);
  CHECK(t.match(k, &t.rules()[3]) == nullptr);
  // above 1 KiB the first rule does not match at all
  CHECK(t.match(key(Coll::allreduce, 4096, 2, MemKind::host)) == &t.rules()[2]);
  // a rule of another table is not a position in this one
  auto other = parse_ok("* * * * * * * pmpi\n");
  CHECK(t.match(k, &other.rules()[0]) == nullptr);
}

TEST_CASE("a rule written back as a table line parses to the same rule") {
  TuningTable t = parse_ok(
      "allreduce,bcast 0-64K 2-8 1 * device,managed yes ht algo=rd chunk=4M\n"
      "* 65537- * 2- 4 * * nvgroup cross=ht hierarchy=4x2\n"
      "reduce_scatter_block 100 * * * pinned no blueconnect backend=nvgroup/nccl\n"
      "* * * * * * * pmpi\n");
  std::string again;
  for (const Rule& r : t.rules()) again += r.to_string() + "\n";
  CAPTURE(again);
  TuningTable u = parse_ok(again);
  REQUIRE(u.rules().size() == t.rules().size());
  for (size_t i = 0; i < t.rules().size(); ++i) {
    const Rule &a = t.rules()[i], &b = u.rules()[i];
    CHECK(a.colls == b.colls);
    CHECK(a.bytes.lo == b.bytes.lo);
    CHECK(a.bytes.hi == b.bytes.hi);
    CHECK(a.ranks.lo == b.ranks.lo);
    CHECK(a.ranks.hi == b.ranks.hi);
    CHECK(a.nodes.lo == b.nodes.lo);
    CHECK(a.ppn.hi == b.ppn.hi);
    CHECK(a.mems == b.mems);
    CHECK(a.stream == b.stream);
    CHECK(a.choice.route == b.choice.route);
    CHECK(a.choice.params == b.choice.params);
  }
  CHECK(t.rules()[0].to_string() == "allreduce,bcast 0-65536 2-8 1 * device,managed yes ht algo=rd chunk=4M");
  CHECK(t.rules()[3].to_string() == "* * * * * * * pmpi");
}

TEST_CASE("RuleWalk: the rules a call is offered to, in order, as dispatch and fusion walk them") {
  TuningTable t = parse_ok(R"(
allreduce   0-32K  *  *  *  device  *  ht algo=rd
allreduce   *      *  *  *  device  *  nccl
allreduce   *      *  *  *  device  *  blueconnect
allreduce   *      *  *  *  device  *  pmpi
allreduce   *      *  *  *  device  *  nvgroup
)");
  const CallKey k = key(Coll::allreduce, 1024, 4, MemKind::device);
  auto routes = [](RuleWalk w) {
    std::vector<RouteId> seen;
    for (const Rule* r = w.rule(); r; r = w.next()) seen.push_back(r->choice.route);
    return seen;
  };
  using V = std::vector<RouteId>;
  // The table's matches in order; a pmpi rule ends the walk (nvgroup after it never comes).
  CHECK(routes(RuleWalk(t, nullptr, k)) ==
        V{RouteId::ht, RouteId::nccl, RouteId::blueconnect, RouteId::pmpi});
  const CallKey big = key(Coll::allreduce, 1 << 20, 4, MemKind::device);
  CHECK(routes(RuleWalk(t, nullptr, big)) == V{RouteId::nccl, RouteId::blueconnect, RouteId::pmpi});
  CHECK(routes(RuleWalk(t, nullptr, key(Coll::bcast, 8, 4, MemKind::device))).empty());

  // A cached prefix of the matches: walked first, then the table from the last one on
  // when more may follow (overflow), else the walk ends with the prefix.
  const Rule* prefix[2] = {t.match(k), t.match(k, t.match(k))};
  CHECK(routes(RuleWalk(t, nullptr, k, prefix, 2, true)) ==
        V{RouteId::ht, RouteId::nccl, RouteId::blueconnect, RouteId::pmpi});
  CHECK(routes(RuleWalk(t, nullptr, k, prefix, 2, false)) == V{RouteId::ht, RouteId::nccl});
  CHECK(routes(RuleWalk(t, nullptr, k, prefix, 0, false)).empty());

  // A forced rule is offered alone: when it declines, the call goes to pmpi.
  std::optional<ParseError> err;
  auto forced = TuningTable::parse_forced("allreduce:blueconnect", &err);
  REQUIRE(!err);
  REQUIRE(forced.size() == 1);
  CHECK(routes(RuleWalk(t, &forced[0], k)) == V{RouteId::blueconnect});
  CHECK(routes(RuleWalk(t, &forced[0], k, prefix, 2, true)) == V{RouteId::blueconnect});
}

TEST_CASE("parse_call: a call as a person writes it, for streamcoll-info --explain") {
  CallKey k;
  std::string err;
  REQUIRE(parse_call("allreduce 8 device 64 ranks 8 nodes", &k, &err));
  CHECK(k.coll == Coll::allreduce);
  CHECK(k.bytes == 8);
  CHECK(k.mem == MemKind::device);
  CHECK(k.ranks == 64);
  CHECK(k.nodes == 8);
  CHECK(k.ppn == 8);
  CHECK_FALSE(k.stream);
  REQUIRE(parse_call("stream 4K, bcast 3 ranks", &k, &err));  // any order, commas
  CHECK(k.coll == Coll::bcast);
  CHECK(k.bytes == 4096);
  CHECK(k.mem == MemKind::host);
  CHECK(k.ranks == 3);
  CHECK(k.nodes == 1);
  CHECK(k.ppn == 3);
  CHECK(k.stream);
  CHECK_FALSE(parse_call("8 device", &k, &err));
  CHECK(err.find("no collective") != std::string::npos);
  CHECK_FALSE(parse_call("allreduce 8 nowhere", &k, &err));
  CHECK(err.find("'nowhere'") != std::string::npos);
  CHECK_FALSE(parse_call("allreduce 8 2 ranks 4 nodes", &k, &err));  // more nodes than ranks
  CHECK_FALSE(parse_call("allreduce 8 16", &k, &err));                // two sizes
}

TEST_CASE("explain: the rules a call is offered to, and its route") {
  TuningTable t = parse_ok(R"(
allreduce 0-1K * * * device * nvgroup
allreduce * * * * device * nccl
* * * * * * * pmpi
)");
  CallKey k;
  std::string err;
  REQUIRE(parse_call("allreduce 512 device 4 ranks", &k, &err));
  auto all = [](RouteId) { return true; };
  auto no_nvgroup = [](RouteId r) { return r != RouteId::nvgroup; };
  const std::string both = explain(t, k, all);
  CHECK(both.find("t.conf:2") != std::string::npos);
  CHECK(both.find("t.conf:3") != std::string::npos);
  CHECK(both.find("-> nvgroup") != std::string::npos);
  // A route not in this build hands the call to the next rule, as dispatch does.
  const std::string without = explain(t, k, no_nvgroup);
  CHECK(without.find("not in this build") != std::string::npos);
  CHECK(without.find("-> nccl") != std::string::npos);
  REQUIRE(parse_call("allreduce 4K device 4 ranks", &k, &err));
  CHECK(explain(t, k, all).find("-> nccl") != std::string::npos);
  REQUIRE(parse_call("bcast 8 host 2 ranks", &k, &err));
  CHECK(explain(t, k, all).find("-> pmpi") != std::string::npos);
  // A forced rule is offered alone.
  std::optional<ParseError> perr;
  t.prepend(TuningTable::parse_forced("allreduce:ht", &perr));
  REQUIRE(!perr);
  REQUIRE(parse_call("allreduce 512 device 4 ranks", &k, &err));
  const std::string forced = explain(t, k, all);
  CHECK(forced.find("-> ht") != std::string::npos);
  CHECK(forced.find("t.conf:2") == std::string::npos);
}
