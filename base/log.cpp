#include "base/log.hpp"

#include <unistd.h>

#include <cstdarg>
#include <cstdio>

namespace streamcoll {
namespace log_detail {
std::atomic<int> level{static_cast<int>(LogLevel::none)};
std::atomic<int> rank{-1};

namespace {
void vemit(const char* tag, const char* fmt, va_list ap) {
  char buf[1024];
  int r = rank.load(std::memory_order_relaxed);
  int n = r >= 0 ? std::snprintf(buf, sizeof buf, "[streamcoll %d] %s: ", r, tag)
                 : std::snprintf(buf, sizeof buf, "[streamcoll] %s: ", tag);
  int m = std::vsnprintf(buf + n, sizeof buf - static_cast<size_t>(n) - 1, fmt, ap);
  size_t len = static_cast<size_t>(n) + static_cast<size_t>(m < 0 ? 0 : m);
  if (len > sizeof buf - 2) len = sizeof buf - 2;
  buf[len++] = '\n';
  ssize_t ignored = ::write(STDERR_FILENO, buf, len);
  (void)ignored;
}
}  // namespace

void emit(LogLevel lvl, const char* fmt, ...) {
  static const char* const tags[] = {"", "warn", "info", "trace"};
  va_list ap;
  va_start(ap, fmt);
  vemit(tags[static_cast<int>(lvl)], fmt, ap);
  va_end(ap);
}
}  // namespace log_detail

void set_log_level(LogLevel l) { log_detail::level.store(static_cast<int>(l)); }
void set_log_rank(int r) { log_detail::rank.store(r); }

void log_error(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  log_detail::vemit("error", fmt, ap);
  va_end(ap);
}

}  // namespace streamcoll
