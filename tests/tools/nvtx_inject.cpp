// An NVTX3 injection library for tests: counts the ranges and marks a program emits.
//
//   NVTX_INJECTION64_PATH=/path/libnvtx_inject.so NVTX_INJECT_OUT=/tmp/nvtx.%p.txt prog
//
// NVTX3 (header-only) loads the library named by NVTX_INJECTION64_PATH at the program's
// first NVTX call and calls InitializeInjectionNvtx2; we fill the CORE and CORE2 callback
// tables with the recorders below. At exit the report goes to NVTX_INJECT_OUT ("%p" ->
// pid), or to stderr when that is unset. Lines (tab-separated), sorted:
//   category    <domain> <id> <name>
//   range       <domain> <message> <pushes> <pops> <payload_sum> <threads>
//   mark        <domain> <message> <count> 0 <payload_sum> <threads>
//   depth       <domain> <max nesting depth>
//   unbalanced  <pops without push> <ranges still open at exit>
// <message> is the ASCII text, the registered string's text or wide text narrowed ('?'
// for non-ASCII); the default domain (null handle, non-domain API) is "(default)". Pops
// count under the message of the push they close (a per-thread, per-domain stack);
// nvtxRangeStart/End count as a push and a pop. payload_sum adds the UNSIGNED_INT64
// payloads only. <threads> is the number of distinct threads that pushed (marked).
// tests/tools/nvtx_inject_check.py checks a report.
#define NVTX_NO_IMPL
#include <nvtx3/nvToolsExt.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <unistd.h>
#include <unordered_map>
#include <vector>

namespace {

struct Stat {
  uint64_t pushes = 0, pops = 0, payload = 0;
  std::set<unsigned> threads;
};
using Key = std::tuple<std::string, std::string, std::string>;  // kind, domain, message

struct State {
  std::mutex mu;
  std::vector<std::string> domains{"(default)"};  // handle value - 1 -> name (0: default)
  std::vector<std::string> strings{""};           // handle value - 1 -> text
  std::map<Key, Stat> stats;
  std::map<std::pair<std::string, uint32_t>, std::string> categories;
  std::map<std::pair<unsigned, size_t>, std::vector<Key>> stacks;  // (thread, domain)
  std::map<std::string, size_t> max_depth;
  std::unordered_map<nvtxRangeId_t, Key> started;  // nvtxRangeStart ids not yet ended
  nvtxRangeId_t next_id = 1;
  uint64_t orphan_pops = 0;
};
State& state() {
  static State* s = new State;  // never freed: calls after the report are still safe
  return *s;
}

std::atomic<unsigned> thread_counter{0};
unsigned thread_num() {
  thread_local unsigned n = ++thread_counter;
  return n;
}

std::string clean(std::string s) {  // keep the report one record per line
  for (char& c : s)
    if (c == '\t' || c == '\n' || c == '\r') c = ' ';
  return s;
}
std::string narrow(const wchar_t* w) {
  std::string s;
  for (; w && *w; ++w) s += (*w > 0 && *w < 128) ? static_cast<char>(*w) : '?';
  return clean(s);
}

// Handles are our own small integers (1-based so null stays "no handle").
size_t domain_index(nvtxDomainHandle_t d) { return reinterpret_cast<uintptr_t>(d); }
std::string domain_name(State& s, nvtxDomainHandle_t d) {
  size_t i = domain_index(d);
  return i < s.domains.size() ? s.domains[i] : "(unknown domain)";
}
std::string message_of(State& s, const nvtxEventAttributes_t* a) {
  if (!a) return "";
  switch (a->messageType) {
    case NVTX_MESSAGE_TYPE_ASCII: return clean(a->message.ascii ? a->message.ascii : "");
    case NVTX_MESSAGE_TYPE_UNICODE: return narrow(a->message.unicode);
    case NVTX_MESSAGE_TYPE_REGISTERED: {
      size_t i = reinterpret_cast<uintptr_t>(a->message.registered);
      return i > 0 && i < s.strings.size() ? s.strings[i] : "(unknown string)";
    }
    default: return "";
  }
}
uint64_t payload_of(const nvtxEventAttributes_t* a) {
  return a && a->payloadType == NVTX_PAYLOAD_TYPE_UNSIGNED_INT64 ? a->payload.ullValue : 0;
}
Key count(State& s, const char* kind, nvtxDomainHandle_t d, const nvtxEventAttributes_t* a) {
  Key k{kind, domain_name(s, d), message_of(s, a)};
  Stat& st = s.stats[k];
  st.pushes++;
  st.payload += payload_of(a);
  st.threads.insert(thread_num());
  return k;
}

// ---- the callbacks ----
int push(nvtxDomainHandle_t d, const nvtxEventAttributes_t* a) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto& stack = s.stacks[{thread_num(), domain_index(d)}];
  stack.push_back(count(s, "range", d, a));
  size_t& m = s.max_depth[domain_name(s, d)];
  if (stack.size() > m) m = stack.size();
  return static_cast<int>(stack.size()) - 1;
}
int pop(nvtxDomainHandle_t d) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto& stack = s.stacks[{thread_num(), domain_index(d)}];
  if (stack.empty()) {
    s.orphan_pops++;
    return -1;
  }
  s.stats[stack.back()].pops++;
  stack.pop_back();
  return static_cast<int>(stack.size());
}
void mark(nvtxDomainHandle_t d, const nvtxEventAttributes_t* a) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  count(s, "mark", d, a);
}
nvtxRangeId_t range_start(nvtxDomainHandle_t d, const nvtxEventAttributes_t* a) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  nvtxRangeId_t id = s.next_id++;
  s.started[id] = count(s, "range", d, a);
  return id;
}
void range_end(nvtxDomainHandle_t, nvtxRangeId_t id) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.started.find(id);
  if (it == s.started.end()) {
    s.orphan_pops++;
    return;
  }
  s.stats[it->second].pops++;
  s.started.erase(it);
}
nvtxDomainHandle_t domain_create(const std::string& name) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  for (size_t i = 1; i < s.domains.size(); ++i)  // the same name gives the same domain
    if (s.domains[i] == name) return reinterpret_cast<nvtxDomainHandle_t>(i);
  s.domains.push_back(name);
  return reinterpret_cast<nvtxDomainHandle_t>(s.domains.size() - 1);
}
nvtxStringHandle_t register_string(const std::string& text) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.strings.push_back(text);
  return reinterpret_cast<nvtxStringHandle_t>(s.strings.size() - 1);
}
void name_category(nvtxDomainHandle_t d, uint32_t id, const std::string& name) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.categories[{domain_name(s, d), id}] = name;
}

nvtxEventAttributes_t ascii_attr(const char* m) {
  nvtxEventAttributes_t a{};
  a.messageType = NVTX_MESSAGE_TYPE_ASCII;
  a.message.ascii = m;
  return a;
}
nvtxEventAttributes_t wide_attr(const wchar_t* m) {
  nvtxEventAttributes_t a{};
  a.messageType = NVTX_MESSAGE_TYPE_UNICODE;
  a.message.unicode = m;
  return a;
}

// CORE2 (the domain API): mark, range_start, range_end, push, pop above and these.
void d_cat_a(nvtxDomainHandle_t d, uint32_t c, const char* n) { name_category(d, c, clean(n ? n : "")); }
void d_cat_w(nvtxDomainHandle_t d, uint32_t c, const wchar_t* n) { name_category(d, c, narrow(n)); }
nvtxStringHandle_t d_str_a(nvtxDomainHandle_t, const char* t) { return register_string(clean(t ? t : "")); }
nvtxStringHandle_t d_str_w(nvtxDomainHandle_t, const wchar_t* t) { return register_string(narrow(t)); }
nvtxDomainHandle_t d_create_a(const char* n) { return domain_create(clean(n ? n : "")); }
nvtxDomainHandle_t d_create_w(const wchar_t* n) { return domain_create(narrow(n)); }

// CORE: the non-domain API, recorded under the default domain.
void c_mark_ex(const nvtxEventAttributes_t* a) { mark(nullptr, a); }
void c_mark_a(const char* m) { auto a = ascii_attr(m); mark(nullptr, &a); }
void c_mark_w(const wchar_t* m) { auto a = wide_attr(m); mark(nullptr, &a); }
nvtxRangeId_t c_start_ex(const nvtxEventAttributes_t* a) { return range_start(nullptr, a); }
nvtxRangeId_t c_start_a(const char* m) { auto a = ascii_attr(m); return range_start(nullptr, &a); }
nvtxRangeId_t c_start_w(const wchar_t* m) { auto a = wide_attr(m); return range_start(nullptr, &a); }
void c_end(nvtxRangeId_t id) { range_end(nullptr, id); }
int c_push_ex(const nvtxEventAttributes_t* a) { return push(nullptr, a); }
int c_push_a(const char* m) { auto a = ascii_attr(m); return push(nullptr, &a); }
int c_push_w(const wchar_t* m) { auto a = wide_attr(m); return push(nullptr, &a); }
int c_pop() { return pop(nullptr); }
void c_cat_a(uint32_t c, const char* n) { d_cat_a(nullptr, c, n); }
void c_cat_w(uint32_t c, const wchar_t* n) { d_cat_w(nullptr, c, n); }

void write_report() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  FILE* f = stderr;
  if (const char* out = std::getenv("NVTX_INJECT_OUT")) {
    std::string path = out;
    for (size_t p; (p = path.find("%p")) != std::string::npos;)
      path.replace(p, 2, std::to_string(getpid()));
    f = std::fopen(path.c_str(), "w");
    if (!f) {
      std::fprintf(stderr, "nvtx_inject: cannot write %s\n", path.c_str());
      return;
    }
  }
  for (const auto& [k, name] : s.categories)
    std::fprintf(f, "category\t%s\t%u\t%s\n", k.first.c_str(), k.second, name.c_str());
  for (const auto& [k, st] : s.stats)
    std::fprintf(f, "%s\t%s\t%s\t%llu\t%llu\t%llu\t%zu\n", std::get<0>(k).c_str(),
                 std::get<1>(k).c_str(), std::get<2>(k).c_str(), (unsigned long long)st.pushes,
                 (unsigned long long)st.pops, (unsigned long long)st.payload, st.threads.size());
  for (const auto& [domain, depth] : s.max_depth)
    std::fprintf(f, "depth\t%s\t%zu\n", domain.c_str(), depth);
  size_t open = s.started.size();
  for (const auto& [k, stack] : s.stacks) open += stack.size();
  std::fprintf(f, "unbalanced\t%llu\t%zu\n", (unsigned long long)s.orphan_pops, open);
  if (f != stderr) std::fclose(f);
}

template <typename Fn>
void install(NvtxFunctionTable table, unsigned size, unsigned id, Fn fn) {
  if (id <= size && table[id]) *table[id] = reinterpret_cast<NvtxFunctionPointer>(fn);
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int InitializeInjectionNvtx2(
    NvtxGetExportTableFunc_t getExportTable) {
  auto* cb = static_cast<const NvtxExportTableCallbacks*>(getExportTable(NVTX_ETID_CALLBACKS));
  if (!cb || cb->struct_size < sizeof(NvtxExportTableCallbacks)) return 0;
  NvtxFunctionTable t = nullptr;
  unsigned n = 0;
  if (!cb->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &t, &n) || !t) return 0;
  install(t, n, NVTX_CBID_CORE2_DomainMarkEx, mark);
  install(t, n, NVTX_CBID_CORE2_DomainRangeStartEx, range_start);
  install(t, n, NVTX_CBID_CORE2_DomainRangeEnd, range_end);
  install(t, n, NVTX_CBID_CORE2_DomainRangePushEx, push);
  install(t, n, NVTX_CBID_CORE2_DomainRangePop, pop);
  install(t, n, NVTX_CBID_CORE2_DomainNameCategoryA, d_cat_a);
  install(t, n, NVTX_CBID_CORE2_DomainNameCategoryW, d_cat_w);
  install(t, n, NVTX_CBID_CORE2_DomainRegisterStringA, d_str_a);
  install(t, n, NVTX_CBID_CORE2_DomainRegisterStringW, d_str_w);
  install(t, n, NVTX_CBID_CORE2_DomainCreateA, d_create_a);
  install(t, n, NVTX_CBID_CORE2_DomainCreateW, d_create_w);
  if (cb->GetModuleFunctionTable(NVTX_CB_MODULE_CORE, &t, &n) && t) {
    install(t, n, NVTX_CBID_CORE_MarkEx, c_mark_ex);
    install(t, n, NVTX_CBID_CORE_MarkA, c_mark_a);
    install(t, n, NVTX_CBID_CORE_MarkW, c_mark_w);
    install(t, n, NVTX_CBID_CORE_RangeStartEx, c_start_ex);
    install(t, n, NVTX_CBID_CORE_RangeStartA, c_start_a);
    install(t, n, NVTX_CBID_CORE_RangeStartW, c_start_w);
    install(t, n, NVTX_CBID_CORE_RangeEnd, c_end);
    install(t, n, NVTX_CBID_CORE_RangePushEx, c_push_ex);
    install(t, n, NVTX_CBID_CORE_RangePushA, c_push_a);
    install(t, n, NVTX_CBID_CORE_RangePushW, c_push_w);
    install(t, n, NVTX_CBID_CORE_RangePop, c_pop);
    install(t, n, NVTX_CBID_CORE_NameCategoryA, c_cat_a);
    install(t, n, NVTX_CBID_CORE_NameCategoryW, c_cat_w);
  }
  if (auto* v = static_cast<const NvtxExportTableVersionInfo*>(getExportTable(NVTX_ETID_VERSIONINFO)))
    if (v->struct_size >= sizeof(NvtxExportTableVersionInfo) && v->SetInjectionNvtxVersion)
      v->SetInjectionNvtxVersion(NVTX_VERSION);
  // Every NVTX instance in the process (each DSO that includes the headers has its own)
  // calls this; they share our state, and the report is written once.
  static std::once_flag once;
  std::call_once(once, [] { state(), std::atexit(write_report); });
  return 1;
}
