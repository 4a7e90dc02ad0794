#include "core/next_mpi.hpp"

#include <dlfcn.h>

namespace streamcoll::next {

void* find(const char* name, void* fallback) {
  void* p = dlsym(RTLD_NEXT, name);
  return p ? p : fallback;
}

}  // namespace streamcoll::next
