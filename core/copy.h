// The data-movement primitives Tensor is built on, with a CPU path here and a CUDA
// path in copy.cu. Both sides of strided_copy live on the same device.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "seqpar/config.h"

namespace seqpar::detail {

// Writes value into every element of a contiguous block of `count` floats.
void fill(float* data, int64_t count, float value, Device device);

// destination[i] = source[i] for every index of `shape`, each side with its own
// strides (in elements). Up to kMaxCopyDims dimensions.
constexpr int kMaxCopyDims = 6;
void strided_copy(float* destination, const Shape& destination_strides, const float* source,
                  const Shape& source_strides, const Shape& shape, Device device);

#ifdef SEQPAR_WITH_CUDA
void fill_cuda(float* data, int64_t count, float value, int device);
void strided_copy_cuda(float* destination, const Shape& destination_strides, const float* source,
                       const Shape& source_strides, const Shape& shape, int device);
#endif

}  // namespace seqpar::detail
