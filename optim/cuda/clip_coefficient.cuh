// clip_grad_norm's coefficient on the GPU, shared by optim/cuda/clip.cu and the exact fused
// step's finishing kernel (bench/fused/kernels/exact_step.cu), so all compute the same
// bits as the CPU (optim/clip.cpp):
// max_norm / (total + 1e-6) in float32, as torch forms it (a number divided by a tensor
// is reciprocal(tensor) * number), clamped to at most 1. A NaN norm stays NaN, as with
// torch.clamp and the CPU's std::min.
#pragma once

namespace seqpar::optim::detail {

__device__ __forceinline__ float clip_coefficient(float total_norm, float max_norm) {
  const float unclamped = __fmul_rn(__frcp_rn(__fadd_rn(total_norm, 1e-6f)), max_norm);
  return 1.0f < unclamped ? 1.0f : unclamped;
}

}  // namespace seqpar::optim::detail
