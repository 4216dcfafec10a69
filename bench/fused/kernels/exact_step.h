// The exact fused step's own kernels (bench/fused/exact_l1_step.h); nn's forward and dW sums
// run between them.
//
// exact_l1_cuda: the L1 loss from the forward's y, in one launch: everything nn's L1
// loss and Linear's db produce for the step, with the same values and so the same bits
// once rounded, and dy's maxima for dW's sums (exact_l1.cuh has the terms). For the
// forwards that cannot take it in their epilogue (few_outputs_forward_exact_l1_cuda).
#pragma once

#include <cstdint>

#include "core/cuda_runtime.h"
#include "nn/cuda/linear.h"
#include "nn/rows.h"
#include "optim/adamw.h"

namespace seqpar::fused::kernels {

// The most outputs the exact L1 loss's kernels take (a block tallies each column).
constexpr int64_t kExactL1MaxOut = 64;

// dy's signs laid out as the few-outputs one-magnitude dW's tensor-core operand (where
// the sign of dy[row, j] goes: nn::detail::sign_fragment_byte), which the L1 loss's
// kernels write beside dy: for at most kSignFragmentOutputs outputs (one tile), in
// sign_fragment_bytes(rows) bytes (whole steps of 32 rows, 16 bytes a row).
constexpr int64_t kSignFragmentOutputs = 16;
inline int64_t sign_fragment_bytes(int64_t rows) { return (rows + 31) / 32 * 32 * 16; }

// The finishing kernel's grid (exact_finish_grid).
struct ExactFinishGrid {
  int blocks = 0;
  int per_thread = 0;  // sums a thread
};

#ifdef SEQPAR_WITH_CUDA

// dW's maxima in one buffer, as the fused step and the benchmarks lay them out: x's
// column maxima [in], dy's [out], then dy's two one-magnitude words. Zero it before the
// passes that fill it (they are atomic maxima).
inline int64_t weight_grad_maxima_words(int64_t in, int64_t out) { return in + out + 2; }
inline nn::detail::WeightGradMaxima weight_grad_maxima_at(const unsigned int* words, int64_t in, int64_t out) {
  return {words, words + in, words + in + out};
}

// The exact L1 loss and its backward as far as db, from y (exact_l1.cuh): where a
// launch puts them. dy's maxima feed the dW sums, as column_maxima_cuda's would.
struct ExactL1Outputs {
  float* grad_y;          // [rows, out], contiguous
  int64_t* loss_digits;   // one sum (stride 1)
  int64_t* bias_digits;   // db's out sums: digit d of sum j at bias_digits[d * stride + j]
  int64_t digit_stride;
  unsigned int* grad_y_largest;  // [out] column maxima, then the two words (zeroed first)
  // Or null: dy's signs as the one-magnitude dW's tensor-core fragments (out at most
  // kSignFragmentOutputs; sign_fragment_bytes(rows) bytes, zeroed once: rows past the
  // last are never written).
  uint8_t* sign_fragments = nullptr;
};
// The target and the loss's scale (nn::Reduction::scale in float, finite).
struct ExactL1Target {
  const float* data;
  int64_t row_stride;
  float scale;
};

// The few-outputs forward (nn/cuda/linear_forward_few_outputs.cuh) with the exact L1 loss as its
// epilogue (forward_exact_l1.cu): y and x's column maxima as
// few_outputs_forward_cuda gives them (x_largest required), then, from the y each thread
// holds, the loss's digits, dy, db's digits and dy's maxima as exact_l1 would from y read
// back: one launch and no second pass over y. Only where few_outputs_forward_exact_l1_fits
// (the staged kernel: rows 16-byte aligned, in % 4 == 0).
bool few_outputs_forward_exact_l1_fits(const nn::detail::ConstRows& x, int64_t out);
void few_outputs_forward_exact_l1_cuda(const nn::detail::ConstRows& x, const float* weight,
                                       int64_t weight_row_stride, const float* bias, int64_t out,
                                       float* y, int device, unsigned int* x_largest,
                                       const ExactL1Target& target, const ExactL1Outputs& outputs);

// y [rows, out] contiguous; target [rows, out] with row stride target_row_stride; out at
// most kExactL1MaxOut; scale the loss's factor as nn::Reduction::scale gives it, in
// float (finite: checked). The digits are added into (zero them first).
void exact_l1_cuda(const float* y, const float* target, int64_t target_row_stride, int64_t rows,
                   int64_t out, float scale, const ExactL1Outputs& outputs, cuda::Stream stream);

// dW's sums from dy's sign fragments (weight_grad_fragments.cu): as
// nn::detail::enqueue_weight_grad_sums gives them, in one launch, where dy has at most
// kSignFragmentOutputs outputs and the few-outputs kernel fits; else (or with null
// fragments) by nn::detail::enqueue_weight_grad_sums. Allocates nothing, never waits.
void enqueue_weight_grad_sums_from_fragments(const nn::detail::ConstRows& grad_y,
                                             const nn::detail::ConstRows& x,
                                             const nn::detail::WeightGradMaxima& maxima, int64_t* digits,
                                             int64_t stride, cuda::Stream stream,
                                             const uint8_t* sign_fragments);

// The step's tail in one launch: the sums rounded, the exact norm, the clip coefficient
// and AdamW. Each block rounds a slice of one gradient tensor's sums and adds the exact
// squares of what it rounded into that tensor's norm digits; then every block waits for
// all the others (the step's one grid-wide wait, grid_sync.cuh beside this file), takes each
// tensor's float norm and the total from the digits as optim::clip_grad_norm does (the
// same bits in every block), and updates its own parameters with the clipped gradient
// it still holds (optim/cuda/step_math.cuh), the gradients stored unclipped. So the norm
// is summed once, and no launch of its own waits for it.
// The launch also leaves the step's digits and words zero for the next step, each once
// read: the gradients' digits by the threads that round them, `step_words` (the loss's
// and the norm's digits among them) by the last block out, which also advances AdamW's
// step slot (bench/fused/fused_step.h). So a step needs no zeroing launch.
struct ExactFinish {
  int64_t* gradient_digits;        // `count` sums: W's `weight_count`, then b's
  int64_t count, weight_count;
  float* gradients;                // [count], unclipped
  const int64_t* loss_digits;      // one sum
  float* loss;
  int64_t* norm_digits;            // two sums (W's squares, b's), stride 2; zero at launch
  float* total_norm;
  int64_t* step_words;             // [step_word_count], loss_digits and norm_digits among them
  int64_t step_word_count;
  unsigned* counts;                // [2]: blocks at the wait, blocks done; zero between launches
  // AdamW: the parameters (W's weight_count, b's count - weight_count) and their moments
  // ([count], W's then b's), the step's scalars at table[*step_slot].
  float* weight;
  float* bias;
  float* exp_avg;
  float* exp_avg_sq;
  const optim::detail::AdamWStepScalars* table;
  int* step_slot;
  float max_norm;
};

// The grid of the tail for `count` sums (`weight_count` of them W's) on `device`: every
// block resident at once (a cooperative launch), so each thread takes one sum or, when
// that grid would not fit, two, four or eight. Checks that it fits.
ExactFinishGrid exact_finish_grid(int64_t count, int64_t weight_count, int device);
void exact_finish_cuda(const ExactFinish& finish, const ExactFinishGrid& grid, cuda::Stream stream);

#endif

}  // namespace seqpar::fused::kernels
