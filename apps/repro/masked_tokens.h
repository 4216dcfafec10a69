// Scenario "masked-tokens": ignored tokens (labels of -100, here the L1 loss's row
// mask) under gradient accumulation and sequence parallelism. A batch's loss is the mean
// over its valid tokens; when each micro-batch or rank takes the mean over its own and
// those means are averaged, a token counts 1/(its part's count), and parts' counts
// differ. The fix (the transformers trainer's num_items_in_batch) divides every part's
// sum by the global valid count.
//
// The data: a mask drawn from the configured seed's stream, each rank's share of a
// micro-batch with its own chance of being ignored, and at least one valid row in
// every part. Micro-batch k of ds_config.gradient_accumulation_steps = ga holds a share
// (k + 1) / (1 + 2 + ... + ga) of a replica's rows (the last takes what rounding
// leaves), split over the sp ranks as torch.tensor_split splits them.
#pragma once

#include <cstdint>
#include <vector>

#include "apps/repro/pitfall.h"

namespace seqpar::repro {

// The rows of one replica that each micro-batch of ga holds (first relative to the
// replica's first row).
std::vector<RowRange> micro_batches_of(int64_t rows, int64_t ga);

// The scenario's mask for every replica's rows ([dp * rows], 1 = valid, 0 = ignored),
// on the host: the same on every rank for the same configuration.
std::vector<float> masked_tokens_mask(const ReproConfig& config);

}  // namespace seqpar::repro
