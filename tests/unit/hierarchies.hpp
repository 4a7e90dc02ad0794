// Hierarchies for the unit tests of hierarchical collectives (test_blueconnect.cpp,
// test_schedule.cpp): every ordered factorization of a rank count, and layouts.
#pragma once

#include <numeric>
#include <string>
#include <vector>

#include "core/topology.hpp"

namespace streamcoll::testing {

inline void factorizations(int p, std::vector<int>& cur, std::vector<std::vector<int>>& out) {
  if (p == 1) {
    out.push_back(cur);
    return;
  }
  for (int f = 2; f <= p; ++f) {
    if (p % f) continue;
    cur.push_back(f);
    factorizations(p / f, cur, out);
    cur.pop_back();
  }
}

/// Every ordered factorization of p into factors >= 2 (p = 1: one, empty).
inline std::vector<std::vector<int>> factorizations(int p) {
  std::vector<std::vector<int>> out;
  std::vector<int> cur;
  factorizations(p, cur, out);
  return out;
}

/// A hierarchy of `factors` (empty: one level of p) over p ranks. shift < 0: the identity
/// layout; otherwise position q holds rank (q·k + shift) mod p, with k the smallest number
/// above p/2 coprime to p: a layout far from the identity.
inline topo::Hierarchy layout(const std::vector<int>& factors, int p, int shift) {
  topo::Hierarchy h;
  h.factors = factors.empty() ? std::vector<int>{p} : factors;
  h.names.assign(h.factors.size(), "test");
  int k = 1;
  for (int c = p / 2 + 1; shift >= 0 && p > 1 && c < 2 * p + 2; ++c)
    if (std::gcd(c, p) == 1) {
      k = c;
      break;
    }
  if (shift < 0) shift = 0;
  for (int q = 0; q < p; ++q) h.rank_at.push_back((q * k + shift) % p);
  h.position_of.assign(static_cast<size_t>(p), -1);
  for (int q = 0; q < p; ++q) h.position_of[static_cast<size_t>(h.rank_at[static_cast<size_t>(q)])] = q;
  return h;
}

inline std::string text(const std::vector<int>& f) {
  std::string s;
  for (int x : f) s += (s.empty() ? "" : "x") + std::to_string(x);
  return s.empty() ? "1" : s;
}

}  // namespace streamcoll::testing
