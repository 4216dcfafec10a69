// Scenario "dropout": dropout on the Linear's output under sequence parallelism.
//
// Dropout draws its mask from a counter-based generator: element (r, c) reads the word
// at some position of the (seed, offset) stream. When every sequence-parallel rank calls
// dropout on its own shard with the same seed and offset (Megatron-LM#1256,
// PaddleFleetX#1005), each rank reads the words of positions 0, 1, ... of its shard:
// every shard gets the mask of the first shard's rows, and the ranks together apply a
// mask one rank on all rows would never draw. Keying the mask by the global row
// (nn/dropout.h: position = offset + global row x columns + column) gives each shard
// exactly its rows of the one-rank mask.
//
// The one-rank baseline applies dropout (p = repro.dropout) over all dp x rows rows,
// row g of the global batch reading words offset + g x out + c of repro.seed's stream,
// with offset starting after the data's draws (RankData::random_offset) and advancing
// by one whole mask per step, the same on every rank.
#pragma once

#include <cstdint>

#include "apps/repro/pitfall.h"

namespace seqpar::repro {

// Where step `step`'s mask starts in the stream (step 0 is the first step).
uint64_t dropout_mask_offset(const ReproConfig& config, uint64_t random_offset, int64_t step);

// The fraction of the global batch's mask elements at step `step` that a rank drawing
// with the same seed and offset as every other sp rank gets wrong: each shard's mask
// against its rows of the one-rank mask.
double same_offset_mask_mismatch(const ReproConfig& config, uint64_t random_offset, int64_t step);

}  // namespace seqpar::repro
