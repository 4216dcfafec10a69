// The ulysses scenario's "local causal mask" mistake (docs/ulysses.md): after the first
// all-to-all a rank holds all S tokens of its heads, and the causal mask must compare
// global indices. Built from the indices a rank held before the exchange, it is nn's
// causal mask over the positions i mod n (n = S/P tokens per shard):
// visible(i, j) = (j mod n) <= (i mod n).
#pragma once

#include <cstdint>
#include <vector>

namespace seqpar::repro {

// i mod n for the S tokens a rank holds after the exchange.
std::vector<int64_t> shard_local_positions(int64_t tokens, int64_t tokens_per_shard);

// Of the S(S+1)/2 pairs the causal mask allows, how many the shard-local mask hides,
// and how many future pairs (j > i) it shows.
struct MaskDifference {
  int64_t causal_pairs = 0, hidden_past = 0, visible_future = 0;
};
MaskDifference shard_local_mask_difference(int64_t tokens, int64_t tokens_per_shard);

}  // namespace seqpar::repro
