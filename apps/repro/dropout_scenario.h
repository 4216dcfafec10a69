// Scenario "dropout": dropout on the Linear's output under sequence parallelism.
//
// Dropout's mask comes from a counter-based generator: element (r, c) reads a word at
// some position of the (seed, offset) stream. When every sp rank calls dropout on its
// shard with the same seed and offset (Megatron-LM#1256, PaddleFleetX#1005), every
// shard gets the mask of the first shard's rows. Keying the mask by the global row
// (nn/dropout.h: position = offset + global row x columns + column) gives each shard
// its rows of the one-rank mask. The offset starts after the data's draws
// (RankData::random_offset) and advances by one whole mask per step.
#pragma once

#include <cstdint>

#include "apps/repro/pitfall.h"

namespace seqpar::repro {

// Where step `step`'s mask starts in the stream (step 0 is the first step).
uint64_t dropout_mask_offset(const ReproConfig& config, uint64_t random_offset, int64_t step);

// The share of step `step`'s mask elements that ranks drawing with the same seed and
// offset get wrong: each shard's mask against its rows of the one-rank mask.
double same_offset_mask_mismatch(const ReproConfig& config, uint64_t random_offset, int64_t step);

}  // namespace seqpar::repro
