// Scenario "clipping-norms": the norm gradient clipping divides by, under sequence
// parallelism. Every variant combines the gradient correctly (a loss over the global
// row count, summed over sp); they differ only in the norm they clip with: the mean of
// the ranks' partial norms (DeepSpeed 0.16's clip_grad_norm_ over its group), the
// replicated gradient's squares summed over the ranks (the inflation NeMo-RL and
// DeepSpeed fixed), each element once (a rank's slice, as a ZeRO partition holds it),
// and the exact gradient's own norm. With gradient_clipping below the norm, a wrong
// norm changes every step's update.
#include "apps/repro/pitfall.h"

#include <cmath>
#include <memory>

#include "core/error.h"
#include "nn/l1_loss.h"
#include "optim/clip.h"

namespace seqpar::repro {

namespace {

using autograd::Variable;

// sqrt(Σ over the group of each rank's `square`), as a one-element tensor.
Tensor root_of_group_sum(double square, dist::ProcessGroup& group, Device device) {
  Tensor total = Tensor::from_data({1}, {static_cast<float>(square)}, device);
  group.all_reduce(total, dist::ReduceOp::Sum);
  return Tensor::from_data({1}, {static_cast<float>(std::sqrt(static_cast<double>(total.item())))}, device);
}

// The squares of this rank's slice of the flattened gradient: the group's size slices,
// contiguous, in rank order.
double slice_square(const Parameters& parameters, const dist::ProcessGroup& group) {
  const std::vector<float> flat = flat_values(parameters, true);
  const RowRange slice = shard_of(static_cast<int64_t>(flat.size()), group.size(), group.rank());
  double square = 0;
  for (int64_t i = slice.first; i < slice.first + slice.count; ++i) {
    square += double(flat[static_cast<size_t>(i)]) * double(flat[static_cast<size_t>(i)]);
  }
  return square;
}

ScenarioPlan plan(const ReproConfig& config, const RankData& data, const RankGroups& groups) {
  const Tensor& x = data.inputs;
  const int64_t rows = config.rows, out = config.out_features;
  const int64_t global_count = config.data_parallel_size * rows * out;
  const Device device = x.device();
  ScenarioPlan plan;
  plan.baseline = [=](const nn::Linear& model, StepContext& context) {
    const int64_t all = x.size(0);
    context.backward(nn::l1_loss(model.forward(rows_of(x, 0, all)), target_of(x, 0, all, out),
                                 nn::Reduction::sum_divided_by(global_count)));
  };
  const RowRange shard = shard_of(rows, config.sequence_parallel_size, groups.sp_rank);
  const int64_t first = groups.dp_rank * rows + shard.first;
  // Divided by the replica's count for DeepSpeed's sum over sp and average over dp; by
  // every replica's for the exact sums, which add over sp x dp.
  const auto backward = [=](int64_t count) {
    return [=](const nn::Linear& model, StepContext& context) {
      context.backward(nn::l1_loss(model.forward(rows_of(x, first, shard.count)),
                                   target_of(x, first, shard.count, out),
                                   nn::Reduction::sum_divided_by(count)));
    };
  };
  // The mean of the partial gradients' norms is taken before the reduction replaces them.
  auto mean_of_norms = std::make_shared<Tensor>();
  const auto reduce_after_local_norms = [=](const Parameters& parameters, const RankGroups& g) {
    *mean_of_norms = optim::grad_norm(parameters).view({1});
    g.sequence_data_parallel->all_reduce(*mean_of_norms, dist::ReduceOp::Avg);
    sum_over_sp_average_over_dp(parameters, g);
  };
  plan.variants = {
      {"mean of the ranks' partial norms", backward(rows * out), reduce_after_local_norms,
       [=](const Parameters&, const RankGroups&) { return *mean_of_norms; }, false},
      {"replicated gradient, squares summed", backward(rows * out), sum_over_sp_average_over_dp,
       [=](const Parameters& parameters, const RankGroups& g) {
         const double norm = optim::grad_norm(parameters).item();
         return root_of_group_sum(norm * norm, *g.sequence_data_parallel, device);
       },
       false},
      {"each element once (sharded squares)", backward(rows * out), sum_over_sp_average_over_dp,
       [=](const Parameters& parameters, const RankGroups& g) {
         return root_of_group_sum(slice_square(parameters, *g.sequence_data_parallel),
                                  *g.sequence_data_parallel, device);
       },
       false},
      {"exact gradient, its own norm", backward(global_count), {}, {}, true},
  };
  plan.notes = {detail::concat("clipping    at ", config.gradient_clipping,
                               ": every variant's gradient is the one-rank gradient; only the norm differs")};
  return plan;
}

void check(const ReproConfig& config) {
  SEQPAR_INPUT_CHECK(config.gradient_clipping > 0,
                     "scenario clipping-norms: ds_config.gradient_clipping = ", config.gradient_clipping,
                     " turns clipping off, so no norm would matter; set it below the gradient's norm");
  SEQPAR_INPUT_CHECK(config.rows >= config.sequence_parallel_size,
                     "scenario clipping-norms: repro.rows = ", config.rows,
                     " leaves a rank of ds_config.sequence_parallel_size = ",
                     config.sequence_parallel_size, " without rows");
}

}  // namespace

const PitfallScenario& clipping_norms_scenario() {
  static const PitfallScenario scenario{
      "clipping-norms",
      "the norm gradient clipping uses under sequence parallelism, against one rank on all rows",
      "a rank's partial gradient is a sum over its own rows; the mean of those norms is\n"
      "neither the norm of their sum nor a fixed fraction of it (it depends on how the\n"
      "partial gradients point). After the reduction every rank holds the whole gradient:\n"
      "summing its squares over the sp x dp ranks counts each element sp x dp times,\n"
      "sqrt(sp x dp) too large. Each element counted once, by slices or on the replicated\n"
      "gradient, is the one-rank norm.\n",
      check, plan};
  return scenario;
}

}  // namespace seqpar::repro
