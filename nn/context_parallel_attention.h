// ContextParallelAttention: attention over a sequence split across ranks that keeps
// every head on every rank and splits the keys instead (context parallelism, as
// Megatron-Core's CP or Llama 3's all-gather attention), so its degree is not bounded
// by the heads as Ulysses' is.
//
// C ranks (the SequenceGroup) share a batch of sequences of S tokens. Rank r holds S/C
// tokens of each sequence, at global positions (context_parallel_positions):
//   contiguous  [r · S/C, (r + 1) · S/C)
//   zigzag      chunks r and 2C−1−r of 2C equal chunks, so that under a causal mask
//               every rank has the same work (a contiguous shard's last rank attends
//               to C times the keys its first does)
// and passes q [B, S/C, Hq, D], k and v [B, S/C, Hkv, D] (or 3-D: one sequence). The
// tokens keep their global positions: RoPE at them, and the mask over them (causal,
// packed documents by their global boundaries, key padding).
//
// The schedule keeps attention's chains whole (docs/numerics.md, section 9), so the
// bits are one rank's on any C and either layout:
//   forward   all-gather K and V, put them in position order, and attend this rank's
//             queries to every key: each row's chains run over all its keys, in order.
//   backward  dQ the same way (attention_backward_queries). dK and dV of this rank's
//             keys need every query that sees them: all-gather Q, dO, O and the rows'
//             m and l, in position order, and run each key's chains over all of them
//             (attention_backward_keys). Operands move, never partial sums.
// Per rank and layer: the forward gathers 2 · S · Hkv · D floats, the backward
// 3 · S · Hq · D + 2 · S · Hq (docs/context-parallel.md compares the volumes with Ulysses').
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "autograd/variable.h"
#include "nn/attention.h"
#include "nn/module.h"
#include "nn/sequence_group.h"

namespace seqpar::nn {

enum class ContextParallelLayout { Contiguous, Zigzag };

// The global positions rank `rank` of `ranks` holds of a sequence of `sequence` tokens,
// ascending. Refuses a sequence that does not split evenly (S % C, or S % 2C for zigzag).
std::vector<int64_t> context_parallel_positions(int64_t sequence, int ranks, int rank,
                                                ContextParallelLayout layout);

struct ContextParallelOptions {
  AttentionMask mask = AttentionMask::causal();  // over global positions; no positions of its own
  ContextParallelLayout layout = ContextParallelLayout::Contiguous;
  std::optional<float> scale;  // empty: 1/sqrt(D)
};

class ContextParallelAttention : public Module {
 public:
  ContextParallelAttention(std::shared_ptr<SequenceGroup> group, ContextParallelOptions options = {});

  // q [B, S/C, Hq, D], k and v [B, S/C, Hkv, D] (or 3-D): this rank's tokens at
  // positions() order. Returns this rank's attention output, q's shape. Collective, in
  // forward and in backward.
  autograd::Variable forward(const autograd::Variable& q, const autograd::Variable& k,
                             const autograd::Variable& v) const;

  // This rank's global positions for a shard of `tokens` tokens.
  std::vector<int64_t> positions(int64_t tokens) const;

  const std::shared_ptr<SequenceGroup>& group() const { return group_; }
  const ContextParallelOptions& options() const { return options_; }

 private:
  std::shared_ptr<SequenceGroup> group_;
  ContextParallelOptions options_;
};

}  // namespace seqpar::nn
