// CUDA kernel for the forward of a Linear with few outputs (out_features <= 16, in_features <=
// 768: the issue's 640 -> 16), where a GEMM tile is mostly empty columns.
//
// A thread owns one row and kPerThread of its (up to 16) outputs: kPerThread fma chains
// over k = 0, 1, ... from +0, then + bias, the order of the reference's chains
// (nn/reference/linear.h), which define the bits: so y has the reference's bits
// whatever kPerThread is and whichever kernel runs. Wᵀ (in x 16 floats, at most 48 KB)
// is staged once per block in shared memory; the threads of one row are adjacent
// lanes, and a warp's read of Wᵀ at one k touches 64 bytes (two shared-memory
// wavefronts, the fewest a warp's 16-byte loads take). x comes through shared memory
// too, in tiles each warp loads coalesced several tiles ahead (the staged kernel, in
// nn/cuda/linear_forward_few_outputs.cuh), or, when its rows are not 16-byte aligned,
// straight from each thread's row (here).
//
// Why not one thread per row and all 16 outputs: a few thousand rows are then fewer
// blocks of four warps than there are SMs, one warp per scheduler, and every load's
// latency shows. Two or four threads a row give more warps for the same instructions
// per FMA (one 16-byte read of Wᵀ per four FMAs either way); bench/RESULTS.md has the
// variants.
#include <cstdint>

#include "core/cuda_check.h"
#include "nn/cuda/linear_forward_few_outputs.cuh"
#include "nn/cuda/linear.h"

namespace seqpar::nn::detail {

namespace {

// Any layout of x (unaligned rows, in % 4 != 0): each thread reads its row's x one float
// at a time.
template <int kPerThread>
__global__ void __launch_bounds__(kFewOutputsThreads) few_outputs_forward_kernel(
    ConstRows x, const float* weight, int64_t weight_row_stride, const float* bias, int64_t out,
    float* y, int64_t y_row_stride) {
  static_assert(kFewOutputsMax % kPerThread == 0 && kPerThread % 4 == 0, "whole float4 groups");
  constexpr int kThreadsPerRow = kFewOutputsMax / kPerThread;
  extern __shared__ float weight_t[];  // [in][16], zero past `out`
  const int64_t in = x.cols;
  stage_weight_t(weight, weight_row_stride, out, in, weight_t);
  __syncthreads();
  const int64_t row =
      int64_t{blockIdx.x} * (kFewOutputsThreads / kThreadsPerRow) + threadIdx.x / kThreadsPerRow;
  const int j0 = static_cast<int>(threadIdx.x % kThreadsPerRow) * kPerThread;
  if (row >= x.rows || j0 >= out) return;
  const float* x_row = x.data + row * x.row_stride;
  float sum[kPerThread] = {};
  for (int64_t k = 0; k < in; ++k) chain_step<kPerThread>(weight_t, j0, x_row[k], k, sum);
  store_row<kPerThread>(sum, bias, out, j0, y + row * y_row_stride);
}

template <int kPerThread>
void launch_few_outputs_forward(const ConstRows& x, const float* weight, int64_t weight_row_stride,
                           const float* bias, int64_t out, float* y, int64_t y_row_stride,
                           unsigned int* x_largest, int device, cudaStream_t stream) {
  const size_t weight_bytes = static_cast<size_t>(x.cols) * kFewOutputsMax * sizeof(float);
  const bool vector = staged_layout(x);
  const int64_t rows_per_block = kFewOutputsThreads / (kFewOutputsMax / kPerThread);
  const unsigned blocks = static_cast<unsigned>(cuda::ceil_div(x.rows, rows_per_block));
  const auto launch_staged = [&](auto kernel, size_t extra_bytes, unsigned int* largest) {
    cuda::allow_dynamic_shared_memory(kernel, weight_bytes + extra_bytes);
    cuda::launch_dependent(kernel, dim3(blocks), dim3(kFewOutputsThreads), weight_bytes + extra_bytes,
                           stream, x, weight, weight_row_stride, bias, out, y, y_row_stride, largest,
                           NoEpilogue{});
  };
  if (vector && x_largest != nullptr) {
    launch_staged(few_outputs_forward_staged_kernel<kPerThread, true>,
                  staged_extra_bytes<kPerThread, true>(), x_largest);
  } else if (vector) {
    launch_staged(few_outputs_forward_staged_kernel<kPerThread, false>,
                  staged_extra_bytes<kPerThread, false>(), nullptr);
  } else {  // the same bits, x read one float at a time; its maxima in a pass of their own
    if (x_largest != nullptr) column_maxima_cuda(x, x_largest, nullptr, stream);
    few_outputs_forward_kernel<kPerThread><<<blocks, kFewOutputsThreads, weight_bytes, stream>>>(
        x, weight, weight_row_stride, bias, out, y, y_row_stride);
  }
  CUDA_LAUNCH_CHECK();
}

}  // namespace

bool few_outputs_forward_fits(const ConstRows& x, int64_t out) {
  // The grid's x dimension: 32 rows a block at 4 outputs a thread, the fewest.
  return out <= kFewOutputsMax && x.cols <= kFewOutputsMaxIn && x.rows <= int64_t{0x7fffffff} * 32;
}

void few_outputs_forward_cuda(const ConstRows& x, const float* weight, int64_t weight_row_stride,
                         const float* bias, int64_t out, float* y, int64_t y_row_stride,
                         int device, unsigned int* x_largest, int outputs_per_thread) {
  SEQPAR_CHECK(few_outputs_forward_fits(x, out), "few_outputs_forward_cuda: ", x.rows, " x ", x.cols,
               " -> ", out, " is not a Linear with few outputs");
  if (outputs_per_thread == 0) outputs_per_thread = default_per_thread(x.rows, device);
  SEQPAR_CHECK(outputs_per_thread == 4 || outputs_per_thread == 8 || outputs_per_thread == 16,
               "few_outputs_forward_cuda: ", outputs_per_thread, " outputs per thread (4, 8 or 16)");
  if (x.rows == 0) return;
  cuda::set_device(device);
  cudaStream_t stream = cuda::current_stream(device);
  if (out == 0) {  // no y to compute, but maybe maxima
    if (x_largest != nullptr) column_maxima_cuda(x, x_largest, nullptr, stream);
    return;
  }
  switch (outputs_per_thread) {
    case 4: return launch_few_outputs_forward<4>(x, weight, weight_row_stride, bias, out, y, y_row_stride, x_largest, device, stream);
    case 8: return launch_few_outputs_forward<8>(x, weight, weight_row_stride, bias, out, y, y_row_stride, x_largest, device, stream);
    default: return launch_few_outputs_forward<16>(x, weight, weight_row_stride, bias, out, y, y_row_stride, x_largest, device, stream);
  }
}

}  // namespace seqpar::nn::detail
