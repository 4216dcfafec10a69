// UlyssesAttention: multi-head attention over a sequence split across ranks, as
// DeepSpeed-Ulysses computes it (DeepSpeed's DistributedAttention), with grouped-query
// heads and a batch.
//
// P ranks (the SequenceGroup) share a batch of sequences of S tokens; rank r holds tokens
// [r * S/P, (r + 1) * S/P) of each. Each rank passes its q [B, S/P, Hq, D] and k, v
// [B, S/P, Hkv, D] (or 3-D [S/P, H, D]: one sequence):
//
//   shard_heads      q [B, S/P, Hq, D] -> [B, S, Hq/P, D]    every token, Hq/P heads
//                    k, v likewise, with their kv heads (below)
//   attention        scaled_dot_product_attention over the whole sequence
//   shard_sequence   [B, S, Hq/P, D] -> [B, S/P, Hq, D]      this rank's tokens again
//   reshape          [B, S/P, Hq * D]                        ready for the output projection
//
// (nn/ulysses_all_to_all.h). After the first exchange a rank holds every token of its
// heads in sequence order, so the mask is over the full sequence's positions: causal,
// or packed documents given by their global boundaries. Positions (RoPE) must be global
// too, sp_rank * S/P + i (or within-document ones), applied before the exchange (the
// block in nn/ulysses_block.h does).
//
// Heads:
//   - Hq must split evenly over the ranks: Hq % P == 0, or forward refuses, naming Hq and
//     P. Every rank then holds the same number of heads, an all-to-all of equal chunks
//     moves them, and the layout is the one DeepSpeed used before 0.15. Uneven heads
//     (DeepSpeed >= 0.15, all_to_all_single with split sizes) would need an all-to-all of
//     uneven chunks: not supported (docs/ulysses.md).
//   - When P divides Hkv, the kv heads split like the query heads: rank r's query heads
//     are exactly those that read its kv heads.
//   - Otherwise (P beyond the kv heads: the head wall), each kv head is repeated for its
//     query heads before the exchange (repeat_kv_heads), so each rank receives the kv
//     heads its query heads read; their gradients are added back exactly. This moves
//     Hq/Hkv times the K and V a split would (docs/ulysses.md); from P = 3 on still less
//     than context parallelism gathers (docs/context-parallel.md compares them).
//
// Exact on any placement: each head's attention runs on one rank over the whole
// sequence, the attention op's bits do not depend on how many heads a call holds, and
// the sharing heads' dk and dv meet in one exact sum wherever they were computed; the
// exchanges move bits unchanged. So P ranks give the rows one rank computes, bit for
// bit, in forward and in backward.
#pragma once

#include <functional>
#include <memory>
#include <optional>

#include "autograd/variable.h"
#include "nn/attention.h"
#include "nn/module.h"
#include "nn/sequence_group.h"

namespace seqpar::nn {

// The attention a rank computes on the q, k, v it holds after the exchange ([B, S, Hq/P, D]
// and its kv heads; [B, S/P, H, D] without it). Empty: scaled_dot_product_attention with
// the layer's mask and scale. A hook so that an app can record what attention sees, or show a mistake
// (seqpar-repro's ulysses scenario: a causal mask on shard-local indices).
using LocalAttention = std::function<autograd::Variable(
    const autograd::Variable& q, const autograd::Variable& k, const autograd::Variable& v)>;

struct UlyssesAttentionOptions {
  // Over the whole sequence's positions (no positions of its own: after the exchange a
  // rank holds every token in order). A bool is causal (true) or none.
  AttentionMask mask = AttentionMask::causal();
  // false: no all-to-all; each rank attends over its own S/P tokens only, with every head.
  // Not Ulysses: a mistake seqpar-repro's ulysses scenario shows (each token loses the
  // keys other shards hold). Off by default, never implied by another option.
  bool exchange = true;
  LocalAttention attention;  // empty: the ordinary attention (see LocalAttention)
  std::optional<float> scale;  // empty: 1/sqrt(D)
};

class UlyssesAttention : public Module {
 public:
  explicit UlyssesAttention(std::shared_ptr<SequenceGroup> group, bool causal = true);
  UlyssesAttention(std::shared_ptr<SequenceGroup> group, UlyssesAttentionOptions options);

  // q [B, S/P, Hq, D], k and v [B, S/P, Hkv, D] (or 3-D, one sequence): this rank's
  // tokens. Returns [B, S/P, Hq * D] ([S/P, Hq * D]). Collective: every rank of the group
  // calls it (and later runs backward) with the same shapes; ranks that pass different
  // shapes are refused on every rank, naming what each passed.
  autograd::Variable forward(const autograd::Variable& q, const autograd::Variable& k,
                             const autograd::Variable& v) const;

  const std::shared_ptr<SequenceGroup>& group() const { return group_; }
  const AttentionMask& mask() const { return options_.mask; }

 private:
  std::shared_ptr<SequenceGroup> group_;
  UlyssesAttentionOptions options_;
};

}  // namespace seqpar::nn
