// The fp32 GEMM problem that the CUDA Linear kernels solve, and the 128 x 128 kernel
// for large products (nn/cuda/gemm_tile128.cu). Internal to nn/cuda/linear.cu, which describes
// the forward and dx as a Gemm and picks this kernel or its own 64 x 64 one.
//
// Both kernels compute each element of C as one fma chain over k = 0, 1, ..., K - 1
// from +0, then + bias: the canonical order of nn/cpu/linear.h. K is never split,
// since partial sums added afterwards would be another order, and other bits.
#pragma once

#include <cstdint>

#include "core/cuda_runtime.h"
#include "seqpar/config.h"

namespace seqpar::nn::detail {

#ifdef SEQPAR_WITH_CUDA

// Element (row, k) of a matrix operand is data[row * row_stride + k * k_stride]. It is
// "along K" when k_stride == 1 (a row's k are contiguous) and "along rows" when
// row_stride == 1 (a k's rows are contiguous, the operand is read down its columns).
struct Operand {
  const float* data;
  int64_t row_stride, k_stride;
};

// c[m * c_row_stride + n] = Σ_k A(m, k) · Bᵀ(n, k) (+ bias[n]), k in increasing order.
struct Gemm {
  int64_t m, n, k;
  Operand a;  // M x K
  Operand b;  // Bᵀ: N x K
  float* c;
  int64_t c_row_stride;
  const float* bias;  // may be null
};

// What the GEMM kernels (this one and nn/cuda/linear.cu's) stage past K and outside the
// matrix: zeros of opposite signs, so each product past K is -0, and an fma with it
// leaves any sum as it is (s + -0 is s for every s; s + +0 turns a -0 sum into +0).
constexpr float kPastKA = -0.0f, kPastKB = 0.0f;

// The 128 x 128 kernel's tile of C, and the depth of its K slices.
constexpr int64_t kGemm128Tile = 128;
constexpr int kGemm128Slice = 32;

// Whether the 128 x 128 kernel can run `gemm` with these layouts: each operand's strides are
// what its layout says (along K: k_stride == 1, else row_stride == 1), and everything
// it reads or writes as float4 is 16-byte aligned (k % 4 for operands along K, their
// row count % 4 for operands along rows, n % 4 for C).
template <bool kAAlongK, bool kBAlongK>
bool gemm128_fits(const Gemm& gemm);

// Runs `gemm` on `stream` (of the current device), on a grid of 128 x 128 tiles of C,
// K whole, in slices of kGemm128Slice k. Eager or captured into a graph alike.
template <bool kAAlongK, bool kBAlongK>
void gemm128_cuda(const Gemm& gemm, cuda::Stream stream);

#endif

}  // namespace seqpar::nn::detail
