// The arithmetic behind LocalProcessGroup's reductions, on whole tensors of one
// device. CPU loops live in local_process_group.cpp, beside the threads group, CUDA
// kernels in local_reduce.cu; a GPU reduction is enqueued on the device's one stream
// (core/cuda_runtime.h) and never visits the host.
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

// accumulator = accumulator + source (two's complement, as digits add) or the larger
// of the two (`max`), word by word, for `count` int64 words on `device`.
void reduce_words_into(int64_t* accumulator, const int64_t* source, int64_t count, Device device,
                       bool max);

// tensor = tensor / divisor, element by element (Avg's last step), in place on a
// contiguous tensor. A true division, not a multiplication by 1 / divisor.
void divide_(Tensor& tensor, float divisor);

#ifdef SEQPAR_WITH_CUDA
void max_into_cuda(float* accumulator, const float* source, int64_t count, int device);
void divide_cuda(float* data, int64_t count, float divisor, int device);
void max_words_into_cuda(int64_t* accumulator, const int64_t* source, int64_t count, int device);
#endif

}  // namespace seqpar::dist::detail
