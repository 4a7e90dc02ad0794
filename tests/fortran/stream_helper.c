/* For stream.F90: the stream attached to a Fortran communicator as C sees it
 * (streamcoll/streamext.h on MPI_Comm_f2c), so that the test checks the Fortran module
 * against the C API rather than against itself. */
#include <stdint.h>

#include "streamcoll/streamext.h"

void sc_c_get_stream(const MPI_Fint *comm, intptr_t *stream, MPI_Fint *flag) {
  streamcoll_stream_t s = 0;
  int f = 0;
  streamcoll_comm_get_stream(MPI_Comm_f2c(*comm), &s, &f);
  *flag = f;
  *stream = f ? (intptr_t)s : 0;
}
