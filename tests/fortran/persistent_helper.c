/* For persistent.F90: a persistent allreduce made in C (MPI_Allreduce_init; Open MPI 4.1:
 * MPIX_Allreduce_init) on buffers this file owns, its request handed to Fortran
 * (MPI_Request_c2f), which starts, waits for and frees it: a C library's persistent
 * request completed by Fortran code. Inputs and the check of the sums are made here. */
#include <mpi.h>
#if defined(OPEN_MPI) && OPEN_MPI
#include <mpi-ext.h>
#define PCOLL(name) MPIX_##name
#else
#define PCOLL(name) MPI_##name
#endif

enum { kN = 64 };
static int g_in[kN], g_out[kN];

static int value(int rank, int j, int k) { return (rank + 1) * 10 + j + 5 * k; }

void sc_pers_init(MPI_Fint *request, MPI_Fint *ierr) {
  MPI_Request r = MPI_REQUEST_NULL;
  *ierr = PCOLL(Allreduce_init)(g_in, g_out, kN, MPI_INT, MPI_SUM, MPI_COMM_WORLD, MPI_INFO_NULL, &r);
  *request = MPI_Request_c2f(r);
}

void sc_pers_fill(MPI_Fint *k) {
  int rank;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  for (int j = 0; j < kN; ++j) g_in[j] = value(rank, j, *k);
}

/* *ok: 1 when every sum of start k is right. */
void sc_pers_check(MPI_Fint *k, MPI_Fint *ok) {
  int size;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  *ok = 1;
  for (int j = 0; j < kN; ++j) {
    int want = 0;
    for (int q = 0; q < size; ++q) want += value(q, j, *k);
    if (g_out[j] != want) *ok = 0;
  }
}
