// CUDA kernel of train/kernels/clip_adamw.h: norm, clip coefficient and AdamW in one launch.
#include "train/kernels/clip_adamw.h"

#include <array>
#include <cstdint>

#include "core/block_reduce.cuh"
#include "core/cuda_check.h"
#include "core/dependent_launch.cuh"
#include "optim/adamw_update.cuh"
#include "optim/clip_coefficient.cuh"
#include "optim/multi_tensor.cuh"

namespace seqpar::train::kernels {

using namespace optim::detail;  // the AdamW element update and the multi-tensor tables

namespace {

enum List { kParams, kGrads, kExpAvgs, kExpAvgSqs, kListCount };
constexpr int kThreads = 1024;  // the norm pass reads every gradient: many loads in flight
// One element per thread in the update: the issue's 10,256 parameters make 11 blocks on
// 11 SMs, each with one short dependency chain, instead of 4 blocks with four.
constexpr int64_t kClipChunk = kThreads;
constexpr int64_t kMaxElements = TensorTable<kListCount>::kMaxBlocks * kClipChunk;  // 327,680

// The total norm in float order, the same bits in every block (in thread 0): each
// tensor's squares summed in double in index order per thread, the block's fixed tree,
// a float norm per tensor, then the norm of the norms.
__device__ float float_order_norm(const TensorTable<kListCount>& table, int tensors) {
  double squared_norms = 0.0;
  for (int t = 0; t < tensors; ++t) {
    const float* grad = table.pointers[kGrads][t];
    double sum = 0.0;
#pragma unroll 8  // independent loads in flight; the sum still runs in index order
    for (int64_t j = threadIdx.x; j < table.sizes[t]; j += blockDim.x) {
      const double value = grad[j];
      sum += value * value;  // exact in double, as clip.cu squares
    }
    sum = cuda::block_sum(sum);
    const double norm = __double2float_rn(sqrt(sum));  // a float32 norm per tensor
    squared_norms += norm * norm;
  }
  return __double2float_rn(sqrt(squared_norms));
}

__global__ void __launch_bounds__(kThreads)
    clip_adamw_kernel(TensorTable<kListCount> table, int tensors, float max_norm,
                      ClipAdamWState state) {
  static_assert(kClipChunk == kThreads, "one element per thread");
  __shared__ float coefficient_shared;
  // 0. Before the wait for the kernels ahead in the stream (core/dependent_launch.cuh):
  // what they do not write, so these loads overlap their tail. The step's scalars
  // (written by the previous step's launch of this kernel) and this thread's element.
  const AdamWStepScalars s = state.table[*state.step_slot];
  const BlockWork work = block_work(table, blockIdx.x, kClipChunk);
  const int64_t i = work.begin + threadIdx.x;
  const bool owns_element = i < work.end;
  float* param = table.pointers[kParams][work.slot] + i;
  float* exp_avg = table.pointers[kExpAvgs][work.slot] + i;
  float* exp_avg_sq = table.pointers[kExpAvgSqs][work.slot] + i;
  float param_value = 0.0f, exp_avg_value = 0.0f, exp_avg_sq_value = 0.0f;
  if (owns_element) {
    param_value = *param;
    exp_avg_value = *exp_avg;
    exp_avg_sq_value = *exp_avg_sq;
  }
  cuda::wait_for_prior_grids();  // the gradients are final from here on

  // 1. The total norm, computed in the same order in every block (the result is in
  // thread 0).
  const float total = float_order_norm(table, tensors);
  if (threadIdx.x == 0) {
    if (blockIdx.x == 0) *state.total_norm = total;
    coefficient_shared = clip_coefficient(total, max_norm);
  }
  __syncthreads();
  const float coefficient = coefficient_shared;

  // 2. This thread's element: the clipped gradient goes straight into the update.
  if (owns_element) {
    const float grad = table.pointers[kGrads][work.slot][i];
    adamw_update(param_value, __fmul_rn(grad, coefficient), exp_avg_value, exp_avg_sq_value, s);
    *param = param_value;
    *exp_avg = exp_avg_value;
    *exp_avg_sq = exp_avg_sq_value;
  }

  // 3. Every block has read the step slot before it counts itself done; the last one
  // advances the slot for the next launch and resets the count.
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(state.blocks_done, 1u) == gridDim.x - 1) {
      *state.step_slot += 1;
      *state.blocks_done = 0;
      __threadfence();
    }
  }
}

}  // namespace

bool clip_adamw_fits(const std::vector<int64_t>& sizes) {
  int64_t elements = 0, blocks = 0, tensors = 0;
  for (int64_t size : sizes) {
    if (size == 0) continue;
    elements += size;
    blocks += cuda::ceil_div(size, kClipChunk);
    ++tensors;
  }
  using Table = TensorTable<kListCount>;
  return elements <= kMaxElements && blocks <= Table::kMaxBlocks && tensors <= Table::kMaxTensors;
}

void clip_adamw_step_cuda(const AdamWTensors& tensors, float max_norm,
                          const ClipAdamWState& state, cuda::Stream stream) {
  const size_t count = tensors.sizes.size();
  SEQPAR_CHECK(tensors.params.size() == count && tensors.grads.size() == count &&
                   tensors.exp_avgs.size() == count && tensors.exp_avg_sqs.size() == count,
               "clip_adamw_step_cuda: the four lists and the sizes differ in length");
  SEQPAR_CHECK(clip_adamw_fits(tensors.sizes),
               "clip_adamw_step_cuda: too many parameters for the one-launch path (at most ",
               kMaxElements, " elements in ", TensorTable<kListCount>::kMaxTensors, " tensors)");
  int non_empty = 0;
  for (int64_t size : tensors.sizes) non_empty += size > 0 ? 1 : 0;
  const std::array<std::vector<float*>, kListCount> lists{tensors.params, tensors.grads,
                                                          tensors.exp_avgs, tensors.exp_avg_sqs};
  for_each_tensor_table<kListCount>(
      lists, tensors.sizes,
      [&](const TensorTable<kListCount>& table, int blocks, int64_t /*first_block*/) {
        // A dependent launch: the loads before its wait overlap the gradients' kernels.
        cuda::launch_dependent(clip_adamw_kernel, dim3(blocks), dim3(kThreads), 0, stream, table,
                               non_empty, max_norm, state);
      },
      kClipChunk);
}

}  // namespace seqpar::train::kernels
