// Linear: y = x Wᵀ + b, with its gradients dW = dyᵀ x, db = Σ_rows dy, dx = dy W.
//
// x is [n, in] and may be a view with any row stride (a rank's rows of the full
// batch, or a column window of a wider tensor); W is [out, in]; b is [out].
// The compute functions dispatch on the device (the table in linear.cpp): the plain
// reference (nn/reference/linear.h, which defines the bits), the fast CPU loops and the
// CUDA kernels, all giving the reference's bits.
#pragma once

#include <cstdint>

#include "autograd/variable.h"
#include "core/exact_sums.h"
#include "core/generator.h"
#include "core/tensor.h"
#include "nn/module.h"

namespace seqpar::nn {

// ---- compute, no autograd ----
Tensor linear_forward(const Tensor& x, const Tensor& weight, const Tensor& bias);

struct LinearGradients {
  Tensor x, weight, bias;  // undefined where not asked for
};
LinearGradients linear_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                                bool want_x, bool want_weight, bool want_bias);
// dW's exact row sums, then db's (each where asked), not yet rounded: what
// linear_backward rounds, and what ranks add together before rounding once
// (nn/exact_gradients.h).
exact::ExactSums linear_row_sums(const Tensor& grad_y, const Tensor& x, bool want_weight,
                                 bool want_bias);

// ---- differentiable ----
autograd::Variable linear(const autograd::Variable& x, const autograd::Variable& weight,
                          const autograd::Variable& bias);

// ---- module ----
// Initialized like PyTorch's nn.Linear: weight, then bias, each uniform in
// ±1/sqrt(in_features), drawn from `generator` on the host (device-independent).
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, Generator& generator,
         Device device = Device::cpu());
  autograd::Variable forward(const autograd::Variable& x) const;

  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }
  const autograd::Variable& weight() const { return weight_; }
  const autograd::Variable& bias() const { return bias_; }

 private:
  int64_t in_features_, out_features_;
  autograd::Variable weight_, bias_;
};

}  // namespace seqpar::nn
