// The CRT dW scheme of nn/cuda/exact_dw_crt.h run on the host: the shared functions of that
// header wherever the CUDA kernels call them, and plain loops where the GPU runs an
// int8 GEMM (with a check that each chunk's int32 sums stay in range). A model of
// nn/cuda/exact_dw_crt.cu for the CPU tests, so that the arithmetic and the split of the
// terms into parts are checked against the reference in CI, without a GPU.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/exact_bins.h"
#include "core/exact_sums.h"
#include "nn/cuda/exact_dw_crt.h"
#include "nn/rows.h"

namespace seqpar::test::crt_dw {

namespace crt = nn::detail::crt;
using nn::detail::ConstRows;

// Column c's largest |element| bits, as column_maxima_cuda finds them (NaN passed over).
inline unsigned int largest_bits(const ConstRows& m, int64_t c) {
  unsigned int largest = 0;
  for (int64_t row = 0; row < m.rows; ++row) {
    const unsigned int bits = exact::float_bits(m(row, c)) & 0x7fffffffu;
    if (bits <= 0x7f800000u) largest = std::max(largest, bits);
  }
  return largest;
}

struct Windows {
  std::vector<crt::ColumnWindow> dy, x;
  std::vector<crt::WindowScale> dy_scale, x_scale;
};

inline Windows windows_of(const ConstRows& dy, const ConstRows& x, int window_bits) {
  Windows w;
  int lowest_dy_unit = crt::kNoUnit;
  for (int64_t j = 0; j < dy.cols; ++j) {
    w.dy.push_back(crt::column_window(largest_bits(dy, j), window_bits));
    if (w.dy.back().kind == crt::kWindowColumn) lowest_dy_unit = std::min(lowest_dy_unit, w.dy.back().unit);
    w.dy_scale.push_back(crt::window_scale(w.dy.back(), window_bits));
  }
  for (int64_t k = 0; k < x.cols; ++k) {
    w.x.push_back(crt::raise_unit(crt::column_window(largest_bits(x, k), window_bits), lowest_dy_unit));
    w.x_scale.push_back(crt::window_scale(w.x.back(), window_bits));
  }
  return w;
}

// The residue of an element modulo modulus i, or 0 outside its window.
inline int element_residue(float value, const crt::WindowScale& scale, const crt::Table& table, int i) {
  double integer;
  if (!crt::inside_window(value, scale, integer)) return 0;
  (void)table;
  return crt::window_residue_at(static_cast<int64_t>(integer), i);
}

// One term into sum `index` of `digits` (stride `count`), as the outside kernels add it.
inline void add_term(std::vector<int64_t>& digits, int64_t count, int64_t index, double term) {
  int64_t local[exact::kDigits];
  crt::term_digits(term, local);
  for (int d = 0; d < exact::kBins; ++d) digits[static_cast<size_t>(d * count + index)] += local[d];
  digits[static_cast<size_t>(exact::kSpecialDigit * count + index)] |= local[exact::kSpecialDigit];
}

// Part 3 for rows [begin, end): the outside elements' products.
inline void add_outside_terms(const ConstRows& dy, const ConstRows& x, const Windows& w, int64_t begin,
                              int64_t end, std::vector<int64_t>& digits, int64_t count) {
  const int64_t in = x.cols;
  double integer;
  for (int64_t row = begin; row < end; ++row) {
    for (int64_t k = 0; k < in; ++k) {  // x outside: with every dy of the row
      if (crt::inside_window(x(row, k), w.x_scale[k], integer)) continue;
      for (int64_t j = 0; j < dy.cols; ++j) {
        if (crt::pair_binned_whole(w.dy[j], w.x[k])) continue;
        add_term(digits, count, j * in + k, static_cast<double>(dy(row, j)) * x(row, k));
      }
    }
    for (int64_t j = 0; j < dy.cols; ++j) {  // dy outside: with the x inside
      if (crt::inside_window(dy(row, j), w.dy_scale[j], integer)) continue;
      for (int64_t k = 0; k < in; ++k) {
        if (crt::pair_binned_whole(w.dy[j], w.x[k]) || !crt::inside_window(x(row, k), w.x_scale[k], integer)) {
          continue;
        }
        add_term(digits, count, j * in + k, static_cast<double>(dy(row, j)) * x(row, k));
      }
    }
  }
}

// Part 2's products for rows [begin, end), modulus i, into residues[i][j * in + k] (in
// [0, m_i)): an int32 sum per chunk, as the int8 GEMM gives it, then reduced.
inline void add_chunk_products(const ConstRows& dy, const ConstRows& x, const Windows& w, const crt::Table& table,
                               int i, int64_t begin, int64_t end, std::vector<int>& residues) {
  const int64_t in = x.cols, out = dy.cols, rows = end - begin;
  std::vector<int> dy_residues(static_cast<size_t>(rows * out)), x_residues(static_cast<size_t>(rows * in));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < out; ++j) {
      dy_residues[static_cast<size_t>(r * out + j)] = element_residue(dy(begin + r, j), w.dy_scale[j], table, i);
    }
    for (int64_t k = 0; k < in; ++k) {
      x_residues[static_cast<size_t>(r * in + k)] = element_residue(x(begin + r, k), w.x_scale[k], table, i);
    }
  }
  for (int64_t j = 0; j < out; ++j) {
    for (int64_t k = 0; k < in; ++k) {
      int64_t sum = 0;
      for (int64_t r = 0; r < rows; ++r) {
        sum += int64_t{dy_residues[static_cast<size_t>(r * out + j)]} * x_residues[static_cast<size_t>(r * in + k)];
      }
      REQUIRE(sum == static_cast<int32_t>(sum));  // what int32 C holds
      int& reduced_sum = residues[static_cast<size_t>(j * in + k)];
      reduced_sum = crt::reduced(int64_t{reduced_sum} + sum, table.moduli[i]);
    }
  }
}

// Part 4: every row of a pair past 2^129, through one binned sum.
inline void add_binned_pair(const ConstRows& dy, const ConstRows& x, int64_t j, int64_t k,
                            std::vector<int64_t>& digits, int64_t count) {
  exact::BinnedSum sum;
  sum.clear();
  const int64_t index = j * x.cols + k;
  for (int64_t row = 0; row < x.rows; ++row) {
    sum.add(static_cast<double>(dy(row, j)) * x(row, k));
    if ((row + 1) % exact::kTermsPerFlush == 0) sum.flush(digits.data() + index, count);
  }
  sum.flush(digits.data() + index, count);
}

// dW's sums by the scheme into `sums` (host, count >= out * in), rows cut into chunks of
// rows_per_product for the "GEMMs".
inline void crt_weight_sums_model(const ConstRows& dy, const ConstRows& x, exact::ExactSums& sums,
                                  int64_t rows_per_product) {
  const int64_t rows = x.rows, in = x.cols, out = dy.cols, count = sums.count();
  if (rows == 0) return;
  const crt::Plan plan = crt::plan_for_rows(rows);
  const crt::Table table = crt::crt_table(plan.moduli);
  const Windows w = windows_of(dy, x, plan.window_bits);
  std::vector<int64_t> digits(sums.digits(), sums.digits() + sums.words());
  std::vector<std::vector<int>> residues(static_cast<size_t>(table.count),
                                         std::vector<int>(static_cast<size_t>(out * in), 0));
  for (int64_t begin = 0; begin < rows; begin += rows_per_product) {
    const int64_t end = std::min(rows, begin + rows_per_product);
    for (int i = 0; i < table.count; ++i) add_chunk_products(dy, x, w, table, i, begin, end, residues[i]);
    add_outside_terms(dy, x, w, begin, end, digits, count);
  }
  for (int64_t j = 0; j < out; ++j) {
    for (int64_t k = 0; k < in; ++k) {
      if (crt::pair_binned_whole(w.dy[j], w.x[k])) add_binned_pair(dy, x, j, k, digits, count);
      if (!crt::pair_takes_integers(w.dy[j], w.x[k])) continue;
      int r[crt::kMaxModuli] = {};
      for (int i = 0; i < table.count; ++i) r[i] = residues[i][static_cast<size_t>(j * in + k)];
      crt::add_wide_scaled_integer(digits.data() + j * in + k, count, crt::signed_value(table, r),
                                   w.dy[j].unit + w.x[k].unit);
    }
  }
  std::copy(digits.begin(), digits.end(), sums.digits());
}

}  // namespace seqpar::test::crt_dw
