#include "apps/repro/policy.h"

#include "core/elementwise.h"
#include "core/error.h"
#include "core/nvtx.h"
#include "optim/clip.h"

namespace seqpar::repro {

bool uses_chunk(const Policy& policy) { return policy.kind != PolicyKind::Exact; }

std::string cannot_shard_reason(const Policy& policy, int64_t rows, int64_t sp) {
  if (!uses_chunk(policy)) return "";
  const int64_t piece = (rows + sp - 1) / sp;
  const int64_t pieces = (rows + piece - 1) / piece;
  if (pieces == sp) return "";
  return detail::concat("torch.chunk splits ", rows, " rows into ", pieces, " pieces of up to ",
                        piece, " for ", sp, " ranks: rank ", pieces,
                        " would have no rows (the report's script would fail with IndexError)");
}

Tensor shard_rows(const Policy& policy, const Tensor& batch, int64_t sp, int64_t sp_rank) {
  const std::string reason = cannot_shard_reason(policy, batch.size(0), sp);
  SEQPAR_CHECK(reason.empty(), policy.name, ": ", reason);
  const std::vector<Tensor> shards = uses_chunk(policy) ? batch.chunk(sp) : batch.tensor_split(sp);
  return shards[static_cast<size_t>(sp_rank)];
}

nn::Reduction loss_reduction(const Policy& policy, int64_t replica_rows, int64_t out_features,
                             int64_t dp) {
  if (policy.kind == PolicyKind::Exact) {
    // Each rank's share of the global batch's mean: summed over sp x dp, it is the
    // mean, with the very scale 1 / (dp * rows * out) that one rank on all rows uses.
    return nn::Reduction::sum_divided_by(dp * replica_rows * out_features);
  }
  return nn::Reduction::mean();  // the report's loss: mean over the rank's own rows
}

PolicyStep::PolicyStep(const Policy& policy, const nn::Linear& model, RankGroups groups,
                       const optim::AdamWOptions& adamw, double gradient_clipping)
    : policy_(policy),
      parameters_(model.parameters()),
      groups_(std::move(groups)),
      optimizer_(parameters_, adamw),
      gradient_clipping_(gradient_clipping) {}

void PolicyStep::backward(const autograd::Variable& loss) {
  if (policy_.kind != PolicyKind::Exact) return loss.backward();
  // Linear's dW and db also keep their exact, unrounded row sums in exact_gradients_,
  // for synchronize_gradients to add across ranks before the one rounding.
  const nn::ExactGradients::Recording recording(exact_gradients_);
  loss.backward();
}

void PolicyStep::broadcast_parameters() {
  dist::ProcessGroup& group = policy_.kind == PolicyKind::DeepSpeed016
                                  ? *groups_.data_parallel
                                  : *groups_.sequence_data_parallel;
  for (const autograd::Variable& parameter : parameters_) {
    Tensor values = parameter.data();
    group.broadcast(values, 0);
  }
}

// The heart of the bug and of its fixes: which ranks' partial gradients are added up.
void PolicyStep::synchronize_gradients() {
  SEQPAR_NVTX_RANGE("synchronize gradients");
  switch (policy_.kind) {
    case PolicyKind::DeepSpeed016:
      for (const autograd::Variable& parameter : parameters_) {
        Tensor gradient = parameter.grad();
        // The mesh's dp group: with dp = 1 a group of one, so this adds nothing.
        groups_.data_parallel->all_reduce(gradient, dist::ReduceOp::Sum);
        mul_(gradient, static_cast<float>(groups_.sp) / static_cast<float>(groups_.dp));
      }
      break;
    case PolicyKind::WithMpu:
      for (const autograd::Variable& parameter : parameters_) {
        Tensor gradient = parameter.grad();
        groups_.sequence_data_parallel->all_reduce(gradient, dist::ReduceOp::Sum);
        mul_(gradient, 1.0f / static_cast<float>(groups_.dp));
      }
      break;
    case PolicyKind::Exact:
      // Each rank's loss is its share of the global batch's mean, and backward kept the
      // exact sums over its rows. Adding those digits over every rank of sp x dp (an
      // integer all-reduce) gives the exact sums over all rows; rounding them once gives
      // one-rank training's gradient, bit for bit.
      for (exact::ExactSums* sums : exact_gradients_.sums()) {
        groups_.sequence_data_parallel->all_reduce_sums(*sums);
      }
      exact_gradients_.round_into_grads();
      break;
  }
}

Tensor PolicyStep::clip_norm() {
  SEQPAR_NVTX_RANGE("clip");
  Tensor norm = optim::grad_norm(parameters_);
  if (policy_.kind == PolicyKind::DeepSpeed016) {
    // DeepSpeed 0.16 averages the norm over the same group it reduced over.
    groups_.data_parallel->all_reduce(norm, dist::ReduceOp::Avg);
  }
  if (gradient_clipping_ > 0) optim::clip_grads_with_norm(parameters_, gradient_clipping_, norm);
  return norm;
}

StepNorms PolicyStep::step() {
  SEQPAR_NVTX_RANGE("optimizer step");
  StepNorms norms;
  norms.local = optim::grad_norm(parameters_);
  synchronize_gradients();
  norms.used = clip_norm();
  optimizer_.step();
  return norms;
}

}  // namespace seqpar::repro
