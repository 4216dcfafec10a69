// Fixed-point shortcuts into the exact sums' digits (core/exact_bins.h), for the fast
// paths: sums that are already integers in some power-of-two unit (a count of signs, a
// fixed-point accumulator of x, the |d| of an L1 loss) enter the digits as slices,
// without one extraction into the bins per term. Each gives the digits' value a
// BinnedSum of the same terms would hold; the tests (tests/core/scaled_integer_test.cpp,
// tests/core/exact_bins_test.cpp) compare them. The plain reference never needs them.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/exact_bins.h"
#include "core/host_device.h"

namespace seqpar::exact {

// Adds the exact value p * 2^t to one sum's digits (kDigits words, `stride` apart), for
// callers whose partial sums are already integers in some power-of-two unit (a count,
// a fixed-point accumulator): p is cut into kBinBits-bit slices aligned with the bins'
// units, each added to its bin with p's sign; what lies above the top bin goes to it
// whole. Requires kLowestExponent <= t < kTopBinExponent + kBinBits and
// |p| * 2^t < 2^(kTopBinExponent + 62) (the top digit stays within int64); each other
// digit changes by less than 2^kBinBits, far inside the kMaxTerms budget of a term.
// |p| < 2^93, so that p shifted to its bin's boundary fits in 128 bits.
//
// The loop visits every bin, each at a constant index once unrolled: on a GPU a local
// array indexed at run time lives in local memory, and a kernel's digits are such an
// array.
SEQPAR_HOST_DEVICE void add_scaled_integer(int64_t* digits, int64_t stride, Int128 p, int t) {
  if (p == 0) return;
  const bool negative = p < 0;
  const int offset = t - kLowestExponent;          // p's unit, in bits above 2^-149
  const int lowest = kBins - 1 - offset / kBinBits;  // the bin of p's lowest bit
  UInt128 magnitude = static_cast<UInt128>(negative ? -p : p) << (offset % kBinBits);
  constexpr uint64_t kSliceMask = (uint64_t{1} << kBinBits) - 1;
  for (int k = kBins - 1; k >= 0; --k) {
    if (k > lowest) continue;  // below p's lowest bit
    const auto slice = static_cast<int64_t>(k == 0 ? static_cast<uint64_t>(magnitude)
                                                   : static_cast<uint64_t>(magnitude) & kSliceMask);
    digits[k * stride] += negative ? -slice : slice;
    magnitude >>= kBinBits;
  }
}

// add_scaled_integer's slices for the common product of an int64 and a float's
// significand (a fixed-point sum times a factor's significand, as a one-magnitude dW
// forms it) without 128-bit arithmetic beyond one wide multiply: |integer| times the
// significand (below 2^87), shifted to its lowest bin's boundary (below 2^118), is four
// kBinBits-bit slices, signed as the integer, for bins lowest, lowest - 1, ..,
// lowest - 3. False, and nothing written, when those would reach above bin 0 (a unit of
// 2^37 or more, which add_scaled_integer handles by giving bin 0 the rest).
SEQPAR_HOST_DEVICE bool slice_scaled_product(int64_t integer, uint32_t significand, int t,
                                             int64_t (&slices)[4], int& lowest) {
  const int offset = t - kLowestExponent;  // the product's unit, in bits above 2^-149
  lowest = kBins - 1 - offset / kBinBits;
  if (lowest < 3) return false;
  const int shift = offset % kBinBits;
  const bool negative = integer < 0;
  const uint64_t magnitude = negative ? 0 - static_cast<uint64_t>(integer) : static_cast<uint64_t>(integer);
  const uint64_t low = magnitude * significand;
#ifdef __CUDA_ARCH__
  const uint64_t high = __umul64hi(magnitude, significand);
#else
  const uint64_t high = static_cast<uint64_t>((static_cast<UInt128>(magnitude) * significand) >> 64);
#endif
  // (high, low) << shift, shift < 31: high stays below 2^54.
  const uint64_t shifted_low = low << shift;
  const uint64_t shifted_high = (high << shift) | ((low >> 1) >> (63 - shift));
  constexpr uint64_t kSliceMask = (uint64_t{1} << kBinBits) - 1;
  const uint64_t parts[4] = {shifted_low & kSliceMask, (shifted_low >> kBinBits) & kSliceMask,
                             ((shifted_low >> (2 * kBinBits)) | (shifted_high << (64 - 2 * kBinBits))) &
                                 kSliceMask,
                             shifted_high >> (3 * kBinBits - 64)};
  for (int i = 0; i < 4; ++i) {
    const auto part = static_cast<int64_t>(parts[i]);
    slices[i] = negative ? -part : part;
  }
  return true;
}

// A float's bits, the same on the host and the device.
SEQPAR_HOST_DEVICE uint32_t float_bits(float value) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(value);
#else
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
#endif
}

// The binade of a nonzero finite float's magnitude from its bits (sign cleared): top
// with 2^top <= |value| < 2^(top + 1), subnormals included. A fixed-point window of a
// column (the one-magnitude dW's, the CRT dW's) is placed below its largest element's.
SEQPAR_HOST_DEVICE int binade_of_magnitude(uint32_t magnitude_bits) {
  if ((magnitude_bits >> 23) == 0) {  // subnormal: magnitude_bits * 2^-149
#ifdef __CUDA_ARCH__
    const int leading = __clz(static_cast<int>(magnitude_bits));
#else
    const int leading = __builtin_clz(magnitude_bits);
#endif
    return 31 - leading + kLowestExponent;
  }
  return static_cast<int>(magnitude_bits >> 23) - 127;
}

// The sum of the terms (double)scale * (double)|a| over float32s a (an L1 loss's
// terms): the value a BinnedSum of those terms holds, for a fraction of its work.
//
// An |a| in [2^-33, 2^8) is an integer number of units 2^-56 below 2^64 (its 24-bit
// significand shifted left by at most 40 bits), so such |a| are summed as integers, in
// one 128-bit fixed-point sum, with no rounding and no extraction into bins; the sum
// is multiplied by scale once, when it is flushed. Every other nonzero |a| (larger,
// tinier, subnormal, infinite, NaN) is added to a BinnedSum as the term scale * |a|.
// The two agree exactly: scale * Σ|a| = Σ scale * |a| when every product lies on the
// bins' grid and below the terms' limit, which holds when scale's lowest significant
// bit is at least 2^-93 and |scale| < 2^121 (integer_path). For any other scale (a tiny,
// huge or non-finite one) every term takes the binned path. The flush is the caller's,
// as for a BinnedSum: at least every kTermsPerFlush terms.
class ScaledAbsSum {
 public:
  SEQPAR_HOST_DEVICE explicit ScaledAbsSum(float scale) : scale_(scale) {
    binned_.clear();
    const uint32_t bits = float_bits(scale) & 0x7fffffffu;
    const uint32_t field = bits >> 23;
    const bool negative = float_bits(scale) >> 31 != 0;
    // scale = significand * 2^exponent, the significand an integer below 2^24
    if (field == 0) {
      significand_ = bits;
      exponent_ = kLowestExponent;
    } else {
      significand_ = (bits & 0x7fffffu) | 0x800000u;
      exponent_ = static_cast<int>(field) - 150;
    }
    if (negative) significand_ = -significand_;
    integer_path_ = field < 255 && exponent_ - kFixedUnitBits >= kLowestExponent &&
                    exponent_ + 24 <= kLargestScaleExponent;
  }

  // Whether the |a| in [2^-33, 2^8) are summed as integers (this scale allows it).
  SEQPAR_HOST_DEVICE bool integer_path() const { return integer_path_; }

  SEQPAR_HOST_DEVICE void add_abs(float a) {
    const uint32_t bits = float_bits(a) & 0x7fffffffu;  // |a|
    if (integer_path_ && bits - kFixedLowBits < kFixedSpanBits) {  // below the range wraps high
      const uint64_t significand = (bits & 0x7fffffu) | 0x800000u;
      fixed_ += significand << ((bits >> 23) - (kFixedLowBits >> 23));
    } else if (bits != 0 || !integer_path_) {  // a zero |a| with a finite scale adds +0
      binned_.add(static_cast<double>(scale_) * static_cast<double>(std::fabs(a)));
    }
  }

  // Adds the sum into `digits` (kDigits words, `stride` apart) and clears it. The
  // fixed-point sum is at most 2^64 units a term, below 2^87 for kTermsPerFlush terms:
  // its two 64-bit halves times the significand (below 2^88 each) go in exactly.
  SEQPAR_HOST_DEVICE void flush(int64_t* digits, int64_t stride = 1) {
    const auto low = static_cast<uint64_t>(fixed_);
    const auto high = static_cast<uint64_t>(fixed_ >> 64);
    add_scaled_integer(digits, stride, Int128{low} * significand_, exponent_ - kFixedUnitBits);
    add_scaled_integer(digits, stride, Int128{high} * significand_,
                       exponent_ - kFixedUnitBits + 64);
    fixed_ = 0;
    binned_.flush(digits, stride);
  }

 private:
  static constexpr int kFixedUnitBits = 56;  // the fixed-point unit, 2^-56
  // |a| in [2^-33, 2^8): exponent fields 94 .. 134, as a range of |a|'s bits
  static constexpr uint32_t kFixedLowBits = uint32_t{127 - 33} << 23;
  static constexpr uint32_t kFixedSpanBits = uint32_t{8 + 33} << 23;
  // A product of |a| < 2^8 and |scale| < 2^121 stays below term_limit().
  static constexpr int kLargestScaleExponent = 121;
  static_assert(8 + kLargestScaleExponent == 129, "products below the terms' limit");
  static_assert(64 - 24 == 8 - (-33) - 1, "the largest |a|, shifted, fits in 64 bits");

  float scale_;
  int64_t significand_;
  int exponent_;
  bool integer_path_;
  UInt128 fixed_ = 0;
  BinnedSum binned_;
};

}  // namespace seqpar::exact
