#include "nn/linear.h"

#include <cmath>

#include "autograd/node.h"
#include "autograd/ops.h"
#include "core/checks.h"
#include "core/device_buffer.h"
#include "core/error.h"
#include "core/exact_sums.h"
#include "nn/eigen_rows.h"
#include "nn/linear_kernels.h"

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


// The exact row sums of dW and db: accumulated, added over the ranks of the current
// CrossRankScope (if any), rounded once.
LinearGradients linear_backward_cpu(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                                    bool want_x, bool want_weight, bool want_bias) {
  LinearGradients gradients;
  const detail::ConstRows dy = detail::const_rows_of(grad_y);
  if (want_x) {  // dx = dy W: chains over the outputs j, i.e. the rows of Wᵀ are W's columns
    gradients.x = Tensor::empty(x.shape());
    const Tensor weight_t = transposed(weight);
    detail::chain_products_cpu(dy, detail::const_rows_of(weight_t), nullptr, gradients.x.data(),
                               x.size(1));
  }
  // dW's sums, then db's, in one ExactSums, as on the GPU: one combine across ranks.
  const int64_t weight_count = want_weight ? weight.numel() : 0;
  const int64_t bias_count = want_bias ? weight.size(0) : 0;
  if (weight_count + bias_count == 0) return gradients;
  exact::ExactSums sums(weight_count + bias_count, Device::cpu());
  if (want_weight) {  // dW = dyᵀ x
    detail::accumulate_weight_grad_cpu(dy, detail::const_rows_of(x), sums);
  }
  if (want_bias) {  // db = Σ_rows dy
    detail::accumulate_column_sums_cpu(dy, sums, weight_count);
  }
  exact::combine_across_ranks(sums);
  if (want_weight) {
    gradients.weight = Tensor::empty(weight.shape());
    sums.round_into(gradients.weight, 0);
  }
  if (want_bias) {
    gradients.bias = Tensor::empty({weight.size(0)});
    sums.round_into(gradients.bias, weight_count);
  }
  return gradients;
}

}  // namespace

namespace {

// The forward and the backward of both entry points. On a GPU, x_largest carries x's
// column maxima from the forward's pass over x (zeroed by the caller) to the exact dW
// of the backward, which would otherwise read x once more to find them.
Tensor forward(const Tensor& x, const Tensor& weight, const Tensor& bias, unsigned int* x_largest) {
  check_x_and_weight("linear", x, weight);
  check_bias(bias, weight);
  const Tensor x_rows = detail::with_unit_column_stride(x);
  const Tensor weight_rows = weight.contiguous(), bias_values = bias.contiguous();
  // Written whole by either path, in the canonical numerics of nn/linear_kernels.h.
  Tensor y = Tensor::empty({x.size(0), weight.size(0)}, x.device());
#ifdef SEQPAR_WITH_CUDA
  if (x.device().is_cuda()) {
    detail::linear_forward_cuda(x_rows, weight_rows, bias_values, y, x_largest);
    return y;
  }
#endif
  (void)x_largest;
  require_cpu("linear", x.device());
  detail::chain_products_cpu(detail::const_rows_of(x_rows), detail::const_rows_of(weight_rows),
                             bias_values.data(), y.data(), y.size(1));
  return y;
}

LinearGradients backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, bool want_x,
                         bool want_weight, bool want_bias, const unsigned int* x_largest) {
  check_x_and_weight("linear_backward", x, weight);
  check_grad_y(grad_y, x, weight);
  const Tensor dy = grad_y.contiguous(), x_rows = detail::with_unit_column_stride(x);
  const Tensor weight_rows = weight.contiguous();
#ifdef SEQPAR_WITH_CUDA
  if (x.device().is_cuda()) {
    const Device device = x.device();
    LinearGradients gradients;
    if (want_x) gradients.x = Tensor::empty(x.shape(), device);
    const int64_t out = weight.size(0), in = weight.size(1);
    if (want_weight && want_bias) {
      // Side by side in one allocation, dW then db, as their sums are: one rounding
      // launch writes both (linear_backward_cuda).
      const Tensor both = Tensor::empty({out * in + out}, device);
      gradients.weight = both.narrow(0, 0, out * in).view({out, in});
      gradients.bias = both.narrow(0, out * in, out);
    } else if (want_weight) {
      gradients.weight = Tensor::empty({out, in}, device);
    } else if (want_bias) {
      gradients.bias = Tensor::empty({out}, device);
    }
    detail::linear_backward_cuda(dy, x_rows, weight_rows, gradients.x, gradients.weight,
                                 gradients.bias, x_largest);
    return gradients;
  }
#endif
  (void)x_largest;
  require_cpu("linear_backward", x.device());
  return linear_backward_cpu(dy, x_rows, weight_rows, want_x, want_weight, want_bias);
}

}  // namespace

Tensor linear_forward(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return forward(x, weight, bias, nullptr);
}

LinearGradients linear_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                                bool want_x, bool want_weight, bool want_bias) {
  return backward(grad_y, x, weight, want_x, want_weight, want_bias, nullptr);
}

// ---------------------------------------------------------------- autograd

namespace {

// Keeps x and W (views sharing their storage, not copies) for the gradient formulas,
// and on a GPU x's column maxima from the forward (empty when W takes no gradient). As
// for any saved tensor, x must not change between the forward and the backward: the
// exact dW's bins are chosen from these maxima, so a larger x written in place would
// also lose its sums' exactness, not only give the gradient of other data.
struct LinearBackward : autograd::Node {
  LinearBackward(Tensor x, Tensor weight, DeviceBuffer<unsigned int> x_largest)
      : x(std::move(x)), weight(std::move(weight)), x_largest(std::move(x_largest)) {}
  std::vector<Tensor> apply(const Tensor& grad_output) override {
    const std::vector<autograd::Edge>& edges = next_edges();
    LinearGradients gradients = backward(grad_output, x, weight, edges[0].valid(), edges[1].valid(),
                                         edges[2].valid(), x_largest.data());
    return {gradients.x, gradients.weight, gradients.bias};
  }
  std::string name() const override { return "LinearBackward"; }
  Tensor x, weight;
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
  auto node = std::make_shared<LinearBackward>(x.data(), weight.data(), std::move(x_largest));
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
