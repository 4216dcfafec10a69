#include "nn/linear.h"

#include <cmath>
#include <memory>

#include "autograd/node.h"
#include "autograd/ops.h"
#include "core/checks.h"
#include "core/error.h"
#include "core/exact_sums.h"
#include "nn/eigen_rows.h"
#include "nn/exact_gradients.h"
#include "nn/cpu/linear.h"
#include "nn/cuda/linear.h"
#include "nn/reference/linear.h"

namespace seqpar::nn {

using autograd::Variable;

namespace {

// x [n, in] and W [out, in] on one device.
void check_x_and_weight(const char* op, const Tensor& x, const Tensor& weight) {
  SEQPAR_CHECK(x.defined() && weight.defined(), op, ": x and weight must be defined");
  SEQPAR_CHECK(x.dim() == 2, op, ": x must be [n, in_features], got shape ", x.shape());
  SEQPAR_CHECK(weight.dim() == 2, op, ": weight must be [out_features, in_features], got shape ",
               weight.shape());
  SEQPAR_CHECK(x.size(1) == weight.size(1), op, ": x of shape ", x.shape(), " has ", x.size(1),
               " features but weight of shape ", weight.shape(), " expects ", weight.size(1));
  SEQPAR_CHECK(x.device() == weight.device(), op, ": x is on ", x.device(), " but weight is on ",
               weight.device());
}

void check_bias(const Tensor& bias, const Tensor& weight) {
  SEQPAR_CHECK(bias.defined(), "linear: bias must be defined");
  SEQPAR_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0), "linear: bias must be [",
               weight.size(0), "] to match weight of shape ", weight.shape(), ", got shape ",
               bias.shape());
  SEQPAR_CHECK(bias.device() == weight.device(), "linear: bias is on ", bias.device(),
               " but weight is on ", weight.device());
}

void check_grad_y(const Tensor& grad_y, const Tensor& x, const Tensor& weight) {
  SEQPAR_CHECK(grad_y.defined(), "linear_backward: grad_y is undefined");
  const Shape expected{x.size(0), weight.size(0)};
  SEQPAR_CHECK(grad_y.shape() == expected, "linear_backward: grad_y has shape ", grad_y.shape(),
               " but the output has shape ", expected);
  SEQPAR_CHECK(grad_y.device() == x.device(), "linear_backward: grad_y is on ", grad_y.device(),
               " but x is on ", x.device());
}

// A contiguous copy of the transpose of a contiguous matrix.
Tensor transposed(const Tensor& matrix) {
  Tensor result = Tensor::empty({matrix.size(1), matrix.size(0)}, matrix.device());
  detail::rows(result) = detail::const_rows(matrix).transpose();
  return result;
}

}  // namespace

// ---------------------------------------------------------------- dispatch
//
// One table for the op, written as the switches below: which implementation runs, by
// the tensors' device. Every row gives the reference's bits (tests/nn/linear_reference_test.cpp
// and, on a GPU, linear_cuda_test.cpp check them on random shapes and data).
//
//   device     y = x Wᵀ + b, dx = dy W           dW, db (exact row sums, then rounded once)
//   reference  nn/reference/linear.cpp: plain   nn/reference/linear.cpp: one binned sum per
//              fma chains                       output, over the rows in order
//   cpu        nn/cpu/linear.cpp: AVX-512       nn/cpu/linear.cpp: integer sums of ±x in
//              chains, 16 outputs a vector      fixed point when every dy has one magnitude
//              (the portable loop without it)   (an L1 loss's dy), else binned sums 8 lanes
//                                               a vector, from the first reachable bin
//   cuda       nn/cuda/linear.cu: the forward   nn/cuda/linear_row_sums.cu, on the kernel
//              and dx kernels by shape (its     that choose_weight_grad_kernel picks
//              table)                           (nn/cuda/weight_grad_choice.h)
//
// Each row's call chain down to its kernels, its decisions and its waits: docs/paths.md.
//
// Why a fast CPU path at all: the default run of seqpar-repro trains on 12,000 rows on
// the CPU, and the plain loops take seconds where the fast ones take a fraction of one.
//
// What a backend keeps from its forward for its backward is its own (BackendState,
// opaque here): only the CUDA row keeps anything.

namespace detail {
struct LinearBackendState;  // defined by the backend that keeps one (nn/cuda/linear.cu)
}  // namespace detail

namespace {

using BackendState = std::shared_ptr<detail::LinearBackendState>;

struct Forward {
  Tensor y;
  BackendState state;
};

// keep_state: the backward will want dW, so a backend may keep what helps it.
Forward forward(const Tensor& x, const Tensor& weight, const Tensor& bias, bool keep_state) {
  check_x_and_weight("linear", x, weight);
  check_bias(bias, weight);
  const Tensor x_rows = detail::with_unit_column_stride(x);
  const Tensor weight_rows = weight.contiguous(), bias_values = bias.contiguous();
  Forward result{Tensor::empty({x.size(0), weight.size(0)}, x.device()), nullptr};
  Tensor& y = result.y;
  switch (x.device().type) {
    case DeviceType::Reference:
      reference::linear_chains(detail::const_rows_of(x_rows), detail::const_rows_of(weight_rows),
                               bias_values.data(), y.data(), y.size(1));
      return result;
    case DeviceType::CPU:
      detail::chain_products_cpu(detail::const_rows_of(x_rows), detail::const_rows_of(weight_rows),
                                 bias_values.data(), y.data(), y.size(1));
      return result;
    case DeviceType::CUDA:
#ifdef SEQPAR_WITH_CUDA
      if (keep_state) {
        result.state = detail::linear_forward_cuda_keeping_state(x_rows, weight_rows, bias_values, y);
      } else {
        detail::linear_forward_cuda(x_rows, weight_rows, bias_values, y);
      }
      return result;
#else
      (void)keep_state;
      require_host("linear", x.device());
#endif
  }
  return result;
}

Tensor grad_input(const Tensor& dy, const Tensor& weight, const Shape& x_shape) {
  Tensor dx = Tensor::empty(x_shape, dy.device());
  switch (dy.device().type) {
    case DeviceType::Reference:
      reference::linear_grad_input(detail::const_rows_of(dy), detail::const_rows_of(weight),
                                   dx.data(), dx.size(1));
      return dx;
    case DeviceType::CPU:  // chains over the outputs j: the rows of Wᵀ are W's columns
      detail::chain_products_cpu(detail::const_rows_of(dy), detail::const_rows_of(transposed(weight)),
                                 nullptr, dx.data(), dx.size(1));
      return dx;
    case DeviceType::CUDA:
#ifdef SEQPAR_WITH_CUDA
      detail::linear_grad_input_cuda(dy, weight, dx);
#else
      require_host("linear_backward", dy.device());
#endif
  }
  return dx;
}

// dW's exact sums, then db's, in one ExactSums: unrounded. `state`: the forward's, if
// its backend kept one.
exact::ExactSums row_sums(const Tensor& dy, const Tensor& x, bool want_weight, bool want_bias,
                          const detail::LinearBackendState* state) {
  const int64_t weight_count = want_weight ? dy.size(1) * x.size(1) : 0;
  const int64_t bias_count = want_bias ? dy.size(1) : 0;
  exact::ExactSums sums(weight_count + bias_count, dy.device());
  if (weight_count + bias_count == 0) return sums;
  const detail::ConstRows dy_rows = detail::const_rows_of(dy), x_rows = detail::const_rows_of(x);
  switch (dy.device().type) {
    case DeviceType::Reference:
      if (want_weight) reference::linear_weight_sums(dy_rows, x_rows, sums, 0);
      if (want_bias) reference::linear_bias_sums(dy_rows, sums, weight_count);
      return sums;
    case DeviceType::CPU:
      if (want_weight) detail::accumulate_weight_grad_cpu(dy_rows, x_rows, sums);
      if (want_bias) detail::accumulate_column_sums_cpu(dy_rows, sums, weight_count);
      return sums;
    case DeviceType::CUDA:
#ifdef SEQPAR_WITH_CUDA
      detail::accumulate_linear_grads_cuda(dy_rows, x_rows, sums, want_weight, want_bias,
                                           detail::kept_x_maxima(state));
#else
      (void)state;
      require_host("linear_backward", dy.device());
#endif
  }
  return sums;
}

// The backward, and the exact sums its dW and db were rounded from (for
// ExactGradients). dW and db lie side by side in one allocation, as their sums do, so
// one rounding writes both.
struct Backward {
  LinearGradients gradients;
  exact::ExactSums sums;
};

Backward backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, bool want_x,
                  bool want_weight, bool want_bias, const detail::LinearBackendState* state) {
  check_x_and_weight("linear_backward", x, weight);
  check_grad_y(grad_y, x, weight);
  const Tensor dy = grad_y.contiguous(), x_rows = detail::with_unit_column_stride(x);
  const Tensor weight_rows = weight.contiguous();
  Backward result;
  LinearGradients& gradients = result.gradients;
  if (want_x) gradients.x = grad_input(dy, weight_rows, x.shape());
  result.sums = row_sums(dy, x_rows, want_weight, want_bias, state);
  if (result.sums.count() == 0) return result;
  const int64_t out = weight.size(0), in = weight.size(1);
  const int64_t weight_count = want_weight ? out * in : 0;
  const Tensor both = Tensor::empty({result.sums.count()}, x.device());
  result.sums.round_into(both);
  if (want_weight) gradients.weight = both.narrow(0, 0, weight_count).view({out, in});
  if (want_bias) gradients.bias = both.narrow(0, weight_count, out);
  return result;
}

}  // namespace

Tensor linear_forward(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return forward(x, weight, bias, false).y;
}

LinearGradients linear_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                                bool want_x, bool want_weight, bool want_bias) {
  return backward(grad_y, x, weight, want_x, want_weight, want_bias, nullptr).gradients;
}

exact::ExactSums linear_row_sums(const Tensor& grad_y, const Tensor& x, bool want_weight,
                                 bool want_bias) {
  SEQPAR_CHECK(grad_y.defined() && x.defined() && grad_y.dim() == 2 && x.dim() == 2 &&
                   grad_y.size(0) == x.size(0) && grad_y.device() == x.device(),
               "linear_row_sums: grad_y ", grad_y.shape(), " and x ", x.shape(),
               " must be matrices of as many rows, on one device");
  return row_sums(grad_y.contiguous(), detail::with_unit_column_stride(x), want_weight, want_bias,
                  nullptr);
}

// ---------------------------------------------------------------- autograd

namespace {

// Keeps x and W (views sharing their storage, not copies) for the gradient formulas,
// and whatever the forward's backend kept for its backward (its BackendState). As for
// any saved tensor, x must not change between the forward and the backward: it would
// give the gradient of other data, and a backend's state describes the x it saw.
//
// Inside an ExactGradients::Recording, the backward also hands its unrounded dW and db
// sums to the recording, for the caller to add across ranks and round once.
struct LinearBackward : autograd::Node {
  LinearBackward(Tensor x, Variable weight, Variable bias, BackendState state)
      : x(std::move(x)), weight(std::move(weight)), bias(std::move(bias)), state(std::move(state)) {}
  std::vector<Tensor> apply(const Tensor& grad_output) override {
    const std::vector<autograd::Edge>& edges = next_edges();
    const bool want_weight = edges[1].valid(), want_bias = edges[2].valid();
    Backward result = backward(grad_output, x, weight.data(), edges[0].valid(), want_weight,
                               want_bias, state.get());
    std::vector<ExactGradients::Target> targets;
    if (want_weight) targets.push_back({weight, 0});
    if (want_bias) targets.push_back({bias, want_weight ? weight.data().numel() : 0});
    if (!targets.empty()) ExactGradients::record(std::move(result.sums), std::move(targets));
    const LinearGradients& gradients = result.gradients;
    return {gradients.x, gradients.weight, gradients.bias};
  }
  std::string name() const override { return "LinearBackward"; }
  Tensor x;
  Variable weight, bias;  // the parameters themselves: ExactGradients rounds into their .grad()
  BackendState state;
};

}  // namespace

Variable linear(const Variable& x, const Variable& weight, const Variable& bias) {
  SEQPAR_CHECK(x.defined() && weight.defined() && bias.defined(),
               "linear: x, weight and bias must all be defined");
  const bool records = autograd::any_requires_grad({&x, &weight, &bias});
  Forward result = forward(x.data(), weight.data(), bias.data(), records && weight.requires_grad());
  if (!records) return Variable(std::move(result.y));
  auto node = std::make_shared<LinearBackward>(x.data(), weight, bias, std::move(result.state));
  node->add_input(x);
  node->add_input(weight);
  node->add_input(bias);
  return Variable::from_op(std::move(result.y), std::move(node));
}

// ---------------------------------------------------------------- module

Linear::Linear(int64_t in_features, int64_t out_features, Generator& generator, Device device)
    : in_features_(in_features), out_features_(out_features) {
  SEQPAR_CHECK(in_features > 0, "Linear: in_features must be positive, got ", in_features);
  SEQPAR_CHECK(out_features > 0, "Linear: out_features must be positive, got ", out_features);
  // PyTorch's nn.Linear default: kaiming_uniform(a=√5) for the weight and the same
  // bound for the bias both come to ±1/√in_features.
  const float bound = static_cast<float>(1.0 / std::sqrt(static_cast<double>(in_features)));
  weight_ = register_parameter(
      "weight", generator.uniform({out_features, in_features}, -bound, bound, device));
  bias_ = register_parameter("bias", generator.uniform({out_features}, -bound, bound, device));
}

Variable Linear::forward(const Variable& x) const { return linear(x, weight_, bias_); }

}  // namespace seqpar::nn
