// Internal to nn/: the CPU kernels of Linear and the CUDA launchers of its exact row
// sums, in the canonical numerics of docs/numerics.md (the CUDA kernels of linear.cu
// and linear_row_sums.cu reproduce the CPU's bits):
//
//   y[i, j]  = (Σ_k x[i, k] W[j, k], one fma chain over k = 0, 1, ..., from +0) + b[j]
//   dx[i, k] =  Σ_j dy[i, j] W[j, k], one fma chain over j = 0, 1, ..., from +0
//   dW[j, k] =  Σ_i dy[i, j] x[i, k], exact, rounded once (core/exact_sum.h)
//   db[j]    =  Σ_i dy[i, j],         exact, rounded once
//
// A chain's order depends on the feature index alone, never on the row, the row count
// or the tiling, so a row's output is the same bits in any batch, on any device.
#pragma once

#include <cstdint>

#include "core/exact_sums.h"
#include "core/tensor.h"

namespace seqpar::nn::detail {

// A [rows, cols] float matrix with unit column stride and any row stride.
struct ConstRows {
  const float* data;
  int64_t rows, cols, row_stride;
};
ConstRows const_rows_of(const Tensor& matrix);  // matrix: 2-D, unit column stride (or one column)

// c[i, n] = chain_k fma(a[i, k], b[n, k]) (+ bias[n]) for b given as [n, k] rows:
// the forward with b = W; dx with b = Wᵀ (see linear_cpu.cpp).
void chain_products_cpu(const ConstRows& a, const ConstRows& b_rows, const float* bias, float* c,
                        int64_t c_row_stride);

// sums[j * in + k] += Σ_i dy[i, j] x[i, k]: digits of the exact sums, not yet rounded.
void accumulate_weight_grad_cpu(const ConstRows& grad_y, const ConstRows& x, exact::ExactSums& sums);
// sums[j] += Σ_i dy[i, j].
void accumulate_column_sums_cpu(const ConstRows& grad_y, exact::ExactSums& sums);

#ifdef SEQPAR_WITH_CUDA
// The same two sums on the GPU (linear_row_sums.cu), into sums on the device.
void accumulate_weight_grad_cuda(const ConstRows& grad_y, const ConstRows& x, exact::ExactSums& sums);
void accumulate_column_sums_cuda(const ConstRows& grad_y, exact::ExactSums& sums);
#endif

}  // namespace seqpar::nn::detail
