// Which kernel computes Linear's dW sums on a GPU, and why: the one function that
// chooses (choose_weight_grad_kernel), with every threshold of the choice beside it.
// nn/cuda/linear_row_sums.cu launches what it returns. Host code only: every build
// compiles it, so tests/nn/weight_grad_choice_test.cpp checks each regime without a GPU.
//
// Every kernel adds the reference's exact values (nn/reference/linear.h), so the choice
// changes the time, never the bits.
#pragma once

#include <cstdint>

namespace seqpar::nn::detail {

// The kernels that can compute dW's sums (nn/cuda/):
//   Binned                   row_sums_kernel<true> (linear_row_sums.cu): binned sums from
//                            the first reachable bin; exact for any dy, any shape
//   OneMagnitudeFewOutputs   one_magnitude_dw_few_outputs.cu: when every dy is ±f or 0 (an
//                            L1 loss's gradient), integer sums of ±x in fixed point on the
//                            int8 tensor cores, 16 outputs a block
//   OneMagnitudeManyOutputs  one_magnitude_dw_many_outputs.cu: the same sums as int8 GEMMs
//                            (cuBLASLt) of x's byte planes with dy's signs
//   Crt                      exact_dw_crt.cu: exact integer products of fixed-point windows
//                            modulo 13 primes (int8 GEMMs), then the CRT; any dy
enum class WeightGradKernel { None, Binned, OneMagnitudeFewOutputs, OneMagnitudeManyOutputs, Crt };
const char* to_string(WeightGradKernel kernel);

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
bool few_outputs_kernel_fits(const WeightGradShape& shape);

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
WeightGradChoice choose_weight_grad_kernel(const WeightGradShape& shape, bool capturing,
                                           DyStructure dy);

}  // namespace seqpar::nn::detail
