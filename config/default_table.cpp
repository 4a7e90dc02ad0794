// The tuning table compiled into libstreamcoll. Used when STREAMCOLL_TUNING_FILE is not
// set, or names a file that does not parse. Format: config/tuning_table.hpp.
#include "config/tuning_table.hpp"

namespace streamcoll::config {

std::string_view default_table_text() {
  return R"(# streamcoll default tuning table
# Only the routes this build carries appear here; every call the table does not send
# elsewhere goes to the real MPI call (pmpi), so behaviour equals plain CUDA-aware MPI.
# nccl declines what it cannot carry (datatype, op, ranks sharing a GPU, no libnccl);
# those calls go to pmpi too.
# collective                                                    bytes  ranks  nodes  ppn  memory          stream  route
allreduce,reduce,bcast,allgather,reduce_scatter_block,alltoall  *      *      *      *    device          *       nccl
*                                                               *      *      *      *    device,managed  *       pmpi
*                                                               *      *      *      *    host,pinned     *       pmpi
)";
}

}  // namespace streamcoll::config
