// Elementwise arithmetic on tensors of one shape and one device, without autograd.
// Inputs may be strided views; results are fresh contiguous tensors. Every op is
// one pass of out[i] = alpha * a[i] + beta * b[i], on the CPU here and on the GPU in
// elementwise.cu, so both paths round identically.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "seqpar/config.h"

namespace seqpar {

Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, float scalar);

// In place, on a contiguous destination: destination += source; destination *= scalar.
void add_(Tensor& destination, const Tensor& source);
void mul_(Tensor& destination, float scalar);

namespace detail {
// out[i] = alpha * a[i] + beta * b[i] for i < count over contiguous arrays; b may be
// null (then out[i] = alpha * a[i]); out may alias a or b.
void axpby(float* out, const float* a, float alpha, const float* b, float beta, int64_t count,
           Device device);
#ifdef SEQPAR_WITH_CUDA
void axpby_cuda(float* out, const float* a, float alpha, const float* b, float beta,
                int64_t count, int device);
#endif
}  // namespace detail

}  // namespace seqpar
