// The backward engine: runs the graph below a root in dependency order on the
// calling thread.
//
// 1. Walk the graph from the root once, counting for each Node how many edges
//    point at it (its dependencies).
// 2. Start from the root with the seed gradient. A Node runs when every gradient
//    headed its way has arrived; gradients reaching the same Node are summed (in
//    the order they arrive, which is fixed by the graph: deterministic).
// 3. Every gradient a Node returns is checked against the shape and device recorded
//    for that input; a mismatch is an error that names the Node.
#pragma once

#include "autograd/variable.h"

namespace seqpar::autograd {

void run_backward(const Variable& root, const Tensor& seed_gradient);

// While one is alive on a thread, ops on that thread record no graph (torch.no_grad()).
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

bool grad_mode_enabled();

}  // namespace seqpar::autograd
