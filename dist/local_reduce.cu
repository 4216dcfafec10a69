// CUDA paths of dist/local_reduce.h (the words' sum is core's add_digits_cuda). The
// float ops are one rounding per element, the same as the CPU loops: fmaxf is exact,
// and __fdiv_rn is the IEEE division whatever flags (-use_fast_math, -prec-div=false)
// the build passes to nvcc.
#include <algorithm>

#include "core/cuda_check.h"
#include "core/cuda_util.cuh"
#include "core/cuda_runtime.h"
#include "dist/local_reduce.h"

namespace seqpar::dist::detail {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65536;  // grid-stride loops cover the rest

__global__ void max_into_kernel(float* accumulator, const float* source, int64_t count) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count; i += stride) {
    accumulator[i] = fmaxf(accumulator[i], source[i]);
  }
}

__global__ void divide_kernel(float* data, int64_t count, float divisor) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count; i += stride) {
    data[i] = __fdiv_rn(data[i], divisor);
  }
}

__global__ void max_words_into_kernel(int64_t* accumulator, const int64_t* source, int64_t count) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count; i += stride) {
    accumulator[i] = max(accumulator[i], source[i]);
  }
}

}  // namespace

void max_words_into_cuda(int64_t* accumulator, const int64_t* source, int64_t count, int device) {
  cuda::set_device(device);
  const int blocks = cuda::blocks_for(count, kThreads, kMaxBlocks);
  max_words_into_kernel<<<blocks, kThreads, 0, cuda::current_stream(device)>>>(accumulator, source,
                                                                              count);
  CUDA_LAUNCH_CHECK();
}

void max_into_cuda(float* accumulator, const float* source, int64_t count, int device) {
  cuda::set_device(device);
  const int blocks = cuda::blocks_for(count, kThreads, kMaxBlocks);
  max_into_kernel<<<blocks, kThreads, 0, cuda::current_stream(device)>>>(accumulator, source, count);
  CUDA_LAUNCH_CHECK();
}

void divide_cuda(float* data, int64_t count, float divisor, int device) {
  cuda::set_device(device);
  const int blocks = cuda::blocks_for(count, kThreads, kMaxBlocks);
  divide_kernel<<<blocks, kThreads, 0, cuda::current_stream(device)>>>(data, count, divisor);
  CUDA_LAUNCH_CHECK();
}

}  // namespace seqpar::dist::detail
