// Scenario "shifted-targets": next-row targets under sequence parallelism, as a causal
// language model's labels are its inputs shifted by one. Each row's target is the next
// row's leading features (the last row of a replica has none); the `why` below says
// what a shift inside each shard loses.
#include "apps/repro/pitfall.h"

#include "autograd/ops.h"
#include "core/error.h"
#include "nn/l1_loss.h"

namespace seqpar::repro {

namespace {

using autograd::Variable;

// The targets of `count` rows from `first`: the rows from first + 1.
Variable next_rows(const Tensor& x, int64_t first, int64_t count, int64_t out) {
  return target_of(x, first + 1, count, out);
}

ScenarioPlan plan(const ReproConfig& config, const RankData& data, const RankGroups& groups) {
  const Tensor& x = data.inputs;
  const int64_t rows = config.rows, out = config.out_features, dp = config.data_parallel_size;
  const int64_t sp = config.sequence_parallel_size;
  // One rank: every replica's rows but its last have a target.
  const int64_t global_targets = dp * (rows - 1) * out;
  ScenarioPlan plan;
  plan.baseline = [=](const nn::Linear& model, StepContext& context) {
    const Variable y = model.forward(Variable(x));
    Variable loss;
    for (int64_t d = 0; d < dp; ++d) {
      const Variable part =
          nn::l1_loss(autograd::narrow(y, 0, d * rows, rows - 1), next_rows(x, d * rows, rows - 1, out),
                      nn::Reduction::sum_divided_by(global_targets));
      loss = d == 0 ? part : autograd::add(loss, part);
    }
    context.backward(loss);
  };
  const RowRange shard = shard_of(rows, sp, groups.sp_rank);
  const int64_t first = groups.dp_rank * rows + shard.first;
  // This rank's rows but its last `untargeted`, each against the next row.
  const auto shifted = [=](int64_t untargeted, nn::Reduction reduction) {
    return [=](const nn::Linear& model, StepContext& context) {
      const int64_t n = shard.count - untargeted;
      context.backward(nn::l1_loss(model.forward(rows_of(x, first, n)), next_rows(x, first, n, out), reduction));
    };
  };
  // Shifted inside the shard, its last row has no target; shifted before sharding, only
  // the replica's last row. A careful user counts the targets a shard-local shift
  // leaves. DeepSpeed sums over sp and averages over dp, so the pre-shifted loss over
  // the replica's count is the mean over every replica's targets; the exact sums add
  // over sp x dp, so the exact variant divides by every replica's count.
  const auto count = [](int64_t targets) { return nn::Reduction::sum_divided_by(targets); };
  const int64_t pre_shifted = groups.sp_rank == sp - 1 ? 1 : 0;
  plan.variants = {
      {"shard-local shift, mean, averaged", shifted(1, nn::Reduction::mean()), average_over_all, {}, false},
      {"shard-local shift, global count", shifted(1, count((rows - sp) * out)), sum_over_sp_average_over_dp, {},
       false},
      {"pre-shifted, global count", shifted(pre_shifted, count((rows - 1) * out)), sum_over_sp_average_over_dp, {},
       false},
      {"pre-shifted, exact sums", shifted(pre_shifted, count(global_targets)), {}, {}, true},
  };
  plan.notes = {detail::concat("targets     one rank: ", rows - 1, " per replica (row i's target is row i+1's ",
                               "leading ", out, " features);"),
                detail::concat("            shifted inside each of ", sp, " shards: ", rows - sp, " (",
                               sp - 1, " lost at the shard boundaries)")};
  return plan;
}

void check(const ReproConfig& config) {
  SEQPAR_INPUT_CHECK(config.rows >= 2 * config.sequence_parallel_size,
                     "scenario shifted-targets: repro.rows = ", config.rows,
                     " gives a shard fewer than 2 rows over ds_config.sequence_parallel_size = ",
                     config.sequence_parallel_size, " (a shard-local shift would leave it no target)");
}

}  // namespace

const PitfallScenario& shifted_targets_scenario() {
  static const PitfallScenario scenario{
      "shifted-targets",
      "next-row targets, shifted inside each shard or before sharding, against one rank on all rows",
      "a shard holds rows [a, b); shifted inside the shard, row b-1 has no target, although\n"
      "rank r+1 holds its next row b: sp-1 targets per replica vanish, and a shard-local\n"
      "mean weighs each shard's rows by its own count. Shifting the replica's targets\n"
      "before it is cut (pre-shifted labels) gives every row but the last its target, and\n"
      "the global count then makes the sum over sp the one-rank gradient.\n",
      check, plan};
  return scenario;
}

}  // namespace seqpar::repro
