// The L1 loss's gradient direction, sign(input - target), in one place for the CPU
// path (nn/l1_loss.cpp), its CUDA kernel (nn/l1_loss.cu) and the fused step's kernels
// (train/kernels/): sign(0) = 0, as PyTorch (no gradient where input equals target),
// and NaN stays NaN, so a NaN never passes as a zero gradient.
#pragma once

#include "core/host_device.h"

namespace seqpar::nn {

SEQPAR_HOST_DEVICE float l1_sign(float difference) {
  return difference > 0.0f ? 1.0f : difference < 0.0f ? -1.0f : difference;
}

}  // namespace seqpar::nn
