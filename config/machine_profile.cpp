// Machine profiles (TOML, read with toml++) and their fit to sc_bench measurements;
// format and method in machine_profile.hpp.
#include "config/machine_profile.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <tuple>

#include <toml++/toml.h>

namespace streamcoll::config {

namespace {

bool finite_nonneg(double x) { return std::isfinite(x) && x >= 0; }
bool finite_pos(double x) { return std::isfinite(x) && x > 0; }

// ---- reading ----------------------------------------------------------------------------

/// Reads the keys of one TOML table, reporting the first problem as "source:line: reason".
class TableReader {
 public:
  TableReader(const toml::table& t, std::string_view source, std::string where)
      : t_(t), source_(source), where_(std::move(where)) {}

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }

  /// A number (integer or float) at `key`; absent: false, *out untouched.
  bool number(const char* key, double* out, bool required) {
    used_.push_back(key);
    const toml::node* n = t_.get(key);
    if (n == nullptr) {
      if (required) fail(line_of_table(), "missing key '" + name(key) + "'");
      return false;
    }
    std::optional<double> v;
    if (n->is_floating_point()) v = n->as_floating_point()->get();
    if (n->is_integer()) v = static_cast<double>(n->as_integer()->get());
    if (!v) {
      fail(line(n), "'" + name(key) + "' must be a number");
      return false;
    }
    if (!std::isfinite(*v)) {
      fail(line(n), "'" + name(key) + "' must be finite");
      return false;
    }
    *out = *v;
    last_line_ = line(n);
    return true;
  }

  bool integer(const char* key, int* out, bool required) {
    used_.push_back(key);
    const toml::node* n = t_.get(key);
    if (n == nullptr) {
      if (required) fail(line_of_table(), "missing key '" + name(key) + "'");
      return false;
    }
    if (!n->is_integer()) {
      fail(line(n), "'" + name(key) + "' must be an integer");
      return false;
    }
    const int64_t v = n->as_integer()->get();
    if (v < 1 || v > (1 << 24)) {
      fail(line(n), "'" + name(key) + "' must be in 1..16777216");
      return false;
    }
    *out = static_cast<int>(v);
    last_line_ = line(n);
    return true;
  }

  bool string(const char* key, std::string* out) {
    used_.push_back(key);
    const toml::node* n = t_.get(key);
    if (n == nullptr) return false;
    if (!n->is_string()) {
      fail(line(n), "'" + name(key) + "' must be a string");
      return false;
    }
    *out = n->as_string()->get();
    return true;
  }

  /// A check on the value just read: fails at its line unless `cond`.
  void require(bool cond, const char* key, const std::string& what) {
    if (!cond && ok()) fail(last_line_, "'" + name(key) + "' " + what);
  }

  /// Fails on the first key that no call above asked for.
  void no_unknown_keys(const std::vector<std::string>& also) {
    for (auto&& [k, v] : t_) {
      const std::string key(k.str());
      if (std::find(used_.begin(), used_.end(), key) != used_.end()) continue;
      if (std::find(also.begin(), also.end(), key) != also.end()) continue;
      fail(line(&v), "unknown key '" + name(key.c_str()) + "'");
      return;
    }
  }

  void fail(int line, std::string reason) {
    if (!error_.empty()) return;
    error_ = std::string(source_) + (line > 0 ? ":" + std::to_string(line) : std::string()) +
             ": " + reason;
  }

  int line_of_table() const { return static_cast<int>(t_.source().begin.line); }

 private:
  static int line(const toml::node* n) { return static_cast<int>(n->source().begin.line); }
  std::string name(const char* key) const { return where_.empty() ? key : where_ + "." + key; }

  const toml::table& t_;
  std::string_view source_;
  std::string where_;
  std::string error_;
  std::vector<std::string> used_;
  int last_line_ = 0;
};

// ---- writing ----------------------------------------------------------------------------

/// The shortest decimal that reads back as v, in TOML float syntax.
std::string number_text(double v) {
  char buf[40];
  for (int prec = 1; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  std::string s = buf;
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

std::string string_text(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned char>(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

}  // namespace

// ---- profiles ---------------------------------------------------------------------------

std::string check_profile(const MachineProfile& p) {
  if (p.gpus_per_node < 1) return "gpus_per_node must be >= 1";
  if (!finite_nonneg(p.gamma)) return "gamma must be finite and >= 0";
  if (p.host_gamma && !finite_nonneg(*p.host_gamma)) return "host_gamma must be finite and >= 0";
  if (!finite_nonneg(p.copy_alpha)) return "copy_alpha must be finite and >= 0";
  if (!finite_pos(p.copy_gbps)) return "copy_bandwidth must be > 0";
  if (!finite_nonneg(p.nccl_call_alpha)) return "nccl_call_alpha must be finite and >= 0";
  if (p.levels.empty()) return "at least one [[level]] is needed";
  if (p.levels.size() > 16) return "at most 16 levels";
  for (size_t i = 0; i < p.levels.size(); ++i) {
    const LevelProfile& l = p.levels[i];
    const std::string at = "level " + std::to_string(i) + ": ";
    if (!finite_nonneg(l.alpha)) return at + "alpha must be finite and >= 0";
    if (!finite_pos(l.gbps)) return at + "bandwidth must be > 0";
    for (double v : {l.solo_gbps, l.a2a_gbps, l.host_gbps, l.host_solo_gbps}) {
      if (!finite_nonneg(v)) return at + "optional bandwidths must be > 0";
    }
    if (l.host_alpha && !finite_nonneg(*l.host_alpha)) {
      return at + "host_alpha must be finite and >= 0";
    }
    if (!finite_nonneg(l.host_call_alpha)) return at + "host_call_alpha must be finite and >= 0";
    const bool middle = i > 0 && i + 1 < p.levels.size();
    if (middle && l.size < 2) return at + "a middle level needs size >= 2";
    if (!middle && l.size != 0) {
      return at + "only levels between the innermost and the outermost take a size";
    }
  }
  return {};
}

std::optional<MachineProfile> load_profile(std::string_view text, std::string_view source,
                                           std::string* error) {
  auto fail = [&](std::string why) {
    if (error) *error = std::move(why);
    return std::nullopt;
  };
  toml::table root;
#if TOML_EXCEPTIONS
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    return fail(std::string(source) + ":" + std::to_string(e.source().begin.line) + ": " +
                std::string(e.description()));
  }
#else
  toml::parse_result res = toml::parse(text, source);
  if (!res) {
    return fail(std::string(source) + ":" + std::to_string(res.error().source().begin.line) +
                ": " + std::string(res.error().description()));
  }
  root = std::move(res).table();
#endif
  MachineProfile p;
  TableReader top(root, source, "");
  top.string("name", &p.name);
  top.string("description", &p.description);
  top.integer("gpus_per_node", &p.gpus_per_node, true);
  top.number("gamma", &p.gamma, true);
  top.require(p.gamma >= 0, "gamma", "must be >= 0");
  double hg = 0;
  if (top.number("host_gamma", &hg, false)) {
    top.require(hg >= 0, "host_gamma", "must be >= 0");
    p.host_gamma = hg;
  }
  if (top.number("copy_alpha", &p.copy_alpha, false)) {
    top.require(p.copy_alpha >= 0, "copy_alpha", "must be >= 0");
  }
  if (top.number("nccl_call_alpha", &p.nccl_call_alpha, false)) {
    top.require(p.nccl_call_alpha >= 0, "nccl_call_alpha", "must be >= 0");
  }
  if (top.number("copy_bandwidth", &p.copy_gbps, false)) {
    top.require(p.copy_gbps > 0, "copy_bandwidth", "must be > 0 (GB/s)");
  }
  top.no_unknown_keys({"level"});
  if (!top.ok()) return fail(top.error());

  const toml::node* levels = root.get("level");
  if (levels == nullptr) return fail(std::string(source) + ": no [[level]] table");
  const toml::array* arr = levels->as_array();
  if (arr == nullptr || !arr->is_array_of_tables() || arr->empty()) {
    return fail(std::string(source) + ":" + std::to_string(levels->source().begin.line) +
                ": 'level' must be an array of tables ([[level]])");
  }
  for (size_t i = 0; i < arr->size(); ++i) {
    const toml::table& t = *(*arr)[i].as_table();
    TableReader r(t, source, "level[" + std::to_string(i) + "]");
    LevelProfile l;
    r.string("name", &l.name);
    r.number("alpha", &l.alpha, true);
    r.require(l.alpha >= 0, "alpha", "must be >= 0 (seconds)");
    r.number("bandwidth", &l.gbps, true);
    r.require(l.gbps > 0, "bandwidth", "must be > 0 (GB/s)");
    if (r.number("solo_bandwidth", &l.solo_gbps, false)) {
      r.require(l.solo_gbps > 0, "solo_bandwidth", "must be > 0 (GB/s)");
    }
    if (r.number("a2a_bandwidth", &l.a2a_gbps, false)) {
      r.require(l.a2a_gbps > 0, "a2a_bandwidth", "must be > 0 (GB/s)");
    }
    double ha = 0;
    if (r.number("host_alpha", &ha, false)) {
      r.require(ha >= 0, "host_alpha", "must be >= 0 (seconds)");
      l.host_alpha = ha;
    }
    if (r.number("host_bandwidth", &l.host_gbps, false)) {
      r.require(l.host_gbps > 0, "host_bandwidth", "must be > 0 (GB/s)");
    }
    if (r.number("host_solo_bandwidth", &l.host_solo_gbps, false)) {
      r.require(l.host_solo_gbps > 0, "host_solo_bandwidth", "must be > 0 (GB/s)");
    }
    if (r.number("host_call_alpha", &l.host_call_alpha, false)) {
      r.require(l.host_call_alpha >= 0, "host_call_alpha", "must be >= 0 (seconds)");
    }
    const bool middle = i > 0 && i + 1 < arr->size();
    if (r.integer("size", &l.size, middle)) {
      r.require(middle, "size",
                "is only for levels between the innermost and the outermost (level 0's "
                "size is gpus_per_node, the outermost takes what is left)");
      r.require(l.size >= 2, "size", "must be >= 2");
    }
    r.no_unknown_keys({});
    if (!r.ok()) return fail(r.error());
    p.levels.push_back(l);
  }
  if (std::string why = check_profile(p); !why.empty()) {
    return fail(std::string(source) + ": " + why);
  }
  return p;
}

std::optional<MachineProfile> load_profile_file(const std::string& path, std::string* error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (error) *error = path + ": cannot open";
    return std::nullopt;
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  return load_profile(ss.str(), path, error);
}

std::string write_profile(const MachineProfile& p, std::string_view comment) {
  std::string out;
  size_t i = 0;
  while (i < comment.size()) {
    size_t j = comment.find('\n', i);
    if (j == std::string_view::npos) j = comment.size();
    out += "# " + std::string(comment.substr(i, j - i)) + "\n";
    i = j + 1;
  }
  if (!comment.empty()) out += "\n";
  if (!p.name.empty()) out += "name = " + string_text(p.name) + "\n";
  if (!p.description.empty()) out += "description = " + string_text(p.description) + "\n";
  out += "gpus_per_node = " + std::to_string(p.gpus_per_node) + "\n";
  out += "gamma = " + number_text(p.gamma) + "            # s/B, device reduction\n";
  if (p.host_gamma) {
    out += "host_gamma = " + number_text(*p.host_gamma) + "       # s/B, host reduction\n";
  }
  out += "copy_alpha = " + number_text(p.copy_alpha) + "       # s\n";
  out += "copy_bandwidth = " + number_text(p.copy_gbps) + "   # GB/s\n";
  if (p.nccl_call_alpha > 0)
    out += "nccl_call_alpha = " + number_text(p.nccl_call_alpha) + "   # s per NCCL call\n";
  for (const LevelProfile& l : p.levels) {
    out += "\n[[level]]\n";
    if (!l.name.empty()) out += "name = " + string_text(l.name) + "\n";
    out += "alpha = " + number_text(l.alpha) + "            # s\n";
    out += "bandwidth = " + number_text(l.gbps) + "        # GB/s\n";
    if (l.solo_gbps > 0) out += "solo_bandwidth = " + number_text(l.solo_gbps) + "\n";
    if (l.a2a_gbps > 0) out += "a2a_bandwidth = " + number_text(l.a2a_gbps) + "\n";
    if (l.host_alpha) out += "host_alpha = " + number_text(*l.host_alpha) + "\n";
    if (l.host_gbps > 0) out += "host_bandwidth = " + number_text(l.host_gbps) + "\n";
    if (l.host_solo_gbps > 0) {
      out += "host_solo_bandwidth = " + number_text(l.host_solo_gbps) + "\n";
    }
    if (l.host_call_alpha > 0) {
      out += "host_call_alpha = " + number_text(l.host_call_alpha) + "   # s per host call\n";
    }
    if (l.size > 0) out += "size = " + std::to_string(l.size) + "\n";
  }
  return out;
}

int nodes_for(const MachineProfile& p, int gpus) {
  const int g = std::max(1, p.gpus_per_node);
  return gpus <= 0 ? 0 : (gpus + g - 1) / g;
}

std::optional<model::Hierarchy> hierarchy(const MachineProfile& p, int gpus, ProfilePath path,
                                          std::string* error) {
  auto fail = [&](std::string why) {
    if (error) *error = std::move(why);
    return std::nullopt;
  };
  if (std::string why = check_profile(p); !why.empty()) return fail(why);
  if (gpus < 1) return fail("the GPU count must be >= 1");
  auto link = [&](const LevelProfile& l) {
    model::LinkLevel k;
    if (path == ProfilePath::host) {
      k = model::link_gbps(l.host_alpha.value_or(l.alpha), l.host_gbps > 0 ? l.host_gbps : l.gbps,
                           l.host_solo_gbps > 0 ? l.host_solo_gbps : l.solo_gbps);
    } else {
      k = model::link_gbps(l.alpha, l.gbps, l.solo_gbps);
      k.beta_a2a = model::beta_from_gbps(l.a2a_gbps);
    }
    return k;
  };
  model::Hierarchy h;
  const int gpn = p.gpus_per_node;
  if (gpus <= gpn) {
    h.factors = {gpus};
    h.links = {link(p.levels[0])};
    return h;
  }
  if (gpus % gpn != 0) {
    return fail(std::to_string(gpus) + " GPUs are not a whole number of nodes of " +
                std::to_string(gpn));
  }
  h.factors = {gpn};
  h.links = {link(p.levels[0])};
  int units = gpus / gpn;
  for (size_t i = 1; i < p.levels.size(); ++i) {
    const LevelProfile& l = p.levels[i];
    const bool last = i + 1 == p.levels.size();
    if (last || units <= l.size) {
      h.factors.push_back(units);
      h.links.push_back(link(l));
      return h;
    }
    if (units % l.size != 0) {
      return fail(std::to_string(gpus / gpn) + " nodes are not a whole number of level-" +
                  std::to_string(i) + " groups of " + std::to_string(l.size));
    }
    h.factors.push_back(l.size);
    h.links.push_back(link(l));
    units /= l.size;
  }
  return fail("the profile has one level: at most " + std::to_string(gpn) + " GPUs");
}

model::Machine machine(const MachineProfile& p, ProfilePath path) {
  model::Machine m;
  m.gamma = path == ProfilePath::host ? p.host_gamma.value_or(p.gamma) : p.gamma;
  m.copy_alpha = p.copy_alpha;
  m.copy_beta = model::beta_from_gbps(p.copy_gbps);
  return m;
}

// ---- the fit ----------------------------------------------------------------------------

std::vector<double> nonneg_least_squares(const std::vector<std::vector<double>>& x,
                                         const std::vector<double>& y, unsigned free_mask,
                                         double* ssr) {
  const size_t rows = std::min(x.size(), y.size());
  size_t k = 0;
  for (const auto& r : x) k = std::max(k, r.size());
  k = std::min<size_t>(k, 4);
  auto at = [&](size_t i, size_t j) { return j < x[i].size() ? x[i][j] : 0.0; };
  auto residual = [&](const std::vector<double>& th) {
    double s = 0;
    for (size_t i = 0; i < rows; ++i) {
      double v = -y[i];
      for (size_t j = 0; j < k; ++j) v += at(i, j) * th[j];
      s += v * v;
    }
    return s;
  };
  std::vector<double> best(k, 0.0);
  double best_ssr = residual(best);
  // A subset must improve on the best so far by more than rounding to replace it.
  double yy = 0;
  for (size_t i = 0; i < rows; ++i) yy += y[i] * y[i];
  const double noise = 1e-12 * yy;
  // Subsets, largest first, each size in increasing mask order; among equal fits the
  // earlier one stays (for collinear columns: β before γ).
  std::vector<unsigned> order;
  for (unsigned s = 1; s < (1u << k); ++s) order.push_back(s);
  std::stable_sort(order.begin(), order.end(), [](unsigned a, unsigned b) {
    return __builtin_popcount(a) > __builtin_popcount(b);
  });
  for (unsigned s : order) {
    if ((s & free_mask) != s) continue;
    std::vector<size_t> cols;
    for (size_t j = 0; j < k; ++j) {
      if (s >> j & 1u) cols.push_back(j);
    }
    if (cols.empty()) continue;
    const size_t m = cols.size();
    // Column scaling: unit-norm columns, so the normal matrix has a unit diagonal.
    std::vector<double> scale(m, 0.0);
    for (size_t a = 0; a < m; ++a) {
      for (size_t i = 0; i < rows; ++i) scale[a] += at(i, cols[a]) * at(i, cols[a]);
      scale[a] = std::sqrt(scale[a]);
    }
    if (std::any_of(scale.begin(), scale.end(), [](double v) { return !(v > 0); })) continue;
    double a_mat[4][5] = {};
    for (size_t a = 0; a < m; ++a) {
      for (size_t b = 0; b < m; ++b) {
        for (size_t i = 0; i < rows; ++i) {
          a_mat[a][b] += at(i, cols[a]) / scale[a] * at(i, cols[b]) / scale[b];
        }
      }
      for (size_t i = 0; i < rows; ++i) a_mat[a][m] += at(i, cols[a]) / scale[a] * y[i];
    }
    bool singular = false;
    for (size_t c = 0; c < m && !singular; ++c) {
      size_t piv = c;
      for (size_t r = c + 1; r < m; ++r) {
        if (std::fabs(a_mat[r][c]) > std::fabs(a_mat[piv][c])) piv = r;
      }
      if (std::fabs(a_mat[piv][c]) < 1e-10) {
        singular = true;
        break;
      }
      for (size_t j = 0; j <= m; ++j) std::swap(a_mat[c][j], a_mat[piv][j]);
      for (size_t r = 0; r < m; ++r) {
        if (r == c) continue;
        const double f = a_mat[r][c] / a_mat[c][c];
        for (size_t j = c; j <= m; ++j) a_mat[r][j] -= f * a_mat[c][j];
      }
    }
    if (singular) continue;
    std::vector<double> th(k, 0.0);
    bool feasible = true;
    for (size_t a = 0; a < m; ++a) {
      th[cols[a]] = a_mat[a][m] / a_mat[a][a] / scale[a];
      if (!(th[cols[a]] >= 0)) feasible = false;
    }
    if (!feasible) continue;
    const double r = residual(th);
    if (r < best_ssr * (1 - 1e-9) - noise) {
      best_ssr = r;
      best = th;
    }
  }
  if (ssr) *ssr = best_ssr;
  return best;
}

namespace {

struct Sample {
  model::Algorithm algo;
  int p;
  double n;
  double t;  ///< seconds
};

/// The host algorithm of an ht spec ("ht:algo=rd"), or nullopt.
std::optional<model::Algorithm> ht_algo(const std::string& spec) {
  if (spec.rfind("ht:", 0) != 0) return std::nullopt;
  size_t i = 3;
  while (i <= spec.size()) {
    size_t j = spec.find(':', i);
    if (j == std::string::npos) j = spec.size();
    const std::string kv = spec.substr(i, j - i);
    if (kv == "algo=ring") return model::Algorithm::ring;
    if (kv == "algo=rd") return model::Algorithm::recursive_doubling;
    if (kv == "algo=rabenseifner") return model::Algorithm::rabenseifner;
    i = j + 1;
  }
  return std::nullopt;
}

/// The model's coefficients of (α, β, γ, per-call cost) for one sample on one level of p
/// ranks; the per-call cost's is 1.
std::vector<double> coefficients(const Sample& s) {
  std::vector<double> c(4, 1.0);
  const double unit[3][3] = {{1, 0, 0}, {0, 1, 0}, {0, 0, 1}};
  for (int j = 0; j < 3; ++j) {
    model::Hierarchy h;
    h.factors = {s.p};
    h.links = {model::LinkLevel{unit[j][0], unit[j][1], 0, 0}};
    model::Machine m;
    m.gamma = unit[j][2];
    c[j] = model::evaluate(s.algo, h, s.n, m).seconds();
  }
  return c;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t k = v.size() / 2;
  return v.size() % 2 ? v[k] : 0.5 * (v[k - 1] + v[k]);
}

std::string algo_list(const std::vector<Sample>& s) {
  std::string out;
  for (model::Algorithm a : {model::Algorithm::ring, model::Algorithm::recursive_doubling,
                             model::Algorithm::rabenseifner}) {
    if (std::any_of(s.begin(), s.end(), [a](const Sample& x) { return x.algo == a; })) {
      out += (out.empty() ? "" : ",") + std::string(model::name(a));
    }
  }
  return out;
}

/// Fits α, β, the per-call cost (and γ unless fixed_gamma >= 0) to samples of one level.
FitQuality fit_level(const std::vector<Sample>& samples, double fixed_gamma) {
  FitQuality q;
  if (samples.empty()) return q;
  std::vector<std::vector<double>> x;
  std::vector<double> y;
  for (const Sample& s : samples) {
    const std::vector<double> c = coefficients(s);
    x.push_back({c[0] / s.t, c[1] / s.t, c[2] / s.t, c[3] / s.t});
    y.push_back(fixed_gamma >= 0 ? 1 - c[2] * fixed_gamma / s.t : 1.0);
  }
  const unsigned mask = fixed_gamma >= 0 ? 0b1011u : 0b1111u;
  double ssr = 0;
  const std::vector<double> th = nonneg_least_squares(x, y, mask, &ssr);
  q.fitted = true;
  q.rows = static_cast<int>(samples.size());
  q.alpha = th[0];
  q.beta = th[1];
  q.gamma = fixed_gamma >= 0 ? fixed_gamma : th[2];
  q.call_alpha = th[3];
  q.gamma_free = fixed_gamma < 0;
  std::vector<double> rel;
  for (size_t i = 0; i < x.size(); ++i) {
    const double model =
        x[i][0] * q.alpha + x[i][1] * q.beta + x[i][2] * q.gamma + x[i][3] * q.call_alpha;
    rel.push_back(std::fabs(model - 1));
  }
  q.median_rel = median(rel);
  q.max_rel = *std::max_element(rel.begin(), rel.end());
  q.algos = algo_list(samples);
  return q;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string describe(const char* what, const FitQuality& q, bool level = true) {
  return std::string(what) + ": " + std::to_string(q.rows) + " rows (" + q.algos +
         "), alpha " + fmt("%.3g", q.alpha * 1e6) + " us, bandwidth " +
         (q.beta > 0 ? fmt("%.4g", 1e-9 / q.beta) + " GB/s" : std::string("unbounded (beta 0)")) +
         ", gamma " + fmt("%.3g", q.gamma) + " s/B" + (q.gamma_free ? "" : " (fixed)") +
         (level ? ", per call " + fmt("%.3g", q.call_alpha * 1e6) + " us" : std::string()) +
         "; relative error median " + fmt("%.1f", 100 * q.median_rel) + " %, max " +
         fmt("%.1f", 100 * q.max_rel) + " %";
}

// The rows fit_profile() uses, sorted: host rows on one node (level 0) and with one rank
// per node (level 1), host and device times by call for the copy fit; what was skipped.
struct FitRows {
  // Host times by (spec, ranks, nodes, ppn, bytes), for the copy fit.
  using Key = std::tuple<std::string, int, int, int, uint64_t>;
  std::vector<Sample> lvl0, lvl1;
  std::map<Key, std::pair<double, int>> host_t;
  std::vector<std::pair<Key, double>> device_t;
  int max_ppn = 1;
  std::map<std::string, int> skipped;
};

FitRows sort_rows(const std::vector<BenchRow>& rows) {
  FitRows f;
  for (const BenchRow& r : rows) {
    f.max_ppn = std::max(f.max_ppn, r.ppn);
    if (r.coll != "allreduce") { ++f.skipped["not allreduce"]; continue; }
    if (!r.valid) { ++f.skipped["not valid"]; continue; }
    if (r.burst) { ++f.skipped["bursts of MPI_Iallreduce"]; continue; }
    const auto algo = ht_algo(r.spec);
    if (!algo) { ++f.skipped["not route ht with algo=ring|rd|rabenseifner"]; continue; }
    if (r.taken != "ht" && r.taken != "-") { ++f.skipped["taken by another route"]; continue; }
    if (!(r.median_us > 0) || !std::isfinite(r.median_us) || r.ranks < 2 || r.bytes == 0) {
      ++f.skipped["no time, one rank or 0 bytes"];
      continue;
    }
    const double t = r.median_us * 1e-6;
    const FitRows::Key key{r.spec, r.ranks, r.nodes, r.ppn, r.bytes};
    if (r.mem == "device") {
      f.device_t.emplace_back(key, t);
      continue;
    }
    if (r.mem != "host") { ++f.skipped["memory neither host nor device"]; continue; }
    auto& h = f.host_t[key];
    h.first += t;
    h.second += 1;
    if (r.nodes == 1) {
      f.lvl0.push_back(Sample{*algo, r.ranks, double(r.bytes), t});
    } else if (r.ppn == 1 && r.nodes == r.ranks) {
      f.lvl1.push_back(Sample{*algo, r.nodes, double(r.bytes), t});
    } else {
      ++f.skipped["host rows on several nodes with more than one rank per node"];
    }
  }
  return f;
}

// Copies: device time minus the host time of the same call = 2(α_c + n·β_c).
FitQuality fit_copies(const FitRows& f) {
  FitQuality q;
  std::vector<std::vector<double>> x;
  std::vector<double> y;
  for (const auto& [key, td] : f.device_t) {
    auto it = f.host_t.find(key);
    if (it == f.host_t.end()) continue;
    const double th = it->second.first / it->second.second;
    const double n = double(std::get<4>(key));
    x.push_back({2 / td, 2 * n / td});
    y.push_back((td - th) / td);
  }
  if (x.empty()) return q;
  double ssr = 0;
  const std::vector<double> c = nonneg_least_squares(x, y, 3u, &ssr);
  q.fitted = true;
  q.rows = static_cast<int>(x.size());
  q.alpha = c[0];
  q.beta = c[1];
  std::vector<double> rel;
  for (size_t i = 0; i < x.size(); ++i) {
    rel.push_back(std::fabs(x[i][0] * c[0] + x[i][1] * c[1] - y[i]));
  }
  q.median_rel = median(rel);
  q.max_rel = *std::max_element(rel.begin(), rel.end());
  q.algos = "pairs of device and host rows";
  return q;
}

// Level i of `p` from the fit `q` (made if missing): the host fields where `host_fields`
// and the level has device figures, else the device ones; notes into `notes`.
void put_level(MachineProfile& p, size_t i, const FitQuality& q, bool solo, const char* name,
               bool host_fields, std::vector<std::string>& notes) {
  while (p.levels.size() <= i) {
    LevelProfile l;
    l.name = p.levels.empty() ? "intra-node" : "inter-node";
    p.levels.push_back(l);
  }
  LevelProfile& l = p.levels[i];
  const bool have_device = l.gbps > 0;
  l.host_call_alpha = q.call_alpha;  // the host path's in every case
  if (l.name.empty()) l.name = name;
  const double bw = q.beta > 0 ? 1e-9 / q.beta : 0.0;
  if (bw <= 0) {
    notes.push_back(std::string("level ") + std::to_string(i) +
                    ": beta came out 0 (the bandwidth term is not identifiable from "
                    "these rows); bandwidth kept");
  }
  if (host_fields && have_device) {
    l.host_alpha = q.alpha;
    if (bw > 0) {
      l.host_gbps = bw;
      if (solo) l.host_solo_gbps = bw;
    }
  } else {
    l.alpha = q.alpha;
    if (bw > 0) {
      l.gbps = bw;
      if (solo) l.solo_gbps = bw;
    }
  }
}

// The fitted levels, gamma and copies written into `p` (a copy of `base`, or a new profile).
void write_fit(FitResult& res, MachineProfile& p, bool host_fields) {
  if (res.level0.fitted) put_level(p, 0, res.level0, false, "intra-node", host_fields, res.notes);
  if (res.level1.fitted) {
    if (!res.level0.fitted && p.levels.empty()) {
      put_level(p, 0, res.level1, false, "intra-node", host_fields, res.notes);
      res.notes.push_back("no single-node rows: level 0 takes level 1's fitted values");
    }
    if (p.levels.size() > 2) {
      res.notes.push_back("the profile has " + std::to_string(p.levels.size()) +
                          " levels: the one-rank-per-node fit went to level 1 only");
    }
    put_level(p, 1, res.level1, true, "inter-node", host_fields, res.notes);
  }
  const double gamma = res.level0.fitted ? res.level0.gamma : res.level1.gamma;
  if (host_fields) {
    p.host_gamma = gamma;
  } else {
    p.gamma = gamma;
  }
  if (gamma == 0) {
    res.notes.push_back(
        "gamma came out 0: negligible, or not identifiable (one host algorithm only makes "
        "the beta and gamma terms proportional)");
  }
  if (host_fields) {
    res.notes.push_back(
        "the fitted values describe MPI on host buffers: written to host_alpha, "
        "host_bandwidth and host_gamma; the device figures of the base are kept");
  }
  if (res.copy.fitted) {
    res.notes.push_back(describe("copies (device minus host rows)", res.copy, false));
    if (res.copy.beta > 0) {
      p.copy_alpha = res.copy.alpha;
      p.copy_gbps = 1e-9 / res.copy.beta;
    } else {
      res.notes.push_back("copy beta came out 0: copy parameters kept");
    }
  } else {
    res.notes.push_back("no device-buffer ht rows matching host rows: copy_alpha " +
                        fmt("%.3g", p.copy_alpha) + " s and copy_bandwidth " +
                        fmt("%.4g", p.copy_gbps) + " GB/s kept (" +
                        (host_fields ? "from the base profile" : "defaults") + ")");
  }
}

}  // namespace

FitResult fit_profile(const std::vector<BenchRow>& rows, const MachineProfile* base,
                      const FitOptions& opt) {
  FitResult res;
  const FitRows f = sort_rows(rows);
  for (const auto& [why, n] : f.skipped) {
    res.notes.push_back(std::to_string(n) + " rows skipped: " + why);
  }
  res.level0 = fit_level(f.lvl0, -1);
  const bool gamma_known = res.level0.fitted;
  res.level1 = fit_level(f.lvl1, gamma_known ? res.level0.gamma : -1);
  res.copy = fit_copies(f);
  if (!res.level0.fitted && !res.level1.fitted) {
    res.notes.push_back(
        "nothing to fit: no host-buffer allreduce rows of ht:algo=ring|rd|rabenseifner on one "
        "node or with one rank per node");
    return res;
  }
  if (res.level0.fitted) res.notes.push_back(describe("level 0 (one node)", res.level0));
  if (res.level1.fitted) {
    res.notes.push_back(describe("level 1 (one rank per node)", res.level1));
    res.notes.push_back(
        "level 1: measured with one rank per node, so this is the one-rank rate; it is "
        "written as both the shared and the solo bandwidth (the shared rate, all ranks of a "
        "node sending, needs rows with several ranks per node)");
  }
  MachineProfile p;
  if (base) {
    p = *base;
  } else {
    p.name = "fitted";
    p.gpus_per_node = opt.gpus_per_node > 0 ? opt.gpus_per_node : f.max_ppn;
    res.notes.push_back("gpus_per_node " + std::to_string(p.gpus_per_node) +
                        (opt.gpus_per_node > 0 ? " (given)" : " (the largest ppn in the rows)"));
  }
  write_fit(res, p, base != nullptr);
  if (std::string why = check_profile(p); !why.empty()) {
    res.notes.push_back("the fitted profile is not usable: " + why);
    return res;
  }
  res.profile = p;
  return res;
}

}  // namespace streamcoll::config
