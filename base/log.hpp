// Rank-tagged diagnostics on stderr, filtered by STREAMCOLL_DEBUG.
// Lines look like "[streamcoll 3] warn: ...". Thread-safe (one write(2) per line).
#pragma once

#include <atomic>

namespace streamcoll {

enum class LogLevel : int { none = 0, warn = 1, info = 2, trace = 3 };

namespace log_detail {
extern std::atomic<int> level;
extern std::atomic<int> rank;  // MPI_COMM_WORLD rank, -1 until known
void emit(LogLevel lvl, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
}  // namespace log_detail

inline bool log_enabled(LogLevel l) {
  return log_detail::level.load(std::memory_order_relaxed) >= static_cast<int>(l);
}
void set_log_level(LogLevel l);
void set_log_rank(int rank);

/// Always printed, whatever STREAMCOLL_DEBUG says: for errors that end the job.
void log_error(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace streamcoll

#define SC_LOG(lvl, ...)                                                    \
  do {                                                                      \
    if (::streamcoll::log_enabled(lvl)) ::streamcoll::log_detail::emit(lvl, __VA_ARGS__); \
  } while (0)
#define SC_WARN(...) SC_LOG(::streamcoll::LogLevel::warn, __VA_ARGS__)
#define SC_INFO(...) SC_LOG(::streamcoll::LogLevel::info, __VA_ARGS__)
#define SC_TRACE(...) SC_LOG(::streamcoll::LogLevel::trace, __VA_ARGS__)
