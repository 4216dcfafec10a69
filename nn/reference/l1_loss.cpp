// The L1 loss's plain loops, as nn/reference/l1_loss.h states them.
#include "nn/reference/l1_loss.h"

#include <cmath>

#include "core/exact_bins.h"
#include "core/exact_sums.h"
#include "nn/eigen_rows.h"
#include "nn/l1_sign.h"

namespace seqpar::nn::reference {

Tensor l1_loss_forward(const Tensor& input, const Tensor& target, float scale, RowMask kept,
                       uint8_t* codes) {
  const auto a = detail::const_rows(input), b = detail::const_rows(target);
  exact::ExactSums sums(1, input.device());
  exact::FlushingSum sum(sums.digits());
  for (Eigen::Index i = 0; i < a.rows(); ++i) {
    if (!kept.keeps(i)) continue;
    for (Eigen::Index j = 0; j < a.cols(); ++j) {
      const float difference = a(i, j) - b(i, j);
      sum.add(static_cast<double>(scale) * std::fabs(static_cast<double>(difference)));
      if (codes != nullptr) codes[i * a.cols() + j] = l1_sign_code(difference);
    }
  }
  sum.finish();
  Tensor loss = Tensor::empty({}, input.device());
  sums.round_into(loss);
  return loss;
}

Tensor l1_loss_backward(float grad_scale, const Tensor& input, const Tensor& target, RowMask kept) {
  const auto a = detail::const_rows(input), b = detail::const_rows(target);
  Tensor grad_input = Tensor::empty(input.shape(), input.device());
  auto grad = detail::rows(grad_input);
  for (Eigen::Index i = 0; i < a.rows(); ++i) {
    for (Eigen::Index j = 0; j < a.cols(); ++j) {
      // A row not kept takes no part in the loss: +0, whatever it holds.
      grad(i, j) = kept.keeps(i) ? grad_scale * l1_sign(a(i, j) - b(i, j)) : 0.0f;
    }
  }
  return grad_input;
}

Tensor l1_loss_backward_from_signs(float grad_scale, const uint8_t* codes, const Shape& shape,
                                   Device device) {
  Tensor grad_input = Tensor::empty(shape, device);
  float* grad = grad_input.data();
  for (int64_t i = 0; i < grad_input.numel(); ++i) grad[i] = grad_scale * l1_sign_of(codes[i]);
  return grad_input;
}

}  // namespace seqpar::nn::reference
