#include "apps/repro/ulysses_mask.h"

#include <cstddef>

namespace seqpar::repro {

std::vector<int64_t> shard_local_positions(int64_t tokens, int64_t tokens_per_shard) {
  std::vector<int64_t> positions(static_cast<size_t>(tokens));
  for (int64_t t = 0; t < tokens; ++t) positions[static_cast<size_t>(t)] = t % tokens_per_shard;
  return positions;
}

MaskDifference shard_local_mask_difference(int64_t tokens, int64_t tokens_per_shard) {
  MaskDifference difference;
  for (int64_t i = 0; i < tokens; ++i) {
    for (int64_t j = 0; j < tokens; ++j) {
      const bool causal = j <= i, local = j % tokens_per_shard <= i % tokens_per_shard;
      difference.causal_pairs += causal;
      difference.hidden_past += causal && !local;
      difference.visible_future += !causal && local;
    }
  }
  return difference;
}

}  // namespace seqpar::repro
