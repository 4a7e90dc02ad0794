/* The C side of the Fortran module `streamcoll` (streamcoll.F90): the helpers of
 * streamcoll/streamext.h on Fortran handles (MPI_Comm_f2c), so that the module works
 * whether libstreamcoll is preloaded, linked or absent (the helpers find it with dlsym). */
#include <stdint.h>

#include "streamcoll/streamext.h"

int streamcoll_f_stream_available(void) { return streamcoll_stream_available(); }

void streamcoll_f_attach_stream(const MPI_Fint *comm, intptr_t stream, MPI_Fint *ierr) {
  *ierr = streamcoll_comm_attach_stream(MPI_Comm_f2c(*comm), (streamcoll_stream_t)stream);
}

void streamcoll_f_get_stream(const MPI_Fint *comm, intptr_t *stream, MPI_Fint *flag,
                             MPI_Fint *ierr) {
  streamcoll_stream_t s = 0;
  int f = 0;
  *ierr = streamcoll_comm_get_stream(MPI_Comm_f2c(*comm), &s, &f);
  *flag = f;
  if (f) *stream = (intptr_t)s;
}

void streamcoll_f_detach_stream(const MPI_Fint *comm, MPI_Fint *ierr) {
  *ierr = streamcoll_comm_detach_stream(MPI_Comm_f2c(*comm));
}
