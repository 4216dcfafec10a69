// CUDA kernels of bench/fused/kernels/exact_step.h.
#include "bench/fused/kernels/exact_step.h"

#include <algorithm>
#include <cmath>

#include "core/cuda_check.h"
#include "core/cuda_util.cuh"
#include "core/dependent_launch.cuh"
#include "core/error.h"
#include "core/exact_bins.h"
#include "core/exact_bins.cuh"
#include "bench/fused/kernels/exact_l1.cuh"
#include "bench/fused/kernels/grid_sync.cuh"
#include "bench/fused/kernels/sum_of_two.h"
#include "optim/cuda/step_math.cuh"

namespace seqpar::fused::kernels {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 1024;
constexpr int64_t kElementsPerThread = 2;  // at least, before the grid grows

// Block: a grid-stride share of the elements, each thread's loss terms in a binned sum
// and the columns' tallies in the block's (exact_l1.cuh).
__global__ void __launch_bounds__(kThreads)
    exact_l1_kernel(const float* y, const float* target, int64_t target_row_stride,
                    int64_t rows, int64_t out, float scale, ExactL1Outputs o) {
  __shared__ ExactL1Tally tally;
  cuda::wait_for_prior_grids();  // y from the forward
  cuda::allow_dependent_grids();
  tally.clear(out);
  __syncthreads();
  ExactL1Terms terms(scale);
  for (cuda::GridStrideElements e(rows, out); e.inside(); e.next()) {
    terms.add(y[e.row * out + e.col], target[e.row * target_row_stride + e.col], e.row,
              static_cast<int>(e.col), out, o, tally);
  }
  terms.finish(tally, out, o);
}

// Block: kThreads * kPerThread sums of one tensor (W's blocks first, then b's), sum
// i = the block's first + e * kThreads + threadIdx.x for e < kPerThread.
template <int kPerThread>
__global__ void __launch_bounds__(kThreads) exact_finish_kernel(ExactFinish f, int64_t weight_blocks) {
  __shared__ unsigned long long block[exact::kDigits];
  __shared__ double norms[2];
  __shared__ float coefficient_shared;
  __shared__ bool last;
  const int tensor = blockIdx.x < weight_blocks ? 0 : 1;
  const int64_t first = tensor == 0 ? 0 : f.weight_count;
  const int64_t end = tensor == 0 ? f.weight_count : f.count;
  const int64_t block_first =
      first + (blockIdx.x - (tensor == 0 ? 0 : weight_blocks)) * int64_t{kThreads * kPerThread};
  float* params = tensor == 0 ? f.weight : f.bias;  // indexed by i - first
  auto sum_index = [&](int e) { return block_first + e * kThreads + threadIdx.x; };

  // 0. The step's AdamW scalars and this thread's parameters and moments, on their way
  // while the gradients are rounded.
  const optim::detail::AdamWStepScalars scalars = f.table[*f.step_slot];
  float param[kPerThread], exp_avg[kPerThread], exp_avg_sq[kPerThread], gradient[kPerThread];
#pragma unroll
  for (int e = 0; e < kPerThread; ++e) {
    const int64_t i = sum_index(e);
    if (i < end) {
      param[e] = params[i - first];
      exp_avg[e] = f.exp_avg[i];
      exp_avg_sq[e] = f.exp_avg_sq[i];
    }
  }

  // 1. The gradients rounded once (and their digits zeroed for the next step), and
  // their exact squares into the tensor's norm digits.
  int64_t local[exact::kDigits] = {};
  exact::BinnedSum square;
  square.clear();
#pragma unroll
  for (int e = 0; e < kPerThread; ++e) {
    const int64_t i = sum_index(e);
    if (i >= end) continue;
    gradient[e] = exact::round_to_float(f.gradient_digits + i, f.count);
    f.gradients[i] = gradient[e];
    for (int d = 0; d < exact::kDigits; ++d) f.gradient_digits[i + d * f.count] = 0;
    const double value = gradient[e];
    square.add(__dmul_rn(value, value));  // exact: a float's square has 48 significant bits
  }
  square.flush(local);
  exact::sum_block_digits(local, block);
  if (threadIdx.x < exact::kDigits && block[threadIdx.x] != 0) {
    auto* word = reinterpret_cast<unsigned long long*>(f.norm_digits + threadIdx.x * 2 + tensor);
    if (threadIdx.x == exact::kSpecialDigit) {
      atomicOr(word, block[threadIdx.x]);
    } else {
      atomicAdd(word, block[threadIdx.x]);
    }
  }

  // 2. Every block's squares are in: each block takes the norm from the digits itself,
  // as optim::clip_grad_norm does (each tensor's float norm by warps 0 and 1, side by
  // side, then the norm of the norms), the same bits in every block. Block 0 keeps the
  // total and rounds the loss (warp 2). The digits are read from L2 (__ldcg): other
  // blocks' atomics wrote them.
  cuda::arrive_and_wait_grid(f.counts);
  const int warp = static_cast<int>(threadIdx.x / 32);
  if (threadIdx.x % 32 == 0 && warp < 2) {
    int64_t digits[exact::kDigits];
    for (int d = 0; d < exact::kDigits; ++d) digits[d] = __ldcg(f.norm_digits + d * 2 + warp);
    norms[warp] = __double2float_rn(sqrt(exact::round_to_double(digits)));
  } else if (threadIdx.x % 32 == 0 && warp == 2 && blockIdx.x == 0) {
    *f.loss = exact::round_to_float(f.loss_digits);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    // The exact sum of the two squares rounded once, as optim::clip_grad_norm takes it
    // from its digits: sum_of_two gives those bits in one addition, where bins,
    // a flush and a rounding in this one lane would hold the whole block.
    const double squares = sum_of_two(__dmul_rn(norms[0], norms[0]), __dmul_rn(norms[1], norms[1]));
    const float total_norm = __double2float_rn(sqrt(squares));
    if (blockIdx.x == 0) *f.total_norm = total_norm;
    coefficient_shared = optim::detail::clip_coefficient(total_norm, f.max_norm);
  }
  __syncthreads();

  // 3. AdamW on this thread's parameters, with the clipped gradient.
  const float coefficient = coefficient_shared;
#pragma unroll
  for (int e = 0; e < kPerThread; ++e) {
    const int64_t i = sum_index(e);
    if (i >= end) continue;
    optim::detail::adamw_update(param[e], __fmul_rn(gradient[e], coefficient), exp_avg[e],
                                exp_avg_sq[e], scalars);
    params[i - first] = param[e];
    f.exp_avg[i] = exp_avg[e];
    f.exp_avg_sq[i] = exp_avg_sq[e];
  }

  // 4. The last block out (every block has read the norm's digits and the step slot):
  // the step's words zeroed for the next step, the counts reset, the slot advanced.
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(f.counts + 1, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  for (int64_t w = threadIdx.x; w < f.step_word_count; w += blockDim.x) f.step_words[w] = 0;
  if (threadIdx.x == 0) {
    f.counts[0] = 0;
    f.counts[1] = 0;
    *f.step_slot += 1;
  }
}

using FinishKernel = void (*)(ExactFinish, int64_t);

// The finishing kernel for `per_thread` sums a thread (1, 2, 4 or 8).
FinishKernel finish_kernel(int per_thread) {
  switch (per_thread) {
    case 1: return exact_finish_kernel<1>;
    case 2: return exact_finish_kernel<2>;
    case 4: return exact_finish_kernel<4>;
    case 8: return exact_finish_kernel<8>;
    default: SEQPAR_FAIL("exact_finish: ", per_thread, " sums a thread (1, 2, 4 or 8)");
  }
}

// Its blocks: each tensor's sums in blocks of kThreads * per_thread.
int64_t finish_blocks(int64_t count, int64_t weight_count, int per_thread) {
  const int64_t sums = int64_t{kThreads} * per_thread;
  return cuda::ceil_div(weight_count, sums) + cuda::ceil_div(count - weight_count, sums);
}

}  // namespace

void exact_l1_cuda(const float* y, const float* target, int64_t target_row_stride, int64_t rows,
                   int64_t out, float scale, const ExactL1Outputs& outputs, cuda::Stream stream) {
  SEQPAR_CHECK(out >= 1 && out <= kExactL1MaxOut, "exact_l1_cuda: out_features ", out,
               " outside [1, ", kExactL1MaxOut, "]");
  // Every nn::Reduction scale of a non-empty loss is finite; db's count of signs needs it.
  SEQPAR_CHECK(std::isfinite(scale), "exact_l1_cuda: the loss scale ", scale, " is not finite");
  SEQPAR_CHECK(outputs.sign_fragments == nullptr || out <= kSignFragmentOutputs,
               "exact_l1_cuda: sign fragments for ", out, " outputs (at most ",
               kSignFragmentOutputs, ")");
  const int64_t count = rows * out;
  if (count == 0) return;
  const int64_t blocks =
      std::clamp<int64_t>(count / (kThreads * kElementsPerThread), 1, kMaxBlocks);
  cuda::launch_dependent(exact_l1_kernel, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0,
                         stream, y, target, target_row_stride, rows, out, scale, outputs);
  CUDA_LAUNCH_CHECK();
}

ExactFinishGrid exact_finish_grid(int64_t count, int64_t weight_count, int device) {
  SEQPAR_CHECK(weight_count >= 1 && count > weight_count, "exact_finish_grid: ", count,
               " sums, ", weight_count, " of them the weight's (both tensors must be non-empty)");
  int64_t blocks = 0;
  for (int per_thread : {1, 2, 4, 8}) {
    blocks = finish_blocks(count, weight_count, per_thread);
    if (blocks <= cuda::cooperative_capacity(finish_kernel(per_thread), kThreads, 0, device)) {
      return {static_cast<int>(blocks), per_thread};
    }
  }
  SEQPAR_FAIL("exact_finish_grid: ", count, " parameters need ", blocks, " blocks of ", kThreads,
              " threads resident at once (8 sums a thread), more than device ", device, " holds");
}

void exact_finish_cuda(const ExactFinish& finish, const ExactFinishGrid& grid, cuda::Stream stream) {
  SEQPAR_CHECK(finish.weight_count >= 1 && finish.count > finish.weight_count,
               "exact_finish_cuda: ", finish.count, " sums, ", finish.weight_count,
               " of them the weight's (both tensors must be non-empty)");
  const int64_t weight_blocks =
      cuda::ceil_div(finish.weight_count, int64_t{kThreads} * grid.per_thread);
  cuda::launch_cooperative(finish_kernel(grid.per_thread), dim3(static_cast<unsigned>(grid.blocks)),
                           dim3(kThreads), 0, stream, finish, weight_blocks);
  CUDA_LAUNCH_CHECK();
}

}  // namespace seqpar::fused::kernels
