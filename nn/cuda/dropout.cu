// CUDA path of nn/dropout.h.
//
// Each thread takes whole Philox blocks of the range [start, start + rows * columns):
// it computes a block's four words once (philox::stream_block, the host's integer
// arithmetic) and writes the elements those words decide. The keep decision is the
// integer comparison word <= threshold, with the threshold the host computed; a kept
// value is __fmul_rn(x, scale), one rounding, never contracted. So the mask and the
// values are the CPU's bit for bit, whatever the grid.
#include <algorithm>
#include <cstdint>

#include "core/cuda_check.h"
#include "core/cuda_runtime.h"
#include "core/cuda_util.cuh"
#include "core/philox.h"
#include "nn/cuda/dropout.h"
#include "nn/dropout.h"
#include "nn/rows.h"

namespace seqpar::nn::detail {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65536;  // grid-stride loops cover the rest

// With input.data == nullptr, writes the keep mask (1 / 0) instead of the values; the
// branch is uniform over the launch.
__global__ void dropout_kernel(ConstRows input, uint64_t columns, uint64_t seed, uint64_t start,
                               uint64_t count, uint32_t threshold, float scale, float* output) {
  const uint64_t first_block = start / 4, blocks = (start + count - 1) / 4 - first_block + 1;
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  for (uint64_t b = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; b < blocks; b += stride) {
    const uint64_t block = first_block + b;
    const philox::Block words = philox::stream_block(seed, block);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint64_t position = block * 4 + j;
      if (position < start || position - start >= count) continue;
      const uint64_t element = position - start;
      const bool kept = words[j] <= threshold;
      float value;
      if (input.data == nullptr) {
        value = kept ? 1.0f : 0.0f;
      } else {
        const auto row = static_cast<int64_t>(element / columns);
        const auto column = static_cast<int64_t>(element % columns);
        value = kept ? __fmul_rn(input(row, column), scale) : 0.0f;
      }
      output[element] = value;
    }
  }
}

}  // namespace

void dropout_cuda(const Tensor& input, int64_t rows, int64_t columns, const DropoutLaunch& launch,
                  const Tensor& output) {
  SEQPAR_CHECK(output.defined() && output.device().is_cuda() && output.is_contiguous() &&
                   output.shape() == Shape({rows, columns}),
               "dropout_cuda: output must be a contiguous [", rows, ", ", columns,
               "] on a GPU, got ", output.shape(), " on ", output.device());
  if (input.defined()) {
    SEQPAR_CHECK(input.device() == output.device() && input.dim() == 2 &&
                     input.size(0) == rows && input.size(1) == columns &&
                     (columns <= 1 || input.stride(1) == 1),
                 "dropout_cuda: input ", input.shape(), " on ", input.device(),
                 " must be [", rows, ", ", columns, "] with unit column stride on ",
                 output.device());
  }
  const uint64_t count = static_cast<uint64_t>(rows) * static_cast<uint64_t>(columns);
  if (count == 0) return;
  const int device = output.device().index;
  const ConstRows values = input.defined() ? const_rows_of(input) : ConstRows{nullptr, rows, columns, columns};
  const uint64_t blocks = (launch.start + count - 1) / 4 - launch.start / 4 + 1;
  cuda::set_device(device);
  dropout_kernel<<<cuda::blocks_for(static_cast<int64_t>(blocks), kThreads, kMaxBlocks), kThreads,
                   0, cuda::current_stream(device)>>>(values, static_cast<uint64_t>(columns),
                                                      launch.seed, launch.start, count,
                                                      launch.threshold, launch.scale,
                                                      output.data());
  CUDA_LAUNCH_CHECK();
}

}  // namespace seqpar::nn::detail
