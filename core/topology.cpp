// Discovery of a communicator's link hierarchy (core/topology.hpp): NUMA via hwloc, node
// via MPI_Comm_split_type, switch/rack groups via STREAMCOLL_NODE_GROUPS. The pure
// layout (from_keys) is base/hierarchy.cpp.
#include "core/topology.hpp"

#include <regex.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdio>
#include <cstring>
#include <map>
#include <numeric>
#include <set>
#include <utility>

#include "base/log.hpp"
#include "core/comm_context.hpp"
#include "core/cuda_driver.hpp"
#include "core/runtime.hpp"

#if STREAMCOLL_HAVE_HWLOC
#include <hwloc.h>
#endif

namespace streamcoll::topo {

namespace {
void set_why(std::string* why, std::string s) {
  if (why) *why = std::move(s);
}
}  // namespace

// ---- discover ------------------------------------------------------------------------------

namespace {

constexpr size_t kKeyBytes = 64;  // per key in the exchange, with its terminating NUL

uint64_t fnv1a(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

/// `s` in at most kKeyBytes-1 bytes: longer ones keep a prefix and get a hash of the whole.
std::string fit(const std::string& s) {
  if (s.size() < kKeyBytes) return s;
  char tail[24];
  std::snprintf(tail, sizeof tail, "#%016llx", static_cast<unsigned long long>(fnv1a(s)));
  return s.substr(0, kKeyBytes - 1 - std::strlen(tail)) + tail;
}

/// "*": this rank's NUMA node is unknown (then no rank uses the numa level).
constexpr const char* kUnknown = "*";

#if STREAMCOLL_HAVE_HWLOC
/// The machine's topology with its important I/O devices, loaded once per process and
/// only read afterwards (hwloc allows concurrent reads).
struct Machine {
  hwloc_topology_t topo = nullptr;
  Machine() {
    if (hwloc_topology_init(&topo) != 0) {
      topo = nullptr;
      return;
    }
    hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    if (hwloc_topology_load(topo) != 0) {
      hwloc_topology_destroy(topo);
      topo = nullptr;
    }
  }
  ~Machine() {
    if (topo) hwloc_topology_destroy(topo);
  }
};

hwloc_topology_t machine() {
  static const Machine m;
  return m.topo;
}

std::string list_of(hwloc_const_bitmap_t set) {
  char buf[256];
  hwloc_bitmap_list_snprintf(buf, sizeof buf, set);
  return buf;
}

/// The NUMA node(s) local to the GPU `device` (its PCI device's first non-I/O ancestor),
/// as a nodeset list, or "" when that cannot be found.
std::string gpu_numa_key(hwloc_topology_t topo, int device, std::string* note) {
#if STREAMCOLL_HAVE_CUDA
  const cuda::Driver& d = cuda::driver();
  if (device < 0 || !d.usable) return "";
  CUdevice dev = 0;
  char bus[64] = {};
  if (SC_CU_RESULT(d.cuDeviceGet(&dev, device)) != CUDA_SUCCESS ||  // a probe: a note, no error
      SC_CU_RESULT(d.cuDeviceGetPCIBusId(bus, sizeof bus - 1, dev)) != CUDA_SUCCESS) {
    *note = "no PCI bus id for device " + std::to_string(device);
    return "";
  }
  hwloc_obj_t pci = hwloc_get_pcidev_by_busidstring(topo, bus);
  hwloc_obj_t near = pci ? hwloc_get_non_io_ancestor_obj(topo, pci) : nullptr;
  if (!near || !near->nodeset || hwloc_bitmap_iszero(near->nodeset)) {
    *note = std::string("hwloc does not place GPU ") + bus;
    return "";
  }
  return list_of(near->nodeset);
#else
  (void)topo;
  (void)device;
  (void)note;
  return "";
#endif
}

/// The NUMA node(s) of this thread's CPU binding as a nodeset list, or "*" when the
/// binding spans NUMA nodes with different CPUs (unbound, or bound across sockets).
/// NUMA nodes with the same CPUs (DRAM and HBM of one domain) count as one.
std::string cpu_numa_key(hwloc_topology_t topo, std::string* note) {
  hwloc_bitmap_t bind = hwloc_bitmap_alloc();
  if (hwloc_get_cpubind(topo, bind, HWLOC_CPUBIND_THREAD) != 0 &&
      hwloc_get_cpubind(topo, bind, HWLOC_CPUBIND_PROCESS) != 0)
    hwloc_bitmap_copy(bind, hwloc_topology_get_allowed_cpuset(topo));
  hwloc_bitmap_t nodes = hwloc_bitmap_alloc();
  hwloc_const_bitmap_t cpus = nullptr;  // of the first NUMA node met
  bool several = false;
  const int n = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
  for (int i = 0; i < n; ++i) {
    hwloc_obj_t numa = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, i);
    if (!numa || !numa->cpuset || !hwloc_bitmap_intersects(numa->cpuset, bind)) continue;
    if (!cpus)
      cpus = numa->cpuset;
    else if (!hwloc_bitmap_isequal(cpus, numa->cpuset))
      several = true;
    hwloc_bitmap_set(nodes, numa->os_index);
  }
  std::string key = kUnknown;
  if (several)
    *note = "the CPU binding " + list_of(bind) + " spans NUMA nodes " + list_of(nodes);
  else if (!cpus)
    *note = "no NUMA node holds the CPU binding " + list_of(bind);
  else
    key = list_of(nodes);
  hwloc_bitmap_free(nodes);
  hwloc_bitmap_free(bind);
  return key;
}
#endif

/// This rank's NUMA key: the GPU's NUMA node(s) for device >= 0 when it can be found, else
/// those of the CPU binding; "*" when unknown.
std::string numa_key(int device, std::string* note) {
#if STREAMCOLL_HAVE_HWLOC
  hwloc_topology_t topo = machine();
  if (!topo) {
    *note = "hwloc could not load the topology";
    return kUnknown;
  }
  if (device >= 0) {
    std::string k = gpu_numa_key(topo, device, note);
    if (!k.empty()) return "gpu " + k;
  }
  return cpu_numa_key(topo, note);
#else
  (void)device;
  *note = "built without hwloc";
  return kUnknown;
#endif
}

/// Whether the numa level is used: every node splits into the same number (>= 2) of
/// NUMA groups of the same size (>= 2 ranks), and no rank's NUMA node is unknown.
bool numa_level_usable(const std::vector<std::string>& node, const std::vector<std::string>& numa,
                       std::string* why_not) {
  std::map<std::string, std::map<std::string, int>> per_node;
  for (size_t r = 0; r < node.size(); ++r) {
    if (numa[r] == kUnknown) {
      *why_not = "the NUMA node of rank " + std::to_string(r) + " is unknown";
      return false;
    }
    ++per_node[node[r]][numa[r]];
  }
  const size_t groups = per_node.begin()->second.size();
  const int size = per_node.begin()->second.begin()->second;
  for (const auto& [n, g] : per_node)
    for (const auto& [k, count] : g)
      if (g.size() != groups || count != size) {
        *why_not = "the nodes do not split evenly into NUMA groups";
        return false;
      }
  if (groups < 2 || size < 2) {
    *why_not = std::to_string(groups) + " NUMA group(s) of " + std::to_string(size) +
               " rank(s) per node";
    return false;
  }
  return true;
}

/// STREAMCOLL_NODE_GROUPS compiled, innermost first; empty when unset or malformed.
class GroupPatterns {
 public:
  explicit GroupPatterns(const std::string& spec) {
    size_t start = 0;
    while (!spec.empty() && start <= spec.size()) {
      size_t end = spec.find(';', start);
      if (end == std::string::npos) end = spec.size();
      const std::string pattern = spec.substr(start, end - start);
      regex_t re;
      const int rc = pattern.empty() ? REG_BADPAT : regcomp(&re, pattern.c_str(), REG_EXTENDED);
      if (rc != 0) {
        static std::atomic<bool> warned{false};
        if (!warned.exchange(true)) {
          char msg[128] = "empty expression";
          if (!pattern.empty()) regerror(rc, &re, msg, sizeof msg);
          SC_WARN("STREAMCOLL_NODE_GROUPS: '%s' is not an extended regular expression (%s); "
                  "the setting is ignored",
                  pattern.c_str(), msg);
        }
        clear();
        return;
      }
      res_.push_back(re);
      start = end + 1;
    }
  }
  ~GroupPatterns() { clear(); }
  GroupPatterns(const GroupPatterns&) = delete;
  GroupPatterns& operator=(const GroupPatterns&) = delete;

  size_t size() const { return res_.size(); }

  /// The group of node `name` at level i: the first sub-expression (or the whole match);
  /// a name that does not match is a group of its own.
  std::string group(size_t i, const std::string& name) const {
    regmatch_t m[2];
    if (regexec(&res_[i], name.c_str(), 2, m, 0) != 0) return "node " + name;
    const regmatch_t& g = (res_[i].re_nsub >= 1 && m[1].rm_so >= 0) ? m[1] : m[0];
    return "group " + name.substr(g.rm_so, g.rm_eo - g.rm_so);
  }

 private:
  void clear() {
    for (regex_t& re : res_) regfree(&re);
    res_.clear();
  }
  std::vector<regex_t> res_;
};

}  // namespace

std::optional<Hierarchy> discover(const CommContext& ctx, int device, std::string* why) {
  auto fail = [&](std::string reason) -> std::optional<Hierarchy> {
    if (ctx.rank == 0) SC_INFO("no hierarchy for %d ranks: %s", ctx.size, reason.c_str());
    set_why(why, std::move(reason));
    return std::nullopt;
  };
  if (ctx.inter) return fail("an inter-communicator");
  if (ctx.local == MPI_COMM_NULL) return fail("no node communicator");

  // Node: the lowest rank on the node.
  int lead = ctx.rank;
  if (PMPI_Allreduce(&ctx.rank, &lead, 1, MPI_INT, MPI_MIN, ctx.local) != MPI_SUCCESS)
    return fail("PMPI_Allreduce on the node failed");

  // Levels above the node: every rank must have the same number.
  const GroupPatterns patterns(Runtime::get().settings().node_groups);
  int ng[2] = {static_cast<int>(patterns.size()), -static_cast<int>(patterns.size())};
  int ng_max[2] = {0, 0};
  if (PMPI_Allreduce(ng, ng_max, 2, MPI_INT, MPI_MAX, ctx.comm) != MPI_SUCCESS)
    return fail("PMPI_Allreduce failed");
  if (ng_max[0] != -ng_max[1]) return fail("STREAMCOLL_NODE_GROUPS differs between ranks");

  // Every rank's keys: numa, node, group1, ...; kKeyBytes each.
  std::string note;
  std::vector<std::string> mine = {fit(numa_key(device, &note)), std::to_string(lead)};
  if (patterns.size()) {
    char name[MPI_MAX_PROCESSOR_NAME + 1] = {};
    int len = 0;
    if (PMPI_Get_processor_name(name, &len) != MPI_SUCCESS) return fail("no processor name");
    for (size_t i = 0; i < patterns.size(); ++i) mine.push_back(fit(patterns.group(i, name)));
  }
  SC_TRACE("topology: NUMA key '%s'%s%s (device %d), node of rank %d", mine[0].c_str(),
           note.empty() ? "" : ": ", note.c_str(), device, lead);
  const size_t nk = mine.size();
  std::vector<char> send(nk * kKeyBytes, '\0'), all(send.size() * ctx.size, '\0');
  for (size_t k = 0; k < nk; ++k) std::memcpy(&send[k * kKeyBytes], mine[k].data(), mine[k].size());
  if (PMPI_Allgather(send.data(), static_cast<int>(send.size()), MPI_CHAR, all.data(),
                     static_cast<int>(send.size()), MPI_CHAR, ctx.comm) != MPI_SUCCESS)
    return fail("PMPI_Allgather failed");

  std::vector<std::vector<std::string>> keys(nk, std::vector<std::string>(ctx.size));
  for (int r = 0; r < ctx.size; ++r)
    for (size_t k = 0; k < nk; ++k) {
      const char* p = &all[(r * nk + k) * kKeyBytes];
      keys[k][r].assign(p, strnlen(p, kKeyBytes - 1));
    }
  std::vector<std::string> names = {"numa", "node"};
  for (size_t i = 1; i <= patterns.size(); ++i) names.push_back("group" + std::to_string(i));

  std::string no_numa;
  if (!numa_level_usable(keys[1], keys[0], &no_numa)) {
    keys.erase(keys.begin());
    names.erase(names.begin());
  }
  std::string reason;
  std::optional<Hierarchy> h = from_keys(keys, names, &reason);
  if (!h) return fail(reason);
  if (ctx.rank == 0)
    SC_INFO("hierarchy of %d ranks: %s%s%s", ctx.size, h->describe().c_str(),
            no_numa.empty() ? "" : "; no numa level: ", no_numa.c_str());
  return h;
}

}  // namespace streamcoll::topo
