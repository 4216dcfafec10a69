// The L1 loss of the exact fused step (train/exact_l1_step.h), from the forward's y, in
// one launch: everything nn's L1 loss and Linear's db produce for that step, with the
// same values and so the same bits once rounded.
//
//   loss digits += exact Σ s |d|,  d = fl32(y - target)        (nn/l1_loss.h's terms)
//   dy           = s * sign(d), sign(0) = 0, NaN stays NaN   (its backward, grad 1)
//   db digits   += Σ_rows dy = s * Σ_rows sign(d)              (Linear's db, exact)
//
// db needs no bins: every nonzero dy is ±s, so a column's sum is s times an integer
// count, added into the digits at s's unit (exact::add_scaled_integer_atomically): the
// exact value the binned sum of dy holds. A NaN dy flags its column's sum NaN, as a NaN
// term does. Integer atomics only; no order can change a bit.
#pragma once

#include <cstdint>

#include "core/cuda_runtime.h"

namespace seqpar::train::kernels {

constexpr int64_t kExactL1MaxOut = 64;

#ifdef SEQPAR_WITH_CUDA

struct ExactL1Outputs {
  float* grad_y;          // [rows, out], contiguous
  int64_t* loss_digits;   // one sum (stride 1)
  int64_t* bias_digits;   // db's out sums: digit d of sum j at bias_digits[d * stride + j]
  int64_t digit_stride;
};

// y [rows, out] contiguous; target [rows, out] with row stride target_row_stride; out at
// most kExactL1MaxOut; scale the loss's factor as nn::Reduction::scale gives it, in
// float. The digits are added into (zero them first).
void exact_l1_cuda(const float* y, const float* target, int64_t target_row_stride, int64_t rows,
                   int64_t out, float scale, const ExactL1Outputs& outputs, cuda::Stream stream);

#endif

}  // namespace seqpar::train::kernels
