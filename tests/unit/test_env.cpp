#include <doctest/doctest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "config/env.hpp"
#include "reference_doc.hpp"

using namespace streamcoll;
using namespace streamcoll::config;

TEST_CASE("boolean and level values") {
  bool b = false;
  for (const char* t : {"1", "yes", "TRUE", "on"}) {
    b = false;
    CHECK(parse_bool(t, &b));
    CHECK(b);
  }
  for (const char* f : {"0", "no", "False", "OFF"}) {
    b = true;
    CHECK(parse_bool(f, &b));
    CHECK_FALSE(b);
  }
  b = true;
  CHECK_FALSE(parse_bool("2", &b));
  CHECK(b);
  LogLevel l = LogLevel::none;
  CHECK(parse_log_level("info", &l));
  CHECK(l == LogLevel::info);
  CHECK(parse_log_level("3", &l));
  CHECK(l == LogLevel::trace);
  CHECK(parse_log_level("WARN", &l));
  CHECK(l == LogLevel::warn);
  CHECK_FALSE(parse_log_level("loud", &l));
}

TEST_CASE("settings from the environment, bad values reported") {
  setenv("STREAMCOLL_STATS", "1", 1);
  setenv("STREAMCOLL_CHECK", "maybe", 1);
  setenv("STREAMCOLL_DEBUG", "trace", 1);
  setenv("STREAMCOLL_ROUTE", "allreduce:pmpi", 1);
  Settings s = read_settings();
  CHECK(s.stats);
  CHECK_FALSE(s.check);
  CHECK(s.debug == LogLevel::trace);
  CHECK(s.route == "allreduce:pmpi");
  REQUIRE(s.problems.size() == 1);
  CHECK(s.problems[0].find("STREAMCOLL_CHECK") != std::string::npos);
  for (const char* n : {"STREAMCOLL_STATS", "STREAMCOLL_CHECK", "STREAMCOLL_DEBUG", "STREAMCOLL_ROUTE"})
    unsetenv(n);
  Settings d = read_settings();
  CHECK_FALSE(d.stats);
  CHECK(d.debug == LogLevel::none);
  CHECK(d.problems.empty());
}

TEST_CASE("STREAMCOLL_NCCL_MEMORY: a share or a size") {
  setenv("STREAMCOLL_NCCL_MEMORY", "40%", 1);
  Settings s = read_settings();
  CHECK(s.nccl_memory_share == doctest::Approx(0.4));
  CHECK(s.nccl_memory_bytes == 0);
  setenv("STREAMCOLL_NCCL_MEMORY", "512M", 1);
  s = read_settings();
  CHECK(s.nccl_memory_bytes == 512ull << 20);
  for (const char* bad : {"150%", "lots", "0", "%"}) {
    setenv("STREAMCOLL_NCCL_MEMORY", bad, 1);
    s = read_settings();
    CAPTURE(bad);
    CHECK(s.problems.size() == 1);
    CHECK(s.nccl_memory_share == doctest::Approx(0.25));
    CHECK(s.nccl_memory_bytes == 0);
  }
  unsetenv("STREAMCOLL_NCCL_MEMORY");
}

namespace {
// A value other than the default for every knob.
const std::vector<std::pair<const char*, const char*>> values = {
      {"STREAMCOLL_DISABLE", "yes"},          {"STREAMCOLL_DEBUG", "info"},
      {"STREAMCOLL_STATS", "on"},             {"STREAMCOLL_DRIVER_PROFILE", "1"},
      {"STREAMCOLL_CHECK", "true"},           {"STREAMCOLL_TUNING_FILE", "/t.table"},
      {"STREAMCOLL_ROUTE", "bcast:ht"},       {"STREAMCOLL_NCCL_LIB", "/n.so"},
      {"STREAMCOLL_NCCL_NONBLOCKING", "1"},   {"STREAMCOLL_NVGROUP_NONBLOCKING", "1"},
      {"STREAMCOLL_DECISION_CACHE", "0"},     {"STREAMCOLL_FUSION_NCCL", "1"},
      {"STREAMCOLL_FUSION_CYCLE", "250"},     {"STREAMCOLL_THREAD_MULTIPLE", "no"},
      {"STREAMCOLL_STAGING_KERNEL", "off"},   {"STREAMCOLL_PROGRESS_BIND", "none"},
      {"STREAMCOLL_HT_WAIT", "kernel"},       {"STREAMCOLL_HIERARCHY", "2x3"},
      {"STREAMCOLL_NODE_GROUPS", "^(r[0-9]+)"}, {"STREAMCOLL_MPI_CUDA_AWARE", "no"},
      {"STREAMCOLL_TIMELINE", "/tl.json"},    {"STREAMCOLL_TIMELINE_MAX", "500"},
      {"STREAMCOLL_NVTX", "0"},               {"STREAMCOLL_ONE_RANK_SELF", "0"},
      {"STREAMCOLL_NCCL_MAX_COMMS", "7"},     {"STREAMCOLL_NCCL_MEMORY", "3G"},
};
}  // namespace

TEST_CASE("every knob sets its own setting") {
  REQUIRE(values.size() == knobs().size());
  for (const auto& [n, v] : values) setenv(n, v, 1);
  Settings s = read_settings();
  CHECK(s.problems.empty());
  CHECK(s.disable);
  CHECK(s.debug == LogLevel::info);
  CHECK(s.stats);
  CHECK(s.driver_profile);
  CHECK(s.check);
  CHECK(s.tuning_file == "/t.table");
  CHECK(s.route == "bcast:ht");
  CHECK(s.nccl_lib == "/n.so");
  CHECK(s.nccl_nonblocking);
  CHECK(s.nvgroup_nonblocking);
  CHECK(s.decision_cache == 0);
  CHECK(s.fusion_nccl);
  CHECK(s.fusion_cycle_us == 250);
  CHECK(s.thread_multiple == Threads::no);
  CHECK_FALSE(s.staging_kernel);
  CHECK_FALSE(s.progress_bind);
  CHECK(s.ht_wait == HtWait::kernel);
  CHECK(s.hierarchy == std::vector<int>{2, 3});
  CHECK(s.node_groups == "^(r[0-9]+)");
  CHECK(s.mpi_cuda_aware == CudaAware::no);
  CHECK(s.timeline == "/tl.json");
  CHECK(s.timeline_max == 500);
  CHECK(s.nvtx == 0);
  CHECK_FALSE(s.one_rank_self);
  CHECK(s.nccl_max_comms == 7);
  CHECK(s.nccl_memory_bytes == 3ull << 30);
  // Values a knob does not understand: each reported under its own name, the default kept.
  for (const auto& [n, v] : values) setenv(n, "bogus", 1);
  Settings b = read_settings();
  CHECK(b.problems.size() == 21);  // every knob but the five that take any string
  for (const Knob& k : knobs()) {
    CAPTURE(k.name);
    const bool any_string = k.name == "STREAMCOLL_TUNING_FILE" || k.name == "STREAMCOLL_ROUTE" ||
                            k.name == "STREAMCOLL_NCCL_LIB" || k.name == "STREAMCOLL_NODE_GROUPS" ||
                            k.name == "STREAMCOLL_TIMELINE";
    int mentions = 0;
    for (const std::string& p : b.problems) mentions += p.rfind(std::string(k.name) + "='bogus'", 0) == 0;
    CHECK(mentions == (any_string ? 0 : 1));
  }
  CHECK(b.debug == LogLevel::warn);  // a bad level says warn
  CHECK(b.fusion_cycle_us == 1000);
  CHECK(b.ht_wait == HtWait::auto_detect);
  CHECK(b.hierarchy.empty());
  CHECK(b.timeline_max == 100000);
  CHECK(b.nvtx == -1);
  for (const auto& [n, v] : values) unsetenv(n);
}

TEST_CASE("a knob's default is its row's, and a value not understood says what the row accepts") {
  for (const auto& [n, v] : values) unsetenv(n);
  const Settings s = read_settings();
  CHECK(s.problems.empty());
  for (const Knob& k : knobs()) {
    CAPTURE(k.name);
    // The default parses, and is the value in effect when the variable is unset.
    Settings t;
    if (!k.default_value.empty()) CHECK(k.set(k.default_value, &t));
    CHECK(k.show(s) == k.default_value);
  }
  CHECK(s.one_rank_self);  // a few read as the fields they set
  CHECK(s.nccl_max_comms == 32);
  CHECK(s.nccl_memory_share == doctest::Approx(0.25));
  CHECK(s.fusion_cycle_us == 1000);
  CHECK(s.nccl_lib == "libnccl.so.2");
  setenv("STREAMCOLL_FUSION_CYCLE", "-5", 1);
  setenv("STREAMCOLL_HIERARCHY", "2by2", 1);
  const Settings b = read_settings();
  REQUIRE(b.problems.size() == 2);
  CHECK(b.problems[0] == "STREAMCOLL_FUSION_CYCLE='-5' is not a number of microseconds up to "
                         "10000000; using 1000");
  CHECK(b.problems[1] == "STREAMCOLL_HIERARCHY='2by2' is not a list of factors like 2x2x2; ignored");
  unsetenv("STREAMCOLL_FUSION_CYCLE");
  unsetenv("STREAMCOLL_HIERARCHY");
}

TEST_CASE("the ranks agree on exactly the knobs whose rows say so") {
  for (const auto& [n, v] : values) unsetenv(n);
  const std::string base = agreed_text(read_settings());
  for (const Knob& k : knobs()) {
    CAPTURE(k.name);
    const char* v = nullptr;
    for (const auto& [n, value] : values)
      if (k.name == n) v = value;
    REQUIRE(v);
    setenv(std::string(k.name).c_str(), v, 1);
    const bool changed = agreed_text(read_settings()) != base;
    unsetenv(std::string(k.name).c_str());
    CHECK(changed == (k.agreed == Agreed::value || k.agreed == Agreed::presence));
    CHECK((agreed_names().find(k.name) != std::string::npos) == (k.agreed != Agreed::local));
  }
}

TEST_CASE("docs/reference.md's environment table is the one the knobs generate") {
  // Regenerate: streamcoll-info --knobs prints the table to paste between the markers.
  CHECK(reference_doc_section("knobs") == knobs_markdown());
}
