// Linear's plain reference: the loops that define its bits.
//
//   y[i, j]  = (x[i, 0] W[j, 0] + x[i, 1] W[j, 1] + ...) + b[j]
//              one fma chain over k = 0, 1, ... from +0, then one float addition
//   dx[i, k] =  dy[i, 0] W[0, k] + dy[i, 1] W[1, k] + ...
//              one fma chain over j = 0, 1, ... from +0
//   dW[j, k] =  Σ_i dy[i, j] x[i, k]   exact (core/exact_bins.h), rounded once
//   db[j]    =  Σ_i dy[i, j]           exact, rounded once
//
// A chain's order depends on the feature index alone, never on the row, the row count or
// a tiling, so a row's output is the same bits in any batch. The row sums are exact, so
// they are the same bits for any split of the rows: over ranks, threads, blocks or
// devices. docs/numerics.md explains both choices.
//
// Plain loops, no intrinsics, no shortcuts, no fusion: the reference device runs them
// (Device::reference(), `seqpar-repro --device reference`), and every fast path (the CPU's
// nn/cpu/linear.cpp, the GPU's nn/cuda/*.cu) is tested bit for bit against them.
#pragma once

#include <cstdint>

#include "core/exact_sums.h"
#include "nn/rows.h"

namespace seqpar::nn::reference {

// y [x.rows, out] with row stride y_row_stride; bias may be null (dx has none).
void linear_chains(const detail::ConstRows& x, const detail::ConstRows& weight, const float* bias,
                   float* y, int64_t y_row_stride);
// dx = dy W: the same chains with Wᵀ's rows, W's columns, read down W.
void linear_grad_input(const detail::ConstRows& grad_y, const detail::ConstRows& weight,
                       float* grad_x, int64_t grad_x_row_stride);
// dW's exact sums into sums [first + j * in + k], not yet rounded.
void linear_weight_sums(const detail::ConstRows& grad_y, const detail::ConstRows& x,
                        exact::ExactSums& sums, int64_t first);
// db's exact sums into sums [first + j], not yet rounded.
void linear_bias_sums(const detail::ConstRows& grad_y, exact::ExactSums& sums, int64_t first);

}  // namespace seqpar::nn::reference
