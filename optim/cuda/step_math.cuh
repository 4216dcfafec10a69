// The optimizer's per-element arithmetic on the GPU, shared by optim's launchers
// (optim/cuda/adamw.cu, optim/cuda/clip.cu) and the exact fused step's finishing kernel
// (bench/fused/kernels/exact_step.cu), so all compute the same bits as the CPU:
// AdamW's update of one element and clip_grad_norm's coefficient.
//
// AdamW's arithmetic follows torch.optim.AdamW's single-tensor path operation by
// operation, as optim/adamw.cpp writes it: __fmul_rn, __fadd_rn, __fdiv_rn and
// __fsqrt_rn are never contracted into an fma, and the fused operations are the ones
// PyTorch's kernels fuse (lerp; addcmul's self + (value * t1) * t2).
#pragma once

#include "optim/adamw.h"

namespace seqpar::optim::detail {

// torch.lerp(start, end, weight) as PyTorch computes it: one fma from whichever end
// is nearer, so that weight 1 gives `end` exactly.
__device__ __forceinline__ float lerp(float start, float end, float weight) {
  return fabsf(weight) < 0.5f ? fmaf(weight, __fsub_rn(end, start), start)
                              : fmaf(__fsub_rn(weight, 1.0f), __fsub_rn(end, start), end);
}

__device__ __forceinline__ void adamw_update(float& param_ref, float grad, float& exp_avg_ref,
                                             float& exp_avg_sq_ref, const AdamWStepScalars& s) {
  float param = param_ref, m = exp_avg_ref, v = exp_avg_sq_ref;
  param = __fmul_rn(param, s.decay);                                          // p *= 1 - lr wd
  m = lerp(m, grad, s.lerp_weight);                                           // m.lerp_(g, 1 - b1)
  v = fmaf(__fmul_rn(s.one_minus_beta2, grad), grad, __fmul_rn(v, s.beta2));  // addcmul
  const float denom =
      __fadd_rn(__fdiv_rn(__fsqrt_rn(v), s.bias_correction2_sqrt), s.eps);    // sqrt(v)/bc2 + eps
  // addcdiv_(m, denom, value=-step_size): self + value * m / denom, in that order.
  param_ref = __fadd_rn(param, __fdiv_rn(__fmul_rn(-s.step_size, m), denom));
  exp_avg_ref = m;
  exp_avg_sq_ref = v;
}

// clip_grad_norm's coefficient, as the CPU's (optim/clip.cpp):
// max_norm / (total + 1e-6) in float32, as torch forms it (a number divided by a tensor
// is reciprocal(tensor) * number), clamped to at most 1. A NaN norm stays NaN, as with
// torch.clamp and the CPU's std::min.
__device__ __forceinline__ float clip_coefficient(float total_norm, float max_norm) {
  const float unclamped = __fmul_rn(__frcp_rn(__fadd_rn(total_norm, 1e-6f)), max_norm);
  return 1.0f < unclamped ? 1.0f : unclamped;
}

}  // namespace seqpar::optim::detail
