// Skinny Linear on the GPU: the kernels for out_features <= 64 (the Linear
// 640 -> 16), where the general tiled GEMM wastes most of its tile and reads x at a
// small fraction of the memory bandwidth. Internal to nn/ and to the fused training step
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

#include <cstddef>
#include <cstdint>

#include "core/cuda_runtime.h"

namespace seqpar::train::kernels {

constexpr int64_t kSkinnyMaxOut = 64;
inline bool is_skinny(int64_t out_features) { return out_features <= kSkinnyMaxOut; }

// The one-pass step kernel's launch shape (skinny_step_plan below; plain data, so the
// fused step can hold one in a CPU-only build too).
struct SkinnyStepPlan {
  bool supported = false;  // in <= 1024 and the tiles fit in shared memory
  int threads = 0;
  int forward_warps = 0;   // warps computing y and dy; the others accumulate dW and db
  int slots = 0;           // tiles of x held in shared memory at once
  int64_t in_padded = 0;   // the staged rows' stride, a multiple of 64
  size_t shared_bytes = 0;
  int64_t loss_partials = 0;
};

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
// Stage 2 alone: the chunk partials (of either stage 1) added in chunk order.
void skinny_sum_partials_cuda(const float* weight_partials, const double* bias_partials,
                              int64_t rows, int64_t in, int64_t out, float* grad_weight,
                              float* grad_bias, const LossFinish& finish, cuda::Stream stream);

// ---- one pass over x for an L1 training step (train/kernels/one_pass_step.cu) ----
// y = x Wᵀ + b, dy = scale * sign(y - target), Σ |y - target|, and the dW and db
// partials of skinny_grad_scratch's chunks, from one read of x (staged in shared
// memory). Every sum runs in the order of the two-launch route (skinny_forward_l1_cuda
// then skinny_weight_grad_cuda), so after skinny_sum_partials_cuda the gradients are
// the same bits. Partials: skinny_grad_scratch's sizes; loss_partials: plan's count.
// Host side, outside any graph capture: reads the device's shared-memory limit and
// raises the kernel's.
SkinnyStepPlan skinny_step_plan(int64_t rows, int64_t in, int64_t out);
void skinny_step_partials_cuda(const SkinnyStepPlan& plan, RowsView x, RowsView target,
                               const float* weight, const float* bias, int64_t rows,
                               int64_t in, int64_t out, float scale, float* weight_partials,
                               double* bias_partials, double* loss_partials,
                               cuda::Stream stream);

#endif

}  // namespace seqpar::train::kernels
