// CUDA kernels of train/kernels/exact_step.h.
#include "train/kernels/exact_step.h"

#include <algorithm>
#include <cmath>

#include "core/cuda_check.h"
#include "core/cuda_util.cuh"
#include "core/dependent_launch.cuh"
#include "core/error.h"
#include "core/exact_sum.cuh"
#include "nn/l1_sign.h"
#include "nn/one_magnitude.h"

namespace seqpar::train::kernels {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 1024;
constexpr int64_t kElementsPerThread = 2;  // at least, before the grid grows

// A NaN as the flags of a one-term sum, added into one sum's digits.
__device__ void add_nan(int64_t* sum, int64_t stride) {
  exact::BinnedSum special;
  special.clear();
  special.add(static_cast<double>(NAN));
  int64_t flags[exact::kDigits] = {};
  special.flush(flags);
  exact::add_digits_atomically(flags, sum, stride);
}

// What a block gathers per column in shared memory, with integer atomics (order-free):
// the count of signs, whether a NaN was seen, and dy's largest magnitude.
struct ColumnTallies {
  int signs[kExactL1MaxOut];
  int nan_seen[kExactL1MaxOut];
  unsigned int largest[kExactL1MaxOut];
  unsigned int words[2];  // dy's largest |dy| bits, the complement of its smallest nonzero
};

// Block: a grid-stride share of the elements. Each thread keeps its loss terms in a
// binned sum (moved into the block's digits, then the launch's); the columns' tallies
// go into db's digits (the count times s) and dy's maxima once per block.
__global__ void __launch_bounds__(kThreads)
    exact_l1_kernel(const float* y, const float* target, int64_t target_row_stride,
                    int64_t rows, int64_t out, float scale, ExactL1Outputs o) {
  __shared__ ColumnTallies tally;
  cuda::wait_for_prior_grids();  // y from the forward
  cuda::allow_dependent_grids();
  for (int j = threadIdx.x; j < out; j += blockDim.x) {
    tally.signs[j] = 0;
    tally.nan_seen[j] = 0;
    tally.largest[j] = 0;
  }
  if (threadIdx.x < 2) tally.words[threadIdx.x] = 0;
  __syncthreads();
  // The backward's factor, as nn's L1 backward forms it from d loss / d loss = 1.
  const float gradient = __double2float_rn(1.0 * scale);
  // A BinnedSum, not an exact::ScaledAbsSum: a thread here has about two terms, and the
  // integer path's flush (two products into the digits) costs more than it saves
  // (measured: bench/RESULTS.md).
  exact::BinnedSum loss;
  loss.clear();
  int64_t local[exact::kDigits] = {};
  int64_t pending = 0;  // terms in the bins since the last flush
  unsigned int most = 0, least_complement = 0;  // over this thread's dy, as column_maxima
  for (cuda::GridStrideElements e(rows, out); e.inside(); e.next()) {
    const int64_t row = e.row, i = e.row * out + e.col;
    const int j = static_cast<int>(e.col);
    const float difference = __fsub_rn(y[i], target[row * target_row_stride + j]);
    loss.add(__dmul_rn(static_cast<double>(scale), static_cast<double>(fabsf(difference))));
    if (++pending == exact::kTermsPerFlush) {
      loss.flush(local);
      pending = 0;
    }
    const float sign = nn::l1_sign(difference);
    const float dy = __fmul_rn(gradient, sign);
    o.grad_y[i] = dy;
    if (sign != 0.0f) {
      if (sign == sign) {
        atomicAdd(&tally.signs[j], sign > 0.0f ? 1 : -1);
      } else {
        atomicOr(&tally.nan_seen[j], 1);
      }
    }
    // nn's column maxima: fmaxf passes over a NaN; the words see every bit pattern.
    atomicMax(&tally.largest[j], __float_as_uint(fmaxf(0.0f, fabsf(dy))));
    const unsigned int bits = __float_as_uint(dy) & 0x7fffffffu;
    most = max(most, bits);
    if (bits != 0) least_complement = max(least_complement, ~bits);
  }
  atomicMax(&tally.words[0], most);
  atomicMax(&tally.words[1], least_complement);
  loss.flush(local);
  exact::add_block_digits(local, o.loss_digits, 1);  // synchronizes the block first

  // s is finite (exact_l1_cuda checks), so |s| is one magnitude: db is s times the net
  // count of signs, an integer at s's unit.
  const unsigned int bits = __float_as_uint(gradient) & 0x7fffffffu;
  const nn::detail::OneMagnitude f = nn::detail::one_magnitude_of(bits, bits);
  for (int j = threadIdx.x; j < out; j += blockDim.x) {
    int64_t* sum = o.bias_digits + j;
    const int64_t signs = gradient < 0.0f ? -int64_t{tally.signs[j]} : tally.signs[j];
    exact::add_scaled_product_atomically(sum, o.digit_stride, signs,
                                         static_cast<uint32_t>(f.significand), f.exponent);
    if (tally.nan_seen[j] != 0) add_nan(sum, o.digit_stride);
    if (tally.largest[j] != 0) atomicMax(o.grad_y_largest + j, tally.largest[j]);
  }
  if (threadIdx.x < 2 && tally.words[threadIdx.x] != 0) {
    atomicMax(o.grad_y_largest + out + threadIdx.x, tally.words[threadIdx.x]);
  }
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
