// Differentiable elementwise ops and views. Each op's forward and backward sit side
// by side in ops.cpp. An op records a Node only when grad mode is on and some input
// requires grad.
#pragma once

#include "autograd/variable.h"

namespace seqpar::autograd {

Variable add(const Variable& a, const Variable& b);
Variable sub(const Variable& a, const Variable& b);
Variable mul(const Variable& a, float scalar);
// A view of `length` entries of dimension `dim` from `start`; the gradient flows
// back into that window of the input (zeros elsewhere).
Variable narrow(const Variable& input, int64_t dim, int64_t start, int64_t length);

// True when an op over these inputs must record a Node.
bool any_requires_grad(std::initializer_list<const Variable*> inputs);

}  // namespace seqpar::autograd
