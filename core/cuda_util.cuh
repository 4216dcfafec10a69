// Small device-side helpers that several layers' kernels share: pointer alignment for
// vectorized (float4) access, the grid size of a grid-stride launch, and a grid-stride
// walk over a matrix's elements.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/cuda_check.h"

namespace seqpar::cuda {

// True when `pointer` can be read or written as float4 (16-byte aligned).
inline bool aligned16(const void* pointer) {
  return reinterpret_cast<uintptr_t>(pointer) % 16 == 0;
}

// Blocks for a grid-stride launch over `count` items with `threads` per block: one
// item per thread, at least 1 block and at most `max_blocks` (the loop covers the rest).
inline int blocks_for(int64_t count, int threads, int64_t max_blocks) {
  return static_cast<int>(std::clamp<int64_t>(ceil_div(count, threads), 1, max_blocks));
}

#ifdef __CUDACC__
// A grid-stride walk over the elements of a [rows, cols] matrix in row-major order,
// with each element's row and column: one 64-bit division at the start, then the
// stride's whole rows and remaining columns added each step (a 64-bit division is
// dozens of instructions, and per element it slowed the L1 loss's passes). cols > 0.
//   for (GridStrideElements e(rows, cols); e.inside(); e.next()) use(e.row, e.col);
struct GridStrideElements {
  int64_t row, col;
  int64_t rows, cols, row_step, col_step;
  __device__ GridStrideElements(int64_t rows_, int64_t cols_) : rows(rows_), cols(cols_) {
    const int64_t first = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
    const int64_t stride = int64_t{gridDim.x} * blockDim.x;
    row = first / cols;
    col = first % cols;
    row_step = stride / cols;
    col_step = stride % cols;
  }
  __device__ bool inside() const { return row < rows; }
  __device__ void next() {
    row += row_step;
    col += col_step;
    if (col >= cols) {
      col -= cols;
      ++row;
    }
  }
};
#endif

}  // namespace seqpar::cuda
