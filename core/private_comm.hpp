// A route's private duplicate of an application communicator, for its own point-to-point
// traffic (routes ht and blueconnect): the messages cannot match the application's, errors
// are returned rather than raised, and every operation takes its own tag.
//
// Thread safety: open() and tag() run on the application thread (calls on one
// communicator are ordered); the members are then read by any thread.
#pragma once

#include <mpi.h>

#include <cstdint>

#include "base/log.hpp"
#include "core/comm_context.hpp"

namespace streamcoll {

struct PrivateComm {
  MPI_Comm p2p = MPI_COMM_NULL;  ///< the duplicate (owned)
  int rank = 0;
  int size = 1;
  uint32_t next_tag = 0;

  PrivateComm() = default;
  PrivateComm(const PrivateComm&) = delete;
  PrivateComm& operator=(const PrivateComm&) = delete;
  ~PrivateComm() {
    if (p2p != MPI_COMM_NULL) PMPI_Comm_free(&p2p);
  }

  /// Collective over ctx.comm (call it from a blocking call): duplicates the communicator
  /// with MPI_ERRORS_RETURN. False, with one warning naming `route`, when the duplicate
  /// cannot be made (the route is then off for this communicator).
  bool open(const CommContext& ctx, const char* route) {
    rank = ctx.rank;
    size = ctx.size;
    if (PMPI_Comm_dup(ctx.comm, &p2p) != MPI_SUCCESS) {
      p2p = MPI_COMM_NULL;
      SC_WARN("%s: MPI_Comm_dup failed; route %s is off for this communicator", route, route);
      return false;
    }
    PMPI_Comm_set_errhandler(p2p, MPI_ERRORS_RETURN);
    return true;
  }

  /// The next operation's tag (MPI guarantees tags up to 32767).
  int tag() { return static_cast<int>(next_tag++ & 0x7fff); }
};

}  // namespace streamcoll
