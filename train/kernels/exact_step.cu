// CUDA kernels of train/kernels/exact_step.h.
#include "train/kernels/exact_step.h"

#include <algorithm>
#include <cmath>

#include "core/cuda_check.h"
#include "core/cuda_util.cuh"
#include "core/dependent_launch.cuh"
#include "core/error.h"
#include "core/exact_round.h"
#include "core/exact_sum.cuh"
#include "nn/exact_l1.cuh"

namespace seqpar::train::kernels {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 1024;
constexpr int64_t kElementsPerThread = 2;  // at least, before the grid grows

// Block: a grid-stride share of the elements, each thread's loss terms in a binned sum
// and the columns' tallies in the block's (nn/exact_l1.cuh).
__global__ void __launch_bounds__(kThreads)
    exact_l1_kernel(const float* y, const float* target, int64_t target_row_stride,
                    int64_t rows, int64_t out, float scale, ExactL1Outputs o) {
  __shared__ nn::detail::ExactL1Tally tally;
  cuda::wait_for_prior_grids();  // y from the forward
  cuda::allow_dependent_grids();
  tally.clear(out);
  __syncthreads();
  nn::detail::ExactL1Terms terms(scale);
  for (cuda::GridStrideElements e(rows, out); e.inside(); e.next()) {
    terms.add(y[e.row * out + e.col], target[e.row * target_row_stride + e.col], e.row,
              static_cast<int>(e.col), out, o, tally);
  }
  terms.finish(tally, out, o);
}

// Block: kThreads sums of one tensor (W's blocks first, then b's).
__global__ void __launch_bounds__(kThreads) exact_finish_kernel(ExactFinish f) {
  __shared__ unsigned long long block[exact::kDigits];
  __shared__ bool last;
  cuda::wait_for_prior_grids();  // the summed digits
  cuda::allow_dependent_grids();
  const int64_t weight_blocks = (f.weight_count + kThreads - 1) / kThreads;
  const int tensor = blockIdx.x < weight_blocks ? 0 : 1;
  const int64_t first = tensor == 0 ? 0 : f.weight_count;
  const int64_t end = tensor == 0 ? f.weight_count : f.count;
  const int64_t i = first + (blockIdx.x - (tensor == 0 ? 0 : weight_blocks)) * kThreads + threadIdx.x;
  int64_t local[exact::kDigits] = {};
  if (i < end) {
    const float gradient = exact::round_to_float(f.gradient_digits + i, f.count);
    f.gradients[i] = gradient;
    for (int d = 0; d < exact::kDigits; ++d) f.gradient_digits[i + d * f.count] = 0;  // for the next step
    exact::BinnedSum square;
    square.clear();
    const double value = gradient;
    square.add(__dmul_rn(value, value));  // exact: a float's square has 48 significant bits
    square.flush(local);
  }
  exact::sum_block_digits(local, block);
  if (threadIdx.x < exact::kDigits && block[threadIdx.x] != 0) {
    auto* word = reinterpret_cast<unsigned long long*>(f.norm_digits + threadIdx.x * 2 + tensor);
    if (threadIdx.x == exact::kSpecialDigit) {
      atomicOr(word, block[threadIdx.x]);
    } else {
      atomicAdd(word, block[threadIdx.x]);
    }
  }
  // The last block to count itself sees every block's digits (each fenced its adds;
  // the last reads them from L2, past its own L1).
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(f.blocks_done, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  // As optim::clip_grad_norm: each tensor's float norm (warps 0 and 1, side by side),
  // then the norm of the norms; the loss rounded by warp 2.
  __shared__ double norms[2];
  const int warp = static_cast<int>(threadIdx.x / 32);
  if (threadIdx.x % 32 == 0 && warp < 2) {
    int64_t digits[exact::kDigits];
    for (int d = 0; d < exact::kDigits; ++d) digits[d] = __ldcg(f.norm_digits + d * 2 + warp);
    norms[warp] = __double2float_rn(sqrt(exact::round_to_double(digits)));
  } else if (threadIdx.x % 32 == 0 && warp == 2) {
    *f.loss = exact::round_to_float(f.loss_digits);
  }
  __syncthreads();
  // Every block's adds are in and read: the step's words start the next step at zero.
  for (int64_t w = threadIdx.x; w < f.step_word_count; w += blockDim.x) f.step_words[w] = 0;
  if (threadIdx.x != 0) return;
  exact::BinnedSum total;
  total.clear();
  for (int t = 0; t < 2; ++t) total.add(__dmul_rn(norms[t], norms[t]));
  int64_t total_digits[exact::kDigits] = {};
  total.flush(total_digits);
  *f.total_norm = __double2float_rn(sqrt(exact::round_to_double(total_digits)));
  *f.blocks_done = 0;
}

}  // namespace

void exact_l1_cuda(const float* y, const float* target, int64_t target_row_stride, int64_t rows,
                   int64_t out, float scale, const ExactL1Outputs& outputs, cuda::Stream stream) {
  SEQPAR_CHECK(out >= 1 && out <= kExactL1MaxOut, "exact_l1_cuda: out_features ", out,
               " outside [1, ", kExactL1MaxOut, "]");
  // Every nn::Reduction scale of a non-empty loss is finite; db's count of signs needs it.
  SEQPAR_CHECK(std::isfinite(scale), "exact_l1_cuda: the loss scale ", scale, " is not finite");
  SEQPAR_CHECK(outputs.sign_fragments == nullptr || out <= nn::detail::kSignFragmentOutputs,
               "exact_l1_cuda: sign fragments for ", out, " outputs (at most ",
               nn::detail::kSignFragmentOutputs, ")");
  const int64_t count = rows * out;
  if (count == 0) return;
  const int64_t blocks =
      std::clamp<int64_t>(count / (kThreads * kElementsPerThread), 1, kMaxBlocks);
  cuda::launch_dependent(exact_l1_kernel, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0,
                         stream, y, target, target_row_stride, rows, out, scale, outputs);
  CUDA_LAUNCH_CHECK();
}

void exact_finish_cuda(const ExactFinish& finish, cuda::Stream stream) {
  SEQPAR_CHECK(finish.weight_count >= 1 && finish.count > finish.weight_count,
               "exact_finish_cuda: ", finish.count, " sums, ", finish.weight_count,
               " of them the weight's (both tensors must be non-empty)");
  const int64_t blocks = (finish.weight_count + kThreads - 1) / kThreads +
                         (finish.count - finish.weight_count + kThreads - 1) / kThreads;
  cuda::launch_dependent(exact_finish_kernel, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0,
                         stream, finish);
  CUDA_LAUNCH_CHECK();
}

}  // namespace seqpar::train::kernels
