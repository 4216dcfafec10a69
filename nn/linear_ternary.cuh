// Whether every dy of a weight gradient had one magnitude (nn/linear_ternary_sums.cu),
// read on the device by the kernels of both paths, so that exactly one of them works.
#pragma once

#include <cstdint>

namespace seqpar::nn::detail {

// dy = s * f, s in {-1, 0, +1}: f = significand * 2^exponent (significand < 2^24).
struct OneMagnitude {
  bool holds;
  int64_t significand;
  int exponent;
};

// words[0]: the largest |dy| bits; words[1]: the complement of the smallest nonzero
// |dy| bits (0: none). One magnitude: every nonzero |dy| the same finite float, or none.
__device__ inline OneMagnitude one_magnitude(const unsigned int* words) {
  const unsigned int largest = words[0], smallest = ~words[1];
  if (largest == 0) return {true, 0, 0};  // every dy is ±0: every window product is 0
  if (largest != smallest || largest >= 0x7f800000u) return {false, 0, 0};
  const unsigned int field = largest >> 23, fraction = largest & 0x7fffffu;
  if (field == 0) return {true, fraction, -149};  // a subnormal f
  return {true, fraction | 0x800000u, static_cast<int>(field) - 150};
}

}  // namespace seqpar::nn::detail
