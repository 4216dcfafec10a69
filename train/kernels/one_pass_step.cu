// The one-pass kernel of an L1 training step with a skinny Linear (train/kernels/skinny.h):
// forward, loss, loss gradient, dW and db from a single read of x.
//
// Design note. A block owns one chunk of rows (skinny_grad_scratch's chunks, so that
// its dW and db partials are the bits the two-launch route writes) and walks it in
// tiles of 8 rows held in a ring of shared-memory slots (tile t in slot t % slots).
// Its warps have two jobs, run side by side on different tiles:
//   - "forward" warps (up to 6). Forward warp f takes tiles f, f + F, f + 2F, ...: it
//     waits until the tile's x has landed, computes y for its 8 rows in the forward
//     kernel's lane layout and butterfly (so y has that kernel's bits), |y - t| for
//     the loss and dy = scale * sign(y - t) into the slot's dy buffer, and marks the
//     slot "full".
//   - "weight-gradient" warps, one thread per 4-column quad of x with 16 outputs (64
//     accumulators). They walk the tiles in order: wait for the slot to be full, add
//     dy[r] ⊗ x[r] row after row (the dW kernel's order), sum dy's columns for db
//     (double; dy is ± scale, so those sums are exact), then copy tile t + slots into
//     the slot they just finished (cp.async, each thread its own quad of the 8 rows)
//     and let the slot's "landed" barrier complete when those copies arrive.
// So x is copied by the warps that have time to spare, the forward warps (the
// critical path) only compute, and the two sides meet only at each slot's two
// mbarriers (core/async_copy.cuh): no block-wide barrier inside the loop.
// W (16 x in) is staged once per block: every forward row reads all of it.
// At the end the block writes its chunk's dW, db and loss partials; stage 2
// (skinny_sum_partials_cuda) adds them in chunk order. No atomics anywhere.
//
// Counts at the issue's shape (12000 x 640 -> 16, 128 chunks of 94 rows, one block per
// SM): per SM 1.9 M FMAs, half each side; shared memory serves the forward's 16-byte
// loads a quarter-warp per cycle, which is why a forward lane takes 4 rows (each W
// value it loads feeds 16 FMAs).
#include <algorithm>
#include <cstdint>

#include "core/async_copy.cuh"
#include "core/block_reduce.cuh"
#include "core/cuda_check.h"
#include "core/dependent_launch.cuh"
#include "train/kernels/skinny.cuh"

namespace seqpar::train::kernels {

namespace {

constexpr int64_t kStepMaxIn = 1024;  // a weight-gradient thread owns one 4-column quad
constexpr int kTileRows = kRowsPerWarp;  // one forward item (8 rows) per tile
constexpr int kStepMaxThreads = 384;      // a cap that leaves 170 registers per thread
constexpr int kMaxForwardWarps = 6, kMaxSlots = 12;

struct SkinnyStep {
  RowsView x, target;
  const float* weight;
  const float* bias;
  int64_t rows, in, out, rows_per_chunk, in_padded;
  float scale;
  float* weight_partials;  // [chunks][out][in]
  double* bias_partials;   // [chunks][out]
  double* loss_partials;   // [out groups][chunks]
};

// The block's shared memory: the slots' x tiles, W, the slots' dy and the barriers.
struct StepShared {
  cuda::Barrier* landed;  // [slots]: the tile's x is in the slot
  cuda::Barrier* full;    // [slots]: the forward warp has written the tile's dy
  float* tiles;           // [slots][kTileRows][in_padded]
  float* weight;          // [kOutGroup][in_padded]
  float (*dy)[kTileRows][kOutGroup];  // [slots]

  __device__ float* tile(int slot, int64_t in_padded) const {
    return tiles + int64_t{slot} * kTileRows * in_padded;
  }
};

__host__ __device__ inline size_t barrier_bytes(int slots) { return (2 * slots * sizeof(cuda::Barrier) + 15) / 16 * 16; }

size_t step_shared_bytes(int slots, int64_t in_padded) {
  return barrier_bytes(slots) +
         sizeof(float) * ((static_cast<size_t>(slots) * kTileRows + kOutGroup) * in_padded +
                          static_cast<size_t>(slots) * kTileRows * kOutGroup);
}

__device__ StepShared carve_shared(void* base, int slots, int64_t in_padded) {
  StepShared s;
  char* bytes = static_cast<char*>(base);
  s.landed = reinterpret_cast<cuda::Barrier*>(bytes);
  s.full = s.landed + slots;
  s.tiles = reinterpret_cast<float*>(bytes + barrier_bytes(slots));
  s.weight = s.tiles + int64_t{slots} * kTileRows * in_padded;
  s.dy = reinterpret_cast<float(*)[kTileRows][kOutGroup]>(s.weight + kOutGroup * in_padded);
  return s;
}

// One weight-gradient thread's share of a tile copy: its 4-column quad of each row.
template <bool kVector>
__device__ void copy_quad(const SkinnyStep& p, float* tile, int64_t first, int count, int quad) {
  const int64_t k = 4 * int64_t{quad};
  if (k >= p.in) return;
  const float* source = p.x.data + first * p.x.row_stride + k;
  float* row = tile + k;
  for (int r = 0; r < count; ++r, source += p.x.row_stride, row += p.in_padded) {
    if (kVector) {
      cuda::copy_async16(row, source);
    } else {
      for (int c = 0; c < 4 && k + c < p.in; ++c) cuda::copy_async4(row + c, source + c);
    }
  }
}

// Columns in .. in_padded of every tile row are zero for the whole kernel (cp.async
// never writes there, and a stale NaN would leak into y through W's zeros).
__device__ void zero_padding(const SkinnyStep& p, float* tiles, int slots) {
  const int pad = static_cast<int>(p.in_padded - p.in);
  for (int i = threadIdx.x; i < slots * kTileRows * pad; i += blockDim.x) {
    tiles[(i / pad) * p.in_padded + p.in + i % pad] = 0.0f;
  }
}

// This block's 16 rows of W into shared memory (zeros past `in` and past `out`), one
// 4-column quad per iteration.
template <bool kVector>
__device__ void stage_weight(const SkinnyStep& p, float* w_tile, int64_t out0) {
  // Each block starts at a different place in W: every block reads all of it at
  // once, and staggered starts spread those requests over the L2 slices.
  const int quads = static_cast<int>(p.in_padded / 4), total = kOutGroup * quads;
  const int start = static_cast<int>((blockIdx.x * 613u) % static_cast<unsigned>(total));
  for (int j = threadIdx.x; j < total; j += blockDim.x) {
    const int i = (j + start) % total;
    const int o = i / quads, k = 4 * (i % quads);
    float* staged = w_tile + o * p.in_padded + k;
    const float* source = p.weight + (out0 + o) * p.in + k;
    const bool row_inside = out0 + o < p.out;
    if (kVector && row_inside && k < p.in) {  // in % 4 == 0: the whole quad is inside
      cuda::copy_async16(staged, source);
      continue;
    }
    for (int c = 0; c < 4; ++c) {
      if (row_inside && k + c < p.in) {
        cuda::copy_async4(staged + c, source + c);
      } else {
        staged[c] = 0.0f;
      }
    }
  }
}

// One row's output: the loss term and dy.
__device__ __forceinline__ float row_gradient(const SkinnyStep& p, float sum, float bias,
                                              float target, double& abs_sum) {
  const float value = p.bias != nullptr ? sum + bias : sum;
  const float difference = __fsub_rn(value, target);
  abs_sum += fabsf(difference);
  return __fmul_rn(p.scale, l1_sign(difference));
}

// A forward warp on one staged tile: dy[r][0..15] for its `count` rows, in the forward
// kernel's layout (16 lanes per row, lane c reading columns 4c .. 4c+3 of every 64;
// rows g, g + 2, g + 4, g + 6 per lane) and its butterfly, so y has that kernel's
// bits. Each step loads 4 float4 of x and 16 of W, then runs 256 FMAs: each sum adds
// its 4 products in fma4's order, the 64 sums side by side.
__device__ void forward_tile(const SkinnyStep& p, const float* tile, const float* w_tile,
                             float (*dy)[kOutGroup], int64_t first, int count, int64_t out0,
                             int lane, double& abs_sum) {
  const int column_lane = lane % kLanesPerRow, row_group = lane / kLanesPerRow;
  const int64_t o = out0 + column_lane;  // this lane's output after the butterfly
  // The bias and targets first: their global-memory latency hides behind the FMAs.
  float bias = 0.0f, target[kRowsPerLane] = {};
  if (o < p.out) {
    if (p.bias != nullptr) bias = p.bias[o];
#pragma unroll
    for (int i = 0; i < kRowsPerLane; ++i) {
      const int r = lane_row(row_group, i);
      if (r < count) target[i] = p.target.data[(first + r) * p.target.row_stride + o];
    }
  }
  const float* x = tile + row_group * p.in_padded + 4 * column_lane;
  const float* w_lane = w_tile + 4 * column_lane;
  float sum[kRowsPerLane][kOutGroup] = {};
  for (int k = 0; k < p.in_padded; k += kColumnsPerStep) {
    float4 xs[kRowsPerLane], w[kOutGroup];
#pragma unroll
    for (int i = 0; i < kRowsPerLane; ++i) xs[i] = *reinterpret_cast<const float4*>(x + i * kRowGroups * p.in_padded + k);
#pragma unroll
    for (int j = 0; j < kOutGroup; ++j) w[j] = *reinterpret_cast<const float4*>(w_lane + j * p.in_padded + k);
#pragma unroll
    for (int c = 0; c < 4; ++c) {
#pragma unroll
      for (int j = 0; j < kOutGroup; ++j) {  // rows past `out` are zeros; their sums are dropped
        const float wc = c == 0 ? w[j].x : c == 1 ? w[j].y : c == 2 ? w[j].z : w[j].w;
#pragma unroll
        for (int i = 0; i < kRowsPerLane; ++i) {
          const float xc = c == 0 ? xs[i].x : c == 1 ? xs[i].y : c == 2 ? xs[i].z : xs[i].w;
          sum[i][j] = fmaf(xc, wc, sum[i][j]);
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kRowsPerLane; ++i) {
    reduce_over_row_lanes(sum[i], column_lane);
    const int r = lane_row(row_group, i);
    if (r < count) dy[r][column_lane] = o < p.out ? row_gradient(p, sum[i][0], bias, target[i], abs_sum) : 0.0f;
  }
}

// The tile's rows in order. A full tile goes 4 rows at a time, each group's loads
// issued before its FMAs (the dy reads are broadcasts: one address for the warp).
__device__ __forceinline__ void weight_grad_tile(const float* tile, const float (*dy)[kOutGroup],
                                                 int count, int64_t in_padded, int quad,
                                                 float (&sum)[kOutGroup][4]) {
  const float* column = tile + 4 * quad;
  auto load = [&](int r, float4& x, float4 (&g)[kOutGroup / 4]) {
    x = *reinterpret_cast<const float4*>(column + r * in_padded);
#pragma unroll
    for (int q = 0; q < kOutGroup / 4; ++q) g[q] = reinterpret_cast<const float4*>(dy[r])[q];
  };
  constexpr int kGroup = 4;
  if (count == kTileRows) {
#pragma unroll
    for (int r0 = 0; r0 < kTileRows; r0 += kGroup) {
      float4 x[kGroup], g[kGroup][kOutGroup / 4];
#pragma unroll
      for (int r = 0; r < kGroup; ++r) load(r0 + r, x[r], g[r]);
#pragma unroll
      for (int r = 0; r < kGroup; ++r) weight_grad_row(x[r], g[r], sum);
    }
    return;
  }
  for (int r = 0; r < count; ++r) {
    float4 x, g[kOutGroup / 4];
    load(r, x, g);
    weight_grad_row(x, g, sum);
  }
}

// The tiles of a chunk: tile t lives in slot t % slots, as that slot's (t / slots)-th
// use, so its barriers' phase parity is (t / slots) % 2.
struct ChunkTiles {
  int64_t row_begin, rows;
  int slots;

  __device__ int count() const { return static_cast<int>(cuda::ceil_div(rows, kTileRows)); }
  __device__ int64_t first_row(int t) const { return row_begin + int64_t{t} * kTileRows; }
  __device__ int rows_in(int t) const {
    return static_cast<int>(std::min<int64_t>(kTileRows, rows - int64_t{t} * kTileRows));
  }
  __device__ int slot(int t) const { return t % slots; }
  __device__ unsigned parity(int t) const { return static_cast<unsigned>((t / slots) % 2); }
};

// A forward warp: tiles warp, warp + forward_warps, ... in order.
__device__ void forward_warp(const SkinnyStep& p, const StepShared& s, const ChunkTiles& tiles,
                             int warp, int forward_warps, int64_t out0, double& abs_sum) {
  const int lane = threadIdx.x % 32;
  for (int t = warp; t < tiles.count(); t += forward_warps) {
    const int slot = tiles.slot(t);
    s.landed[slot].wait(tiles.parity(t));
    forward_tile(p, s.tile(slot, p.in_padded), s.weight, s.dy[slot], tiles.first_row(t),
                 tiles.rows_in(t), out0, lane, abs_sum);
    s.full[slot].arrive();
  }
}

// The first tiles into their slots (tiles.slots of them, or all).
template <bool kVector>
__device__ void copy_first_tiles(const SkinnyStep& p, const StepShared& s, const ChunkTiles& tiles,
                                 int quad) {
  for (int t = 0; t < tiles.count() && t < tiles.slots; ++t) {
    copy_quad<kVector>(p, s.tile(t, p.in_padded), tiles.first_row(t), tiles.rows_in(t), quad);
    s.landed[t].arrive_when_copied();
  }
}

// The weight-gradient threads: every tile in order (the dW kernel's row order), each
// slot refilled with tile t + slots as soon as it is done with.
template <bool kVector>
__device__ void weight_grad_warps(const SkinnyStep& p, const StepShared& s,
                                  const ChunkTiles& tiles, int quad, float (&sum)[kOutGroup][4],
                                  double& bias_sum) {
  const bool owns_quad = 4 * int64_t{quad} < p.in;
  const int count = tiles.count();
  for (int t = 0; t < count; ++t) {
    const int slot = tiles.slot(t);
    s.full[slot].wait(tiles.parity(t));
    const int rows = tiles.rows_in(t);
    float* tile = s.tile(slot, p.in_padded);
    if (owns_quad) weight_grad_tile(tile, s.dy[slot], rows, p.in_padded, quad, sum);
    if (quad < kOutGroup) {
      for (int r = 0; r < rows; ++r) bias_sum += s.dy[slot][r][quad];
    }
    const int next = t + tiles.slots;
    if (next < count) {  // this thread's reads of the slot are done: its values are summed
      copy_quad<kVector>(p, tile, tiles.first_row(next), tiles.rows_in(next), quad);
      s.landed[slot].arrive_when_copied();
    }
  }
}

template <bool kVector>
__device__ void write_partials(const SkinnyStep& p, int64_t chunk, int64_t out0, int quad,
                               const float (&sum)[kOutGroup][4], double bias_sum) {
  if (quad < kOutGroup && out0 + quad < p.out) p.bias_partials[chunk * p.out + out0 + quad] = bias_sum;
  // (fewer quads than outputs: the bias threads above still write)
  store_weight_sums<kVector>(p.weight_partials + chunk * p.out * p.in, p.in, p.out, out0,
                             4 * int64_t{quad}, sum);
}

// grid (chunks, output groups); block: forward_warps forward warps, then one
// weight-gradient thread per 4-column quad (whole warps).
template <bool kVector>
__global__ void __launch_bounds__(kStepMaxThreads, 1)
    skinny_step_kernel(SkinnyStep p, int forward_warps, int slots) {
  // Stage 2 (skinny_sum_partials_cuda, a dependent launch) may be scheduled onto the
  // SMs this grid leaves free; it waits for this grid's partials before reading them.
  cuda::allow_dependent_grids();
  extern __shared__ float4 shared_words[];
  const StepShared s = carve_shared(shared_words, slots, p.in_padded);
  const int64_t chunk = blockIdx.x, out0 = int64_t{blockIdx.y} * kOutGroup;
  const int64_t row_begin = chunk * p.rows_per_chunk;
  const ChunkTiles tiles{row_begin, std::min(p.rows, row_begin + p.rows_per_chunk) - row_begin, slots};
  const int forward_threads = 32 * forward_warps;
  const int weight_threads = static_cast<int>(blockDim.x) - forward_threads;
  const bool forward = static_cast<int>(threadIdx.x) < forward_threads;
  const int quad = static_cast<int>(threadIdx.x) - forward_threads;

  if (threadIdx.x == 0) {
    for (int i = 0; i < slots; ++i) {
      s.landed[i].init(static_cast<unsigned>(weight_threads));
      s.full[i].init(32);
    }
  }
  zero_padding(p, s.tiles, slots);
  stage_weight<kVector>(p, s.weight, out0);
  cuda::commit_copies();
  __syncthreads();  // the barriers are initialised
  if (forward) {
    cuda::wait_copies<0>();
  } else {
    copy_first_tiles<kVector>(p, s, tiles, quad);
    cuda::commit_copies();
    cuda::wait_copies<1>();  // this thread's part of W (the tiles may still be in flight)
  }
  __syncthreads();  // W and the zeros visible to every thread

  double abs_sum = 0.0;
  if (forward) {
    forward_warp(p, s, tiles, static_cast<int>(threadIdx.x) / 32, forward_warps, out0, abs_sum);
  } else {
    float sum[kOutGroup][4] = {};
    double bias_sum = 0.0;
    weight_grad_warps<kVector>(p, s, tiles, quad, sum, bias_sum);
    write_partials<kVector>(p, chunk, out0, quad, sum, bias_sum);
  }
  abs_sum = cuda::block_sum(abs_sum);
  if (threadIdx.x == 0) p.loss_partials[int64_t{blockIdx.y} * gridDim.x + chunk] = abs_sum;
}

}  // namespace

SkinnyStepPlan skinny_step_plan(int64_t rows, int64_t in, int64_t out) {
  SkinnyStepPlan plan;
  if (in < 1 || in > kStepMaxIn || !is_skinny(out)) return plan;
  plan.in_padded = cuda::round_up(in, kColumnsPerStep);
  int device = 0, limit = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  cudaFuncAttributes attributes{};
  CUDA_CHECK(cudaFuncGetAttributes(&attributes, skinny_step_kernel<true>));
  const size_t available = size_t(limit) - attributes.sharedSizeBytes;  // block_sum's words
  // As many slots as fit (at most kMaxSlots), and up to 6 forward warps with at least
  // two slots more than forward warps, so that copies run ahead of every forward warp.
  for (plan.slots = kMaxSlots; plan.slots >= 2; --plan.slots) {
    if (step_shared_bytes(plan.slots, plan.in_padded) <= available) break;
  }
  const int weight_warps = static_cast<int>(cuda::ceil_div(cuda::ceil_div(in, 4), 32));
  plan.forward_warps = std::min({kMaxForwardWarps, plan.slots - 2, kStepMaxThreads / 32 - weight_warps});
  if (plan.slots < 3 || plan.forward_warps < 1) return plan;
  plan.threads = 32 * (plan.forward_warps + weight_warps);
  plan.shared_bytes = step_shared_bytes(plan.slots, plan.in_padded);
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
                     plan.in_padded, scale, weight_partials, bias_partials, loss_partials};
  const dim3 grid(static_cast<unsigned>(scratch.chunks), static_cast<unsigned>(cuda::ceil_div(out, kOutGroup)));
  const bool vector = in % 4 == 0 && x.row_stride % 4 == 0 && aligned16(x.data) &&
                      aligned16(weight) && aligned16(weight_partials);
  if (vector) {
    skinny_step_kernel<true><<<grid, plan.threads, plan.shared_bytes, stream>>>(p, plan.forward_warps, plan.slots);
  } else {
    skinny_step_kernel<false><<<grid, plan.threads, plan.shared_bytes, stream>>>(p, plan.forward_warps, plan.slots);
  }
  CUDA_LAUNCH_CHECK();
}

}  // namespace seqpar::train::kernels
