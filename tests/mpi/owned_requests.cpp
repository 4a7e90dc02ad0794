// The owned-request mechanism of the wait/test wrappers (core/requests.hpp), with real
// generalized requests mixed with real point-to-point requests in the same arrays.
// Linked against the library's internals; runs on one rank (messages to itself).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <mpi.h>

#include <vector>

#include "core/requests.hpp"

using streamcoll::OwnedRequest;
namespace req = streamcoll::requests;

namespace {

// A generalized request that completes when told to, counting the hooks it receives.
// complete_after_tests: on_test completes it on that many-th call (0: never).
class Probe final : public OwnedRequest {
 public:
  explicit Probe(int complete_after_tests = 0) : after_(complete_after_tests) {
    MPI_Grequest_start(query, free_fn, cancel, this, &request);
    req::adopt(request, this);
  }
  void on_wait() override {
    ++waits;
    complete();
  }
  void on_test() override {
    ++tests;
    if (after_ > 0 && tests >= after_) complete();
  }
  void on_free() override {
    ++frees;
    complete();
  }
  MPI_Request request = MPI_REQUEST_NULL;
  int waits = 0, tests = 0, frees = 0;
  bool freed = false;

 private:
  void complete() {
    if (!done_) {
      done_ = true;
      MPI_Grequest_complete(request);
    }
  }
  static int query(void*, MPI_Status* s) {
    MPI_Status_set_elements(s, MPI_BYTE, 0);
    MPI_Status_set_cancelled(s, 0);
    s->MPI_SOURCE = MPI_UNDEFINED;
    s->MPI_TAG = 77;  // recognisable in statuses
    return MPI_SUCCESS;
  }
  static int free_fn(void* self) {
    static_cast<Probe*>(self)->freed = true;
    return MPI_SUCCESS;
  }
  static int cancel(void*, int) { return MPI_SUCCESS; }
  int after_;
  bool done_ = false;
};

// A matched self send/receive pair; value checked after completion.
struct SelfMessage {
  explicit SelfMessage(int tag) : tag(tag) {
    out = 1000 + tag;
    MPI_Irecv(&in, 1, MPI_INT, 0, tag, MPI_COMM_SELF, &recv);
    MPI_Isend(&out, 1, MPI_INT, 0, tag, MPI_COMM_SELF, &send);
  }
  int tag, in = -1, out;
  MPI_Request send, recv;
};

}  // namespace

TEST_CASE("no owned request: nothing is looked up") {
  CHECK_FALSE(req::any_owned());
  SelfMessage m(1);
  MPI_Request r[2] = {m.send, m.recv};
  CHECK(MPI_Waitall(2, r, MPI_STATUSES_IGNORE) == MPI_SUCCESS);
  CHECK(m.in == 1001);
}

TEST_CASE("MPI_Wait gives the owner its turn, then MPI frees the request") {
  auto* p = new Probe;
  MPI_Request r = p->request;
  CHECK(req::any_owned());
  MPI_Status st;
  CHECK(MPI_Wait(&r, &st) == MPI_SUCCESS);
  CHECK(r == MPI_REQUEST_NULL);
  CHECK(p->waits == 1);
  CHECK(p->freed);
  CHECK(st.MPI_TAG == 77);
  CHECK_FALSE(req::any_owned());
  CHECK(req::peek(p->request) == nullptr);
  delete p;
}

TEST_CASE("MPI_Test advances the owner until it completes") {
  auto* p = new Probe(3);
  MPI_Request r = p->request;
  int flag = 0, calls = 0;
  while (!flag) {
    CHECK(MPI_Test(&r, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS);
    ++calls;
  }
  CHECK(calls == 3);
  CHECK(p->tests == 3);
  CHECK(r == MPI_REQUEST_NULL);
  CHECK_FALSE(req::any_owned());
  delete p;
}

TEST_CASE("Waitall over owned and ordinary requests") {
  auto* a = new Probe;
  auto* b = new Probe;
  SelfMessage m(2);
  MPI_Request r[4] = {a->request, m.send, b->request, m.recv};
  MPI_Status st[4];
  CHECK(MPI_Waitall(4, r, st) == MPI_SUCCESS);
  for (MPI_Request x : r) CHECK(x == MPI_REQUEST_NULL);
  CHECK(a->waits == 1);
  CHECK(b->waits == 1);
  CHECK(st[0].MPI_TAG == 77);
  CHECK(st[3].MPI_TAG == 2);
  CHECK(m.in == 1002);
  CHECK_FALSE(req::any_owned());
  delete a;
  delete b;
}

TEST_CASE("Testall reports done only when the owned request is") {
  auto* p = new Probe(2);
  SelfMessage m(3);
  MPI_Request r[3] = {m.send, p->request, m.recv};
  int flag = 0, calls = 0;
  while (!flag) {
    CHECK(MPI_Testall(3, r, &flag, MPI_STATUSES_IGNORE) == MPI_SUCCESS);
    ++calls;
  }
  CHECK(calls >= 2);
  CHECK(m.in == 1003);
  CHECK(r[1] == MPI_REQUEST_NULL);
  CHECK_FALSE(req::any_owned());
  delete p;
}

TEST_CASE("Waitany returns an ordinary request while an owned one is still pending") {
  auto* p = new Probe;  // completes only on wait or free
  SelfMessage m(4);
  MPI_Request r[3] = {p->request, m.send, m.recv};
  int done = 0;
  for (int k = 0; k < 2; ++k) {
    int index = -1;
    MPI_Status st;
    CHECK(MPI_Waitany(3, r, &index, &st) == MPI_SUCCESS);
    CHECK((index == 1 || index == 2));
    ++done;
  }
  CHECK(done == 2);
  CHECK(m.in == 1004);
  CHECK(p->tests > 0);
  CHECK(p->waits == 0);
  CHECK(req::any_owned());
  // Now only the owned request is left; Waitany polls it (on_test) without completing,
  // so complete it through MPI_Wait.
  CHECK(MPI_Wait(&r[0], MPI_STATUS_IGNORE) == MPI_SUCCESS);
  CHECK_FALSE(req::any_owned());
  delete p;
}

TEST_CASE("Waitany and Waitsome complete an owned request that progresses by testing") {
  auto* p = new Probe(5);
  MPI_Request r[2] = {MPI_REQUEST_NULL, p->request};
  int index = -1;
  CHECK(MPI_Waitany(2, r, &index, MPI_STATUS_IGNORE) == MPI_SUCCESS);
  CHECK(index == 1);
  CHECK(p->tests >= 5);
  CHECK_FALSE(req::any_owned());
  delete p;

  auto* q = new Probe(4);
  SelfMessage m(5);
  MPI_Request s[3] = {q->request, m.send, m.recv};
  int outcount = 0, indices[3], got = 0;
  bool owned_seen = false;
  while (got < 3) {
    CHECK(MPI_Waitsome(3, s, &outcount, indices, MPI_STATUSES_IGNORE) == MPI_SUCCESS);
    REQUIRE(outcount > 0);
    for (int i = 0; i < outcount; ++i) owned_seen = owned_seen || indices[i] == 0;
    got += outcount;
  }
  CHECK(owned_seen);
  CHECK(m.in == 1005);
  CHECK_FALSE(req::any_owned());
  delete q;
}

TEST_CASE("Testany and Testsome") {
  auto* p = new Probe(2);
  MPI_Request r[1] = {p->request};
  int index = -1, flag = 0, calls = 0;
  while (!flag) {
    CHECK(MPI_Testany(1, r, &index, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS);
    ++calls;
  }
  CHECK(index == 0);
  CHECK(calls == 2);
  CHECK_FALSE(req::any_owned());
  delete p;

  auto* q = new Probe(3);
  MPI_Request s[1] = {q->request};
  int outcount = 0, idx[1];
  calls = 0;
  do {
    CHECK(MPI_Testsome(1, s, &outcount, idx, MPI_STATUSES_IGNORE) == MPI_SUCCESS);
    ++calls;
  } while (outcount == 0);
  CHECK(outcount == 1);
  CHECK(calls == 3);
  CHECK_FALSE(req::any_owned());
  delete q;
}

TEST_CASE("MPI_Request_free lets the owner finish on its own") {
  auto* p = new Probe;
  MPI_Request r = p->request;
  CHECK(MPI_Request_free(&r) == MPI_SUCCESS);
  CHECK(r == MPI_REQUEST_NULL);
  CHECK(p->frees == 1);
  CHECK(p->freed);  // completed by on_free, so MPI released it
  CHECK_FALSE(req::any_owned());
  delete p;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  doctest::Context ctx(argc, argv);
  int rc = ctx.run();
  MPI_Finalize();
  return rc;
}
