// The registry of route instances, made from base/routes.def: for each row whose `needs`
// this build has, the entry its file defines (`<id>_entry`, algorithms/route.hpp); for
// the others, none. Nothing here names a route.
#include "algorithms/route.hpp"

// A row's `needs` as 0/1 (STREAMCOLL_HAVE_* are always defined, 0 or 1, by meson.build),
// and SC_IF_BUILT(needs)(x) / SC_IF_NOT_BUILT(needs)(x): x, or nothing.
#define SC_NEEDS_always 1
#define SC_NEEDS_cuda STREAMCOLL_HAVE_CUDA
#define SC_NEEDS_nccl STREAMCOLL_HAVE_NCCL
#define SC_NEEDS_nvgroup STREAMCOLL_HAVE_NVGROUP
#define SC_IF_1(...) __VA_ARGS__
#define SC_IF_0(...)
#define SC_IF_NOT_1(...)
#define SC_IF_NOT_0(...) __VA_ARGS__
#define SC_IF_(c) SC_IF_##c
#define SC_IF_NOT_(c) SC_IF_NOT_##c
#define SC_IF(c) SC_IF_(c)
#define SC_IF_NOT(c) SC_IF_NOT_(c)
#define SC_IF_BUILT(needs) SC_IF(SC_NEEDS_##needs)
#define SC_IF_NOT_BUILT(needs) SC_IF_NOT(SC_NEEDS_##needs)

namespace streamcoll {

#define ROUTE(id, needs, ...) SC_IF_BUILT(needs)(extern const RouteEntry id##_entry;)
#include "base/routes.def"
#undef ROUTE

namespace {

// Row i: RouteId i's entry, or nullptr where this build leaves the route out.
constexpr const RouteEntry* kEntries[] = {
#define ROUTE(id, needs, ...) SC_IF_BUILT(needs)(&id##_entry) SC_IF_NOT_BUILT(needs)(nullptr),
#include "base/routes.def"
#undef ROUTE
};
static_assert(sizeof(kEntries) / sizeof(kEntries[0]) == kNumRoutes);

const RouteEntry* entry(RouteId id) {
  const RouteEntry* e = kEntries[static_cast<int>(id)];
  return e && e->instance ? e : nullptr;
}

}  // namespace

Route* find_route(RouteId id) {
  const RouteEntry* e = entry(id);
  return e ? e->instance() : nullptr;  // nullptr: not in this build, or not here
}

bool route_built(RouteId id) { return entry(id) != nullptr; }

void routes_shutdown() {
  for (const RouteEntry* e : kEntries)
    if (e && e->shutdown) e->shutdown();
}

void routes_derive(CommContext& parent, MPI_Comm child) {
  for (const RouteEntry* e : kEntries)
    if (e && e->derive) e->derive(parent, child);
}

ResourceCounts routes_resources() {
  ResourceCounts c;
  for (const RouteEntry* e : kEntries)
    if (e && e->resources) e->resources(&c);
  return c;
}

void routes_release() {
  for (const RouteEntry* e : kEntries)
    if (e && e->release) e->release();
}

}  // namespace streamcoll
