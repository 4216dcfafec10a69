#include "autograd/ops.h"

#include "autograd/engine.h"
#include "autograd/node.h"
#include "core/elementwise.h"
#include "core/error.h"

namespace seqpar::autograd {

bool any_requires_grad(std::initializer_list<const Variable*> inputs) {
  if (!grad_mode_enabled()) return false;
  for (const Variable* input : inputs) {
    if (input->defined() && input->requires_grad()) return true;
  }
  return false;
}

// ---------------------------------------------------------------- add, sub

namespace {

// `output` of a two-input op, recorded with a Backward node when either input wants
// a gradient.
template <typename Backward>
Variable binary_result(Tensor output, const Variable& a, const Variable& b) {
  if (!any_requires_grad({&a, &b})) return Variable(std::move(output));
  auto node = std::make_shared<Backward>();
  node->add_input(a);
  node->add_input(b);
  return Variable::from_op(std::move(output), std::move(node));
}

}  // namespace

// d(a + b) = (g, g).
struct AddBackward : Node {
  std::vector<Tensor> apply(const Tensor& grad_output) override { return {grad_output, grad_output}; }
  std::string name() const override { return "AddBackward"; }
};

Variable add(const Variable& a, const Variable& b) {
  return binary_result<AddBackward>(seqpar::add(a.data(), b.data()), a, b);
}

// d(a - b) = (g, -g).
struct SubBackward : Node {
  std::vector<Tensor> apply(const Tensor& grad_output) override {
    const bool want_b = next_edges()[1].valid();
    return {grad_output, want_b ? seqpar::mul(grad_output, -1.0f) : Tensor()};
  }
  std::string name() const override { return "SubBackward"; }
};

Variable sub(const Variable& a, const Variable& b) {
  return binary_result<SubBackward>(seqpar::sub(a.data(), b.data()), a, b);
}

// ---------------------------------------------------------------- mul by a scalar

// d(a * s) = g * s.
struct MulBackward : Node {
  explicit MulBackward(float scalar) : scalar(scalar) {}
  std::vector<Tensor> apply(const Tensor& grad_output) override {
    return {seqpar::mul(grad_output, scalar)};
  }
  std::string name() const override { return "MulBackward"; }
  float scalar;
};

Variable mul(const Variable& a, float scalar) {
  Tensor output = seqpar::mul(a.data(), scalar);
  if (!any_requires_grad({&a})) return Variable(std::move(output));
  auto node = std::make_shared<MulBackward>(scalar);
  node->add_input(a);
  return Variable::from_op(std::move(output), std::move(node));
}

// ---------------------------------------------------------------- narrow

// The gradient of a window is the window's gradient placed back into zeros of the
// input's shape.
struct NarrowBackward : Node {
  NarrowBackward(int64_t dim, int64_t start, int64_t length)
      : dim(dim), start(start), length(length) {}
  std::vector<Tensor> apply(const Tensor& grad_output) override {
    const InputMetadata& input = input_metadata()[0];
    Tensor grad_input = Tensor::zeros(input.shape, input.device);
    grad_input.narrow(dim, start, length).copy_(grad_output);
    return {grad_input};
  }
  std::string name() const override { return "NarrowBackward"; }
  int64_t dim, start, length;
};

Variable narrow(const Variable& input, int64_t dim, int64_t start, int64_t length) {
  Tensor output = input.data().narrow(dim, start, length);  // a view: no copy
  if (!any_requires_grad({&input})) return Variable(std::move(output));
  auto node = std::make_shared<NarrowBackward>(dim, start, length);
  node->add_input(input);
  return Variable::from_op(std::move(output), std::move(node));
}

}  // namespace seqpar::autograd
