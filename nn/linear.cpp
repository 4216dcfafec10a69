#include "nn/linear.h"

#include <cmath>

#include "autograd/node.h"
#include "autograd/ops.h"
#include "core/checks.h"
#include "core/device_buffer.h"
#include "core/error.h"
#include "core/exact_sums.h"
#include "nn/eigen_rows.h"
#include "nn/exact_gradients.h"
#include "nn/linear_kernels.h"
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
// One table for the op: which implementation runs, by the tensors' device. Every row
// gives the reference's bits (tests/nn/linear_reference_test.cpp and, on a GPU,
// linear_cuda_test.cpp check them on random shapes and data).
//
//   device     y = x Wᵀ + b, dx = dy W           dW, db (exact row sums, then rounded once)
//   reference  reference/linear.cpp: plain      reference/linear.cpp: one binned sum per
//              fma chains                       output, over the rows in order
//   cpu        fast/linear_cpu.cpp: AVX-512     fast/linear_cpu.cpp: integer sums of ±x in
//              chains, 16 outputs a vector      fixed point when every dy has one magnitude
//              (the portable loop without it)   (an L1 loss's dy), else binned sums 8 lanes
//                                               a vector, from the first reachable bin
//   cuda       linear.cu: the forward and dx    linear_row_sums.cu: which dW kernel runs is
//              kernels by shape (its table)     its table's choice (shape, then dy's data)
//
// Why a fast CPU path at all: the default run of seqpar-repro trains on 12,000 rows on
// the CPU, and the plain loops take seconds where the fast ones take a fraction of one.

namespace {

Tensor forward(const Tensor& x, const Tensor& weight, const Tensor& bias, unsigned int* x_largest) {
  check_x_and_weight("linear", x, weight);
  check_bias(bias, weight);
  const Tensor x_rows = detail::with_unit_column_stride(x);
  const Tensor weight_rows = weight.contiguous(), bias_values = bias.contiguous();
  Tensor y = Tensor::empty({x.size(0), weight.size(0)}, x.device());
  switch (x.device().type) {
    case DeviceType::Reference:
      reference::linear_chains(detail::const_rows_of(x_rows), detail::const_rows_of(weight_rows),
                               bias_values.data(), y.data(), y.size(1));
      return y;
    case DeviceType::CPU:
      detail::chain_products_cpu(detail::const_rows_of(x_rows), detail::const_rows_of(weight_rows),
                                 bias_values.data(), y.data(), y.size(1));
      return y;
    case DeviceType::CUDA:
      break;
  }
#ifdef SEQPAR_WITH_CUDA
  detail::linear_forward_cuda(x_rows, weight_rows, bias_values, y, x_largest);
  return y;
#else
  (void)x_largest;
  require_host("linear", x.device());
  return y;
#endif
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
      break;
  }
#ifdef SEQPAR_WITH_CUDA
  detail::linear_grad_input_cuda(dy, weight, dx);
#else
  require_host("linear_backward", dy.device());
#endif
  return dx;
}

// dW's exact sums, then db's, in one ExactSums: unrounded.
exact::ExactSums row_sums(const Tensor& dy, const Tensor& x, bool want_weight, bool want_bias,
                          const unsigned int* x_largest) {
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
      break;
  }
#ifdef SEQPAR_WITH_CUDA
  detail::accumulate_linear_grads_cuda(dy_rows, x_rows, sums, want_weight, want_bias, x_largest);
#else
  (void)x_largest;
  require_host("linear_backward", dy.device());
#endif
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
                  bool want_weight, bool want_bias, const unsigned int* x_largest) {
  check_x_and_weight("linear_backward", x, weight);
  check_grad_y(grad_y, x, weight);
  const Tensor dy = grad_y.contiguous(), x_rows = detail::with_unit_column_stride(x);
  const Tensor weight_rows = weight.contiguous();
  Backward result;
  LinearGradients& gradients = result.gradients;
  if (want_x) gradients.x = grad_input(dy, weight_rows, x.shape());
  result.sums = row_sums(dy, x_rows, want_weight, want_bias, x_largest);
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
  return forward(x, weight, bias, nullptr);
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
// and on a GPU x's column maxima from the forward (empty when W takes no gradient). As
// for any saved tensor, x must not change between the forward and the backward: the
// exact dW's bins are chosen from these maxima, so a larger x written in place would
// also lose its sums' exactness, not only give the gradient of other data.
//
// Inside an ExactGradients::Recording, the backward also hands its unrounded dW and db
// sums to the recording, for the caller to add across ranks and round once.
struct LinearBackward : autograd::Node {
  LinearBackward(Tensor x, Variable weight, Variable bias, DeviceBuffer<unsigned int> x_largest)
      : x(std::move(x)), weight(std::move(weight)), bias(std::move(bias)),
        x_largest(std::move(x_largest)) {}
  std::vector<Tensor> apply(const Tensor& grad_output) override {
    const std::vector<autograd::Edge>& edges = next_edges();
    const bool want_weight = edges[1].valid(), want_bias = edges[2].valid();
    Backward result = backward(grad_output, x, weight.data(), edges[0].valid(), want_weight,
                               want_bias, x_largest.data());
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
  DeviceBuffer<unsigned int> x_largest;
};

}  // namespace

Variable linear(const Variable& x, const Variable& weight, const Variable& bias) {
  SEQPAR_CHECK(x.defined() && weight.defined() && bias.defined(),
               "linear: x, weight and bias must all be defined");
  const bool records = autograd::any_requires_grad({&x, &weight, &bias});
  DeviceBuffer<unsigned int> x_largest;
  if (records && weight.requires_grad() && x.data().device().is_cuda()) {
    check_x_and_weight("linear", x.data(), weight.data());
    x_largest = DeviceBuffer<unsigned int>(x.data().size(1), x.data().device());
    x_largest.zero();  // atomic maxima start from zeros
  }
  Tensor y = forward(x.data(), weight.data(), bias.data(), x_largest.data());
  if (!records) return Variable(std::move(y));
  auto node = std::make_shared<LinearBackward>(x.data(), weight, bias, std::move(x_largest));
  node->add_input(x);
  node->add_input(weight);
  node->add_input(bias);
  return Variable::from_op(std::move(y), std::move(node));
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
