// The CUDA path of dropout (nn/cuda/dropout.cu): the launcher that the CUDA rows of
// nn/dropout.cpp's tables call, bitwise the host loops' masks.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "nn/dropout.h"

namespace seqpar::nn::detail {

// CUDA launcher. input: [n, m] with unit column stride, or undefined for
// the keep mask (1 / 0) itself; output: contiguous [n, m] on the same GPU.
void dropout_cuda(const Tensor& input, int64_t rows, int64_t columns, const DropoutLaunch& launch,
                  const Tensor& output);

}  // namespace seqpar::nn::detail
