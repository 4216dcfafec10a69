// The ulysses scenario's "local causal mask" mistake: attention whose causal mask compares
// shard-local indices. After Ulysses' first all-to-all a rank holds all S tokens of its
// heads in sequence order, and the mask must compare global indices (key j visible to
// query i iff j <= i). Built instead from the indices a rank held before the exchange,
// i mod S/P and j mod S/P, it lets a token see keys of later shards (the future) and
// hides keys of earlier shards that sit further into their shard:
//
//   visible(i, j) = (j mod n) <= (i mod n)      n = S/P tokens per shard
//
// Plain loops in double, rounded to float once per output: a demonstration, not a kernel
// (nn/attention.h's op, with its documented numerics, is what the correct variants use).
#pragma once

#include <cstdint>

#include "autograd/variable.h"

namespace seqpar::repro {

// q, k, v [S, H, D] (one rank's heads after the exchange); S a multiple of n.
autograd::Variable shard_local_mask_attention(const autograd::Variable& q, const autograd::Variable& k,
                                              const autograd::Variable& v, int64_t tokens_per_shard);

// For the report: of the S(S+1)/2 pairs the causal mask allows, how many the shard-local
// mask hides, and how many future pairs (j > i) it shows.
struct MaskDifference {
  int64_t causal_pairs = 0, hidden_past = 0, visible_future = 0;
};
MaskDifference shard_local_mask_difference(int64_t tokens, int64_t tokens_per_shard);

}  // namespace seqpar::repro
