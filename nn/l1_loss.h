// L1 loss: reduce(|input - target|), with the reductions the app needs.
//
//   mean          sum / numel           (torch's default; DeepSpeed's per-rank loss)
//   sum           sum
//   sum / count   sum / an explicit count (a rank's share of a loss over rows that
//                 other ranks hold: the "exact" sequence-parallel loss)
//
// The forward is an exact reduction (core/exact_sum.h), the same bits on every device
// and for any order of the elements (a permutation of the rows changes nothing):
//
//   s   = (float)scale(numel)                 (the double scale rounded to float32 once)
//   d_i = fl32(input_i - target_i)
//   loss = round_to_float( exact Σ_i (double)s * (double)|d_i| )
//
// Each term, a product of two floats, is exact in double; the terms are summed
// without rounding and the total is rounded once to nearest even. Non-finite values
// follow the exact sums' rules: a NaN term (or NaN input) gives NaN, else an infinite
// |d_i| gives +inf, and a finite total beyond float32's range rounds to +inf. A term
// below 2^-149 (a tiny |d_i| times a small s) is first rounded to a multiple of 2^-149
// (the exactness domain of core/exact_sum.h). With no elements the loss is 0 * s: 0,
// or NaN for the mean (torch.mean of nothing). At most exact::kMaxTerms elements.
//
// The gradient with respect to input is scale * sign(input - target), sign(0) = 0
// as in PyTorch, where scale is 1/numel, 1 or 1/count.
#pragma once

#include <cstdint>

#include "autograd/variable.h"
#include "core/tensor.h"

namespace seqpar::nn {

struct Reduction {
  enum class Kind { Mean, Sum, SumDividedBy };
  Kind kind = Kind::Mean;
  int64_t divisor = 1;  // only for SumDividedBy

  static Reduction mean() { return {Kind::Mean, 1}; }
  static Reduction sum() { return {Kind::Sum, 1}; }
  static Reduction sum_divided_by(int64_t count);  // count must be positive

  // The factor the plain sum is multiplied by for `numel` elements.
  double scale(int64_t numel) const;
};

// ---- compute, no autograd ----
// Both [n, m] (either may be a strided view); the loss is a one-element tensor of
// shape {} on the inputs' device (it stays there: no host round trip).
Tensor l1_loss_forward(const Tensor& input, const Tensor& target, Reduction reduction);
// d loss / d input, given d (final) / d loss as a one-element device tensor.
Tensor l1_loss_backward(const Tensor& grad_loss, const Tensor& input, const Tensor& target,
                        Reduction reduction);

// ---- differentiable (in input and in target) ----
autograd::Variable l1_loss(const autograd::Variable& input, const autograd::Variable& target,
                           Reduction reduction = Reduction::mean());

namespace detail {
#ifdef SEQPAR_WITH_CUDA
// CUDA launchers (l1_loss.cu). input and target are [n, m] with unit column stride
// and their own row strides; `scale` as in Reduction::scale, rounded to float. The
// forward is the exact sum above (integer atomics on the digits, then one rounding)
// into loss (shape {}): bitwise the CPU's loss.
void l1_loss_forward_cuda(const Tensor& input, const Tensor& target, float scale,
                          const Tensor& loss);
void l1_loss_backward_cuda(const Tensor& grad_loss, const Tensor& input, const Tensor& target,
                           float scale, const Tensor& grad_input);
#endif
}  // namespace detail

}  // namespace seqpar::nn
