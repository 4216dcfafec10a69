// The exact L1 loss of a Linear's output and its backward as far as db, element by
// element, for the fused step's kernels that have y at hand: the L1 kernel
// (exact_step.cu), which reads y back, and the few-outputs forward with this loss as its
// epilogue (forward_exact_l1.cu), which takes y from its own chains. Per element, with
// d = fl32(y - target) and s the loss's scale:
//
//   loss digits += exact Σ s |d|                         (nn/l1_loss.h's terms)
//   dy           = s * sign(d), sign(0) = 0, NaN stays NaN   (its backward, grad 1)
//   db digits   += Σ_rows dy = s * Σ_rows sign(d)          (Linear's db, exact)
//   dy's column maxima and one-magnitude words, as column_maxima_cuda finds them (so
//                  the dW sums need no pass over dy of their own)
//
// db needs no bins: every nonzero dy is ±s, so a column's sum is s times an integer
// count, added into the digits at s's unit: the exact value the binned sum of dy holds.
// A NaN dy flags its column's sum NaN, as a NaN term does. Integer atomics only (in
// shared memory for the block, then into the launch's words), so no order of threads,
// blocks or elements changes a bit.
#pragma once

#include <cmath>
#include <cstdint>

#include "bench/fused/kernels/exact_step.h"
#include "core/exact_bins.cuh"
#include "core/exact_fixed_point.h"
#include "nn/l1_sign.h"
#include "nn/one_magnitude.h"
#include "nn/cuda/one_magnitude_dw.cuh"

namespace seqpar::fused::kernels {

using nn::l1_sign;
using nn::detail::one_magnitude_of;
using nn::detail::OneMagnitude;
using nn::detail::sign_fragment_byte;
using nn::detail::sign_of;

// A block's gatherings per column, in shared memory: the net count of signs, whether a
// NaN was seen, dy's largest magnitude; and dy's largest and complement-of-smallest
// nonzero magnitude bits over the block.
struct ExactL1Tally {
  int signs[kExactL1MaxOut];
  int nan_seen[kExactL1MaxOut];
  unsigned int largest[kExactL1MaxOut];
  unsigned int words[2];

  // Every thread of the block calls it; a barrier must follow before any add.
  __device__ void clear(int64_t out) {
    for (int64_t j = threadIdx.x; j < out; j += blockDim.x) {
      signs[j] = 0;
      nan_seen[j] = 0;
      largest[j] = 0;
    }
    if (threadIdx.x < 2) words[threadIdx.x] = 0;
  }
};

// One thread's share: its loss terms in a binned sum, its dy words; the columns' tallies
// go to the block's ExactL1Tally as the elements come.
class ExactL1Terms {
 public:
  // scale: the loss's factor (finite); the backward's factor is fl32(1 * scale), as nn's
  // L1 backward forms it from d loss / d loss = 1.
  __device__ explicit ExactL1Terms(float scale) : scale_(scale) {
    gradient_ = __double2float_rn(1.0 * scale);
    loss_.clear();
    for (int d = 0; d < exact::kDigits; ++d) local_[d] = 0;
  }

  // Element (row, j) of `out` columns: y and its target; writes dy (and its sign's
  // fragment byte, where o has them).
  __device__ void add(float y, float target, int64_t row, int j, int64_t out, const ExactL1Outputs& o,
                      ExactL1Tally& tally) {
    const float difference = __fsub_rn(y, target);
    // A BinnedSum, not an exact::ScaledAbsSum: a thread has a few terms, and the integer
    // path's flush (two products into the digits) costs more than it saves.
    loss_.add(__dmul_rn(static_cast<double>(scale_), static_cast<double>(fabsf(difference))));
    if (++pending_ == exact::kTermsPerFlush) {
      loss_.flush(local_);
      pending_ = 0;
    }
    const float sign = l1_sign(difference);
    const float dy = __fmul_rn(gradient_, sign);
    o.grad_y[row * out + j] = dy;
    if (o.sign_fragments != nullptr) {
      o.sign_fragments[sign_fragment_byte(row, j)] = static_cast<uint8_t>(sign_of(dy));
    }
    if (sign != 0.0f) {
      if (sign == sign) {
        atomicAdd(&tally.signs[j], sign > 0.0f ? 1 : -1);
      } else {
        atomicOr(&tally.nan_seen[j], 1);
      }
    }
    // The column maxima: fmaxf passes over a NaN; the words see every bit pattern.
    atomicMax(&tally.largest[j], __float_as_uint(fmaxf(0.0f, fabsf(dy))));
    const unsigned int bits = __float_as_uint(dy) & 0x7fffffffu;
    most_ = max(most_, bits);
    if (bits != 0) least_complement_ = max(least_complement_, ~bits);
  }

  // The block's terms and tallies into the launch's digits and words. Every thread of
  // the block calls it, once, after its last add (it synchronizes the block).
  __device__ void finish(ExactL1Tally& tally, int64_t out, const ExactL1Outputs& o) {
    atomicMax(&tally.words[0], most_);
    atomicMax(&tally.words[1], least_complement_);
    loss_.flush(local_);
    exact::add_block_digits(local_, o.loss_digits, 1);  // synchronizes the block first
    // s is finite, so |s| is one magnitude: db is s times the net count of signs, an
    // integer at s's unit.
    const unsigned int bits = __float_as_uint(gradient_) & 0x7fffffffu;
    const OneMagnitude f = one_magnitude_of(bits, bits);
    for (int64_t j = threadIdx.x; j < out; j += blockDim.x) {
      int64_t* sum = o.bias_digits + j;
      const int64_t signs = gradient_ < 0.0f ? -int64_t{tally.signs[j]} : tally.signs[j];
      exact::add_scaled_product_atomically(sum, o.digit_stride, signs,
                                           static_cast<uint32_t>(f.significand), f.exponent);
      if (tally.nan_seen[j] != 0) add_nan(sum, o.digit_stride);
      if (tally.largest[j] != 0) atomicMax(o.grad_y_largest + j, tally.largest[j]);
    }
    if (threadIdx.x < 2 && tally.words[threadIdx.x] != 0) {
      atomicMax(o.grad_y_largest + out + threadIdx.x, tally.words[threadIdx.x]);
    }
  }

 private:
  // A NaN as the flags of a one-term sum, added into one sum's digits.
  __device__ static void add_nan(int64_t* sum, int64_t stride) {
    exact::BinnedSum special;
    special.clear();
    special.add(static_cast<double>(NAN));
    int64_t flags[exact::kDigits] = {};
    special.flush(flags);
    exact::add_digits_atomically(flags, sum, stride);
  }

  float scale_, gradient_;
  exact::BinnedSum loss_;
  int64_t local_[exact::kDigits];
  int64_t pending_ = 0;  // terms in the bins since the last flush
  unsigned int most_ = 0, least_complement_ = 0;
};

// The few-outputs forward's epilogue (nn/cuda/linear_forward_few_outputs.cuh) that takes each
// row's y through the loss, against `target`, into `outputs` (y is [rows, out],
// contiguous); the block's tally in the kernel's shared memory.
struct ExactL1Epilogue {
  ExactL1Target target;
  ExactL1Outputs outputs;

  static constexpr size_t kSharedBytes = sizeof(ExactL1Tally);
  __device__ void prepare(void* shared, int64_t out) const {
    static_cast<ExactL1Tally*>(shared)->clear(out);
  }
  template <int kPerThread>
  __device__ void finish(const float (&sum)[kPerThread], int64_t row, bool row_inside, int j0,
                         int64_t out, void* shared) const {
    ExactL1Tally& tally = *static_cast<ExactL1Tally*>(shared);
    ExactL1Terms terms(target.scale);
    if (row_inside) {
      const float* target_row = target.data + row * target.row_stride;
#pragma unroll
      for (int j = 0; j < kPerThread; ++j) {
        if (j0 + j < out) terms.add(sum[j], target_row[j0 + j], row, j0 + j, out, outputs, tally);
      }
    }
    terms.finish(tally, out, outputs);
  }
};

}  // namespace seqpar::fused::kernels
