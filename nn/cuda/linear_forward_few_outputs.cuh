// The kernel of nn/cuda/linear_forward_few_outputs.cu that reads x through shared memory, as
// a template: nn launches it as it is, and the benchmarks' fused step
// (bench/fused/kernels/) with an epilogue of its own. The file's design note is in the
// .cu beside it.
#pragma once

#include <cstdint>

#include "core/async_copy.cuh"
#include "core/cuda_runtime.h"
#include "core/cuda_util.cuh"
#include "core/dependent_launch.cuh"
#include "nn/rows.h"

namespace seqpar::nn::detail {


constexpr int kFewOutputsMax = 16;
constexpr int64_t kFewOutputsMaxIn = 768;  // Wᵀ in at most 48 KB of shared memory
constexpr int kFewOutputsThreads = 128;

// Outputs a thread by default: 8 (fewer instructions a FMA) where that gives every SM a
// block, else 4, twice the blocks for the same rows: with few rows, 8 a thread would
// leave SMs without a block.
inline int default_per_thread(int64_t rows, int device) {
  const int64_t blocks_at_8 = (rows + kFewOutputsThreads / 2 - 1) / (kFewOutputsThreads / 2);
  return blocks_at_8 >= cuda::multiprocessor_count(device) ? 8 : 4;
}

// Wᵀ into shared memory ([in][16], zero past `out`): a thread takes every 128th k and
// its 16 weights, read along W's rows (each load coalesced across the warp) and stored
// as four float4s. Every load of the thread goes out before the first store (the shared
// memory that limits the blocks an SM leaves registers spare): with 16 in flight at a
// time the copy waited on L2 once per 128 k's (bench/RESULTS.md has what it saved).
__device__ __forceinline__ void stage_weight_t(const float* weight, int64_t weight_row_stride,
                                               int64_t out, int64_t in, float* weight_t) {
  constexpr int kRounds = static_cast<int>((kFewOutputsMaxIn + kFewOutputsThreads - 1) / kFewOutputsThreads);
  float column[kRounds][kFewOutputsMax];
#pragma unroll
  for (int r = 0; r < kRounds; ++r) {
    const int64_t k = threadIdx.x + int64_t{r} * kFewOutputsThreads;
#pragma unroll
    for (int j = 0; j < kFewOutputsMax; ++j) {
      column[r][j] = k < in && j < out ? weight[j * weight_row_stride + k] : 0.0f;
    }
  }
#pragma unroll
  for (int r = 0; r < kRounds; ++r) {
    const int64_t k = threadIdx.x + int64_t{r} * kFewOutputsThreads;
    if (k >= in) continue;
    float4* row = reinterpret_cast<float4*>(weight_t + k * kFewOutputsMax);
#pragma unroll
    for (int q = 0; q < kFewOutputsMax / 4; ++q) {
      row[q] = make_float4(column[r][4 * q], column[r][4 * q + 1], column[r][4 * q + 2], column[r][4 * q + 3]);
    }
  }
}

// Four of a thread's chains at one k: sum[i] = fma(x[row, k], w_i, sum[i]) for the four
// weights of w (W[j, k] for four consecutive outputs j).
__device__ __forceinline__ void fma4(float value, float4 w, float* sum) {
  sum[0] = fmaf(value, w.x, sum[0]);
  sum[1] = fmaf(value, w.y, sum[1]);
  sum[2] = fmaf(value, w.z, sum[2]);
  sum[3] = fmaf(value, w.w, sum[3]);
}

// One k of a thread's chains: sum[j] = fma(x[row, k], W[j0 + j, k], sum[j]).
template <int kPerThread>
__device__ __forceinline__ void chain_step(const float* weight_t, int j0, float value, int64_t k,
                                           float (&sum)[kPerThread]) {
  const float4* w = reinterpret_cast<const float4*>(weight_t + k * kFewOutputsMax + j0);
#pragma unroll
  for (int q = 0; q < kPerThread / 4; ++q) fma4(value, w[q], sum + 4 * q);
}

// Wᵀ's rows k .. k + 3, this thread's kPerThread weights of each.
template <int kPerThread>
struct FourRows {
  float4 w[4][kPerThread / 4];
};
template <int kPerThread>
__device__ __forceinline__ FourRows<kPerThread> load_four_rows(const float* weight_t, int j0, int64_t k) {
  FourRows<kPerThread> rows;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float4* row = reinterpret_cast<const float4*>(weight_t + (k + i) * kFewOutputsMax + j0);
#pragma unroll
    for (int q = 0; q < kPerThread / 4; ++q) rows.w[i][q] = row[q];
  }
  return rows;
}
// Four k's of a thread's chains, x[row, k + i] = (&v.x)[i].
template <int kPerThread>
__device__ __forceinline__ void chain_steps4(const FourRows<kPerThread>& rows, float4 v,
                                             float (&sum)[kPerThread]) {
  const float value[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int q = 0; q < kPerThread / 4; ++q) fma4(value[i], rows.w[i][q], sum + 4 * q);
  }
}

// A row's outputs j0 .. j0 + kPerThread - 1 (those below `out`): its chains plus the
// bias, left in sum (for an epilogue) and stored.
template <int kPerThread>
__device__ __forceinline__ void store_row(float (&sum)[kPerThread], const float* bias,
                                          int64_t out, int j0, float* y_row) {
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    if (j0 + j < out) {
      if (bias != nullptr) sum[j] = __fadd_rn(sum[j], bias[j0 + j]);
      y_row[j0 + j] = sum[j];
    }
  }
}

// 16-byte aligned rows and in % 4 == 0: each warp streams its rows' x through a ring of
// kStages tiles in shared memory (cp.async, kTileK columns of every row a tile, loaded
// coalesced: 8 lanes read one row's 128 bytes), kStages - 1 tiles ahead of the FMAs.
// Reading x from each thread's own row instead kept too few bytes in flight: a few
// warps per SM, one row's next 128 bytes each, were a fraction of what hides the
// memory's latency (bench/RESULTS.md). The chains are the same: k ascending, from +0.
constexpr int kTileK = 32;                // columns of x a tile holds
constexpr int kTileStride = kTileK + 4;   // floats a staged row: 16-byte aligned, rows spread over banks
constexpr int kStages = 4;

// What the staged kernel does with each row's outputs once they are stored: nothing in
// nn. A caller that wants more from the same pass (the benchmarks' fused step takes its
// L1 loss here, bench/fused/kernels/) passes its own type with the same members:
//   kSharedBytes   the block's shared memory it needs
//   prepare        every thread, before the block's first barrier
//   finish         every thread, once, after its row's outputs (it may synchronize)
struct NoEpilogue {
  static constexpr size_t kSharedBytes = 0;
  __device__ void prepare(void* /*shared*/, int64_t /*out*/) const {}
  template <int kPerThread>
  __device__ void finish(const float (&/*sum*/)[kPerThread], int64_t /*row*/, bool /*row_inside*/,
                         int /*j0*/, int64_t /*out*/, void* /*shared*/) const {}
};

// The dynamic shared memory past Wᵀ: the warps' rings, then, with x's column maxima,
// the block's maxima [in], then the epilogue's.
template <int kPerThread, bool kMaxima, class Epilogue = NoEpilogue>
constexpr size_t staged_extra_bytes() {
  constexpr int kRowsPerWarp = 32 / (kFewOutputsMax / kPerThread);
  return sizeof(float) * (kFewOutputsThreads / 32) * kStages * kRowsPerWarp * kTileStride +
         (kMaxima ? sizeof(unsigned int) * kFewOutputsMaxIn : 0) + Epilogue::kSharedBytes;
}

// With kMaxima, x_largest[k] also becomes the bits of the largest |x[., k]| (NaNs passed
// over), as column_maxima_cuda finds it (linear_kernels.h): the tiles are in shared
// memory anyway, so the maxima cost no second read of x. Each lane takes one column of
// each tile; the warps meet in the block's maxima, the blocks in x_largest (integer
// maxima of non-negative floats' bits: any order gives the same bits).
// Then each thread hands its row's outputs to `epilogue`.
template <int kPerThread, bool kMaxima, class Epilogue = NoEpilogue>
__global__ void __launch_bounds__(kFewOutputsThreads) few_outputs_forward_staged_kernel(
    ConstRows x, const float* weight, int64_t weight_row_stride, const float* bias, int64_t out,
    float* y, int64_t y_row_stride, unsigned int* x_largest, Epilogue epilogue) {
  static_assert(kFewOutputsMax % kPerThread == 0 && kPerThread % 4 == 0, "whole float4 groups");
  constexpr int kThreadsPerRow = kFewOutputsMax / kPerThread;
  constexpr int kRowsPerWarp = 32 / kThreadsPerRow;
  constexpr int kQuadsPerRow = kTileK / 4;
  constexpr int kTileFloats = kRowsPerWarp * kTileStride;
  cuda::wait_for_prior_grids();  // x, W and the maxima may come from the kernels before
  cuda::allow_dependent_grids();
  extern __shared__ float4 shared_words[];
  float* weight_t = reinterpret_cast<float*>(shared_words);  // [in][16], zero past `out`
  const int64_t in = x.cols, quads = in / 4;
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  float* tiles = weight_t + in * kFewOutputsMax + warp * kStages * kTileFloats;  // this warp's ring
  const int64_t first_row =
      int64_t{blockIdx.x} * (kFewOutputsThreads / kThreadsPerRow) + int64_t{warp} * kRowsPerWarp;
  const int tile_count = static_cast<int>(cuda::ceil_div(quads, int64_t{kQuadsPerRow}));
  // Tile t into ring slot t % kStages: its quads of the warp's rows (zeros past the
  // edges). A lane copies quad `copy_quad` of rows lane / 8 + 4 m of the warp's; their
  // addresses are worked out once, as each tile's copies were most of the loop's
  // instructions that were not FMAs (ncu).
  constexpr int kRowsPerCopy = 32 / kQuadsPerRow;  // rows one copy of the warp's covers
  constexpr int kCopies = kRowsPerWarp / kRowsPerCopy;
  const int copy_quad = lane % kQuadsPerRow, copy_row = lane / kQuadsPerRow;
  const float* copy_source[kCopies];
  bool copy_row_inside[kCopies];
#pragma unroll
  for (int m = 0; m < kCopies; ++m) {
    const int64_t row = first_row + copy_row + m * kRowsPerCopy;
    copy_row_inside[m] = row < x.rows;
    copy_source[m] = copy_row_inside[m] ? x.data + row * x.row_stride + 4 * copy_quad : x.data;
  }
  const unsigned copy_target = cuda::shared_address(tiles + copy_row * kTileStride + 4 * copy_quad);
  auto load_tile = [&](int t) {
    const bool quad_inside = int64_t{t} * kQuadsPerRow + copy_quad < quads;
    const unsigned slot = copy_target + (t % kStages) * kTileFloats * sizeof(float);
#pragma unroll
    for (int m = 0; m < kCopies; ++m) {
      const bool inside = copy_row_inside[m] && quad_inside;
      cuda::copy_async16_or_zero(slot + m * kRowsPerCopy * kTileStride * sizeof(float),
                                 inside ? copy_source[m] + t * kTileK : x.data, inside);
    }
  };
  // The first tiles start on their way before Wᵀ is staged.
#pragma unroll
  for (int t = 0; t < kStages - 1; ++t) {
    if (t < tile_count) load_tile(t);
    cuda::commit_copies();  // (an empty group past the end keeps the count uniform)
  }
  stage_weight_t(weight, weight_row_stride, out, in, weight_t);
  unsigned int* block_largest = reinterpret_cast<unsigned int*>(
      weight_t + in * kFewOutputsMax + (kFewOutputsThreads / 32) * kStages * kTileFloats);
  if (kMaxima) {
    for (int64_t k = threadIdx.x; k < in; k += kFewOutputsThreads) block_largest[k] = 0;
  }
  void* epilogue_shared = block_largest + (kMaxima ? kFewOutputsMaxIn : 0);
  epilogue.prepare(epilogue_shared, out);
  __syncthreads();

  const int r_local = lane / kThreadsPerRow;
  const int j0 = (lane % kThreadsPerRow) * kPerThread;
  float sum[kPerThread] = {};
  for (int t = 0; t < tile_count; ++t) {
    // Tile t + kStages - 1 into the slot of tile t - 1, which every lane has finished.
    if (t + kStages - 1 < tile_count) load_tile(t + kStages - 1);
    cuda::commit_copies();
    cuda::wait_copies<kStages - 1>();  // this lane's part of tile t has landed
    __syncwarp();                      // and every lane's
    const int64_t k0 = int64_t{t} * kTileK;
    if (kMaxima && k0 + lane < in) {  // column k0 + lane over the warp's rows (zeros past x)
      const float* column = tiles + (t % kStages) * kTileFloats + lane;
      float largest = 0.0f;
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) largest = fmaxf(largest, fabsf(column[r * kTileStride]));
      atomicMax(block_largest + k0 + lane, __float_as_uint(largest));
    }
    const float* staged = tiles + (t % kStages) * kTileFloats + r_local * kTileStride;
    if (k0 + kTileK <= in) {
      // Software-pipelined: the next four rows of Wᵀ on their way while this four's
      // FMAs run. Left to itself, the compiler loaded Wᵀ one k ahead of its FMAs and
      // the warps (a few an SM) waited on shared memory's latency (ncu).
      FourRows<kPerThread> next = load_four_rows<kPerThread>(weight_t, j0, k0);
#pragma unroll
      for (int c = 0; c < kTileK; c += 4) {
        const FourRows<kPerThread> now = next;
        if (c + 4 < kTileK) next = load_four_rows<kPerThread>(weight_t, j0, k0 + c + 4);
        chain_steps4<kPerThread>(now, *reinterpret_cast<const float4*>(staged + c), sum);
      }
    } else {
      for (int c = 0; k0 + c < in; c += 4) {
        chain_steps4<kPerThread>(load_four_rows<kPerThread>(weight_t, j0, k0 + c),
                                 *reinterpret_cast<const float4*>(staged + c), sum);
      }
    }
    __syncwarp();  // every lane is done with the slot before a later tile refills it
  }
  const int64_t row = first_row + r_local;
  const bool row_inside = row < x.rows && j0 < out;
  if (row_inside) store_row<kPerThread>(sum, bias, out, j0, y + row * y_row_stride);
  if (kMaxima) {
    __syncthreads();
    for (int64_t k = threadIdx.x; k < in; k += kFewOutputsThreads) {
      if (block_largest[k] != 0) atomicMax(x_largest + k, block_largest[k]);
    }
  }
  epilogue.template finish<kPerThread>(sum, row, row_inside, j0, out, epilogue_shared);
}

// Whether x's rows can stream through the staged kernel's 16-byte copies.
inline bool staged_layout(const ConstRows& x) {
  return x.cols % 4 == 0 && x.row_stride % 4 == 0 && cuda::aligned16(x.data);
}

}  // namespace seqpar::nn::detail
