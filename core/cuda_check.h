// Checks for code that calls the CUDA runtime or launches kernels (.cu files and
// CUDA-only .cpp files). Every runtime call is wrapped in CUDA_CHECK and every
// kernel launch is followed by CUDA_LAUNCH_CHECK(); a failure throws seqpar::Error
// naming the call, file:line, the device and CUDA's own error string.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/error.h"

namespace seqpar::cuda::detail {

inline int current_device_or_minus_one() {
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) return -1;
  return device;
}

[[noreturn]] inline void throw_cuda_error(cudaError_t status, const char* call, const char* file,
                                          int line) {
  ::seqpar::detail::throw_error(
      file, line, nullptr,
      ::seqpar::detail::concat(call, " failed on cuda:", current_device_or_minus_one(), ": ",
                               cudaGetErrorName(status), " (", cudaGetErrorString(status), ")"));
}

}  // namespace seqpar::cuda::detail

#define CUDA_CHECK(call)                                                           \
  do {                                                                             \
    const cudaError_t seqpar_status_ = (call);                                     \
    if (seqpar_status_ != cudaSuccess) {                                           \
      ::seqpar::cuda::detail::throw_cuda_error(seqpar_status_, #call, __FILE__,    \
                                               __LINE__);                          \
    }                                                                              \
  } while (0)

// After every <<<...>>>: a bad configuration shows up here, at the launch that caused it.
#define CUDA_LAUNCH_CHECK() CUDA_CHECK(cudaGetLastError())

namespace seqpar::cuda {

// Blocks needed to cover `count` items with `per_block` items each.
constexpr int64_t ceil_div(int64_t count, int64_t per_block) {
  return (count + per_block - 1) / per_block;
}

// `value` rounded up to a whole number of `multiple`s (a padded extent).
constexpr int64_t round_up(int64_t value, int64_t multiple) {
  return ceil_div(value, multiple) * multiple;
}

}  // namespace seqpar::cuda
