#include "base/routes.hpp"

namespace streamcoll {

const std::vector<RouteInfo>& route_table() {
  static const std::vector<std::string_view> blocks = {"1", "2", "4", "8", "16", "32", "64", "128"};
  // Never destroyed: a name may be asked for from an exit handler after static destructors.
  static const std::vector<RouteInfo>* const table = new std::vector<RouteInfo>{
      {RouteId::pmpi, "pmpi", "the MPI's own call (PMPI_), unchanged", {}},
      {RouteId::nccl, "nccl", "NCCL's collective on the communicator's NCCL communicator", {}},
      {RouteId::ht, "ht",
       "host-transfer: stream-ordered staging through pinned host memory and MPI on a "
       "progress thread (Aluminum: Dryden et al., MLHPC 2018, sec. V-B.2)",
       {{"algo", {"rd", "rabenseifner", "ring", "mpi", "ccube"}, ""}, {"chunk", {}, "size"}}},
      {RouteId::blueconnect, "blueconnect",
       "hierarchical reduce-scatter/all-gather over the factors of the rank count "
       "(BlueConnect: Cho et al., SysML 2019, sec. 3)",
       {{"hierarchy", {}, "hierarchy"},
        {"backend", {"sched", "mpi", "nccl", "nvgroup", "ht"}, "list"},
        {"algo", {"auto", "ring"}, ""},
        {"chunk", {}, "size"},
        // for the levels on nvgroup (its parameters)
        {"blocks", blocks, ""},
        {"direct", {"yes", "no"}, ""}}},
      {RouteId::nvgroup, "nvgroup",
       "cooperative kernels over CUDA IPC within an NVLink group (NV-Group: Chu et al., OSU, sec. 3-4)",
       {{"chunk", {}, "size"},
        {"blocks", blocks, ""},
        {"cross", {"nccl", "ht"}, ""},
        {"direct", {"yes", "no"}, ""},
        {"hierarchy", {}, "hierarchy"}}},
      {RouteId::ccube, "ccube",
       "overlapped pipelined trees on NCCL point-to-point (C-Cube: Jo, Son, Kim et al., KAIST, sec. III)",
       {{"chunk", {}, "size"}}},
      {RouteId::self, "self",
       "a communicator of one rank: the collective is a copy from the send to the receive "
       "buffer on the GPU (nothing in place), classic or on the attached stream; no NCCL, "
       "no agreement, nothing set up",
       {}},
  };
  return *table;
}

std::string_view name(RouteId r) { return route_info(r).name; }

std::optional<RouteId> parse_route(std::string_view s) {
  for (const RouteInfo& r : route_table())
    if (r.name == s) return r.id;
  return std::nullopt;
}

}  // namespace streamcoll
