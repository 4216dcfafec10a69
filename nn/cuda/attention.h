// The CUDA path of attention and RoPE (nn/cuda/attention.cu, nn/cuda/rope.cu): the
// launchers that the CUDA rows of nn/attention.cpp's and nn/rope.cpp's tables call,
// bitwise the reference's (nn/reference/attention.h, nn/reference/rope.h).
#pragma once

#include "core/tensor.h"
#include "nn/attention.h"

namespace seqpar::nn::detail {

// q, k, v (and grad_out) contiguous [S, H, D] on one GPU, and the mask, checked by the
// caller. Refuses (naming S) a sequence whose rows do not fit in a block's shared memory.
AttentionForward attention_forward_cuda(const Tensor& q, const Tensor& k, const Tensor& v,
                                        const AttentionMask& mask);
AttentionGrads attention_backward_cuda(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                       const Tensor& v, const AttentionForward& forward,
                                       const AttentionMask& mask);

// x contiguous [S, H, D]; cos and sin [S, D/2] on x's GPU (nn/rope.h).
Tensor rope_rotate_cuda(const Tensor& x, const Tensor& cos, const Tensor& sin, bool transposed);

}  // namespace seqpar::nn::detail
