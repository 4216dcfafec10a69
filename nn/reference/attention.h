// Attention's plain reference: the loops that define its bits (nn/attention.h states
// the numerics, docs/numerics.md explains them; nn/attention.cpp has the dispatch).
#pragma once

#include "nn/attention.h"

namespace seqpar::nn::reference {

// q, k, v (and grad_out) contiguous [B, S, H, D] on the host; mask and scale checked by
// the caller.
AttentionForward attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const AttentionMask& mask, float scale);

// The backward's parts: `queries` fills grads.q, `keys` grads.k and grads.v; a part not
// asked for stays undefined.
AttentionGrads attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const AttentionForward& forward,
                                  const AttentionMask& mask, float scale, bool queries, bool keys);

}  // namespace seqpar::nn::reference
