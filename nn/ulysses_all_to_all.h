// The all-to-alls of Ulysses attention (DeepSpeed-Ulysses; DeepSpeed's
// DistributedAttention), with their gradients.
//
// P ranks share a batch of sequences of S tokens: rank r holds tokens
// [r * S/P, (r + 1) * S/P) of every sequence and every head. Attention needs every token
// of a head on one rank, so
//
//   shard_heads     [B, S/P, H, D] -> [B, S, H/P, D]   rank j keeps heads
//                                                      [j * H/P, (j + 1) * H/P) of every
//                                                      token, tokens in sequence order
//   shard_sequence  [B, S, H/P, D] -> [B, S/P, H, D]   back: each rank its own tokens, all heads
//
// (a 3-D [S/P, H, D] is one sequence, and stays 3-D).
// Each is one equal-split all-to-all (dist/all_to_all.h) and a local copy that puts the
// chunks in order; no arithmetic, so the bits move unchanged. Each undoes the other, and
// the gradient of a permutation is its inverse: shard_heads's backward is
// shard_sequence and the other way round (DeepSpeed's _SeqAllToAll swaps its scatter
// and gather dimensions the same way).
//
// Heads must split evenly: H % P == 0, refused otherwise naming H and P
// (nn/ulysses_attention.h says why uneven heads are not supported).
//
// The exchanges are collective, in forward and in backward: every rank of the group
// runs the same graph, so the backward engine reaches the nodes in the same order on
// every rank.
#pragma once

#include <memory>

#include "autograd/variable.h"
#include "core/tensor.h"
#include "nn/sequence_group.h"

namespace seqpar::nn {

// ---- compute, no autograd ----
Tensor shard_heads(const Tensor& x, SequenceGroup& group);
Tensor shard_sequence(const Tensor& x, SequenceGroup& group);

// ---- differentiable ----
autograd::Variable shard_heads(const autograd::Variable& x, std::shared_ptr<SequenceGroup> group);
autograd::Variable shard_sequence(const autograd::Variable& x, std::shared_ptr<SequenceGroup> group);
// The plain all-to-all of the group, differentiable: the exchange is its own inverse,
// so its backward is the same all-to-all of the gradient.
autograd::Variable all_to_all(const autograd::Variable& x, std::shared_ptr<SequenceGroup> group);

// Checks that `heads` split evenly over the group, naming both counts (`op` opens the
// message).
void check_heads_split(const char* op, int64_t heads, const SequenceGroup& group);

}  // namespace seqpar::nn
