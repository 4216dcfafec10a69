// The ulysses scenario's "local causal mask" mistake: after Ulysses' first all-to-all a
// rank holds all S tokens of its heads in sequence order, and the causal mask must
// compare global indices (key j visible to query i iff j <= i). Built instead from the
// indices a rank held before the exchange, i mod S/P and j mod S/P, it lets a token see
// keys of later shards (the future) and hides keys of earlier shards that sit further
// into their shard:
//
//   visible(i, j) = (j mod n) <= (i mod n)      n = S/P tokens per shard
//
// That is nn's attention op with a causal mask over the positions i mod n
// (nn::AttentionMask::causal_over): the mistake is the positions, as with RoPE.
#pragma once

#include <cstdint>
#include <vector>

namespace seqpar::repro {

// i mod n for the S tokens a rank holds after the exchange: the positions the mistaken
// mask compares.
std::vector<int64_t> shard_local_positions(int64_t tokens, int64_t tokens_per_shard);

// For the report: of the S(S+1)/2 pairs the causal mask allows, how many the shard-local
// mask hides, and how many future pairs (j > i) it shows.
struct MaskDifference {
  int64_t causal_pairs = 0, hidden_past = 0, visible_future = 0;
};
MaskDifference shard_local_mask_difference(int64_t tokens, int64_t tokens_per_shard);

}  // namespace seqpar::repro
