// CUDA path of optim/adamw.h: one fused AdamW kernel over every parameter, in one
// launch (multi_tensor.cuh).
//
// The arithmetic (optim/adamw_update.cuh) follows torch.optim.AdamW's single-tensor
// path operation by operation, each rounded to float on its own, exactly as
// optim/adamw.cpp writes it: __fmul_rn, __fadd_rn, __fdiv_rn and __fsqrt_rn are never
// fused into an fma (nvcc contracts a * b + c otherwise), and sqrt and division are
// the correctly rounded ones. The fused operations are the ones PyTorch's compiled
// kernels fuse, and the CPU path writes with std::fma: lerp, and addcmul's
// self + (value * t1) * t2 (fmaf here; both correctly rounded). So given the same
// float scalars, both backends compute the same bits.
#include <array>
#include <cstdint>

#include "core/cuda_check.h"
#include "core/cuda_runtime.h"
#include "optim/adamw.h"
#include "optim/adamw_update.cuh"
#include "optim/multi_tensor.cuh"

namespace seqpar::optim::detail {

namespace {

enum List { kParams, kGrads, kExpAvgs, kExpAvgSqs, kListCount };

__global__ void __launch_bounds__(kMultiTensorThreads)
    adamw_kernel(TensorTable<kListCount> table, AdamWStepScalars s) {
  const BlockWork work = block_work(table, blockIdx.x);
  float* params = table.pointers[kParams][work.slot];
  const float* grads = table.pointers[kGrads][work.slot];
  float* exp_avgs = table.pointers[kExpAvgs][work.slot];
  float* exp_avg_sqs = table.pointers[kExpAvgSqs][work.slot];
  for (int64_t i = work.begin + threadIdx.x; i < work.end; i += blockDim.x) {
    adamw_update(params[i], grads[i], exp_avgs[i], exp_avg_sqs[i], s);
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
