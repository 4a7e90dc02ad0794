// Runs a host schedule (algorithms/schedule.hpp) on PMPI_ point-to-point calls: one
// round at a time, all of a round's sends and receives posted together, then its local
// reductions (PMPI_Reduce_local, so every predefined datatype and op reduces exactly as
// the MPI itself would) and copies.
//
// The communicator should be streamcoll's private duplicate of the application's (so
// that no message can match an application receive), and `tag` unique among the
// operations in flight on it (so that concurrent collectives do not match each other's
// messages). Buffers are host memory.
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

 private:
  char* base(Buf b) const;
  int post_round();
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
  std::vector<MPI_Request> reqs_;
};

}  // namespace streamcoll::sched
