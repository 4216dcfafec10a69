// One run of the scenario on one rank: draw the data, train the one-rank reference
// (world rank 0), then train each policy from the same initial state, gathering every
// rank's parameters, gradients and norms on world rank 0 after each step.
//
// Determinism made explicit: every rank seeds one Generator with the configured seed
// and makes the same calls in the same order (the Linear's weight, its bias, then one
// batch of `rows` rows per data-parallel replica, one after another), so every rank
// holds the same initial parameters and the same data. The same batches are reused
// at every step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "apps/repro/config.h"
#include "apps/repro/policy_step.h"
#include "apps/repro/policy.h"
#include "core/tensor.h"

namespace seqpar::repro {

// Host copies of one step, indexed [rank][parameter element] (weight row-major,
// then bias), as gathered on world rank 0.
struct StepRecord {
  std::vector<std::vector<float>> parameters;  // after the step
  std::vector<std::vector<float>> gradients;   // as the optimizer used them
  std::vector<float> losses, local_norms, used_norms;  // [rank]
};

struct PolicyRun {
  const Policy* policy = nullptr;
  std::string skipped;  // why the policy could not run ("" when it ran)
  std::vector<StepRecord> steps;
  double seconds = 0;  // wall time of the steps on rank 0
};

// The one-rank reference: one rank on all replicas' rows, mean loss.
struct ReferenceRun {
  std::vector<std::vector<float>> parameters, gradients;  // [step][element]
  std::vector<float> losses, norms;                       // [step]
  double seconds = 0;
};

struct RunResults {
  ReproConfig config;
  std::string placement;  // "4 ranks as threads on cpu", ...
  std::string mesh_layout;
  std::vector<std::vector<float>> initial_parameters;  // [rank][element]
  Tensor inputs;                                       // x, [dp * rows, in], host
  ReferenceRun reference;
  std::vector<PolicyRun> policies;
};

// Runs on every rank with the same arguments; returns the gathered results on world
// rank 0 (other ranks get an empty RunResults).
RunResults run_scenario(const RankGroups& groups, const ReproConfig& config,
                        const std::vector<const Policy*>& policies, Device device,
                        const std::string& placement);

// Element counts of the model's parameters in the flattened order (weight, bias).
int64_t parameter_count(const ReproConfig& config);

}  // namespace seqpar::repro
