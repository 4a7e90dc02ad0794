/* streamcoll: stream-aware, route-selecting MPI collectives for GPU buffers.
 *
 * This header is the library's small C API, for tests, benchmarks and tools. An
 * application needs none of it: streamcoll works on unmodified MPI programs through
 * LD_PRELOAD or by linking libstreamcoll before libmpi.
 *
 * When the library may only be preloaded, look the functions up at run time:
 *   int (*get)(const char*, const char*, const char*, streamcoll_stat_t*) =
 *       dlsym(RTLD_DEFAULT, "streamcoll_get_stats");
 * A null result means streamcoll is not loaded in this process.
 *
 * Thread safety: every function may be called from any thread after MPI_Init.
 */
#ifndef STREAMCOLL_STREAMCOLL_H
#define STREAMCOLL_STREAMCOLL_H

#include <mpi.h>

#ifdef __cplusplus
extern "C" {
#endif

#define STREAMCOLL_VERSION "0.1.0"

/** Counters of this process (not summed over ranks). */
typedef struct {
  unsigned long long calls;   /**< calls made */
  unsigned long long bytes;   /**< bytes, as the tuning table counts them (docs/reference.md) */
  double seconds;             /**< host time spent inside the calls */
} streamcoll_stat_t;

/** This process's counters for calls matching all three names; NULL matches any.
 *  `collective` is a collective name ("allreduce") or its non-blocking name
 *  ("iallreduce"); `route` a route ("pmpi", "nccl", ...); `memory` a memory kind
 *  ("host", "pinned", "device", "managed", "mixed").
 *  Counters are kept only while STREAMCOLL_STATS=1; otherwise they stay 0.
 *  Returns 0, or -1 (and leaves *out alone) if a name is unknown or out is NULL. */
int streamcoll_get_stats(const char *collective, const char *route, const char *memory,
                         streamcoll_stat_t *out);

/** Forces routes for the calls on one communicator, in STREAMCOLL_ROUTE's syntax
 *  ("allreduce:ht:algo=ring,bcast:pmpi", '*' for every collective; "" or NULL clears).
 *  These rules are matched before the tuning table and STREAMCOLL_ROUTE, for calls on
 *  `comm` only (not on communicators later duplicated from it). Benchmarks and tests use
 *  it to compare routes in one run.
 *  Collective over `comm`: every rank must call it with the same spec, at the same point
 *  of its collective calls on `comm` (it may set up streamcoll's state for `comm`).
 *  Returns MPI_SUCCESS; MPI_ERR_COMM for MPI_COMM_NULL or an inter-communicator;
 *  MPI_ERR_ARG if the spec does not parse (the reason goes to stderr); or
 *  MPI_ERR_OTHER when streamcoll is disabled or MPI is not initialised. */
int streamcoll_comm_set_route(MPI_Comm comm, const char *spec);

/** The route this thread's last collective call went to, with the parameters of the rule
 *  that chose it, in tuning-table syntax: "ht algo=rd", "blueconnect hierarchy=2x2
 *  backend=sched", "pmpi". Benchmarks use it to check which algorithm a table picked.
 *  Kept only while STREAMCOLL_STATS=1. Writes at most len bytes, NUL included (the text
 *  is cut to fit); returns the text's full length, or -1 (and writes nothing) when
 *  statistics are off, no collective has been called on this thread yet, buf is NULL
 *  or len <= 0. */
int streamcoll_last_route(char *buf, int len);

/** What MPI_Iallreduce fusion (a tuning-table rule with fuse=SIZE; docs/guide.md "Fusion") has
 *  done in this process so far, over all communicators: the calls started as members of
 *  fused groups, the fused messages run for them and the agreements run to form the
 *  groups (one per group; two for a group packed for NCCL that went to the host after an
 *  abort, docs/guide.md "Fusion"). Any pointer may be NULL. Thread-safe; callable at any time. */
void streamcoll_fusion_counts(unsigned long long *calls, unsigned long long *messages,
                              unsigned long long *agreements);

/** Of the fused messages that streamcoll_fusion_counts counts, how many ran on route
 *  `route` ("pmpi": the MPI's MPI_Iallreduce; "ht": the host-transfer route, where the
 *  rules route an allreduce of the fused message's size there; "nccl": groups on GPU
 *  memory under STREAMCOLL_FUSION_NCCL). 0 for any other name or NULL. Thread-safe;
 *  callable at any time. */
unsigned long long streamcoll_fusion_messages_on(const char *route);

/** Of the fused messages that streamcoll_fusion_counts counts, how many were packed in
 *  GPU memory on this rank (groups packed for route nccl, docs/guide.md "Fusion"); the others
 *  were packed in host memory. Thread-safe; callable at any time. */
unsigned long long streamcoll_fusion_messages_packed_on_gpu(void);

/** streamcoll's own collectives for agreeing on what ranks see (docs/design.md, "Safety rules")
 *  in this process so far, over all communicators: blocking agreements (one small
 *  MPI_Allreduce each, at the first call of a signature and wherever the calls leave
 *  pmpi), refreshes started (one small MPI_Iallreduce each, off the calls' path) and
 *  refreshes a call had to wait for (a peer had not started the call that began one).
 *  Any pointer may be NULL. Thread-safe; callable at any time. */
void streamcoll_agreement_counts(unsigned long long *blocking, unsigned long long *refreshes,
                                 unsigned long long *waited);

/** CUDA graphs (docs/guide.md, "CUDA graphs") in this process so far: the replay lanes started
 *  (one thread each, for one communicator with captured calls, from its first captured call
 *  to its MPI_Comm_free or MPI_Finalize), the lanes alive now, the captured calls replayed
 *  (one per call per graph launch) and those skipped because their communicator had been
 *  freed. Any pointer may be NULL. Thread-safe; callable at any time. */
void streamcoll_capture_counts(unsigned long long *lanes_started, unsigned long long *lanes_live,
                               unsigned long long *replayed, unsigned long long *skipped);

/** Blocking calls that repeated an earlier call's decision on the steady path (the same
 *  arguments, host memory, the MPI's own collective; docs/design.md, "The steady path"),
 *  made by the calling thread and by threads that have exited. Thread-safe; callable at
 *  any time. */
unsigned long long streamcoll_steady_calls(void);

/** What streamcoll's NCCL communicators took in this process: those made with resources
 *  of their own (ncclCommInitRank), those split from a parent's sharing its resources
 *  (ncclCommSplit with splitShare, at MPI_Comm_dup, _split, ...), how many are alive now
 *  (both kinds, in use or idle), the set-ups this rank's budget turned away
 *  (STREAMCOLL_NCCL_MAX_COMMS, STREAMCOLL_NCCL_MEMORY), and the GPU memory in bytes they
 *  hold now and held at most (cuMemGetInfo's free memory before minus after each set-up:
 *  an estimate, as other threads may allocate meanwhile). A one-rank communicator never
 *  gets one (route self). Any pointer may be NULL. Thread-safe; callable at any time. */
void streamcoll_nccl_counts(unsigned long long *own, unsigned long long *shared,
                            unsigned long long *live, unsigned long long *refused,
                            unsigned long long *gpu_bytes, unsigned long long *peak_gpu_bytes);

/** The name of route `index` (0, 1, ... in the order of base/routes.hpp), as the tuning
 *  table, STREAMCOLL_ROUTE and streamcoll_get_stats spell it ("pmpi", "nccl", ...), whether
 *  or not this build carries it; NULL for an index past the last (or negative). Benchmarks
 *  list the routes with it rather than keep their own list. Thread-safe; callable at any
 *  time, before MPI_Init too. */
const char *streamcoll_route_name(int index);

/** The library version, STREAMCOLL_VERSION of the build. */
const char *streamcoll_version(void);

#ifdef __cplusplus
}
#endif

#endif /* STREAMCOLL_STREAMCOLL_H */
