// Skinny Linear on the GPU: the kernels for out_features <= 64 (the seed's Linear
// 640 -> 16), where the general tiled GEMM wastes most of its tile and reads x at a
// tenth of the memory bandwidth. Internal to nn/ and to the fused training step
// (train/): raw device pointers, explicit scratch, the caller's stream, so that a
// step can preallocate everything and be captured into a CUDA graph.
//
//   forward          y = x Wᵀ + b, one pass over x; or, fused with an L1 loss,
//                    no y at all: per-block partial sums of |y - target| and
//                    sign(y - target), the loss gradient up to its scale.
//   weight gradient  dW = dyᵀ x and db = Σ_rows dy in one pass over x: stage 1 sums
//                    each chunk of rows into its own partial, stage 2 adds the
//                    partials in chunk order. No atomics; the chunking depends only
//                    on the shape, so results are bitwise-reproducible on any GPU.
//
// dy is either a matrix or, after the fused forward, scale * sign (formed exactly as
// the L1 backward forms it, so both routes see the same dy bits).
#pragma once

#include <cstdint>

#include "core/cuda_runtime.h"

namespace seqpar::nn::detail {

constexpr int64_t kSkinnyMaxOut = 64;
inline bool is_skinny(int64_t out_features) { return out_features <= kSkinnyMaxOut; }

#ifdef SEQPAR_WITH_CUDA

// An [rows, cols] matrix with unit column stride.
struct RowsView {
  const float* data;
  int64_t row_stride;
};

// ---- forward ----
// The fused L1 variant's outputs: sign [rows, out] contiguous, and one double per
// forward block (skinny_forward_partial_count of them).
struct L1Outputs {
  RowsView target;
  float* sign;
  double* loss_partials;
};
int64_t skinny_forward_partial_count(int64_t rows, int64_t out);

// W [out, in] and b [out] contiguous; y [rows, out] with row stride y_row_stride.
void skinny_forward_cuda(RowsView x, const float* weight, const float* bias, int64_t rows,
                         int64_t in, int64_t out, float* y, int64_t y_row_stride,
                         cuda::Stream stream);
void skinny_forward_l1_cuda(RowsView x, const float* weight, const float* bias, int64_t rows,
                            int64_t in, int64_t out, const L1Outputs& l1, cuda::Stream stream);

// ---- weight and bias gradients ----
struct SkinnyGradScratch {
  int64_t chunks;          // row chunks of stage 1
  int64_t rows_per_chunk;
  int64_t weight_floats;   // chunks * out * in
  int64_t bias_doubles;    // chunks * out
};
SkinnyGradScratch skinny_grad_scratch(int64_t rows, int64_t in, int64_t out);

// Where dy comes from: a matrix, or scale * sign with sign [rows, out] contiguous.
struct GradSource {
  RowsView matrix;     // used when sign == nullptr
  const float* sign;
  float scale;
};

// The loss of the fused forward, finished by stage 2 (optional, for the fused step):
// loss = float(Σ partials * scale), as l1_loss_forward_cuda finishes it.
struct LossFinish {
  const double* partials = nullptr;
  int64_t count = 0;
  float scale = 0.0f;
  float* loss = nullptr;
};

// grad_weight [out, in] and grad_bias [out] contiguous; either may be null.
// weight_partials / bias_partials: skinny_grad_scratch's sizes.
void skinny_weight_grad_cuda(const GradSource& grad, RowsView x, int64_t rows, int64_t in,
                             int64_t out, float* grad_weight, float* grad_bias,
                             float* weight_partials, double* bias_partials,
                             const LossFinish& finish, cuda::Stream stream);

#endif

}  // namespace seqpar::nn::detail
