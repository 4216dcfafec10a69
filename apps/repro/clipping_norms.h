// Scenario "clipping-norms": the norm gradient clipping divides by, under sequence
// parallelism.
//
// Every variant combines the gradient correctly (a loss normalized by the global row
// count, summed over sp); they differ only in the norm they clip with:
//   - the mean of the ranks' norms of their partial gradients, taken before the
//     reduction (what DeepSpeed 0.16's clip_grad_norm_ computes over its group);
//   - the sum over the ranks of the squares of the whole, replicated gradient: every
//     element counted once per rank, sqrt(sp x dp) times too large (the inflation
//     NeMo-RL and DeepSpeed fixed for replicated parameters);
//   - each element counted once: every rank sums the squares of its own slice of the
//     flattened gradient (as a ZeRO partition does) and the ranks add the sums;
//   - exact: the exact gradient's norm, which every rank holds whole.
// With gradient_clipping below the norm, a wrong norm changes every step's update.
#pragma once

#include "apps/repro/pitfall.h"

namespace seqpar::repro {

const PitfallScenario& clipping_norms_scenario();

}  // namespace seqpar::repro
