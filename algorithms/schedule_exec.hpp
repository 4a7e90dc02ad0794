// Runs a host schedule (algorithms/schedule.hpp) on PMPI_ point-to-point calls: one
// round at a time, all of a round's sends and receives posted together, then its local
// reductions (core/datatypes.hpp reduce_local: PMPI_Reduce_local, so every predefined
// datatype and op reduces as the MPI defines it, but for the MIN/MAX of unsigned types,
// which Open MPI 4.1 and MPICH 4.0 get wrong in places and streamcoll computes itself)
// and copies.
//
// The communicator should be streamcoll's private duplicate of the application's (so
// that no message can match an application receive), and `tag` unique among the
// operations in flight on it (so that concurrent collectives do not match each other's
// messages). Buffers are host memory.
//
// Failures stay collective (taint). A rank whose own input could not be produced (its
// GPU-to-host copy failed, say) must still take part, or the others wait for it forever;
// but its data must not end up in anyone's result reported as a success. So a run can
// start tainted (taint()), and taint travels with the data at no cost to a run that
// does not fail: a tainted rank sends every message of its schedule empty (0 elements
// instead of the count, which is never 0 in a built schedule), and a rank that receives a
// message shorter than the schedule says is tainted from then on. Every rank whose
// result depends on a tainted rank's data receives, directly or through others, a
// message sent after the taint, so it ends tainted() and reports an error, while ranks
// whose results do not depend on it (reduce's non-roots) finish cleanly.
// Thread-compatible: one ScheduleRun is driven by one thread at a time.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "algorithms/schedule.hpp"

namespace streamcoll::sched {

class ScheduleRun {
 public:
  /// `send` may be null when the schedule does not use Buf::send (in place). `extent`:
  /// bytes per element of `type` (a predefined contiguous datatype).
  ScheduleRun(std::shared_ptr<const Schedule> s, const void* send, void* recv,
              MPI_Datatype type, int extent, MPI_Op op, MPI_Comm comm, int tag);
  ~ScheduleRun();
  ScheduleRun(const ScheduleRun&) = delete;
  ScheduleRun& operator=(const ScheduleRun&) = delete;

  /// Advances without blocking: posts the next round, tests it, runs its local
  /// operations when it is complete. Sets *done when the whole schedule is. Returns an
  /// MPI error code; after an error the run is finished (*done set) and its requests are
  /// cancelled or completed.
  int step(bool* done);

  /// Runs the whole schedule, blocking in PMPI_Waitall for each round.
  int run();

  /// This rank's input is unusable: from now on its messages are sent empty. Call it
  /// before the first step() or run().
  void taint() { tainted_ = true; }
  /// Whether this rank's data is unusable: taint() was called, or a message from a
  /// tainted rank arrived. A result is valid only if the run ends untainted.
  bool tainted() const { return tainted_; }

 private:
  char* base(Buf b) const;
  int post_round();
  void check_received();  ///< after a round's requests completed: short message -> tainted
  void finish_round();
  void abandon();

  std::shared_ptr<const Schedule> s_;
  const char* send_;
  char* recv_;
  char* tmp_ = nullptr;
  MPI_Datatype type_;
  int extent_;
  MPI_Op op_;
  MPI_Comm comm_;
  int tag_;
  size_t round_ = 0;
  bool posted_ = false;
  bool tainted_ = false;
  std::vector<MPI_Request> reqs_;
  std::vector<MPI_Status> statuses_;
  std::vector<int> expect_;  ///< per request: elements a receive expects, -1 for a send
};

}  // namespace streamcoll::sched
