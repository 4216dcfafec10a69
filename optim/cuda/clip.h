// The CUDA path of gradient clipping (optim/cuda/clip.cu): the launchers that the CUDA
// rows of optim/clip.cpp's tables call, bitwise the host's norms and scaling.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace seqpar::optim::detail {

// Contiguous gradients on `device`. Per-tensor exact sums of squares (integer
// atomics on the digits), then the norms and the total, into
// total_norm: bitwise the host's grad_norm (optim/clip.h defines them).
void grad_norm_cuda(const std::vector<const float*>& grads, const std::vector<int64_t>& sizes,
                    const Tensor& total_norm, int device);
void clip_grads_cuda(const std::vector<float*>& grads, const std::vector<int64_t>& sizes,
                     float max_norm, const Tensor& total_norm, int device);

}  // namespace seqpar::optim::detail
