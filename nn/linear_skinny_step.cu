// The one-pass kernel of an L1 training step with a skinny Linear (nn/linear_skinny.h):
// forward, loss, loss gradient, dW and db from a single read of x.
//
// Design note. The two-launch route reads x twice (forward, then dW) and each of its
// kernels waits on global memory with few loads in flight. Here a block owns one
// chunk of rows (skinny_grad_scratch's chunks, so that the partials are the ones the
// two-launch route writes) and walks it in tiles of rows staged in shared memory by
// cp.async, double-buffered: while tile t is used, tile t+1 is on its way. Per tile:
//   1. forward: warp w takes rows 8w .. 8w+7 in the forward kernel's lane layout
//      (8 lanes per row, two rows per lane; W staged once per block in shared memory:
//      next to ~200 KB of tiles L1 cannot hold it, and from L2 the first version of
//      this kernel took 70 us instead of ~12) and
//      the same butterfly, so y has the forward kernel's bits; each lane then forms
//      |y - t| (double, per thread) and dy = scale * sign(y - t) into shared memory;
//   2. dW: thread q owns columns 4q .. 4q+3 and 16 outputs (64 registers) and adds
//      dy[r] ⊗ x[r] row after row, in row order as the dW kernel does; 16 threads add
//      the dy columns for db (double; dy is ± scale, so those sums are exact).
// At the end the block writes its chunk's dW, db and loss partials; stage 2
// (skinny_sum_partials_cuda) adds them in chunk order. No atomics anywhere.
// One block per SM (W and two tiles take ~200 KB at in = 640): the copies of the next
// tile, not other warps, are what hide memory latency.
#include <algorithm>
#include <cstdint>

#include "core/block_reduce.cuh"
#include "core/cuda_check.h"
#include "nn/linear_skinny.cuh"

namespace seqpar::nn::detail {

namespace {

constexpr int64_t kStepMaxIn = 1024;  // a thread owns one 4-column quad in the dW pass
constexpr int kStepMaxThreads = 256;

struct SkinnyStep {
  RowsView x, target;
  const float* weight;
  const float* bias;
  int64_t rows, in, out, rows_per_chunk, in_padded;
  int tile_rows;
  float scale;
  float* weight_partials;  // [chunks][out][in]
  double* bias_partials;   // [chunks][out]
  double* loss_partials;   // [out groups][chunks]
};

__device__ __forceinline__ void copy_async16(float* shared, const float* global) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(address), "l"(global) : "memory");
}
__device__ __forceinline__ void copy_async4(float* shared, const float* global) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(address), "l"(global) : "memory");
}
__device__ __forceinline__ void commit_copies() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wait_copies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Rows [first, first + count) of x into a tile (row stride in_padded), as one group.
template <bool kVector>
__device__ void stage_tile(const SkinnyStep& p, float* tile, int64_t first, int count) {
  const int width = kVector ? static_cast<int>(p.in / 4) : static_cast<int>(p.in);
  for (int i = threadIdx.x; i < count * width; i += blockDim.x) {
    const int r = i / width, column = i % width;
    const float* source = p.x.data + (first + r) * p.x.row_stride;
    if (kVector) {
      copy_async16(tile + r * p.in_padded + 4 * column, source + 4 * column);
    } else {
      copy_async4(tile + r * p.in_padded + column, source + column);
    }
  }
  commit_copies();
}

// Columns in .. in_padded of every staged row of x are zero for the whole kernel
// (a stale NaN there would leak into y through W's zeros).
__device__ void zero_padding(const SkinnyStep& p, float* tiles) {
  const int pad = static_cast<int>(p.in_padded - p.in);
  for (int i = threadIdx.x; i < 2 * p.tile_rows * pad; i += blockDim.x) {
    tiles[(i / pad) * p.in_padded + p.in + i % pad] = 0.0f;
  }
}

// This block's 16 rows of W into shared memory (zeros past `in` and past `out`):
// every forward item reads all of W, and L1 is too small to keep it next to the tiles.
template <bool kVector>
__device__ void stage_weight(const SkinnyStep& p, float* w_tile, int64_t out0) {
  const int width = static_cast<int>(p.in_padded);
  for (int i = threadIdx.x; i < kOutGroup * width; i += blockDim.x) {
    const int o = i / width, k = i % width;
    const bool inside = out0 + o < p.out && k < p.in;
    const float* source = p.weight + (out0 + o) * p.in + k;
    if (!inside) {
      w_tile[i] = 0.0f;
    } else if (!kVector) {
      copy_async4(w_tile + i, source);
    } else if (k % 4 == 0) {
      copy_async16(w_tile + i, source);
    }
  }
}

// One row's output o: the loss term and dy (zero for outputs past out).
__device__ __forceinline__ float row_gradient(const SkinnyStep& p, int64_t row, int64_t o,
                                              float sum, double& abs_sum) {
  if (o >= p.out) return 0.0f;
  const float value = p.bias != nullptr ? sum + p.bias[o] : sum;
  const float difference = __fsub_rn(value, p.target.data[row * p.target.row_stride + o]);
  abs_sum += fabsf(difference);
  return __fmul_rn(p.scale, sign_of(difference));
}

// Phase 1 on a staged tile: dy[r][0..15] for its `count` rows.
__device__ void forward_tile(const SkinnyStep& p, const float* tile, const float* w_tile,
                             float (*dy)[kOutGroup], int64_t first, int count, int64_t out0,
                             double& abs_sum) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const int column_lane = lane % kLanesPerRow, row_group = lane / kLanesPerRow;
  for (int item = warp; item * kRowsPerWarp < count; item += warps) {  // warp-uniform
    const int row_a = item * kRowsPerWarp + row_group, row_b = row_a + kRowGroups;
    const float* x_a = tile + row_a * p.in_padded;
    const float* x_b = tile + row_b * p.in_padded;
    float sum_a[kOutGroup] = {}, sum_b[kOutGroup] = {};
#pragma unroll 2
    for (int k = 4 * column_lane; k < p.in_padded; k += 32) {
      const float4 xa = *reinterpret_cast<const float4*>(x_a + k);
      const float4 xb = *reinterpret_cast<const float4*>(x_b + k);
#pragma unroll
      for (int o = 0; o < kOutGroup; ++o) {  // rows past `out` are zeros; their sums are dropped
        const float4 w = *reinterpret_cast<const float4*>(w_tile + o * p.in_padded + k);
        fma4(sum_a[o], xa, w);
        fma4(sum_b[o], xb, w);
      }
    }
    reduce_over_row_lanes(sum_a, column_lane);
    reduce_over_row_lanes(sum_b, column_lane);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int column = 2 * column_lane + i;
      if (row_a < count) dy[row_a][column] = row_gradient(p, first + row_a, out0 + column, sum_a[i], abs_sum);
      if (row_b < count) dy[row_b][column] = row_gradient(p, first + row_b, out0 + column, sum_b[i], abs_sum);
    }
  }
}

// Phase 2: sum[o][c] += dy[r][o] * x[r][4q + c] for the tile's rows, in row order.
__device__ __forceinline__ void weight_grad_tile(const float* tile, const float (*dy)[kOutGroup],
                                                 int count, int64_t in_padded, int quad,
                                                 float (&sum)[kOutGroup][4]) {
  for (int r = 0; r < count; ++r) {
    const float4 x = *reinterpret_cast<const float4*>(tile + r * in_padded + 4 * quad);
    const float4* grads = reinterpret_cast<const float4*>(dy[r]);
#pragma unroll
    for (int q = 0; q < kOutGroup / 4; ++q) {
      const float4 g = grads[q];  // the same address for the whole warp: a broadcast
      const float gs[4] = {g.x, g.y, g.z, g.w};
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        sum[4 * q + c][0] = fmaf(gs[c], x.x, sum[4 * q + c][0]);
        sum[4 * q + c][1] = fmaf(gs[c], x.y, sum[4 * q + c][1]);
        sum[4 * q + c][2] = fmaf(gs[c], x.z, sum[4 * q + c][2]);
        sum[4 * q + c][3] = fmaf(gs[c], x.w, sum[4 * q + c][3]);
      }
    }
  }
}

template <bool kVector>
__device__ void write_partials(const SkinnyStep& p, int64_t chunk, int64_t out0, int quad,
                               const float (&sum)[kOutGroup][4], double bias_sum, double abs_sum) {
  const int64_t k = 4 * int64_t{quad};
  float* partial = p.weight_partials + chunk * p.out * p.in;
#pragma unroll
  for (int o = 0; o < kOutGroup; ++o) {
    if (out0 + o >= p.out || k >= p.in) break;
    float* row = partial + (out0 + o) * p.in;
    if (kVector) {
      *reinterpret_cast<float4*>(row + k) = make_float4(sum[o][0], sum[o][1], sum[o][2], sum[o][3]);
    } else {
      for (int c = 0; c < 4 && k + c < p.in; ++c) row[k + c] = sum[o][c];
    }
  }
  if (threadIdx.x < kOutGroup && out0 + threadIdx.x < p.out) {
    p.bias_partials[chunk * p.out + out0 + threadIdx.x] = bias_sum;
  }
  abs_sum = cuda::block_sum(abs_sum);
  if (threadIdx.x == 0) p.loss_partials[int64_t{blockIdx.y} * gridDim.x + chunk] = abs_sum;
}

// grid (chunks, output groups); block: one thread per 4-column quad, whole warps.
template <bool kVector>
__global__ void __launch_bounds__(kStepMaxThreads, 1) skinny_step_kernel(SkinnyStep p) {
  extern __shared__ float4 shared_words[];
  float* tiles = reinterpret_cast<float*>(shared_words);
  const int64_t tile_floats = int64_t{p.tile_rows} * p.in_padded;
  float* w_tile = tiles + 2 * tile_floats;
  auto dy = reinterpret_cast<float(*)[kOutGroup]>(w_tile + kOutGroup * p.in_padded);
  const int64_t chunk = blockIdx.x, out0 = int64_t{blockIdx.y} * kOutGroup;
  const int64_t row_begin = chunk * p.rows_per_chunk;
  const int64_t chunk_rows = std::min(p.rows, row_begin + p.rows_per_chunk) - row_begin;
  const int tile_count = static_cast<int>(cuda::ceil_div(chunk_rows, p.tile_rows));
  const int quad = threadIdx.x;
  const bool owns_quad = 4 * int64_t{quad} < p.in;

  zero_padding(p, tiles);
  stage_weight<kVector>(p, w_tile, out0);  // in tile 0's group of copies
  stage_tile<kVector>(p, tiles, row_begin, static_cast<int>(std::min<int64_t>(p.tile_rows, chunk_rows)));
  double abs_sum = 0.0, bias_sum = 0.0;
  float sum[kOutGroup][4] = {};
  for (int t = 0; t < tile_count; ++t) {
    const int64_t first = row_begin + int64_t{t} * p.tile_rows;
    const int count = static_cast<int>(std::min<int64_t>(p.tile_rows, row_begin + chunk_rows - first));
    const float* tile = tiles + (t % 2) * tile_floats;
    if (t + 1 < tile_count) {  // the other buffer was released by the last barrier below
      const int64_t next = first + p.tile_rows;
      stage_tile<kVector>(p, tiles + ((t + 1) % 2) * tile_floats, next,
                          static_cast<int>(std::min<int64_t>(p.tile_rows, row_begin + chunk_rows - next)));
      wait_copies<1>();
    } else {
      wait_copies<0>();
    }
    __syncthreads();  // tile t (and the zeroed padding) visible to every thread
    forward_tile(p, tile, w_tile, dy, first, count, out0, abs_sum);
    __syncthreads();  // dy of tile t complete
    if (owns_quad) weight_grad_tile(tile, dy, count, p.in_padded, quad, sum);
    if (threadIdx.x < kOutGroup) {
      for (int r = 0; r < count; ++r) bias_sum += dy[r][threadIdx.x];
    }
    __syncthreads();  // tile t and dy free for reuse
  }
  write_partials<kVector>(p, chunk, out0, quad, sum, bias_sum, abs_sum);
}

size_t step_shared_bytes(int tile_rows, int64_t in_padded) {
  return sizeof(float) * ((2 * static_cast<size_t>(tile_rows) + kOutGroup) * in_padded +
                          static_cast<size_t>(tile_rows) * kOutGroup);
}

}  // namespace

SkinnyStepPlan skinny_step_plan(int64_t rows, int64_t in, int64_t out) {
  SkinnyStepPlan plan;
  if (in < 1 || in > kStepMaxIn || !is_skinny(out)) return plan;
  const int64_t quads = cuda::ceil_div(in, 4);
  plan.threads = static_cast<int>(cuda::ceil_div(quads, 32) * 32);
  plan.in_padded = cuda::ceil_div(in, 32) * 32;
  int device = 0, limit = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  // One 8-row forward item per warp per tile; fewer rows where shared memory is short.
  plan.tile_rows = plan.threads / 32 * kRowsPerWarp;
  while (plan.tile_rows > kRowsPerWarp && step_shared_bytes(plan.tile_rows, plan.in_padded) > size_t(limit)) {
    plan.tile_rows -= kRowsPerWarp;
  }
  plan.shared_bytes = step_shared_bytes(plan.tile_rows, plan.in_padded);
  if (plan.shared_bytes > size_t(limit)) return plan;
  const int bytes = static_cast<int>(plan.shared_bytes);
  CUDA_CHECK(cudaFuncSetAttribute(skinny_step_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  CUDA_CHECK(cudaFuncSetAttribute(skinny_step_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  plan.loss_partials = skinny_grad_scratch(rows, in, out).chunks * cuda::ceil_div(out, kOutGroup);
  plan.supported = true;
  return plan;
}

void skinny_step_partials_cuda(const SkinnyStepPlan& plan, RowsView x, RowsView target,
                               const float* weight, const float* bias, int64_t rows,
                               int64_t in, int64_t out, float scale, float* weight_partials,
                               double* bias_partials, double* loss_partials,
                               cuda::Stream stream) {
  SEQPAR_CHECK(plan.supported, "skinny step: no one-pass plan for in_features ", in,
               ", out_features ", out);
  if (rows == 0) return;
  const SkinnyGradScratch scratch = skinny_grad_scratch(rows, in, out);
  const SkinnyStep p{x, target, weight, bias, rows, in, out, scratch.rows_per_chunk,
                     plan.in_padded, plan.tile_rows, scale, weight_partials, bias_partials,
                     loss_partials};
  const dim3 grid(static_cast<unsigned>(scratch.chunks), static_cast<unsigned>(cuda::ceil_div(out, kOutGroup)));
  const bool vector = in % 4 == 0 && x.row_stride % 4 == 0 && aligned16(x.data) &&
                      aligned16(weight) && aligned16(weight_partials);
  if (vector) {
    skinny_step_kernel<true><<<grid, plan.threads, plan.shared_bytes, stream>>>(p);
  } else {
    skinny_step_kernel<false><<<grid, plan.threads, plan.shared_bytes, stream>>>(p);
  }
  CUDA_LAUNCH_CHECK();
}

}  // namespace seqpar::nn::detail
