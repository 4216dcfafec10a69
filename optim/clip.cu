// CUDA path of optim/clip.h: the total gradient norm and the clipping, with no host
// round trip and no atomics.
//
// The norm, as torch.nn.utils.clip_grad_norm_ forms it (norm of the per-tensor norms),
// in fixed-order stages:
//   1. squares:  one multi-tensor launch; block b sums the squares of its (tensor,
//                chunk) into partials[b]. A tensor's chunks are consecutive blocks.
//   2. norms:    one block per tensor sums that tensor's partials in order:
//                norms[t] = sqrt(Σ partials).
//   3. total:    one block: total = sqrt(Σ_t norms[t]²).
// Block sums are fixed shuffle trees (core/block_reduce.cuh) and every map depends
// only on the sizes, so the same gradients always give the same bits. Sums are kept
// in double and each norm rounded to float once, as the CPU path (optim/clip.cpp)
// does, so the two backends nearly always agree to the bit.
//
// Clipping reads total where it lives: each block computes the coefficient
// min(1, max_norm / (total + 1e-6)) itself and scales its chunk, one launch over all
// gradients. Like PyTorch, gradients are multiplied even when the coefficient is 1,
// and the coefficient is formed as PyTorch forms it: reciprocal(total + 1e-6) * max_norm.
#include <algorithm>
#include <array>
#include <cstdint>

#include "core/block_reduce.cuh"
#include "core/cuda_check.h"
#include "core/cuda_runtime.h"
#include "optim/clip.h"
#include "optim/multi_tensor.cuh"

namespace seqpar::optim::detail {

namespace {

using ReadTable = TensorTable<1, const float*>;
using WriteTable = TensorTable<1, float*>;

__global__ void __launch_bounds__(kMultiTensorThreads)
    sum_of_squares_kernel(ReadTable table, double* partials) {
  const BlockWork work = block_work(table, blockIdx.x);
  const float* grad = table.pointers[0][work.slot];
  double sum = 0.0;
  for (int64_t i = work.begin + threadIdx.x; i < work.end; i += blockDim.x) {
    const double value = grad[i];
    sum += value * value;  // exact in double: a float's square has 48 significant bits
  }
  sum = cuda::block_sum(sum);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

// Which partials belong to which tensor: block b of a launch reduces
// partials[first[b], first[b] + count[b]) into norms[first_norm + b].
struct Segments {
  static constexpr int kMax = 240;
  int64_t first[kMax];
  int64_t count[kMax];
};

constexpr int kNormThreads = 256;

__global__ void tensor_norms_kernel(Segments segments, const double* partials, float* norms) {
  const int64_t first = segments.first[blockIdx.x], count = segments.count[blockIdx.x];
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) sum += partials[first + i];
  sum = cuda::block_sum(sum);
  if (threadIdx.x == 0) norms[blockIdx.x] = __double2float_rn(sqrt(sum));  // a float32 norm
}

constexpr int kTotalThreads = 1024;

__global__ void total_norm_kernel(const float* norms, int64_t count, float* total) {
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) {
    const double norm = norms[i];
    sum += norm * norm;
  }
  sum = cuda::block_sum(sum);
  if (threadIdx.x == 0) *total = __double2float_rn(sqrt(sum));
}

__global__ void __launch_bounds__(kMultiTensorThreads)
    scale_by_clip_coefficient_kernel(WriteTable table, float max_norm, const float* total_norm) {
  // max_norm / (total + 1e-6), as reciprocal then product, clamped to at most 1 (a NaN
  // stays NaN, as with torch.clamp and the CPU path's std::min).
  const float unclamped = __fmul_rn(__frcp_rn(__fadd_rn(*total_norm, 1e-6f)), max_norm);
  const float coefficient = 1.0f < unclamped ? 1.0f : unclamped;
  const BlockWork work = block_work(table, blockIdx.x);
  float* grad = table.pointers[0][work.slot];
  for (int64_t i = work.begin + threadIdx.x; i < work.end; i += blockDim.x) {
    grad[i] = __fmul_rn(grad[i], coefficient);
  }
}

void check_total_norm(const char* op, const Tensor& total_norm, int device) {
  SEQPAR_CHECK(total_norm.defined() && total_norm.numel() == 1 &&
                   total_norm.device() == Device::cuda(device),
               op, ": total_norm must be one element on cuda:", device);
}

}  // namespace

void grad_norm_cuda(const std::vector<const float*>& grads, const std::vector<int64_t>& sizes,
                    const Tensor& total_norm, int device) {
  SEQPAR_CHECK(grads.size() == sizes.size(), "grad_norm_cuda: ", grads.size(), " grads but ",
               sizes.size(), " sizes");
  check_total_norm("grad_norm_cuda", total_norm, device);
  cuda::set_device(device);
  cudaStream_t stream = cuda::current_stream(device);

  // Stage 1's block count, and each tensor's run of blocks, follow from the sizes.
  std::vector<int64_t> first_block, block_count;
  int64_t blocks = 0;
  for (int64_t size : sizes) {
    if (size == 0) continue;  // contributes an exact zero: leave it out
    first_block.push_back(blocks);
    block_count.push_back(cuda::ceil_div(size, kChunkElements));
    blocks += block_count.back();
  }
  const int64_t tensors = static_cast<int64_t>(first_block.size());
  const Tensor partials = cuda::double_scratch(blocks, total_norm.device());
  const Tensor norms = Tensor::empty({std::max<int64_t>(tensors, 1)}, total_norm.device());

  for_each_tensor_table<1>(std::array<std::vector<const float*>, 1>{grads}, sizes,
                           [&](const ReadTable& table, int count, int64_t first) {
                             sum_of_squares_kernel<<<count, kMultiTensorThreads, 0, stream>>>(
                                 table, cuda::doubles(partials) + first);
                             CUDA_LAUNCH_CHECK();
                           });
  for (int64_t start = 0; start < tensors; start += Segments::kMax) {
    const int64_t count = std::min<int64_t>(Segments::kMax, tensors - start);
    Segments segments{};
    for (int64_t s = 0; s < count; ++s) {
      segments.first[s] = first_block[start + s];
      segments.count[s] = block_count[start + s];
    }
    tensor_norms_kernel<<<static_cast<int>(count), kNormThreads, 0, stream>>>(
        segments, cuda::doubles(partials), norms.data() + start);
    CUDA_LAUNCH_CHECK();
  }
  total_norm_kernel<<<1, kTotalThreads, 0, stream>>>(norms.data(), tensors, total_norm.data());
  CUDA_LAUNCH_CHECK();
}

void clip_grads_cuda(const std::vector<float*>& grads, const std::vector<int64_t>& sizes,
                     float max_norm, const Tensor& total_norm, int device) {
  SEQPAR_CHECK(grads.size() == sizes.size(), "clip_grads_cuda: ", grads.size(), " grads but ",
               sizes.size(), " sizes");
  check_total_norm("clip_grads_cuda", total_norm, device);
  cuda::set_device(device);
  cudaStream_t stream = cuda::current_stream(device);
  for_each_tensor_table<1>(std::array<std::vector<float*>, 1>{grads}, sizes,
                           [&](const WriteTable& table, int count, int64_t /*first_block*/) {
                             scale_by_clip_coefficient_kernel<<<count, kMultiTensorThreads, 0,
                                                                stream>>>(table, max_norm,
                                                                          total_norm.data());
                             CUDA_LAUNCH_CHECK();
                           });
}

}  // namespace seqpar::optim::detail
