// Dropout whose mask is a pure function of (seed, offset, global row, column), so that
// ranks holding different rows of one sequence draw the mask one rank draws for all.
//
// On an [n, m] input whose row i is row r = first_row + i of the whole sequence, the
// element (r, c) reads one 32-bit word of seqpar's Philox stream (core/philox.h, the
// stream Generator and cuRAND's host generator give) at
//
//   position = offset + r * m + c
//
// A rank that holds rows [a, b) and passes first_row = a therefore reads exactly the
// words one rank reads for those rows when it holds them all. A rank that passes
// first_row = 0 for its own shard reads the words of the sequence's first rows instead:
// every shard then gets the first shard's mask rather than its own rows' mask.
//
// The numbers, each computed once on the host from p and then shared by both devices:
//
//   keep  = (float)(1.0 - (double)p)       the keep probability; exact in double, one
//                                          rounding to float
//   scale = (float)(1.0 / (double)keep)    the division in double, then one rounding
//                                          to float (PyTorch's CUDA dropout forms its
//                                          scale the same way)
//   u     = philox::uniform(word)          cuRAND's uniform in (0, 1]
//   kept  = u <= keep
//
// The decision is made on the word itself: u is non-decreasing in the word, so
// "u <= keep" is "word <= threshold" for the largest word whose u is at most keep
// (dropout_keep_threshold). Both devices compare integers against the same threshold
// and the CUDA kernel computes the same Philox words (integer arithmetic), so the masks
// are equal bit for bit; a kept element is one float product x * scale (rounded once,
// __fmul_rn on the GPU), so the outputs are too.
//
//   output[i, c] = kept ? x[i, c] * scale : +0
//
// A dropped element is +0 whatever x holds (a NaN or an infinity there does not leak
// through, as it would through a multiplication by zero). The gradient is the same map
// applied to the incoming gradient: g * scale where kept, +0 where dropped.
//
// p = 0 is the identity: keep = 1, every u <= 1, scale = 1, and x * 1 = x. p must lie
// in [0, 1) (p = 1 would keep nothing and scale by infinity); anything else, NaN
// included, is an error naming p. The positions must fit in 64 bits.
#pragma once

#include <cstdint>

#include "autograd/variable.h"
#include "core/tensor.h"
#include "seqpar/config.h"

namespace seqpar::nn {

// Which mask: everything but the shape, which comes from the tensor it is applied to.
struct DropoutMask {
  float p = 0.0f;           // the drop probability, in [0, 1)
  uint64_t seed = 0;        // the Philox key
  uint64_t offset = 0;      // the position of the sequence's element (0, 0)
  int64_t first_row = 0;    // the global row of the tensor's row 0
};

// The host-side numbers above (each checks p).
float dropout_keep_probability(float p);
float dropout_scale(float p);
uint32_t dropout_keep_threshold(float p);

// How far a caller advances the offset after a dropout over a whole sequence of
// `rows` x `columns`, so that the next call draws fresh words: rows * columns, rounded
// up to a whole Philox block (4 words) as Generator's draws advance.
uint64_t dropout_positions(int64_t rows, int64_t columns);

// ---- compute, no autograd ----
// input: [n, m] (any strides); the result is a fresh contiguous [n, m] on input's device.
Tensor dropout_forward(const Tensor& input, const DropoutMask& mask);
// The same map on the incoming gradient (dropout is linear in its input).
Tensor dropout_backward(const Tensor& grad_output, const DropoutMask& mask);
// The mask itself for rows [first_row, first_row + rows): 1 where kept, 0 where dropped.
Tensor dropout_keep_mask(int64_t rows, int64_t columns, const DropoutMask& mask,
                         Device device = Device::cpu());

// ---- differentiable ----
autograd::Variable dropout(const autograd::Variable& input, float p, uint64_t seed,
                           uint64_t offset, int64_t first_row = 0);

namespace detail {
// The arguments a kernel needs, checked and computed on the host.
struct DropoutLaunch {
  uint64_t seed;
  uint64_t start;           // offset + first_row * columns: the position of element (0, 0)
  uint32_t threshold;       // kept iff word <= threshold
  float scale;
};
}  // namespace detail

}  // namespace seqpar::nn
