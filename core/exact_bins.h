// Exact sums: a float32 reduction whose result depends on the multiset of its terms
// alone, never on their order, their split over threads, blocks or ranks, or the
// device. docs/numerics.md explains the choice; this header is the arithmetic, shared
// by the CPU paths and (compiled by nvcc) the CUDA kernels, so both give the same bits.
//
// A term is a double that is exact by construction: a float32, or the product of two
// float32s (24 + 24 significant bits fit in 53). Terms are accumulated without any
// rounding into kBins "bins" of doubles, then moved ("flushed") into int64 digits;
// the digits of partial sums, of any number of threads or ranks, add as integers; and
// the total is rounded once, to nearest even, to a float (or a double for norms: the
// last section of this header).
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

// One running sum that flushes itself: its bins go into `digits` (kDigits words,
// `stride` apart) after every kTermsPerFlush terms, before a bin could lose a bit, and
// at finish(). What a host loop over any number of terms keeps, in place of counting
// them itself.
class FlushingSum {
 public:
  explicit FlushingSum(int64_t* digits, int64_t stride = 1) : digits_(digits), stride_(stride) {
    bins_.clear();
  }
  void add(double term) {
    bins_.add(term);
    if (++pending_ == kTermsPerFlush) finish();
  }
  // Flushes the terms added since the last flush; more may follow.
  void finish() {
    bins_.flush(digits_, stride_);
    pending_ = 0;
  }

 private:
  BinnedSum bins_;
  int64_t* digits_;
  int64_t stride_;
  int64_t pending_ = 0;  // terms in the bins since the last flush
};

// ---------------------------------------------------------------- rounding
//
// Rounding an exact sum's digits once, to nearest even, to a float or
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
