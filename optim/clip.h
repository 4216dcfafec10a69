// Gradient-norm clipping with PyTorch's semantics (torch.nn.utils.clip_grad_norm_):
//
//   norm_i = ||g_i||_2 for each parameter,  total = ||(norm_1, ..., norm_k)||_2
//   coefficient = min(1, max_norm / (total + 1e-6));  every g_i *= coefficient
//
// The norms are exact reductions (core/exact_bins.h), the same bits on the CPU and the
// GPU and for any order of the elements:
//
//   S_i    = exact Σ_j (double)g_ij * (double)g_ij          (each square exact in double)
//   norm_i = (float)sqrt(round_to_double(S_i))
//   total  = (float)sqrt(round_to_double(exact Σ_i (double)norm_i * (double)norm_i))
//
// round_to_double rounds the exact sum once, to nearest even; sqrt in double is
// correctly rounded on both sides. Within the exact sums' domain: a |g| at or above
// 2^64.5 squares past 2^129 and gives an infinite norm (as float32 squares would), a
// square below 2^-149 is first rounded to a multiple of 2^-149, NaN gives NaN. The
// coefficient is float32 arithmetic, (1 / (total + 1e-6f)) * (float)max_norm clamped
// to at most 1, and the scaling one float product per element, on both sides.
//
// The norm and the coefficient stay on the gradients' device: no host round trip
// inside a step. The pieces are exposed separately so that a distributed policy can
// combine norms across ranks before clipping.
#pragma once

#include <vector>

#include "autograd/variable.h"
#include "core/tensor.h"
#include "seqpar/config.h"

namespace seqpar::optim {

// Total L2 norm of the defined gradients, as a one-element tensor (shape {}) on
// their device: the exact definition above, bitwise the same on every device.
Tensor grad_norm(const std::vector<autograd::Variable>& parameters);

// Scales every defined gradient by min(1, max_norm / (total_norm + 1e-6)), reading
// total_norm (shape {}) where it lives.
void clip_grads_with_norm(const std::vector<autograd::Variable>& parameters, double max_norm,
                          const Tensor& total_norm);

// Both: returns the total norm before clipping.
Tensor clip_grad_norm(const std::vector<autograd::Variable>& parameters, double max_norm);

namespace detail {
}  // namespace detail

}  // namespace seqpar::optim
