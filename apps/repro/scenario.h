// One run of the scenario on one rank: draw the data, then train the one-rank baseline
// (world rank 0) and every policy (each its own model and optimizer, from the same
// initial state) in lockstep: per step, the baseline takes its step, then each policy
// in turn on every rank, gathering every rank's parameters, gradients and norms on world
// rank 0, which turns them into that step's figures at once and drops them. Memory
// does not grow with the number of steps (but for a few scalars per step), and no
// rank waits for another longer than about one step.
//
// Determinism made explicit: every rank seeds one Generator with the configured seed
// and makes the same calls in the same order (the Linear's weight, its bias, then one
// batch of `rows` rows per data-parallel replica, one after another), so every rank
// holds the same initial parameters and the same data. The same batches are reused
// at every step.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "apps/repro/analysis.h"
#include "apps/repro/config.h"
#include "apps/repro/policy.h"
#include "apps/repro/progress.h"
#include "core/tensor.h"
#include "nn/linear.h"

namespace seqpar::repro {

// One policy's run as world rank 0 keeps it: the per-step figures (computed when each
// step ends, against the baseline's state after the same step) and the final state.
struct PolicyRun {
  PolicyFigures figures;  // policy, skipped, steps, first-step signs and scale, verdict
  StepRecord last;        // every rank's parameters and gradients after the last step
};

// The one-rank baseline: one rank on all replicas' rows, mean loss.
struct BaselineRun {
  std::vector<float> parameters, gradients;  // [element], after the last step
  std::vector<float> losses, norms;          // [step]
  double seconds = 0;                        // wall time of its steps
};

struct RunResults {
  ReproConfig config;
  std::string placement;  // "4 ranks as threads on cpu", ...
  std::string mesh_layout;
  std::vector<std::vector<float>> initial_parameters;  // [rank][element]
  Tensor inputs;                                       // x, [dp * rows, in], host
  BaselineRun baseline;
  std::vector<PolicyRun> policies;
};

// Every rank's copy of the same data and initial parameters: the Linear's
// initialization from repro.seed, then each replica's batch.
struct RankData {
  Tensor inputs;  // all replicas' rows, [dp * rows, in]
  Tensor initial_weight, initial_bias;
  // The Generator's offset after these draws: where a scenario's own random numbers
  // (the dropout scenario's masks) start in repro.seed's stream, fresh words after the data's.
  uint64_t random_offset = 0;
};
RankData draw_data(const ReproConfig& config, Device device);

// A fresh model holding the drawn initial parameters (it draws nothing itself).
std::unique_ptr<nn::Linear> make_model(const ReproConfig& config, const RankData& data,
                                       Device device);

// This rank's groups of the sp x dp mesh over `world` (a collective: every rank calls it).
RankGroups rank_groups(const std::shared_ptr<dist::ProcessGroup>& world, const ReproConfig& config);

// Runs on every rank with the same arguments; returns the gathered results, figures
// and verdicts decided, on world rank 0 (other ranks get an empty RunResults). World
// rank 0 tells `progress`, when given, what it is doing.
RunResults run_scenario(const RankGroups& groups, const ReproConfig& config,
                        const std::vector<const Policy*>& policies, Device device,
                        const std::string& placement, Progress* progress = nullptr);

// Element counts of the model's parameters in the flattened order (weight, bias).
int64_t parameter_count(const ReproConfig& config);

}  // namespace seqpar::repro
