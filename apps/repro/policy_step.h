// PolicyStep: a DeepSpeed-like engine, small enough to read at once. It owns the
// optimizer, knows the rank's process groups, and turns backward(loss) + step() into
// "combine gradients across ranks, clip, AdamW" the way the chosen Policy says.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "apps/repro/policy.h"
#include "autograd/variable.h"
#include "dist/process_group.h"
#include "nn/exact_gradients.h"
#include "nn/linear.h"
#include "optim/adamw.h"

namespace seqpar::repro {

// The groups one rank belongs to, from the sp x dp mesh.
struct RankGroups {
  std::shared_ptr<dist::ProcessGroup> world;
  std::shared_ptr<dist::ProcessGroup> sequence_parallel;       // contiguous ranks
  std::shared_ptr<dist::ProcessGroup> data_parallel;           // strided ranks
  std::shared_ptr<dist::ProcessGroup> sequence_data_parallel;  // all sp x dp ranks
  int64_t sp = 1, dp = 1, sp_rank = 0, dp_rank = 0;
  std::string mesh_layout;  // printable, the same on every rank
};

// What one step measured, as one-element device tensors.
struct StepNorms {
  Tensor local;  // ||gradient|| of the rank's own backward, before any reduction
  Tensor used;   // the norm the policy clipped with
};

class PolicyStep {
 public:
  PolicyStep(const Policy& policy, const nn::Linear& model, RankGroups groups,
             const optim::AdamWOptions& adamw, double gradient_clipping);

  // deepspeed.initialize() broadcasts the parameters from the first rank of the group
  // it reduces over: the data-parallel group in 0.16, the sp x dp group with an mpu.
  void broadcast_parameters();
  // The exact policy records the exact row sums of Linear's dW and db
  // (nn::ExactGradients) for synchronize_gradients to add across ranks.
  void backward(const autograd::Variable& loss);
  StepNorms step();

  const std::vector<autograd::Variable>& parameters() const { return parameters_; }
  const Policy& policy() const { return policy_; }

 private:
  void synchronize_gradients();
  Tensor clip_norm();

  const Policy& policy_;
  std::vector<autograd::Variable> parameters_;
  RankGroups groups_;
  optim::AdamW optimizer_;
  nn::ExactGradients exact_gradients_;  // the exact policy's unrounded row sums
  double gradient_clipping_;
};

}  // namespace seqpar::repro
