// Rounding an exact sum's digits (core/exact_bins.h) once, to nearest even, to a float or
// a double: the last step of every exact reduction, the same function on the CPU and
// (compiled by nvcc) on the GPU.
//
// The digits are first carried into place, from the lowest bin up: each bin below the
// top keeps its value modulo 2^31 (in [0, 2^31)) and passes the rest up, so that the
// sum's sign is the top digit's and a negative sum is negated digit by digit (and
// carried again). The highest nonzero digit and the two below it then hold at least 63
// bits below the sum's leading one: enough for a double's 53, the rounding bit and more;
// the digits further down only decide the sticky bit. Rounded to nearest even at the
// target format's precision.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/exact_bins.h"
#include "core/host_device.h"

namespace seqpar::exact {

namespace detail {

SEQPAR_HOST_DEVICE int leading_zeros(uint64_t word) {
#ifdef __CUDA_ARCH__
  return __clzll(static_cast<long long>(word));
#else
  return word == 0 ? 64 : __builtin_clzll(word);
#endif
}

// Every digit but the top one into [0, 2^31), the excess carried into the bin above
// (an arithmetic shift: a floor, for negative digits too). The value is unchanged; the
// top digit stays within int64 (|digits| <= 2^62 on entry: kMaxTerms).
SEQPAR_HOST_DEVICE void carry_digits(int64_t (&d)[kBins]) {
  constexpr int64_t kMask = (int64_t{1} << kBinBits) - 1;
  for (int k = kBins - 1; k > 0; --k) {
    d[k - 1] += d[k] >> kBinBits;
    d[k] &= kMask;
  }
}

// Rounds the exact sum to Float (float or double), to nearest even, subnormals and
// overflow to infinity included.
template <typename Float>
SEQPAR_HOST_DEVICE Float round_digits(const int64_t* digits, int64_t stride) {
  const int64_t flags = digits[kSpecialDigit * stride];
  if (flags != 0) {
    const bool nan = (flags >> 42) != 0;
    const bool positive = (flags & kFlagFieldMask) != 0;
    const bool negative = ((flags >> 21) & kFlagFieldMask) != 0;
    if (nan || (positive && negative)) return std::numeric_limits<Float>::quiet_NaN();
    return positive ? std::numeric_limits<Float>::infinity()
                    : -std::numeric_limits<Float>::infinity();
  }
  int64_t d[kBins];
  for (int k = 0; k < kBins; ++k) d[k] = digits[k * stride];
  carry_digits(d);
  // The lower digits are now non-negative and below one unit of the top's bin: the sum
  // is negative exactly when the top digit is.
  const bool negative = d[0] < 0;
  if (negative) {
    for (int k = 0; k < kBins; ++k) d[k] = -d[k];
    carry_digits(d);
  }
  int first = 0;  // the highest nonzero digit
  while (first < kBins && d[first] == 0) ++first;
  if (first == kBins) return Float(0);  // an exact zero is +0, whatever the terms' signs
  // Digits first .. first + 2 side by side (they do not overlap: the lower two are below
  // 2^31), in units of 2^(b_(first + 2)); a missing digit is 0. At the first digit's
  // bit 0 the window holds its bit 62, so the leading one is at bit 62 or above.
  UInt128 window = static_cast<UInt128>(d[first]) << (2 * kBinBits);
  if (first + 1 < kBins) window |= static_cast<UInt128>(d[first + 1]) << kBinBits;
  if (first + 2 < kBins) window |= static_cast<UInt128>(d[first + 2]);
  bool rest = false;  // any nonzero digit below the window
  for (int k = first + 3; k < kBins; ++k) rest = rest || d[k] != 0;
  // Positions in units of 2^-149 (bin 8's unit is 2^-149, bin k's 2^(31 (8 - k) - 149)).
  const int window_low = kBinBits * (kBins - 3 - first);  // the window's bit 0; < 0 near the grid's end
  const uint64_t window_high = static_cast<uint64_t>(window >> 64);
  const int top = window_low + (window_high != 0 ? 127 - leading_zeros(window_high)
                                                  : 63 - leading_zeros(static_cast<uint64_t>(window)));
  constexpr int kPrecision = std::numeric_limits<Float>::digits;  // 24 or 53
  // The lowest kept bit: precision bits below the top, but never below the format's
  // smallest subnormal (2^-149 for float; doubles reach far lower) nor below the grid.
  const int subnormal_floor = std::numeric_limits<Float>::min_exponent - kPrecision - kLowestExponent;
  int low = top - kPrecision + 1;
  if (low < subnormal_floor) low = subnormal_floor;
  if (low < 0) low = 0;
  // At least 10 bits below the kept ones lie in the window (the top is at its bit 62 or
  // above), so the shift is in [10, 127].
  const int shift = low - window_low;
  uint64_t kept = static_cast<uint64_t>(window >> shift);
  const bool half = ((window >> (shift - 1)) & 1u) != 0;
  const bool sticky = rest || (window & ((static_cast<UInt128>(1) << (shift - 1)) - 1)) != 0;
  if (half && (sticky || (kept & 1u))) ++kept;  // may carry into one more bit: still exact
  // kept * 2^(low - 149): both factors exact in double, and ldexp rounds nothing
  // unless the result leaves Float's range, where it becomes infinity as it should.
  const double magnitude = std::ldexp(static_cast<double>(kept), low + kLowestExponent);
  const Float rounded = static_cast<Float>(magnitude);
  return negative ? -rounded : rounded;
}

}  // namespace detail

// The exact sum held in `digits` (kDigits words, `stride` apart), rounded once.
SEQPAR_HOST_DEVICE float round_to_float(const int64_t* digits, int64_t stride = 1) {
  return detail::round_digits<float>(digits, stride);
}
SEQPAR_HOST_DEVICE double round_to_double(const int64_t* digits, int64_t stride = 1) {
  return detail::round_digits<double>(digits, stride);
}

// The exact sum of a few floats (`count` of them, `stride` apart), rounded once: for
// values that meet from different places, such as the query heads that share one kv
// head in attention's backward, whose order of arrival must not matter. count is at
// most kTermsPerFlush.
SEQPAR_HOST_DEVICE float rounded_exact_sum(const float* terms, int64_t count, int64_t stride = 1) {
  BinnedSum sum;
  sum.clear();
  for (int64_t n = 0; n < count; ++n) sum.add(terms[n * stride]);
  int64_t digits[kDigits] = {};
  sum.flush(digits);
  return round_to_float(digits);
}

}  // namespace seqpar::exact
