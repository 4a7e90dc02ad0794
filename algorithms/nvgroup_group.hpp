// Route nvgroup's per-communicator group (algorithms/nvgroup.cpp): the flags segment's
// layout, what this rank set up (Group: its GPU, streams, scratch, the peers' mappings,
// the status words, the registered inputs), the route's state on a communicator, and the
// graveyard of gone communicators' groups. Internal to the route's files.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "algorithms/nvgroup_kernel.hpp"
#include "base/routes.hpp"
#include "core/comm_context.hpp"

namespace streamcoll::nvgroup_detail {

using nvgroup::kFlagWords;
using nvgroup::kMaxBlocks;
using nvgroup::kMaxMembers;

// The flags segment: flags[member][block][kFlagWords], then each member's failure word
// (written by its host only) and status word (written by its kernel).
constexpr size_t kFlagsBytes = sizeof(uint64_t) * kMaxMembers * kMaxBlocks * kFlagWords;
constexpr size_t kFailOffset = kFlagsBytes;
constexpr size_t kStatusOffset = kFailOffset + sizeof(uint64_t) * kMaxMembers;
// Registered inputs (nvgroup_kernel.hpp): each member's registry of exported allocations,
// reg[member][slot], written by its host; and acks[peer][member][slot], the generation of
// that registration the peer's host has mapped (kNotMapped added when it could not).
using nvgroup::kSlots;
struct Registration {
  uint64_t gen;  // 0: empty; written last (release)
  uint64_t bytes;
  CUipcMemHandle handle;
};
constexpr size_t kRegOffset = kStatusOffset + sizeof(uint64_t) * kMaxMembers;
constexpr size_t kAckOffset = kRegOffset + sizeof(Registration) * kMaxMembers * kSlots;
constexpr uint64_t kNotMapped = 1ull << 63;
constexpr size_t kSegmentBytes =
    (kAckOffset + sizeof(uint64_t) * kMaxMembers * kMaxMembers * kSlots + 4095) / 4096 * 4096;

// One communicator's group: what this rank set up, shared with the graveyard so that it
// outlives the communicator until no peer can still read its scratch.
struct Group : std::enable_shared_from_this<Group> {
  int device = -1;
  CUdevice cudev = 0;
  CUcontext cuctx = nullptr;
  CUstream classic = nullptr;
  CUevent legacy = nullptr;
  CUevent last = nullptr;  // recorded after each kernel: this rank's own work is done
  bool last_recorded = false;
  CUstream last_stream = nullptr;  // where the last kernel went
  CUfunction fn = nullptr;
  CUdeviceptr scratch = 0;
  uint64_t chunk_bytes = 0;
  CUdeviceptr peer[kMaxMembers] = {};  // opened IPC mappings (0 for this rank)
  char* segment = nullptr;             // the flags segment, mapped here
  bool registered = false;
  CUdeviceptr segment_dev = 0;
  uint32_t members = 0, me = 0, blocks = 0;
  uint64_t next_seq = 1;  // the next round's number
  uint64_t last_seq = 0;  // the last round launched (or failed)
  std::mutex mu;          // next_seq, failure words, status words
  CUstream side = nullptr;  // stream-ordered MPI_I*: after the attached stream
  // Staged calls' copies back (Staged): made at the first, used by nothing else, so that
  // waiting for it waits for no kernel (and so for no other rank).
  CUstream copy = nullptr;
  std::once_flag copy_once;
  // Status words of classic MPI_I* calls, one per call in flight (a request completes
  // only once its kernel is done, so its word is free again after it): pinned,
  // device-mapped pages of kStatusPerPage words, made as needed.
  struct StatusWord {
    uint64_t* host;
    CUdeviceptr dev;
  };
  std::vector<void*> status_pages;
  std::vector<StatusWord> free_status;
  static constexpr size_t kStatusPerPage = 512;

  // A cleared status word, or {nullptr, 0} when no page can be had; cuctx is current.
  StatusWord take_status();
  void give_status(StatusWord w);

  uint64_t* flags_host() const { return reinterpret_cast<uint64_t*>(segment); }
  uint64_t* fail_host(uint32_t m) const {
    return reinterpret_cast<uint64_t*>(segment + kFailOffset) + m;
  }
  uint64_t* status_host(uint32_t m) const {
    return reinterpret_cast<uint64_t*>(segment + kStatusOffset) + m;
  }
  Registration* reg(uint32_t member, uint32_t slot) const {
    return reinterpret_cast<Registration*>(segment + kRegOffset) + member * kSlots + slot;
  }
  uint64_t* ack(uint32_t peer, uint32_t member, uint32_t slot) const {
    return reinterpret_cast<uint64_t*>(segment + kAckOffset) + (peer * kMaxMembers + member) * kSlots + slot;
  }

  // ---- registered inputs ----
  bool direct = true;  // the rule allows them (direct=yes)
  // This rank's registrations: the allocation in each slot, and the last round a kernel
  // of any member may read it in (it may be given to another allocation once every member
  // is past that round).
  struct Own {
    CUdeviceptr base = 0;
    uint64_t bytes = 0;
    unsigned long long id = 0;  // CU_POINTER_ATTRIBUTE_BUFFER_ID
    uint64_t gen = 0;
    uint64_t last_seq = 0;
    uint64_t used = 0;  // for least-recently-used replacement
  } own[kSlots];
  uint64_t next_gen = 0, clock = 0;
  std::vector<unsigned long long> not_exportable;  // buffer ids cuIpcGetMemHandle refused
  // The peers' registrations as mapped here: the table the kernels read (pinned,
  // device-mapped: Params::maps), the mappings and their generations.
  uint64_t* maps_host = nullptr;
  CUdeviceptr maps_dev = 0;
  CUdeviceptr opened[kMaxMembers][kSlots] = {};
  uint64_t opened_gen[kMaxMembers][kSlots] = {};

  // Whether every member is past round q (its kernel's done flags, or its host gave up).
  bool passed(uint64_t q) const;

  // Maps what the peers registered since the last call and says so (acks). A peer gives
  // a slot to another allocation only once no kernel can still read the old one (passed),
  // so the old mapping may go now. cuctx is current.
  void map_peers();

  // The input word for an input of `bytes` at `ptr` that rounds up to `last` may read:
  // the slot of its allocation once every peer has mapped it; 0 (copied through scratch)
  // until then, or when it cannot be exported. Registers a new allocation, in a free slot
  // or the least recently used one no kernel can still read. cuctx is current.
  uint64_t input_word(const void* ptr, uint64_t bytes, uint64_t last);

  // Whether no member can still touch what this rank shares: its own kernels are done
  // and every member is past the last round (or said it failed it).
  bool quiet() const;

  // This rank cannot take its part in rounds up to `q` (a call's kernel did not launch):
  // its peers' kernels must not wait for it. Its own earlier kernels may not have run yet
  // (stream-ordered calls queued behind the application's work): a failure word written
  // now would let the peers go past their rounds too, and those kernels would then read
  // scratch that had moved on. So the word is written once this rank's last launched
  // kernel is done (every earlier one waits for its predecessor's rounds, so it is done
  // last): at once when it is, otherwise by a thread that waits for an event recorded
  // behind it. Its peers' kernels for the failed rounds wait until then, not forever.
  void give_up(uint64_t q);

  void fail_through(uint64_t q);

  // Unmaps the peers' scratch areas (before a failed set-up frees this rank's own).
  void close_peers();

  ~Group();
};

// The groups found quiet are destroyed after the lock is let go: ~Group frees GPU memory,
// which may wait for the device, whose other work (another communicator's kernels) may
// wait for peers, while another thread's MPI_Comm_free needs the lock.
void bury(std::shared_ptr<Group> g);

struct NvgroupState final : RouteState {
  enum Status { unset, ready, off } status = unset;
  std::shared_ptr<Group> group;
  ~NvgroupState() override { bury(std::move(group)); }
};

// The route's state on ctx, made (unset) at the first use.
NvgroupState& state_of(CommContext& ctx);

// At MPI_Finalize: the groups of gone communicators, whatever their peers' flags say.
void clear_grave();

}  // namespace streamcoll::nvgroup_detail
