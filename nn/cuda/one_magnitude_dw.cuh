// The device side of dW when every dy has one magnitude (nn/one_magnitude.h), shared by
// the kernels of one_magnitude_dw_few_outputs.cuh (few outputs) and one_magnitude_dw_many_outputs.cu (many outputs):
// whether dy had one magnitude, read on the device by the kernels of both this path and
// the general one, so that exactly one of them works; and the rare elements outside
// their column's fixed-point window.
#pragma once

#include "core/exact_bins.cuh"
#include "nn/one_magnitude.h"
#include "nn/rows.h"

namespace seqpar::nn::detail {

// words[0]: the largest |dy| bits; words[1]: the complement of the smallest nonzero
// |dy| bits (0: none), both kept as maxima by the column-maxima pass.
__device__ inline OneMagnitude one_magnitude(const unsigned int* words) {
  return one_magnitude_of(words[0], ~words[1]);
}

__device__ inline int sign_of(float value) { return value > 0.0f ? 1 : value < 0.0f ? -1 : 0; }

// One element x[row, k] outside its column's window, times dy[row, j]: the product through
// a binned sum (the general path's rules: rounded to the grid, NaN and inf as IEEE), into
// the digits of dW[j, k] with integer atomics (in any order, the same digits).
__device__ inline void add_outside_product(const ConstRows& dy, float value, int64_t row, int64_t k,
                                           int64_t j, int64_t in, int64_t* digits, int64_t count) {
  const float factor = dy.data[row * dy.row_stride + j];
  exact::BinnedSum sum;
  sum.clear();
  sum.add(__dmul_rn(static_cast<double>(factor), static_cast<double>(value)));
  int64_t local[exact::kDigits] = {};
  sum.flush(local, 1);
  exact::add_digits_atomically(local, digits + j * in + k, count);
}

// The same for j in [j_begin, j_end). Not inlined: it is the rare path, and the common
// one keeps its registers.
inline __device__ __noinline__ void add_outside_window(const ConstRows& dy, float value, int64_t row,
                                                       int64_t k, int64_t j_begin, int64_t j_end,
                                                       int64_t in, int64_t* digits, int64_t count) {
  for (int64_t j = j_begin; j < j_end; ++j) add_outside_product(dy, value, row, k, j, in, digits, count);
}

}  // namespace seqpar::nn::detail
