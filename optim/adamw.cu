// CUDA path of optim/adamw.h: one fused AdamW kernel over every parameter, in one
// launch (multi_tensor.cuh).
//
// The arithmetic follows torch.optim.AdamW's single-tensor path operation by
// operation, each rounded to float on its own, exactly as optim/adamw.cpp writes it:
// __fmul_rn, __fadd_rn, __fdiv_rn and __fsqrt_rn are never fused into an fma (nvcc
// contracts a * b + c otherwise), and sqrt and division are the correctly rounded
// ones. The fused operations are the ones PyTorch's compiled kernels fuse, and the
// CPU path writes with std::fma: lerp, and addcmul's self + (value * t1) * t2 (fmaf
// here; both correctly rounded). So given the same float scalars, both backends
// compute the same bits.
#include <array>
#include <cstdint>

#include "core/cuda_check.h"
#include "core/cuda_runtime.h"
#include "optim/adamw.h"
#include "optim/multi_tensor.cuh"

namespace seqpar::optim::detail {

namespace {

enum List { kParams, kGrads, kExpAvgs, kExpAvgSqs, kListCount };

// torch.lerp(start, end, weight) as PyTorch computes it: one fma from whichever end
// is nearer, so that weight 1 gives `end` exactly.
__device__ __forceinline__ float lerp(float start, float end, float weight) {
  return fabsf(weight) < 0.5f ? fmaf(weight, __fsub_rn(end, start), start)
                              : fmaf(__fsub_rn(weight, 1.0f), __fsub_rn(end, start), end);
}

__global__ void __launch_bounds__(kMultiTensorThreads)
    adamw_kernel(TensorTable<kListCount> table, AdamWStepScalars s) {
  const BlockWork work = block_work(table, blockIdx.x);
  float* params = table.pointers[kParams][work.slot];
  const float* grads = table.pointers[kGrads][work.slot];
  float* exp_avgs = table.pointers[kExpAvgs][work.slot];
  float* exp_avg_sqs = table.pointers[kExpAvgSqs][work.slot];
  for (int64_t i = work.begin + threadIdx.x; i < work.end; i += blockDim.x) {
    const float grad = grads[i];
    float param = params[i], m = exp_avgs[i], v = exp_avg_sqs[i];
    param = __fmul_rn(param, s.decay);                                        // p *= 1 - lr wd
    m = lerp(m, grad, s.lerp_weight);                                         // m.lerp_(g, 1 - b1)
    v = fmaf(__fmul_rn(s.one_minus_beta2, grad), grad, __fmul_rn(v, s.beta2));  // addcmul
    const float denom =
        __fadd_rn(__fdiv_rn(__fsqrt_rn(v), s.bias_correction2_sqrt), s.eps);  // sqrt(v)/bc2 + eps
    // addcdiv_(m, denom, value=-step_size): self + value * m / denom, in that order.
    param = __fadd_rn(param, __fdiv_rn(__fmul_rn(-s.step_size, m), denom));
    params[i] = param;
    exp_avgs[i] = m;
    exp_avg_sqs[i] = v;
  }
}

}  // namespace

void adamw_step_cuda(const AdamWTensors& tensors, const AdamWStepScalars& scalars, int device) {
  const size_t count = tensors.sizes.size();
  SEQPAR_CHECK(tensors.params.size() == count && tensors.grads.size() == count &&
                   tensors.exp_avgs.size() == count && tensors.exp_avg_sqs.size() == count,
               "adamw_step_cuda: ", count, " sizes but ", tensors.params.size(), " params, ",
               tensors.grads.size(), " grads, ", tensors.exp_avgs.size(), " exp_avgs and ",
               tensors.exp_avg_sqs.size(), " exp_avg_sqs");
  cuda::set_device(device);
  cudaStream_t stream = cuda::current_stream(device);
  const std::array<std::vector<float*>, kListCount> lists{tensors.params, tensors.grads,
                                                          tensors.exp_avgs, tensors.exp_avg_sqs};
  for_each_tensor_table<kListCount>(
      lists, tensors.sizes,
      [&](const TensorTable<kListCount>& table, int blocks, int64_t /*first_block*/) {
        adamw_kernel<<<blocks, kMultiTensorThreads, 0, stream>>>(table, scalars);
        CUDA_LAUNCH_CHECK();
      });
}

}  // namespace seqpar::optim::detail
