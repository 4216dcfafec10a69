// The arithmetic behind LocalProcessGroup's reductions, on whole tensors of one
// device. CPU loops live in local_reduce.cpp, CUDA kernels in local_reduce.cu; a
// GPU reduction is enqueued on the device's one stream (core/cuda_runtime.h) and
// never visits the host.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "dist/process_group.h"
#include "seqpar/config.h"

namespace seqpar::dist::detail {

// accumulator = accumulator + source (Sum and Avg) or fmax(accumulator, source)
// (Max: like NCCL's fmaxf, a NaN loses to a number). The accumulator must be
// contiguous; source may be any view of the same shape and device.
void reduce_into(Tensor& accumulator, const Tensor& source, ReduceOp op);

// tensor = tensor / divisor, element by element (Avg's last step), in place on a
// contiguous tensor. A true division, not a multiplication by 1 / divisor.
void divide_(Tensor& tensor, float divisor);

#ifdef SEQPAR_WITH_CUDA
void max_into_cuda(float* accumulator, const float* source, int64_t count, int device);
void divide_cuda(float* data, int64_t count, float divisor, int device);
#endif

}  // namespace seqpar::dist::detail
