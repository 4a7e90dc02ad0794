// The tuning table compiled into libstreamcoll. Used when STREAMCOLL_TUNING_FILE is not
// set, or names a file that does not parse. Format: config/tuning_table.hpp.
#include "config/tuning_table.hpp"

namespace streamcoll::config {

std::string_view default_table_text() {
  return R"(# streamcoll default tuning table
# Only the routes this build carries appear here; every call the table does not send
# elsewhere goes to the real MPI call (pmpi), so behaviour equals plain CUDA-aware MPI.
# collective  bytes  ranks  nodes  ppn  memory          stream  route
*             *      *      *      *    device,managed  *       pmpi
*             *      *      *      *    host,pinned     *       pmpi
)";
}

}  // namespace streamcoll::config
