#include <doctest/doctest.h>

#include "core/alloc_kinds.hpp"

using namespace streamcoll;
using namespace streamcoll::alloc_kinds;

namespace {
uint32_t bits(std::initializer_list<MemKind> ks) {
  uint32_t b = 0;
  for (MemKind k : ks) b |= 1u << static_cast<int>(k);
  return b;
}
}  // namespace

TEST_CASE("mpi_assert_memory_alloc_kinds values") {
  const uint32_t host = bits({MemKind::host, MemKind::pinned});
  CHECK(parse("system") == host);
  CHECK(parse("mpi") == host);
  CHECK(parse("mpi:alloc_mem") == host);
  CHECK(parse("system,mpi:win_allocate_shared") == host);
  CHECK(parse("cuda:host") == bits({MemKind::pinned}));
  CHECK(parse("cuda:device") == bits({MemKind::device}));
  CHECK(parse("cuda:managed") == bits({MemKind::managed}));
  CHECK(parse("cuda") == bits({MemKind::pinned, MemKind::device, MemKind::managed}));
  CHECK(parse(" system , cuda:device ") == (host | bits({MemKind::device})));
  CHECK(parse("system,,mpi") == host);
  // Not understood: the whole assertion is unused.
  CHECK(parse("") == 0);
  CHECK(parse(" , ") == 0);
  CHECK(parse("rocm:device") == 0);
  CHECK(parse("system,rocm") == 0);
  CHECK(parse("cuda:pinned") == 0);
  CHECK(parse("system:host") == 0);
  CHECK(parse("SYSTEM") == 0);
}

TEST_CASE("host-only assertions and the kind they are routed as") {
  CHECK(host_only(parse("system")));
  CHECK(host_only(parse("mpi,cuda:host")));
  CHECK_FALSE(host_only(parse("system,cuda:device")));
  CHECK_FALSE(host_only(parse("cuda")));
  CHECK_FALSE(host_only(0));
  CHECK(routing_kind(parse("system")) == MemKind::host);
  CHECK(routing_kind(parse("cuda:host")) == MemKind::pinned);
  CHECK(allows(parse("system"), MemKind::pinned));
  CHECK_FALSE(allows(parse("system"), MemKind::device));
  CHECK_FALSE(allows(parse("cuda:device"), MemKind::mixed));
}
