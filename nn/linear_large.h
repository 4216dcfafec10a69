// The large-tile fp32 GEMM for big products (nn/linear_large.cu): C = A Bᵀ (+ bias)
// with both operands contiguous along K, as the forward y = x Wᵀ + b reads them.
// Internal to nn/linear.cu, which picks it when the product has enough 128 x 128
// tiles to fill the GPU without splitting K and the operands allow 16-byte loads.
#pragma once

#include <cstdint>

#include "core/cuda_runtime.h"

namespace seqpar::nn::detail {

#ifdef SEQPAR_WITH_CUDA

struct LargeGemm {
  const float* a;  // [m, k], row stride lda
  int64_t lda;
  const float* b;  // [n, k], row stride ldb
  int64_t ldb;
  const float* bias;  // [n] or null
  float* c;           // [m, n], row stride ldc
  int64_t ldc;
  int64_t m, n, k;
};

bool large_gemm_applies(const LargeGemm& gemm);
void large_gemm_cuda(const LargeGemm& gemm, cuda::Stream stream);

#endif

}  // namespace seqpar::nn::detail
