// NVTX ranges and the per-call timeline (core/trace.hpp).
#include "core/trace.hpp"

#include <algorithm>
#include <atomic>
#include <climits>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/log.hpp"
#include "config/env.hpp"
#include "core/cuda_driver.hpp"

#if STREAMCOLL_HAVE_CUDA && __has_include(<nvtx3/nvToolsExt.h>)
#define STREAMCOLL_HAVE_NVTX 1
#include <nvtx3/nvToolsExt.h>
#else
#define STREAMCOLL_HAVE_NVTX 0
#endif

namespace streamcoll::trace {

namespace {

std::atomic<bool> g_nvtx{false};
std::atomic<bool> g_timeline{false};

uint64_t now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

// ---- NVTX ----------------------------------------------------------------------------

#if STREAMCOLL_HAVE_NVTX
nvtxDomainHandle_t domain() {
  static nvtxDomainHandle_t d = [] {
    nvtxDomainHandle_t h = nvtxDomainCreateA("streamcoll");
    for (int r = 0; r < kNumRoutes; ++r)  // categories 1..: the routes
      nvtxDomainNameCategoryA(h, static_cast<uint32_t>(r + 1),
                              std::string(name(static_cast<RouteId>(r))).c_str());
    return h;
  }();
  return d;
}

// A string registered in the domain once, by slot (lock-free after the first use; two
// threads racing register it twice, harmlessly).
nvtxStringHandle_t registered(std::atomic<nvtxStringHandle_t>& slot, const std::string& text) {
  nvtxStringHandle_t h = slot.load(std::memory_order_acquire);
  if (!h) {
    h = nvtxDomainRegisterStringA(domain(), text.c_str());
    slot.store(h, std::memory_order_release);
  }
  return h;
}

// Per-route colours (ARGB), in RouteId order; a route past the palette's end (a new row
// of base/routes.def) takes them again from the start.
constexpr uint32_t kColours[] = {0xFF9E9E9E, 0xFF76B900, 0xFF1F77B4, 0xFFFF7F0E,
                                 0xFFD62728, 0xFF9467BD, 0xFF8C564B};
constexpr uint32_t colour(RouteId r) {
  return kColours[static_cast<size_t>(r) % (sizeof(kColours) / sizeof(kColours[0]))];
}

std::string call_text(Coll c, bool nonblocking) {
  return (nonblocking ? "i" : "") + std::string(name(c));
}

// As MPI spells it: MPI_Allreduce, MPI_Iallreduce.
std::string mpi_name(Coll c, bool nonblocking) {
  std::string n = call_text(c, nonblocking);
  n[0] = static_cast<char>(n[0] - 'a' + 'A');
  return "MPI_" + n;
}

nvtxEventAttributes_t attributes(nvtxStringHandle_t text, uint32_t colour, uint32_t category) {
  nvtxEventAttributes_t a{};
  a.version = NVTX_VERSION;
  a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  a.category = category;
  a.colorType = NVTX_COLOR_ARGB;
  a.color = colour;
  a.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
  a.message.registered = text;
  return a;
}

void push_call(Coll c, bool nonblocking) {
  static std::atomic<nvtxStringHandle_t> slots[kNumColls][2];
  const nvtxStringHandle_t h =
      registered(slots[static_cast<int>(c)][nonblocking], mpi_name(c, nonblocking));
  const nvtxEventAttributes_t a = attributes(h, 0xFF607D8B, 0);
  nvtxDomainRangePushEx(domain(), &a);
}

void push_routed(Coll c, bool nonblocking, RouteId r, MemKind m, Mode mode, uint64_t bytes) {
  static std::atomic<nvtxStringHandle_t> slots[kNumColls][2][kNumRoutes][kNumMemKinds][kNumModes];
  const int ri = static_cast<int>(r);
  auto& slot = slots[static_cast<int>(c)][nonblocking][ri][static_cast<int>(m)][static_cast<int>(mode)];
  const nvtxStringHandle_t h =
      registered(slot, call_text(c, nonblocking) + " " + std::string(name(r)) + " " +
                           std::string(name(m)) + " " + trace::name(mode));
  nvtxEventAttributes_t a = attributes(h, colour(r), static_cast<uint32_t>(ri + 1));
  a.payloadType = NVTX_PAYLOAD_TYPE_UNSIGNED_INT64;
  a.payload.ullValue = bytes;
  nvtxDomainRangePushEx(domain(), &a);
}

// An event named by a plain string (ranges of agreements and tasks, marks).
nvtxEventAttributes_t ascii(const char* text) {
  nvtxEventAttributes_t a{};
  a.version = NVTX_VERSION;
  a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  a.messageType = NVTX_MESSAGE_TYPE_ASCII;
  a.message.ascii = text;
  return a;
}

void pop() { nvtxDomainRangePop(domain()); }
#else
void push_call(Coll, bool) {}
void push_routed(Coll, bool, RouteId, MemKind, Mode, uint64_t) {}
void pop() {}
#endif

// ---- the timeline --------------------------------------------------------------------

struct Record {
  uint64_t seq = 0;
  uint64_t t0 = 0, t1 = 0;          // host span, ns (steady clock)
  uint64_t g0 = 0, g1 = 0;          // GPU span, ns (0: none)
  uint64_t bytes = 0;
  int comm_size = 0;
  Coll coll = Coll::allreduce;
  bool nonblocking = false;
  RouteId route = RouteId::pmpi;
  MemKind mem = MemKind::host;
  Mode mode = Mode::host;
};

#if STREAMCOLL_HAVE_CUDA
// A GPU span still being measured: its events, and the record it belongs to.
struct Pending {
  uint64_t seq;
  CUcontext ctx;
  CUevent begin, end;
};

// A context's reference event: its GPU time is `host_ns` on the host clock.
struct Reference {
  CUcontext ctx;
  CUevent event;
  uint64_t host_ns;
};
#endif

class Timeline {
 public:
  static Timeline& get() {
    static Timeline* t = new Timeline;  // outlives static destructors (written at exit)
    return *t;
  }

  void configure(const std::string& path, uint64_t capacity) {
    std::lock_guard<std::mutex> lock(mu_);
    path_ = path;
    capacity_ = capacity;
    std::atexit([] { Timeline::get().write_local_at_exit(); });
  }

  void add(const Record& r, void* gpu_begin, void* gpu_end);
  void* gpu_begin(void* stream);
  void* gpu_end(void* stream);
  void finalize();

 private:
  void poll(size_t at_most);
  Record* find(uint64_t seq);
  std::string events_json(int rank, int64_t offset_ns) const;
  void write_local_at_exit();
#if STREAMCOLL_HAVE_CUDA
  const Reference* reference(CUcontext ctx);
  CUevent take_event();
  bool span_of(const Pending& p, uint64_t* g0, uint64_t* g1);
  std::vector<Reference> refs_;
  std::vector<CUevent> free_events_;
  std::deque<Pending> pending_;
#endif
  std::mutex mu_;
  std::string path_;
  uint64_t capacity_ = 100000;
  std::deque<Record> ring_;
  uint64_t dropped_ = 0;
  uint64_t seq_ = 0;  // the next record's (in ring order: find() relies on it)
  bool written_ = false;
};

#if STREAMCOLL_HAVE_CUDA
CUevent Timeline::take_event() {
  if (!free_events_.empty()) {
    CUevent e = free_events_.back();
    free_events_.pop_back();
    return e;
  }
  CUevent e = nullptr;
  // Tracing is best effort: a driver call that fails here loses a span, silently.
  return SC_CU_RESULT(cuda::driver().cuEventCreate(&e, CU_EVENT_DEFAULT)) == CUDA_SUCCESS ? e : nullptr;
}

// The context's reference: an event on a stream of its own, waited for once, so that its
// GPU time is known on the host clock (to the wait's resolution, microseconds).
const Reference* Timeline::reference(CUcontext ctx) {
  for (const Reference& r : refs_)
    if (r.ctx == ctx) return &r;
  const cuda::Driver& d = cuda::driver();
  CUstream own = nullptr;
  CUevent ev = take_event();
  if (!ev || SC_CU_RESULT(d.cuStreamCreate(&own, CU_STREAM_NON_BLOCKING)) != CUDA_SUCCESS)
    return nullptr;
  uint64_t host = 0;
  if (SC_CU_RESULT(d.cuEventRecord(ev, own)) == CUDA_SUCCESS &&
      SC_CU_RESULT(d.cuEventSynchronize(ev)) == CUDA_SUCCESS)
    host = now_ns();
  SC_CU_TOLERATE(d.cuStreamDestroy(own));
  if (!host) return nullptr;
  refs_.push_back({ctx, ev, host});
  return &refs_.back();
}

bool Timeline::span_of(const Pending& p, uint64_t* g0, uint64_t* g1) {
  const cuda::Driver& d = cuda::driver();
  const Reference* ref = nullptr;
  for (const Reference& r : refs_)
    if (r.ctx == p.ctx) ref = &r;
  float a = 0, b = 0;
  if (!ref || !d.cuEventElapsedTime ||
      SC_CU_RESULT(d.cuEventElapsedTime(&a, ref->event, p.begin)) != CUDA_SUCCESS ||
      SC_CU_RESULT(d.cuEventElapsedTime(&b, ref->event, p.end)) != CUDA_SUCCESS)
    return false;
  *g0 = ref->host_ns + static_cast<uint64_t>(static_cast<double>(a) * 1e6);
  *g1 = ref->host_ns + static_cast<uint64_t>(static_cast<double>(b) * 1e6);
  return true;
}
#endif

Record* Timeline::find(uint64_t seq) {
  if (ring_.empty() || seq < ring_.front().seq) return nullptr;
  const uint64_t i = seq - ring_.front().seq;
  return i < ring_.size() && ring_[i].seq == seq ? &ring_[i] : nullptr;
}

// The GPU spans whose end event has completed (cuEventQuery: never waits), oldest first.
void Timeline::poll(size_t at_most) {
#if STREAMCOLL_HAVE_CUDA
  const cuda::Driver& d = cuda::driver();
  for (size_t n = 0; n < at_most && !pending_.empty(); ++n) {
    Pending& p = pending_.front();
    const CUresult q = SC_CU_RESULT(d.cuEventQuery(p.end));
    if (q == CUDA_ERROR_NOT_READY) break;
    uint64_t g0 = 0, g1 = 0;
    if (q == CUDA_SUCCESS && span_of(p, &g0, &g1))
      if (Record* r = find(p.seq)) r->g0 = g0, r->g1 = g1;
    free_events_.push_back(p.begin);
    free_events_.push_back(p.end);
    pending_.pop_front();
  }
#else
  (void)at_most;
#endif
}

void* Timeline::gpu_begin(void* stream) {
#if STREAMCOLL_HAVE_CUDA
  std::lock_guard<std::mutex> lock(mu_);
  const cuda::Driver& d = cuda::driver();
  CUcontext ctx = nullptr;
  if (!d.usable || SC_CU_RESULT(d.cuCtxGetCurrent(&ctx)) != CUDA_SUCCESS || !ctx) return nullptr;
  if (!reference(ctx)) return nullptr;
  CUevent e = take_event();
  if (e && SC_CU_RESULT(d.cuEventRecord(e, static_cast<CUstream>(stream))) != CUDA_SUCCESS) {
    free_events_.push_back(e);
    return nullptr;
  }
  return e;
#else
  (void)stream;
  return nullptr;
#endif
}

void* Timeline::gpu_end(void* stream) { return gpu_begin(stream); }

void Timeline::add(const Record& r, void* begin, void* end) {
  std::lock_guard<std::mutex> lock(mu_);
  if (written_) return;
  ring_.push_back(r);
  ring_.back().seq = seq_++;
  while (ring_.size() > capacity_) ring_.pop_front(), ++dropped_;
#if STREAMCOLL_HAVE_CUDA
  CUcontext ctx = nullptr;
  if (begin && end && SC_CU_RESULT(cuda::driver().cuCtxGetCurrent(&ctx)) == CUDA_SUCCESS) {
    pending_.push_back({ring_.back().seq, ctx, static_cast<CUevent>(begin), static_cast<CUevent>(end)});
  } else {
    if (begin) free_events_.push_back(static_cast<CUevent>(begin));
    if (end) free_events_.push_back(static_cast<CUevent>(end));
  }
#else
  (void)begin, (void)end;
#endif
  poll(4);
}

// This rank's events, times in microseconds after subtracting `offset_ns`.
std::string Timeline::events_json(int rank, int64_t offset_ns) const {
  std::string out;
  char buf[512];
  auto us = [offset_ns](uint64_t t) { return (static_cast<double>(static_cast<int64_t>(t) - offset_ns)) / 1e3; };
  std::snprintf(buf, sizeof buf,
                "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":\"rank %d\"}},\n"
                "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":\"host\"}},\n"
                "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":1,\"args\":{\"name\":\"GPU (stream)\"}},\n",
                rank, rank, rank, rank);
  out += buf;
  for (const Record& r : ring_) {
    const std::string coll = (r.nonblocking ? "i" : "") + std::string(name(r.coll));
    const std::string route(name(r.route));
    std::snprintf(buf, sizeof buf,
                  "{\"name\":\"%s %s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":0,"
                  "\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"coll\":\"%s\",\"nonblocking\":%s,"
                  "\"route\":\"%s\",\"bytes\":%llu,\"mem\":\"%s\",\"mode\":\"%s\","
                  "\"comm_size\":%d,\"seq\":%llu}},\n",
                  coll.c_str(), route.c_str(), route.c_str(), rank, us(r.t0),
                  static_cast<double>(r.t1 - r.t0) / 1e3, std::string(name(r.coll)).c_str(),
                  r.nonblocking ? "true" : "false", route.c_str(),
                  static_cast<unsigned long long>(r.bytes), std::string(name(r.mem)).c_str(),
                  name(r.mode), r.comm_size, static_cast<unsigned long long>(r.seq));
    out += buf;
    if (r.g1 >= r.g0 && r.g0) {
      std::snprintf(buf, sizeof buf,
                    "{\"name\":\"%s %s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":1,"
                    "\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"seq\":%llu,\"host_ts\":%.3f}},\n",
                    coll.c_str(), route.c_str(), route.c_str(), rank, us(r.g0),
                    static_cast<double>(r.g1 - r.g0) / 1e3,
                    static_cast<unsigned long long>(r.seq), us(r.t0));
      out += buf;
    }
  }
  return out;
}

std::string document(const std::string& events, int ranks, uint64_t dropped, uint64_t capacity) {
  std::string doc = "{\"displayTimeUnit\":\"ns\",\n\"otherData\":{\"streamcoll\":\"timeline\",\"ranks\":" +
                    std::to_string(ranks) + ",\"dropped\":" + std::to_string(dropped) +
                    ",\"capacity\":" + std::to_string(capacity) + "},\n\"traceEvents\":[\n" + events;
  if (doc.size() >= 2 && doc.compare(doc.size() - 2, 2, ",\n") == 0) doc.resize(doc.size() - 2);
  return doc + "\n]}\n";
}

bool write_file(const std::string& path, const std::string& text) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return false;
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  return std::fclose(f) == 0 && ok;
}

// The GPU spans still measured: waited for (the program is in MPI_Finalize; its streams
// should be done), each at most a second.
void Timeline::finalize() {
  std::unique_lock<std::mutex> lock(mu_);
  if (written_) return;
#if STREAMCOLL_HAVE_CUDA
  for (int i = 0; i < 1000 && !pending_.empty(); ++i) {
    poll(pending_.size());
    if (!pending_.empty()) {
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      lock.lock();
    }
  }
#endif
  int rank = 0, size = 1;
  PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
  PMPI_Comm_size(MPI_COMM_WORLD, &size);
  // One time base: each rank's clock at the end of a barrier, then the earliest event
  // of any rank is 0.
  PMPI_Barrier(MPI_COMM_WORLD);
  const int64_t sync = static_cast<int64_t>(now_ns());
  int64_t first = INT64_MAX;  // (records are in order of their calls' ends, not begins)
  for (const Record& r : ring_) {
    first = std::min<int64_t>(first, static_cast<int64_t>(r.t0) - sync);
    if (r.g0) first = std::min<int64_t>(first, static_cast<int64_t>(r.g0) - sync);
  }
  int64_t base = 0;
  PMPI_Allreduce(&first, &base, 1, MPI_INT64_T, MPI_MIN, MPI_COMM_WORLD);
  if (base == INT64_MAX) base = 0;
  const std::string mine = events_json(rank, sync + base);
  unsigned long long dropped = dropped_, all_dropped = 0;
  PMPI_Reduce(&dropped, &all_dropped, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
  int len = static_cast<int>(mine.size());
  std::vector<int> lens(rank == 0 ? size : 0), displs(rank == 0 ? size : 0);
  PMPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  std::string all;
  if (rank == 0) {
    size_t total = 0;
    for (int r = 0; r < size; ++r) displs[r] = static_cast<int>(total), total += lens[r];
    all.resize(total);
  }
  PMPI_Gatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, 0,
               MPI_COMM_WORLD);
  written_ = true;
  if (rank != 0) return;
  if (write_file(path_, document(all, size, all_dropped, capacity_)))
    SC_INFO("timeline of %d ranks written to %s", size, path_.c_str());
  else
    SC_WARN("STREAMCOLL_TIMELINE: cannot write %s", path_.c_str());
}

// At exit without MPI_Finalize: this rank's records, to PATH.rank<N> (no MPI call).
void Timeline::write_local_at_exit() {
  std::lock_guard<std::mutex> lock(mu_);
  if (written_ || path_.empty()) return;
  written_ = true;
  const char* r = std::getenv("OMPI_COMM_WORLD_RANK");
  if (!r) r = std::getenv("PMI_RANK");
  const int rank = r ? std::atoi(r) : 0;
  int64_t base = INT64_MAX;
  for (const Record& r : ring_) base = std::min<int64_t>(base, static_cast<int64_t>(r.t0));
  if (base == INT64_MAX) base = 0;
  write_file(path_ + ".rank" + std::to_string(rank),
             document(events_json(rank, base), 1, dropped_, capacity_));
}

}  // namespace

const char* name(Mode m) {
  switch (m) {
    case Mode::host: return "host";
    case Mode::classic: return "classic";
    case Mode::stream: return "stream";
    case Mode::captured: return "captured";
  }
  return "?";
}

void configure(const config::Settings& s) {
  const bool tool = std::getenv("NVTX_INJECTION64_PATH") != nullptr;
  g_nvtx.store(STREAMCOLL_HAVE_NVTX && (s.nvtx > 0 || (s.nvtx < 0 && tool)));
  if (!s.timeline.empty()) {
    Timeline::get().configure(s.timeline, s.timeline_max);
    g_timeline.store(true);
  }
}

bool nvtx_on() { return g_nvtx.load(std::memory_order_relaxed); }
bool timeline_on() { return g_timeline.load(std::memory_order_relaxed); }

Call::Call(Coll coll, bool nonblocking) : coll_(coll), nonblocking_(nonblocking) {
  if ((nvtx_ = nvtx_on())) push_call(coll, nonblocking);
  if ((timed_ = timeline_on())) t0_ = now_ns();
}

void Call::routed(RouteId route, MemKind mem, Mode mode, uint64_t bytes, int comm_size, void* stream) {
  routed_ = true;
  route_ = route, mem_ = mem, mode_ = mode, bytes_ = bytes, comm_size_ = comm_size;
  if (nvtx_) push_routed(coll_, nonblocking_, route, mem, mode, bytes), nvtx_inner_ = true;
  // A GPU span for blocking stream-ordered calls: after dispatch returns, their stream
  // holds the operation (an MPI_I* call's completes at MPI_Wait: no span).
  if (timed_ && (mode == Mode::stream || mode == Mode::captured) && !nonblocking_ && stream) {
    stream_ = stream;
    gpu_begin_ = Timeline::get().gpu_begin(stream);
  }
}

Call::~Call() {
  if (nvtx_inner_) pop();
  if (nvtx_) pop();
  if (!timed_ || !routed_) return;
  Timeline& t = Timeline::get();
  void* gpu_end = gpu_begin_ ? t.gpu_end(stream_) : nullptr;
  Record r;  // (its seq given by add())
  r.t0 = t0_, r.t1 = now_ns();
  r.bytes = bytes_, r.comm_size = comm_size_;
  r.coll = coll_, r.nonblocking = nonblocking_, r.route = route_, r.mem = mem_, r.mode = mode_;
  t.add(r, gpu_begin_, gpu_end);
}

Range::Range(const char* what) {
#if STREAMCOLL_HAVE_NVTX
  if (!(on_ = nvtx_on())) return;
  const nvtxEventAttributes_t a = ascii(what);
  nvtxDomainRangePushEx(domain(), &a);
#else
  (void)what;
#endif
}

Range::~Range() {
  if (on_) pop();
}

uint64_t range_start(const char* what) {
#if STREAMCOLL_HAVE_NVTX
  if (!nvtx_on()) return 0;
  const nvtxEventAttributes_t a = ascii(what);
  return nvtxDomainRangeStartEx(domain(), &a);
#else
  (void)what;
  return 0;
#endif
}

void range_end(uint64_t id) {
#if STREAMCOLL_HAVE_NVTX
  if (id) nvtxDomainRangeEnd(domain(), id);
#else
  (void)id;
#endif
}

void mark(const char* text) {
#if STREAMCOLL_HAVE_NVTX
  if (!nvtx_on()) return;
  const nvtxEventAttributes_t a = ascii(text);
  nvtxDomainMarkEx(domain(), &a);
#else
  (void)text;
#endif
}

void finalize() {
  if (timeline_on()) Timeline::get().finalize();
}

}  // namespace streamcoll::trace
