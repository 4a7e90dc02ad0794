// SignatureAgreements (core/agreement.hpp): which call of a signature agrees at once, which
// starts a refresh, and which agreement's facts each call decides from. One process: the
// agreements run on MPI_COMM_SELF, with `size` 2 so that they go through the MPI's
// PMPI_Allreduce / PMPI_Iallreduce as with more ranks.
#include <doctest/doctest.h>
#include <mpi.h>

#include <vector>

#include "core/agreement.hpp"

using namespace streamcoll;

namespace {

LocalFacts facts_of(MemKind m) {
  LocalFacts f;
  f.mem = m;
  return f;
}

// The memory kind of call n (1-based) in the scripted program below: host, except calls
// in [40, 140) on device memory.
MemKind kind_at(uint64_t n) { return n >= 40 && n < 140 ? MemKind::device : MemKind::host; }

}  // namespace

TEST_CASE("refresh points: 2, 3, 5, 9, ..., 65, then every 64th call") {
  std::vector<uint64_t> points;
  for (uint64_t n = 1; n <= 300; ++n)
    if (SignatureAgreements::refresh_point(n)) points.push_back(n);
  CHECK(points == std::vector<uint64_t>{2, 3, 5, 9, 17, 33, 65, 129, 193, 257});
}

TEST_CASE("each call decides from the newest refresh started kRunAhead calls before it") {
  SignatureAgreements sig;
  constexpr uint64_t D = SignatureAgreements::kRunAhead;
  uint64_t last_refresh = 0;   // the newest refresh started at most D calls ago, 0: none
  std::vector<uint64_t> started;  // refreshes started, by call
  for (uint64_t n = 1; n <= 300; ++n) {
    const bool now = sig.begin_call();
    CHECK(sig.calls() == n);
    CHECK(now == (n == 1));  // every call goes to pmpi here: only the first agrees
    AgreedFacts f;
    if (now) {
      f = sig.agree(MPI_COMM_SELF, 2, facts_of(kind_at(n)));
    } else {
      f = sig.adopt();
      CHECK(sig.refreshes() == SignatureAgreements::refresh_point(n));
      if (sig.refreshes()) {
        sig.refresh(MPI_COMM_SELF, 2, facts_of(kind_at(n)));
        started.push_back(n);
      }
    }
    for (uint64_t j : started)
      if (j + D <= n) last_refresh = j;
    const MemKind expected = kind_at(last_refresh ? last_refresh : 1);
    CHECK_MESSAGE(f.mem == expected, "call " << n);
    CHECK(f.valid);
    CHECK(f.routable);
    // The device phase [40, 140) is seen from call 69 (the refresh of call 65) to call 196
    // (the refresh of call 129 still in it; call 193's, host again, from call 197).
    if (n == 68 || n == 197) CHECK(f.mem == MemKind::host);
    if (n == 69 || n == 196) CHECK(f.mem == MemKind::device);
    sig.decided(true, false);
  }
  CHECK(sig.started() == started.size());
}

TEST_CASE("a call that leaves pmpi makes the next one agree at once; agree() waits for the "
          "refreshes in flight") {
  SignatureAgreements sig;
  CHECK(sig.begin_call());
  sig.agree(MPI_COMM_SELF, 2, facts_of(MemKind::host));
  sig.decided(true, false);
  CHECK_FALSE(sig.begin_call());  // call 2: a refresh
  sig.adopt();
  REQUIRE(sig.refreshes());
  sig.refresh(MPI_COMM_SELF, 2, facts_of(MemKind::device));
  sig.decided(false, true);  // say its facts took it elsewhere
  CHECK(sig.begin_call());  // call 3 agrees at once
  const AgreedFacts f = sig.agree(MPI_COMM_SELF, 2, facts_of(MemKind::managed));
  CHECK(f.mem == MemKind::managed);
  sig.decided(true, false);
  CHECK_FALSE(sig.begin_call());  // call 4: decides from call 3's agreement, not call 2's
  CHECK(sig.adopt().mem == MemKind::managed);
}

TEST_CASE("ranks that disagree on the memory kind give a fact that is not routable") {
  SignatureAgreements sig;
  sig.begin_call();
  LocalFacts mine = facts_of(MemKind::device);
  mine.ineligible = true;
  const AgreedFacts f = sig.agree(MPI_COMM_SELF, 2, mine);
  CHECK(f.valid);
  CHECK_FALSE(f.routable);
}

TEST_CASE("calls that leave pmpi refresh every kRefreshRouted-th call as well") {
  SignatureAgreements sig;
  sig.begin_call();
  sig.agree(MPI_COMM_SELF, 2, facts_of(MemKind::device));
  sig.decided(true, true);
  std::vector<uint64_t> refreshed;
  for (uint64_t n = 2; n <= 200; ++n) {
    CHECK_FALSE(sig.begin_call());
    sig.adopt();
    const bool expect = SignatureAgreements::refresh_point(n) ||
                        n % SignatureAgreements::kRefreshRouted == 0;
    CHECK_MESSAGE(sig.refreshes() == expect, "call " << n);
    if (sig.refreshes()) {
      sig.refresh(MPI_COMM_SELF, 2, facts_of(MemKind::device));
      refreshed.push_back(n);
    }
    sig.decided(true, true);
  }
  // Never more than kRefreshRouted calls between two refreshes.
  for (size_t i = 1; i < refreshed.size(); ++i)
    CHECK(refreshed[i] - refreshed[i - 1] <= SignatureAgreements::kRefreshRouted);
}
