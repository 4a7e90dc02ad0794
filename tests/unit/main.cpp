// doctest runner for the unit tests. MPI is initialised because the datatype tables are
// built from the MPI library's own handles and sizes; no message is sent.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <mpi.h>

int main(int argc, char** argv) {
  PMPI_Init(&argc, &argv);
  doctest::Context ctx(argc, argv);
  int rc = ctx.run();
  PMPI_Finalize();
  return rc;
}
