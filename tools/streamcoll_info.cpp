// streamcoll-info: what streamcoll would see on this node, like ompi_info or al_info.
//
//   streamcoll-info [--json] [--no-mpi]
//   streamcoll-info --knobs
//   streamcoll-info --routes
//   streamcoll-info --explain "allreduce 8 device 64 ranks 8 nodes [stream]"
//
// Reports the build (version, options, the MPI it was compiled against), the MPI it runs
// with (library version, standard, CUDA-awareness, the thread level it gives), the CUDA
// driver and its devices (name, memory, PCI bus id, peer access), under mpirun the GPUs of
// the node's ranks and how each rank reaches the others' (the same GPU, peer access, CUDA
// IPC to a GPU it cannot see: route nvgroup's view; only rank 0 prints), NCCL (found where, which
// version, whether children can share their parent's resources, the budget a job's NCCL
// communicators get), the hwloc topology (packages, NUMA nodes, cores, GPUs and network devices and
// which of them share a NUMA node), the effective tuning table (embedded or file, after
// STREAMCOLL_ROUTE) and every environment knob with its value. It loads the CUDA driver
// and NCCL the way libstreamcoll does (dlopen) and says so where they are missing: it runs
// on a node with no GPU, no driver and no NCCL. MPI is initialised (PMPI_Init_thread,
// asking for MPI_THREAD_MULTIPLE, a singleton without mpirun) unless --no-mpi.
// --json prints one JSON object with the same content (keys as in the text, lower case).
// --knobs prints the environment knobs' reference table (Markdown, docs/reference.md's).
// --routes prints the routes' reference table (Markdown, docs/reference.md's).
// --explain answers what the effective tuning table (STREAMCOLL_TUNING_FILE or the
// embedded default, STREAMCOLL_ROUTE in front) does with a call, without running it: the
// rules it is offered to in order and the route (config::explain). No MPI.
// Exit status 0, or 2 for a bad argument.
#include <dlfcn.h>
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "algorithms/route.hpp"
#include "config/env.hpp"
#include "config/tuning_table.hpp"
#include "core/cuda_driver.hpp"
#include "core/host_staging.hpp"
#include "core/runtime.hpp"
#include "streamcoll/streamcoll.h"
#if STREAMCOLL_HAVE_NCCL
#include "algorithms/nccl_lib.hpp"
#endif
#if STREAMCOLL_HAVE_HWLOC
#include <hwloc.h>
#endif

namespace {

// ---- a small ordered tree, printed as indented text or as JSON ------------------------

struct Node {
  enum Kind { null, boolean, number, text, list, object } kind = null;
  bool b = false;
  double n = 0;
  std::string s;
  std::vector<std::pair<std::string, Node>> items;  // list: keys empty

  static Node Str(std::string v) {
    Node x;
    x.kind = text;
    x.s = std::move(v);
    return x;
  }
  static Node Num(double v) {
    Node x;
    x.kind = number;
    x.n = v;
    return x;
  }
  static Node Bool(bool v) {
    Node x;
    x.kind = boolean;
    x.b = v;
    return x;
  }
  static Node List() {
    Node x;
    x.kind = list;
    return x;
  }
  static Node Obj() {
    Node x;
    x.kind = object;
    return x;
  }
  Node& add(const std::string& key, Node v) {
    items.emplace_back(key, std::move(v));
    return items.back().second;
  }
  Node& push(Node v) { return add("", std::move(v)); }
};

std::string json_quote(const std::string& s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\n': o += "\\n"; break;
      case '\t': o += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          o += buf;
        } else {
          o += static_cast<char>(c);
        }
    }
  }
  return o + "\"";
}

std::string number_text(double v) {
  char buf[32];
  if (v == static_cast<double>(static_cast<long long>(v))) std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(v));
  else std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

void print_json(const Node& x, std::string* out) {
  switch (x.kind) {
    case Node::null: *out += "null"; return;
    case Node::boolean: *out += x.b ? "true" : "false"; return;
    case Node::number: *out += number_text(x.n); return;
    case Node::text: *out += json_quote(x.s); return;
    case Node::list:
    case Node::object: {
      *out += x.kind == Node::list ? "[" : "{";
      bool first = true;
      for (const auto& [k, v] : x.items) {
        if (!first) *out += ",";
        first = false;
        if (x.kind == Node::object) *out += json_quote(k) + ":";
        print_json(v, out);
      }
      *out += x.kind == Node::list ? "]" : "}";
      return;
    }
  }
}

std::string scalar_text(const Node& x) {
  switch (x.kind) {
    case Node::null: return "(none)";
    case Node::boolean: return x.b ? "yes" : "no";
    case Node::number: return number_text(x.n);
    case Node::text: return x.s;
    default: return "";
  }
}

void print_text(const Node& x, int depth, std::string* out) {
  const std::string pad(static_cast<size_t>(depth) * 2, ' ');
  for (const auto& [k, v] : x.items) {
    const bool nested = v.kind == Node::list || v.kind == Node::object;
    const std::string key = k.empty() ? "-" : k + ":";
    if (!nested) {
      *out += pad + key + " " + scalar_text(v) + "\n";
    } else if (v.items.empty()) {
      *out += pad + key + " (none)\n";
    } else {
      *out += pad + key + "\n";
      print_text(v, depth + 1, out);
    }
  }
}

// ---- the sections ---------------------------------------------------------------------

Node build_section() {
  Node b = Node::Obj();
  b.add("version", Node::Str(STREAMCOLL_VERSION));
  b.add("cuda headers", Node::Bool(STREAMCOLL_HAVE_CUDA));
  b.add("nccl header", Node::Bool(STREAMCOLL_HAVE_NCCL));
  b.add("nvgroup kernels", Node::Bool(STREAMCOLL_HAVE_NVGROUP));
  b.add("hwloc", Node::Bool(STREAMCOLL_HAVE_HWLOC));
  // The routes this build carries (whether nccl and ccube can run also needs libnccl and
  // a GPU at run time: the "nccl" and "cuda" sections).
  Node routes = Node::List();
  for (const streamcoll::RouteInfo& r : streamcoll::route_table())
    if (streamcoll::route_built(r.id)) routes.push(Node::Str(std::string(r.name)));
  b.add("routes built", std::move(routes));
#ifdef STREAMCOLL_PREFIX
  b.add("prefix", Node::Str(STREAMCOLL_PREFIX));
#endif
  std::string mpi = "MPI " + std::to_string(MPI_VERSION) + "." + std::to_string(MPI_SUBVERSION);
#if defined(OMPI_MAJOR_VERSION)
  mpi = "Open MPI " + std::to_string(OMPI_MAJOR_VERSION) + "." + std::to_string(OMPI_MINOR_VERSION) + "." +
        std::to_string(OMPI_RELEASE_VERSION) + " (" + mpi + ")";
#elif defined(MPICH_VERSION)
  mpi = std::string("MPICH ") + MPICH_VERSION + " (" + mpi + ")";
#endif
  b.add("built for mpi", Node::Str(mpi));
  b.add("compiler", Node::Str(__VERSION__));
  return b;
}

std::string thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
    default: return std::to_string(level);
  }
}

Node mpi_section(bool init, const streamcoll::config::Settings& s) {
  Node m = Node::Obj();
  char lib[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  int len = 0;
  if (PMPI_Get_library_version(lib, &len) == MPI_SUCCESS) {
    std::string v(lib);  // len may count the terminating NUL
    v = v.substr(0, v.find('\n'));
    while (!v.empty() && (v.back() == ' ' || v.back() == ',')) v.pop_back();
    m.add("library", Node::Str(v));
  }
  int major = 0, minor = 0;
  PMPI_Get_version(&major, &minor);
  m.add("standard", Node::Str(std::to_string(major) + "." + std::to_string(minor)));
  if (init) {
    int provided = -1, flag = 0;
    PMPI_Initialized(&flag);
    if (flag) PMPI_Query_thread(&provided);
    m.add("thread level given", Node::Str(provided >= 0 ? thread_level_name(provided) : "unknown"));
    const streamcoll::host_staging::Awareness aw = streamcoll::host_staging::query(s.mpi_cuda_aware);
    m.add("cuda-aware", Node::Bool(aw.aware));
    m.add("cuda-aware because", Node::Str(aw.how));
  } else {
    m.add("initialised", Node::Bool(false));
  }
  m.add("streamcoll asks for MPI_THREAD_MULTIPLE", Node::Bool(streamcoll::Runtime::wants_thread_multiple()));
  return m;
}

Node cuda_section() {
  Node c = Node::Obj();
#if !STREAMCOLL_HAVE_CUDA
  c.add("driver", Node::Str("not in this build (no CUDA headers)"));
  return c;
#else
  // libstreamcoll uses the driver once the application has loaded it: load it as one
  // would, then ask streamcoll's loader.
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (!lib) {
    const char* err = dlerror();
    c.add("driver", Node::Str(std::string("none (") + (err ? err : "libcuda.so.1 not found") + ")"));
    c.add("devices", Node::List());
    return c;
  }
  const streamcoll::cuda::Driver& d = streamcoll::cuda::driver();
  c.add("driver usable", Node::Bool(d.usable));
  if (!d.usable) {
    c.add("why not", Node::Str(d.reason));
    c.add("devices", Node::List());
    return c;
  }
  c.add("driver version", Node::Str(std::to_string(d.version / 1000) + "." + std::to_string(d.version % 1000 / 10)));
  using name_fn = CUresult (*)(char*, int, CUdevice);
  using mem_fn = CUresult (*)(size_t*, CUdevice);
  auto get_name = reinterpret_cast<name_fn>(dlsym(lib, "cuDeviceGetName"));
  auto get_mem = reinterpret_cast<mem_fn>(dlsym(lib, "cuDeviceTotalMem_v2"));
  Node devs = Node::List();
  std::vector<CUdevice> handles;
  for (int i = 0; i < d.device_count; ++i) {
    CUdevice dev = 0;
    if (d.cuDeviceGet(&dev, i) != CUDA_SUCCESS) continue;
    handles.push_back(dev);
    Node x = Node::Obj();
    x.add("ordinal", Node::Num(i));
    char name[256] = {0};
    if (get_name && get_name(name, sizeof name - 1, dev) == CUDA_SUCCESS) x.add("name", Node::Str(name));
    size_t bytes = 0;
    if (get_mem && get_mem(&bytes, dev) == CUDA_SUCCESS) x.add("memory bytes", Node::Num(static_cast<double>(bytes)));
    char bus[64] = {0};
    if (d.cuDeviceGetPCIBusId(bus, sizeof bus - 1, dev) == CUDA_SUCCESS) x.add("pci bus id", Node::Str(bus));
    devs.push(std::move(x));
  }
  c.add("devices", std::move(devs));
  // Peer access, row i: the devices device i can access (cuDeviceCanAccessPeer).
  Node peers = Node::List();
  for (size_t i = 0; i < handles.size(); ++i) {
    std::string row;
    for (size_t j = 0; j < handles.size(); ++j) {
      int can = 0;
      if (i != j && d.cuDeviceCanAccessPeer) d.cuDeviceCanAccessPeer(&can, handles[i], handles[j]);
      row += i == j ? "-" : can ? "1" : "0";
    }
    peers.push(Node::Str(row));
  }
  c.add("peer access", std::move(peers));
  return c;
#endif
}

#if STREAMCOLL_HAVE_CUDA
// The GPUs of this node's ranks (MPI_COMM_TYPE_SHARED) as route nvgroup would reach them,
// row i the local rank i's view: "=" the same GPU, "P" a GPU it sees with peer access, "I"
// a GPU it cannot see (one GPU per rank) whose memory it opened through CUDA IPC (the
// probe nvgroup's set-up makes), "x" neither. Each rank uses its current device, or
// device 0. Collective over MPI_COMM_WORLD.
Node node_gpus_section() {
  Node n = Node::Obj();
  const streamcoll::cuda::Driver& d = streamcoll::cuda::driver();
  MPI_Comm node = MPI_COMM_NULL;
  PMPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int me = 0, size = 1;
  PMPI_Comm_rank(node, &me);
  PMPI_Comm_size(node, &size);
  struct Mine {
    int ok;
    char bus[32];
    CUipcMemHandle handle;
  } mine{};
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  CUdeviceptr buf = 0;
  const bool can = d.usable && d.device_count > 0 && d.cuMemAlloc && d.cuIpcGetMemHandle &&
                   d.cuIpcOpenMemHandle && d.cuIpcCloseMemHandle && d.cuMemFree;
  if (can && d.cuDeviceGet(&dev, 0) == CUDA_SUCCESS &&
      d.cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS && d.cuCtxPushCurrent(ctx) == CUDA_SUCCESS &&
      d.cuDeviceGetPCIBusId(mine.bus, sizeof mine.bus - 1, dev) == CUDA_SUCCESS &&
      d.cuMemAlloc(&buf, 4096) == CUDA_SUCCESS && d.cuIpcGetMemHandle(&mine.handle, buf) == CUDA_SUCCESS)
    mine.ok = 1;
  std::vector<Mine> all(static_cast<size_t>(size));
  PMPI_Allgather(&mine, sizeof mine, MPI_BYTE, all.data(), sizeof mine, MPI_BYTE, node);
  std::string row;
  for (int j = 0; j < size; ++j) {
    const Mine& o = all[static_cast<size_t>(j)];
    char c = 'x';
    CUdevice other = 0;
    int peer = 0;
    if (!mine.ok || !o.ok) c = '?';
    else if (std::strcmp(mine.bus, o.bus) == 0) c = '=';
    else if (d.cuDeviceGetByPCIBusId(&other, o.bus) == CUDA_SUCCESS)
      c = d.cuDeviceCanAccessPeer(&peer, dev, other) == CUDA_SUCCESS && peer ? 'P' : 'x';
    else if (CUdeviceptr p = 0; d.cuIpcOpenMemHandle(&p, o.handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_SUCCESS)
      c = 'I', d.cuIpcCloseMemHandle(p);
    row += c;
  }
  PMPI_Barrier(node);  // every open closed before any buffer goes
  std::vector<char> rows(static_cast<size_t>(size) * static_cast<size_t>(size));
  PMPI_Allgather(row.data(), size, MPI_CHAR, rows.data(), size, MPI_CHAR, node);
  Node buses = Node::List(), matrix = Node::List();
  for (int i = 0; i < size; ++i) {
    buses.push(Node::Str(all[static_cast<size_t>(i)].ok ? all[static_cast<size_t>(i)].bus : "(no GPU)"));
    matrix.push(Node::Str(std::string(rows.data() + static_cast<size_t>(i) * size, static_cast<size_t>(size))));
  }
  n.add("ranks on this node", Node::Num(size));
  n.add("gpu of each local rank", std::move(buses));
  n.add("reach (= same GPU, P peer access, I CUDA IPC to a GPU not visible, x none, ? no GPU)",
        std::move(matrix));
  if (buf) d.cuMemFree(buf);
  if (ctx) {
    CUcontext popped = nullptr;
    d.cuCtxPopCurrent(&popped);
    d.cuDevicePrimaryCtxRelease(dev);
  }
  PMPI_Comm_free(&node);
  return n;
}
#endif

Node nccl_section(const streamcoll::config::Settings& s) {
  Node n = Node::Obj();
#if !STREAMCOLL_HAVE_NCCL
  (void)s;
  n.add("found", Node::Bool(false));
  n.add("why not", Node::Str("not in this build (no nccl.h)"));
#else
  const streamcoll::nccl::Library& lib = streamcoll::nccl::library(s.nccl_lib);
  n.add("found", Node::Bool(lib.usable));
  n.add("path", Node::Str(lib.path.empty() ? (s.nccl_lib.empty() ? "libnccl.so.2" : s.nccl_lib) : lib.path));
  if (lib.usable)
    n.add("version", Node::Str(std::to_string(lib.version / 10000) + "." + std::to_string(lib.version / 100 % 100) +
                                   "." + std::to_string(lib.version % 100)));
  else
    n.add("why not", Node::Str(lib.reason));
  // What a job's NCCL communicators may take here (algorithms/nccl_comm.hpp, Pool): the
  // budget per process, and whether children can share their parent's resources.
  n.add("children share the parent's resources (ncclCommSplit, splitShare)",
        Node::Bool(lib.usable && lib.ncclCommSplit != nullptr));
  Node budget = Node::Obj();
  budget.add("communicators at most (STREAMCOLL_NCCL_MAX_COMMS)", Node::Num(s.nccl_max_comms));
  if (s.nccl_memory_bytes)
    budget.add("GPU memory at most, bytes (STREAMCOLL_NCCL_MEMORY)",
               Node::Num(static_cast<double>(s.nccl_memory_bytes)));
  else
    budget.add("GPU memory at most, share of each GPU (STREAMCOLL_NCCL_MEMORY)",
               Node::Num(s.nccl_memory_share));
  budget.add("one-rank communicators (STREAMCOLL_ONE_RANK_SELF)",
             Node::Str(s.one_rank_self ? "route self: no NCCL communicator" : "routed as any"));
  n.add("budget", std::move(budget));
#endif
  return n;
}

Node topology_section() {
  Node t = Node::Obj();
#if !STREAMCOLL_HAVE_HWLOC
  t.add("hwloc", Node::Str("not in this build"));
#else
  hwloc_topology_t topo = nullptr;
  if (hwloc_topology_init(&topo) != 0) {
    t.add("hwloc", Node::Str("hwloc_topology_init failed"));
    return t;
  }
  hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  if (hwloc_topology_load(topo) != 0) {
    hwloc_topology_destroy(topo);
    t.add("hwloc", Node::Str("hwloc_topology_load failed"));
    return t;
  }
  t.add("packages", Node::Num(hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PACKAGE)));
  t.add("numa nodes", Node::Num(hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE)));
  t.add("cores", Node::Num(hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE)));
  t.add("hardware threads", Node::Num(hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU)));
  // GPUs (NVIDIA PCI display or 3D controllers) and network devices, each with the NUMA
  // nodes nearest to it; a GPU's "near" list names the network devices that share them.
  auto numa_of = [&](hwloc_obj_t o) {
    hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(topo, o);
    char buf[128] = "?";
    if (anc && anc->nodeset) hwloc_bitmap_list_snprintf(buf, sizeof buf, anc->nodeset);
    return std::string(buf);
  };
  auto bus_of = [](hwloc_obj_t pci) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%04x:%02x:%02x.%x", pci->attr->pcidev.domain, pci->attr->pcidev.bus,
                  pci->attr->pcidev.dev, pci->attr->pcidev.func);
    return std::string(buf);
  };
  struct Dev {
    std::string name, bus, numa;
  };
  std::vector<Dev> gpus, nics;
  for (hwloc_obj_t o = hwloc_get_next_pcidev(topo, nullptr); o; o = hwloc_get_next_pcidev(topo, o)) {
    const unsigned cls = o->attr->pcidev.class_id >> 8;
    if (cls == 0x03 && o->attr->pcidev.vendor_id == 0x10de)
      gpus.push_back({"NVIDIA " + std::string(o->name ? o->name : "GPU"), bus_of(o), numa_of(o)});
  }
  for (hwloc_obj_t o = hwloc_get_next_osdev(topo, nullptr); o; o = hwloc_get_next_osdev(topo, o)) {
    const auto type = o->attr->osdev.type;
    if (type != HWLOC_OBJ_OSDEV_NETWORK && type != HWLOC_OBJ_OSDEV_OPENFABRICS) continue;
    hwloc_obj_t pci = o->parent;
    while (pci && pci->type != HWLOC_OBJ_PCI_DEVICE) pci = pci->parent;
    nics.push_back({o->name ? o->name : "?", pci ? bus_of(pci) : "", numa_of(o)});
  }
  Node g = Node::List();
  for (const Dev& x : gpus) {
    Node e = Node::Obj();
    e.add("pci bus id", Node::Str(x.bus));
    e.add("numa nodes", Node::Str(x.numa));
    Node near = Node::List();
    for (const Dev& n : nics)
      if (n.numa == x.numa) near.push(Node::Str(n.name));
    e.add("network devices near", std::move(near));
    g.push(std::move(e));
  }
  t.add("gpus", std::move(g));
  Node nn = Node::List();
  for (const Dev& x : nics) {
    Node e = Node::Obj();
    e.add("name", Node::Str(x.name));
    if (!x.bus.empty()) e.add("pci bus id", Node::Str(x.bus));
    e.add("numa nodes", Node::Str(x.numa));
    nn.push(std::move(e));
  }
  t.add("network devices", std::move(nn));
  hwloc_topology_destroy(topo);
#endif
  return t;
}

Node table_section(const streamcoll::config::Settings& s) {
  Node t = Node::Obj();
  std::string source = "embedded default";
  if (!s.tuning_file.empty()) {
    std::ifstream in(s.tuning_file);
    std::optional<streamcoll::config::ParseError> err;
    if (!in) {
      source = s.tuning_file + " cannot be opened: the embedded default instead";
    } else {
      std::stringstream text;
      text << in.rdbuf();
      streamcoll::config::TuningTable::parse(text.str(), s.tuning_file, &err);
      source = err ? err->to_string() + ": the embedded default instead" : s.tuning_file;
    }
  }
  t.add("source", Node::Str(source));
  if (!s.route.empty()) {
    std::optional<streamcoll::config::ParseError> err;
    streamcoll::config::TuningTable::parse_forced(s.route, &err);
    t.add("STREAMCOLL_ROUTE", Node::Str(err ? err->to_string() + " (ignored)" : s.route + " (in front)"));
  }
  Node rules = Node::List();
  const streamcoll::config::TuningTable table = streamcoll::effective_table(s, false);
  for (const streamcoll::config::Rule& r : table.rules()) rules.push(Node::Str(r.to_string()));
  t.add("rules", std::move(rules));
  return t;
}

Node environment_section(const streamcoll::config::Settings& s) {
  using streamcoll::config::Agreed;
  Node e = Node::List();
  for (const streamcoll::config::Knob& k : streamcoll::config::knobs()) {
    Node x = Node::Obj();
    const std::string name(k.name);
    x.add("name", Node::Str(name));
    const char* v = std::getenv(name.c_str());
    x.add("value", v ? Node::Str(v) : Node());
    x.add("default", Node::Str(std::string(k.default_value)));
    x.add("in effect", Node::Str(k.show(s)));
    x.add("agreed", Node::Str(k.agreed == Agreed::value      ? "value"
                              : k.agreed == Agreed::presence ? "presence"
                              : k.agreed == Agreed::table    ? "table"
                                                             : "local"));
    e.push(std::move(x));
  }
  return e;
}

// Text form of the environment: one line per knob.
Node environment_text(const Node& list) {
  Node t = Node::Obj();
  for (const auto& [unused, k] : list.items) {
    const Node& value = k.items[1].second;
    const std::string def = k.items[2].second.s, effect = k.items[3].second.s;
    t.add(k.items[0].second.s,
          Node::Str(value.kind == Node::null
                        ? "(unset; default " + (def.empty() ? std::string("none") : def) + ")"
                        : value.s + (effect == value.s ? "" : " (in effect: " + effect + ")")));
  }
  return t;
}

// --explain: the effective table's answer for the call `spec` describes. 0, or 2 for a
// call that does not parse.
int explain_call(const char* spec) {
  streamcoll::config::CallKey key;
  std::string error;
  if (!streamcoll::config::parse_call(spec, &key, &error)) {
    std::fprintf(stderr, "streamcoll-info: --explain \"%s\": %s\n", spec, error.c_str());
    return 2;
  }
  const streamcoll::config::Settings s = streamcoll::config::read_settings();
  const streamcoll::config::TuningTable table = streamcoll::effective_table(s, false);
  std::printf("%s %llu B on %s memory, %d ranks on %d nodes (%d per node), %s; table: %s%s\n",
              std::string(streamcoll::name(key.coll)).c_str(),
              static_cast<unsigned long long>(key.bytes),
              std::string(streamcoll::name(key.mem)).c_str(), key.ranks, key.nodes, key.ppn,
              key.stream ? "stream-ordered" : "classic",
              s.tuning_file.empty() ? "embedded default" : s.tuning_file.c_str(),
              s.route.empty() ? "" : (", STREAMCOLL_ROUTE=" + s.route + " in front").c_str());
  std::fputs(streamcoll::config::explain(table, key, streamcoll::route_built).c_str(), stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false, init = true;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) {
      json = true;
    } else if (std::strcmp(argv[i], "--no-mpi") == 0) {
      init = false;
    } else if (std::strcmp(argv[i], "--knobs") == 0) {
      std::fputs(streamcoll::config::knobs_markdown().c_str(), stdout);
      return 0;
    } else if (std::strcmp(argv[i], "--routes") == 0) {
      std::fputs(streamcoll::config::routes_markdown().c_str(), stdout);
      return 0;
    } else if (std::strcmp(argv[i], "--explain") == 0) {
      return i + 1 < argc ? explain_call(argv[i + 1]) : (std::fputs("streamcoll-info: --explain needs a call, e.g. \"allreduce 8 device 64 ranks 8 nodes\"\n", stderr), 2);
    } else if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::printf("usage: streamcoll-info [--json] [--no-mpi] | --knobs | --routes | --explain CALL\n"
                  "  what streamcoll would see here: build, MPI, CUDA, NCCL, topology, tuning\n"
                  "  table, environment. --json: one JSON object; --no-mpi: do not initialise MPI;\n"
                  "  --knobs, --routes: the environment knobs' and the routes' reference tables (Markdown);\n"
                  "  --explain \"allreduce 8 device 64 ranks 8 nodes [stream]\": the rules the table offers\n"
                  "  such a call to, in order, and its route.\n");
      return 0;
    } else {
      std::fprintf(stderr, "streamcoll-info: unknown argument '%s' (try --help)\n", argv[i]);
      return 2;
    }
  }
  if (init) {
    int provided = 0;
    if (PMPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) init = false;
  }
  const streamcoll::config::Settings s = streamcoll::config::read_settings();
  Node root = Node::Obj();
  root.add("streamcoll", build_section());
  root.add("mpi", mpi_section(init, s));
  root.add("cuda", cuda_section());
#if STREAMCOLL_HAVE_CUDA
  if (int ranks = 1; init && PMPI_Comm_size(MPI_COMM_WORLD, &ranks) == MPI_SUCCESS && ranks > 1)
    root.add("node gpus", node_gpus_section());
#endif
  root.add("nccl", nccl_section(s));
  root.add("topology", topology_section());
  root.add("tuning table", table_section(s));
  Node env = environment_section(s);
  Node problems = Node::List();
  for (const std::string& p : s.problems) problems.push(Node::Str(p));
  std::string out;
  if (json) {
    root.add("environment", std::move(env));
    root.add("environment problems", std::move(problems));
    print_json(root, &out);
    out += "\n";
  } else {
    root.add("environment", environment_text(env));
    if (!problems.items.empty()) root.add("environment problems", std::move(problems));
    print_text(root, 0, &out);
  }
  // Under mpirun: rank 0 prints (the node's section holds what its other ranks see).
  int rank = 0;
  if (init) PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) std::fputs(out.c_str(), stdout);
  if (init) PMPI_Finalize();
  return 0;
}
