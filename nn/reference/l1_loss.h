// The L1 loss's plain reference: the loops that define its bits (nn/l1_loss.h has the
// op and its dispatch table).
//
//   loss     = Σ_kept rows, j  s |input[i, j] - target[i, j]|   exact, rounded once
//   d input  = g sign(input - target), g = fl32(s * grad_loss); +0 on rows not kept
//
// Each term s |d| (d = fl32(input - target), s the loss's float scale) is a product of
// two floats, exact in a double, and the terms are summed exactly (core/exact_bins.h),
// so the loop's order changes nothing. sign(0) = 0 and a NaN stays NaN (nn/l1_sign.h).
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace seqpar::nn::reference {

// Which rows form terms: every row (data null), or those whose mask value
// data[row * stride] is nonzero.
struct RowMask {
  const float* data = nullptr;
  int64_t stride = 0;
  bool keeps(int64_t row) const { return data == nullptr || data[row * stride] != 0.0f; }
};

// input and target [n, m] on the host, unit column stride. With `codes`, each element's
// sign code (nn/l1_sign.h) goes to codes[i * m + j].
Tensor l1_loss_forward(const Tensor& input, const Tensor& target, float scale, RowMask kept = {},
                       uint8_t* codes = nullptr);
// grad_scale: g, the gradient's factor.
Tensor l1_loss_backward(float grad_scale, const Tensor& input, const Tensor& target,
                        RowMask kept = {});
// The same from the forward's sign codes, `shape` elements.
Tensor l1_loss_backward_from_signs(float grad_scale, const uint8_t* codes, const Shape& shape,
                                   Device device);

}  // namespace seqpar::nn::reference
