// Attention's plain reference: the loops that define its bits (nn/attention.h states
// the numerics, docs/numerics.md explains them; nn/attention.cpp has the dispatch).
#pragma once

#include "nn/attention.h"

namespace seqpar::nn::reference {

// q, k, v (and grad_out) contiguous [S, H, D] on the host, and the mask, checked by the caller.
AttentionForward attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const AttentionMask& mask);
AttentionGrads attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const AttentionForward& forward,
                                  const AttentionMask& mask);

}  // namespace seqpar::nn::reference
