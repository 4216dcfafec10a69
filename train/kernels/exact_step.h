// The exact fused step's own kernels (train/exact_l1_step.h); nn's forward and dW sums
// run between them.
//
// exact_l1_cuda: the L1 loss from the forward's y, in one launch: everything nn's L1
// loss and Linear's db produce for the step, with the same values and so the same bits
// once rounded, and dy's maxima for dW's sums:
//
//   loss digits += exact Σ s |d|,  d = fl32(y - target)        (nn/l1_loss.h's terms)
//   dy           = s * sign(d), sign(0) = 0, NaN stays NaN   (its backward, grad 1)
//   db digits   += Σ_rows dy = s * Σ_rows sign(d)              (Linear's db, exact)
//   dy's column maxima and one-magnitude words, as nn::detail::column_maxima_cuda
//                  finds them (so nn's dW sums need no pass over dy of their own)
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
  unsigned int* grad_y_largest;  // [out] column maxima, then the two words (zeroed first)
};

// y [rows, out] contiguous; target [rows, out] with row stride target_row_stride; out at
// most kExactL1MaxOut; scale the loss's factor as nn::Reduction::scale gives it, in
// float (finite: checked). The digits are added into (zero them first).
void exact_l1_cuda(const float* y, const float* target, int64_t target_row_stride, int64_t rows,
                   int64_t out, float scale, const ExactL1Outputs& outputs, cuda::Stream stream);

// exact_finish_cuda: the step's sums rounded, and the norm, in one launch. Each block
// rounds a slice of one gradient tensor's sums and adds the exact squares of what it
// rounded into that tensor's norm digits; the last block to finish (an integer count)
// takes each tensor's float norm and the total as optim::clip_grad_norm does, and
// rounds the loss. So the norm is summed once, not by every block of the optimizer.
// It also leaves the step's digits and words zero for the next step, each once read:
// the gradients' digits by the threads that round them, `step_words` (the loss's and
// the norm's digits among them) by the last block. So a step needs no zeroing launch.
struct ExactFinish {
  int64_t* gradient_digits;        // `count` sums: W's `weight_count`, then b's
  int64_t count, weight_count;
  float* gradients;                // [count]
  const int64_t* loss_digits;      // one sum
  float* loss;
  int64_t* norm_digits;            // two sums (W's squares, b's), stride 2; zero at launch
  unsigned* blocks_done;           // zero between launches; the last block resets it
  float* total_norm;
  int64_t* step_words;             // [step_word_count], loss_digits and norm_digits among them
  int64_t step_word_count;
};
void exact_finish_cuda(const ExactFinish& finish, cuda::Stream stream);

#endif

}  // namespace seqpar::train::kernels
