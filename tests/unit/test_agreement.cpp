// SignatureAgreements (core/agreement.hpp): which call of a signature agrees at once, which
// starts a refresh, and which agreement's facts each call decides from. One process: the
// agreements run on MPI_COMM_SELF, with `size` 2 so that they go through the MPI's
// PMPI_Allreduce / PMPI_Iallreduce as with more ranks.
#include <doctest/doctest.h>
#include <mpi.h>

#include <algorithm>
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

// Runs `calls` cacheable pmpi calls of one signature whose rank facts are kind_of(n) (on
// MPI_COMM_SELF, size 2); returns the calls that started a refresh.
template <class Kind>
std::vector<uint64_t> refreshes_over(SignatureAgreements& sig, uint64_t calls, Kind kind_of) {
  std::vector<uint64_t> points;
  for (uint64_t n = 1; n <= calls; ++n) {
    if (sig.begin_call()) {
      sig.agree(MPI_COMM_SELF, 2, facts_of(kind_of(n)));
    } else {
      sig.adopt();
      if (sig.refreshes()) {
        sig.refresh(MPI_COMM_SELF, 2, facts_of(kind_of(n)));
        points.push_back(n);
      }
    }
    sig.decided(true, false);
  }
  return points;
}

TEST_CASE("refresh points: 2, 3, 5, ..., 65, then a gap doubling up to kRefreshMax while the "
          "facts stand") {
  SignatureAgreements sig;
  const auto points = refreshes_over(sig, 5200, [](uint64_t) { return MemKind::host; });
  CHECK(points == std::vector<uint64_t>{2, 3, 5, 9, 17, 33, 65, 129, 257, 513, 1025, 2049, 3073,
                                        4097, 5121});
  CHECK(SignatureAgreements::kRefreshMax == 1024);
}

TEST_CASE("a refresh that finds the facts changed brings the gap back to kRefreshEvery") {
  SignatureAgreements sig;
  // Device memory from call 600 on: seen by the refresh of call 1025 (adopted at 1029),
  // within kRefreshMax + kRunAhead calls; the next refresh then comes 64 calls later
  // (1093), and the gap doubles again from there (1157, 1285) while the facts stand.
  const auto points = refreshes_over(
      sig, 1400, [](uint64_t n) { return n >= 600 ? MemKind::device : MemKind::host; });
  CHECK(points == std::vector<uint64_t>{2, 3, 5, 9, 17, 33, 65, 129, 257, 513, 1025, 1093, 1157,
                                        1285});
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
  uint64_t scheduled_next = 2;
  for (uint64_t n = 2; n <= 200; ++n) {
    CHECK_FALSE(sig.begin_call());
    sig.adopt();
    const bool scheduled = n == scheduled_next;
    if (scheduled) scheduled_next = sig.next_refresh();
    const bool expect = scheduled || n % SignatureAgreements::kRefreshRouted == 0;
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

TEST_CASE("the steady path takes every call but those that start or adopt a refresh, and "
          "counts them as the full path does") {
  // Two copies of one rank's signature: one decides every call in full, the other lets the
  // steady path take each call it may. The refreshes must start at the same calls (the
  // steady path is taken on one rank and not on another: their counts must stay equal).
  SignatureAgreements full, steady;
  std::vector<uint64_t> full_points, steady_points, left;  // left: calls steady left to full
  constexpr uint64_t D = SignatureAgreements::kRunAhead;
  for (uint64_t n = 1; n <= 3000; ++n) {
    // the full path
    if (full.begin_call()) full.agree(MPI_COMM_SELF, 2, facts_of(MemKind::host));
    else full.adopt();
    if (n > 1 && full.refreshes()) {
      full.refresh(MPI_COMM_SELF, 2, facts_of(MemKind::host));
      full_points.push_back(n);
    }
    full.decided(true, false, true);
    // the steady path where it may, the full path where it may not
    if (steady.steady_call()) {
      CHECK(steady.calls() == n);
      continue;
    }
    left.push_back(n);
    if (steady.begin_call()) steady.agree(MPI_COMM_SELF, 2, facts_of(MemKind::host));
    else steady.adopt();
    if (n > 1 && steady.refreshes()) {
      steady.refresh(MPI_COMM_SELF, 2, facts_of(MemKind::host));
      steady_points.push_back(n);
    }
    steady.decided(true, false, true);
    CHECK(steady.steady());
  }
  CHECK(full_points == steady_points);
  CHECK(full.calls() == steady.calls());
  // What the steady path left: call 1, every refresh, and every adoption (kRunAhead later).
  std::vector<uint64_t> expected{1};
  for (uint64_t p : full_points) {
    expected.push_back(p);
    expected.push_back(p + D);
  }
  std::sort(expected.begin(), expected.end());
  expected.erase(std::unique(expected.begin(), expected.end()), expected.end());
  while (!expected.empty() && expected.back() > 3000) expected.pop_back();
  CHECK(left == expected);
  // A decision that says not steady (or a call that is not cacheable) stops it.
  steady.decided(true, false, false);
  CHECK_FALSE(steady.steady());
  CHECK_FALSE(steady.steady_call());
  steady.decided(false, false, true);
  CHECK_FALSE(steady.steady_call());
}
