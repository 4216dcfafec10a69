// Gradient-norm clipping with PyTorch's semantics (torch.nn.utils.clip_grad_norm_):
//
//   norm_i = ||g_i||_2 for each parameter,  total = ||(norm_1, ..., norm_k)||_2
//   coefficient = min(1, max_norm / (total + 1e-6));  every g_i *= coefficient
//
// The norm and the coefficient stay on the gradients' device: no host round trip
// inside a step. The pieces are exposed separately so that a distributed policy can
// combine norms across ranks before clipping.
#pragma once

#include <vector>

#include "autograd/variable.h"
#include "core/tensor.h"

namespace seqpar::optim {

// Total L2 norm of the defined gradients, as a one-element tensor (shape {}) on
// their device. Fixed reduction order: deterministic.
Tensor grad_norm(const std::vector<autograd::Variable>& parameters);

// Scales every defined gradient by min(1, max_norm / (total_norm + 1e-6)), reading
// total_norm (shape {}) where it lives.
void clip_grads_with_norm(const std::vector<autograd::Variable>& parameters, double max_norm,
                          const Tensor& total_norm);

// Both: returns the total norm before clipping.
Tensor clip_grad_norm(const std::vector<autograd::Variable>& parameters, double max_norm);

namespace detail {
#ifdef SEQPAR_WITH_CUDA
// clip.cu. Contiguous gradients on `device`. Two fixed-order stages (per-block sums
// of squares, then one block): per-tensor norms, then the total, into total_norm.
void grad_norm_cuda(const std::vector<const float*>& grads, const std::vector<int64_t>& sizes,
                    const Tensor& total_norm, int device);
void clip_grads_cuda(const std::vector<float*>& grads, const std::vector<int64_t>& sizes,
                     float max_norm, const Tensor& total_norm, int device);
#endif
}  // namespace detail

}  // namespace seqpar::optim
