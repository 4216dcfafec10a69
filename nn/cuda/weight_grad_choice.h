// Which kernel computes Linear's dW sums on a GPU, and why: the one function that
// chooses (choose_weight_grad_kernel), with every threshold of the choice beside it.
// nn/cuda/linear_row_sums.cu launches what it returns. Host code only: every build
// compiles it, so tests/nn/weight_grad_choice_test.cpp checks each regime without a GPU.
//
// Every kernel adds the reference's exact values (nn/reference/linear.h), so the choice
// changes the time, never the bits.
#pragma once

#include <cstdint>

#include "core/error.h"

namespace seqpar::nn::detail {

// The kernels that can compute dW's sums (nn/cuda/):
//   Binned                   row_sums_kernel<true> (linear_row_sums.cu): binned sums from
//                            the first reachable bin; exact for any dy, any shape
//   OneMagnitudeFewOutputs   one_magnitude_dw_few_outputs.cuh: when every dy is ±f or 0 (an
//                            L1 loss's gradient), integer sums of ±x in fixed point on the
//                            int8 tensor cores, 16 outputs a block
//   OneMagnitudeManyOutputs  one_magnitude_dw_many_outputs.cu: the same sums as int8 GEMMs
//                            (cuBLASLt) of x's byte planes with dy's signs
//   Crt                      exact_dw_crt.cu: exact integer products of fixed-point windows
//                            modulo 13 primes (int8 GEMMs), then the CRT; any dy
enum class WeightGradKernel { None, Binned, OneMagnitudeFewOutputs, OneMagnitudeManyOutputs, Crt };
inline const char* to_string(WeightGradKernel kernel) {
  switch (kernel) {
    case WeightGradKernel::None: return "none";
    case WeightGradKernel::Binned: return "binned";
    case WeightGradKernel::OneMagnitudeFewOutputs: return "one-magnitude, few outputs";
    case WeightGradKernel::OneMagnitudeManyOutputs: return "one-magnitude, many outputs";
    case WeightGradKernel::Crt: return "CRT on int8 products";
  }
  return "?";
}

// x [rows, in] and dy [rows, out], each with its row stride (in elements).
struct WeightGradShape {
  int64_t rows = 0, in = 0, out = 0;
  int64_t x_row_stride = 0, dy_row_stride = 0;
};

// What the host knows of dy's values. It learns whether every dy has one magnitude only
// by reading back the two words that the pass over dy's column maxima leaves on the
// device (a wait for that pass).
enum class DyStructure { Unknown, OneMagnitude, General };

// What to launch:
//   ReadDyStructure           nothing yet: read dy's words back, then choose again with
//                             what they say
//   Run                       `kernel` alone
//   DeviceChooses             `kernel` (a one-magnitude one) and the binned kernel both:
//                             each reads dy's words on the device and returns at once
//                             unless it is the one to work
enum class WeightGradLaunch { ReadDyStructure, Run, DeviceChooses };
struct WeightGradChoice {
  WeightGradLaunch launch;
  WeightGradKernel kernel;  // None for ReadDyStructure
  bool operator==(const WeightGradChoice& other) const {
    return launch == other.launch && kernel == other.kernel;
  }
};

// ---- the thresholds, each with its reason ----
// At least this many outputs: the many-outputs one-magnitude GEMMs; below, the
// 16-output kernel is faster (bench/RESULTS.md, the dw_l1_* rows).
constexpr int64_t kManyOutputsMin = 64;
// At least this many terms (rows x out x in): a general dy's dW on the CRT; below, its
// launches (cuBLASLt's included) cost more than the binned sums themselves.
constexpr int64_t kCrtMinTerms = int64_t{1} << 24;
// The few-outputs one-magnitude kernel's grid and addressing (its block is 64 columns of
// x by 16 outputs over chunks of at most 512 rows, 32 rows a step;
// one_magnitude_dw_few_outputs.cuh checks these against its own constants): CUDA's
// grid limits (65,535 in y and z, 2^31 - 1 in x), and a step's 32 rows of x or dy
// addressed in 32-bit offsets.
struct FewOutputsGrid {
  static constexpr int64_t kRowsPerChunk = 512, kOutputsPerBlock = 16, kColumnsPerBlock = 64;
  static constexpr int64_t kStepRows = 32;
};
namespace weight_grad_choice {
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline WeightGradChoice run(WeightGradKernel kernel) { return {WeightGradLaunch::Run, kernel}; }
// A dy of any values: the CRT where the sums are large enough to pay for its launches.
inline WeightGradChoice general_choice(const WeightGradShape& shape) {
  const bool crt = shape.rows * shape.in * shape.out >= kCrtMinTerms;
  return run(crt ? WeightGradKernel::Crt : WeightGradKernel::Binned);
}
}  // namespace weight_grad_choice

inline bool few_outputs_kernel_fits(const WeightGradShape& shape) {
  using Grid = FewOutputsGrid;
  constexpr int64_t kMaxGridYZ = 65535, kMaxGridX = 0x7fffffff, kMaxOffset = int64_t{1} << 31;
  return weight_grad_choice::ceil_div(shape.rows, Grid::kRowsPerChunk) <= kMaxGridYZ &&
         weight_grad_choice::ceil_div(shape.out, Grid::kOutputsPerBlock) <= kMaxGridYZ &&
         weight_grad_choice::ceil_div(shape.in, Grid::kColumnsPerBlock) <= kMaxGridX &&
         shape.x_row_stride * Grid::kStepRows < kMaxOffset &&
         shape.dy_row_stride * Grid::kStepRows < kMaxOffset;
}

// The choice, by regime (rows, in and out all positive; `capturing`: the launches are
// being captured into a CUDA graph, where the host cannot read the device):
//
//   regime                                   dy known?      launch
//   out >= kManyOutputsMin, eager            not yet        ReadDyStructure: a GEMM path
//                                                           cannot return at once as a
//                                                           kernel can, so the host waits
//                                                           for dy's words (short beside
//                                                           the GEMMs) and runs one path
//                                            one magnitude  Run OneMagnitudeManyOutputs
//                                            general        the general choice (below)
//   out >= kManyOutputsMin, capturing        -              DeviceChooses
//                                                           OneMagnitudeManyOutputs
//   out < kManyOutputsMin, the few-outputs   -              DeviceChooses
//   kernel fits                                             OneMagnitudeFewOutputs
//   out < kManyOutputsMin, it does not fit   -              the general choice
//   general: terms >= kCrtMinTerms                          Run Crt
//            fewer terms                                    Run Binned
//
// With few outputs the device chooses even when the host could know dy's structure (an
// L1 loss's gradient is ±s or 0 by construction): reading the words back would make the
// L1 step wait for the pass over dy, and no kernel ran yet with the host's knowledge in
// its place (it would change what runs on a GPU, which only a GPU run can check).
inline WeightGradChoice choose_weight_grad_kernel(const WeightGradShape& shape, bool capturing,
                                                  DyStructure dy) {
  SEQPAR_CHECK(shape.rows > 0 && shape.in > 0 && shape.out > 0,
               "choose_weight_grad_kernel: dW of ", shape.out, " x ", shape.in, " over ",
               shape.rows, " rows has no sums to choose a kernel for");
  if (shape.out >= kManyOutputsMin) {
    if (capturing) return {WeightGradLaunch::DeviceChooses, WeightGradKernel::OneMagnitudeManyOutputs};
    switch (dy) {
      case DyStructure::Unknown: return {WeightGradLaunch::ReadDyStructure, WeightGradKernel::None};
      case DyStructure::OneMagnitude: return weight_grad_choice::run(WeightGradKernel::OneMagnitudeManyOutputs);
      case DyStructure::General: return weight_grad_choice::general_choice(shape);
    }
  }
  if (few_outputs_kernel_fits(shape)) {
    return {WeightGradLaunch::DeviceChooses, WeightGradKernel::OneMagnitudeFewOutputs};
  }
  return weight_grad_choice::general_choice(shape);
}

}  // namespace seqpar::nn::detail
