// The exact fused step's own kernels (train/exact_l1_step.h); nn's forward and dW sums
// run between them.
//
// exact_l1_cuda: the L1 loss from the forward's y, in one launch: everything nn's L1
// loss and Linear's db produce for the step, with the same values and so the same bits
// once rounded, and dy's maxima for dW's sums (nn/exact_l1.cuh has the terms). For the
// forwards that cannot take it in their epilogue (nn::detail::narrow_forward_exact_l1_cuda).
#pragma once

#include <cstdint>

#include "core/cuda_runtime.h"
#include "nn/linear_kernels.h"

namespace seqpar::train::kernels {

using nn::detail::kExactL1MaxOut;

#ifdef SEQPAR_WITH_CUDA

using nn::detail::ExactL1Outputs;

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
