// CUDA kernel of nn/linear_large.h: the classic register-blocked SGEMM.
//
// A block of 256 threads owns a 128 x 128 tile of C and walks K in slices of 8:
// each slice of A and B (128 x 8 each, one 16-byte load per thread) is stored
// transposed in shared memory (k-major, rows padded by 4 floats so the transposing
// stores hit 32 distinct banks), double-buffered: the next slice's global loads are
// issued before the current slice's FMAs and stored after them, one barrier per
// slice. Each thread accumulates an 8 x 8 sub-tile in registers: rows ty*4 + i and
// 64 + ty*4 + i, columns tx*4 + j and 64 + tx*4 + j, so every shared-memory read is a
// 16-byte vector, a warp's reads of B cover 32 distinct banks, and its reads of A are
// broadcasts. Per slice a thread does 64 FMAs for 4 vector loads. Each element of C
// is one fma chain in k order: deterministic, no split of K.
//
// What it does not use: Hopper's tensor cores (wgmma) — their fp32 inputs go through
// TF32, which the issue's fp32 comparison rules out — and the asynchronous copy
// engine (cp.async / TMA), which would take the loads off the registers.
#include "nn/linear_large.h"

#include <cstdint>

#include "core/cuda_check.h"

namespace seqpar::nn::detail {

namespace {

constexpr int kTile = 128, kSlice = 8, kThreads = 256, kPad = 4;
constexpr int kHalf = kTile / 2;
constexpr int64_t kMinTiles = 128;  // fewer tiles than about one per SM: the split-K kernel

__device__ __forceinline__ float4 load_row_slice(const float* base, int64_t ld, int64_t row,
                                                 int64_t rows, int64_t k, int64_t depth) {
  if (row < rows && k < depth) return *reinterpret_cast<const float4*>(base + row * ld + k);
  return make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

__device__ __forceinline__ void store_transposed(float (*tile)[kTile + kPad], int row, int k,
                                                 float4 v) {
  tile[k + 0][row] = v.x;
  tile[k + 1][row] = v.y;
  tile[k + 2][row] = v.z;
  tile[k + 3][row] = v.w;
}

__global__ void __launch_bounds__(kThreads, 2) large_gemm_kernel(LargeGemm g) {
  __shared__ __align__(16) float a_tile[2][kSlice][kTile + kPad];
  __shared__ __align__(16) float b_tile[2][kSlice][kTile + kPad];
  const int t = threadIdx.x;
  const int load_row = t / 2, load_k = (t % 2) * 4;  // one float4 of A and of B per slice
  const int ty = t / 16, tx = t % 16;
  const int64_t m0 = int64_t{blockIdx.x} * kTile, n0 = int64_t{blockIdx.y} * kTile;

  float4 a_next = load_row_slice(g.a, g.lda, m0 + load_row, g.m, load_k, g.k);
  float4 b_next = load_row_slice(g.b, g.ldb, n0 + load_row, g.n, load_k, g.k);
  store_transposed(a_tile[0], load_row, load_k, a_next);
  store_transposed(b_tile[0], load_row, load_k, b_next);
  __syncthreads();

  float sum[8][8] = {};
  const int64_t slices = cuda::ceil_div(g.k, kSlice);
  for (int64_t s = 0; s < slices; ++s) {
    const int current = static_cast<int>(s & 1);
    const bool more = s + 1 < slices;
    if (more) {
      const int64_t k = (s + 1) * kSlice + load_k;
      a_next = load_row_slice(g.a, g.lda, m0 + load_row, g.m, k, g.k);
      b_next = load_row_slice(g.b, g.ldb, n0 + load_row, g.n, k, g.k);
    }
#pragma unroll
    for (int kk = 0; kk < kSlice; ++kk) {
      const float* a_row = a_tile[current][kk];
      const float* b_row = b_tile[current][kk];
      const float4 a_low = *reinterpret_cast<const float4*>(a_row + ty * 4);
      const float4 a_high = *reinterpret_cast<const float4*>(a_row + kHalf + ty * 4);
      const float4 b_low = *reinterpret_cast<const float4*>(b_row + tx * 4);
      const float4 b_high = *reinterpret_cast<const float4*>(b_row + kHalf + tx * 4);
      const float a[8] = {a_low.x, a_low.y, a_low.z, a_low.w, a_high.x, a_high.y, a_high.z, a_high.w};
      const float b[8] = {b_low.x, b_low.y, b_low.z, b_low.w, b_high.x, b_high.y, b_high.z, b_high.w};
#pragma unroll
      for (int i = 0; i < 8; ++i) {
#pragma unroll
        for (int j = 0; j < 8; ++j) sum[i][j] = fmaf(a[i], b[j], sum[i][j]);
      }
    }
    if (more) {  // the other buffer was last read before the previous barrier
      store_transposed(a_tile[current ^ 1], load_row, load_k, a_next);
      store_transposed(b_tile[current ^ 1], load_row, load_k, b_next);
    }
    __syncthreads();
  }

#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int64_t row = m0 + (i < 4 ? ty * 4 + i : kHalf + ty * 4 + i - 4);
    if (row >= g.m) continue;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t col = n0 + half * kHalf + tx * 4;
      if (col >= g.n) continue;  // n % 4 == 0: col < n covers col .. col + 3
      float4 v = make_float4(sum[i][4 * half], sum[i][4 * half + 1], sum[i][4 * half + 2],
                             sum[i][4 * half + 3]);
      if (g.bias != nullptr) {
        v.x += g.bias[col];
        v.y += g.bias[col + 1];
        v.z += g.bias[col + 2];
        v.w += g.bias[col + 3];
      }
      *reinterpret_cast<float4*>(g.c + row * g.ldc + col) = v;
    }
  }
}

bool aligned16(const void* pointer) { return reinterpret_cast<uintptr_t>(pointer) % 16 == 0; }

}  // namespace

bool large_gemm_applies(const LargeGemm& g) {
  const int64_t tiles = cuda::ceil_div(g.m, kTile) * cuda::ceil_div(g.n, kTile);
  return tiles >= kMinTiles && g.k % 4 == 0 && g.n % 4 == 0 && g.lda % 4 == 0 &&
         g.ldb % 4 == 0 && g.ldc % 4 == 0 && aligned16(g.a) && aligned16(g.b) && aligned16(g.c) &&
         cuda::ceil_div(g.n, kTile) <= 65535;
}

void large_gemm_cuda(const LargeGemm& g, cuda::Stream stream) {
  SEQPAR_CHECK(large_gemm_applies(g), "large_gemm_cuda: shape or alignment not supported");
  const dim3 grid(static_cast<unsigned>(cuda::ceil_div(g.m, kTile)),
                  static_cast<unsigned>(cuda::ceil_div(g.n, kTile)));
  large_gemm_kernel<<<grid, kThreads, 0, stream>>>(g);
  CUDA_LAUNCH_CHECK();
}

}  // namespace seqpar::nn::detail
