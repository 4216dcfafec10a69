// Variable: a Tensor that autograd tracks (the role of torch.Tensor with
// requires_grad). core knows nothing about autograd; this layer wraps core's Tensor.
//
// Copies of a Variable alias one another, like Python references to one
// torch.Tensor: setting the gradient through one copy is seen through all.
//
//   Variable w(Tensor::ones({3}), /*requires_grad=*/true);
//   Variable loss = ...;            // ops record Nodes into a graph
//   loss.backward();                // w.grad() now holds d loss / d w
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/tensor.h"

namespace seqpar::autograd {

class Node;

// Where a gradient flows: input number `input_nr` of `node`. An invalid edge (no
// node) means "this input needs no gradient".
struct Edge {
  std::shared_ptr<Node> node;
  uint32_t input_nr = 0;
  bool valid() const { return node != nullptr; }
};

class Variable {
 public:
  Variable() = default;  // undefined
  explicit Variable(Tensor data, bool requires_grad = false);

  bool defined() const { return impl_ != nullptr; }
  // Whether both are the same Variable (copies share one), as Python's `is`.
  bool is(const Variable& other) const { return impl_ == other.impl_; }
  const Tensor& data() const;
  // Replaces the values in place for every alias (optimizers and broadcasts use it).
  void set_data(const Tensor& data) const;
  const Shape& shape() const { return data().shape(); }
  Device device() const { return data().device(); }

  bool requires_grad() const;
  // Only a leaf (a Variable no op produced) can be switched.
  void set_requires_grad(bool requires_grad) const;
  bool is_leaf() const;

  // The accumulated gradient: undefined until a backward pass reaches this leaf;
  // later passes add into it until zero_grad().
  //
  // In training over several ranks it means two things in turn. After backward it is
  // this rank's partial gradient: the sum over the rows this rank holds, in float32.
  // After an exact gradient sync (nn/exact_gradient_sync.h) it is the total over every
  // rank's rows, rounded once: the gradient one rank would hold with all the rows. Only
  // the second is the model's gradient; clip and step after the sync, never before.
  const Tensor& grad() const;
  void set_grad(const Tensor& grad) const;
  // Zeros the gradient in place (its memory is kept), or leaves it undefined.
  void zero_grad() const;
  // How many times a backward pass has added into grad() since this Variable was made
  // (set_grad and zero_grad do not count). It lets a gradient sync see which passes ran
  // while it was recording and which did not.
  uint64_t grad_accumulations() const;

  // The Node that produced this Variable (null for leaves).
  const std::shared_ptr<Node>& grad_fn() const;
  // Where this Variable's gradient goes: its grad_fn, or the AccumulateGrad node of a
  // leaf that requires grad (created once and kept), or an invalid edge.
  Edge gradient_edge() const;

  // Runs the backward engine from this Variable. With no argument it must hold one
  // element (a loss) and the seed gradient is 1.
  void backward(const Tensor& gradient = Tensor()) const;

  // For ops: a Variable produced by `grad_fn` (its output number 0).
  static Variable from_op(Tensor data, std::shared_ptr<Node> grad_fn);

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
  friend class AccumulateGrad;
};

}  // namespace seqpar::autograd
