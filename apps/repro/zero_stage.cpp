#include "apps/repro/zero_stage.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <iterator>
#include <memory>
#include <ostream>
#include <sstream>

#include "autograd/node.h"
#include "core/error.h"
#include "nn/l1_loss.h"

namespace seqpar::repro {

namespace {

using autograd::Variable;

// y_full = every sp rank's y, stacked in sp-rank order; a differentiable all-gather with
// either of the two backward conventions in use.
class AllGatherRowsBackward : public autograd::Node {
 public:
  AllGatherRowsBackward(std::shared_ptr<dist::ProcessGroup> group, int64_t rows, bool sum)
      : group_(std::move(group)), rows_(rows), sum_(sum) {}

  // The gradient of the gathered rows arrives whole on every rank. Summed: each rank's
  // slice gets the sum over the ranks of their gradients of it (a reduce-scatter sum,
  // PyTorch's convention); sliced: each rank keeps its own (DeepSpeed's).
  std::vector<Tensor> apply(const Tensor& grad_output) override {
    Tensor whole = grad_output.clone();
    if (sum_) group_->all_reduce(whole, dist::ReduceOp::Sum);
    return {whole.narrow(0, group_->rank() * rows_, rows_).clone()};
  }
  std::string name() const override { return sum_ ? "AllGatherSumBackward" : "AllGatherSliceBackward"; }

 private:
  std::shared_ptr<dist::ProcessGroup> group_;
  int64_t rows_;
  bool sum_;
};

Variable all_gather_rows(const Variable& y, const std::shared_ptr<dist::ProcessGroup>& group,
                         bool sum_backward) {
  const Tensor mine = y.data().contiguous();
  Tensor all = Tensor::empty({group->size() * mine.size(0), mine.size(1)}, mine.device());
  group->all_gather(all, mine);
  if (!y.requires_grad()) return Variable(all);
  auto node = std::make_shared<AllGatherRowsBackward>(group, mine.size(0), sum_backward);
  node->add_input(y);
  return Variable::from_op(all, std::move(node));
}

// The rank's loss under `loss`, on its shard of its replica's rows.
StepFunction variant_step(LossConvention loss, const ReproConfig& config, const RankData& data,
                          const RankGroups& groups) {
  const int64_t shard_rows = config.rows / groups.sp;
  const int64_t replica_first = groups.dp_rank * config.rows;
  const int64_t first = replica_first + groups.sp_rank * shard_rows;
  const int64_t out = config.out_features;
  const Tensor x = data.inputs;
  const std::shared_ptr<dist::ProcessGroup> sp_group = groups.sequence_parallel;
  const int64_t global_count = config.data_parallel_size * config.rows * out;
  return [=](const nn::Linear& model, StepContext& context) {
    const Variable y = model.forward(rows_of(x, first, shard_rows));
    const Variable target = target_of(x, first, shard_rows, out);
    switch (loss) {
      case LossConvention::LocalMean:
        return context.backward(nn::l1_loss(y, target, nn::Reduction::mean()));
      case LossConvention::GlobalCount:
        return context.backward(nn::l1_loss(y, target, nn::Reduction::sum_divided_by(global_count)));
      case LossConvention::GatherSumBackward:
      case LossConvention::GatherSliceBackward:
        return context.backward(nn::l1_loss(
            all_gather_rows(y, sp_group, loss == LossConvention::GatherSumBackward),
            target_of(x, replica_first, config.rows, out), nn::Reduction::mean()));
    }
  };
}

// The table's rows, in order.
constexpr LossConvention kLossConventions[] = {LossConvention::LocalMean, LossConvention::GlobalCount,
                                               LossConvention::GatherSumBackward,
                                               LossConvention::GatherSliceBackward};

std::vector<ZeroStageVariant> zero_stage_variants(const ReproConfig& config) {
  // Each loss convention under each reduction (only the one
  // ds_config.zero_optimization.stage selects, when given), then the exact one.
  std::vector<GradientReduction> reductions = {GradientReduction::SumSpAverageDp,
                                               GradientReduction::AverageAll};
  if (config.zero_stage >= 0) {
    reductions = {config.zero_stage == 3 ? GradientReduction::AverageAll
                                         : GradientReduction::SumSpAverageDp};
  }
  std::vector<ZeroStageVariant> variants;
  for (LossConvention loss : kLossConventions) {
    for (GradientReduction reduction : reductions) variants.push_back({loss, reduction, false});
  }
  variants.push_back({LossConvention::GlobalCount, GradientReduction::SumSpAverageDp, true});
  return variants;
}

const char* reduction_name(const ZeroStageVariant& v) {
  return v.exact ? "exact sums" : gradient_reduction_name(v.reduction);
}

ScenarioPlan zero_stage_plan(const ReproConfig& config, const RankData& data, const RankGroups& groups) {
  ScenarioPlan plan;
  const Tensor x = data.inputs;
  const int64_t out = config.out_features;
  plan.baseline = [=](const nn::Linear& model, StepContext& context) {
    context.backward(nn::l1_loss(model.forward(Variable(x)), target_of(x, 0, x.size(0), out),
                                 nn::Reduction::mean()));
  };
  for (const ZeroStageVariant& v : zero_stage_variants(config)) {
    const auto reduce =
        v.reduction == GradientReduction::SumSpAverageDp ? sum_over_sp_average_over_dp : average_over_all;
    plan.variants.push_back({std::string(loss_convention_name(v.loss)) + " / " + reduction_name(v),
                             variant_step(v.loss, config, data, groups), v.exact ? nullptr : reduce, nullptr,
                             v.exact});
  }
  return plan;
}

const PitfallScenario& zero_stage_kit() {
  static const PitfallScenario scenario{"zero-stage", "", "", check_zero_stage_config, zero_stage_plan};
  return scenario;
}

ZeroStageResults zero_stage_results(PitfallResults run) {
  ZeroStageResults results{std::move(run), {}};
  const std::vector<ZeroStageVariant> variants = zero_stage_variants(results.run.config);
  for (size_t i = 0; i < results.run.variants.size(); ++i) {
    results.variants.push_back({results.run.variants[i], variants[i]});
  }
  return results;
}

// --json's document (schema seqpar-repro-zero-stage/2).
nlohmann::json zero_stage_json(const ZeroStageResults& results) {
  nlohmann::json json = run_json(results.run);
  json["schema"] = "seqpar-repro-zero-stage/2";
  for (const ZeroStageFigures& f : results.variants) {
    nlohmann::json variant = figures_json(f);
    variant.update({{"loss", loss_convention_name(f.variant.loss)}, {"reduction", reduction_name(f.variant)}});
    json["variants"].push_back(variant);
  }
  return json;
}

}  // namespace

const char* loss_convention_name(LossConvention loss) {
  switch (loss) {
    case LossConvention::LocalMean: return "local mean";
    case LossConvention::GlobalCount: return "global row count";
    case LossConvention::GatherSumBackward: return "all-gather, sum backward";
    case LossConvention::GatherSliceBackward: return "all-gather, slice backward";
  }
  return "?";
}

const char* gradient_reduction_name(GradientReduction reduction) {
  return reduction == GradientReduction::SumSpAverageDp ? "ZeRO 0-2" : "ZeRO-3";
}

void check_zero_stage_config(const ReproConfig& config) {
  SEQPAR_INPUT_CHECK(config.rows % config.sequence_parallel_size == 0,
                     "scenario zero-stage: repro.rows = ", config.rows,
                     " must be a multiple of ds_config.sequence_parallel_size = ",
                     config.sequence_parallel_size, " (the all-gather needs equal shards)");
}

ZeroStageResults run_zero_stage(const RankGroups& groups, const ReproConfig& config, Device device,
                                const std::string& placement) {
  return zero_stage_results(run_pitfall(zero_stage_kit(), groups, config, device, placement));
}

void print_zero_stage(std::ostream& out, const ZeroStageResults& results) {
  const ReproConfig& c = results.run.config;
  out << "seqpar-repro scenario zero-stage: the gradient's scale under each ZeRO stage's\n"
         "reduction and each sequence-parallel loss convention, against one rank on all rows\n\n";
  print_run_header(out, c, results.run.placement, results.run.mesh_layout);
  out << "  reductions  ZeRO 0-2: gradients summed over sp, averaged over dp; ZeRO-3: averaged\n"
         "              over sp x dp (its reduce-scatter)";
  if (c.zero_stage >= 0) {
    out << "; ds_config.zero_optimization.stage = " << c.zero_stage << " selects " <<
        (c.zero_stage == 3 ? "ZeRO-3's" : "ZeRO 0-2's");
  }
  out << "\n  one-rank baseline: gradient norm " << number_text(results.run.baseline_norm)
      << " at step 1\n\n";
  out << "  gradient at step 1 / the one-rank gradient (norms; named where it is a mistake's factor):\n";
  // A row per loss convention, a column per reduction that ran: the variants come loss
  // by loss, then the exact one.
  const size_t columns = (results.variants.size() - 1) / std::size(kLossConventions);
  const auto cell = [](std::string text, size_t width) {
    text.resize(width, ' ');
    return text;
  };
  const auto print_row = [&](std::string row) {
    while (!row.empty() && row.back() == ' ') row.pop_back();
    out << row << '\n';
  };
  std::string header = cell("  loss convention", 31);
  for (size_t i = 0; i < columns; ++i) {
    header += cell(gradient_reduction_name(results.variants[i].variant.reduction), 25);
  }
  print_row(header);
  for (size_t i = 0; i + 1 < results.variants.size(); i += columns) {
    std::string row = cell("  " + std::string(loss_convention_name(results.variants[i].variant.loss)), 31);
    for (size_t j = i; j < i + columns; ++j) {
      const ZeroStageFigures& f = results.variants[j];
      row += cell(number_text(f.gradient_scale) + (f.cause.empty() ? "" : " " + f.cause), 25);
    }
    print_row(row);
  }
  bool all_agree = true;
  double worst_correct = 0;
  for (const ZeroStageFigures& f : results.variants) {
    all_agree = all_agree && f.ranks_agree;
    if (f.cause.empty() && !f.variant.exact) worst_correct = std::max(worst_correct, f.max_difference);
  }
  const ZeroStageFigures& exact = results.variants.back();
  out << "  global row count, exact sums " << number_text(exact.gradient_scale)
      << (exact.equals_baseline ? ", one-rank training bit for bit" : ", NOT bitwise one-rank training: a bug")
      << "\n                               (rows summed exactly over sp x dp inside backward)\n";
  out << "\n  after " << c.steps << " step(s): the ranks' parameters "
      << (all_agree ? "agree bitwise in every variant (each\n  reduction spans sp x dp)"
                    : "DIFFER in some variant")
      << "; the float32 variants with the right scale are within " << number_text(worst_correct)
      << "\n  of one-rank training (float32 sums in another order)\n\n";
  out << "  why: a local mean is 1/shard of a sum, sp times the global mean's 1/rows, and a\n"
         "  sum-backward all-gather hands each rank sp copies of its slice's gradient; ZeRO\n"
         "  0-2 then adds sp of those, while ZeRO-3's average divides by sp. A loss already\n"
         "  normalized by the global row count (or a slice backward) is right under a sum and\n"
         "  1/sp under ZeRO-3's average.\n";
}

const Scenario& zero_stage_scenario() {
  static const std::unique_ptr<Scenario> scenario = kit_scenario(zero_stage_kit(), [](const PitfallResults& r) {
    const ZeroStageResults results = zero_stage_results(r);
    std::ostringstream text;
    print_zero_stage(text, results);
    return scenario_results(text.str() + "\n", zero_stage_json(results), {});
  });
  return *scenario;
}

}  // namespace seqpar::repro
