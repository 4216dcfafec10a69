// Helpers of the CRT dW tests (exact_dw_crt_test.cpp on the CPU, exact_dw_crt_cuda_test.cpp
// on the GPU): inputs over chosen exponent ranges with zeros, NaN and infinities, and the
// comparison of two sets of digits by their exact values.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/exact_bins.h"
#include "core/exact_sums.h"
#include "core/tensor.h"

namespace seqpar::test::crt_dw {

// One operand's values: normal samples times 2^e, e uniform in [low, high]; a fraction
// of ±0, and a fraction of NaN, +inf and -inf (a third each).
struct Spread {
  int low = 0, high = 0;
  double zeros = 0.0, specials = 0.0;
};

struct Case {
  std::string name;
  int64_t rows, in, out;
  Spread dy, x;
};

inline std::vector<float> spread_values(std::mt19937_64& rng, int64_t count, const Spread& s) {
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> exponent(s.low, s.high);
  std::uniform_real_distribution<double> uniform;
  std::vector<float> values(static_cast<size_t>(count));
  for (float& value : values) {
    const double u = uniform(rng);
    if (u < s.specials / 3) {
      value = std::numeric_limits<float>::quiet_NaN();
    } else if (u < 2 * s.specials / 3) {
      value = std::numeric_limits<float>::infinity();
    } else if (u < s.specials) {
      value = -std::numeric_limits<float>::infinity();
    } else if (u < s.specials + s.zeros) {
      value = u < s.specials + s.zeros / 2 ? 0.0f : -0.0f;
    } else {
      value = std::ldexp(normal(rng), exponent(rng));  // may round to a subnormal or 0
    }
  }
  return values;
}

inline Tensor matrix(std::mt19937_64& rng, int64_t rows, int64_t cols, const Spread& s) {
  return Tensor::from_data({rows, cols}, spread_values(rng, rows * cols, s));
}

// The cases both tests run: exponent ranges that reach every part of the scheme.
inline std::vector<Case> cases() {
  return {
      {"randn", 700, 37, 11, {0, 0}, {0, 0}},
      {"mixed binades, many outside", 513, 20, 9, {-30, 30}, {-20, 20}},
      {"zeros, NaN and infinities", 300, 19, 7, {-3, 3, 0.1, 0.01}, {-3, 3, 0.1, 0.01}},
      {"subnormal x", 257, 17, 5, {-10, 10}, {-140, -125}},
      {"tiny both: x's units raised", 400, 16, 8, {-85, -75}, {-45, -35}},
      {"tiny products below the grid", 200, 13, 6, {-80, -60}, {-90, -70}},
      {"huge both: pairs past 2^129 take the binned sum", 150, 9, 4, {60, 66}, {58, 64, 0.0, 0.02}},
      {"huge dy, small x", 333, 12, 5, {100, 110}, {-30, -10}},
      {"one row", 1, 5, 3, {-5, 5}, {-5, 5}},
      {"wide spread: nearly all outside", 120, 15, 6, {-120, 120}, {-100, 100}},
  };
}

// What a sum's flags word makes of it: finite (0), +inf (1), -inf (2) or NaN (3).
inline int outcome(int64_t flags) {
  const bool nan = flags / exact::kNaNFlag != 0;
  const bool positive = (flags & exact::kFlagFieldMask) != 0;
  const bool negative = ((flags / exact::kNegativeInfinityFlag) & exact::kFlagFieldMask) != 0;
  if (nan || (positive && negative)) return 3;
  return positive ? 1 : negative ? 2 : 0;
}

// How many of the first `count` sums differ in exact value (digits may carry differently
// between bins: the difference's exact value must be 0, which its rounding to double
// tells, since a nonzero multiple of 2^-149 rounds to a nonzero double) or in what their
// flags make of them. a and b on the host, each with its own count (digit stride).
inline int64_t differing_sums(const std::vector<int64_t>& a, int64_t a_stride, const std::vector<int64_t>& b,
                              int64_t b_stride, int64_t count) {
  int64_t differing = 0;
  for (int64_t i = 0; i < count; ++i) {
    int64_t difference[exact::kDigits] = {};
    for (int d = 0; d < exact::kBins; ++d) {
      difference[d] = a[static_cast<size_t>(d * a_stride + i)] - b[static_cast<size_t>(d * b_stride + i)];
    }
    const int64_t a_flags = a[static_cast<size_t>(exact::kSpecialDigit * a_stride + i)];
    const int64_t b_flags = b[static_cast<size_t>(exact::kSpecialDigit * b_stride + i)];
    if (outcome(a_flags) != outcome(b_flags) || exact::round_to_double(difference) != 0.0) ++differing;
  }
  return differing;
}

}  // namespace seqpar::test::crt_dw
