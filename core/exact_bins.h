// Exact sums: a float32 reduction whose result depends on the multiset of its terms
// alone, never on their order, their split over threads, blocks or ranks, or the
// device. docs/numerics.md explains the choice; this header is the arithmetic, shared
// by the CPU paths and (compiled by nvcc) the CUDA kernels, so both give the same bits.
//
// A term is a double that is exact by construction: a float32, or the product of two
// float32s (24 + 24 significant bits fit in 53). Terms are accumulated without any
// rounding into kBins "bins" of doubles, then moved ("flushed") into int64 digits;
// the digits of partial sums, of any number of threads or ranks, add as integers; and
// the total is rounded once, to nearest even, to a float (or a double for norms:
// core/exact_rounding.h).
//
// Bins (the idea of ReproBLAS's binned sums, with boundaries fixed once and for all so
// that no two placements can disagree): bin k holds multiples of 2^b_k, with
// b_k = 99 - 31 k, k = 0..8, so the grid runs from 2^-149 to 2^129. A term t is split
// from the top: p_k = (r + C_k) - C_k with C_k = 1.5 * 2^(b_k + 52) is r rounded to
// the nearest multiple of 2^b_k (exactly: r + C_k lies in a binade whose spacing is
// 2^b_k), and r - p_k, the rest, is exact. Each rest is at most 2^(b_k - 1), so each
// part below the top is at most 2^30 units of its bin, and the top part (|t| < 2^129)
// below 2^30 of its own; a bin's double sum stays exact for 2^23 terms
// (2^23 * 2^30 = 2^53), after which it is flushed into the digits. Nine bins of 31 bits
// rather than eight of 35: one more extraction a term buys 2^32 terms a sum instead of
// 2^28 (an L1 loss over 2^20 rows of 1024 outputs sums 2^30).
//
// The exactness domain (tested on both sides in tests/core/exact_bins_test.cpp):
//   - every term that is a multiple of 2^-149 with |t| < 2^129 is summed exactly:
//     every finite float32 (subnormals included), and every product of two float32s
//     whose exponents add to at least -103 (e.g. both factors at least 2^-51);
//   - a finite term below that grid is rounded to the nearest multiple of 2^-149
//     (ties to even) before it is added: the same rule on every device and split;
//   - a term with |t| >= 2^129 (a product of two large floats) overflows to +-inf, as
//     a float32 sum that large would; non-finite terms give the IEEE sum of the non-finite terms
//     (NaN if any is NaN or both infinities occur, else the infinity): an order-free rule;
//   - at most kMaxTerms terms per sum (rows times ranks); callers check their counts.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "core/host_device.h"

namespace seqpar::exact {

constexpr int kBins = 9;
constexpr int kBinBits = 31;
constexpr int kTopBinExponent = 99;  // b_0; b_k = 99 - 31 k, the last is -149
constexpr int kLowestExponent = kTopBinExponent - (kBins - 1) * kBinBits;
static_assert(kLowestExponent == -149, "the grid reaches float32's smallest subnormal");
// Digits per sum: one per bin, then one word of flags for non-finite results.
constexpr int kDigits = kBins + 1;
constexpr int kSpecialDigit = kBins;
// A bin's double sum stays exact for this many terms between flushes.
constexpr int64_t kTermsPerFlush = int64_t{1} << 23;
// Digits stay within int64 for this many terms in all: at most 2^30 units a term in
// any bin, 2^32 * 2^30 = 2^62.
constexpr int64_t kMaxTerms = int64_t{1} << 32;

// The exponent of bin k's unit, and the constant that rounds to it.
SEQPAR_HOST_DEVICE constexpr int bin_exponent(int k) { return kTopBinExponent - k * kBinBits; }

// Powers of two as constants: these sit in the innermost loop of every exact sum, where
// a call to ldexp per term would cost more than the sum itself. (In unrolled loops k is
// a constant and the switch disappears.)
SEQPAR_HOST_DEVICE constexpr double bin_unit(int k) {  // 2^b_k
  switch (k) {
    case 0: return 0x1p99;
    case 1: return 0x1p68;
    case 2: return 0x1p37;
    case 3: return 0x1p6;
    case 4: return 0x1p-25;
    case 5: return 0x1p-56;
    case 6: return 0x1p-87;
    case 7: return 0x1p-118;
    default: return 0x1p-149;
  }
}
SEQPAR_HOST_DEVICE constexpr double inverse_bin_unit(int k) {  // 2^-b_k
  switch (k) {
    case 0: return 0x1p-99;
    case 1: return 0x1p-68;
    case 2: return 0x1p-37;
    case 3: return 0x1p-6;
    case 4: return 0x1p25;
    case 5: return 0x1p56;
    case 6: return 0x1p87;
    case 7: return 0x1p118;
    default: return 0x1p149;
  }
}
namespace detail {
constexpr double power_of_two(int exponent) {  // exact, for the checks below
  double value = 1.0;
  for (int i = 0; i < exponent; ++i) value *= 2.0;
  for (int i = 0; i > exponent; --i) value *= 0.5;
  return value;
}
constexpr bool units_match_exponents() {
  for (int k = 0; k < kBins; ++k) {
    if (bin_unit(k) != power_of_two(bin_exponent(k))) return false;
    if (inverse_bin_unit(k) != power_of_two(-bin_exponent(k))) return false;
  }
  return true;
}
static_assert(units_match_exponents(), "the bins' units are 2^b_k");
}  // namespace detail

// r + C_k lands in a binade whose spacing is 2^b_k: C_k = 1.5 * 2^(b_k + 52).
SEQPAR_HOST_DEVICE constexpr double bin_rounder(int k) { return 1.5 * 0x1p52 * bin_unit(k); }
// Terms at or above this magnitude leave the bins' range.
SEQPAR_HOST_DEVICE constexpr double term_limit() { return 0x1p129; }
static_assert(term_limit() == 0x1p30 * bin_unit(0), "terms below 2^30 units of the top bin");
// The budget above: a part is at most 2^(kBinBits - 1) units, a flush of kTermsPerFlush
// of them is exact in a double, and kMaxTerms of them keep a digit below 2^62.
static_assert(kTermsPerFlush << (kBinBits - 1) == (int64_t{1} << 53), "a bin exact until flushed");
static_assert(kMaxTerms << (kBinBits - 1) == (int64_t{1} << 62), "digits within int64");

// Flags for non-finite results. Within one set of digits they are or-ed (flush, and
// the kernels' atomicOr); digits of different ranks are added, so each field counts
// the ranks that saw that value, and the fields never carry into each other below
// 2^21 ranks.
constexpr int64_t kPositiveInfinityFlag = int64_t{1};
constexpr int64_t kNegativeInfinityFlag = int64_t{1} << 21;
constexpr int64_t kNaNFlag = int64_t{1} << 42;
constexpr int64_t kFlagFieldMask = (int64_t{1} << 21) - 1;

SEQPAR_HOST_DEVICE int64_t special_flags(double special) {
  if (special != special) return kNaNFlag;
  if (special > 0) return kPositiveInfinityFlag;
  if (special < 0) return kNegativeInfinityFlag;
  return 0;
}

// Running exact sums, kLanes of them side by side (the CPU loops add 8 terms at a
// time, one per lane, which the compiler turns into vector instructions; a GPU thread
// keeps one). Per lane: the bins, and the IEEE sum of the terms that are not finite or
// too large (0, +-inf or NaN, whatever their order).
template <int kLanes>
struct BinnedSums {
  double bin[kBins][kLanes];
  double special[kLanes];

  SEQPAR_HOST_DEVICE void clear() {
    for (int k = 0; k < kBins; ++k) {
      for (int l = 0; l < kLanes; ++l) bin[k][l] = 0.0;
    }
    for (int l = 0; l < kLanes; ++l) special[l] = 0.0;
  }

  // kFirstBin > 0 skips bins 0 .. kFirstBin - 1, for callers that know every term is
  // below half their units (first_reachable_bin): there the extraction gives exactly +0
  // and leaves the rest as it is, so skipping them changes no bit.
  template <int kFirstBin = 0>
  SEQPAR_HOST_DEVICE void add(const double (&terms)[kLanes]) {
    double rest[kLanes];
    for (int l = 0; l < kLanes; ++l) {
      const double term = terms[l];
      const bool in_range = std::fabs(term) < term_limit();  // false for NaN and inf too
      special[l] += in_range ? 0.0 : term * INFINITY;  // +-inf, or NaN for NaN
      rest[l] = in_range ? term : 0.0;
    }
    for (int k = kFirstBin; k < kBins; ++k) {
      const double rounder = bin_rounder(k);
      for (int l = 0; l < kLanes; ++l) {
        const double part = (rest[l] + rounder) - rounder;
        rest[l] -= part;
        bin[k][l] += part;
      }
    }
  }

  // Adds lane l's bins into `digits` (kDigits words, `stride` apart) and clears them.
  // Each bin is an integer number of its units below 2^53: the conversion is exact.
  SEQPAR_HOST_DEVICE void flush(int l, int64_t* digits, int64_t stride) {
    for (int k = 0; k < kBins; ++k) {
      digits[k * stride] += static_cast<int64_t>(bin[k][l] * inverse_bin_unit(k));  // exact
      bin[k][l] = 0.0;
    }
    digits[kSpecialDigit * stride] |= special_flags(special[l]);
    special[l] = 0.0;
  }
};

// 128-bit integers (a GCC/Clang/nvcc extension, on the host and the device), for the
// products of fixed-point sums and float significands below.
__extension__ typedef __int128 Int128;
__extension__ typedef unsigned __int128 UInt128;

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

// The first bin that a term of magnitude at most `bound` can reach: the bins before it
// have units more than twice the bound. A NaN or infinite bound reaches them all (0).
SEQPAR_HOST_DEVICE int first_reachable_bin(double bound) {
  if (!(bound < term_limit())) return 0;
  int k = 0;
  while (k < kBins - 1 && bound < 0.5 * bin_unit(k)) ++k;
  return k;
}

// One running sum: what a GPU thread or a scalar CPU loop keeps.
struct BinnedSum : BinnedSums<1> {
  SEQPAR_HOST_DEVICE void add(double term) {
    const double terms[1] = {term};
    BinnedSums<1>::add<0>(terms);
  }
  SEQPAR_HOST_DEVICE void flush(int64_t* digits, int64_t stride = 1) {
    BinnedSums<1>::flush(0, digits, stride);
  }
};

// The exact sum of two terms rounded once to double: what round_to_double gives for a
// BinnedSum of just a and b, without the bins. Each term is first taken as the bins take
// it (past term_limit() an infinity of its sign; otherwise rounded to the grid's unit
// 2^-149, ties to even, which leaves a term already on the grid unchanged since t * 2^149
// is then an integer); two such terms are below 2^130, so their IEEE sum is their
// exact sum rounded once; an exact zero is +0, and the non-finite cases follow IEEE as
// the bins' do. For a sum of two known terms, such as the norm of two tensors' norms.
SEQPAR_HOST_DEVICE double sum_of_two(double a, double b) {
  const auto on_grid = [](double t) {
    if (std::fabs(t) >= term_limit()) return t * INFINITY;  // +-inf (NaN stays NaN below)
    return std::rint(t * 0x1p149) * 0x1p-149;
  };
  const double sum = on_grid(a) + on_grid(b);
  return sum == 0.0 ? 0.0 : sum;
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
