// The owned-request mechanism of the wait/test wrappers (core/requests.hpp), with real
// generalized requests mixed with real point-to-point requests in the same arrays.
// Linked against the library's internals; runs on one rank (messages to itself).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <mpi.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/requests.hpp"

using streamcoll::OwnedRequest;
namespace req = streamcoll::requests;

namespace {

// A generalized request that completes when told to, counting the hooks it receives.
// complete_after_tests: on_test completes it on that many-th call (0: never; set later
// with complete_after). error: what its query function returns (the request's error).
// As the contract asks (core/requests.hpp), its free function forgets the handle.
class Probe final : public OwnedRequest {
 public:
  explicit Probe(int complete_after_tests = 0, int error = MPI_SUCCESS)
      : after_(complete_after_tests), error_(error) {
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
    done_at_free = done_;
  }
  bool completed() const override { return done_; }
  // on_test completes it `more` calls from now.
  void complete_after(int more) { after_ = tests + more; }
  // Completes it now (MPI_Grequest_complete), with no hook.
  void complete() {
    if (!done_) {
      done_ = true;
      MPI_Grequest_complete(request);
    }
  }
  MPI_Request request = MPI_REQUEST_NULL;
  int waits = 0, tests = 0, frees = 0;
  bool freed = false, done_at_free = false;

 private:
  static int query(void* self, MPI_Status* s) {
    MPI_Status_set_elements(s, MPI_BYTE, 0);
    MPI_Status_set_cancelled(s, 0);
    s->MPI_SOURCE = MPI_UNDEFINED;
    s->MPI_TAG = 77;  // recognisable in statuses
    return static_cast<Probe*>(self)->error_;
  }
  static int free_fn(void* self) {
    auto* p = static_cast<Probe*>(self);
    req::take(p->request);
    p->freed = true;
    return MPI_SUCCESS;
  }
  static int cancel(void*, int) { return MPI_SUCCESS; }
  int after_;
  int error_;
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

TEST_CASE("MPI_Wait polls the owner (on_test, never on_wait), then MPI frees the request") {
  auto* p = new Probe(4);
  MPI_Request r = p->request;
  CHECK(req::any_owned());
  MPI_Status st;
  CHECK(MPI_Wait(&r, &st) == MPI_SUCCESS);
  CHECK(r == MPI_REQUEST_NULL);
  CHECK(p->tests == 4);
  CHECK(p->waits == 0);
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
  auto* a = new Probe(2);
  auto* b = new Probe(5);
  SelfMessage m(2);
  MPI_Request r[4] = {a->request, m.send, b->request, m.recv};
  MPI_Status st[4];
  CHECK(MPI_Waitall(4, r, st) == MPI_SUCCESS);
  for (MPI_Request x : r) CHECK(x == MPI_REQUEST_NULL);
  CHECK(a->tests == 2);
  CHECK(b->tests == 5);
  CHECK(a->waits + b->waits == 0);
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
  auto* p = new Probe;  // does not complete until told to
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
  // Now only the owned request is left: Waitany polls it until it completes.
  p->complete_after(3);
  int index = -1;
  MPI_Status st;
  CHECK(MPI_Waitany(3, r, &index, &st) == MPI_SUCCESS);
  CHECK(index == 0);
  CHECK(st.MPI_TAG == 77);
  CHECK(p->waits == 0);
  CHECK_FALSE(req::any_owned());
  // Nothing active left: MPI_UNDEFINED.
  CHECK(MPI_Waitany(3, r, &index, &st) == MPI_SUCCESS);
  CHECK(index == MPI_UNDEFINED);
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

TEST_CASE("MPI_Request_free polls the owner to completion, then on_free") {
  auto* p = new Probe(3);
  MPI_Request r = p->request;
  CHECK(MPI_Request_free(&r) == MPI_SUCCESS);
  CHECK(r == MPI_REQUEST_NULL);
  CHECK(p->tests == 3);
  CHECK(p->frees == 1);
  CHECK(p->done_at_free);
  CHECK(p->waits == 0);
  CHECK(p->freed);  // complete, so MPI released it
  CHECK_FALSE(req::any_owned());
  delete p;
}

TEST_CASE("MPI_Request_get_status gives the owner on_test and does not free the request") {
  auto* p = new Probe(2);
  MPI_Request r = p->request;
  int flag = 1;
  MPI_Status st;
  CHECK(MPI_Request_get_status(r, &flag, &st) == MPI_SUCCESS);
  CHECK_FALSE(flag);
  CHECK(MPI_Request_get_status(r, &flag, &st) == MPI_SUCCESS);
  CHECK(flag);
  CHECK(st.MPI_TAG == 77);
  CHECK(p->tests == 2);
  CHECK_FALSE(p->freed);
  CHECK(req::peek(r) == p);
  CHECK(MPI_Request_get_status(r, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS);
  CHECK(flag);
  CHECK(MPI_Wait(&r, MPI_STATUS_IGNORE) == MPI_SUCCESS);
  CHECK(r == MPI_REQUEST_NULL);
  CHECK(p->freed);
  CHECK_FALSE(req::any_owned());
  delete p;
}

// ---- the wait forms answer exactly as the MPI's own --------------------------------------
//
// The same array twice: with the MPI's wait form (PMPI_) on an owned request already
// complete, and with streamcoll's on one that completes while it polls. Everything the
// call returns must be the same: return code, index/indices/outcount, statuses (source,
// tag, error; MPI_ERR_IN_STATUS), which handles are freed. Arrays hold null requests,
// inactive persistent requests, ordinary requests already complete (Wait/Waitall only:
// for Waitany/Waitsome a complete ordinary request is rightly returned before a pending
// owned one) and owned requests completing with an error or without.

enum class Form { wait, waitall, waitany, waitsome };

struct Outcome {
  int rc = -1, index = -2, outcount = -2;
  std::vector<int> indices;
  std::vector<MPI_Status> statuses;
  std::vector<bool> freed;
};

struct Scenario {
  std::vector<MPI_Request> r;
  std::vector<Probe*> probes;
  std::vector<MPI_Request> persistent;
  std::vector<SelfMessage*> messages;
  int buf = 0;
  ~Scenario() {
    for (Probe* p : probes) p->complete();  // those a call did not wait for
    for (MPI_Request& x : r)
      if (x != MPI_REQUEST_NULL) PMPI_Request_free(&x);  // persistent, failed or not waited for
    for (Probe* p : probes) delete p;
    for (SelfMessage* m : messages) {
      if (m->send != MPI_REQUEST_NULL) PMPI_Request_free(&m->send);
      delete m;
    }
  }
};

// layout: N null, I inactive persistent, P owned, E owned with an error, C a complete
// ordinary receive (its send too). reference: owned requests complete before the call.
void build(Scenario& sc, const char* layout, bool reference, int tag) {
  for (const char* c = layout; *c; ++c) {
    switch (*c) {
      case 'N': sc.r.push_back(MPI_REQUEST_NULL); break;
      case 'I': {
        MPI_Request p;
        MPI_Recv_init(&sc.buf, 1, MPI_INT, 0, tag + 500, MPI_COMM_SELF, &p);
        sc.r.push_back(p);
        break;
      }
      case 'P':
      case 'E': {
        auto* p = new Probe(reference ? 0 : 3, *c == 'E' ? MPI_ERR_OTHER : MPI_SUCCESS);
        if (reference) p->complete();
        sc.probes.push_back(p);
        sc.r.push_back(p->request);
        break;
      }
      case 'C': {
        auto* m = new SelfMessage(tag++);
        for (MPI_Request x : {m->recv, m->send})
          for (int flag = 0; !flag;) PMPI_Request_get_status(x, &flag, MPI_STATUS_IGNORE);
        sc.messages.push_back(m);
        sc.r.push_back(m->recv);
        break;
      }
    }
  }
}

Outcome run_form(Form f, const char* layout, bool reference, int tag) {
  Scenario sc;
  build(sc, layout, reference, tag);
  const int n = static_cast<int>(sc.r.size());
  Outcome o;
  o.statuses.resize(static_cast<size_t>(n));
  for (MPI_Status& s : o.statuses) {
    s.MPI_SOURCE = s.MPI_TAG = -99;
    s.MPI_ERROR = -99;
  }
  o.indices.assign(static_cast<size_t>(n), -3);
  switch (f) {
    case Form::wait: {
      int k = 0;  // the first owned request
      while (k < n && req::peek(sc.r[static_cast<size_t>(k)]) == nullptr) ++k;
      REQUIRE(k < n);
      o.index = k;
      o.rc = reference ? PMPI_Wait(&sc.r[static_cast<size_t>(k)], &o.statuses[0])
                       : MPI_Wait(&sc.r[static_cast<size_t>(k)], &o.statuses[0]);
      break;
    }
    case Form::waitall:
      o.rc = reference ? PMPI_Waitall(n, sc.r.data(), o.statuses.data())
                       : MPI_Waitall(n, sc.r.data(), o.statuses.data());
      break;
    case Form::waitany:
      o.rc = reference ? PMPI_Waitany(n, sc.r.data(), &o.index, &o.statuses[0])
                       : MPI_Waitany(n, sc.r.data(), &o.index, &o.statuses[0]);
      break;
    case Form::waitsome:
      o.rc = reference ? PMPI_Waitsome(n, sc.r.data(), &o.outcount, o.indices.data(), o.statuses.data())
                       : MPI_Waitsome(n, sc.r.data(), &o.outcount, o.indices.data(), o.statuses.data());
      break;
  }
  for (MPI_Request x : sc.r) o.freed.push_back(x == MPI_REQUEST_NULL);
  if (!reference)
    for (Probe* p : sc.probes) CHECK(p->waits == 0);
  return o;
}

void same(Form f, const char* layout, int tag) {
  CAPTURE(static_cast<int>(f));
  const std::string shape = layout;
  CAPTURE(shape);
  const Outcome want = run_form(f, layout, true, tag);
  const Outcome got = run_form(f, layout, false, tag);  // the same tags: the same statuses
  CHECK(got.rc == want.rc);
  CHECK(got.index == want.index);
  CHECK(got.outcount == want.outcount);
  CHECK(got.freed == want.freed);
  const int k = f == Form::waitsome ? std::max(0, want.outcount) : f == Form::waitall ? static_cast<int>(want.statuses.size()) : 1;
  for (int i = 0; i < k && i < static_cast<int>(want.statuses.size()); ++i) {
    CAPTURE(i);
    if (f == Form::waitsome) CHECK(got.indices[static_cast<size_t>(i)] == want.indices[static_cast<size_t>(i)]);
    const MPI_Status &a = got.statuses[static_cast<size_t>(i)], &b = want.statuses[static_cast<size_t>(i)];
    CHECK(a.MPI_SOURCE == b.MPI_SOURCE);
    CHECK(a.MPI_TAG == b.MPI_TAG);
    // The same code, or else the same error class (MPICH's error codes also number each
    // error's message, so two runs of one failure give two codes).
    bool same = a.MPI_ERROR == b.MPI_ERROR;
    if (!same) {
      int ca = -1, cb = -2;
      same = PMPI_Error_class(a.MPI_ERROR, &ca) == MPI_SUCCESS &&
             PMPI_Error_class(b.MPI_ERROR, &cb) == MPI_SUCCESS && ca == cb;
    }
    CHECK(same);
  }
  CHECK_FALSE(req::any_owned());
}

TEST_CASE("the wait forms return exactly what the MPI's wait form would") {
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
  int tag = 1000;
  for (const char* layout : {"P", "E", "NPI", "CNPIC", "ENCP", "PEC", "INCEN"}) {
    same(Form::wait, layout, tag += 100);
    same(Form::waitall, layout, tag += 100);
  }
  for (const char* layout : {"P", "E", "NPI", "INEN", "NIPNE", "PP"}) {
    same(Form::waitany, layout, tag += 100);
    same(Form::waitsome, layout, tag += 100);
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
  MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_ARE_FATAL);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  doctest::Context ctx(argc, argv);
  int rc = ctx.run();
  MPI_Finalize();
  return rc;
}
