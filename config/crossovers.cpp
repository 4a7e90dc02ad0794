#include "config/crossovers.hpp"

#include <algorithm>
#include <cmath>

namespace streamcoll::config {

std::vector<Crossover> crossovers(const std::vector<double>& bytes, const std::vector<double>& t_a,
                                  const std::vector<double>& t_b, double tie) {
  std::vector<Crossover> out;
  const size_t n = std::min({bytes.size(), t_a.size(), t_b.size()});
  int last_label = 0;  // +1: a cheaper, -1: b cheaper
  double last_x = 0, last_d = 0;
  for (size_t i = 0; i < n; ++i) {
    const double a = t_a[i], b = t_b[i];
    if (!(bytes[i] > 0) || !(a > 0) || !(b > 0) || !std::isfinite(a) || !std::isfinite(b)) continue;
    int label = 0;
    if (b / a - 1 > tie) label = 1;
    else if (a / b - 1 > tie) label = -1;
    if (label == 0) continue;
    const double x = std::log2(bytes[i]), d = std::log(a / b);
    if (last_label != 0 && label != last_label) {
      // d changes sign between the two sizes: where the line through them reaches 0.
      const double f = last_d / (last_d - d);
      out.push_back({std::exp2(last_x + f * (x - last_x)), last_label == 1});
    }
    last_label = label;
    last_x = x;
    last_d = d;
  }
  return out;
}

std::vector<CrossoverMatch> match_crossovers(const std::vector<Crossover>& predicted,
                                             const std::vector<Crossover>& measured) {
  std::vector<CrossoverMatch> out;
  std::vector<bool> used(predicted.size(), false);
  for (const Crossover& m : measured) {
    int best = -1;
    double best_dist = 0;
    for (size_t i = 0; i < predicted.size(); ++i) {
      if (used[i] || predicted[i].a_below != m.a_below) continue;
      const double dist = std::fabs(std::log2(predicted[i].bytes / m.bytes));
      if (best < 0 || dist < best_dist) best = static_cast<int>(i), best_dist = dist;
    }
    CrossoverMatch x;
    x.measured = m.bytes;
    x.a_below = m.a_below;
    if (best >= 0) {
      used[static_cast<size_t>(best)] = true;
      x.predicted = predicted[static_cast<size_t>(best)].bytes;
    }
    out.push_back(x);
  }
  for (size_t i = 0; i < predicted.size(); ++i)
    if (!used[i]) out.push_back({predicted[i].bytes, 0, predicted[i].a_below});
  std::sort(out.begin(), out.end(), [](const CrossoverMatch& x, const CrossoverMatch& y) {
    return std::max(x.predicted, x.measured) < std::max(y.predicted, y.measured);
  });
  return out;
}

}  // namespace streamcoll::config
