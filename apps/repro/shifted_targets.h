// Scenario "shifted-targets": next-row targets under sequence parallelism.
//
// A causal language model learns to predict token t+1 from tokens up to t, so the
// labels are the inputs shifted by one. Here each row's target is the next row's
// leading features (the last row of a replica has none). When every rank shifts
// inside its own shard, the row at the end of each shard has no target left, although
// the next rank holds it: sp - 1 targets per replica are lost, and a shard-local mean
// also weighs the rest by its shard's count. Shifting the whole replica's targets
// before it is cut (DeepSpeed's and ALST's "pre-shifted labels") is exact.
#pragma once

#include "apps/repro/pitfall.h"

namespace seqpar::repro {

const PitfallScenario& shifted_targets_scenario();

}  // namespace seqpar::repro
