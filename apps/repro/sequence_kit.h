// What the sequence-parallel scenarios (ulysses.cpp, context_parallel.cpp) share: rows
// gathered from every rank in one-rank order, how far a run's parameters are from one
// rank's, the ranks' agreement, per-shard figures, and the bytes each collective moves.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "apps/repro/config.h"
#include "apps/repro/pitfall.h"
#include "core/tensor.h"
#include "dist/process_group.h"

namespace seqpar::repro {

// Every rank's `local` rows stacked in world-rank order (one rank, `world` null: a copy).
Tensor gathered_rows(const Tensor& local, dist::ProcessGroup* world);
// The rows of `parts` one after another, on the CPU.
Tensor stacked_rows(const std::vector<Tensor>& parts);
// max |mine_r - mine_0| over every rank r's copy of `mine` (gathered over `world`).
double rank_spread(const std::vector<float>& mine, dist::ProcessGroup* world);
bool ranks_agree(const std::vector<double>& rank_spread_by_step);

// A run's parameters after each step against the baseline's after the same step.
struct ParameterComparison {
  int64_t differing = 0;         // after the last step, elements not bitwise the baseline's
  double max_difference = 0;     // after the last step, max |Δ|
  int64_t diverged_at_step = 0;  // first step whose parameters differ (0: none)
};
ParameterComparison compare_parameters(const std::vector<std::vector<float>>& run,
                                       const std::vector<std::vector<float>>& baseline);

// Lists in config.ignored the keys these scenarios accept but never read (repro.dropout,
// gradient accumulation), so their reports name them; `block` names the model.
void add_sequence_ignored(ReproConfig& config, const std::string& block);

// --dump's files: inputs.safetensors, the one-rank run's as reference.safetensors, and
// each variant's as KEY.safetensors (`variants`: key and tensors, in the report's order).
DumpTensors variant_dump(NamedTensors inputs, NamedTensors reference, const DumpTensors& variants);

// "[a, b, c]": one figure per shard or rank.
std::string shard_figures(const std::vector<double>& values);

// Bytes one rank receives from the others, float32: an equal-split all-to-all of a
// [tokens, heads, dim] shard over `ranks` (all but its own 1/ranks), and an all-gather
// of `elements` per rank.
int64_t all_to_all_bytes(int64_t tokens, int64_t heads, int64_t dim, int64_t ranks);
int64_t all_gather_bytes(int64_t elements, int64_t ranks);

}  // namespace seqpar::repro
