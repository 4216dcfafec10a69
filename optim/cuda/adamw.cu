// CUDA path of optim/adamw.h: one fused AdamW kernel, in two launch shapes.
//
// Small tensors share multi-tensor launches (multi_tensor.cuh): one launch covers a
// whole small model. Large tensors (detail::kAdamWLargeTensorElements and up) get a
// launch of their own, because a table holds only 320 chunks of 4096 elements: at
// 100 M parameters the table path takes 77 launches of 1.3 M elements each, every one
// paying a launch and a ragged last wave, with 4-byte accesses. The large-tensor kernel
// instead runs a fixed grid (a few waves of as many blocks as the device holds at once;
// the SM count and occupancy are asked once per device) whose threads stride over the
// whole tensor, four elements at a time through float4 loads and stores: one launch
// per tensor, 16-byte accesses, no tail wave per 1.3 M elements. float4 needs 16-byte
// alignment, so when all four pointers are equally misaligned (a view at an offset)
// the first 1-3 elements are done one by one to reach the boundary; when they are
// misaligned differently, the whole tensor is done one element at a time (still one
// launch). The last 0-3 elements after the float4 body are done one by one too.
//
// The arithmetic (optim/cuda/step_math.cuh) follows torch.optim.AdamW's single-tensor
// path operation by operation, each rounded to float on its own, exactly as
// optim/adamw.cpp writes it: __fmul_rn, __fadd_rn, __fdiv_rn and __fsqrt_rn are never
// fused into an fma (nvcc contracts a * b + c otherwise), and sqrt and division are
// the correctly rounded ones. The fused operations are the ones PyTorch's compiled
// kernels fuse, and the CPU path writes with std::fma: lerp, and addcmul's
// self + (value * t1) * t2 (fmaf here; both correctly rounded). Both kernels call the
// same adamw_update on every element, whichever way it was loaded, so given the same
// float scalars, both backends and both launch shapes compute the same bits.
#include <algorithm>
#include <array>
#include <cstdint>
#include <mutex>
#include <vector>

#include "core/cuda_check.h"
#include "core/cuda_runtime.h"
#include "core/cuda_util.cuh"
#include "optim/adamw.h"
#include "optim/cuda/adamw.h"
#include "optim/cuda/step_math.cuh"
#include "optim/cuda/multi_tensor.cuh"

namespace seqpar::optim::detail {

namespace {

enum List { kParams, kGrads, kExpAvgs, kExpAvgSqs, kListCount };

__global__ void __launch_bounds__(kMultiTensorThreads)
    adamw_kernel(TensorTable<kListCount> table, int64_t chunk, AdamWStepScalars s) {
  const BlockWork work = block_work(table, blockIdx.x, chunk);
  float* params = table.pointers[kParams][work.slot];
  const float* grads = table.pointers[kGrads][work.slot];
  float* exp_avgs = table.pointers[kExpAvgs][work.slot];
  float* exp_avg_sqs = table.pointers[kExpAvgSqs][work.slot];
  for (int64_t i = work.begin + threadIdx.x; i < work.end; i += blockDim.x) {
    adamw_update(params[i], grads[i], exp_avgs[i], exp_avg_sqs[i], s);
  }
}

// ---- Large tensors: one grid-stride launch each ----------------------------------------

constexpr int kLargeThreads = 256;
constexpr int kWavesPerLaunch = 4;  // blocks beyond one wave start as early ones finish

// One large tensor in three parts: elements [0, head) one by one, then `vectors`
// float4s from element head (16-byte aligned in all four tensors), then the rest
// [head + 4 * vectors, size) one by one. head == size, vectors == 0: all one by one.
struct LargeTensor {
  float* param;
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  int64_t size, head, vectors;
};

__global__ void __launch_bounds__(kLargeThreads)
    adamw_large_kernel(LargeTensor t, AdamWStepScalars s) {
  const int64_t first = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  if (t.vectors > 0) {
    float4* params = reinterpret_cast<float4*>(t.param + t.head);
    const float4* grads = reinterpret_cast<const float4*>(t.grad + t.head);
    float4* exp_avgs = reinterpret_cast<float4*>(t.exp_avg + t.head);
    float4* exp_avg_sqs = reinterpret_cast<float4*>(t.exp_avg_sq + t.head);
    for (int64_t i = first; i < t.vectors; i += stride) {
      float4 p = params[i], m = exp_avgs[i], v = exp_avg_sqs[i];
      const float4 g = __ldg(&grads[i]);  // read-only for the whole launch
      adamw_update(p.x, g.x, m.x, v.x, s);
      adamw_update(p.y, g.y, m.y, v.y, s);
      adamw_update(p.z, g.z, m.z, v.z, s);
      adamw_update(p.w, g.w, m.w, v.w, s);
      params[i] = p;
      exp_avgs[i] = m;
      exp_avg_sqs[i] = v;
    }
  }
  for (int64_t i = first; i < t.head; i += stride) {
    adamw_update(t.param[i], t.grad[i], t.exp_avg[i], t.exp_avg_sq[i], s);
  }
  for (int64_t i = t.head + 4 * t.vectors + first; i < t.size; i += stride) {
    adamw_update(t.param[i], t.grad[i], t.exp_avg[i], t.exp_avg_sq[i], s);
  }
}

// Floats from `pointer` up to the next 16-byte boundary (0-3); -1 when the pointer is
// not even float-aligned.
int floats_to_16_bytes(const void* pointer) {
  const auto address = reinterpret_cast<std::uintptr_t>(pointer);
  if (address % sizeof(float) != 0) return -1;
  return static_cast<int>((16 - address % 16) % 16 / sizeof(float));
}

LargeTensor split_for_float4(float* param, const float* grad, float* exp_avg,
                             float* exp_avg_sq, int64_t size) {
  LargeTensor t{param, grad, exp_avg, exp_avg_sq, size, /*head=*/size, /*vectors=*/0};
  const int head = floats_to_16_bytes(param);
  if (head >= 0 && floats_to_16_bytes(grad) == head && floats_to_16_bytes(exp_avg) == head &&
      floats_to_16_bytes(exp_avg_sq) == head) {
    t.head = std::min<int64_t>(head, size);
    t.vectors = (size - t.head) / 4;
  }
  return t;
}

// The most blocks a large-tensor launch uses on `device` (the current device):
// kWavesPerLaunch times the blocks all its SMs hold at once. Asked once per device.
int large_launch_blocks(int device) {
  struct Cached {
    std::once_flag once;
    int blocks = 0;
  };
  static std::vector<Cached> cache(static_cast<size_t>(cuda::device_count()));
  Cached& cached = cache[static_cast<size_t>(device)];
  std::call_once(cached.once, [&] {
    const int sms = cuda::multiprocessor_count(device);
    int blocks_per_sm = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, adamw_large_kernel,
                                                             kLargeThreads, 0));
    cached.blocks = kWavesPerLaunch * std::max(sms, 1) * std::max(blocks_per_sm, 1);
  });
  return cached.blocks;
}

void launch_large(const LargeTensor& t, const AdamWStepScalars& scalars, int max_blocks,
                  cudaStream_t stream) {
  const int64_t tail = t.size - t.head - 4 * t.vectors;
  const int64_t items = std::max({t.vectors, t.head, tail});  // per thread-slot of the grid
  const int64_t blocks = cuda::blocks_for(items, kLargeThreads, max_blocks);
  adamw_large_kernel<<<static_cast<unsigned>(blocks), kLargeThreads, 0, stream>>>(t, scalars);
  CUDA_LAUNCH_CHECK();
}

}  // namespace

void adamw_step_cuda(const AdamWTensors& tensors, const AdamWStepScalars& scalars, int device) {
  const size_t count = tensors.sizes.size();
  SEQPAR_CHECK(tensors.params.size() == count && tensors.grads.size() == count &&
                   tensors.exp_avgs.size() == count && tensors.exp_avg_sqs.size() == count,
               "adamw_step_cuda: ", count, " sizes but ", tensors.params.size(), " params, ",
               tensors.grads.size(), " grads, ", tensors.exp_avgs.size(), " exp_avgs and ",
               tensors.exp_avg_sqs.size(), " exp_avg_sqs");
  cuda::set_device(device);
  cudaStream_t stream = cuda::current_stream(device);

  // Large tensors: one launch each. The rest go into the multi-tensor tables below.
  std::array<std::vector<float*>, kListCount> small_lists;
  std::vector<int64_t> small_sizes;
  int64_t small_elements = 0;
  for (size_t t = 0; t < count; ++t) {
    if (tensors.sizes[t] >= kAdamWLargeTensorElements) {
      launch_large(split_for_float4(tensors.params[t], tensors.grads[t], tensors.exp_avgs[t],
                                    tensors.exp_avg_sqs[t], tensors.sizes[t]),
                   scalars, large_launch_blocks(device), stream);
      continue;
    }
    small_lists[kParams].push_back(tensors.params[t]);
    small_lists[kGrads].push_back(tensors.grads[t]);
    small_lists[kExpAvgs].push_back(tensors.exp_avgs[t]);
    small_lists[kExpAvgSqs].push_back(tensors.exp_avg_sqs[t]);
    small_sizes.push_back(tensors.sizes[t]);
    small_elements += tensors.sizes[t];
  }
  const int64_t chunk = chunk_elements_for(small_elements, cuda::multiprocessor_count(device));
  for_each_tensor_table<kListCount>(
      small_lists, small_sizes,
      [&](const TensorTable<kListCount>& table, int blocks, int64_t /*first_block*/) {
        adamw_kernel<<<blocks, kMultiTensorThreads, 0, stream>>>(table, chunk, scalars);
        CUDA_LAUNCH_CHECK();
      },
      chunk);
}

}  // namespace seqpar::optim::detail
