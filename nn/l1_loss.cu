// CUDA path of nn/l1_loss.h.
//
// Forward: loss = scale * Σ |input - target|, reduced in two fixed-order stages
// (docs/design.md, "Two-stage reductions"): each block of the first kernel folds a
// grid-stride share of the elements into one partial sum; one block then sums the
// partials and applies the scale. Sums are kept in double, as the CPU path keeps
// them. The grid size depends only on the element count, so which thread adds which
// element, and in what order, never changes: bitwise-identical results from run to
// run, and no atomics.
//
// Backward: grad_input = (grad_loss * scale) * sign(input - target), sign(0) = 0 as
// in PyTorch, the product formed in double and rounded once, as the CPU path does.
// grad_loss is read on the device, so a step never waits for the host.
#include <algorithm>
#include <cstdint>

#include "core/block_reduce.cuh"
#include "core/cuda_check.h"
#include "core/cuda_runtime.h"
#include "nn/l1_loss.h"

namespace seqpar::nn::detail {

namespace {

constexpr int kThreads = 256;
constexpr int kFinalThreads = 1024;
constexpr int64_t kMaxPartials = kFinalThreads;  // the final block reads one partial each
constexpr int64_t kMinElementsPerThread = 8;

// An [n, m] matrix with unit column stride and its own row stride.
struct Matrix {
  const float* data;
  int64_t row_stride;
  __device__ float operator()(int64_t row, int64_t col) const { return data[row * row_stride + col]; }
};

__global__ void abs_diff_partials_kernel(Matrix input, Matrix target, int64_t rows, int64_t cols,
                                         double* partials) {
  const int64_t count = rows * cols;
  double sum = 0.0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = i / cols, col = i % cols;
    sum += fabsf(__fsub_rn(input(row, col), target(row, col)));
  }
  sum = cuda::block_sum(sum);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

__global__ void scaled_total_kernel(const double* partials, int64_t count, float scale,
                                    float* loss) {
  double sum = threadIdx.x < count ? partials[threadIdx.x] : 0.0;
  sum = cuda::block_sum(sum);
  if (threadIdx.x == 0) *loss = __double2float_rn(sum * scale);
}

__global__ void l1_backward_kernel(const float* grad_loss, Matrix input, Matrix target,
                                   int64_t rows, int64_t cols, float scale, float* grad_input,
                                   int64_t grad_row_stride) {
  const float gradient = __double2float_rn(double{*grad_loss} * scale);
  const int64_t count = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = i / cols, col = i % cols;
    const float difference = __fsub_rn(input(row, col), target(row, col));
    // 0 (of either sign) and NaN are their own sign: a NaN must not pass as 0.
    const float sign = difference > 0.0f ? 1.0f : difference < 0.0f ? -1.0f : difference;
    grad_input[row * grad_row_stride + col] = __fmul_rn(gradient, sign);
  }
}

void check_operands(const char* op, const Tensor& input, const Tensor& target) {
  SEQPAR_CHECK(input.defined() && target.defined() && input.device().is_cuda() &&
                   input.device() == target.device(),
               op, ": input and target must be on the same GPU");
  SEQPAR_CHECK(input.dim() == 2 && input.shape() == target.shape() && input.stride(1) == 1 &&
                   target.stride(1) == 1,
               op, ": input ", input.shape(), " and target ", target.shape(),
               " must be the same [n, m] with unit column stride");
}

}  // namespace

void l1_loss_forward_cuda(const Tensor& input, const Tensor& target, float scale,
                          const Tensor& loss) {
  check_operands("l1_loss_forward_cuda", input, target);
  SEQPAR_CHECK(loss.defined() && loss.numel() == 1 && loss.device() == input.device(),
               "l1_loss_forward_cuda: loss must be one element on ", input.device());
  const int device = input.device().index;
  const int64_t rows = input.size(0), cols = input.size(1);
  // Blocks: enough to give every thread a few elements, at most kMaxPartials. A
  // function of the count alone, so the summation order is fixed.
  const int64_t blocks = std::clamp<int64_t>(
      cuda::ceil_div(rows * cols, kThreads * kMinElementsPerThread), 1, kMaxPartials);
  cuda::set_device(device);
  cudaStream_t stream = cuda::current_stream(device);
  const Tensor partials = cuda::double_scratch(blocks, input.device());
  abs_diff_partials_kernel<<<static_cast<int>(blocks), kThreads, 0, stream>>>(
      Matrix{input.data(), input.stride(0)}, Matrix{target.data(), target.stride(0)}, rows, cols,
      cuda::doubles(partials));
  CUDA_LAUNCH_CHECK();
  scaled_total_kernel<<<1, kFinalThreads, 0, stream>>>(cuda::doubles(partials), blocks, scale,
                                                       loss.data());
  CUDA_LAUNCH_CHECK();
}

void l1_loss_backward_cuda(const Tensor& grad_loss, const Tensor& input, const Tensor& target,
                           float scale, const Tensor& grad_input) {
  check_operands("l1_loss_backward_cuda", input, target);
  SEQPAR_CHECK(grad_loss.defined() && grad_loss.numel() == 1 &&
                   grad_loss.device() == input.device(),
               "l1_loss_backward_cuda: grad_loss must be one element on ", input.device());
  SEQPAR_CHECK(grad_input.defined() && grad_input.shape() == input.shape() &&
                   grad_input.device() == input.device() && grad_input.stride(1) == 1,
               "l1_loss_backward_cuda: grad_input must be ", input.shape(), " on ",
               input.device(), " with unit column stride");
  const int device = input.device().index;
  const int64_t rows = input.size(0), cols = input.size(1);
  if (rows * cols == 0) return;
  const int blocks = static_cast<int>(std::min<int64_t>(cuda::ceil_div(rows * cols, kThreads), 65536));
  cuda::set_device(device);
  l1_backward_kernel<<<blocks, kThreads, 0, cuda::current_stream(device)>>>(
      grad_loss.data(), Matrix{input.data(), input.stride(0)},
      Matrix{target.data(), target.stride(0)}, rows, cols, scale, grad_input.data(),
      grad_input.stride(0));
  CUDA_LAUNCH_CHECK();
}

}  // namespace seqpar::nn::detail
