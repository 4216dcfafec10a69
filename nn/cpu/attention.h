// Attention's fast CPU path: the reference's chains (nn/attention.h), with independent
// chains side by side in vector registers. Bitwise the reference
// (tests/nn/attention_test.cpp).
#pragma once

#include "nn/attention.h"

namespace seqpar::nn::cpu {

// As nn/reference/attention.h: contiguous [B, S, H, D] on the host, checked by the caller.
AttentionForward attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const AttentionMask& mask, float scale);
AttentionGrads attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const AttentionForward& forward,
                                  const AttentionMask& mask, float scale, bool queries, bool keys);

}  // namespace seqpar::nn::cpu
