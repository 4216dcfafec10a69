// UlyssesAttention: multi-head attention over a sequence split across ranks, as
// DeepSpeed-Ulysses computes it (DeepSpeed's DistributedAttention).
//
// P ranks (the SequenceGroup) share a sequence of S tokens; rank r holds tokens
// [r * S/P, (r + 1) * S/P). Each rank passes its q, k and v, [S/P, H, D]:
//
//   shard_heads      q, k, v [S/P, H, D] -> [S, H/P, D]    every token, H/P heads
//   attention        scaled_dot_product_attention over the whole sequence, per head
//   shard_sequence   [S, H/P, D] -> [S/P, H, D]            this rank's tokens again
//   reshape          [S/P, H * D]                          ready for the output projection
//
// (nn/ulysses_all_to_all.h). After the first exchange a rank holds every token of its
// heads in sequence order, so the causal mask is the ordinary one over the full
// sequence: token i attends to tokens 0..i by their global indices. Positions (RoPE)
// must be global too, sp_rank * S/P + i, and applied before the exchange (the block in
// nn/ulysses_block.h does).
//
// Exact on any placement: each head's attention runs on one rank over the whole
// sequence, and the attention op's bits do not depend on how many heads a rank holds;
// the exchanges move bits unchanged. So P ranks give the rows one rank computes, bit
// for bit, in forward and in backward.
//
// Heads must split evenly over the ranks: H % P == 0, or forward refuses, naming H and
// P. That is the simplest correct choice: every rank holds the same number of heads, an
// all-to-all of equal chunks moves them, and the layout stays the one DeepSpeed used
// before 0.15. Uneven heads (DeepSpeed >= 0.15, through all_to_all_single with split
// sizes) would need an all-to-all of uneven chunks; a later option, not supported here.
#pragma once

#include <functional>
#include <memory>

#include "autograd/variable.h"
#include "nn/module.h"
#include "nn/sequence_group.h"

namespace seqpar::nn {

// The attention a rank computes on the q, k, v it holds after the exchange ([S, H/P, D]
// each; [S/P, H, D] without it). Empty: scaled_dot_product_attention with the layer's
// causal flag. A hook so that an app can record what attention sees, or show a mistake
// (seqpar-repro's ulysses scenario: a causal mask on shard-local indices).
using LocalAttention = std::function<autograd::Variable(
    const autograd::Variable& q, const autograd::Variable& k, const autograd::Variable& v)>;

struct UlyssesAttentionOptions {
  bool causal = true;
  // false: no all-to-all; each rank attends over its own S/P tokens only, with every head.
  // Not Ulysses: a mistake seqpar-repro's ulysses scenario shows (each token loses the
  // keys other shards hold). Off by default, never implied by another option.
  bool exchange = true;
  LocalAttention attention;  // empty: the ordinary attention (see LocalAttention)
};

class UlyssesAttention : public Module {
 public:
  explicit UlyssesAttention(std::shared_ptr<SequenceGroup> group, bool causal = true);
  UlyssesAttention(std::shared_ptr<SequenceGroup> group, UlyssesAttentionOptions options);

  // q, k, v: [S/P, H, D] each, this rank's tokens. Returns [S/P, H * D]. Collective:
  // every rank of the group calls it (and later runs backward) with the same shapes.
  autograd::Variable forward(const autograd::Variable& q, const autograd::Variable& k,
                             const autograd::Variable& v) const;

  const std::shared_ptr<SequenceGroup>& group() const { return group_; }
  bool causal() const { return options_.causal; }

 private:
  std::shared_ptr<SequenceGroup> group_;
  UlyssesAttentionOptions options_;
};

}  // namespace seqpar::nn
