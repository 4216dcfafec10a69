// The CUDA path of AdamW (optim/cuda/adamw.cu): the launcher that the CUDA row of
// optim/adamw.cpp's table calls, bitwise the reference update of optim/adamw.h.
#pragma once

#include <cstdint>
#include <vector>

#include "optim/adamw.h"

namespace seqpar::optim::detail {

// Tensors of at least this many elements get a grid-stride launch of their own (float4
// accesses where the pointers allow); the smaller ones share multi-tensor launches.
constexpr int64_t kAdamWLargeTensorElements = int64_t{1} << 20;

// One step over every parameter: a multi-tensor launch per table of small tensors and
// one launch per large tensor (optim/cuda/adamw.cu). All tensors contiguous on `device`.
struct AdamWTensors {
  std::vector<float*> params, grads, exp_avgs, exp_avg_sqs;
  std::vector<int64_t> sizes;
};
void adamw_step_cuda(const AdamWTensors& tensors, const AdamWStepScalars& scalars, int device);

}  // namespace seqpar::optim::detail
