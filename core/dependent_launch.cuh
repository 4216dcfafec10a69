// Programmatic dependent launch (sm_90+): a chain of kernels in one stream whose
// launches overlap. A kernel launched with launch_dependent() may be scheduled while
// the kernel before it in the stream is still running, once every block of that
// kernel has called allow_dependent_grids() (or exited); it must call
// wait_for_prior_grids() before it touches anything the earlier kernel writes, and
// that call returns once the earlier kernel has finished and its writes are visible.
// Work before the wait (reading inputs the earlier kernel does not write, staging
// constants) then overlaps the earlier kernel's tail and the launch itself.
//
// Inside a CUDA graph capture the dependency becomes a programmatic edge. Without a
// dependent launch (an ordinary <<<...>>>, an older GPU) the wait returns at once and
// the trigger does nothing, so a kernel written for a chain is correct either way.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <utility>

#include "core/cuda_check.h"

namespace seqpar::cuda {

// In the dependent kernel: wait for the kernels before it in the stream, memory
// included. Everything after this call sees their writes.
__device__ __forceinline__ void wait_for_prior_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// In the earlier kernel: this block no longer holds back the next kernel's launch.
// It says nothing about this block's writes: the next kernel still waits for them.
__device__ __forceinline__ void allow_dependent_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Whether the current device takes dependent launches (compute capability 9.0 or
// newer), asked of the driver once per device rather than at every launch: the eager
// path's time is mostly the host's launches.
inline bool dependent_launch_supported() {
  constexpr int kDevices = 64;
  static std::atomic<int> major[kDevices] = {};  // 0: not asked yet
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  if (device < 0 || device >= kDevices) return false;
  int known = major[device].load(std::memory_order_relaxed);
  if (known == 0) {
    CUDA_CHECK(cudaDeviceGetAttribute(&known, cudaDevAttrComputeCapabilityMajor, device));
    major[device].store(known, std::memory_order_relaxed);
  }
  return known >= 9;
}

// A cudaLaunchKernelEx configuration with one attribute (not copied: it must outlive the
// launch), or none when `with_attribute` is false.
inline cudaLaunchConfig_t launch_config(dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
                                        cudaLaunchAttribute* attribute, bool with_attribute) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = attribute;
  config.numAttrs = with_attribute ? 1 : 0;
  return config;
}

// kernel<<<grid, block, shared_bytes, stream>>>(args...) as a dependent launch where
// the device supports it (compute capability 9.0 or newer), an ordinary one otherwise.
template <typename... Params, typename... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                      cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  const cudaLaunchConfig_t config =
      launch_config(grid, block, shared_bytes, stream, &attribute, dependent_launch_supported());
  CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

}  // namespace seqpar::cuda
