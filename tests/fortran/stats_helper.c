/* For the Fortran test: calls made so far of one collective in this process, through
 * streamcoll's statistics (found at run time, so it works preloaded or linked);
 * -1 when streamcoll is not loaded. */
#include <dlfcn.h>

#include "streamcoll/streamcoll.h"

long long sc_calls(const char *collective) {
  int (*get)(const char *, const char *, const char *, streamcoll_stat_t *) =
      (int (*)(const char *, const char *, const char *, streamcoll_stat_t *))dlsym(
          RTLD_DEFAULT, "streamcoll_get_stats");
  streamcoll_stat_t s;
  if (!get || get(collective, 0, 0, &s) != 0) return -1;
  return (long long)s.calls;
}
