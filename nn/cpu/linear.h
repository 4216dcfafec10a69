// The fast CPU path of Linear (nn/cpu/linear.cpp), in the canonical numerics of
// docs/numerics.md, bitwise the reference's (nn/reference/linear.h):
//
//   y[i, j]  = (Σ_k x[i, k] W[j, k], one fma chain over k = 0, 1, ..., from +0) + b[j]
//   dx[i, k] =  Σ_j dy[i, j] W[j, k], one fma chain over j = 0, 1, ..., from +0
//   dW[j, k] =  Σ_i dy[i, j] x[i, k], exact, rounded once (core/exact_bins.h)
//   db[j]    =  Σ_i dy[i, j],         exact, rounded once
//
// A chain's order depends on the feature index alone, never on the row, the row count
// or the tiling, so a row's output is the same bits in any batch, on any device.
#pragma once

#include <cstdint>

#include "core/exact_sums.h"
#include "nn/rows.h"

namespace seqpar::nn::detail {

// c[i, n] = chain_k fma(a[i, k], b[n, k]) (+ bias[n]) for b given as [n, k] rows:
// the forward with b = W; dx with b = Wᵀ (see linear.cpp).
void chain_products_cpu(const ConstRows& a, const ConstRows& b_rows, const float* bias, float* c,
                        int64_t c_row_stride);

// sums[first + j * in + k] += Σ_i dy[i, j] x[i, k]: digits of the exact sums, not yet
// rounded. Automatic takes the fixed-point integer sums when every dy has one magnitude
// (nn/one_magnitude.h) and the binned sums otherwise; General always the binned sums.
// Both add the same exact values (the tests compare them).
enum class WeightGradPath { Automatic, General };
void accumulate_weight_grad_cpu(const ConstRows& grad_y, const ConstRows& x, exact::ExactSums& sums,
                                WeightGradPath path = WeightGradPath::Automatic, int64_t first = 0);
// sums[first + j] += Σ_i dy[i, j].
void accumulate_column_sums_cpu(const ConstRows& grad_y, exact::ExactSums& sums, int64_t first = 0);

}  // namespace seqpar::nn::detail
