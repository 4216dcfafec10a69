// Internal to nn/: how the CPU paths see a 2-D tensor through Eigen without copying.
//
// A [n, m] tensor whose columns are adjacent in memory (unit column stride) is a
// row-major Eigen matrix with an outer stride: the row stride, which may be larger
// than m for a window of columns of a wider tensor (the app's x[:, :16]).
#pragma once

#include <algorithm>

#include <Eigen/Dense>

#include "core/tensor.h"

namespace seqpar::nn::detail {

using RowMajorMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstRowsMap = Eigen::Map<const RowMajorMatrix, Eigen::Unaligned, Eigen::OuterStride<>>;
using RowsMap = Eigen::Map<RowMajorMatrix, Eigen::Unaligned, Eigen::OuterStride<>>;

// The tensor itself when its columns are adjacent, else a contiguous copy. (With one
// column, or one row, the corresponding stride is never used.)
inline Tensor with_unit_column_stride(const Tensor& matrix) {
  return (matrix.size(1) <= 1 || matrix.stride(1) == 1) ? matrix : matrix.contiguous();
}

// The row stride Eigen should step by: any value works for a single row, but Eigen
// asserts a positive stride, so fall back to the row length.
inline Eigen::Index row_stride(const Tensor& matrix) {
  return matrix.size(0) <= 1 ? std::max<int64_t>(matrix.size(1), 1) : matrix.stride(0);
}

// Both expect a CPU tensor that went through with_unit_column_stride.
inline ConstRowsMap const_rows(const Tensor& matrix) {
  return ConstRowsMap(matrix.data(), matrix.size(0), matrix.size(1),
                      Eigen::OuterStride<>(row_stride(matrix)));
}
inline RowsMap rows(const Tensor& matrix) {
  return RowsMap(matrix.data(), matrix.size(0), matrix.size(1),
                 Eigen::OuterStride<>(row_stride(matrix)));
}

}  // namespace seqpar::nn::detail
