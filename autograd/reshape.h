// reshape: the same elements in row-major order under a new shape, as torch.reshape.
// A view (no copy) of a contiguous input, a contiguous copy otherwise. The gradient is
// the output's gradient given the input's shape back. Multi-head layers use it to turn
// a projection's [n, heads * head_dim] into [n, heads, head_dim] and back.
#pragma once

#include "autograd/variable.h"
#include "core/tensor.h"

namespace seqpar::autograd {

// `shape` must hold as many elements as the input.
Variable reshape(const Variable& input, const Shape& shape);

}  // namespace seqpar::autograd
