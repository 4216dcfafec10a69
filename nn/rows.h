// Internal to nn/: a read-only [rows, cols] float matrix with unit column stride and any
// row stride, as the kernels of nn/ (CPU loops and CUDA kernels alike) take a tensor
// that went through detail::with_unit_column_stride: a rank's rows of a batch, or a
// window of columns of a wider tensor (the app's x[:, :16]).
#pragma once

#include <cstdint>

#include "core/host_device.h"
#include "core/tensor.h"

namespace seqpar::nn::detail {

struct ConstRows {
  const float* data;
  int64_t rows, cols, row_stride;
  SEQPAR_HOST_DEVICE float operator()(int64_t row, int64_t col) const {
    return data[row * row_stride + col];
  }
};

// matrix: 2-D, with unit column stride (or one column).
ConstRows const_rows_of(const Tensor& matrix);

}  // namespace seqpar::nn::detail
