#include <doctest/doctest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "config/env.hpp"

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

TEST_CASE("docs/reference.md documents every environment knob") {
  std::ifstream in(STREAMCOLL_SOURCE_DIR "/docs/reference.md");
  REQUIRE(in);
  std::stringstream text;
  text << in.rdbuf();
  for (const Knob& k : knobs()) {
    CAPTURE(k.name);
    CHECK(text.str().find("`" + std::string(k.name) + "`") != std::string::npos);
  }
}
