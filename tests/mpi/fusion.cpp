// MPI_Iallreduce fusion (algorithms/fusion.hpp) against the real MPI: exact results for every
// datatype and op the routes carry, with ranks that wait and test at different points.
//
//   fusion [--spec=SPEC] [--limit=SIZE] [--expect-fused] [--all-on=ROUTE] [--some-on=ROUTE]
// SPEC (default "allreduce:pmpi:fuse=4K") is forced on the program's communicators with
// streamcoll_comm_set_route, found with dlsym so that the same program runs without
// streamcoll (run.sh plain: the reference); "table": nothing forced (the tuning table's
// fuse= rules). --limit: the fuse= limit the calls are sized around (default: the spec's,
// else 4K). --expect-fused: streamcoll must have fused calls (streamcoll_fusion_counts:
// fewer fused messages than calls). --all-on / --some-on: every fused message, or at
// least one, ran on ROUTE (streamcoll_fusion_messages_on).
//
// Every phase runs under an alarm: a hang fails the test within a minute.
#include <dlfcn.h>
#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "harness.hpp"
#include "type_table.hpp"
#include "value_model.hpp"

namespace {

int g_rank = 0, g_size = 1;
int g_failures = 0;
int g_checks = 0;
const char* g_phase = "start";

using SetRoute = int (*)(MPI_Comm, const char*);
using FusionCounts = void (*)(unsigned long long*, unsigned long long*, unsigned long long*);
using MessagesOn = unsigned long long (*)(const char*);
SetRoute g_set_route = nullptr;
FusionCounts g_counts = nullptr;

void fail(const std::string& what) {
  ++g_failures;
  if (g_failures <= 20) std::fprintf(stderr, "rank %d [%s]: %s\n", g_rank, g_phase, what.c_str());
}

void on_alarm(int) {
  char msg[160];
  const int n = std::snprintf(msg, sizeof msg, "rank %d: timed out in phase %s (a hang)\n",
                              g_rank, g_phase);
  if (write(2, msg, static_cast<size_t>(n)) < 0) {}
  _exit(3);
}

void phase(const char* name) {
  g_phase = name;
  alarm(60);
}

MPI_Comm fused_comm(const std::string& spec) {
  MPI_Comm c;
  MPI_Comm_dup(MPI_COMM_WORLD, &c);
  if (g_set_route && spec != "table" && g_set_route(c, spec.c_str()) != MPI_SUCCESS)
    fail("streamcoll_comm_set_route");
  // A blocking call agrees on the facts later MPI_Iallreduce calls are routed from (and
  // makes the fusion queue).
  int one = 1, sum = 0;
  MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, c);
  if (sum != g_size) fail("warm-up allreduce");
  return c;
}

// One MPI_Iallreduce of the test, with what it must produce.
struct Call {
  const TypeDesc* t = nullptr;
  Op op = Op::sum;
  size_t n = 0;
  uint64_t salt = 0;
  bool in_place = false;
  Buffer send, recv;
  MPI_Request req = MPI_REQUEST_NULL;
};

uint64_t g_salt = 1;

void start(Call& c, const TypeDesc& t, Op op, size_t n, bool in_place, MPI_Comm comm) {
  c.t = &t;
  c.op = op;
  c.n = n;
  c.salt = g_salt++;
  c.in_place = in_place;
  c.send = Buffer(n, t.k.size);
  c.recv = Buffer(n, t.k.size);
  t.k.fill(in_place ? c.recv.data() : c.send.data(), n, op, g_rank, 0, c.salt, tame_inputs(t, op));
  const int rc = MPI_Iallreduce(in_place ? MPI_IN_PLACE : c.send.data(), c.recv.data(),
                                static_cast<int>(n), t.handle, handle_of(op), comm, &c.req);
  if (rc != MPI_SUCCESS) fail(std::string("MPI_Iallreduce returned an error on ") + t.name);
}

void check(const Call& c) {
  ++g_checks;
  Buffer want(c.n, c.t->k.size);
  c.t->k.reduce(want.data(), c.n, c.op, g_size, 0, c.salt, tame_inputs(*c.t, c.op));
  const size_t bad = c.t->k.mismatch(c.recv.data(), want.data(), 0, c.n);
  if (bad != c.n)
    fail(std::string(c.t->name) + " " + name_of(c.op) + " n=" + std::to_string(c.n) +
         (c.in_place ? " in place" : "") + ": element " + std::to_string(bad) + " is " +
         c.t->k.show(c.recv.data(), bad) + ", expected " + c.t->k.show(want.data(), bad));
}

void complete(std::vector<Call>& calls, Completion how) {
  std::vector<MPI_Request> reqs;
  for (Call& c : calls) reqs.push_back(c.req);
  int rc = MPI_SUCCESS;
  const std::string problem = complete_requests(reqs, how, &rc);
  if (rc != MPI_SUCCESS) fail(std::string(describe(how)) + " returned an error");
  if (!problem.empty()) fail(std::string(describe(how)) + ": " + problem);
  for (Call& c : calls) c.req = MPI_REQUEST_NULL;
  for (const Call& c : calls) check(c);
}

// Every routable datatype with each of its ops, three calls each (sizes 0 and up, in place
// and not) plus one call above the fuse limit (not fused), started as one sequence per
// datatype and completed by a completion call that differs between ranks.
void all_types(MPI_Comm comm, uint64_t limit) {
  phase("every datatype and op");
  static const size_t kCounts[] = {1, 3, 0, 17, 40};
  int ti = 0;
  for (const TypeDesc& t : all_types()) {
    if (!t.routable() || ops_for(t.cls).empty()) continue;
    std::vector<Call> calls;
    calls.reserve(64);
    for (Op op : ops_for(t.cls)) {
      for (int j = 0; j < 3; ++j) {
        calls.emplace_back();
        start(calls.back(), t, op, kCounts[(j + ti) % 5], (j + ti) % 2 == 0, comm);
      }
      if (ti % 3 == 0) {  // one too large to fuse, between fused ones
        calls.emplace_back();
        start(calls.back(), t, op, limit / t.k.size + 3, false, comm);
      }
    }
    complete(calls, static_cast<Completion>((g_rank + ti) % kNumCompletions));
    ++ti;
  }
}

// The example, generalised: each rank waits for or tests the calls started so far
// at its own points (rank 0 may start a, b and wait; rank 1 start a, wait, start b).
void local_waits(MPI_Comm comm) {
  phase("waits at rank-local points");
  const TypeDesc& dbl = type_named("MPI_DOUBLE");
  const TypeDesc& i32 = type_named("MPI_INT");
  for (int round = 0; round < 40; ++round) {
    std::vector<Call> calls(12);
    size_t waited = 0;
    for (size_t i = 0; i < calls.size(); ++i) {
      const bool ints = (i / 4 + static_cast<size_t>(round)) % 3 == 0;  // runs of 4 change type
      start(calls[i], ints ? i32 : dbl, ints ? Op::max : Op::sum, 1 + (i * 7 + round) % 9,
            i % 3 == 0, comm);
      const uint64_t h = mix(static_cast<uint64_t>(g_rank) << 32 ^ static_cast<uint64_t>(round) << 8 ^ i);
      if (h % 4 == 0) {  // wait for everything so far
        std::vector<Call> head;  // those not found complete by a test already
        for (size_t j = waited; j <= i; ++j)
          if (calls[j].req != MPI_REQUEST_NULL) head.push_back(std::move(calls[j]));
        complete(head, static_cast<Completion>(h / 4 % kNumCompletions));
        waited = i + 1;
      } else if (h % 4 == 1) {  // test the newest once
        int flag = 0;
        MPI_Test(&calls[i].req, &flag, MPI_STATUS_IGNORE);
        if (flag) {
          check(calls[i]);
          calls[i].req = MPI_REQUEST_NULL;
        }
      }
    }
    std::vector<Call> rest;
    for (size_t i = waited; i < calls.size(); ++i)
      if (calls[i].req != MPI_REQUEST_NULL) rest.push_back(std::move(calls[i]));
    complete(rest, static_cast<Completion>((round + g_rank) % kNumCompletions));
  }
}

// A rank waits for a call that the others have started but do not wait for until it has
// joined them elsewhere: in a blocking call on another communicator, in a receive, or in a
// long computation. The MPI completes the call (progress); so must fusion.
void progress(MPI_Comm comm) {
  phase("progress while other ranks are elsewhere");
  const TypeDesc& i64 = type_named("MPI_INT64_T");
  for (int variant = 0; variant < 3; ++variant) {
    std::vector<Call> a(1);
    start(a[0], i64, Op::sum, 5, false, comm);
    if (g_rank == 0) {
      complete(a, Completion::wait);
      if (variant == 0) MPI_Barrier(MPI_COMM_WORLD);
      if (variant == 1 && g_size > 1) {
        int token = 7;
        MPI_Send(&token, 1, MPI_INT, 1, 11, MPI_COMM_WORLD);
      }
    } else {
      if (variant == 0) MPI_Barrier(MPI_COMM_WORLD);
      if (variant == 1 && g_rank == 1) {
        int token = 0;
        MPI_Recv(&token, 1, MPI_INT, 0, 11, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        if (token != 7) fail("token");
      }
      if (variant == 2) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      complete(a, g_rank % 2 ? Completion::testall : Completion::waitany);
    }
  }
}

// Other calls on the same communicator between fused ones, and two communicators whose
// fused calls interleave. (MPI_Request_free on a non-blocking collective's request is
// erroneous: MPI-4.0 section 5.12.)
void interleaved(MPI_Comm c1, MPI_Comm c2) {
  phase("interleaved with other calls and communicators");
  const TypeDesc& flt = type_named("MPI_FLOAT");
  const TypeDesc& u16 = type_named("MPI_UINT16_T");
  for (int round = 0; round < 10; ++round) {
    std::vector<Call> on1(4), on2(4);
    start(on1[0], flt, Op::sum, 8, false, c1);
    start(on2[0], u16, Op::bor, 3, false, c2);
    int root_value = g_rank == round % g_size ? 100 + round : -1;
    MPI_Bcast(&root_value, 1, MPI_INT, round % g_size, c1);
    if (root_value != 100 + round) fail("bcast between fused calls");
    start(on1[1], flt, Op::sum, 8, true, c1);
    start(on2[1], u16, Op::bor, 3, true, c2);
    MPI_Request ib;
    MPI_Ibarrier(c2, &ib);
    start(on1[2], flt, Op::max, 2, false, c1);
    start(on2[2], u16, Op::band, 1, false, c2);
    start(on1[3], flt, Op::sum, 8, false, c1);
    start(on2[3], u16, Op::bor, 3, false, c2);
    MPI_Wait(&ib, MPI_STATUS_IGNORE);
    if (g_rank % 2) {
      complete(on2, Completion::waitsome);
      complete(on1, Completion::testany);
    } else {
      complete(on1, Completion::waitall);
      complete(on2, Completion::test);
    }
  }
  MPI_Barrier(c1);
}

}  // namespace

int main(int argc, char** argv) {
  std::string spec = "allreduce:pmpi:fuse=4K";
  std::string limit_text, all_on, some_on;
  bool expect_fused = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--spec=", 7) == 0) spec = argv[i] + 7;
    else if (std::strncmp(argv[i], "--limit=", 8) == 0) limit_text = argv[i] + 8;
    else if (std::strncmp(argv[i], "--all-on=", 9) == 0) all_on = argv[i] + 9;
    else if (std::strncmp(argv[i], "--some-on=", 10) == 0) some_on = argv[i] + 10;
    else if (std::strcmp(argv[i], "--expect-fused") == 0) expect_fused = true;
    else {
      std::fprintf(stderr, "fusion: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  signal(SIGALRM, on_alarm);
  alarm(60);
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SINGLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  g_set_route = reinterpret_cast<SetRoute>(dlsym(RTLD_DEFAULT, "streamcoll_comm_set_route"));
  g_counts = reinterpret_cast<FusionCounts>(dlsym(RTLD_DEFAULT, "streamcoll_fusion_counts"));
  auto messages_on = reinterpret_cast<MessagesOn>(dlsym(RTLD_DEFAULT, "streamcoll_fusion_messages_on"));
  uint64_t limit = 4096;  // fuse= of the spec, or --limit: "4K", "1M", "512"
  if (const size_t k = spec.find("fuse="); limit_text.empty() && k != std::string::npos)
    limit_text = spec.substr(k + 5);
  if (!limit_text.empty()) {
    size_t end = 0;
    limit = std::stoull(limit_text, &end);
    const char unit = end < limit_text.size() ? limit_text[end] : ' ';
    limit <<= unit == 'K' ? 10 : unit == 'M' ? 20 : 0;
  }

  MPI_Comm c1 = fused_comm(spec), c2 = fused_comm(spec);
  all_types(c1, limit);
  local_waits(c1);
  progress(c1);
  interleaved(c1, c2);

  phase("summary");
  unsigned long long calls = 0, messages = 0, agreements = 0;
  if (g_counts) g_counts(&calls, &messages, &agreements);
  if (expect_fused && (!g_counts || calls == 0 || messages >= calls))
    fail("expected fused calls: " + std::to_string(calls) + " calls fused into " +
         std::to_string(messages) + " messages");
  unsigned long long on_all = 0, on_some = 0;
  if (!all_on.empty()) {
    on_all = messages_on ? messages_on(all_on.c_str()) : 0;
    if (!messages_on || on_all != messages || messages == 0)
      fail("expected every fused message on route " + all_on + ": " + std::to_string(on_all) +
           " of " + std::to_string(messages));
  }
  if (!some_on.empty()) {
    on_some = messages_on ? messages_on(some_on.c_str()) : 0;
    if (on_some == 0) fail("expected fused messages on route " + some_on + ": none");
  }
  int failures = 0;
  MPI_Allreduce(&g_failures, &failures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (g_rank == 0)
    std::printf("fusion: %d ranks, %d checks on rank 0, %llu calls fused into %llu messages "
                "(%llu agreements; on pmpi %llu, on ht %llu) on rank 0, %d failures\n",
                g_size, g_checks, calls, messages, agreements,
                messages_on ? messages_on("pmpi") : 0ull, messages_on ? messages_on("ht") : 0ull,
                failures);
  MPI_Comm_free(&c1);
  MPI_Comm_free(&c2);
  MPI_Finalize();
  return failures == 0 ? 0 : 1;
}
