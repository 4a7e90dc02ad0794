#include "core/cuda_driver.hpp"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string_view>
#include <type_traits>
#include <vector>

#include "base/log.hpp"
#include "core/errors.hpp"

namespace streamcoll::cuda {
namespace {

#define STREAMCOLL_STR2(x) #x
#define STREAMCOLL_STR(x) STREAMCOLL_STR2(x)

// Whether the process has libcuda.so.1 mapped already (the application, its CUDA runtime
// or a library it uses opened it). dlopen(RTLD_NOLOAD) answers, but a "no" costs a search
// of the loader's cache (about 40,000 instructions, callgrind), which a host-only program
// would pay at every routed call. So a "no" is remembered with the loader's count of
// objects ever added (dl_iterate_phdr's dlpi_adds): until another object is loaded,
// libcuda.so.1 cannot have been, and the answer stands.
#if STREAMCOLL_HAVE_CUDA
int first_object(struct dl_phdr_info* info, size_t size, void* out) {
  if (size >= offsetof(struct dl_phdr_info, dlpi_subs)) *static_cast<unsigned long long*>(out) = info->dlpi_adds;
  return 1;  // one object is enough: the counters are the loader's
}
std::atomic<unsigned long long> g_adds_without_driver{0};  // 0: no "no" remembered
#endif

bool driver_loaded() {
#if STREAMCOLL_HAVE_CUDA
  unsigned long long adds = 0;
  dl_iterate_phdr(first_object, &adds);
  if (adds != 0 && g_adds_without_driver.load(std::memory_order_relaxed) == adds) return false;
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (!h) {
    g_adds_without_driver.store(adds, std::memory_order_relaxed);
    return false;
  }
  dlclose(h);  // drops the reference just taken; the application's keeps it mapped
  return true;
#else
  return false;
#endif
}

// STREAMCOLL_DRIVER_PROFILE: the entry points by index, the real pointers, and per entry
// point the calls and nanoseconds spent in them.
std::atomic<bool> g_profile{false};
#if STREAMCOLL_HAVE_CUDA
enum EntryId : int {
#define STREAMCOLL_CUDA_ID(fn) kId_##fn,
  STREAMCOLL_CUDA_ENTRY_POINTS(STREAMCOLL_CUDA_ID)
  STREAMCOLL_CUDA_OPTIONAL_ENTRY_POINTS(STREAMCOLL_CUDA_ID)
#undef STREAMCOLL_CUDA_ID
  kNumEntries
};
// The names as streamcoll's code spells them (#fn: before cuda.h's versioned mapping).
constexpr const char* kEntryNames[kNumEntries] = {
#define STREAMCOLL_CUDA_NAME(fn) #fn,
    STREAMCOLL_CUDA_ENTRY_POINTS(STREAMCOLL_CUDA_NAME)
    STREAMCOLL_CUDA_OPTIONAL_ENTRY_POINTS(STREAMCOLL_CUDA_NAME)
#undef STREAMCOLL_CUDA_NAME
};
void* g_real[kNumEntries] = {};  // written once, before the Driver is published
struct Tally {
  std::atomic<uint64_t> calls{0}, ns{0};
};
Tally g_tally[kNumEntries];

template <int Id, typename R, typename... A>
R timed(A... args) {
  const auto t0 = std::chrono::steady_clock::now();
  R r = reinterpret_cast<R (*)(A...)>(g_real[Id])(args...);
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now() - t0).count();
  g_tally[Id].calls.fetch_add(1, std::memory_order_relaxed);
  g_tally[Id].ns.fetch_add(static_cast<uint64_t>(ns), std::memory_order_relaxed);
  return r;
}
template <int Id, typename R, typename... A>
void wrap(R (*&fn)(A...)) {
  if (!fn) return;  // an optional entry point the driver lacks stays null
  g_real[Id] = reinterpret_cast<void*>(fn);
  fn = &timed<Id, R, A...>;
}

void profile_entries(Driver& d) {
#define STREAMCOLL_CUDA_WRAP(fn) wrap<kId_##fn>(d.fn);
  STREAMCOLL_CUDA_ENTRY_POINTS(STREAMCOLL_CUDA_WRAP)
  STREAMCOLL_CUDA_OPTIONAL_ENTRY_POINTS(STREAMCOLL_CUDA_WRAP)
#undef STREAMCOLL_CUDA_WRAP
}
#endif

Driver load() {
  Driver d;
#if !STREAMCOLL_HAVE_CUDA
  d.reason = "built without the CUDA headers";
#else
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* e = dlerror();
    d.reason = std::string("libcuda.so.1 not loadable: ") + (e ? e : "unknown");
    return d;
  }
  std::string missing;
  auto sym = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
    if (!fn) missing += missing.empty() ? name : std::string(", ") + name;
  };
  // STREAMCOLL_STR expands the header's macro first: the versioned symbol name.
#define STREAMCOLL_CUDA_LOAD(fn) sym(d.fn, STREAMCOLL_STR(fn));
  STREAMCOLL_CUDA_ENTRY_POINTS(STREAMCOLL_CUDA_LOAD)
#undef STREAMCOLL_CUDA_LOAD
  auto optional = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
  };
#define STREAMCOLL_CUDA_LOAD_OPTIONAL(fn) optional(d.fn, STREAMCOLL_STR(fn));
  STREAMCOLL_CUDA_OPTIONAL_ENTRY_POINTS(STREAMCOLL_CUDA_LOAD_OPTIONAL)
#undef STREAMCOLL_CUDA_LOAD_OPTIONAL
  if (g_profile.load()) profile_entries(d);  // from cuInit on
  if (!missing.empty()) {
    d.reason = "libcuda.so.1 lacks " + missing + " (driver older than the CUDA headers?)";
    return d;
  }
  if (CUresult r = SC_CU_RESULT(d.cuInit(0)); r != CUDA_SUCCESS) {  // a reason, no error
    const char* msg = nullptr;
    d.cuGetErrorString(r, &msg);
    d.reason = std::string("cuInit failed: ") + (msg ? msg : "error " + std::to_string(r));
    return d;
  }
  d.cuDriverGetVersion(&d.version);
  if (SC_CU_RESULT(d.cuDeviceGetCount(&d.device_count)) != CUDA_SUCCESS || d.device_count == 0) {
    d.reason = "no CUDA device visible";
    return d;
  }
  d.usable = true;
  // The library stays open for the life of the process: CUDA cannot be unloaded safely.
#endif
  return d;
}

std::atomic<const Driver*> g_loaded{nullptr};
std::mutex g_load_mu;

const Driver& not_loaded() {
  static const Driver d = [] {
    Driver x;
#if STREAMCOLL_HAVE_CUDA
    x.reason = "the application has not loaded the CUDA driver (libcuda.so.1)";
#else
    x.reason = "built without the CUDA headers";
#endif
    return x;
  }();
  return d;
}

}  // namespace

const Driver& driver() {
  if (const Driver* d = g_loaded.load(std::memory_order_acquire)) return *d;
  // Not before the application: a process that never touches CUDA pays no cuInit.
  if (!driver_loaded()) return not_loaded();
  std::lock_guard<std::mutex> lock(g_load_mu);
  if (const Driver* d = g_loaded.load(std::memory_order_acquire)) return *d;
  static const Driver d = load();
  g_loaded.store(&d, std::memory_order_release);
  return d;
}

void set_profile(bool on) { g_profile.store(on); }

std::string profile_report() {
  std::string out;
#if STREAMCOLL_HAVE_CUDA
  if (!g_profile.load()) return out;
  struct Row {
    const char* name;
    uint64_t calls, ns;
  };
  std::vector<Row> rows;
  uint64_t calls = 0, ns = 0;
  for (int i = 0; i < kNumEntries; ++i) {
    const uint64_t c = g_tally[i].calls.load(std::memory_order_relaxed);
    if (c == 0) continue;
    rows.push_back({kEntryNames[i], c, g_tally[i].ns.load(std::memory_order_relaxed)});
    calls += c;
    ns += rows.back().ns;
  }
  if (rows.empty()) return out;
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.ns > b.ns; });
  char line[160];
  std::snprintf(line, sizeof line, "%-28s %12s %14s %10s\n", "driver entry point", "calls",
                "total us", "mean us");
  out += line;
  for (const Row& r : rows) {
    std::snprintf(line, sizeof line, "%-28s %12llu %14.1f %10.3f\n", r.name,
                  static_cast<unsigned long long>(r.calls), static_cast<double>(r.ns) / 1e3,
                  static_cast<double>(r.ns) / 1e3 / static_cast<double>(r.calls));
    out += line;
  }
  std::snprintf(line, sizeof line, "%-28s %12llu %14.1f %10.3f\n", "(all)",
                static_cast<unsigned long long>(calls), static_cast<double>(ns) / 1e3,
                static_cast<double>(ns) / 1e3 / static_cast<double>(calls));
  out += line;
#endif
  return out;
}

bool driver_present() {
  if (driver_loaded()) return true;
  struct stat st;
  if (stat("/proc/driver/nvidia/version", &st) == 0) return true;  // the kernel module
  // A driver library the loader would find first (a container's, or a test's).
  if (const char* path = std::getenv("LD_LIBRARY_PATH")) {
    std::string_view rest = path;
    while (!rest.empty()) {
      const size_t colon = rest.find(':');
      std::string dir(rest.substr(0, colon));
      rest = colon == std::string_view::npos ? std::string_view() : rest.substr(colon + 1);
      if (!dir.empty() && stat((dir + "/libcuda.so.1").c_str(), &st) == 0) return true;
    }
  }
  return false;
}

MemKind classify(const void* p, int* device) {
  if (device) *device = -1;
#if STREAMCOLL_HAVE_CUDA
  const Driver& d = driver();
  if (!d.usable || p == nullptr) return MemKind::host;
  // Zero-initialised so that a driver writing a narrower type (IS_MANAGED is a bool)
  // still leaves a correct value.
  unsigned int mem_type = 0, is_managed = 0;
  int ordinal = -1;
  CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                 CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                 CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
  void* data[] = {&mem_type, &is_managed, &ordinal};
  if (d.cuPointerGetAttributes(device ? 3 : 2, attrs, data, reinterpret_cast<CUdeviceptr>(p)) !=
      CUDA_SUCCESS)
    return MemKind::host;
  if (is_managed) return MemKind::managed;
  if (mem_type == CU_MEMORYTYPE_DEVICE) {
    if (device) *device = ordinal;
    return MemKind::device;
  }
  if (mem_type == CU_MEMORYTYPE_HOST) return MemKind::pinned;
  return MemKind::host;
#else
  (void)p;
  return MemKind::host;
#endif
}

std::atomic<uintptr_t> detail::g_heap_start{0};

namespace {

// glibc's program break, what sbrk(0) returns, read without the call (__curbrk, weak:
// absent from other C libraries, which get sbrk(0)).
uintptr_t current_break() {
  return &__curbrk ? reinterpret_cast<uintptr_t>(__curbrk) : reinterpret_cast<uintptr_t>(sbrk(0));
}

// The program break when this library was loaded: the heap's start cannot be above it.
const uintptr_t g_break_at_load = reinterpret_cast<uintptr_t>(sbrk(0));

// The start of the program break (/proc/self/stat, field 47, start_brk), read once; 0
// when it cannot be read (then no address counts as heap). Where that is not this
// program's break (above it: under valgrind, which emulates the break elsewhere), the
// break when the library was loaded, which is at or above the heap's start (never below:
// no address outside the heap counts as heap).
uintptr_t heap_start() {
  static const uintptr_t start = [] {
    uintptr_t v = 0;
    if (FILE* f = std::fopen("/proc/self/stat", "r")) {
      char buf[4096];
      const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
      std::fclose(f);
      buf[n] = '\0';
      // Fields after the command name, which is in parentheses and may hold spaces.
      const char* q = std::strrchr(buf, ')');
      int field = 2;
      for (; q && *q; ++q)
        if (*q == ' ' && ++field == 47) {
          v = static_cast<uintptr_t>(std::strtoull(q + 1, nullptr, 10));
          break;
        }
    }
    v = v && v > current_break() ? g_break_at_load : v;
    detail::g_heap_start.store(v, std::memory_order_relaxed);
    return v;
  }();
  return start;
}

struct StackBounds {
  uintptr_t lo = 0, hi = 0;
  bool known = false;
};
// (Initial-exec: read on every call that classifies a buffer, the steady path too.)
thread_local StackBounds t_stack __attribute__((tls_model("initial-exec")));

}  // namespace

bool in_heap_or_stack(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  const uintptr_t start = heap_start();
  if (start && a >= start && a < current_break()) return true;
  if (!t_stack.known) {
    t_stack.known = true;
    pthread_attr_t attr;
    void* base = nullptr;
    size_t size = 0;
    if (pthread_getattr_np(pthread_self(), &attr) == 0) {
      if (pthread_attr_getstack(&attr, &base, &size) == 0) {
        t_stack.lo = reinterpret_cast<uintptr_t>(base);
        t_stack.hi = t_stack.lo + size;
      }
      pthread_attr_destroy(&attr);
    }
  }
  return a >= t_stack.lo && a < t_stack.hi;
}

MemKind classify_buffer(const void* p, int* device) {
  if (in_heap_or_stack(p)) return MemKind::host;
  return classify(p, device);
}

int device_of(const void* p) {
#if STREAMCOLL_HAVE_CUDA
  const Driver& d = driver();
  if (!d.usable || p == nullptr) return -1;
  int ordinal = -1;
  if (d.cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                              reinterpret_cast<CUdeviceptr>(p)) != CUDA_SUCCESS)
    return -1;
  return ordinal;
#else
  (void)p;
  return -1;
#endif
}

#if STREAMCOLL_HAVE_CUDA
std::string describe(const char* what, CUresult r) {
  const char* msg = nullptr;
  if (driver().cuGetErrorString) driver().cuGetErrorString(r, &msg);
  return std::string(what) + ": " + (msg ? msg : "unknown error") + " (error " +
         std::to_string(static_cast<int>(r)) + ")";
}

const char* source_path(const char* file) {
  const char* p = file;
  for (;;) {
    if (std::strncmp(p, "../", 3) == 0) p += 3;
    else if (std::strncmp(p, "./", 2) == 0) p += 2;
    else break;
  }
  if (*p != '/') return p;
  const char* best = nullptr;
  for (const char* top : {"/algorithms/", "/core/", "/shim/", "/streamext/", "/base/",
                          "/config/", "/tools/", "/tests/", "/include/"}) {
    for (const char* q = std::strstr(p, top); q; q = std::strstr(q + 1, top))
      if (q > best) best = q;
  }
  return best ? best + 1 : p;
}

namespace {
std::string located(const char* file, int line, const char* what, CUresult r) {
  return std::string(source_path(file)) + ":" + std::to_string(line) + ": " + describe(what, r);
}
}  // namespace

int failure_at(const char* file, int line, const char* what, CUresult r) {
  return fail(Failure::cuda, located(file, line, what, r));
}

std::string describe_at(const char* file, int line, const char* what, CUresult r) {
  return located(file, line, what, r);
}

CUresult tolerated_at(const char* file, int line, const char* what, CUresult r) {
  SC_WARN("%s", located(file, line, what, r).c_str());
  return r;
}

bool legacy_stream_usable() {
  const Driver& d = driver();
  CUstreamCaptureStatus status;
  return !d.cuStreamIsCapturing ||
         SC_CU_RESULT(d.cuStreamIsCapturing(CU_STREAM_LEGACY, &status)) !=
             CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
}

CUresult wait_for_legacy(CUstream stream, CUevent event) {
  const Driver& d = driver();
  // The capturing stream's work is recorded, not run: nothing of it to wait for; the
  // order after the other blocking streams is given up for this call.
  if (!legacy_stream_usable()) return CUDA_SUCCESS;
  // An event recorded on the legacy stream is an action of that stream: it completes only
  // after the blocking streams' work enqueued before it (CUDA's implicit synchronisation).
  // Results for the caller to check (it retries after a context reset).
  CUresult r = SC_CU_RESULT(d.cuEventRecord(event, CU_STREAM_LEGACY));
  if (r == CUDA_SUCCESS) r = d.cuStreamWaitEvent(stream, event, 0);
  return r;
}

bool relax_capture_mode() {
  const Driver& d = driver();
  if (!d.usable) return false;
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  if (d.cuThreadExchangeStreamCaptureMode) d.cuThreadExchangeStreamCaptureMode(&mode);
  return true;
}

RelaxedCapture::RelaxedCapture(bool on) {
  if (!on) return;
  const Driver& d = driver();
  if (d.usable && d.cuThreadExchangeStreamCaptureMode)
    set_ = SC_CU_RESULT(d.cuThreadExchangeStreamCaptureMode(&mode_)) == CUDA_SUCCESS;
}

RelaxedCapture::~RelaxedCapture() {
  if (set_) SC_CU_TOLERATE(driver().cuThreadExchangeStreamCaptureMode(&mode_));
}

CUcontext primary_context(int device, CUresult* r) {
  static std::mutex mu;
  static std::vector<CUcontext>* retained = new std::vector<CUcontext>;  // never released
  const Driver& d = driver();
  *r = CUDA_SUCCESS;
  if (device < 0 || device >= d.device_count) return *r = CUDA_ERROR_INVALID_DEVICE, nullptr;
  std::lock_guard<std::mutex> lock(mu);
  if (retained->size() < static_cast<size_t>(d.device_count))
    retained->resize(static_cast<size_t>(d.device_count), nullptr);
  CUcontext& slot = (*retained)[static_cast<size_t>(device)];
  if (!slot) {
    CUdevice dev = 0;
    CUcontext c = nullptr;
    if ((*r = SC_CU_RESULT(d.cuDeviceGet(&dev, device))) == CUDA_SUCCESS &&  // *r: the caller's
        (*r = SC_CU_RESULT(d.cuDevicePrimaryCtxRetain(&c, dev))) == CUDA_SUCCESS)
      slot = c;
  }
  return slot;
}

ScopedContext::ScopedContext(CUcontext ctx) {
  const Driver& d = driver();
  CUcontext current = nullptr;
  if (SC_CU_RESULT(d.cuCtxGetCurrent(&current)) == CUDA_SUCCESS && current == ctx) return;
  pushed_ = SC_CU_TOLERATE(d.cuCtxPushCurrent(ctx)) == CUDA_SUCCESS;
}

ScopedContext::~ScopedContext() {
  if (pushed_) {
    CUcontext popped;
    SC_CU_TOLERATE(driver().cuCtxPopCurrent(&popped));
  }
}
#endif

}  // namespace streamcoll::cuda
