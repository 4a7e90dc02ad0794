/* A small PMPI profiling tool, for the stacking test (run.sh): it counts the calls of a
 * few MPI functions and passes each on. COUNTER_CHAIN=1 (default): to the next definition
 * (dlsym(RTLD_NEXT, "MPI_X")), as interposing libraries that chain do, so that a library
 * preloaded after it (streamcoll) still gets the call; COUNTER_CHAIN=0: to PMPI_X, as a
 * classic PMPI tool does. counter_get(name) reads a count (the test finds it with dlsym).
 * Counts are per process, kept with atomics (the test's calls come from one thread). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

enum { k_init, k_init_thread, k_finalize, k_allreduce, k_bcast, k_barrier, k_iallreduce, k_wait,
       k_waitall, k_count };
static const char* const names[k_count] = {"MPI_Init", "MPI_Init_thread", "MPI_Finalize",
                                           "MPI_Allreduce", "MPI_Bcast", "MPI_Barrier",
                                           "MPI_Iallreduce", "MPI_Wait", "MPI_Waitall"};
static long counts[k_count];

static int chain(void) {
  static int c = -1;
  if (c < 0) {
    const char* v = getenv("COUNTER_CHAIN");
    c = !(v && strcmp(v, "0") == 0);
  }
  return c;
}

/* The next definition of `name`, or the PMPI_ one (COUNTER_CHAIN=0). */
static void* target(const char* name, void* pmpi) {
  if (!chain()) return pmpi;
  void* p = dlsym(RTLD_NEXT, name);
  return p ? p : pmpi;
}

long counter_get(const char* name) {
  for (int i = 0; i < k_count; ++i)
    if (strcmp(names[i], name) == 0) return __atomic_load_n(&counts[i], __ATOMIC_RELAXED);
  return -1;
}

#define COUNT(k) __atomic_fetch_add(&counts[k], 1, __ATOMIC_RELAXED)

int MPI_Init(int* argc, char*** argv) {
  COUNT(k_init);
  int (*f)(int*, char***) = (int (*)(int*, char***))target("MPI_Init", (void*)&PMPI_Init);
  return f(argc, argv);
}
int MPI_Init_thread(int* argc, char*** argv, int required, int* provided) {
  COUNT(k_init_thread);
  int (*f)(int*, char***, int, int*) =
      (int (*)(int*, char***, int, int*))target("MPI_Init_thread", (void*)&PMPI_Init_thread);
  return f(argc, argv, required, provided);
}
int MPI_Finalize(void) {
  COUNT(k_finalize);
  int (*f)(void) = (int (*)(void))target("MPI_Finalize", (void*)&PMPI_Finalize);
  return f();
}
int MPI_Allreduce(const void* s, void* r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c) {
  COUNT(k_allreduce);
  int (*f)(const void*, void*, int, MPI_Datatype, MPI_Op, MPI_Comm) =
      (int (*)(const void*, void*, int, MPI_Datatype, MPI_Op, MPI_Comm))target("MPI_Allreduce",
                                                                                (void*)&PMPI_Allreduce);
  return f(s, r, n, t, op, c);
}
int MPI_Bcast(void* b, int n, MPI_Datatype t, int root, MPI_Comm c) {
  COUNT(k_bcast);
  int (*f)(void*, int, MPI_Datatype, int, MPI_Comm) =
      (int (*)(void*, int, MPI_Datatype, int, MPI_Comm))target("MPI_Bcast", (void*)&PMPI_Bcast);
  return f(b, n, t, root, c);
}
int MPI_Barrier(MPI_Comm c) {
  COUNT(k_barrier);
  int (*f)(MPI_Comm) = (int (*)(MPI_Comm))target("MPI_Barrier", (void*)&PMPI_Barrier);
  return f(c);
}
int MPI_Iallreduce(const void* s, void* r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c,
                   MPI_Request* q) {
  COUNT(k_iallreduce);
  int (*f)(const void*, void*, int, MPI_Datatype, MPI_Op, MPI_Comm, MPI_Request*) =
      (int (*)(const void*, void*, int, MPI_Datatype, MPI_Op, MPI_Comm, MPI_Request*))target(
          "MPI_Iallreduce", (void*)&PMPI_Iallreduce);
  return f(s, r, n, t, op, c, q);
}
int MPI_Wait(MPI_Request* q, MPI_Status* st) {
  COUNT(k_wait);
  int (*f)(MPI_Request*, MPI_Status*) =
      (int (*)(MPI_Request*, MPI_Status*))target("MPI_Wait", (void*)&PMPI_Wait);
  return f(q, st);
}
int MPI_Waitall(int n, MPI_Request* q, MPI_Status* st) {
  COUNT(k_waitall);
  int (*f)(int, MPI_Request*, MPI_Status*) =
      (int (*)(int, MPI_Request*, MPI_Status*))target("MPI_Waitall", (void*)&PMPI_Waitall);
  return f(n, q, st);
}
