#include "algorithms/nccl_lib.hpp"

#include <dlfcn.h>

#include <type_traits>

namespace streamcoll::nccl {
namespace {

Library load(const std::string& requested) {
  Library l;
  l.path = requested.empty() ? "libnccl.so.2" : requested;
  void* lib = dlopen(l.path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* e = dlerror();
    l.reason = l.path + " not loadable: " + (e ? e : "unknown");
    return l;
  }
  std::string missing;
  auto sym = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
    if (!fn) missing += missing.empty() ? name : std::string(", ") + name;
  };
#define STREAMCOLL_NCCL_LOAD(fn) sym(l.fn, #fn);
  STREAMCOLL_NCCL_ENTRY_POINTS(STREAMCOLL_NCCL_LOAD)
#undef STREAMCOLL_NCCL_LOAD
#define STREAMCOLL_NCCL_LOAD_OPTIONAL(fn) \
  l.fn = reinterpret_cast<decltype(l.fn)>(dlsym(lib, #fn));
  STREAMCOLL_NCCL_OPTIONAL_ENTRY_POINTS(STREAMCOLL_NCCL_LOAD_OPTIONAL)
#undef STREAMCOLL_NCCL_LOAD_OPTIONAL
  if (!missing.empty()) {
    l.reason = l.path + " lacks " + missing;
    return l;
  }
  if (l.ncclGetVersion(&l.version) != ncclSuccess) {
    l.reason = l.path + ": ncclGetVersion failed";
    return l;
  }
  l.usable = true;  // stays loaded: NCCL's proxy threads may outlive any of our calls
  return l;
}

}  // namespace

std::string Library::describe(const char* what, ncclResult_t r, ncclComm_t comm) const {
  std::string s = std::string(what) + ": ";
  s += ncclGetErrorString ? ncclGetErrorString(r) : "error";
  s += " (ncclResult " + std::to_string(static_cast<int>(r)) + ")";
  if (ncclGetLastError) {
    const char* last = ncclGetLastError(comm);
    if (last && *last) s += std::string(" [") + last + "]";
  }
  return s;
}

const Library& library(const std::string& path) {
  static const Library l = load(path);
  return l;
}

}  // namespace streamcoll::nccl
