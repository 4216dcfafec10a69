// CPU kernels of Linear (nn/cpu/linear.h). Each has a portable loop that states the
// arithmetic and, where the processor has AVX-512, a vector loop doing the very same
// operations 16 floats (or 8 doubles) at a time: fma is correctly rounded and the
// exact sums' steps are plain IEEE additions, so both loops give the same bits. The
// project compiles with -ffp-contract=off, so no other multiply-add is ever fused.
#include "nn/cpu/linear.h"

#include <immintrin.h>

// GCC 12 warns that _mm512_cvtps_pd's own "undefined" source vector may be used
// uninitialized; it is fully overwritten (a known false positive of the intrinsic).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/exact_bins.h"
#include "core/exact_fixed_point.h"
#include "nn/one_magnitude.h"

namespace seqpar::nn::detail {

ConstRows const_rows_of(const Tensor& matrix) {
  SEQPAR_CHECK(matrix.dim() == 2 && (matrix.size(1) <= 1 || matrix.stride(1) == 1),
               "linear (CPU): expected a matrix with unit column stride, got shape ",
               matrix.shape());
  return {matrix.data(), matrix.size(0), matrix.size(1),
          matrix.size(0) <= 1 ? matrix.size(1) : matrix.stride(0)};
}

namespace {

bool has_avx512() {
  static const bool supported =
      __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl");
  return supported;
}

// ---------------------------------------------------------------- fma chains

constexpr int kRowBlock = 4;      // rows whose chains share each loaded b value
constexpr int64_t kLanes = 16;    // outputs per vector: b is transposed and padded to 16

// b [n, k] transposed into [k, n_padded], zero past n, so that a step of every chain of
// a row reads 16 adjacent values.
std::vector<float> transposed_padded(const ConstRows& b, int64_t n_padded) {
  std::vector<float> bt(static_cast<size_t>(b.cols * n_padded), 0.0f);
  for (int64_t n = 0; n < b.rows; ++n) {
    for (int64_t k = 0; k < b.cols; ++k) bt[k * n_padded + n] = b.data[n * b.row_stride + k];
  }
  return bt;
}

// The chains of rows `a_rows` (kRowBlock of them; repeats allowed) for outputs
// [n0, n0 + 16): sums[r][c] = fma(a[r][k], bt[k][n0 + c], sums[r][c]) for k = 0, 1, ...
void chains_portable(const float* const (&a_rows)[kRowBlock], int64_t k_count, const float* bt,
                     int64_t n_padded, int64_t n0, float (&sums)[kRowBlock][kLanes]) {
  for (int64_t k = 0; k < k_count; ++k) {
    const float* b = bt + k * n_padded + n0;
    for (int r = 0; r < kRowBlock; ++r) {
      for (int c = 0; c < kLanes; ++c) sums[r][c] = std::fma(a_rows[r][k], b[c], sums[r][c]);
    }
  }
}

__attribute__((target("avx512f,avx512vl"))) void chains_avx512(const float* const (&a_rows)[kRowBlock],
                                                      int64_t k_count, const float* bt,
                                                      int64_t n_padded, int64_t n0,
                                                      float (&sums)[kRowBlock][kLanes]) {
  __m512 s[kRowBlock];
  for (int r = 0; r < kRowBlock; ++r) s[r] = _mm512_setzero_ps();
  for (int64_t k = 0; k < k_count; ++k) {
    const __m512 b = _mm512_loadu_ps(bt + k * n_padded + n0);
    for (int r = 0; r < kRowBlock; ++r) s[r] = _mm512_fmadd_ps(_mm512_set1_ps(a_rows[r][k]), b, s[r]);
  }
  for (int r = 0; r < kRowBlock; ++r) _mm512_storeu_ps(sums[r], s[r]);
}

// ---------------------------------------------------------------- exact row sums

constexpr int kSumLanes = 8;  // doubles per AVX-512 vector

// Terms d * x[k0 + l] for l < lanes (zero past them), as exact doubles.
void products(double d, const float* x, int lanes, double (&terms)[kSumLanes]) {
  for (int l = 0; l < kSumLanes; ++l) terms[l] = l < lanes ? d * static_cast<double>(x[l]) : 0.0;
}

// Σ_i a[i] * x[i][0 .. lanes) into `digits` (sum l at digits + l, sums `stride` apart
// digit to digit); a's row i is a[i * a_stride], x's row i is x + i * x_stride.
void row_sums_portable(const float* a, int64_t a_stride, const float* x, int64_t x_stride,
                       int64_t rows, int lanes, int64_t* digits, int64_t stride) {
  exact::BinnedSums<kSumLanes> sums;
  sums.clear();
  for (int64_t i = 0; i < rows; ++i) {
    double terms[kSumLanes];
    products(a[i * a_stride], x + i * x_stride, lanes, terms);
    sums.add(terms);
    if ((i + 1) % exact::kTermsPerFlush == 0 || i + 1 == rows) {
      for (int l = 0; l < lanes; ++l) sums.flush(l, digits + l, stride);
    }
  }
}

// Moves the vector bins into `digits` (through BinnedSums::flush, the portable code)
// and clears them.
__attribute__((target("avx512f,avx512vl"))) void flush_vectors(__m512d (&bin)[exact::kBins],
                                                               __m512d& special, int lanes,
                                                               int64_t* digits, int64_t stride) {
  exact::BinnedSums<kSumLanes> sums;
  for (int k = 0; k < exact::kBins; ++k) {
    _mm512_storeu_pd(sums.bin[k], bin[k]);
    bin[k] = _mm512_setzero_pd();
  }
  _mm512_storeu_pd(sums.special, special);
  special = _mm512_setzero_pd();
  for (int l = 0; l < lanes; ++l) sums.flush(l, digits + l, stride);
}

// The same steps as exact::BinnedSums::add, eight lanes in one vector, from bin
// kFirstBin on: the caller has shown that every term is below half the unit of each
// bin before it, where the extraction gives exactly +0 and leaves the rest unchanged,
// so skipping those bins changes no bit (a data-dependent shortcut with a
// data-independent result).
template <int kFirstBin>
__attribute__((target("avx512f,avx512vl"))) void row_sums_avx512(const float* a, int64_t a_stride,
                                                        const float* x, int64_t x_stride,
                                                        int64_t rows, int lanes, int64_t* digits,
                                                        int64_t stride) {
  const __mmask8 lane_mask = static_cast<__mmask8>((1u << lanes) - 1u);
  const __m512d limit = _mm512_set1_pd(exact::term_limit());
  const __m512d infinity = _mm512_set1_pd(INFINITY);
  const __m512i magnitude_mask = _mm512_set1_epi64(0x7fffffffffffffffLL);
  __m512d rounder[exact::kBins];
  for (int k = 0; k < exact::kBins; ++k) rounder[k] = _mm512_set1_pd(exact::bin_rounder(k));
  __m512d bin[exact::kBins], special = _mm512_setzero_pd();
  for (int k = 0; k < exact::kBins; ++k) bin[k] = _mm512_setzero_pd();
  for (int64_t i = 0; i < rows; ++i) {
    const __m512d x8 = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(lane_mask, x + i * x_stride));
    const __m512d term = _mm512_mul_pd(_mm512_set1_pd(a[i * a_stride]), x8);
    const __mmask8 in_range = _mm512_cmp_pd_mask(
        _mm512_castsi512_pd(_mm512_and_epi64(_mm512_castpd_si512(term), magnitude_mask)), limit,
        _CMP_LT_OQ);  // |term| < limit; false for NaN
    special = _mm512_mask_add_pd(special, static_cast<__mmask8>(~in_range), special,
                                 _mm512_mul_pd(term, infinity));
    __m512d rest = _mm512_maskz_mov_pd(in_range, term);
    for (int k = kFirstBin; k < exact::kBins; ++k) {
      const __m512d part = _mm512_sub_pd(_mm512_add_pd(rest, rounder[k]), rounder[k]);
      rest = _mm512_sub_pd(rest, part);
      bin[k] = _mm512_add_pd(bin[k], part);
    }
    if ((i + 1) % exact::kTermsPerFlush == 0) flush_vectors(bin, special, lanes, digits, stride);
  }
  flush_vectors(bin, special, lanes, digits, stride);
}

// The largest |m[i, c]| of each column c of a [rows, cols] matrix (std::max passes over
// NaNs, rightly: NaN terms never reach the bins, they go to the special sum; an
// infinity makes every bin reachable).
std::vector<float> column_maxima(const float* m, int64_t row_stride, int64_t rows, int64_t cols) {
  std::vector<float> largest(static_cast<size_t>(cols), 0.0f);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t c = 0; c < cols; ++c) {
      largest[c] = std::max(largest[c], std::fabs(m[i * row_stride + c]));
    }
  }
  return largest;
}

// The first bin the terms a * x[:, k0 .. k0 + lanes) can reach, from the largest factors.
int first_bin_for(float largest_a, const std::vector<float>& largest_x, int64_t k0, int lanes) {
  const float x = *std::max_element(largest_x.begin() + k0, largest_x.begin() + k0 + lanes);
  return exact::first_reachable_bin(static_cast<double>(largest_a) * static_cast<double>(x));
}

// row_sums_avx512<k> for each first bin k, indexed by k.
using RowSumsKernel = void (*)(const float*, int64_t, const float*, int64_t, int64_t, int,
                               int64_t*, int64_t);
template <int... kFirstBins>
constexpr std::array<RowSumsKernel, sizeof...(kFirstBins)> avx512_kernels(
    std::integer_sequence<int, kFirstBins...>) {
  return {row_sums_avx512<kFirstBins>...};
}

// Σ_i a[i] * x[i][0 .. lanes), from bin `first_bin` on (all bins before it unreachable).
void row_sums(const float* a, int64_t a_stride, const float* x, int64_t x_stride, int64_t rows,
              int lanes, int first_bin, int64_t* digits, int64_t stride) {
  if (has_avx512()) {
    static constexpr auto kFrom = avx512_kernels(std::make_integer_sequence<int, exact::kBins>{});
    kFrom[first_bin](a, a_stride, x, x_stride, rows, lanes, digits, stride);
  } else {
    row_sums_portable(a, a_stride, x, x_stride, rows, lanes, digits, stride);
  }
}

// ---------------------------------------------------------------- one magnitude
// dW when every dy has one magnitude (nn/one_magnitude.h): integer sums of ±x in fixed
// point, int64 accumulators per (j, k), the same exact value as the binned row sums.

// acc[k] += x[k] or -= x[k] over n values: plain integer adds, which the compiler
// vectorizes, once for any x86-64 and once for AVX-512, chosen like the loops above.
// (Not target_clones: its resolver runs before a sanitizer's runtime is up.)
template <bool kNegative>
inline void add_row_loop(int64_t* acc, const int64_t* x, int64_t n) {
  for (int64_t k = 0; k < n; ++k) acc[k] = kNegative ? acc[k] - x[k] : acc[k] + x[k];
}
__attribute__((target("avx512f,avx512vl"))) void add_row_avx512(int64_t* acc, const int64_t* x,
                                                                int64_t n, bool negative) {
  if (negative) {
    add_row_loop<true>(acc, x, n);
  } else {
    add_row_loop<false>(acc, x, n);
  }
}
void add_row(int64_t* acc, const int64_t* x, int64_t n, bool negative) {
  if (has_avx512()) return add_row_avx512(acc, x, n, negative);
  if (negative) {
    add_row_loop<true>(acc, x, n);
  } else {
    add_row_loop<false>(acc, x, n);
  }
}

// One element outside its column's window: its products with every dy of the row
// through a binned sum each, as the general path adds them.
void add_outside_window(const ConstRows& grad_y, int64_t row, float value, int64_t k,
                        int64_t in, int64_t* digits, int64_t stride) {
  for (int64_t j = 0; j < grad_y.cols; ++j) {
    const double dy = grad_y.data[row * grad_y.row_stride + j];
    exact::BinnedSum sum;
    sum.clear();
    sum.add(dy * static_cast<double>(value));
    sum.flush(digits + j * in + k, stride);
  }
}

// Returns false (and adds nothing) unless dy has one magnitude. Sum j * in + k at
// digits[d * stride + j * in + k].
bool accumulate_one_magnitude(const ConstRows& grad_y, const ConstRows& x,
                              const std::vector<float>& largest_x, int64_t* digits,
                              int64_t stride) {
  unsigned int largest = 0, smallest = 0xffffffffu;
  for (int64_t row = 0; row < grad_y.rows; ++row) {
    for (int64_t j = 0; j < grad_y.cols; ++j) {
      uint32_t bits;
      std::memcpy(&bits, grad_y.data + row * grad_y.row_stride + j, sizeof bits);
      bits &= 0x7fffffffu;
      largest = std::max(largest, bits);
      if (bits != 0) smallest = std::min(smallest, bits);
    }
  }
  const OneMagnitude magnitude = one_magnitude_of(largest, smallest);
  if (!magnitude.holds) return false;
  const int64_t in = x.cols, out = grad_y.cols;
  std::vector<int> lsb(static_cast<size_t>(in));
  std::vector<double> scale(static_cast<size_t>(in));
  for (int64_t k = 0; k < in; ++k) {
    uint32_t bits;
    std::memcpy(&bits, &largest_x[static_cast<size_t>(k)], sizeof bits);
    const Window window = column_window(bits, magnitude.exponent);
    lsb[k] = window.lsb;
    // NaN for a column without a window: every element then fails the test below.
    scale[k] = window.whole ? std::nan("") : std::ldexp(1.0, -window.lsb);
  }
  // |acc| < rows * 2^44: below 2^63 for 2^19 rows; moved into the digits every 2^18.
  constexpr int64_t kRowsPerFlush = int64_t{1} << 18;
  std::vector<int64_t> acc(static_cast<size_t>(out * in), 0), fixed(static_cast<size_t>(in));
  auto flush = [&] {
    for (int64_t j = 0; j < out; ++j) {
      for (int64_t k = 0; k < in; ++k) {
        int64_t& a = acc[static_cast<size_t>(j * in + k)];
        exact::add_scaled_integer(digits + j * in + k, stride,
                                  exact::Int128{a} * magnitude.significand,
                                  lsb[k] + magnitude.exponent);
        a = 0;
      }
    }
  };
  for (int64_t row = 0; row < x.rows; ++row) {
    const float* x_row = x.data + row * x.row_stride;
    bool outside = false;
    for (int64_t k = 0; k < in; ++k) {
      const double value = static_cast<double>(x_row[k]) * scale[k];  // exact: a power of two
      const bool held = std::fabs(value) < kWindowLimit && value == std::trunc(value);
      fixed[k] = held ? static_cast<int64_t>(value) : 0;
      outside |= !held;
    }
    if (outside) {  // rare: find them and add them one by one
      for (int64_t k = 0; k < in; ++k) {
        const double value = static_cast<double>(x_row[k]) * scale[k];
        if (!(std::fabs(value) < kWindowLimit && value == std::trunc(value))) {
          add_outside_window(grad_y, row, x_row[k], k, in, digits, stride);
        }
      }
    }
    for (int64_t j = 0; j < out; ++j) {
      const float dy = grad_y.data[row * grad_y.row_stride + j];
      if (dy != 0.0f) add_row(acc.data() + j * in, fixed.data(), in, dy < 0.0f);
    }
    if ((row + 1) % kRowsPerFlush == 0) flush();
  }
  flush();
  return true;
}

}  // namespace

void chain_products_cpu(const ConstRows& a, const ConstRows& b_rows, const float* bias, float* c,
                        int64_t c_row_stride) {
  SEQPAR_CHECK(a.cols == b_rows.cols, "chain_products_cpu: ", a.cols, " vs ", b_rows.cols);
  const int64_t n = b_rows.rows, n_padded = (n + kLanes - 1) / kLanes * kLanes;
  if (a.rows == 0 || n == 0) return;
  const std::vector<float> bt = transposed_padded(b_rows, n_padded);
  const bool vector = has_avx512();
  for (int64_t row0 = 0; row0 < a.rows; row0 += kRowBlock) {
    const float* a_rows[kRowBlock];
    for (int r = 0; r < kRowBlock; ++r) {  // a block past the end repeats the last row
      a_rows[r] = a.data + std::min(row0 + r, a.rows - 1) * a.row_stride;
    }
    for (int64_t n0 = 0; n0 < n_padded; n0 += kLanes) {
      float sums[kRowBlock][kLanes] = {};
      if (vector) {
        chains_avx512(a_rows, a.cols, bt.data(), n_padded, n0, sums);
      } else {
        chains_portable(a_rows, a.cols, bt.data(), n_padded, n0, sums);
      }
      for (int r = 0; r < kRowBlock && row0 + r < a.rows; ++r) {
        float* out = c + (row0 + r) * c_row_stride;
        for (int64_t j = n0; j < std::min(n0 + kLanes, n); ++j) {
          out[j] = bias != nullptr ? sums[r][j - n0] + bias[j] : sums[r][j - n0];
        }
      }
    }
  }
}

void accumulate_weight_grad_cpu(const ConstRows& grad_y, const ConstRows& x, exact::ExactSums& sums,
                                WeightGradPath path, int64_t first) {
  SEQPAR_CHECK(grad_y.rows == x.rows && first >= 0 && sums.count() - first >= grad_y.cols * x.cols,
               "accumulate_weight_grad_cpu: dy ", grad_y.rows, " x ", grad_y.cols, ", x ", x.rows,
               " x ", x.cols, ", ", sums.count(), " sums from sum ", first);
  int64_t* const digits = sums.digits() + first;
  const std::vector<float> largest_x = column_maxima(x.data, x.row_stride, x.rows, x.cols);
  if (path == WeightGradPath::Automatic &&
      accumulate_one_magnitude(grad_y, x, largest_x, digits, sums.count())) {
    return;
  }
  const std::vector<float> largest_dy =
      column_maxima(grad_y.data, grad_y.row_stride, grad_y.rows, grad_y.cols);
  // Column blocks outer: a block of x's columns over all rows stays in cache while
  // every output row j reads it.
  for (int64_t k0 = 0; k0 < x.cols; k0 += kSumLanes) {
    const int lanes = static_cast<int>(std::min<int64_t>(kSumLanes, x.cols - k0));
    for (int64_t j = 0; j < grad_y.cols; ++j) {
      row_sums(grad_y.data + j, grad_y.row_stride, x.data + k0, x.row_stride, x.rows, lanes,
               first_bin_for(largest_dy[j], largest_x, k0, lanes),
               digits + j * x.cols + k0, sums.count());
    }
  }
}

void accumulate_column_sums_cpu(const ConstRows& grad_y, exact::ExactSums& sums, int64_t first) {
  SEQPAR_CHECK(first >= 0 && sums.count() - first >= grad_y.cols, "accumulate_column_sums_cpu: ",
               grad_y.cols, " columns, ", sums.count(), " sums from sum ", first);
  static const float kOnes[kSumLanes] = {1, 1, 1, 1, 1, 1, 1, 1};
  const std::vector<float> largest =
      column_maxima(grad_y.data, grad_y.row_stride, grad_y.rows, grad_y.cols);
  for (int64_t k0 = 0; k0 < grad_y.cols; k0 += kSumLanes) {
    const int lanes = static_cast<int>(std::min<int64_t>(kSumLanes, grad_y.cols - k0));
    // Σ_i 1 * dy[i, k0 + l]: the ones are the "a" column, read with stride 0.
    row_sums(kOnes, 0, grad_y.data + k0, grad_y.row_stride, grad_y.rows, lanes,
             first_bin_for(1.0f, largest, k0, lanes), sums.digits() + first + k0, sums.count());
  }
}

}  // namespace seqpar::nn::detail
