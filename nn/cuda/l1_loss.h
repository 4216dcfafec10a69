// The CUDA path of the L1 loss (nn/cuda/l1_loss.cu): the launchers that the CUDA rows
// of nn/l1_loss.cpp's tables call, bitwise the reference's (nn/reference/l1_loss.h).
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace seqpar::nn::detail {

// input and target are [n, m] with unit column stride
// and their own row strides; `scale` as in Reduction::scale, rounded to float. The
// forward is the exact sum above (integer atomics on the digits, then one rounding)
// into loss (shape {}): bitwise the CPU's loss.
// With `codes` (null: none), each element's nn/l1_sign.h code goes to codes[row * m + col].
void l1_loss_forward_cuda(const Tensor& input, const Tensor& target, float scale,
                          const Tensor& loss, uint8_t* codes = nullptr);
void l1_loss_backward_cuda(const Tensor& grad_loss, const Tensor& input, const Tensor& target,
                           float scale, const Tensor& grad_input);
// From the forward's codes: grad_input (contiguous, 16-byte aligned) [i] =
// (grad_loss * scale) * l1_sign_of(codes[i]).
void l1_loss_backward_from_signs_cuda(const Tensor& grad_loss, const uint8_t* codes,
                                      float scale, const Tensor& grad_input);
// The same over the rows whose row_mask value is not 0 (a checked mask, [n], any
// stride); a masked row forms no term and its grad_input row is +0.
void l1_loss_forward_masked_cuda(const Tensor& input, const Tensor& target,
                                 const Tensor& row_mask, float scale, const Tensor& loss);
void l1_loss_backward_masked_cuda(const Tensor& grad_loss, const Tensor& input,
                                  const Tensor& target, const Tensor& row_mask, float scale,
                                  const Tensor& grad_input);

}  // namespace seqpar::nn::detail
