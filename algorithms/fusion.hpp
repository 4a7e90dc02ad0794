// Fusion of small non-blocking allreduces (Horovod's tensor fusion: Sergeev and Del Balso,
// "Horovod: fast and easy distributed deep learning in TensorFlow", 2018, section 4,
// "Tensor Fusion"). A table rule with fuse=SIZE lets the MPI_Iallreduce calls it matches
// (SIZE bytes or less each) be fused: consecutive calls on one communicator with the same
// datatype and op are packed into one buffer, reduced by one non-blocking allreduce on a
// private duplicate of the communicator, and unpacked; each call's request completes with
// its own status (a streamcoll-owned generalized request, core/requests.hpp).
//
// ROUTE. The fused message goes where an allreduce of its size on host memory goes: the
// communicator's forced routes at the calls (streamcoll_comm_set_route, STREAMCOLL_ROUTE),
// else the table's rules in order. Two routes can start it from the thread that steps
// the queue: pmpi (the MPI's MPI_Iallreduce) and ht (its non-blocking host schedule, on
// the duplicate's own context, set up at open()); a table rule of another route hands it
// to the next rule, a forced one to pmpi. A group on GPU memory (the memory kind agreed
// for its calls) goes to route nccl where the site allows it (STREAMCOLL_FUSION_NCCL:
// NCCL kernels started at the agreement interleave with the program's other NCCL
// operations in an order of each rank's own, see config/env.cpp) and the rules give
// route nccl an allreduce on GPU memory of its size, or, for a group packed for nccl
// (MEMORY), of one call's size and of the fuse= limit: one ncclAllReduce on the
// duplicate's NCCL communicator (set up at open(), on this rank's GPU), whose failures
// stay collective; only when every rank offered it (the agreement carries whether each
// rank's NCCL communicator is usable), else on the host as above. The choice is made
// from the agreed group and state equal on every rank.
//
// AGREEMENT. Every rank must put the same calls in each fused message, yet what closes a
// group is often local: rank 0 may start a, b and then wait for a, while rank 1 starts a,
// waits for it, and only then starts b. The rule:
//   - every rank sees the same sequence of fusible calls on the communicator (MPI orders
//     collectives alike on every rank; whether a call is fusible is decided from the
//     agreed facts and the table, shim/dispatch_agree.cpp: rule_fuse_limit), and the
//     calls of a group are a run of that sequence: same datatype, op and fuse= limit, at
//     most SIZE bytes together. Where a run must end (a call that differs, or the limit)
//     is the same on every rank;
//   - a rank closes its open group when the run is complete, when the application waits
//     for or tests one of the group's requests (or the request of a later call), when it
//     makes another collective call on the communicator, or when the group has been open
//     for STREAMCOLL_FUSION_CYCLE microseconds (Horovod's cycle time). These differ between
//     ranks; so closing starts an agreement: a small MPI_Iallreduce (MPI_MIN) of the
//     number of calls each rank has in its group. The group holds that many calls on every
//     rank (at least one: a rank closes only a non-empty group); a rank's calls beyond it
//     open the next group, in order. The agreements and fused messages of a communicator
//     are started on a private duplicate of it by one thread at a time (the progress
//     thread, or an application thread waiting for or testing one of the calls, which
//     steps the queue itself), in group order, so they match on every rank. Timing only
//     changes how many calls each rank offers, never what is fused: that is the minimum
//     every rank offered.
//   - progress: a rank waiting for a fused call needs every other rank to close its group
//     too, including ranks that are blocked elsewhere (in a blocking call on another
//     communicator, say). The cycle time closes their groups on the progress thread
//     without anything from the application, so every started call completes, as it
//     would in the MPI.
//
// MEMORY. Buffers in host memory are copied with memcpy; buffers in GPU memory (a rank may
// pass them where the agreed facts say host memory) with synchronous copies of the CUDA
// driver (host_staging's backend), before the agreement (pack) and after the fused
// message (unpack), by the thread stepping the queue. The fused buffer is host memory,
// except for a group packed for route nccl: packing comes before the agreement, where the
// group's size, and so its route, is not known, so the ranks decide from facts equal on
// every rank (Queue::nccl_pack_rule: NCCL usable on every rank at the last agreement, the
// rules for one call and for the fuse= limit both nccl) that the group goes to nccl, and
// each packs it in GPU memory on route nccl's GPU (nccl_stage::device_buffer; the
// batched-copy kernel where both ends are on that GPU), or in host memory where it can
// have none (route nccl then stages it to the GPU and back: two copies of the whole
// buffer). If the agreement then finds some rank's NCCL communicator unusable (aborted
// after a failure), that group fails on every rank: a contribution in GPU memory cannot
// move to the host after the agreement without a copy that could fail on one rank alone.
// The next groups are packed in host memory and run on the host routes.
//
// STREAMS. Where the agreed facts have a stream (every rank's communicator carries one,
// streamext), a call on GPU buffers is stream-ordered, as route ht's calls are (Aluminum:
// Dryden et al., MLHPC 2018, sections IV-B and V-A): at the call, route ht's staging
// (algorithms/ht.hpp, ht_stream) enqueues, after what the stream holds, the copy of its
// input into pinned memory, a hold, and the copy back. The call is fused like any other:
// its pinned buffer is its contribution, packed once the copy in is done (a rank offers,
// of the calls its group may hold, those in a row whose input is in); once its group's
// fused message is done the result goes into the pinned buffer and the hold is released.
// MPI_Wait and MPI_Test make the stream wait for the copy back and complete at once (the
// host never waits for the GPU) and close the group, as for any call. A rank's calls on
// host buffers keep plain semantics; each call's staging is local, and the groups are
// agreed as above whatever kinds of calls they hold. Where staging cannot start, the
// stream is synchronised and the call goes on without it. A failure found after the call
// returned (the group's, a copy's) is reported by the communicator's next call, as route
// ht does. A stream that the agreed facts do not have (some rank's communicator lacks
// one) is synchronised at the call, as the pmpi route does.
//
// ERRORS. A failed copy on any rank fails the whole group on every rank (the agreement
// carries an ok flag): each request completes with MPI_ERR_OTHER's code. A failed MPI call
// fails the group's requests with its code; on NCCL, a rank that cannot take its part
// aborts the duplicate's NCCL communicator and tells its peers (route nccl's failure
// handling), so the group fails on every rank and the later groups run on the host.
//
// Thread safety: start() and poke() from any application thread (calls on one
// communicator are ordered by the application, as MPI requires); the queue is stepped by
// the progress thread and by threads waiting for its calls, one at a time. Needs
// MPI_THREAD_MULTIPLE (the progress thread calls MPI).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>

#include "algorithms/route.hpp"
#include "base/types.hpp"
#include "config/tuning_table.hpp"
#include "core/coll_args.hpp"

namespace streamcoll {
struct CommContext;

namespace fusion {

struct Queue;

/// Collective over ctx.comm: makes the communicator's fusion queue (a private duplicate
/// of it). Call it at a blocking call that every rank routes alike. Returns null (with
/// a warning) if the duplicate cannot be made; fusion is then off for the communicator.
/// `forced`: the communicator's forced routes at that call (null: none); where they or
/// the table may route an allreduce to ht, route ht is set up on the duplicate too (and
/// agreed), for the fused messages the rules give to it.
/// With STREAMCOLL_FUSION_NCCL, where they or the table may route an allreduce on GPU
/// memory to nccl, route nccl is set up on the duplicate too, on GPU `device` (this rank's
/// GPU at that call; -1: the thread's current CUDA context's), kept only where every
/// rank's set-up worked.
std::shared_ptr<Queue> open(const CommContext& ctx,
                            const std::shared_ptr<const config::TuningTable>& forced,
                            int device);

/// Starts the MPI_Iallreduce `a` (a.nonblocking, a.coll == allreduce, a predefined
/// datatype and op, a.count * type size <= limit bytes) as a member of `q`'s open group:
/// *a.request gets a streamcoll-owned request that completes when the group's fused
/// message is done (stream-ordered: when MPI_Wait has made the stream wait, see STREAMS).
/// `env`: this rank's view of the call (env.mem: host or pinned, no buffer is looked at
/// again, otherwise each is classified; env.has_stream: stream-ordered, on env.stream and
/// GPU env.device: the agreed facts have a stream and this rank's buffers are on a GPU).
/// `own`: a failure of this rank's found before (the caller's synchronisation of a stream
/// the agreed facts do not have). `sync_stream`: synchronises a stream, returning an MPI
/// error code (for a stream-ordered call that cannot be staged). Returns an MPI error
/// code: a failure of this rank's (`own`, or one found here: staging, that
/// synchronisation, the request) leaves the call taking its part, as every rank's call
/// must, and its group fails on every rank (the agreement's ok flag); only an invalid
/// datatype, or no request for a call that is not stream-ordered, starts nothing.
/// `forced`: the communicator's forced routes at this call (null: none); with the table
/// they route the fused message (see ROUTE above).
int start(Queue& q, const CollArgs& a, uint64_t limit, const CallEnv& env, int own,
          std::shared_ptr<const config::TuningTable> forced, int (*sync_stream)(void*));

/// Another call on the communicator: closes the open group (nothing when there is none).
/// Never blocks.
void poke(Queue& q);

/// For tests and statistics: calls started, fused messages and agreements run so far
/// on this queue.
struct Counts {
  uint64_t calls = 0;
  uint64_t messages = 0;
  uint64_t agreements = 0;
};
Counts counts(const Queue& q);
/// Sum of counts() over every queue of the process, alive or gone.
Counts process_counts();
/// Of process_counts().messages, those that ran on `route` (pmpi, ht or nccl).
uint64_t process_messages_on(RouteId route);
/// Of process_counts().messages, those packed in GPU memory (for route nccl, see MEMORY).
uint64_t process_messages_packed_on_gpu();

}  // namespace fusion
}  // namespace streamcoll
