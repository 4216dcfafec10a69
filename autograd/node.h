// The autograd graph (PyTorch's names, micrograd's size).
//
// A Node is one recorded operation. It has exactly one output (every op seqpar needs
// has one), and one Edge per differentiable input, pointing at the Node that will
// receive that input's gradient. apply() maps the gradient of the output to the
// gradients of the inputs. A leaf that requires grad ends the graph in an
// AccumulateGrad node, which adds the arriving gradient into the leaf's .grad().
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "autograd/variable.h"
#include "core/tensor.h"

namespace seqpar::autograd {

// What the engine expects each gradient flowing into an input to look like.
struct InputMetadata {
  Shape shape;
  Device device;
};

class Node : public std::enable_shared_from_this<Node> {
 public:
  virtual ~Node() = default;

  // Gradient of the output in, one gradient per input out (undefined where the
  // input's edge is invalid).
  virtual std::vector<Tensor> apply(const Tensor& grad_output) = 0;
  virtual std::string name() const = 0;

  const std::vector<Edge>& next_edges() const { return next_edges_; }
  const std::vector<InputMetadata>& input_metadata() const { return input_metadata_; }

  // Ops call this once per input, in order: records where its gradient goes and
  // what shape it must have.
  void add_input(const Variable& input);

 private:
  std::vector<Edge> next_edges_;
  std::vector<InputMetadata> input_metadata_;
};

// The sink for a leaf: adds the gradient into the leaf's .grad().
class AccumulateGrad : public Node {
 public:
  explicit AccumulateGrad(const Variable& leaf);
  std::vector<Tensor> apply(const Tensor& grad_output) override;
  std::string name() const override { return "AccumulateGrad"; }

 private:
  std::weak_ptr<Variable::Impl> leaf_;  // the leaf owns this node, not the other way round
};

}  // namespace seqpar::autograd
