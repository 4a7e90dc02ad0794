// Communicator contexts: created once per communicator, by blocking calls only, with the
// node layout; freed by MPI_Comm_free and by the runtime's stop before MPI_Finalize.
// Linked against the library's internals; run with 1 to 4 ranks, on one node or spread
// over several (scripts/cluster.sh): the layout expected is computed here from the ranks'
// host names, independently of the shared-memory split streamcoll makes.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <mpi.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "core/comm_context.hpp"
#include "core/runtime.hpp"

using namespace streamcoll;

namespace {
int world_size() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

// The node layout of `comm` from its ranks' processor names (host names).
struct Layout {
  int nodes = 0, ppn = 0, local_size = 0;
  bool uniform = true;
  std::vector<int> node_of;  // per rank: the lowest rank with its host name
};
Layout layout_by_name(MPI_Comm comm) {
  int size = 0, len = 0;
  MPI_Comm_size(comm, &size);
  std::vector<char> mine(MPI_MAX_PROCESSOR_NAME, '\0'), all(static_cast<size_t>(size) * MPI_MAX_PROCESSOR_NAME);
  MPI_Get_processor_name(mine.data(), &len);
  MPI_Allgather(mine.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME,
                MPI_CHAR, comm);
  std::map<std::string, int> count;
  for (int r = 0; r < size; ++r) ++count[std::string(&all[static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME])];
  Layout l;
  l.nodes = static_cast<int>(count.size());
  for (const auto& [name, n] : count) {
    l.ppn = std::max(l.ppn, n);
    l.uniform = l.uniform && n == count.begin()->second;
  }
  l.local_size = count[std::string(mine.data())];
  std::map<std::string, int> lowest;
  for (int r = 0; r < size; ++r) {
    const std::string name(&all[static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME]);
    lowest.emplace(name, r);
    l.node_of.push_back(lowest[name]);
  }
  return l;
}
}  // namespace

TEST_CASE("a context per communicator, with the node layout") {
  REQUIRE(Runtime::get().active());
  const size_t live = comm_contexts_live();
  CommContext* w = comm_context(MPI_COMM_WORLD, true);
  REQUIRE(w != nullptr);
  CHECK(comm_context(MPI_COMM_WORLD, true) == w);
  CHECK(comm_context(MPI_COMM_WORLD, false) == w);
  CHECK(comm_contexts_live() == live + 1);
  CHECK(w->size == world_size());
  CHECK_FALSE(w->inter);
  const Layout want = layout_by_name(MPI_COMM_WORLD);
  CHECK(w->nodes == want.nodes);
  CHECK(w->ppn == want.ppn);
  CHECK(w->uniform == want.uniform);
  CHECK(w->local_size == want.local_size);
  CHECK(w->node_of == want.node_of);
  CHECK(w->local != MPI_COMM_NULL);
}

TEST_CASE("non-blocking calls never create one; MPI_Comm_free frees it") {
  MPI_Comm dup;
  MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  const size_t live = comm_contexts_live();
  CHECK(comm_context(dup, false) == nullptr);
  CHECK(comm_contexts_live() == live);
  CommContext* c = comm_context(dup, true);
  REQUIRE(c != nullptr);
  CHECK(c->comm == dup);
  CHECK(comm_contexts_live() == live + 1);
  // MPI_Comm_dup does not copy it (null copy callback).
  MPI_Comm dup2;
  MPI_Comm_dup(dup, &dup2);
  CHECK(comm_context(dup2, false) == nullptr);
  MPI_Comm_free(&dup2);
  MPI_Comm_free(&dup);
  CHECK(comm_contexts_live() == live);
}

TEST_CASE("a lookup remembered by the thread does not outlive its context") {
  // comm_context remembers the thread's last find; an MPI may give a freed communicator's
  // handle to the next one made (both MPIs here do, often), which has no context yet.
  int reused = 0;
  for (int i = 0; i < 8; ++i) {
    MPI_Comm a;
    MPI_Comm_dup(MPI_COMM_WORLD, &a);
    CommContext* c = comm_context(a, true);
    REQUIRE(c != nullptr);
    CHECK(comm_context(a, false) == c);  // remembered now
    const MPI_Comm old = a;
    MPI_Comm_free(&a);
    MPI_Comm b;
    MPI_Comm_dup(MPI_COMM_WORLD, &b);
    reused += b == old;
    CHECK(comm_context(b, false) == nullptr);
    CommContext* d = comm_context(b, true);
    REQUIRE(d != nullptr);
    CHECK(d->comm == b);
    CHECK(comm_context(b, false) == d);
    // Two communicators in turn: each finds its own.
    CHECK(comm_context(MPI_COMM_WORLD, false) != d);
    CHECK(comm_context(b, false) == d);
    MPI_Comm_free(&b);
  }
  MESSAGE("handles reused by the MPI: " << reused << " of 8");
}

TEST_CASE("split communicators get their own layout") {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm half;
  MPI_Comm_split(MPI_COMM_WORLD, rank % 2, -rank, &half);
  CommContext* c = comm_context(half, true);
  REQUIRE(c != nullptr);
  int size = 0, hrank = 0;
  MPI_Comm_size(half, &size);
  MPI_Comm_rank(half, &hrank);
  CHECK(c->size == size);
  CHECK(c->rank == hrank);
  CHECK(c->ppn == layout_by_name(half).ppn);
  CHECK(c->nodes == layout_by_name(half).nodes);
  CHECK(c->node_of == layout_by_name(half).node_of);
  MPI_Comm_free(&half);
}

TEST_CASE("an inter-communicator gets a context that routes nothing") {
  if (world_size() < 2) return;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm half, inter;
  MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &half);
  MPI_Intercomm_create(half, 0, MPI_COMM_WORLD, rank % 2 == 0 ? 1 : 0, 7, &inter);
  CommContext* c = comm_context(inter, true);
  REQUIRE(c != nullptr);
  CHECK(c->inter);
  CHECK(c->local == MPI_COMM_NULL);
  MPI_Comm_free(&inter);
  MPI_Comm_free(&half);
}

TEST_CASE("the runtime's stop frees every context left") {
  MPI_Comm keep;
  MPI_Comm_dup(MPI_COMM_WORLD, &keep);
  REQUIRE(comm_context(keep, true) != nullptr);
  CHECK(comm_contexts_live() >= 2);  // world and keep
  Runtime::get().stop();
  CHECK(comm_contexts_live() == 0);
  CHECK_FALSE(Runtime::get().active());
  MPI_Comm_free(&keep);  // no context left on it: must not crash
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  doctest::Context ctx(argc, argv);
  ctx.setOption("order-by", "file");
  int rc = ctx.run();
  MPI_Finalize();
  return rc;
}
