// Emits a known set of NVTX ranges and marks, for tests/tools/nvtx_inject_selftest.sh to
// check the report of the injection library (tests/tools/nvtx_inject.cpp) against.
//   nvtx_inject_selftest [unbalanced]
// Domain "selftest": category 7 "seven"; two threads, each 3 times: push "outer"
// (ASCII, payload 100), push "inner" (registered string, payload 1 on thread 0, 2 on
// thread 1), pop, pop; then one mark "done" (payload 5) on the main thread. Default
// domain: nvtxRangePushA("plain") and nvtxRangePop() once, nvtxMarkA("hello") once.
// With "unbalanced": one more pop on "selftest" with nothing pushed and a push of "left
// open" never popped.
#include <nvtx3/nvToolsExt.h>

#include <cstdint>
#include <cstring>
#include <thread>

namespace {

nvtxEventAttributes_t attr(uint64_t payload) {
  nvtxEventAttributes_t a{};
  a.version = NVTX_VERSION;
  a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  a.category = 7;
  a.payloadType = NVTX_PAYLOAD_TYPE_UNSIGNED_INT64;
  a.payload.ullValue = payload;
  return a;
}

void work(nvtxDomainHandle_t d, nvtxStringHandle_t inner, uint64_t inner_payload) {
  for (int i = 0; i < 3; ++i) {
    nvtxEventAttributes_t a = attr(100);
    a.messageType = NVTX_MESSAGE_TYPE_ASCII;
    a.message.ascii = "outer";
    nvtxDomainRangePushEx(d, &a);
    nvtxEventAttributes_t b = attr(inner_payload);
    b.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
    b.message.registered = inner;
    nvtxDomainRangePushEx(d, &b);
    nvtxDomainRangePop(d);
    nvtxDomainRangePop(d);
  }
}

}  // namespace

int main(int argc, char** argv) {
  nvtxDomainHandle_t d = nvtxDomainCreateA("selftest");
  nvtxDomainNameCategoryA(d, 7, "seven");
  nvtxStringHandle_t inner = nvtxDomainRegisterStringA(d, "inner");
  std::thread t0(work, d, inner, 1), t1(work, d, inner, 2);
  t0.join();
  t1.join();
  nvtxEventAttributes_t m = attr(5);
  m.messageType = NVTX_MESSAGE_TYPE_ASCII;
  m.message.ascii = "done";
  nvtxDomainMarkEx(d, &m);
  nvtxRangePushA("plain");
  nvtxRangePop();
  nvtxMarkA("hello");
  if (argc > 1 && std::strcmp(argv[1], "unbalanced") == 0) {
    nvtxDomainRangePop(d);
    nvtxEventAttributes_t o = attr(0);
    o.messageType = NVTX_MESSAGE_TYPE_ASCII;
    o.message.ascii = "left open";
    nvtxDomainRangePushEx(d, &o);
  }
  return 0;
}
