// L1 loss: reduce(|input - target|), with the reductions the app needs.
//
//   mean          sum / numel           (torch's default; DeepSpeed's per-rank loss)
//   sum           sum
//   sum / count   sum / an explicit count (a rank's share of a loss over rows that
//                 other ranks hold: the "exact" sequence-parallel loss)
//
// The forward is an exact reduction (core/exact_bins.h), the same bits on every device
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
// (the exactness domain of core/exact_bins.h). With no elements the loss is 0 * s: 0,
// or NaN for the mean (torch.mean of nothing). At most exact::kMaxTerms elements.
//
// The gradient with respect to input is scale * sign(input - target), sign(0) = 0
// as in PyTorch, where scale is 1/numel, 1 or 1/count.
//
// A row mask (the counterpart of cross-entropy's ignore_index) is a tensor [n] on the
// inputs' device holding 0 (ignore the row) or 1 (count it). A masked row's elements
// form no term at all, so nothing in it (not even a NaN or an infinity) reaches the
// loss, and its gradient (in input and in target) is +0 exactly. The mean divides by
// the unmasked elements, unmasked rows x m, as torch's mean under ignore_index
// divides by the tokens not ignored; with none the loss is NaN, as torch's. sum and
// sum / count are as without a mask. The forward is the same exact sum, over the
// unmasked rows' terms only, rounded once: with a mask of ones it is the unmasked
// loss, bit for bit, and a masked row changes nothing but the mean's count.
//
// The mask is checked (shape and every value) on the host: on a GPU that is one copy
// of its n values and a wait for the stream, which only the masked overloads pay.
//
// The gradient needs nothing of the inputs but each element's sign, so the unmasked
// autograd node keeps the forward's signs (L1Signs, one byte an element) instead of
// input and target: its backward reads one byte an element where it would read eight,
// and a change made to input or target in place after the forward cannot reach the
// gradient. The masked node keeps its inputs: its target gradient is sign(target -
// input) itself, whose zeros the signs of input - target do not tell (input = target
// = 1 gives +0 both ways; input = +0, target = -0 gives +0 and -0).
#pragma once

#include <cstdint>

#include "autograd/variable.h"
#include "core/device_buffer.h"
#include "core/tensor.h"
#include "seqpar/config.h"

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

// sign(input - target) of every element as the forward saw it, in nn/l1_sign.h's
// one-byte codes: [n, m] row-major on the inputs' device.
struct L1Signs {
  DeviceBuffer<uint8_t> codes;
  Shape shape;
};
// The loss, as above, and the signs into *signs in the same pass over the inputs.
Tensor l1_loss_forward(const Tensor& input, const Tensor& target, Reduction reduction,
                       L1Signs* signs);
// d loss / d input from the forward's signs: bitwise the backward from the inputs,
// save that a NaN gradient is a NaN without the difference's payload.
Tensor l1_loss_backward(const Tensor& grad_loss, const L1Signs& signs, Reduction reduction);

// With a row mask: the mask as above, [n] for inputs [n, m], on their device.
Tensor l1_loss_forward(const Tensor& input, const Tensor& target, Reduction reduction,
                       const Tensor& row_mask);
Tensor l1_loss_backward(const Tensor& grad_loss, const Tensor& input, const Tensor& target,
                        Reduction reduction, const Tensor& row_mask);

// The rows a row mask counts (its ones), after checking it as the loss does: `rows`
// values of 0 or 1, on `device`. `op` names the caller in the error.
int64_t unmasked_rows(const char* op, const Tensor& row_mask, int64_t rows, Device device);

// ---- differentiable (in input and in target) ----
autograd::Variable l1_loss(const autograd::Variable& input, const autograd::Variable& target,
                           Reduction reduction = Reduction::mean());
// With a row mask (not differentiated: it is data, as ignore_index's labels).
autograd::Variable l1_loss(const autograd::Variable& input, const autograd::Variable& target,
                           Reduction reduction, const Tensor& row_mask);

namespace detail {
}  // namespace detail

}  // namespace seqpar::nn
