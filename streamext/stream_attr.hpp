// The communicator stream attribute (include/streamcoll/streamext.h, DESIGN.md section 4).
// The application stores a cudaStream_t under streamcoll's keyval with MPI_Comm_set_attr;
// the dispatcher reads it per call on GPU buffers. The keyval is created when the
// application first asks for it (streamcoll_get_stream_keyval), so a process that never
// asks pays nothing. MPI_Comm_dup copies the attribute (same stream); deleting it, or
// freeing the communicator, releases nothing but the attribute itself: what streamcoll
// holds per communicator (its NCCL communicator, internal streams) lives in the
// communicator's context and goes with MPI_Comm_free.
// Thread-safe.
#pragma once

#include <mpi.h>

namespace streamcoll::streamext {

/// The keyval, created on first call while the runtime runs; MPI_KEYVAL_INVALID when the
/// runtime is disabled, not started (MPI not initialised) or stopped.
int keyval();

/// Whether a keyval exists (some code asked for it), so attributes may be set. Cheap.
bool in_use();

/// The stream attached to `comm`: true and *stream set, or false.
bool attached(MPI_Comm comm, void** stream);

/// Frees the keyval (runtime stop). Attributes still set stay until their communicators go.
void stop();

}  // namespace streamcoll::streamext
