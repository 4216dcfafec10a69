#include "autograd/variable.h"

#include "autograd/engine.h"
#include "autograd/node.h"
#include "core/elementwise.h"
#include "core/error.h"

namespace seqpar::autograd {

// Everything a Variable is. Copies of a Variable share one Impl, so a gradient
// accumulated through one copy is visible through all of them.
struct Variable::Impl {
  Tensor data;
  bool requires_grad = false;
  Tensor grad;                                   // undefined until a backward pass reaches a leaf
  uint64_t grad_accumulations = 0;               // backward passes that added into grad
  std::shared_ptr<Node> grad_fn;                 // null for leaves
  std::shared_ptr<AccumulateGrad> accumulator;   // a leaf's gradient sink, made on first use
};

Variable::Variable(Tensor data, bool requires_grad) : impl_(std::make_shared<Impl>()) {
  SEQPAR_CHECK(data.defined(), "Variable: cannot wrap an undefined tensor");
  impl_->data = std::move(data);
  impl_->requires_grad = requires_grad;
}

Variable Variable::from_op(Tensor data, std::shared_ptr<Node> grad_fn) {
  SEQPAR_CHECK(grad_fn != nullptr, "Variable::from_op: an op output needs its grad_fn");
  Variable output(std::move(data), /*requires_grad=*/true);
  output.impl_->grad_fn = std::move(grad_fn);
  return output;
}

const Tensor& Variable::data() const {
  SEQPAR_CHECK(defined(), "Variable::data: the Variable is undefined");
  return impl_->data;
}

// Writes into the existing storage instead of rebinding it, so that every alias and
// every raw pointer to the parameter (a captured CUDA graph, an optimizer) sees the
// new values.
void Variable::set_data(const Tensor& data) const {
  SEQPAR_CHECK(data.defined(), "Variable::set_data: the new data is undefined");
  SEQPAR_CHECK(data.shape() == shape(), "Variable::set_data: new data has shape ", data.shape(),
               " but the Variable has shape ", shape());
  impl_->data.copy_(data);
}

bool Variable::requires_grad() const {
  return defined() && (impl_->requires_grad || impl_->grad_fn != nullptr);
}

void Variable::set_requires_grad(bool requires_grad) const {
  SEQPAR_CHECK(is_leaf(), "set_requires_grad: only a leaf can be switched; this Variable was "
               "produced by ", impl_->grad_fn->name());
  impl_->requires_grad = requires_grad;
}

bool Variable::is_leaf() const {
  SEQPAR_CHECK(defined(), "is_leaf: the Variable is undefined");
  return impl_->grad_fn == nullptr;
}

const Tensor& Variable::grad() const {
  SEQPAR_CHECK(defined(), "grad: the Variable is undefined");
  return impl_->grad;
}

void Variable::set_grad(const Tensor& grad) const {
  SEQPAR_CHECK(defined(), "set_grad: the Variable is undefined");
  if (grad.defined()) {
    SEQPAR_CHECK(grad.shape() == shape(), "set_grad: gradient of shape ", grad.shape(),
                 " for a Variable of shape ", shape());
    SEQPAR_CHECK(grad.device() == device(), "set_grad: gradient on ", grad.device(),
                 " for a Variable on ", device());
  }
  impl_->grad = grad;
}

void Variable::zero_grad() const {
  if (grad().defined()) impl_->grad.fill_(0.0f);
}

uint64_t Variable::grad_accumulations() const {
  SEQPAR_CHECK(defined(), "grad_accumulations: the Variable is undefined");
  return impl_->grad_accumulations;
}

const std::shared_ptr<Node>& Variable::grad_fn() const {
  SEQPAR_CHECK(defined(), "grad_fn: the Variable is undefined");
  return impl_->grad_fn;
}

Edge Variable::gradient_edge() const {
  if (!defined()) return Edge{};
  if (impl_->grad_fn) return Edge{impl_->grad_fn, 0};
  if (!impl_->requires_grad) return Edge{};
  // One AccumulateGrad per leaf, kept for its lifetime: every graph that uses the
  // leaf sends its gradient to the same sink.
  if (!impl_->accumulator) impl_->accumulator = std::make_shared<AccumulateGrad>(*this);
  return Edge{impl_->accumulator, 0};
}

void Variable::backward(const Tensor& gradient) const {
  SEQPAR_CHECK(defined(), "backward: the Variable is undefined");
  if (gradient.defined()) return run_backward(*this, gradient);
  SEQPAR_CHECK(data().numel() == 1, "backward: a Variable of shape ", shape(),
               " is not a scalar; pass the gradient of the output explicitly");
  run_backward(*this, Tensor::ones(shape(), device()));
}

// ---------------------------------------------------------------- AccumulateGrad
// (here rather than in node.cpp because it writes into Variable::Impl)

AccumulateGrad::AccumulateGrad(const Variable& leaf) : leaf_(leaf.impl_) {}

std::vector<Tensor> AccumulateGrad::apply(const Tensor& grad_output) {
  const std::shared_ptr<Variable::Impl> leaf = leaf_.lock();
  if (!leaf) return {};  // the leaf is gone: nobody can read its gradient
  Tensor& grad = leaf->grad;
  leaf->grad_accumulations += 1;
  if (!grad.defined()) {
    // A private copy: the engine's gradient may be a view of (or be) a tensor the
    // graph still holds, and the optimizer and clipping later change .grad() in place.
    grad = grad_output.clone();
  } else if (grad.is_contiguous()) {
    seqpar::add_(grad, grad_output);
  } else {
    grad = seqpar::add(grad, grad_output);  // a strided gradient given through set_grad()
  }
  return {};
}

}  // namespace seqpar::autograd
