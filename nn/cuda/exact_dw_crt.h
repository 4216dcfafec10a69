// Exact dW = dyᵀ x for any dy on the integer tensor cores, by the Chinese remainder
// theorem (the idea of Ozaki scheme II): the arithmetic that the CUDA kernels
// (nn/cuda/exact_dw_crt.cu) and the CPU test's model of them share, compiled by both.
//
// The value to reproduce is the reference's (nn/reference/linear.h): dW[j, k] is the
// exact sum over the rows of the terms dy[row, j] x[row, k] by the rules of
// core/exact_bins.h, rounded once. It is split in two exact parts:
//
//  1. Windows. Column c of dy or x gets a unit 2^u_c from its largest |element|
//     (2^top <= largest < 2^(top+1)): u_c = top + 1 - W, W = window_bits. An element v
//     is INSIDE its column's window when it is finite and V = v 2^-u_c is an integer
//     (then |V| < 2^W); else (NaN, inf, bits below the unit) it is OUTSIDE. The units
//     never go below 2^-149 (every float is a multiple of it), and x's are raised so
//     that u_j + u_k >= -149 for every pair: every product of two inside elements is a
//     multiple of 2^-149, a term the bins hold without rounding.
//  2. Integers. For a pair of columns with windows, the inside terms sum to
//     2^(u_j + u_k) S with S = Σ DY X, |S| < rows 2^(2W). S is found modulo
//     `moduli` pairwise coprime odd moduli below 256 (one int8 GEMM each: residues in
//     [-127, 127], int32 sums exact for 131,072 rows; the chunks' sums are reduced
//     modulo m between them), then by Garner's mixed radix, exactly, as a signed 128-bit
//     integer: the moduli's product exceeds 2 rows 2^(2W). S 2^(u_j + u_k) goes into
//     the sum's digits cut at the bins' boundaries (add_wide_scaled_integer).
//  3. The rest, term by term through a one-term binned sum (the reference's rules for
//     rounding below the grid, 2^129 and NaN/inf): for an x element outside its
//     window, its products with every dy of its row; for a dy element outside, its
//     products with the x elements of its row that are inside (the others were in
//     the first list).
//  4. A pair whose largest product could reach 2^129 would need the bins' overflow
//     rule (an infinity in the special word) on some inside terms: the
//     whole pair takes the binned sum over every row instead, and neither 2 nor 3
//     touches it. Only columns whose largest elements multiply to 2^128 or more
//     (both near 2^64, say) take it.
//
// Every term lands in exactly one of 2, 3 or 4, and each part is the exact value of
// its terms under the bins' rules, so the digits hold the reference's exact value: the
// same bits once rounded, whatever the split of the rows.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/exact_bins.h"
#include "core/exact_fixed_point.h"
#include "core/host_device.h"
#include "core/exact_sums.h"
#include "nn/rows.h"
#include "seqpar/config.h"

namespace seqpar::nn::detail {

namespace crt {

// The moduli, largest first: pairwise coprime and odd, so that a symmetric residue lies
// in [-127, 127]. 255 = 3 5 17, 253 = 11 23, 247 = 13 19, 217 = 7 31; the rest primes.
constexpr int kMaxModuli = 16;
SEQPAR_HOST_DEVICE constexpr int modulus(int i) {
  constexpr int kModuli[kMaxModuli] = {255, 253, 251, 247, 241, 239, 233, 229,
                                       227, 223, 217, 211, 199, 197, 193, 191};
  return kModuli[i];
}
// Windows of fewer bits leave more elements outside (from randn about 2^(17 - W) of
// them: each costs `out` or `in` binned terms); more bits need more moduli (each
// another int8 GEMM of the whole shape). 39 bits need 12 moduli for the seed shape's
// 12,000 rows and 13 for 2^20 rows; plan_for_rows then widens the window to what those
// moduli allow. Above 44 bits the residues' 32-bit arithmetic (window_digits) would not
// hold V, and the sixteen moduli would no longer cover 2^32 rows.
constexpr int kMinWindowBits = 39;
constexpr int kMaxWindowBits = 44;
// Rows of one int8 product: |residue| <= 127, 131,072 * 127^2 < 2^31.
constexpr int64_t kRowsPerProduct = int64_t{1} << 17;
static_assert(kRowsPerProduct * 127 * 127 < (int64_t{1} << 31), "a product's int32 sums stay in range");

// The moduli in use and Garner's constants, built once on the host (crt_table) and
// passed by value to the kernels.
struct Table {
  int count;
  int moduli[kMaxModuli];
  int inverses[kMaxModuli][kMaxModuli];  // inverses[j][i] = m_j^-1 mod m_i, for j < i
  exact::UInt128 product;                // Π m_i
};

// How many moduli and how wide a window a call over `rows` rows takes: the fewest
// moduli whose product exceeds 2 rows (2^kMinWindowBits - 1)^2, then the widest window
// (up to kMaxWindowBits) they still cover.
struct Plan {
  int moduli;
  int window_bits;
};
Plan plan_for_rows(int64_t rows);  // rows in [1, exact::kMaxTerms]
Table crt_table(int moduli);

// Kinds of column: all ±0 (and NaN), with a window, or none (it holds an infinity: the
// column maxima pass counts infinities, so no unit can be set; every element outside).
constexpr int kZeroColumn = 0;
constexpr int kWindowColumn = 1;
constexpr int kNoWindowColumn = 2;
// A unit above any a window can have: "no dy column sets a bound" in raise_unit.
constexpr int kNoUnit = 1 << 20;

struct ColumnWindow {
  int kind;
  int unit;  // u: the window's integers count units of 2^u
  int top;   // 2^top <= the column's largest |element| < 2^(top + 1)
};

// From the bits of a column's largest |element| (column_maxima_cuda's: NaN passed over,
// an infinity 0x7f800000).
SEQPAR_HOST_DEVICE ColumnWindow column_window(unsigned int largest_bits, int window_bits) {
  if (largest_bits >= 0x7f800000u) return {kNoWindowColumn, 0, 0};
  if (largest_bits == 0) return {kZeroColumn, 0, 0};
  const int top = exact::binade_of_magnitude(largest_bits);
  const int unit = top + 1 - window_bits;
  return {kWindowColumn, unit > exact::kLowestExponent ? unit : exact::kLowestExponent, top};
}

// x's column window with its unit raised so that every product with a dy window (unit at
// least lowest_dy_unit, the least over dy's window columns) is on the 2^-149 grid.
SEQPAR_HOST_DEVICE ColumnWindow raise_unit(ColumnWindow x, int lowest_dy_unit) {
  const int least = exact::kLowestExponent - lowest_dy_unit;
  if (x.kind == kWindowColumn && x.unit < least) x.unit = least;
  return x;
}

// Whether dW[j, k] takes the binned sum over every row (part 4 above): both columns have
// windows and a product of their elements could reach 2^129.
SEQPAR_HOST_DEVICE bool pair_binned_whole(const ColumnWindow& dy, const ColumnWindow& x) {
  return dy.kind == kWindowColumn && x.kind == kWindowColumn && dy.top + x.top + 2 > 129;
}
// Whether dW[j, k] has an integer part (part 2).
SEQPAR_HOST_DEVICE bool pair_takes_integers(const ColumnWindow& dy, const ColumnWindow& x) {
  return dy.kind == kWindowColumn && x.kind == kWindowColumn && !pair_binned_whole(dy, x);
}

// 2^e as a double, exactly, for -1022 <= e <= 1023 (from its bits: no ldexp in a kernel).
SEQPAR_HOST_DEVICE double power_of_two(int e) {
  const auto bits = static_cast<uint64_t>(1023 + e) << 52;
#ifdef __CUDA_ARCH__
  return __longlong_as_double(static_cast<long long>(bits));
#else
  double value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
#endif
}

// What the inside test needs of a column: 2^-u, and 2^W (0 for a column without a
// window, which nothing is inside).
struct WindowScale {
  double scale, limit;
};
SEQPAR_HOST_DEVICE WindowScale window_scale(const ColumnWindow& w, int window_bits) {
  if (w.kind == kNoWindowColumn) return {0.0, 0.0};
  if (w.kind == kZeroColumn) return {1.0, 1.0};  // only ±0 inside (a NaN is not)
  return {power_of_two(-w.unit), power_of_two(window_bits)};
}

// Whether `value` is inside the window: V = value 2^-u (exact: a power of two times a
// float, far from a double's limits) is an integer with |V| < 2^W. NaN and the
// infinities fail the comparisons. `integer` gets V.
SEQPAR_HOST_DEVICE bool inside_window(float value, const WindowScale& w, double& integer) {
  integer = static_cast<double>(value) * w.scale;
  return std::fabs(integer) < w.limit && std::rint(integer) == integer;
}

// A window's integer V, |V| < 2^kMaxWindowBits, as two unsigned digits of V + 2^44:
// high in [0, 2^23), low in [0, 2^22). Split once per element, then taken modulo every
// modulus (window_residue) in 32-bit unsigned arithmetic.
struct WindowDigits {
  uint32_t high, low;
};
SEQPAR_HOST_DEVICE WindowDigits window_digits(int64_t integer) {
  static_assert(kMaxWindowBits <= 44, "V + 2^44 is non-negative");
  const uint64_t shifted = static_cast<uint64_t>(integer + (int64_t{1} << 44));
  return {static_cast<uint32_t>(shifted >> 22), static_cast<uint32_t>(shifted & 0x3fffffu)};
}

// floor(u / m) for u < 2^31 and 128 < m < 256, by a multiply-high and a shift: with
// M = ceil(2^39 / m) (below 2^32), M m - 2^39 < m <= 2^8, so floor(u M / 2^39) is
// floor(u / m) for every u below 2^31 (Granlund and Montgomery, "Division by invariant
// integers using multiplication", 1994, theorem 4.2).
template <uint32_t kModulus>
SEQPAR_HOST_DEVICE uint32_t quotient_below_2_31(uint32_t u) {
  static_assert(kModulus > 128 && kModulus < 256, "l = 8 bits of modulus");
  constexpr uint64_t kMagic = ((uint64_t{1} << 39) + kModulus - 1) / kModulus;
  static_assert(kMagic < (uint64_t{1} << 32), "M fits a 32-bit multiply-high");
#ifdef __CUDA_ARCH__
  return __umulhi(u, static_cast<uint32_t>(kMagic)) >> 7;
#else
  return static_cast<uint32_t>((u * kMagic) >> 39);
#endif
}

// The symmetric residue, in [-(m-1)/2, (m-1)/2], of a window's integer V modulo m =
// modulus(kIndex): the kernels' inner loop. u = high (2^22 mod m) + low + a constant is
// V + (m-1)/2 modulo m (the constant takes 2^44 back out), below 2^23 m + 2^22 + 2m <
// 2^31, so u - m floor(u / m) - (m-1)/2 is the residue: a few 32-bit integer operations
// a modulus.
template <int kIndex>
SEQPAR_HOST_DEVICE int window_residue(const WindowDigits& v) {
  constexpr uint32_t kModulus = static_cast<uint32_t>(modulus(kIndex));
  constexpr uint32_t kHighWeight = (uint32_t{1} << 22) % kModulus;
  constexpr uint32_t kHalf = (kModulus - 1) / 2;
  constexpr uint32_t kBias = kHalf + (kModulus - static_cast<uint32_t>((uint64_t{1} << 44) % kModulus));
  static_assert(((uint64_t{1} << 23) - 1) * kHighWeight + (uint64_t{1} << 22) + kBias < (uint64_t{1} << 31),
                "u below 2^31");
  const uint32_t u = v.high * kHighWeight + v.low + kBias;
  return static_cast<int>(u - kModulus * quotient_below_2_31<kModulus>(u)) - static_cast<int>(kHalf);
}
template <int kIndex>
SEQPAR_HOST_DEVICE int window_residue(int64_t integer) {
  return window_residue<kIndex>(window_digits(integer));
}

// window_residue for a modulus index known only at run time (the CPU model and tests).
SEQPAR_HOST_DEVICE int window_residue_at(int64_t integer, int index) {
  switch (index) {
    case 0: return window_residue<0>(integer);
    case 1: return window_residue<1>(integer);
    case 2: return window_residue<2>(integer);
    case 3: return window_residue<3>(integer);
    case 4: return window_residue<4>(integer);
    case 5: return window_residue<5>(integer);
    case 6: return window_residue<6>(integer);
    case 7: return window_residue<7>(integer);
    case 8: return window_residue<8>(integer);
    case 9: return window_residue<9>(integer);
    case 10: return window_residue<10>(integer);
    case 11: return window_residue<11>(integer);
    case 12: return window_residue<12>(integer);
    case 13: return window_residue<13>(integer);
    case 14: return window_residue<14>(integer);
    default: return window_residue<15>(integer);
  }
}

// An int32 sum of residue products (or a running residue) as a residue in [0, m).
SEQPAR_HOST_DEVICE int reduced(int64_t sum, int modulus) {
  const int r = static_cast<int>(sum % modulus);
  return r < 0 ? r + modulus : r;
}

// The signed integer S with S = residues[i] mod m_i for every modulus, |S| < Π m_i / 2:
// Garner's mixed-radix digits, then Horner in 128 bits. residues[i] in [0, m_i).
SEQPAR_HOST_DEVICE exact::Int128 signed_value(const Table& table, const int (&residues)[kMaxModuli]) {
  int digits[kMaxModuli];
  for (int i = 0; i < kMaxModuli; ++i) {
    if (i >= table.count) break;
    const int m = table.moduli[i];
    int t = residues[i];
    for (int j = 0; j < kMaxModuli; ++j) {
      if (j >= i) break;
      t = reduced(int64_t{t - digits[j]} * table.inverses[j][i], m);
    }
    digits[i] = t;
  }
  exact::UInt128 value = 0;
  for (int i = kMaxModuli - 1; i >= 0; --i) {
    if (i < table.count) value = value * static_cast<unsigned>(table.moduli[i]) + static_cast<unsigned>(digits[i]);
  }
  if (value > table.product / 2) return static_cast<exact::Int128>(value) - static_cast<exact::Int128>(table.product);
  return static_cast<exact::Int128>(value);
}

// Adds value 2^t into one sum's digits (kDigits words, `stride` apart): |value| cut into
// kBinBits-bit slices at the bins' boundaries, each added with value's sign, what lies
// above the top bin into it whole. Unlike exact::add_scaled_integer, value may use all
// 127 bits and t any exponent from -149 up, provided |value| 2^t < 2^(99 + 62) (the top
// digit stays in int64): what S 2^(u_j + u_k) needs. Each digit below the top changes
// by less than 2^31, as a term's would.
SEQPAR_HOST_DEVICE void add_wide_scaled_integer(int64_t* digits, int64_t stride, exact::Int128 value, int t) {
  if (value == 0) return;
  const bool negative = value < 0;
  const exact::UInt128 magnitude = negative ? -static_cast<exact::UInt128>(value) : static_cast<exact::UInt128>(value);
  const auto add = [&](int bin, uint64_t slice) {
    const auto signed_slice = static_cast<int64_t>(slice);
    digits[bin * stride] += negative ? -signed_slice : signed_slice;
  };
  const int offset = t - exact::kLowestExponent;  // bits of value's unit above 2^-149
  const int lowest = exact::kBins - 1 - offset / exact::kBinBits;  // the bin of value's unit
  const int shift = offset % exact::kBinBits;  // value's unit within that bin
  if (lowest <= 0) {  // all in the top bin
    add(0, static_cast<uint64_t>(magnitude << (t - exact::kTopBinExponent)));
    return;
  }
  constexpr uint64_t kMask = (uint64_t{1} << exact::kBinBits) - 1;
  add(lowest, (static_cast<uint64_t>(magnitude) << shift) & kMask);
  exact::UInt128 rest = magnitude >> (exact::kBinBits - shift);
  for (int bin = lowest - 1; bin >= 1 && rest != 0; --bin) {
    add(bin, static_cast<uint64_t>(rest) & kMask);
    rest >>= exact::kBinBits;
  }
  if (rest != 0) add(0, static_cast<uint64_t>(rest));
}

// One term through the bins, as the reference adds it, into local digits.
SEQPAR_HOST_DEVICE void term_digits(double term, int64_t (&local)[exact::kDigits]) {
  exact::BinnedSum sum;
  sum.clear();
  sum.add(term);
  for (int64_t& digit : local) digit = 0;
  sum.flush(local, 1);
}

}  // namespace crt

#ifdef SEQPAR_WITH_CUDA
// How the CRT dW cuts its work: rows per int8 product (at most crt::kRowsPerProduct)
// and the elements outside their windows listed per chunk and operand before a chunk is
// scanned for them instead. 0: the defaults (crt::kRowsPerProduct, 65,536). The tests
// choose small ones to reach every edge; any choice gives the same bits.
struct CrtChunks {
  int64_t rows_per_product = 0, outside_capacity = 0;
};

// dW's exact sums for any dy by the scheme above, added into the first out * in sums of
// `sums` (on the GPU): digit d of sum j * in + k at sums.digits()[d * sums.count() +
// j * in + k], as accumulate_linear_grads_cuda lays them out. x_largest, dy_largest: the
// column maxima as column_maxima_cuda finds them, if the caller has them; else found here.
// Stream-ordered on the device's current stream; allocates its scratch there: residue
// planes of moduli * rows_per_product * (in + out) bytes (columns rounded up to 32,
// rows to 64), and one or two int32 products per output and modulus.
void accumulate_weight_grad_crt_cuda(const ConstRows& grad_y, const ConstRows& x, exact::ExactSums& sums,
                                     const unsigned int* x_largest = nullptr, const CrtChunks& chunks = {},
                                     const unsigned int* dy_largest = nullptr);
#endif

}  // namespace seqpar::nn::detail
