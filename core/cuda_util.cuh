// Small device-side helpers that several layers' kernels share: pointer alignment for
// vectorized (float4) access, and the grid size of a grid-stride launch.
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

}  // namespace seqpar::cuda
