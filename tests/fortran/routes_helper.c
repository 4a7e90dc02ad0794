/* For the Fortran routing test (routes.F90): how many calls of one collective in this
 * process took the route STREAMCOLL_ROUTE forces for it ("allreduce:ht,bcast:ht", "*:ht";
 * a non-blocking collective, "iallreduce", follows its blocking one's entry), or route
 * pmpi where it forces none; through streamcoll's statistics, found at run time so that
 * it works preloaded or linked. -1 when streamcoll is not loaded. */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "streamcoll/streamcoll.h"

/* The route STREAMCOLL_ROUTE forces for `coll` (a blocking collective's name) into
 * route[len], or "pmpi". */
static void forced_route(const char *coll, char *route, size_t len) {
  const char *spec = getenv("STREAMCOLL_ROUTE");
  strncpy(route, "pmpi", len);
  route[len - 1] = 0;
  while (spec && *spec) {
    const char *end = strchr(spec, ',');
    size_t n = end ? (size_t)(end - spec) : strlen(spec);
    const char *colon = memchr(spec, ':', n);
    if (colon) {
      size_t cn = (size_t)(colon - spec);
      if ((cn == strlen(coll) && strncmp(spec, coll, cn) == 0) || (cn == 1 && spec[0] == '*')) {
        const char *r = colon + 1;
        size_t rn = n - cn - 1;
        const char *more = memchr(r, ':', rn);
        if (more) rn = (size_t)(more - r);
        if (rn >= len) rn = len - 1;
        memcpy(route, r, rn);
        route[rn] = 0;
        return;
      }
    }
    spec = end ? end + 1 : NULL;
  }
}

long long sc_route_calls(const char *collective) {
  int (*get)(const char *, const char *, const char *, streamcoll_stat_t *) =
      (int (*)(const char *, const char *, const char *, streamcoll_stat_t *))dlsym(
          RTLD_DEFAULT, "streamcoll_get_stats");
  if (!get) return -1;
  const char *blocking = collective;
  if (collective[0] == 'i') blocking = collective + 1; /* no blocking one begins with i */
  char route[32];
  forced_route(blocking, route, sizeof route);
  streamcoll_stat_t s;
  if (get(collective, route, 0, &s) != 0) return 0;
  return (long long)s.calls;
}
