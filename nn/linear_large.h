// The fp32 GEMM problem that the CUDA Linear kernels solve, and the large-tile kernel
// for big products (nn/linear_large.cu). Internal to nn/linear.cu, which describes the
// three products of a Linear as a Gemm, picks the kernel (this one or its own 64 x 64
// one) and the K split, and sums split partials in order.
#pragma once

#include <cstdint>

#include "core/cuda_runtime.h"

namespace seqpar::nn::detail {

#ifdef SEQPAR_WITH_CUDA

// Element (row, k) of a matrix operand is data[row * row_stride + k * k_stride]. It is
// "along K" when k_stride == 1 (a row's k are contiguous) and "along rows" when
// row_stride == 1 (a k's rows are contiguous, the operand is read down its columns).
struct Operand {
  const float* data;
  int64_t row_stride, k_stride;
};

// C[m, n] = Σ_k A(m, k) · Bᵀ(n, k) (+ bias[n]), K cut into ranges of k_per_split, one
// per blockIdx.z. One split: c[row * c_row_stride + col] = sum (+ bias[col]). Several:
// partials[split][row][col] = the split's sum, no bias; linear.cu adds them in order.
struct Gemm {
  int64_t m, n, k;
  Operand a;  // M x K
  Operand b;  // Bᵀ: N x K
  int64_t k_per_split;
  float* c;
  int64_t c_row_stride;
  const float* bias;  // may be null
  float* partials;    // [splits, m, n], null for one split
};

// The large kernel's tile of C, and the depth of its K slices (8 or 16) that the
// launchers use, by layout; k_per_split must be a multiple of the slice depth. Each
// depth is the faster one for its layout (measured: see bench/RESULTS.md): 16 when A
// is read along K (the forward, dx), 8 when both operands are read along rows (dW).
constexpr int64_t kLargeTile = 128;
template <bool kAAlongK, bool kBAlongK>
constexpr int kLargeSlice = kAAlongK ? 16 : 8;

// Whether the large kernel can run `gemm` with these layouts: each operand's strides are
// what its layout says (along K: k_stride == 1, else row_stride == 1), and everything
// it reads or writes as float4 is 16-byte aligned (k % 4 for operands along K, their
// row count % 4 for operands along rows, n % 4 for C). Shape only; the split is the
// caller's.
template <bool kAAlongK, bool kBAlongK>
bool large_gemm_fits(const Gemm& gemm);

// Runs `gemm` over grid (m tiles, n tiles, splits) with K slices kSlice deep (8 or 16);
// gemm.k_per_split (a multiple of kSlice) covers K in `splits` ranges and
// gemm.partials holds splits x m x n floats when splits > 1.
template <bool kAAlongK, bool kBAlongK, int kSlice = kLargeSlice<kAAlongK, kBAlongK>>
void large_gemm_cuda(const Gemm& gemm, int64_t splits, cuda::Stream stream);

#endif

}  // namespace seqpar::nn::detail
