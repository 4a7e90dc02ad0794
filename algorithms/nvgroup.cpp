// nvgroup: allreduce, reduce_scatter_block and allgather by the GPUs of one NVLink group
// reading each other's memory (one kernel, three modes: nvgroup_kernel.hpp).
//
// Source: NV-Group (Chu et al., OSU), sections 3-4 (its cost model: algorithms/
// cost_model.cpp, nvgroup_allreduce). The kernel and its protocol: nvgroup_kernel.hpp.
// This file is the route class; its parts: the kernels' module in nvgroup_module, the
// group (the flags segment, status words, registered inputs, the graveyard) in
// nvgroup_group, the set-up in nvgroup_setup, a call's kernel, its request and a staged
// call in nvgroup_launch.
//
// Group: every rank of the communicator, when they all run on one node (ctx.nodes == 1),
// there are at most kMaxMembers of them, and every rank can reach every other rank's GPU:
// the same GPU (CUDA IPC between processes on one device), a GPU this rank's driver sees
// (cuDeviceGetByPCIBusId) with peer access (cuDeviceCanAccessPeer), or a GPU it cannot
// see (one GPU per rank, CUDA_VISIBLE_DEVICES) whose memory it opens: the set-up opens
// every peer's scratch through its IPC handle anyway (step 3), and that open is the probe
// (the driver enables peer access lazily, and fails where the two GPUs have none; UCX's
// cuda_ipc decides the same way). The probe's outcome is agreed with the rest (step 4):
// a pair that fails turns the route off on every rank. NVML is not needed: the bus ids
// the ranks exchange already tell the same GPU apart from another one.
//
// Several groups (a communicator over several nodes, or a hierarchy imposed by the rule's
// hierarchy= or STREAMCOLL_HIERARCHY with two levels or more): the route is BlueConnect's
// decomposition (algorithms/blueconnect.cpp) with this route's kernels as the stage
// backend of its innermost level: reduce-scatter inside each group (the kernel's first
// half), the cross-group step on each rank's slice by route nccl or ht (cross=, one
// allreduce across the groups at the outermost level), all-gather inside each group (the
// kernel's second half). The groups are the hierarchy's innermost level.
//
// Set-up, per communicator, at its first blocking call routed here (collective; every
// rank gets there at the same call, and the outcome is agreed, so either every rank
// uses the route on this communicator or none does):
//   1. local: the buffer's GPU, its primary context, a stream, the kernels' module (one
//      per device and process), a scratch area of 2 x chunk bytes and an inbox of flags
//      (cuMemAlloc; the inbox zeroed) and its IPC handle;
//   2. PMPI_Allgather of (ok, bus id, SM count, IPC handle): the group and the grid size
//      (min of `blocks` and every member's SM count, so that every block can be resident:
//      blocks wait for their peers' blocks) follow from it alike on every rank;
//   3. rank 0 makes the flags segment (POSIX shared memory), PMPI_Bcast its name; every
//      rank maps it, registers it with its device (cuMemHostRegister), opens the peers'
//      IPC handles;
//   4. PMPI_Allreduce(MIN, ok): ready, or off for good (the calls take the next rule).
//
// Registered inputs (the kernel's side: nvgroup_kernel.hpp). A rank whose input buffer
// lies in a CUDA IPC capable allocation (cudaMalloc's; not pool or managed memory)
// registers the allocation in one of its kSlots slots of the flags segment (its IPC
// handle, a generation), at the first call that passes it; each peer maps it at its next
// call (cuIpcOpenMemHandle, into a device-mapped table the kernels read) and acknowledges
// the generation. From then on, once every peer has acknowledged, the rank's kernel skips
// copying its input into scratch and tells the peers (its input word) to read it in
// place: per call, per rank, a local choice, so nothing needs agreeing. Allocations are
// known by base address and buffer id (CU_POINTER_ATTRIBUTE_BUFFER_ID), so one freed and
// another made at the same address is registered anew. A slot goes to another allocation
// (least recently used) only once every member is past the last round that may read it;
// a peer's old mapping is closed when it sees the new generation. A failure anywhere in
// this (attributes, export, mapping, the table's memory) only means copying, as before.
//
// Per call (blocking calls; MPI_I* below):
//   classic   the kernel on an internal stream ordered after the legacy stream (as a
//             legacy-stream copy would be); the host waits for it and reads the status
//             word, so a failure seen by the kernel is this call's error.
//   attached  the kernel on the communicator's stream; returns at once. A failure the
//             kernel saw is reported by the next call on the communicator.
// MPI_I* calls (only with STREAMCOLL_NVGROUP_NONBLOCKING=1; otherwise the table's next
// rule): each member's kernel waits for its peers' kernels, so operations of two
// communicators started in different orders on different ranks, which MPI allows for
// non-blocking calls, could wait for each other on the GPU (the hazard NCCL's user guide
// describes for its own kernels); a program that starts them in one order everywhere may
// say so. Classic: the kernel goes on the internal stream, and the request completes once
// an event behind it has (its own status word says whether it failed). Stream-ordered:
// the kernel goes on a side stream that waits for the attached stream, and MPI_Wait makes
// the attached stream wait for it (the host does not).
// Calls decided from earlier agreements (stream-ordered: Route::adapts; MPI_I*): a rank
// whose buffers are not on the group's GPU (host memory, another GPU) copies its input to
// scratch there and runs its kernel classic, the results copied back after it (Staged,
// run_staged); a rank without the stream runs classic.
// The kernels of one communicator run one after the other on this rank's GPU, whatever
// streams they go on (each waits for an event behind the previous one): every kernel
// waits for the previous call's rounds, and two resident at once could starve each other.
//
// Failures stay collective: a rank that cannot launch its kernel (or whose stream fails)
// writes its failure word in the flags segment (Group::give_up: once its own earlier
// kernels are done): the peers' kernels waiting for it see it, go on without its data,
// finish, and report the call failed (their status words). A
// rank never frees its scratch while a peer may still read it: a gone communicator's
// resources wait until every member's flags say it is done (or MPI_Finalize).
#include <memory>
#include <string>
#include <vector>

#include "algorithms/nvgroup.hpp"
#include "algorithms/nvgroup_group.hpp"
#include "algorithms/nvgroup_kernel.hpp"
#include "algorithms/nvgroup_launch.hpp"
#include "algorithms/nvgroup_module.hpp"
#include "algorithms/nvgroup_setup.hpp"
#include "algorithms/route.hpp"
#include "core/coll_args.hpp"
#include "core/datatypes.hpp"
#include "core/runtime.hpp"
#include "core/topology.hpp"

namespace streamcoll {
namespace nvgroup_detail {
namespace {

// Whether `choice` on ctx means several groups (file comment): facts equal on every rank
// (the rule, the settings agreed at MPI_Init, the communicator's layout).
bool several_groups(const CommContext& ctx, const config::RouteChoice& choice) {
  if (choice.param("cross").value_or("") == "none") return false;  // a stage of blueconnect
  auto levels = [&](const std::vector<int>& f) {
    long product = 1;
    int n = 0;
    for (int x : f) {
      product *= x;
      n += x > 1;
    }
    return product == ctx.size ? n : -1;
  };
  if (auto v = choice.param("hierarchy")) {
    auto f = topo::parse_factors(*v);
    return f && levels(*f) >= 2;
  }
  const std::vector<int>& env = Runtime::get().settings().hierarchy;
  if (!env.empty() && levels(env) >= 0) return levels(env) >= 2;
  return ctx.nodes > 1;
}

// The blueconnect rule that carries a call over several groups: this route's kernels
// inside the groups (the innermost level), route cross= (nccl by default) above.
config::RouteChoice across(const config::RouteChoice& choice) {
  config::RouteChoice bc;
  bc.route = RouteId::blueconnect;
  const std::string cross(choice.param("cross").value_or("nccl"));
  bc.params.emplace_back("backend", "nvgroup/" + cross);
  for (const char* key : {"hierarchy", "chunk", "blocks", "direct"})
    if (auto v = choice.param(key)) bc.params.emplace_back(key, std::string(*v));
  return bc;
}

bool valid_cross(const config::RouteChoice& choice) {
  const std::string_view c = choice.param("cross").value_or("nccl");
  return c == "nccl" || c == "ht";
}

class NvgroupRoute final : public Route {
 public:
  RouteId id() const override { return RouteId::nvgroup; }

  bool able_here(const CollArgs& a, CommContext& ctx, const CallEnv& local) override {
    if (local.mem != MemKind::device || local.device < 0) return false;
    auto& slot = ctx.route_state[static_cast<int>(RouteId::nvgroup)];
    if (slot) {
      auto& st = static_cast<NvgroupState&>(*slot);
      if (st.status == NvgroupState::ready) return local.device == st.group->device;
    }
    // Several groups: blueconnect's stages (its levels' routes on this rank's GPU).
    if (ctx.route_state[static_cast<int>(RouteId::blueconnect)] &&
        !find_route(RouteId::blueconnect)->able_here(a, ctx, local))
      return false;
    return driver_has_entry_points();
  }

  bool accepts(const CollArgs& a, CommContext& ctx, const config::RouteChoice& choice,
               const CallEnv& agreed) override {
    if (a.nonblocking && !Runtime::get().settings().nvgroup_nonblocking) return false;
    if (agreed.mem != MemKind::device) return false;
    if (a.coll != Coll::allreduce && a.coll != Coll::reduce_scatter_block &&
        a.coll != Coll::allgather)
      return false;
    if (!nvgroup_stage::supports(a)) return false;
    if (several_groups(ctx, choice)) {
      if (a.nonblocking || !valid_cross(choice)) return false;
      return find_route(RouteId::blueconnect)->accepts(a, ctx, across(choice), agreed);
    }
    if (ctx.nodes != 1 || ctx.size > kMaxMembers) return false;
    NvgroupState& st = state_of(ctx);
    if (st.status == NvgroupState::unset) {
      if (!collective_point(a)) return false;  // set-up is collective: at a blocking call or a persistent init
      set_up(st, agreed, ctx, choice);
    }
    return st.status == NvgroupState::ready;
  }

  // Stream-ordered calls on one group: a rank whose buffers are not on the group's GPU
  // stages them (run_staged), one without the stream runs classic, one that cannot read
  // a repacked input gives its rounds up: the peers' kernels report the call failed.
  // Classic calls agree at every call (their host waits for the peers anyway). Several
  // groups: as BlueConnect's decomposition says.
  bool adapts(const CollArgs& a, CommContext& ctx, const config::RouteChoice& choice,
              const CallEnv& agreed) override {
    if (several_groups(ctx, choice))
      return find_route(RouteId::blueconnect)->adapts(a, ctx, across(choice), agreed);
    return agreed.has_stream;
  }

  int run(const CollArgs& a, CommContext& ctx, const config::RouteChoice& choice,
          const CallEnv& env) override {
    if (several_groups(ctx, choice)) return find_route(RouteId::blueconnect)->run(a, ctx, across(choice), env);
    bury(nullptr);  // frees what gone communicators left, once their peers are through
    std::shared_ptr<Group> g = state_of(ctx).group;
    // Managed memory is reachable from the group's GPU; device memory only from its own.
    const bool reachable = env.mem == MemKind::managed ||
                           (env.mem == MemKind::device && env.device == g->device);
    return reachable ? launch(a, env, g, nullptr) : run_staged(a, ctx, env, g);
  }
};

}  // namespace
}  // namespace nvgroup_detail

Route* nvgroup_route();
void nvgroup_release();
extern const RouteEntry nvgroup_entry = {nvgroup_route, nullptr, nvgroup_release};

Route* nvgroup_route() {
  static nvgroup_detail::NvgroupRoute r;
  return &r;
}

namespace nvgroup_stage {

using nvgroup_detail::Group;
using nvgroup_detail::NvgroupState;

bool supports(const CollArgs& a) {
  if (a.coll == Coll::allgather) {
    const TypeInfo* t = find_type(a.recvtype);  // eligibility: contiguous, = sendtype
    return t && t->size > 0;
  }
  if (a.coll != Coll::allreduce && a.coll != Coll::reduce_scatter_block) return false;
  const TypeInfo* t = find_type(a.datatype);
  const OpInfo* op = find_op(a.op);
  return t && op && nvgroup_detail::kernel_type(*t) && nvgroup_detail::kernel_op(op->kind);
}

void give_up(CommContext& ctx, const CollArgs& a) {
  auto& slot = ctx.route_state[static_cast<int>(RouteId::nvgroup)];
  if (!slot || static_cast<NvgroupState&>(*slot).status != NvgroupState::ready) return;
  Group& g = *static_cast<NvgroupState&>(*slot).group;
  uint64_t rounds = 0;
  nvgroup_detail::shape_of(a, g, &rounds);
  if (rounds) g.give_up(nvgroup_detail::reserve(g, rounds) + rounds - 1);
}

bool take_failure(CommContext& ctx) {
  auto& slot = ctx.route_state[static_cast<int>(RouteId::nvgroup)];
  if (!slot || static_cast<NvgroupState&>(*slot).status != NvgroupState::ready) return false;
  Group& g = *static_cast<NvgroupState&>(*slot).group;
  return __atomic_exchange_n(g.status_host(g.me), 0, __ATOMIC_ACQ_REL) != 0;
}

}  // namespace nvgroup_stage

// At MPI_Finalize, after every communicator context is gone: what gone communicators left
// (their peers are in MPI_Finalize too) and the kernels' modules.
void nvgroup_release() {
  nvgroup_detail::clear_grave();
  nvgroup_detail::unload_modules();
}

}  // namespace streamcoll
