// The next definition of an MPI function after libstreamcoll, for the calls streamcoll
// passes on unchanged (the pass-through of an intercepted call, route pmpi, MPI_Init and
// MPI_Finalize, the wait/test family): another PMPI tool preloaded after streamcoll
// (LD_PRELOAD=libstreamcoll.so:libtool.so) then still sees them, as interposing libraries
// that chain do; without one it is the MPI library's own. Found once per call site with
// dlsym(RTLD_NEXT, "MPI_..."), falling back to the PMPI_ entry point.
// A tool preloaded before streamcoll reaches it when that tool chains the same way (its
// MPI_X calls the next MPI_X); one that calls PMPI_X goes straight to the MPI library
// (streamcoll defines no PMPI_ names), so it belongs after streamcoll (README).
#pragma once

namespace streamcoll::next {

/// dlsym(RTLD_NEXT, name) from libstreamcoll, or `fallback` when there is none.
void* find(const char* name, void* fallback);

}  // namespace streamcoll::next

/// The next `fn` (an MPI_ name) as a function pointer of PMPI_fn's type, resolved once.
#define SC_NEXT(fn)                                                                       \
  ([]() {                                                                                 \
    static const auto next_ = reinterpret_cast<decltype(&P##fn)>(                         \
        ::streamcoll::next::find(#fn, reinterpret_cast<void*>(&P##fn)));                  \
    return next_;                                                                         \
  }())
