// The CUDA path of attention and RoPE (nn/cuda/attention.cu, nn/cuda/rope.cu): the
// launchers that the CUDA rows of nn/attention.cpp's and nn/rope.cpp's tables call,
// bitwise the reference's (nn/reference/attention.h, nn/reference/rope.h).
#pragma once

#include "core/tensor.h"
#include "nn/attention.h"

namespace seqpar::nn::detail {

// q [B, Sq, Hq, D], k and v [B, Sk, Hkv, D] (and grad_out q's shape) contiguous on one
// GPU, with the mask and the scale checked by the caller (nn/attention.cpp); row_max and
// row_sum are [B, Hq, Sq]. Refuses, naming the sizes, a call whose rows of scores do not
// fit in a block's shared memory or whose batch and heads do not fit a grid.
AttentionForward attention_forward_cuda(const Tensor& q, const Tensor& k, const Tensor& v,
                                        const AttentionMask& mask, float scale);
// queries: compute dq; keys: compute dk and dv. A part not asked for stays undefined.
AttentionGrads attention_backward_cuda(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                       const Tensor& v, const AttentionForward& forward,
                                       const AttentionMask& mask, float scale, bool queries,
                                       bool keys);

// x contiguous [N, H, D] (a batch's tokens one after another); cos and sin [T, D/2] on x's GPU,
// T dividing N: token t rotates by row t mod T (nn/reference/rope.h).
Tensor rope_rotate_cuda(const Tensor& x, const Tensor& cos, const Tensor& sin, bool transposed);

}  // namespace seqpar::nn::detail
