#include "autograd/reshape.h"

#include "autograd/node.h"
#include "autograd/ops.h"
#include "core/error.h"

namespace seqpar::autograd {

namespace {

Tensor reshaped(const Tensor& tensor, const Shape& shape) { return tensor.contiguous().view(shape); }

// The gradient's elements are the output's, in the same order: only the shape changes.
struct ReshapeBackward : Node {
  std::vector<Tensor> apply(const Tensor& grad_output) override {
    return {reshaped(grad_output, input_metadata()[0].shape)};
  }
  std::string name() const override { return "ReshapeBackward"; }
};

}  // namespace

Variable reshape(const Variable& input, const Shape& shape) {
  SEQPAR_CHECK(input.defined(), "reshape: the input is undefined");
  SEQPAR_CHECK(shape_numel(shape) == input.data().numel(), "reshape: cannot view ",
               input.shape(), " (", input.data().numel(), " elements) as ", shape, " (",
               shape_numel(shape), " elements)");
  Tensor output = reshaped(input.data(), shape);
  if (!any_requires_grad({&input})) return Variable(std::move(output));
  auto node = std::make_shared<ReshapeBackward>();
  node->add_input(input);
  return Variable::from_op(std::move(output), std::move(node));
}

}  // namespace seqpar::autograd
