// What a configuration may hold, checked in one place before anything runs: every
// size and product of sizes, every float, the step count and the world size, and the
// memory the run would need. Each error is a seqpar::InputError of one line naming the
// key, the value and the limit (seqpar-repro exits 2 on it).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>

#include "apps/repro/config.h"

namespace seqpar::repro {

// Ranks run as threads or processes on one machine; beyond this the per-rank setup
// (threads, pipes, groups) dominates any run and the limits of the system are near.
constexpr int64_t kMaxWorldSize = 1024;
// A run records a few hundred bytes per step and policy; a million steps is days of
// compute at the default sizes.
constexpr int64_t kMaxSteps = 1000000;
// Micro-batches per step, for the scenarios that accumulate gradients (masked-tokens):
// each micro-batch is at least one row per rank, so more would only split rows thinner.
constexpr int64_t kMaxGradientAccumulationSteps = 1000;

// The largest learning rate, eps and weight decay accepted. Larger values do not train
// (Adam moves every parameter by about lr a step) and only lead to overflow.
constexpr double kMaxLearningRate = 1;
constexpr double kMaxEps = 1;
constexpr double kMaxWeightDecay = 100;

// The configuration's sizes with their products, each checked against int64 overflow.
struct ScenarioSizes {
  int64_t world_size;    // sp x dp
  int64_t input_rows;    // dp x rows: all replicas' rows, which every rank holds
  int64_t input_values;  // dp x rows x in_features
  int64_t parameters;    // out x in + out
};
ScenarioSizes checked_sizes(const ReproConfig& config);

// A generous estimate of the host memory a run takes (all ranks' copies of the data,
// the models and optimizer states, rank 0's records), overflow-checked.
uint64_t estimated_memory_bytes(const ReproConfig& config);

// The memory available now (MemAvailable in /proc/meminfo, else free pages from
// sysconf); nullopt when neither can be read.
std::optional<uint64_t> available_memory_bytes();

// Fails when estimated_memory_bytes exceeds `available`.
void check_memory(const ReproConfig& config, uint64_t available);

// How long a collective may wait for its last member. Rank 0 alone runs the one-rank
// reference and the analysis of each step while the others wait at the next
// collective, and ranks that are threads share the cores, so the wait grows with the
// work of a step (or of drawing the data) over all ranks: a minute plus a second for
// every 10^7 multiply-adds (a rate far below any machine's). --timeout overrides it.
std::chrono::milliseconds default_collective_timeout(const ReproConfig& config);

}  // namespace seqpar::repro
