#include "config/bench_csv.hpp"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <map>

namespace streamcoll::config {
namespace {

std::vector<std::string_view> split_commas(std::string_view s) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); ++i)
    if (i == s.size() || s[i] == ',') {
      out.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  return out;
}

template <class T>
bool parse_int(std::string_view s, T* out) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && p == s.data() + s.size();
}

bool parse_real(std::string_view s, double* out) {
  std::string tmp(s);
  char* end = nullptr;
  *out = std::strtod(tmp.c_str(), &end);
  return !tmp.empty() && end == tmp.c_str() + tmp.size();
}

}  // namespace

std::string_view bench_csv_header() {
  return "coll,dtype,op,mem,stream,ranks,nodes,ppn,spec,route,taken,bytes,count,iters,"
         "min_us,median_us,max_us,host_us,algbw_GBps,busbw_GBps,valid,rule,burst";
}

bool parse_bench_csv(std::string_view text, std::string_view source,
                     std::vector<BenchRow>* rows, std::string* error) {
  std::map<std::string_view, size_t> col;
  std::vector<std::string_view> header;
  int lineno = 0;
  size_t start = 0;
  bool have_header = false;
  auto fail = [&](const std::string& reason) {
    if (error)
      *error = std::string(source) + (lineno ? ":" + std::to_string(lineno) : "") + ": " + reason;
    return false;
  };
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    start = end + 1;
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || line.front() == '#') continue;
    auto f = split_commas(line);
    if (!have_header) {
      header = f;
      for (size_t i = 0; i < f.size(); ++i)
        if (!col.emplace(f[i], i).second)
          return fail("column '" + std::string(f[i]) + "' appears twice");
      for (auto name : split_commas(bench_csv_header()))
        if (!col.count(name) && name != "rule" && name != "burst")  // newer, optional
          return fail("no column '" + std::string(name) + "'");
      have_header = true;
      continue;
    }
    if (f == header) continue;  // the header again (files appended to each other)
    if (f.size() < col.size())
      return fail("expected " + std::to_string(col.size()) + " fields, got " +
                  std::to_string(f.size()));
    auto at = [&](std::string_view name) { return f[col.at(name)]; };
    BenchRow r;
    r.coll = at("coll");
    r.dtype = at("dtype");
    r.op = at("op");
    r.mem = at("mem");
    r.spec = at("spec");
    r.route = at("route");
    r.taken = at("taken");
    if (col.count("rule") && !at("rule").empty()) r.rule = at("rule");
    int valid = 0;
    bool ok = (!col.count("burst") || parse_int(at("burst"), &r.burst)) && r.burst >= 0 &&
              parse_int(at("stream"), &r.stream) && parse_int(at("ranks"), &r.ranks) &&
              parse_int(at("nodes"), &r.nodes) && parse_int(at("ppn"), &r.ppn) &&
              parse_int(at("bytes"), &r.bytes) && parse_int(at("count"), &r.count) &&
              parse_int(at("iters"), &r.iters) && parse_real(at("min_us"), &r.min_us) &&
              parse_real(at("median_us"), &r.median_us) && parse_real(at("max_us"), &r.max_us) &&
              parse_real(at("host_us"), &r.host_us) && parse_real(at("algbw_GBps"), &r.algbw) &&
              parse_real(at("busbw_GBps"), &r.busbw) && parse_int(at("valid"), &valid);
    if (!ok) return fail("a numeric field does not parse: '" + std::string(line) + "'");
    r.valid = valid == 1;
    rows->push_back(std::move(r));
  }
  if (!have_header) {
    lineno = 0;
    return fail("no header line");
  }
  return true;
}

bool to_measurement(const BenchRow& row, Measurement* out, std::string* why) {
  auto no = [&](std::string reason) {
    if (why) *why = std::move(reason);
    return false;
  };
  if (!row.valid) return no("its results were wrong");
  if (row.spec == "table") return no("no route was forced (spec 'table')");
  auto coll = parse_coll(row.coll);
  if (!coll) return no("unknown collective '" + row.coll + "'");
  auto mem = parse_mem(row.mem);
  if (!mem || *mem == MemKind::mixed) return no("unknown memory kind '" + row.mem + "'");
  std::string_view family = std::string_view(row.route).substr(0, row.route.find(' '));
  if (row.taken != "-" && row.taken != family)
    return no("route '" + row.route + "' declined: the calls went to " + row.taken);
  if (row.rule != "-" && row.rule != row.route)
    return no("route '" + row.route + "' did not run as written: the calls went to " + row.rule);
  if (!std::isfinite(row.median_us) || row.median_us <= 0) return no("no time");
  out->coll = *coll;
  out->mem = *mem;
  out->stream = row.stream;
  out->ranks = row.ranks;
  out->nodes = row.nodes;
  out->bytes = row.bytes;
  out->route = row.route;
  out->burst = row.burst;
  out->seconds = row.median_us * 1e-6;
  return true;
}

}  // namespace streamcoll::config
