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
// warps, one warp per scheduler on most SMs, and every load's latency shows. Two or
// four threads a row give more warps for the same instructions per FMA (one 16-byte
// read of Wᵀ per four FMAs either way); bench/RESULTS.md has the variants.
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
constexpr int kDefaultPerThread = 8;  // measured fastest (bench/RESULTS.md), 4 a close second

template <int kPerThread, bool kVector>
__global__ void __launch_bounds__(kNarrowThreads) narrow_forward_kernel(
    ConstRows x, const float* weight, int64_t weight_row_stride, const float* bias, int64_t out,
    float* y, int64_t y_row_stride) {
  static_assert(kNarrowOut % kPerThread == 0 && kPerThread % 4 == 0, "whole float4 groups");
  constexpr int kThreadsPerRow = kNarrowOut / kPerThread;
  extern __shared__ float weight_t[];  // [in][16], zero past `out`
  const int64_t in = x.cols;
  // Wᵀ: a thread takes every 128th k and its 16 weights, read along W's rows (each
  // of the 16 loads coalesced across the warp, all 16 in flight at once: staged one
  // load at a time, this copy took longer than the FMAs) and stored as four float4s.
  for (int64_t k = threadIdx.x; k < in; k += kNarrowThreads) {
    float column[kNarrowOut];
#pragma unroll
    for (int j = 0; j < kNarrowOut; ++j) column[j] = j < out ? weight[j * weight_row_stride + k] : 0.0f;
    float4* row = reinterpret_cast<float4*>(weight_t + k * kNarrowOut);
#pragma unroll
    for (int q = 0; q < kNarrowOut / 4; ++q) {
      row[q] = make_float4(column[4 * q], column[4 * q + 1], column[4 * q + 2], column[4 * q + 3]);
    }
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
    // Eight 16-byte reads of the row in flight ahead of the FMAs that use them: a
    // thread's loop is otherwise one load's latency (hundreds of cycles from memory) per
    // four values of x, and a few warps per scheduler cannot hide it.
    const float4* x4 = reinterpret_cast<const float4*>(x_row);
    const int64_t quads = in / 4;
    constexpr int kAhead = 8;
    float4 current[kAhead], next[kAhead];
#pragma unroll
    for (int i = 0; i < kAhead; ++i) current[i] = i < quads ? x4[i] : float4{};
    for (int64_t q0 = 0; q0 < quads; q0 += kAhead) {
#pragma unroll
      for (int i = 0; i < kAhead; ++i) {
        next[i] = q0 + kAhead + i < quads ? x4[q0 + kAhead + i] : float4{};
      }
#pragma unroll
      for (int i = 0; i < kAhead; ++i) {
        if (q0 + i < quads) {
          const float4 v = current[i];
          const int64_t k = 4 * (q0 + i);
          step(v.x, k);
          step(v.y, k + 1);
          step(v.z, k + 2);
          step(v.w, k + 3);
        }
      }
#pragma unroll
      for (int i = 0; i < kAhead; ++i) current[i] = next[i];
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
