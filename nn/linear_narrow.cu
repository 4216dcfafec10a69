// CUDA kernel for the forward of a narrow Linear (out_features <= 16, in_features <=
// 768: the issue's 640 -> 16), where a GEMM tile is mostly empty columns.
//
// One thread owns one row and all (up to 16) outputs: 16 fma chains over k = 0, 1, ...
// from +0, then + bias, the canonical order of nn/linear_kernels.h, so y has the CPU's
// bits. Wᵀ (in x 16 floats, at most 48 KB) is staged once per block in shared memory,
// where a warp's reads of one k are broadcasts; each thread reads its own row of x,
// 16 bytes at a time when the rows allow it, and every x value feeds 16 independent
// chains.
#include <cstdint>

#include "core/cuda_check.h"
#include "core/cuda_runtime.h"
#include "core/cuda_util.cuh"
#include "nn/linear_kernels.h"

namespace seqpar::nn::detail {

namespace {

constexpr int kNarrowOut = 16;
constexpr int64_t kNarrowMaxIn = 768;  // Wᵀ in the default 48 KB of shared memory
constexpr int kNarrowThreads = 128;

template <bool kVector>
__global__ void __launch_bounds__(kNarrowThreads) narrow_forward_kernel(
    ConstRows x, const float* weight, int64_t weight_row_stride, const float* bias, int64_t out,
    float* y, int64_t y_row_stride) {
  extern __shared__ float weight_t[];  // [in][16], zero past `out`
  const int64_t in = x.cols;
  for (int64_t i = threadIdx.x; i < in * kNarrowOut; i += blockDim.x) {
    const int64_t k = i / kNarrowOut, j = i % kNarrowOut;
    weight_t[i] = j < out ? weight[j * weight_row_stride + k] : 0.0f;
  }
  __syncthreads();
  const int64_t row = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (row >= x.rows) return;
  const float* x_row = x.data + row * x.row_stride;
  float sum[kNarrowOut] = {};
  auto step = [&](float value, int64_t k) {
    const float4* w = reinterpret_cast<const float4*>(weight_t + k * kNarrowOut);
#pragma unroll
    for (int q = 0; q < kNarrowOut / 4; ++q) {
      const float4 w4 = w[q];
      sum[4 * q] = fmaf(value, w4.x, sum[4 * q]);
      sum[4 * q + 1] = fmaf(value, w4.y, sum[4 * q + 1]);
      sum[4 * q + 2] = fmaf(value, w4.z, sum[4 * q + 2]);
      sum[4 * q + 3] = fmaf(value, w4.w, sum[4 * q + 3]);
    }
  };
  if (kVector) {
    for (int64_t k = 0; k < in; k += 4) {
      const float4 v = *reinterpret_cast<const float4*>(x_row + k);
      step(v.x, k);
      step(v.y, k + 1);
      step(v.z, k + 2);
      step(v.w, k + 3);
    }
  } else {
    for (int64_t k = 0; k < in; ++k) step(x_row[k], k);
  }
  float* y_row = y + row * y_row_stride;
#pragma unroll
  for (int j = 0; j < kNarrowOut; ++j) {
    if (j < out) y_row[j] = bias != nullptr ? __fadd_rn(sum[j], bias[j]) : sum[j];
  }
}

}  // namespace

bool narrow_forward_fits(const ConstRows& x, int64_t out) {
  return out <= kNarrowOut && x.cols <= kNarrowMaxIn && x.rows <= int64_t{0x7fffffff} * kNarrowThreads;
}

void narrow_forward_cuda(const ConstRows& x, const float* weight, int64_t weight_row_stride,
                         const float* bias, int64_t out, float* y, int64_t y_row_stride,
                         int device) {
  SEQPAR_CHECK(narrow_forward_fits(x, out), "narrow_forward_cuda: ", x.rows, " x ", x.cols,
               " -> ", out, " is not a narrow Linear");
  if (x.rows == 0 || out == 0) return;
  cuda::set_device(device);
  const size_t shared_bytes = static_cast<size_t>(x.cols) * kNarrowOut * sizeof(float);
  const bool vector = x.cols % 4 == 0 && x.row_stride % 4 == 0 && cuda::aligned16(x.data);
  const unsigned blocks = static_cast<unsigned>(cuda::ceil_div(x.rows, kNarrowThreads));
  cudaStream_t stream = cuda::current_stream(device);
  if (vector) {
    narrow_forward_kernel<true><<<blocks, kNarrowThreads, shared_bytes, stream>>>(
        x, weight, weight_row_stride, bias, out, y, y_row_stride);
  } else {
    narrow_forward_kernel<false><<<blocks, kNarrowThreads, shared_bytes, stream>>>(
        x, weight, weight_row_stride, bias, out, y, y_row_stride);
  }
  CUDA_LAUNCH_CHECK();
}

}  // namespace seqpar::nn::detail
