// RoPE's plain reference: the loops that define its bits (nn/rope.h states them).
#pragma once

#include "core/tensor.h"

namespace seqpar::nn::reference {

// x [S, H, D] contiguous; cos and sin [S, D/2] contiguous; all on the host. With
// `transposed`, the rotation by the negative angle: the backward.
Tensor rope_rotate(const Tensor& x, const Tensor& cos, const Tensor& sin, bool transposed);

}  // namespace seqpar::nn::reference
