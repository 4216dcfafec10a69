// CUDA kernel for the forward of a narrow Linear (out_features <= 16, in_features <=
// 768: the issue's 640 -> 16), where a GEMM tile is mostly empty columns.
//
// A thread owns one row and kPerThread of its (up to 16) outputs: kPerThread fma chains
// over k = 0, 1, ... from +0, then + bias, the canonical order of nn/linear_kernels.h,
// so y has the CPU's bits whatever kPerThread is. Wᵀ (in x 16 floats, at most 48 KB) is
// staged once per block in shared memory; the threads of one row are adjacent lanes, so
// a warp's read of x is one 16-byte load per row shared by those lanes, and its read of
// Wᵀ at one k touches 64 bytes, one shared-memory wavefront.
//
// Why not one thread per row and all 16 outputs: 12,000 rows are then 94 blocks of four
// warps, one warp per scheduler on most SMs, and every load's latency shows. Four
// threads a row give four times the warps for the same instructions per FMA (one
// 16-byte read of Wᵀ per four FMAs either way); bench/RESULTS.md has the variants.
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
constexpr int kDefaultPerThread = 4;

template <int kPerThread, bool kVector>
__global__ void __launch_bounds__(kNarrowThreads) narrow_forward_kernel(
    ConstRows x, const float* weight, int64_t weight_row_stride, const float* bias, int64_t out,
    float* y, int64_t y_row_stride) {
  static_assert(kNarrowOut % kPerThread == 0 && kPerThread % 4 == 0, "whole float4 groups");
  constexpr int kThreadsPerRow = kNarrowOut / kPerThread;
  extern __shared__ float weight_t[];  // [in][16], zero past `out`
  const int64_t in = x.cols;
  // Read along W's rows (coalesced), write transposed.
  for (int64_t i = threadIdx.x; i < in * kNarrowOut; i += blockDim.x) {
    const int64_t j = i / in, k = i % in;
    weight_t[k * kNarrowOut + j] = j < out ? weight[j * weight_row_stride + k] : 0.0f;
  }
  __syncthreads();
  const int64_t row =
      int64_t{blockIdx.x} * (kNarrowThreads / kThreadsPerRow) + threadIdx.x / kThreadsPerRow;
  const int j0 = static_cast<int>(threadIdx.x % kThreadsPerRow) * kPerThread;
  if (row >= x.rows || j0 >= out) return;
  const float* x_row = x.data + row * x.row_stride;
  float sum[kPerThread] = {};
  auto step = [&](float value, int64_t k) {
    const float4* w = reinterpret_cast<const float4*>(weight_t + k * kNarrowOut + j0);
#pragma unroll
    for (int q = 0; q < kPerThread / 4; ++q) {
      const float4 w4 = w[q];
      sum[4 * q] = fmaf(value, w4.x, sum[4 * q]);
      sum[4 * q + 1] = fmaf(value, w4.y, sum[4 * q + 1]);
      sum[4 * q + 2] = fmaf(value, w4.z, sum[4 * q + 2]);
      sum[4 * q + 3] = fmaf(value, w4.w, sum[4 * q + 3]);
    }
  };
  if (kVector) {
    // Two 16-byte reads in flight ahead of the FMAs: each thread's loop is otherwise
    // one load's latency per four values of x.
    const float4* x4 = reinterpret_cast<const float4*>(x_row);
    const int64_t quads = in / 4;
    auto quad = [&](const float4& v, int64_t q) {
      step(v.x, 4 * q);
      step(v.y, 4 * q + 1);
      step(v.z, 4 * q + 2);
      step(v.w, 4 * q + 3);
    };
    float4 even = quads > 0 ? x4[0] : float4{}, odd = quads > 1 ? x4[1] : float4{};
    for (int64_t q = 0; q < quads; q += 2) {
      const float4 v = even;
      if (q + 2 < quads) even = x4[q + 2];
      quad(v, q);
      if (q + 1 < quads) {
        const float4 w = odd;
        if (q + 3 < quads) odd = x4[q + 3];
        quad(w, q + 1);
      }
    }
  } else {
    for (int64_t k = 0; k < in; ++k) step(x_row[k], k);
  }
  float* y_row = y + row * y_row_stride + j0;
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    if (j0 + j < out) y_row[j] = bias != nullptr ? __fadd_rn(sum[j], bias[j0 + j]) : sum[j];
  }
}

template <int kPerThread>
void launch_narrow_forward(const ConstRows& x, const float* weight, int64_t weight_row_stride,
                           const float* bias, int64_t out, float* y, int64_t y_row_stride,
                           cudaStream_t stream) {
  const size_t shared_bytes = static_cast<size_t>(x.cols) * kNarrowOut * sizeof(float);
  const bool vector = x.cols % 4 == 0 && x.row_stride % 4 == 0 && cuda::aligned16(x.data);
  const int64_t rows_per_block = kNarrowThreads / (kNarrowOut / kPerThread);
  const unsigned blocks = static_cast<unsigned>(cuda::ceil_div(x.rows, rows_per_block));
  if (vector) {
    narrow_forward_kernel<kPerThread, true><<<blocks, kNarrowThreads, shared_bytes, stream>>>(
        x, weight, weight_row_stride, bias, out, y, y_row_stride);
  } else {
    narrow_forward_kernel<kPerThread, false><<<blocks, kNarrowThreads, shared_bytes, stream>>>(
        x, weight, weight_row_stride, bias, out, y, y_row_stride);
  }
  CUDA_LAUNCH_CHECK();
}

}  // namespace

bool narrow_forward_fits(const ConstRows& x, int64_t out) {
  // The grid's x dimension: 32 rows a block at 4 outputs a thread, the fewest.
  return out <= kNarrowOut && x.cols <= kNarrowMaxIn && x.rows <= int64_t{0x7fffffff} * 32;
}

void narrow_forward_cuda(const ConstRows& x, const float* weight, int64_t weight_row_stride,
                         const float* bias, int64_t out, float* y, int64_t y_row_stride,
                         int device, int outputs_per_thread) {
  SEQPAR_CHECK(narrow_forward_fits(x, out), "narrow_forward_cuda: ", x.rows, " x ", x.cols,
               " -> ", out, " is not a narrow Linear");
  if (outputs_per_thread == 0) outputs_per_thread = kDefaultPerThread;
  SEQPAR_CHECK(outputs_per_thread == 4 || outputs_per_thread == 8 || outputs_per_thread == 16,
               "narrow_forward_cuda: ", outputs_per_thread, " outputs per thread (4, 8 or 16)");
  if (x.rows == 0 || out == 0) return;
  cuda::set_device(device);
  cudaStream_t stream = cuda::current_stream(device);
  switch (outputs_per_thread) {
    case 4: return launch_narrow_forward<4>(x, weight, weight_row_stride, bias, out, y, y_row_stride, stream);
    case 8: return launch_narrow_forward<8>(x, weight, weight_row_stride, bias, out, y, y_row_stride, stream);
    default: return launch_narrow_forward<16>(x, weight, weight_row_stride, bias, out, y, y_row_stride, stream);
  }
}

}  // namespace seqpar::nn::detail
