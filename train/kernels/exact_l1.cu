// CUDA kernel of train/kernels/exact_l1.h.
#include "train/kernels/exact_l1.h"

#include <algorithm>
#include <cmath>

#include "core/cuda_check.h"
#include "core/error.h"
#include "core/exact_sum.cuh"
#include "nn/l1_sign.h"
#include "nn/one_magnitude.h"

namespace seqpar::train::kernels {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 1024;
constexpr int64_t kElementsPerThread = 8;  // at least, before the grid grows

// Block: a grid-stride share of the elements. Each thread keeps its loss terms in a
// binned sum (moved into the block's digits, then the launch's); each column's signs
// are counted in shared memory (integer atomics) and added into db's digits once per
// block, as the count times s.
__global__ void __launch_bounds__(kThreads)
    exact_l1_kernel(const float* y, const float* target, int64_t target_row_stride,
                    int64_t rows, int64_t out, float scale, ExactL1Outputs o) {
  __shared__ int sign_counts[kExactL1MaxOut];
  __shared__ int nan_seen[kExactL1MaxOut];
  for (int j = threadIdx.x; j < out; j += blockDim.x) {
    sign_counts[j] = 0;
    nan_seen[j] = 0;
  }
  __syncthreads();
  // The backward's factor, as nn's L1 backward forms it from d loss / d loss = 1.
  const float gradient = __double2float_rn(1.0 * scale);
  exact::BinnedSum loss;
  loss.clear();
  int64_t local[exact::kDigits] = {};
  int64_t pending = 0;  // terms in the bins since the last flush
  const int64_t count = rows * out;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = i / out;
    const int j = static_cast<int>(i % out);
    const float difference = __fsub_rn(y[i], target[row * target_row_stride + j]);
    loss.add(__dmul_rn(static_cast<double>(scale), static_cast<double>(fabsf(difference))));
    if (++pending == exact::kTermsPerFlush) {
      loss.flush(local);
      pending = 0;
    }
    const float sign = nn::l1_sign(difference);
    o.grad_y[i] = __fmul_rn(gradient, sign);
    if (sign != 0.0f) {
      if (sign == sign) {
        atomicAdd(&sign_counts[j], sign > 0.0f ? 1 : -1);
      } else {
        atomicOr(&nan_seen[j], 1);
      }
    }
  }
  loss.flush(local);
  exact::add_block_digits(local, o.loss_digits, 1);  // synchronizes the block first
  const unsigned bits = __float_as_uint(gradient) & 0x7fffffffu;
  const nn::detail::OneMagnitude f = nn::detail::one_magnitude_of(bits, bits);
  for (int j = threadIdx.x; j < out; j += blockDim.x) {
    int64_t* sum = o.bias_digits + j;
    const int64_t signs = gradient < 0.0f ? -int64_t{sign_counts[j]} : sign_counts[j];
    if (f.holds) {
      exact::add_scaled_integer_atomically(sum, o.digit_stride,
                                           exact::Int128{signs} * f.significand, f.exponent);
    } else if (signs != 0) {  // s is inf or NaN: every nonzero dy is that special value
      exact::BinnedSum special;
      special.clear();
      special.add(static_cast<double>(gradient) * static_cast<double>(signs > 0 ? 1 : -1));
      int64_t flags[exact::kDigits] = {};
      special.flush(flags);
      exact::add_digits_atomically(flags, sum, o.digit_stride);
    }
    if (nan_seen[j] != 0) {
      exact::BinnedSum special;
      special.clear();
      special.add(static_cast<double>(NAN));
      int64_t flags[exact::kDigits] = {};
      special.flush(flags);
      exact::add_digits_atomically(flags, sum, o.digit_stride);
    }
  }
}

}  // namespace

void exact_l1_cuda(const float* y, const float* target, int64_t target_row_stride, int64_t rows,
                   int64_t out, float scale, const ExactL1Outputs& outputs, cuda::Stream stream) {
  SEQPAR_CHECK(out >= 1 && out <= kExactL1MaxOut, "exact_l1_cuda: out_features ", out,
               " outside [1, ", kExactL1MaxOut, "]");
  const int64_t count = rows * out;
  if (count == 0) return;
  const int64_t blocks =
      std::clamp<int64_t>(count / (kThreads * kElementsPerThread), 1, kMaxBlocks);
  exact_l1_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      y, target, target_row_stride, rows, out, scale, outputs);
  CUDA_LAUNCH_CHECK();
}

}  // namespace seqpar::train::kernels
