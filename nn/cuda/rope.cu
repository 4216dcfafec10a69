// CUDA path of nn/rope.h: nn/reference/rope.cpp's formula, a thread an element pair.
// Each product is __fmul_rn and the sum or difference __fadd_rn / __fsub_rn, which nvcc
// never contracts into an fma: the reference's roundings, so its bits.
#include <cstdint>

#include "core/cuda_check.h"
#include "core/cuda_runtime.h"
#include "core/cuda_util.cuh"
#include "nn/cuda/attention.h"

namespace seqpar::nn::detail {

namespace {

constexpr int kThreads = 256;

__global__ void rope_kernel(const float* x, const float* cos, const float* sin, int64_t tokens,
                            int64_t rows, int64_t heads, int64_t half, float sign, float* out) {
  const int64_t pairs = tokens * heads * half;
  for (int64_t n = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; n < pairs;
       n += int64_t{gridDim.x} * blockDim.x) {
    const int64_t m = n % half, token_head = n / half, row = token_head / heads % rows;
    const float c = cos[row * half + m], s = __fmul_rn(sign, sin[row * half + m]);
    const float* in = x + token_head * 2 * half;
    float* o = out + token_head * 2 * half;
    const float first = in[m], second = in[m + half];
    o[m] = __fsub_rn(__fmul_rn(first, c), __fmul_rn(second, s));
    o[m + half] = __fadd_rn(__fmul_rn(second, c), __fmul_rn(first, s));
  }
}

}  // namespace

Tensor rope_rotate_cuda(const Tensor& x, const Tensor& cos, const Tensor& sin, bool transposed) {
  const int device = x.device().index;
  cuda::set_device(device);
  Tensor out = Tensor::empty(x.shape(), x.device());
  const int64_t tokens = x.size(0), heads = x.size(1), half = x.size(2) / 2;
  const int64_t pairs = tokens * heads * half;
  if (pairs == 0) return out;
  rope_kernel<<<cuda::blocks_for(pairs, kThreads, 65536), kThreads, 0, cuda::current_stream(device)>>>(
      x.data(), cos.data(), sin.data(), tokens, cos.size(0), heads, half, transposed ? -1.0f : 1.0f,
      out.data());
  CUDA_LAUNCH_CHECK();
  return out;
}

}  // namespace seqpar::nn::detail
