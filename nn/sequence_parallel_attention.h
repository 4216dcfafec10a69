// SequenceParallelAttention: unified sequence parallelism (USP, as yunchang's
// LongContextAttention composes it): Ulysses inside, context parallelism outside, so a
// sequence splits over sp = ulysses x cp ranks however few kv heads the model has. Pure
// Ulysses (cp 1) and pure context parallelism (ulysses 1) are its corners.
//
// The ranks (dist::Mesh's two-level layout: Ulysses groups of neighbouring ranks, cp
// groups strided across them) hold a batch of sequences of S tokens. The cp groups split
// each sequence by the layout (nn/context_parallel_attention.h): cp rank c holds S/cp
// tokens at context_parallel_positions(S, cp, c), contiguous or zigzag; the Ulysses group
// of cp rank c splits those S/cp tokens contiguously, in their position order: Ulysses
// rank u holds tokens [u · S/sp, (u + 1) · S/sp) of them (positions()). Each rank passes
// q [B, S/sp, Hq, D] and k, v [B, S/sp, Hkv, D] (or 3-D: one sequence):
//
//   shard_heads      over ulysses: [B, S/sp, H, D] -> [B, S/cp, H/ulysses, D]
//                    (k and v repeated first past the kv heads, as in UlyssesAttention)
//   attention        ContextParallelAttention over cp, on those heads: every key of the
//                    sequence gathered in position order
//   shard_sequence   over ulysses, back: [B, S/cp, Hq/ulysses, D] -> [B, S/sp, Hq, D]
//   reshape          [B, S/sp, Hq · D], ready for the output projection
//
// The bits are one rank's, forward and backward, on any split: the all-to-alls and the
// all-gathers move operands and never add (each head's chains run whole, over its keys
// in position order, on one rank), and the kv copies' gradients meet in one exact sum
// (docs/context-parallel.md). Tokens keep their global positions: RoPE at positions(),
// and the mask decided on them. Hq must split over ulysses; S over cp (2 · cp for
// zigzag) and then over ulysses: refused otherwise, naming the counts.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "autograd/variable.h"
#include "nn/attention.h"
#include "nn/context_parallel_attention.h"
#include "nn/module.h"
#include "nn/sequence_group.h"
#include "nn/ulysses_attention.h"

namespace seqpar::nn {

struct SequenceParallelOptions {
  AttentionMask mask = AttentionMask::causal();  // over global positions; no positions of its own
  ContextParallelLayout layout = ContextParallelLayout::Contiguous;  // how the cp ranks split S
  std::optional<float> scale;  // empty: 1/sqrt(D)
};

class SequenceParallelAttention : public Module {
 public:
  // `ulysses` and `cp`: this rank's groups of the two levels (nn::single_rank_group() for
  // a level of degree 1).
  SequenceParallelAttention(std::shared_ptr<SequenceGroup> ulysses, std::shared_ptr<SequenceGroup> cp,
                            SequenceParallelOptions options = {});

  // q [B, S/sp, Hq, D], k and v [B, S/sp, Hkv, D] (or 3-D): this rank's tokens, at
  // positions(). Returns [B, S/sp, Hq · D] ([S/sp, Hq · D]). Collective over both
  // groups, in forward and in backward.
  autograd::Variable forward(const autograd::Variable& q, const autograd::Variable& k,
                             const autograd::Variable& v) const;

  // This rank's global positions for a shard of `tokens` tokens, in its order.
  std::vector<int64_t> positions(int64_t tokens) const;

  int degree() const { return ulysses_->group()->size() * context_parallel_->group()->size(); }
  const std::shared_ptr<SequenceGroup>& ulysses_group() const { return ulysses_->group(); }
  const std::shared_ptr<SequenceGroup>& cp_group() const { return context_parallel_->group(); }
  const SequenceParallelOptions& options() const { return options_; }

 private:
  SequenceParallelOptions options_;
  std::shared_ptr<ContextParallelAttention> context_parallel_;
  std::shared_ptr<UlyssesAttention> ulysses_;
};

}  // namespace seqpar::nn
