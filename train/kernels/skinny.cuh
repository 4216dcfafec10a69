// Device helpers shared by the skinny Linear kernels (train/kernels/skinny_forward.cu,
// train/kernels/skinny_weight_grad.cu) and the one-pass training-step kernel
// (train/kernels/one_pass_step.cu): the loads of x and W, the forward's lane layout and its
// butterfly over the 16 lanes of a row. Both kernels sum in exactly this order, so
// their y (and thus the sign the loss gradient takes) are the same bits.
#pragma once

#include <cstdint>

#include "core/cuda_runtime.h"
#include "core/cuda_util.cuh"
#include "nn/l1_sign.h"
#include "train/kernels/skinny.h"

namespace seqpar::train::kernels {

constexpr int kOutGroup = 16;  // outputs per pass; grid.y (forward) or grid.z walks the groups

__device__ __forceinline__ float4 zero4() { return make_float4(0.0f, 0.0f, 0.0f, 0.0f); }

// x is streamed once: keep it out of L1 (L2 still caches it for the next kernel).
__device__ __forceinline__ float4 load_streaming(const float* address) {
  float4 v;
  asm("ld.global.nc.L1::no_allocate.v4.f32 {%0, %1, %2, %3}, [%4];"
      : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
      : "l"(address));
  return v;
}

// Columns k .. k+3 of a row, zero past `end` or for an invalid row. kVector: the row
// is 16-byte aligned and `end` and k are multiples of 4, so one load covers them.
template <bool kVector, bool kStreaming>
__device__ __forceinline__ float4 load_columns(const float* row, int64_t k, int64_t end,
                                               bool valid) {
  float4 v = zero4();
  if (!valid) return v;
  if (kVector) {
    if (k < end) {
      v = kStreaming ? load_streaming(row + k) : __ldg(reinterpret_cast<const float4*>(row + k));
    }
  } else {
    if (k < end) v.x = row[k];
    if (k + 1 < end) v.y = row[k + 1];
    if (k + 2 < end) v.z = row[k + 2];
    if (k + 3 < end) v.w = row[k + 3];
  }
  return v;
}

__device__ __forceinline__ void fma4(float& sum, float4 a, float4 b) {
  sum = fmaf(a.x, b.x, sum);
  sum = fmaf(a.y, b.y, sum);
  sum = fmaf(a.z, b.z, sum);
  sum = fmaf(a.w, b.w, sum);
}

// sign(d), sign(0) = 0, NaN stays NaN: the L1 backward's rule (nn/l1_sign.h).
using nn::l1_sign;

// The forward's warp layout: 16 lanes share a row (lane c reads columns 4c .. 4c+3 of
// every 64), 2 row groups, each lane four rows (g, g + 2, g + 4, g + 6): 8 rows per
// warp. Each W value a lane loads feeds 4 rows x 4 FMAs: shared memory serves a
// 16-byte load one quarter-warp per cycle even when the lanes share the address, so
// rows per lane, not unique bytes, set the forward's shared-memory traffic.
constexpr int kLanesPerRow = 16;                     // 16 lanes x 4 floats = 64 columns
constexpr int kColumnsPerStep = 4 * kLanesPerRow;
constexpr int kRowGroups = 32 / kLanesPerRow;        // rows a warp reads per load
constexpr int kRowsPerLane = 4;
constexpr int kRowsPerWarp = kRowGroups * kRowsPerLane;
// A lane's i-th row of an 8-row item.
__device__ __forceinline__ int lane_row(int row_group, int i) { return row_group + kRowGroups * i; }

// One butterfly level: lanes whose bit kHalf is set keep the upper kHalf of their
// 2 kHalf values, the others the lower; each adds its partner's copy of what it keeps.
template <int kHalf>
__device__ __forceinline__ void butterfly_level(float (&a)[kOutGroup], int column_lane) {
  const bool upper = column_lane & kHalf;
#pragma unroll
  for (int i = 0; i < kHalf; ++i) {
    const float keep = upper ? a[i + kHalf] : a[i], give = upper ? a[i] : a[i + kHalf];
    a[i] = keep + __shfl_xor_sync(0xffffffffu, give, kHalf);
  }
}

// 16 partial sums per lane -> lane c (of 16) holds output c in a[0]: four levels
// (xor 8, 4, 2, 1). Every output is the same fixed tree over its 16 lane sums.
__device__ __forceinline__ void reduce_over_row_lanes(float (&a)[kOutGroup], int column_lane) {
  static_assert(kLanesPerRow == 16 && kOutGroup == 16, "four levels: 16 sums over 16 lanes");
  butterfly_level<8>(a, column_lane);
  butterfly_level<4>(a, column_lane);
  butterfly_level<2>(a, column_lane);
  butterfly_level<1>(a, column_lane);
}

using cuda::aligned16;

// The weight gradient's step for one row, shared by the weight-gradient kernel and the
// one-pass step so both sum in the same order: sum[o][c] += dy[r][o] * x[r][4q + c].
__device__ __forceinline__ void weight_grad_row(float4 x, const float4 (&g)[kOutGroup / 4],
                                                float (&sum)[kOutGroup][4]) {
#pragma unroll
  for (int q = 0; q < kOutGroup / 4; ++q) {
    const float gs[4] = {g[q].x, g[q].y, g[q].z, g[q].w};
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      sum[4 * q + c][0] = fmaf(gs[c], x.x, sum[4 * q + c][0]);
      sum[4 * q + c][1] = fmaf(gs[c], x.y, sum[4 * q + c][1]);
      sum[4 * q + c][2] = fmaf(gs[c], x.z, sum[4 * q + c][2]);
      sum[4 * q + c][3] = fmaf(gs[c], x.w, sum[4 * q + c][3]);
    }
  }
}

// Stores a thread's weight-gradient sums, columns k .. k+3 of outputs out0 .. out0+15,
// into one chunk's partial dW ([out, in], row-major); columns past `in` and outputs
// past `out` are skipped. kVector: rows 16-byte aligned and `in` a multiple of 4.
template <bool kVector>
__device__ __forceinline__ void store_weight_sums(float* partial, int64_t in, int64_t out,
                                                  int64_t out0, int64_t k,
                                                  const float (&sum)[kOutGroup][4]) {
  if (k >= in) return;
#pragma unroll
  for (int o = 0; o < kOutGroup; ++o) {
    if (out0 + o >= out) break;
    float* row = partial + (out0 + o) * in;
    if (kVector) {
      *reinterpret_cast<float4*>(row + k) = make_float4(sum[o][0], sum[o][1], sum[o][2], sum[o][3]);
    } else {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        if (k + c < in) row[k + c] = sum[o][c];
      }
    }
  }
}

}  // namespace seqpar::train::kernels
