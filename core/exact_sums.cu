// CUDA paths of core/exact_sums.h: elementwise over the sums, with the same arithmetic
// as the CPU loops (core/exact_bins.h is compiled for both), so both give the same bits.
#include <algorithm>

#include "core/cuda_check.h"
#include "core/cuda_util.cuh"
#include "core/cuda_runtime.h"
#include "core/exact_bins.h"
#include "core/exact_sums.h"

namespace seqpar::exact::detail {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65536;  // grid-stride loops cover the rest

__global__ void digits_of_values_kernel(const float* values, int64_t count, int64_t* digits) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    BinnedSum sum;
    sum.clear();
    sum.add(values[i]);
    sum.flush(digits + i, count);
  }
}

__global__ void add_digits_kernel(int64_t* digits, const int64_t* other, int64_t words) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < words;
       i += int64_t{gridDim.x} * blockDim.x) {
    digits[i] = static_cast<int64_t>(static_cast<unsigned long long>(digits[i]) +
                                     static_cast<unsigned long long>(other[i]));
  }
}

__global__ void round_digits_kernel(const int64_t* digits, int64_t stride, int64_t count, float* out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = round_to_float(digits + i, stride);
  }
}

}  // namespace

void digits_of_values_cuda(const float* values, int64_t count, int64_t* digits, int device) {
  cuda::set_device(device);
  const int blocks = cuda::blocks_for(count, kThreads, kMaxBlocks);
  digits_of_values_kernel<<<blocks, kThreads, 0, cuda::current_stream(device)>>>(values, count, digits);
  CUDA_LAUNCH_CHECK();
}

void add_digits_cuda(int64_t* digits, const int64_t* other, int64_t words, int device) {
  cuda::set_device(device);
  const int blocks = cuda::blocks_for(words, kThreads, kMaxBlocks);
  add_digits_kernel<<<blocks, kThreads, 0, cuda::current_stream(device)>>>(digits, other, words);
  CUDA_LAUNCH_CHECK();
}

void round_digits_cuda(const int64_t* digits, int64_t stride, int64_t count, float* out, int device) {
  cuda::set_device(device);
  const int blocks = cuda::blocks_for(count, kThreads, kMaxBlocks);
  round_digits_kernel<<<blocks, kThreads, 0, cuda::current_stream(device)>>>(digits, stride, count, out);
  CUDA_LAUNCH_CHECK();
}

}  // namespace seqpar::exact::detail
