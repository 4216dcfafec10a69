// The gradient-synchronization policies seqpar-repro compares, each a complete
// answer to: which rows does a rank hold, what loss does it compute on them, and how
// are the ranks' partial gradients combined before clipping and the optimizer step?
//
//                   rows per rank        per-rank loss          gradient combine           clip norm
//  deepspeed-0.16   torch.chunk          mean over own rows     Σ over dp group, × sp/dp   avg of local norms over dp
//  with-mpu         torch.chunk          mean over own rows     Σ over sp×dp, ÷ dp         after the reduction
//  exact            torch.tensor_split   Σ own rows / (dp·rows·out) exact Σ over sp×dp   after the reduction
//
// deepspeed-0.16 is what DeepSpeed 0.16 did in issue #6868: with no mpu, its
// "sequence-data-parallel" group falls back to the mesh's data-parallel group, which
// (dp = 1) holds only the rank itself, so each rank steps on its own partial
// gradient. with-mpu is the fix users applied (an mpu whose group spans sp×dp); it
// makes the ranks agree but sums per-rank means, so the gradient is sp times too large
// (invisible to Adam's first step, not to clipping). exact is what one rank training on
// the whole batch computes, for any row count.
//
// PolicyStep, below: a DeepSpeed-like engine, small enough to read at once. It owns the
// optimizer, knows the rank's process groups, and turns backward(loss) + step() into
// "combine gradients across ranks, clip, AdamW" the way the chosen Policy says.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "autograd/variable.h"
#include "core/tensor.h"
#include "dist/process_group.h"
#include "nn/exact_gradients.h"
#include "nn/l1_loss.h"
#include "nn/linear.h"
#include "optim/adamw.h"

namespace seqpar::repro {

enum class PolicyKind { DeepSpeed016, WithMpu, Exact };

struct Policy {
  PolicyKind kind;
  std::string name;     // as given to --policy
  std::string summary;  // one line for the report
};

const std::vector<Policy>& all_policies();
// By --policy name; an unknown name is an error that lists the known ones.
const Policy& policy_named(const std::string& name);

// How the policy splits a replica's rows over the sp ranks: torch.chunk (which can
// give fewer pieces than ranks) or torch.tensor_split (always sp pieces).
bool uses_chunk(const Policy& policy);

// Why this policy cannot run with `rows` rows over `sp` ranks ("" when it can):
// torch.chunk(12001 rows, 4) works, torch.chunk(10, 4) gives 3 pieces for 4 ranks.
std::string cannot_shard_reason(const Policy& policy, int64_t rows, int64_t sp);

// The rows of `batch` that sequence-parallel rank `sp_rank` of `sp` holds (a view).
Tensor shard_rows(const Policy& policy, const Tensor& batch, int64_t sp, int64_t sp_rank);

// The reduction of the rank's L1 loss over its shard of [shard_rows, out_features].
nn::Reduction loss_reduction(const Policy& policy, int64_t replica_rows, int64_t out_features,
                             int64_t dp);

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
