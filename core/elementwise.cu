// CUDA path of core/elementwise.h: out[i] = alpha * a[i] + beta * b[i].
//
// The CPU loop is plain float C++ compiled for x86-64 without -march, so it has no
// FMA: it rounds the two products and then the sum. nvcc would happily contract
// `alpha * a + beta * b` into one fma (one rounding fewer), and the GPU would then
// disagree with the CPU in the last bit. __fmul_rn / __fadd_rn are never contracted,
// so both backends round identically and agree bitwise.
#include "core/cuda_check.h"
#include "core/cuda_runtime.h"
#include "core/cuda_util.cuh"
#include "core/elementwise.h"

#include <algorithm>
#include <cstdint>

namespace seqpar::detail {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65536;  // grid-stride loops cover the rest

__device__ __forceinline__ float axpby_one(float alpha, float a, float beta, float b) {
  return __fadd_rn(__fmul_rn(alpha, a), __fmul_rn(beta, b));
}

// With b == nullptr, out = alpha * a. One branch per launch (uniform), not per element.
__global__ void axpby_kernel(float* out, const float* a, float alpha, const float* b, float beta,
                             int64_t count) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count; i += stride) {
    out[i] = b ? axpby_one(alpha, a[i], beta, b[i]) : __fmul_rn(alpha, a[i]);
  }
}

// Same arithmetic, 16 bytes per access: every pointer is 16-byte aligned, and the
// kernel covers the first count4 * 4 elements (the scalar kernel does the tail).
__global__ void axpby_vector_kernel(float4* out, const float4* a, float alpha, const float4* b,
                                    float beta, int64_t count4) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count4; i += stride) {
    const float4 x = a[i];
    float4 y;
    if (b) {
      const float4 z = b[i];
      y = make_float4(axpby_one(alpha, x.x, beta, z.x), axpby_one(alpha, x.y, beta, z.y),
                      axpby_one(alpha, x.z, beta, z.z), axpby_one(alpha, x.w, beta, z.w));
    } else {
      y = make_float4(__fmul_rn(alpha, x.x), __fmul_rn(alpha, x.y), __fmul_rn(alpha, x.z),
                      __fmul_rn(alpha, x.w));
    }
    out[i] = y;
  }
}

}  // namespace

void axpby_cuda(float* out, const float* a, float alpha, const float* b, float beta,
                int64_t count, int device) {
  if (count == 0) return;
  cuda::set_device(device);
  cudaStream_t stream = cuda::current_stream(device);
  // Views start at any element, so alignment is a property of this call's pointers.
  // out may alias a or b: each element is read and written by the same thread.
  const bool vector = cuda::aligned16(out) && cuda::aligned16(a) && (b == nullptr || cuda::aligned16(b));
  int64_t done = 0;
  if (vector && count >= 4) {
    const int64_t count4 = count / 4;
    axpby_vector_kernel<<<cuda::blocks_for(count4, kThreads, kMaxBlocks), kThreads, 0, stream>>>(
        reinterpret_cast<float4*>(out), reinterpret_cast<const float4*>(a), alpha,
        reinterpret_cast<const float4*>(b), beta, count4);
    CUDA_LAUNCH_CHECK();
    done = count4 * 4;
  }
  if (done < count) {
    axpby_kernel<<<cuda::blocks_for(count - done, kThreads, kMaxBlocks), kThreads, 0, stream>>>(
        out + done, a + done, alpha, b ? b + done : nullptr, beta, count - done);
    CUDA_LAUNCH_CHECK();
  }
}

}  // namespace seqpar::detail
