// CUDA kernel of train/kernels/skinny.h's forward: y = x Wᵀ + b for out_features <= 64, or,
// fused with an L1 loss, the per-block |y - target| partials and sign(y - target).
// (Why skinny shapes get kernels of their own: the design note of train/kernels/skinny_weight_grad.cu.)
//
// Forward. A warp owns 8 rows (four per lane), and 16 lanes share a row: lane c reads
// columns 4c .. 4c+3 of every 64. x comes through shared memory by cp.async, three
// 64-column steps ahead of the FMAs; W (40 KB) is read through L1. Each lane
// keeps 16 partial dot products per row, then 4 butterfly exchanges (xor 8, 4, 2, 1)
// halve the 16 sums each time until lane c holds output c, each summed in a fixed
// tree. Each W value a lane loads serves its 4 rows.
#include <algorithm>
#include <climits>
#include <cstdint>

#include "core/async_copy.cuh"
#include "core/block_reduce.cuh"
#include "core/cuda_check.h"
#include "train/kernels/skinny.h"
#include "train/kernels/skinny.cuh"

namespace seqpar::train::kernels {

namespace {

constexpr int kForwardWarps = 4;
constexpr int kForwardThreads = 32 * kForwardWarps;
// 64 accumulators with a step's x and W fit the 168 registers of 3 blocks per SM
// (__launch_bounds__ below: all 375 blocks of the issue's shape resident).
constexpr int64_t kForwardMaxBlocks = 1024;          // a constant: partials depend on shape only

struct SkinnyForward {
  RowsView x;
  const float* weight;
  const float* bias;
  int64_t rows, in, out;
  float* y;
  int64_t y_row_stride;
  L1Outputs l1;  // used when kFuseL1
};

template <bool kFuseL1>
__device__ __forceinline__ void forward_epilogue(const SkinnyForward& p, int64_t row, int64_t o,
                                                 float sum, double& abs_sum) {
  const float value = p.bias != nullptr ? sum + p.bias[o] : sum;
  if (!kFuseL1) {
    p.y[row * p.y_row_stride + o] = value;
    return;
  }
  const float difference = __fsub_rn(value, p.l1.target.data[row * p.l1.target.row_stride + o]);
  abs_sum += fabsf(difference);
  p.l1.sign[row * p.out + o] = l1_sign(difference);
}

// x reaches shared memory through cp.async, kForwardStages 64-column steps ahead of
// the FMAs. Each lane copies exactly the values it will read (its 4 rows' quad of the
// step), so a lane's own wait_copies is the only synchronization the ring needs, and a
// warp keeps 3 steps (6 KB) in flight without spending registers on them. Columns past
// `in` arrive as zeros.
constexpr int kForwardStages = 3;
constexpr int kStageFloats = kRowsPerWarp * kColumnsPerStep;  // one step of a warp's 8 rows
size_t forward_ring_bytes() { return size_t{kForwardWarps} * kForwardStages * kStageFloats * sizeof(float); }

// One step's copies as one copy group; past the last step an empty group, so that
// wait_copies counts steps (and no stage is written twice without a wait between).
template <bool kVector>
__device__ __forceinline__ void copy_step(float* stage, const float* const (&x_rows)[kRowsPerLane],
                                          int64_t k, int64_t in, bool active) {
#pragma unroll
  for (int i = 0; i < kRowsPerLane && active; ++i) {
    float* slot = stage + i * kRowGroups * kColumnsPerStep;
    if (kVector) {
      cuda::copy_async16_or_zero(slot, x_rows[i] + (k < in ? k : 0), k < in);
    } else {
#pragma unroll
      for (int c = 0; c < 4; ++c) cuda::copy_async4_or_zero(slot + c, x_rows[i] + (k + c < in ? k + c : 0), k + c < in);
    }
  }
  cuda::commit_copies();
}

template <bool kVector, bool kFuseL1>
__global__ void __launch_bounds__(kForwardThreads, 3) skinny_forward_kernel(SkinnyForward p) {
  extern __shared__ float4 shared_words[];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int column_lane = lane % kLanesPerRow, row_group = lane / kLanesPerRow;
  const int64_t out0 = int64_t{blockIdx.y} * kOutGroup;
  const int64_t tiles = cuda::ceil_div(p.rows, kRowsPerWarp);
  const int64_t warp_count = int64_t{gridDim.x} * kForwardWarps;
  const int steps = static_cast<int>(cuda::ceil_div(p.in, kColumnsPerStep));
  // This lane's slot in each stage of its warp's ring: row row_group, columns 4c .. 4c+3.
  float* lane_ring = reinterpret_cast<float*>(shared_words) + warp * kForwardStages * kStageFloats +
                     row_group * kColumnsPerStep + 4 * column_lane;
  const float* x_rows[kRowsPerLane];
  // A tile's first kForwardStages - 1 steps, each its own copy group (empty past the
  // last step, or for a warp without a tile).
  auto begin_tile = [&](int64_t tile) {
#pragma unroll
    for (int i = 0; i < kRowsPerLane; ++i) {  // a row past the end reads the last row; its sums are dropped
      const int64_t row = min(tile * kRowsPerWarp + lane_row(row_group, i), p.rows - 1);
      x_rows[i] = p.x.data + row * p.x.row_stride;
    }
    for (int s = 0; s < kForwardStages - 1; ++s) {
      copy_step<kVector>(lane_ring + s * kStageFloats, x_rows, int64_t{s} * kColumnsPerStep + 4 * column_lane,
                         p.in, s < steps && tile < tiles);
    }
  };
  int64_t tile = int64_t{blockIdx.x} * kForwardWarps + warp;
  begin_tile(tile);
  // W is read through L1, where the SM's blocks share its 40 KB: rows past `out` repeat
  // the last row (valid memory; their sums are dropped), one 32-bit multiply-add per
  // row's address.
  const float* w_group = p.weight + out0 * p.in;
  const int in32 = static_cast<int>(p.in);  // launch_forward: W has < 2^31 elements
  const int last_row = static_cast<int>(min(int64_t{kOutGroup}, p.out - out0)) - 1;
  double abs_sum = 0.0;
  for (; tile < tiles; tile += warp_count) {  // the same count for the whole warp: shuffles stay converged
    float sum[kRowsPerLane][kOutGroup] = {};
    for (int s = 0; s < steps; ++s) {
      const int ahead = s + kForwardStages - 1;  // refills the stage step s - 1 used
      copy_step<kVector>(lane_ring + (ahead % kForwardStages) * kStageFloats, x_rows,
                         int64_t{ahead} * kColumnsPerStep + 4 * column_lane, p.in, ahead < steps);
      cuda::wait_copies<kForwardStages - 1>();  // step s has landed
      const float* stage = lane_ring + (s % kForwardStages) * kStageFloats;
      float4 x[kRowsPerLane];
#pragma unroll
      for (int i = 0; i < kRowsPerLane; ++i) x[i] = *reinterpret_cast<const float4*>(stage + i * kRowGroups * kColumnsPerStep);
      const int64_t k = int64_t{s} * kColumnsPerStep + 4 * column_lane;
      const float* w_k = w_group + k;
#pragma unroll
      for (int o = 0; o < kOutGroup; ++o) {
        const float4 w_o = load_columns<kVector, false>(w_k + min(o, last_row) * in32, 0, p.in - k, true);
#pragma unroll
        for (int i = 0; i < kRowsPerLane; ++i) fma4(sum[i][o], x[i], w_o);
      }
    }
    const int64_t first_row = tile * kRowsPerWarp;
    if (tile + warp_count < tiles) begin_tile(tile + warp_count);  // overlaps the butterfly
    const int64_t o = out0 + column_lane;
#pragma unroll
    for (int i = 0; i < kRowsPerLane; ++i) {
      reduce_over_row_lanes(sum[i], column_lane);
      const int64_t row = first_row + lane_row(row_group, i);
      if (row < p.rows && o < p.out) forward_epilogue<kFuseL1>(p, row, o, sum[i][0], abs_sum);
    }
  }
  cuda::wait_copies<0>();  // nothing in flight when the block exits
  if (kFuseL1) {
    abs_sum = cuda::block_sum(abs_sum);
    if (threadIdx.x == 0) p.l1.loss_partials[int64_t{blockIdx.y} * gridDim.x + blockIdx.x] = abs_sum;
  }
}

dim3 forward_grid(int64_t rows, int64_t out) {
  const int64_t tiles = cuda::ceil_div(rows, kRowsPerWarp);
  const int64_t blocks = std::clamp<int64_t>(cuda::ceil_div(tiles, kForwardWarps), 1, kForwardMaxBlocks);
  return dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(cuda::ceil_div(out, kOutGroup)));
}

template <bool kFuseL1>
void launch_forward(const SkinnyForward& p, cuda::Stream stream) {
  SEQPAR_CHECK(p.out >= 1 && p.out <= kSkinnyMaxOut, "skinny linear: out_features ", p.out,
               " is not in [1, ", kSkinnyMaxOut, "]");
  SEQPAR_CHECK(p.out * p.in <= INT32_MAX, "skinny linear: weight [", p.out, ", ", p.in,
               "] has 2^31 elements or more");
  if (p.rows == 0) return;
  const bool vector = p.in % 4 == 0 && p.x.row_stride % 4 == 0 && aligned16(p.x.data) &&
                      aligned16(p.weight);
  const dim3 grid = forward_grid(p.rows, p.out);
  const size_t shared = forward_ring_bytes();  // 24 KB
  if (vector) {
    skinny_forward_kernel<true, kFuseL1><<<grid, kForwardThreads, shared, stream>>>(p);
  } else {
    skinny_forward_kernel<false, kFuseL1><<<grid, kForwardThreads, shared, stream>>>(p);
  }
  CUDA_LAUNCH_CHECK();
}

}  // namespace

int64_t skinny_forward_partial_count(int64_t rows, int64_t out) {
  const dim3 grid = forward_grid(rows, out);
  return int64_t{grid.x} * grid.y;
}

void skinny_forward_cuda(RowsView x, const float* weight, const float* bias, int64_t rows,
                         int64_t in, int64_t out, float* y, int64_t y_row_stride,
                         cuda::Stream stream) {
  launch_forward<false>(SkinnyForward{x, weight, bias, rows, in, out, y, y_row_stride, {}}, stream);
}

void skinny_forward_l1_cuda(RowsView x, const float* weight, const float* bias, int64_t rows,
                            int64_t in, int64_t out, const L1Outputs& l1, cuda::Stream stream) {
  launch_forward<true>(SkinnyForward{x, weight, bias, rows, in, out, nullptr, 0, l1}, stream);
}

}  // namespace seqpar::train::kernels
