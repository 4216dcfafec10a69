// RoPE's plain reference: the loops that define its bits (nn/rope.h states them).
#pragma once

#include "core/tensor.h"

namespace seqpar::nn::reference {

// x [N, H, D] contiguous (N tokens: a batch's sequences one after another); cos and sin
// [T, D/2] contiguous, with T dividing N: token t rotates by row t mod T (T = S: one
// table for every sequence; T = N: a row per token of the batch); all on the host. With
// `transposed`, the rotation by the negative angle: the backward.
Tensor rope_rotate(const Tensor& x, const Tensor& cos, const Tensor& sin, bool transposed);

}  // namespace seqpar::nn::reference
