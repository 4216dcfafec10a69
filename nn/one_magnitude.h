// The arithmetic of Linear's dW when every dy has one magnitude (dy = s * f, s in
// {-1, 0, +1}, one float f: what an L1 loss's backward gives), shared by the CPU loop
// (nn/cpu/linear.cpp) and the CUDA kernels (nn/cuda/one_magnitude_dw_few_outputs.cuh).
//
// Then dW[j, k] = f * Σ_rows s x[row, k], and Σ s x is a sum of integers once x is
// written in fixed point. Per column k, from its largest |x| (2^top <= |x| < 2^(top+1)),
// an element is an integer multiple of 2^lsb, lsb = top + 1 - kWindowBits, below
// 2^kWindowBits in magnitude, when its last significant bit is not below 2^lsb (from
// randn: all but about one element in three hundred thousand). The window never
// reaches below the exact sums' grid (f times any element it holds is a multiple of
// 2^-149), and a column whose products could reach 2^129 has no window at all (its
// elements take the binned sums one by one, as do those outside a window). Inside a
// window every product is a term the exact sum holds exactly, so the integer sums,
// times f, are the exact row sums: the same value, the same bits once rounded.
#pragma once

#include <cstdint>

#include "core/exact_bins.h"
#include "core/exact_fixed_point.h"
#include "core/host_device.h"

namespace seqpar::nn::detail {

constexpr int kWindowBits = 44;
constexpr double kWindowLimit = 0x1p44;

// f = significand * 2^exponent, significand < 2^24; holds: every dy had it.
struct OneMagnitude {
  bool holds;
  int64_t significand;
  int exponent;
};

// From the largest |dy| bits and the smallest nonzero |dy| bits (0xffffffff: none):
// one magnitude when they agree and are finite, or when every dy is ±0.
SEQPAR_HOST_DEVICE OneMagnitude one_magnitude_of(unsigned int largest,
                                                        unsigned int smallest_nonzero) {
  if (largest == 0) return {true, 0, 0};  // every dy is ±0: every window product is 0
  if (largest != smallest_nonzero || largest >= 0x7f800000u) return {false, 0, 0};
  const unsigned int field = largest >> 23, fraction = largest & 0x7fffffu;
  if (field == 0) return {true, fraction, exact::kLowestExponent};  // a subnormal f
  return {true, fraction | 0x800000u, static_cast<int>(field) - 150};
}

// Column k's fixed-point unit 2^lsb, or `whole` when the column has no window (an
// infinity or NaN in it, or products that could reach 2^129).
struct Window {
  int lsb;
  bool whole;
};

SEQPAR_HOST_DEVICE Window column_window(unsigned int largest_bits, int f_exponent) {
  if (largest_bits >= 0x7f800000u) return {0, true};
  int top;  // 2^top <= the column's largest |x| < 2^(top + 1)
  if (largest_bits == 0) {
    top = exact::kLowestExponent;  // all zeros: any window holds them
  } else {
    top = exact::binade_of_magnitude(largest_bits);
  }
  // |f x| < 2^(f_exponent + 24) * 2^(top + 1): within the bins' range, 2^129?
  if (top + f_exponent + 25 > 129) return {0, true};
  const int lowest = exact::kLowestExponent - f_exponent;
  const int lsb = top + 1 - kWindowBits;
  return {lsb > lowest ? lsb : lowest, false};
}

// Where dy[row, j]'s sign (j < 16) sits among the tensor-core A fragments of the
// few-outputs one-magnitude dW (PTX m16n8k32, s8; nn/cuda/one_magnitude_dw_few_outputs.cuh):
// rows in steps of 32, a step 32 lanes x 16 bytes; lane 4 g + t holds outputs g and
// g + 8 of rows 4t..4t+3 (words 0, 1) and 16+4t..16+4t+3 (words 2, 3), a row's sign in
// byte row % 4 of its word.
SEQPAR_HOST_DEVICE int64_t sign_fragment_byte(int64_t row, int j) {
  const int r = static_cast<int>(row % 32);
  return row / 32 * 512 + 16 * (4 * (j % 8) + r % 16 / 4) + 4 * (2 * (r / 16) + j / 8) + r % 4;
}

}  // namespace seqpar::nn::detail
