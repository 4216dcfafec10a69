// Linear: y = x Wᵀ + b, with its gradients dW = dyᵀ x, db = Σ_rows dy, dx = dy W.
//
// x is [n, in] and may be a view with any row stride (a rank's rows of the full
// batch, or a column window of a wider tensor); W is [out, in]; b is [out].
// The compute functions dispatch on the device: the CPU path (Eigen) in
// linear.cpp is the readable reference, the CUDA path is in linear.cu.
#pragma once

#include <cstdint>

#include "autograd/variable.h"
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

namespace detail {
#ifdef SEQPAR_WITH_CUDA
// Which kernels the CUDA launchers use. Auto: the skinny ones (nn/linear_skinny.h)
// for out_features <= 64 (the forward and dW), the 128 x 128 GEMM (nn/linear_large.h)
// for large aligned products, the 64 x 64 tiled GEMM otherwise. General: never the
// skinny ones. Tiled64: only the 64 x 64 tiled GEMM. Slice8, Slice16: as General, with
// the 128 x 128 GEMM's K slices 8 or 16 deep (K split into whole slices of that depth);
// Auto and General use kLargeSlice. (All but Auto are for comparisons.)
enum class LinearKernel { Auto, General, Tiled64, Slice8, Slice16 };
// CUDA launchers (linear.cu). Arguments are checked and shaped by the dispatchers in
// linear.cpp: x is [n, in] with unit column stride and row stride x.stride(0);
// weight [out, in], bias [out], y / grad_y [n, out] contiguous. Outputs are written
// whole (never accumulated into). Undefined gradient outputs are skipped.
void linear_forward_cuda(const Tensor& x, const Tensor& weight, const Tensor& bias,
                         const Tensor& y, LinearKernel kernel = LinearKernel::Auto);
// dx by the GEMM (no K split: the canonical chains); dW and db by the exact row sums,
// added over the ranks of the current exact::CrossRankScope and rounded once.
void linear_backward_cuda(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                          const Tensor& grad_x, const Tensor& grad_weight,
                          const Tensor& grad_bias, LinearKernel kernel = LinearKernel::Auto);

// The GEMM that the launchers run for one product of a Linear, for the tests, which
// check that their shapes reach the kernel they mean to test. `left` and `right` are
// the product's operands in the order of its formula, `result` its output, all as the
// launchers take them: Output y = x Wᵀ (x, weight, y), GradInput dx = dy W (grad_y,
// weight, grad_x), GradWeight dW = dyᵀ x (grad_y, x, grad_weight). The skinny kernels,
// which Auto prefers for out_features <= 64, are not considered.
enum class LinearProduct { Output, GradInput, GradWeight };
struct GemmChoice {
  bool large;           // the 128 x 128 kernel, else the 64 x 64 one
  int64_t splits;       // K ranges, summed in order by a second kernel when more than one
  int64_t k_per_split;  // the length of each range (the last may be shorter)
  int64_t slice;        // the kernel's K slice depth, of which k_per_split is a multiple
};
GemmChoice linear_gemm_choice(LinearProduct product, const Tensor& left, const Tensor& right,
                              const Tensor& result, LinearKernel kernel = LinearKernel::Auto);
#endif
}  // namespace detail

}  // namespace seqpar::nn
