// The next definition of an MPI function after libstreamcoll, for the calls streamcoll
// passes on unchanged (the pass-through of an intercepted call, route pmpi, MPI_Init and
// MPI_Finalize, the wait/test family): another PMPI tool preloaded after streamcoll
// (LD_PRELOAD=libstreamcoll.so:libtool.so) then still sees them, as interposing libraries
// that chain do; without one it is the MPI library's own. Found once, when the library is
// loaded, with dlsym(RTLD_NEXT, "MPI_..."), falling back to the PMPI_ entry point; a call
// costs one load of the pointer, as a PMPI_ call through the GOT does.
// A tool preloaded before streamcoll reaches it when that tool chains the same way (its
// MPI_X calls the next MPI_X); one that calls PMPI_X goes straight to the MPI library
// (streamcoll defines no PMPI_ names), so it belongs after streamcoll (docs/guide.md, "Stacking").
#pragma once

#include <mpi.h>
#if defined(OPEN_MPI) && OPEN_MPI
#include <mpi-ext.h>
#endif

// The persistent collectives (MPI 4.0), where the MPI has them: MPICH 4's MPI_*_init;
// Open MPI 4.1's MPIX_*_init (its pcollreq extension, C only). SC_PCOLL(Allreduce_init) is
// the name this MPI gives it.
#if defined(OMPI_HAVE_MPI_EXT_PCOLLREQ) && OMPI_HAVE_MPI_EXT_PCOLLREQ
#define STREAMCOLL_HAVE_PCOLL 1
#define SC_PCOLL(name) MPIX_##name
#define STREAMCOLL_NEXT_PCOLL(X)                                                          \
  X(MPIX_Allreduce_init) X(MPIX_Reduce_init) X(MPIX_Bcast_init) X(MPIX_Allgather_init)    \
  X(MPIX_Allgatherv_init) X(MPIX_Reduce_scatter_block_init) X(MPIX_Reduce_scatter_init)   \
  X(MPIX_Alltoall_init) X(MPIX_Barrier_init)
#elif MPI_VERSION >= 4
#define STREAMCOLL_HAVE_PCOLL 1
#define SC_PCOLL(name) MPI_##name
#define STREAMCOLL_NEXT_PCOLL(X)                                                          \
  X(MPI_Allreduce_init) X(MPI_Reduce_init) X(MPI_Bcast_init) X(MPI_Allgather_init)        \
  X(MPI_Allgatherv_init) X(MPI_Reduce_scatter_block_init) X(MPI_Reduce_scatter_init)      \
  X(MPI_Alltoall_init) X(MPI_Barrier_init)
#else
#define STREAMCOLL_HAVE_PCOLL 0
#define STREAMCOLL_NEXT_PCOLL(X)
#endif

// Every MPI function streamcoll passes on.
#define STREAMCOLL_NEXT_FUNCTIONS(X)                                                     \
  X(MPI_Init) X(MPI_Init_thread) X(MPI_Query_thread) X(MPI_Finalize)                     \
  X(MPI_Allreduce) X(MPI_Reduce) X(MPI_Bcast) X(MPI_Allgather) X(MPI_Allgatherv)         \
  X(MPI_Reduce_scatter_block) X(MPI_Reduce_scatter) X(MPI_Alltoall) X(MPI_Barrier)       \
  X(MPI_Iallreduce) X(MPI_Ireduce) X(MPI_Ibcast) X(MPI_Iallgather) X(MPI_Iallgatherv)    \
  X(MPI_Ireduce_scatter_block) X(MPI_Ireduce_scatter) X(MPI_Ialltoall) X(MPI_Ibarrier)   \
  X(MPI_Wait) X(MPI_Test) X(MPI_Request_get_status) X(MPI_Waitall) X(MPI_Testall)        \
  X(MPI_Waitany) X(MPI_Testany) X(MPI_Waitsome) X(MPI_Testsome) X(MPI_Request_free)    \
  X(MPI_Error_string) X(MPI_Comm_set_info) X(MPI_Comm_dup_with_info) X(MPI_Comm_split_type) \
  X(MPI_Start) X(MPI_Startall) X(MPI_Comm_dup) X(MPI_Comm_split) X(MPI_Comm_create)      \
  X(MPI_Cart_create) X(MPI_Cart_sub) X(MPI_Graph_create) X(MPI_Dist_graph_create)        \
  X(MPI_Dist_graph_create_adjacent) STREAMCOLL_NEXT_PCOLL(X)

namespace streamcoll::next {

/// One pointer per function, of its PMPI_ type; set before any MPI call can be made.
struct Table {
#define STREAMCOLL_NEXT_MEMBER(fn) decltype(&P##fn) fn = &P##fn;
  STREAMCOLL_NEXT_FUNCTIONS(STREAMCOLL_NEXT_MEMBER)
#undef STREAMCOLL_NEXT_MEMBER
};
extern Table g;

}  // namespace streamcoll::next

/// The next `fn` (an MPI_ name of STREAMCOLL_NEXT_FUNCTIONS).
#define SC_NEXT(fn) (::streamcoll::next::g.fn)
