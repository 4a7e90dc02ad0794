/* A test tool, preloaded after libstreamcoll (run.sh: STREAMCOLL_TEST_PRELOAD): counts the
 * non-blocking collectives still pending on a communicator when the application frees it
 * with MPI_Comm_free. MPI lets a program free a communicator with operations pending, but
 * what streamcoll starts on its own must never be among them: Open MPI 4.1 went on
 * progressing such a schedule on the freed communicator and crashed (issue: a
 * STREAMCOLL_CHECK check left on the application's communicator).
 *
 * How: it defines PMPI_Iallreduce and PMPI_Ibcast (reached by streamcoll's own calls, which
 * resolve to the first definition in the process: this library, loaded before the MPI's)
 * and MPI_Iallreduce and MPI_Ibcast (reached by the application's calls that streamcoll
 * passes on to the next definition), each recording its request and communicator; the
 * MPI_ and PMPI_ forms of MPI_Wait, MPI_Test, MPI_Waitall, MPI_Testall and
 * MPI_Request_free forget requests that complete or are freed; MPI_Comm_free (which
 * streamcoll does not wrap) counts the requests still recorded on the communicator. A
 * program whose own requests are complete before it frees a communicator (the test's)
 * must see 0: pending_at_free_count(), found with dlsym. Other completion calls
 * (MPI_Waitany, ...) are not followed: a test using them would see its own requests
 * counted.
 *
 * Each wrapper forwards to the next definition (dlsym RTLD_NEXT). Thread-safe (one lock).
 * Its own check: pending_at_free_selftest() records a request of its own on a communicator
 * and frees that, which must count one. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>

#define MAX_TRACKED 4096

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
  MPI_Request req;
  MPI_Comm comm;
} g_tracked[MAX_TRACKED];
static int g_n = 0, g_overflow = 0;
static long g_pending_at_free = 0;

static void track(MPI_Request req, MPI_Comm comm) {
  pthread_mutex_lock(&g_mu);
  if (g_n < MAX_TRACKED) {
    g_tracked[g_n].req = req;
    g_tracked[g_n].comm = comm;
    ++g_n;
  } else {
    g_overflow = 1;
  }
  pthread_mutex_unlock(&g_mu);
}

static void forget(MPI_Request req) {
  if (req == MPI_REQUEST_NULL) return;
  pthread_mutex_lock(&g_mu);
  for (int i = 0; i < g_n; ++i)
    if (g_tracked[i].req == req) {
      g_tracked[i] = g_tracked[--g_n];
      break;
    }
  pthread_mutex_unlock(&g_mu);
}

/* Forgets each request of reqs[0, n) that the call (flag, or a wait) has completed: those
 * the MPI set to MPI_REQUEST_NULL. (A persistent request stays; none is tracked.) */
static void forget_done(int n, const MPI_Request* before, const MPI_Request* after) {
  for (int i = 0; i < n; ++i)
    if (before[i] != MPI_REQUEST_NULL && after[i] == MPI_REQUEST_NULL) forget(before[i]);
}

#define NEXT(name, type) \
  static type next_##name = NULL; \
  if (!next_##name) next_##name = (type)dlsym(RTLD_NEXT, #name)

typedef int (*iallreduce_fn)(const void*, void*, int, MPI_Datatype, MPI_Op, MPI_Comm, MPI_Request*);
typedef int (*ibcast_fn)(void*, int, MPI_Datatype, int, MPI_Comm, MPI_Request*);
typedef int (*wait_fn)(MPI_Request*, MPI_Status*);
typedef int (*test_fn)(MPI_Request*, int*, MPI_Status*);
typedef int (*waitall_fn)(int, MPI_Request*, MPI_Status*);
typedef int (*testall_fn)(int, MPI_Request*, int*, MPI_Status*);
typedef int (*free_fn)(MPI_Request*);
typedef int (*comm_free_fn)(MPI_Comm*);

#define IALLREDUCE(name)                                                                     \
  int name(const void* s, void* r, int n, MPI_Datatype t, MPI_Op o, MPI_Comm c, MPI_Request* q) { \
    NEXT(name, iallreduce_fn);                                                               \
    const int rc = next_##name(s, r, n, t, o, c, q);                                        \
    if (rc == MPI_SUCCESS) track(*q, c);                                                     \
    return rc;                                                                               \
  }
IALLREDUCE(PMPI_Iallreduce)
IALLREDUCE(MPI_Iallreduce)

#define IBCAST(name)                                                                   \
  int name(void* b, int n, MPI_Datatype t, int root, MPI_Comm c, MPI_Request* q) {    \
    NEXT(name, ibcast_fn);                                                             \
    const int rc = next_##name(b, n, t, root, c, q);                                   \
    if (rc == MPI_SUCCESS) track(*q, c);                                               \
    return rc;                                                                         \
  }
IBCAST(PMPI_Ibcast)
IBCAST(MPI_Ibcast)

#define WAIT(name)                              \
  int name(MPI_Request* q, MPI_Status* st) {    \
    NEXT(name, wait_fn);                        \
    const MPI_Request before = *q;              \
    const int rc = next_##name(q, st);          \
    forget_done(1, &before, q);                 \
    return rc;                                  \
  }
WAIT(PMPI_Wait)
WAIT(MPI_Wait)

#define TEST(name)                                        \
  int name(MPI_Request* q, int* flag, MPI_Status* st) {   \
    NEXT(name, test_fn);                                  \
    const MPI_Request before = *q;                        \
    const int rc = next_##name(q, flag, st);              \
    forget_done(1, &before, q);                           \
    return rc;                                            \
  }
TEST(PMPI_Test)
TEST(MPI_Test)

#define WAITALL(name)                                        \
  int name(int n, MPI_Request* q, MPI_Status* st) {          \
    NEXT(name, waitall_fn);                                  \
    MPI_Request before[64];                                  \
    const int k = n < 64 ? n : 64;                           \
    for (int i = 0; i < k; ++i) before[i] = q[i];            \
    const int rc = next_##name(n, q, st);                    \
    forget_done(k, before, q);                               \
    return rc;                                               \
  }
WAITALL(PMPI_Waitall)
WAITALL(MPI_Waitall)

#define TESTALL(name)                                                  \
  int name(int n, MPI_Request* q, int* flag, MPI_Status* st) {         \
    NEXT(name, testall_fn);                                            \
    MPI_Request before[64];                                            \
    const int k = n < 64 ? n : 64;                                     \
    for (int i = 0; i < k; ++i) before[i] = q[i];                      \
    const int rc = next_##name(n, q, flag, st);                        \
    forget_done(k, before, q);                                         \
    return rc;                                                         \
  }
TESTALL(PMPI_Testall)
TESTALL(MPI_Testall)

#define REQUEST_FREE(name)                  \
  int name(MPI_Request* q) {                \
    NEXT(name, free_fn);                    \
    const MPI_Request before = *q;          \
    const int rc = next_##name(q);          \
    if (rc == MPI_SUCCESS) forget(before);  \
    return rc;                              \
  }
REQUEST_FREE(PMPI_Request_free)
REQUEST_FREE(MPI_Request_free)

int MPI_Comm_free(MPI_Comm* comm) {
  NEXT(MPI_Comm_free, comm_free_fn);
  pthread_mutex_lock(&g_mu);
  for (int i = 0; i < g_n; ++i)
    if (g_tracked[i].comm == *comm) ++g_pending_at_free;
  pthread_mutex_unlock(&g_mu);
  return next_MPI_Comm_free(comm);
}

/* The requests found pending on a communicator at its MPI_Comm_free so far; -1 if more
 * requests were pending at once than the tool can follow. */
long pending_at_free_count(void) {
  pthread_mutex_lock(&g_mu);
  const long n = g_overflow ? -1 : g_pending_at_free;
  pthread_mutex_unlock(&g_mu);
  return n;
}

/* The tool's own check: a request recorded on a communicator that is then freed is
 * counted. Local (MPI_COMM_SELF duplicate, a one-rank MPI_Ibcast completed after the free,
 * which MPI allows). Returns 1 when the count went up by exactly one. */
int pending_at_free_selftest(void) {
  const long before = pending_at_free_count();
  MPI_Comm c;
  if (PMPI_Comm_dup(MPI_COMM_SELF, &c) != MPI_SUCCESS) return 0;
  int x = 0;
  MPI_Request r = MPI_REQUEST_NULL;
  PMPI_Ibcast(&x, 1, MPI_INT, 0, c, &r);
  MPI_Comm_free(&c);
  PMPI_Wait(&r, MPI_STATUS_IGNORE);
  return pending_at_free_count() == before + 1;
}
