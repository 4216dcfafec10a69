// What the exact-sum tests share (tests/core/exact_bins_test.cpp,
// exact_bins_split_test.cpp): terms through the library's binned sum into digits, digit
// addition as ExactSums does it, random terms of the kinds the ops produce.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "core/exact_bins.h"
#include "tests/exact_reference.h"

namespace seqpar::test {

using Digits = std::array<int64_t, exact::kDigits>;

// The terms through one BinnedSum, flushed every kTermsPerFlush terms as the library's
// loops do, into fresh digits.
inline Digits digits_of(const std::vector<double>& terms) {
  Digits digits{};
  exact::BinnedSum sum;
  sum.clear();
  int64_t pending = 0;
  for (double term : terms) {
    sum.add(term);
    if (++pending == exact::kTermsPerFlush) {
      sum.flush(digits.data());
      pending = 0;
    }
  }
  sum.flush(digits.data());
  return digits;
}

// Digit-wise integer addition (two's complement wrap-around, as ExactSums::add).
inline void add_digits(Digits& into, const Digits& other) {
  for (int d = 0; d < exact::kDigits; ++d) {
    into[d] = static_cast<int64_t>(static_cast<uint64_t>(into[d]) + static_cast<uint64_t>(other[d]));
  }
}

inline double p2(int e) { return std::ldexp(1.0, e); }
inline float f2(int e) { return std::ldexp(1.0f, e); }

// Terms of the kinds the ops produce: float32s and products of two float32s, each
// factor's exponent in [-spread, spread].
inline std::vector<double> random_terms(std::mt19937_64& rng, size_t count, int spread) {
  std::uniform_int_distribution<int> kind(0, 2);
  std::vector<double> terms(count);
  for (double& term : terms) {
    if (kind(rng) == 0) {
      term = random_float(rng, -spread, spread);
    } else {
      term = static_cast<double>(random_float(rng, -spread, spread)) *
             static_cast<double>(random_float(rng, -spread, spread));
    }
  }
  return terms;
}

inline const float kInf = std::numeric_limits<float>::infinity();
inline const double kInfD = std::numeric_limits<double>::infinity();
inline const float kNaN = std::numeric_limits<float>::quiet_NaN();
inline const double kNaND = std::numeric_limits<double>::quiet_NaN();
inline const float kMax = std::numeric_limits<float>::max();


}  // namespace seqpar::test
