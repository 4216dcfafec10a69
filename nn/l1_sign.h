// The L1 loss's gradient direction, sign(input - target), in one place for the CPU
// path (nn/l1_loss.cpp), its CUDA kernel (nn/cuda/l1_loss.cu) and the exact L1 terms of the
// benchmarks' fused step (bench/fused/kernels/exact_l1.cuh): sign(0) = 0, as PyTorch
// (no gradient where input equals target), and NaN stays NaN, so a NaN never passes as
// a zero gradient.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/host_device.h"

namespace seqpar::nn {

SEQPAR_HOST_DEVICE float l1_sign(float difference) {
  return difference > 0.0f ? 1.0f : difference < 0.0f ? -1.0f : difference;
}

// The same sign in one byte, for a backward that keeps the forward's signs instead of
// its inputs (nn/l1_loss.h's L1Signs). Bit 7 is the difference's sign bit; the low bits
// say what sign(difference) is: a zero (0), one (1) or NaN (2). A zero keeps its sign
// (a - b is -0 for a = -0, b = +0), since gradient * -0 and gradient * +0 differ in
// their bits. So l1_sign_of(l1_sign_code(d)) is l1_sign(d) bit for bit, save that a NaN
// comes back as the quiet NaN of d's sign, without d's payload.
SEQPAR_HOST_DEVICE uint8_t l1_sign_code(float difference) {
  const uint8_t negative = copysignf(1.0f, difference) < 0.0f ? 0x80 : 0x00;
  return negative | (difference != difference ? 2 : difference != 0.0f ? 1 : 0);
}

SEQPAR_HOST_DEVICE float l1_sign_of(uint8_t code) {
  const int kind = code & 3;
  const float magnitude = kind == 0 ? 0.0f : kind == 1 ? 1.0f : NAN;
  return code & 0x80 ? -magnitude : magnitude;
}

}  // namespace seqpar::nn
