// One grid-wide wait inside a kernel: every block arrives, then every block goes on
// with what all of them wrote. It saves a kernel launch where a step's tail needs one
// value from the whole grid (the exact step's gradient norm, exact_step.cu beside it).
//
// A block that waits for the others holds its SM, so the others must be resident at the
// same time, or the grid hangs. launch_cooperative makes that the driver's promise: the
// launch fails (an error, not a hang) when the grid could not all be resident, and the
// caller sizes the grid with cooperative_capacity.
//
// The launch is not a dependent one (core/dependent_launch.cuh): the grid starts once
// the kernels before it have finished. Launched dependent, with or without the
// cooperative attribute, the exact step's tail made the step slower than launched
// plain (measured; bench/RESULTS.md has the variants).
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "core/cuda_check.h"
#include "core/cuda_runtime.h"  // multiprocessor_count
#include "core/dependent_launch.cuh"  // launch_config

namespace seqpar::cuda {

// Every block of the grid calls this once, with every thread, at the same point; it
// returns in each block after all gridDim blocks have called it, with their writes
// before the call visible (their fences, the acquire here). `arrived` counts the blocks:
// zero before the launch; the caller resets it once every block is past the wait.
__device__ __forceinline__ void arrive_and_wait_grid(unsigned* arrived) {
  __syncthreads();  // the block's writes are issued
  if (threadIdx.x == 0) {
    __threadfence();  // and visible to the grid before the block counts itself
    atomicAdd(arrived, 1u);
    const unsigned blocks = gridDim.x * gridDim.y * gridDim.z;
    unsigned seen = 0;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(arrived) : "memory");
    } while (seen < blocks);
  }
  __syncthreads();
}

// How many blocks of `kernel` (block threads, dynamic shared memory) the device holds at
// once: the most a cooperative launch takes.
template <typename... Params>
int cooperative_capacity(void (*kernel)(Params...), int block_threads, size_t shared_bytes,
                         int device) {
  int per_multiprocessor = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &per_multiprocessor, reinterpret_cast<const void*>(kernel), block_threads, shared_bytes));
  return per_multiprocessor * multiprocessor_count(device);
}

// kernel<<<grid, block, shared_bytes, stream>>>(args...) with every block resident at
// once (checked by the driver).
template <typename... Params, typename... Args>
void launch_cooperative(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                        cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeCooperative;
  attribute.val.cooperative = 1;
  const cudaLaunchConfig_t config = launch_config(grid, block, shared_bytes, stream, &attribute, true);
  CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

}  // namespace seqpar::cuda
