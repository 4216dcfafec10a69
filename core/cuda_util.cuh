// Small helpers that several layers' kernels share: pointer alignment for vectorized
// (float4) access, a kernel's shared-memory limit, the grid size of a grid-stride
// launch, and a grid-stride walk over a matrix's elements.
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
// Lets `kernel` launch with `bytes` of dynamic shared memory, past the default 48 KB
// where it asks for more. Called before every such launch rather than once per device:
// it is not a stream operation, so it is legal while a stream is being captured into a
// graph, and a launch then never depends on what ran before it in the process. Its cost
// is a host call, small beside a launch's.
template <typename... Parameters>
void allow_dynamic_shared_memory(void (*kernel)(Parameters...), size_t bytes) {
  constexpr size_t kDefaultLimit = 48 * 1024;
  if (bytes <= kDefaultLimit) return;
  CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                  cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(bytes)));
}

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
