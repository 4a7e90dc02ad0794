// Where the cheaper of two routes changes with the message size, found the same way in
// measured times (sc_bench rows) and in modelled ones (sc_model), so that the two can be
// compared: the model's crossover sizes against the measured ones.
//
// Thread safety: pure functions of their arguments.
#pragma once

#include <cstddef>
#include <vector>

namespace streamcoll::config {

/// One change of the cheaper route between routes a and b.
struct Crossover {
  double bytes = 0;      ///< where it changes (interpolated, see crossovers())
  bool a_below = false;  ///< a is the cheaper one below `bytes` (b above)
};

/// The crossovers of two routes from their times at increasing sizes (bytes > 0; the
/// three vectors of equal length). Each size is labelled by which route is cheaper by more
/// than `tie` (relative: t_b / t_a - 1 > tie labels a; ties and missing times, <= 0 or not
/// finite, are unlabelled); a crossover is a change of label, unlabelled sizes in between
/// skipped, placed where d = ln(t_a / t_b) reaches 0 on the straight line in (log2 size, d)
/// between the last size with the old label and the first with the new one.
/// With tie = 0 on a fine grid of modelled times this is the model's crossover within the
/// grid's step; on measured times, tie keeps noise around a near-tie from counting as
/// crossings.
std::vector<Crossover> crossovers(const std::vector<double>& bytes, const std::vector<double>& t_a,
                                  const std::vector<double>& t_b, double tie);

/// A predicted crossover matched with a measured one of the same direction.
struct CrossoverMatch {
  double predicted = 0, measured = 0;  ///< bytes; 0 when that side has none to match
  bool a_below = false;
  double ratio() const { return predicted > 0 && measured > 0 ? predicted / measured : 0; }
};

/// Pairs predicted and measured crossovers of one route pair: in order of size, each
/// measured crossover with the nearest (in log size) unmatched predicted one of the same
/// direction; what is left on either side comes out alone (the other side 0).
std::vector<CrossoverMatch> match_crossovers(const std::vector<Crossover>& predicted,
                                             const std::vector<Crossover>& measured);

}  // namespace streamcoll::config
