// block_sum: the sum of one value from every thread of a block, in a fixed order (a
// shuffle tree inside each warp, then the warps' sums by a shuffle tree in warp 0), so
// the same inputs always give the same bits. Every thread of the block must call it;
// the result is valid in thread 0. For the two-stage reductions of docs/design.md
// ("Two-stage reductions"): per-block partials, then one block.
//
// The reductions that the CPU path does in double (loss, norms, bias gradient) also
// keep double partials here: the two backends then differ only by the order of
// double additions, which almost never changes the final float.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace seqpar::cuda {

// Device scratch for `count` doubles. Tensor holds floats, so it is carved from twice
// as many; a fresh tensor starts at its allocation, which cudaMallocAsync aligns to
// 256 bytes.
inline Tensor double_scratch(int64_t count, Device device) {
  return Tensor::empty({2 * (count > 0 ? count : 1)}, device);
}
inline double* doubles(const Tensor& scratch) { return reinterpret_cast<double*>(scratch.data()); }

template <typename T>
__device__ __forceinline__ T warp_sum(T value) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    value += __shfl_down_sync(0xffffffffu, value, offset);
  }
  return value;
}

// blockDim.x must be a multiple of 32, at most 1024 (one-dimensional blocks).
template <typename T>
__device__ __forceinline__ T block_sum(T value) {
  __shared__ T warp_sums[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  value = warp_sum(value);
  __syncthreads();  // a previous call's warp_sums may still be being read
  if (lane == 0) warp_sums[warp] = value;
  __syncthreads();
  if (warp == 0) {
    value = lane < static_cast<int>(blockDim.x / 32) ? warp_sums[lane] : T(0);
    value = warp_sum(value);
  }
  return value;
}

}  // namespace seqpar::cuda
