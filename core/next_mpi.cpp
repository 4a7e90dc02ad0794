#include "core/next_mpi.hpp"

#include <dlfcn.h>

namespace streamcoll::next {

Table g;

namespace {

// At load time (a constructor: before main, and before anything can call MPI through
// libstreamcoll). dlsym(RTLD_NEXT) from here finds the definitions after libstreamcoll's
// in the lookup order (or after the executable's, when linked into it statically).
__attribute__((constructor)) void resolve_next() {
#define STREAMCOLL_NEXT_RESOLVE(fn)                                      \
  if (void* p = dlsym(RTLD_NEXT, #fn)) g.fn = reinterpret_cast<decltype(g.fn)>(p);
  STREAMCOLL_NEXT_FUNCTIONS(STREAMCOLL_NEXT_RESOLVE)
#undef STREAMCOLL_NEXT_RESOLVE
}

}  // namespace
}  // namespace streamcoll::next
