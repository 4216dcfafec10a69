// Scenario "masked-tokens": ignored tokens (labels of -100) under gradient accumulation
// and sequence parallelism.
//
// A language model's loss leaves out the tokens it must not learn (padding, the
// prompt): cross-entropy's ignore_index, here the L1 loss's row mask. The loss of a
// batch is the mean over its valid tokens. When each micro-batch, or each rank, takes
// the mean over its own valid tokens and those means are averaged, a token counts
// 1/(its own part's count) instead of 1/(the batch's count): (x1/n1 + x2/n2) / 2 is
// not (x1 + x2) / (n1 + n2) unless n1 = n2. Gradient accumulation over micro-batches
// of different valid counts and ranks holding different shares of the ignored tokens
// make the counts differ. The fix (the transformers trainer's num_items_in_batch) sums
// every part's loss divided by the global valid count.
//
// The data: a mask of ignored rows drawn from the configured seed's stream (beyond any
// draw of x or the parameters), each rank's share of a micro-batch with its own chance
// of being ignored, so the valid counts differ from rank to rank and micro-batch to
// micro-batch. Micro-batch k of ds_config.gradient_accumulation_steps = ga holds a share
// (k + 1) / (1 + 2 + ... + ga) of a replica's rows (the last takes what rounding
// leaves); its rows are split over the sequence-parallel ranks as torch.tensor_split
// splits them. Every rank's part of every micro-batch keeps at least one valid row, so
// no local mean is a mean of nothing.
#pragma once

#include <cstdint>
#include <vector>

#include "apps/repro/pitfall.h"

namespace seqpar::repro {

// The rows of one replica that micro-batch k of ga holds (first is relative to the
// replica's first row), as described above. For the scenario and its tests.
std::vector<RowRange> micro_batches_of(int64_t rows, int64_t ga);

// The scenario's mask for every replica's rows ([dp * rows], 1 = valid, 0 = ignored),
// on the host: the same on every rank for the same configuration.
std::vector<float> masked_tokens_mask(const ReproConfig& config);

}  // namespace seqpar::repro
