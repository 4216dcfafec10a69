// CUDA kernels of train/kernels/skinny.h: Linear with out_features <= 64, the weight and
// bias gradients and their chunk sums (the forward: train/kernels/skinny_forward.cu).
//
// Design note. At the issue's shape (x 12000 x 640, W 16 x 640) both products are
// thin: every row of x meets all 16 rows of W. The general GEMM's 64 x 64 tiles are
// three-quarters empty there and it reads x far below the memory bandwidth. These
// kernels read x exactly once per group of 16 outputs. 12000 x 640 x 16 FMAs = 123 M
// per product, which the FMA units finish in about half the time it takes to read x
// from memory once: what limits them is keeping enough of x in flight, not the
// arithmetic (measured: see bench/RESULTS.md).
//
// Weight gradient. A thread owns 4 columns of x and all 16 outputs: 64 accumulators,
// dW[o][k..k+3] += dy[r][o] * x[r][k..k+3] row by row, with dy staged in shared
// memory (one broadcast read per 4 outputs) and x coming through a per-thread cp.async
// ring 32 rows deep: one block per SM holds only 5 warps at the issue's shape, so the
// bytes in flight per thread set the read rate. Blocks own chunks of
// rows (stage 1: one partial dW each); stage 2 adds the partials in chunk order. db
// rides along: column sums of the staged dy in double, as the CPU path sums it.
#include <algorithm>
#include <cstdint>

#include "core/async_copy.cuh"
#include "core/block_reduce.cuh"
#include "core/cuda_check.h"
#include "core/dependent_launch.cuh"
#include "train/kernels/skinny.h"
#include "train/kernels/skinny.cuh"

namespace seqpar::train::kernels {

namespace {

// ------------------------------------------------------------------ weight gradient

constexpr int kGradMaxThreads = 256;
constexpr int kGradRowsStaged = 256;  // rows of dy in shared memory at once (16 KB)
constexpr int kGradRowsPerGroup = 4;  // rows of x per cp.async group
constexpr int kGradStages = 8;        // groups in flight: 32 rows of x per thread
constexpr int kBiasLanes = 8;         // row lanes of the db column sums
constexpr int64_t kGradMaxChunks = 128, kGradMinRowsPerChunk = 32;

struct SkinnyGrad {
  GradSource grad;
  RowsView x;
  int64_t rows, in, out, rows_per_chunk;
  float* weight_partials;   // [chunks][out][in]
  double* bias_partials;    // [chunks][out]
};

template <bool kSign>
__device__ __forceinline__ float grad_value(const GradSource& g, int64_t row, int64_t o,
                                            int64_t out) {
  if (kSign) return __fmul_rn(g.scale, g.sign[row * out + o]);
  return g.matrix.data[row * g.matrix.row_stride + o];
}

// The ring of x rows in shared memory: slot r of thread t at ring[r * blockDim.x + t]
// (a warp's reads and writes of a slot are 512 contiguous bytes). Each thread copies
// and reads only its own 4-column quad, so its own wait_copies is all the ring needs.
size_t grad_ring_bytes(int threads) {
  return size_t{kGradStages} * kGradRowsPerGroup * threads * sizeof(float4);
}

// Rows first_row .. first_row + 3 (those below rows_left; zeros for the others and for
// columns past `in`) into ring stage `stage`, as one copy group (empty if !active).
template <bool kVector>
__device__ __forceinline__ void copy_rows(float4* ring, int stage, const RowsView& x,
                                          int64_t first_row, int64_t rows_left, int64_t k,
                                          int64_t in, bool active) {
#pragma unroll
  for (int u = 0; u < kGradRowsPerGroup && active; ++u) {
    float4* slot = ring + (stage * kGradRowsPerGroup + u) * blockDim.x + threadIdx.x;
    const bool row_inside = u < rows_left;
    const float* row = x.data + (first_row + (row_inside ? u : 0)) * x.row_stride;
    if (kVector) {
      const bool copy = row_inside && k < in;
      cuda::copy_async16_or_zero(slot, row + (copy ? k : 0), copy);
    } else {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const bool copy = row_inside && k + c < in;
        cuda::copy_async4_or_zero(reinterpret_cast<float*>(slot) + c, row + (copy ? k + c : 0), copy);
      }
    }
  }
  cuda::commit_copies();
}

template <bool kVector, bool kSign>
__global__ void __launch_bounds__(kGradMaxThreads) skinny_weight_grad_kernel(SkinnyGrad p) {
  __shared__ __align__(16) float grad_tile[kGradRowsStaged][kOutGroup];
  __shared__ double bias_lane_sums[kBiasLanes][kOutGroup];
  extern __shared__ float4 ring[];
  const int64_t chunk = blockIdx.x;
  const int64_t row_begin = chunk * p.rows_per_chunk;
  const int64_t row_end = std::min(p.rows, row_begin + p.rows_per_chunk);
  const int64_t k = (int64_t{blockIdx.y} * blockDim.x + threadIdx.x) * 4;
  const int64_t out0 = int64_t{blockIdx.z} * kOutGroup;
  // db: threads (lane, column) of the first kBiasLanes * 16 sum every kBiasLanes-th row.
  const int bias_lanes = blockDim.x / kOutGroup < kBiasLanes ? blockDim.x / kOutGroup : kBiasLanes;
  const int bias_lane = threadIdx.x / kOutGroup, bias_column = threadIdx.x % kOutGroup;
  double bias_sum = 0.0;

  float sum[kOutGroup][4] = {};
  // x does not depend on dy: its first rows are on their way before dy is staged, and
  // the ring runs on across stagings, kGradStages - 1 groups of rows ahead of the FMAs.
  const int64_t chunk_rows = row_end - row_begin;
  const int64_t groups = cuda::ceil_div(chunk_rows, kGradRowsPerGroup);
  for (int g = 0; g < kGradStages - 1; ++g) {
    copy_rows<kVector>(ring, g, p.x, row_begin + g * kGradRowsPerGroup,
                       chunk_rows - g * kGradRowsPerGroup, k, p.in, g < groups);
  }
  int64_t group = 0;  // the next group of rows to multiply
  for (int64_t staged = row_begin; staged < row_end; staged += kGradRowsStaged) {
    const int count = static_cast<int>(std::min<int64_t>(kGradRowsStaged, row_end - staged));
    __syncthreads();  // the previous rows' tile is no longer read
    // dy into shared memory, kStageLoads loads in flight per thread before any store.
    constexpr int kStageLoads = 8;
    for (int base = threadIdx.x; base < count * kOutGroup; base += kStageLoads * blockDim.x) {
      float values[kStageLoads];
#pragma unroll
      for (int u = 0; u < kStageLoads; ++u) {
        const int i = base + u * static_cast<int>(blockDim.x), r = i / kOutGroup, o = i % kOutGroup;
        values[u] = (r < count && out0 + o < p.out) ? grad_value<kSign>(p.grad, staged + r, out0 + o, p.out) : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < kStageLoads; ++u) {
        const int i = base + u * static_cast<int>(blockDim.x);
        if (i < count * kOutGroup) grad_tile[i / kOutGroup][i % kOutGroup] = values[u];
      }
    }
    __syncthreads();
    if (bias_lane < bias_lanes) {
      for (int r = bias_lane; r < count; r += bias_lanes) bias_sum += grad_tile[r][bias_column];
    }
    for (int r = 0; r < count; r += kGradRowsPerGroup, ++group) {
      const int64_t ahead = group + kGradStages - 1;  // refills the stage the last group used
      copy_rows<kVector>(ring, static_cast<int>(ahead % kGradStages), p.x,
                         row_begin + ahead * kGradRowsPerGroup,
                         chunk_rows - ahead * kGradRowsPerGroup, k, p.in, ahead < groups);
      cuda::wait_copies<kGradStages - 1>();  // this group's rows have landed
      const float4* rows = ring + (group % kGradStages) * kGradRowsPerGroup * blockDim.x + threadIdx.x;
#pragma unroll
      for (int u = 0; u < kGradRowsPerGroup; ++u) {
        if (r + u >= count) break;  // rows in order, exactly the chunk's
        const float4 x = rows[u * blockDim.x];
        const float4* grads = reinterpret_cast<const float4*>(grad_tile[r + u]);
        float4 g[kOutGroup / 4];  // the same addresses for the whole warp: broadcasts
#pragma unroll
        for (int q = 0; q < kOutGroup / 4; ++q) g[q] = grads[q];
        weight_grad_row(x, g, sum);
      }
    }
  }
  cuda::wait_copies<0>();  // nothing in flight when the block exits

  store_weight_sums<kVector>(p.weight_partials + chunk * p.out * p.in, p.in, p.out, out0, k, sum);
  if (blockIdx.y != 0) return;  // one column block writes db
  if (bias_lane < bias_lanes) bias_lane_sums[bias_lane][bias_column] = bias_sum;
  __syncthreads();
  if (threadIdx.x < kOutGroup && out0 + threadIdx.x < p.out) {
    double total = bias_lane_sums[0][threadIdx.x];
    for (int lane = 1; lane < bias_lanes; ++lane) total += bias_lane_sums[lane][threadIdx.x];
    p.bias_partials[chunk * p.out + out0 + threadIdx.x] = total;
  }
}

// Stage 2. Block b < last: 32 elements of dW, each summed by 16 chunk lanes (lane l
// takes chunks l, l + 16, ...; a warp reads one chunk's 32 adjacent elements), the
// lane sums then added as a pairwise tree: 8 loads per thread instead of a chain of
// 128, so the launch is not latency-bound. The last block: db in double, and the fused
// forward's loss.
constexpr int kSumLanes = 16, kSumElements = 32, kSumThreads = kSumLanes * kSumElements;

__global__ void __launch_bounds__(kSumThreads)
    sum_grad_partials_kernel(const float* weight_partials, const double* bias_partials,
                             int64_t chunks, int64_t out, int64_t in, float* grad_weight,
                             float* grad_bias, LossFinish finish) {
  // Launched as a dependent of the kernel that writes the partials: the next kernel
  // (the optimizer) may be scheduled now; nothing is read before the partials are done.
  cuda::allow_dependent_grids();
  cuda::wait_for_prior_grids();
  if (blockIdx.x == gridDim.x - 1) {
    // db: output o summed by kChunkLanes chunk lanes (lane l: chunks l, l + 8, ...), then
    // the lanes in order; threads past out * kChunkLanes idle. out <= 64 by contract.
    constexpr int kChunkLanes = kSumThreads / kSkinnyMaxOut;
    __shared__ double bias_lanes[kChunkLanes][kSkinnyMaxOut];
    const int o = threadIdx.x % kSkinnyMaxOut, bias_lane = threadIdx.x / kSkinnyMaxOut;
    if (grad_bias != nullptr && o < out) {
      double total = 0.0;
      for (int64_t c = bias_lane; c < chunks; c += kChunkLanes) total += bias_partials[c * out + o];
      bias_lanes[bias_lane][o] = total;
    }
    __syncthreads();
    if (grad_bias != nullptr && bias_lane == 0 && o < out) {
      double total = bias_lanes[0][o];
      for (int l = 1; l < kChunkLanes; ++l) total += bias_lanes[l][o];
      grad_bias[o] = static_cast<float>(total);
    }
    if (finish.partials != nullptr) {
      double total = 0.0;
      for (int64_t i = threadIdx.x; i < finish.count; i += blockDim.x) total += finish.partials[i];
      total = cuda::block_sum(total);
      if (threadIdx.x == 0) *finish.loss = __double2float_rn(total * finish.scale);
    }
    return;
  }
  __shared__ float lane_sums[kSumLanes][kSumElements];
  const int element = threadIdx.x % kSumElements, lane = threadIdx.x / kSumElements;
  const int64_t count = out * in;
  const int64_t i = int64_t{blockIdx.x} * kSumElements + element;
  float total = 0.0f;
  if (i < count) {
#pragma unroll 8
    for (int64_t c = lane; c < chunks; c += kSumLanes) total += weight_partials[c * count + i];
  }
  lane_sums[lane][element] = total;
  __syncthreads();
  if (lane == 0 && i < count) {
    float level[kSumLanes];
#pragma unroll
    for (int l = 0; l < kSumLanes; ++l) level[l] = lane_sums[l][element];
#pragma unroll
    for (int width = kSumLanes / 2; width > 0; width /= 2) {
#pragma unroll
      for (int l = 0; l < width; ++l) level[l] = level[2 * l] + level[2 * l + 1];
    }
    grad_weight[i] = level[0];
  }
}

}  // namespace

SkinnyGradScratch skinny_grad_scratch(int64_t rows, int64_t in, int64_t out) {
  SkinnyGradScratch scratch{};
  scratch.chunks = std::clamp<int64_t>(cuda::ceil_div(rows, kGradMinRowsPerChunk), 1, kGradMaxChunks);
  scratch.rows_per_chunk = std::max<int64_t>(1, cuda::ceil_div(rows, scratch.chunks));
  scratch.chunks = std::max<int64_t>(1, cuda::ceil_div(rows, scratch.rows_per_chunk));
  scratch.weight_floats = scratch.chunks * out * in;
  scratch.bias_doubles = scratch.chunks * out;
  return scratch;
}

void skinny_weight_grad_cuda(const GradSource& grad, RowsView x, int64_t rows, int64_t in,
                             int64_t out, float* grad_weight, float* grad_bias,
                             float* weight_partials, double* bias_partials,
                             const LossFinish& finish, cuda::Stream stream) {
  SEQPAR_CHECK(out >= 1 && out <= kSkinnyMaxOut, "skinny weight gradient: out_features ", out,
               " is not in [1, ", kSkinnyMaxOut, "]");
  const SkinnyGradScratch scratch = skinny_grad_scratch(rows, in, out);
  if (rows > 0) {
    const int64_t quads = std::max<int64_t>(1, cuda::ceil_div(in, 4));
    const int threads = static_cast<int>(std::min<int64_t>(kGradMaxThreads, cuda::round_up(quads, 32)));
    const dim3 grid(static_cast<unsigned>(scratch.chunks),
                    static_cast<unsigned>(cuda::ceil_div(quads, threads)),
                    static_cast<unsigned>(cuda::ceil_div(out, kOutGroup)));
    const SkinnyGrad p{grad, x, rows, in, out, scratch.rows_per_chunk, weight_partials, bias_partials};
    const bool vector = in % 4 == 0 && x.row_stride % 4 == 0 && aligned16(x.data) &&
                        aligned16(weight_partials);
    const size_t ring = grad_ring_bytes(threads);  // 80 KB at the issue's 160 threads
    auto launch = [&](auto kernel) {
      // Above 48 KB of dynamic shared memory a kernel must opt in (legal inside a capture).
      CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(ring)));
      kernel<<<grid, threads, ring, stream>>>(p);
      CUDA_LAUNCH_CHECK();
    };
    if (grad.sign != nullptr) {
      if (vector) launch(skinny_weight_grad_kernel<true, true>);
      else launch(skinny_weight_grad_kernel<false, true>);
    } else {
      if (vector) launch(skinny_weight_grad_kernel<true, false>);
      else launch(skinny_weight_grad_kernel<false, false>);
    }
  }
  skinny_sum_partials_cuda(weight_partials, bias_partials, rows, in, out, grad_weight, grad_bias,
                           finish, stream);
}

void skinny_sum_partials_cuda(const float* weight_partials, const double* bias_partials,
                              int64_t rows, int64_t in, int64_t out, float* grad_weight,
                              float* grad_bias, const LossFinish& finish, cuda::Stream stream) {
  // With no rows the sums are zero: stage 2 over zero chunks writes exact zeros.
  const int64_t chunks = rows > 0 ? skinny_grad_scratch(rows, in, out).chunks : 0;
  const int64_t weight_blocks = grad_weight != nullptr ? cuda::ceil_div(out * in, kSumElements) : 0;
  cuda::launch_dependent(sum_grad_partials_kernel, dim3(static_cast<unsigned>(weight_blocks + 1)),
                         dim3(kSumThreads), 0, stream, weight_partials, bias_partials, chunks, out,
                         in, grad_weight, grad_bias, finish);
}

}  // namespace seqpar::train::kernels
