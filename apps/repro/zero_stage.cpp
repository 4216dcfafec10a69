#include "apps/repro/zero_stage.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <memory>
#include <ostream>
#include <sstream>

#include "apps/repro/pitfall.h"
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

ScenarioPlan zero_stage_plan(const ReproConfig& config, const RankData& data, const RankGroups& groups) {
  ScenarioPlan plan;
  const Tensor x = data.inputs;
  const int64_t out = config.out_features;
  plan.baseline = [=](const nn::Linear& model, StepContext& context) {
    context.backward(nn::l1_loss(model.forward(Variable(x)), target_of(x, 0, x.size(0), out),
                                 nn::Reduction::mean()));
  };
  for (const ZeroStageVariant& v : zero_stage_variants(config)) {
    Variant variant;
    variant.name = std::string(loss_convention_name(v.loss)) + " / " +
                   (v.exact ? "exact sums" : gradient_reduction_name(v.reduction));
    variant.backward = variant_step(v.loss, config, data, groups);
    variant.exact = v.exact;
    if (!v.exact) {
      variant.reduce = v.reduction == GradientReduction::SumSpAverageDp ? sum_over_sp_average_over_dp
                                                                        : average_over_all;
    }
    plan.variants.push_back(std::move(variant));
  }
  return plan;
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

std::vector<ZeroStageVariant> zero_stage_variants(const ReproConfig& config) {
  std::vector<GradientReduction> reductions = {GradientReduction::SumSpAverageDp,
                                               GradientReduction::AverageAll};
  if (config.zero_stage >= 0) {
    reductions = {config.zero_stage == 3 ? GradientReduction::AverageAll
                                         : GradientReduction::SumSpAverageDp};
  }
  std::vector<ZeroStageVariant> variants;
  for (LossConvention loss : {LossConvention::LocalMean, LossConvention::GlobalCount,
                              LossConvention::GatherSumBackward, LossConvention::GatherSliceBackward}) {
    for (GradientReduction reduction : reductions) variants.push_back({loss, reduction, false});
  }
  // The global-count loss with its rows summed exactly over sp x dp inside backward.
  variants.push_back({LossConvention::GlobalCount, GradientReduction::SumSpAverageDp, true});
  return variants;
}

void check_zero_stage_config(const ReproConfig& config) {
  SEQPAR_INPUT_CHECK(config.rows % config.sequence_parallel_size == 0,
                     "scenario zero-stage: repro.rows = ", config.rows,
                     " must be a multiple of ds_config.sequence_parallel_size = ",
                     config.sequence_parallel_size, " (the all-gather needs equal shards)");
}

ZeroStageResults run_zero_stage(const RankGroups& groups, const ReproConfig& config, Device device,
                                const std::string& placement) {
  const PitfallScenario scenario{"zero-stage", "", "", check_zero_stage_config, zero_stage_plan};
  const PitfallResults run = run_pitfall(scenario, groups, config, device, placement);
  if (groups.world->rank() != 0) return {};
  ZeroStageResults results;
  results.config = config;
  results.placement = placement;
  results.mesh_layout = groups.mesh_layout;
  results.baseline_norm = run.baseline_norm;
  const std::vector<ZeroStageVariant> variants = zero_stage_variants(config);
  for (size_t i = 0; i < variants.size(); ++i) results.variants.push_back({run.variants[i], variants[i]});
  return results;
}

void print_zero_stage(std::ostream& out, const ZeroStageResults& results) {
  const ReproConfig& c = results.config;
  out << "seqpar-repro scenario zero-stage: the gradient's scale under each ZeRO stage's\n"
         "reduction and each sequence-parallel loss convention, against one rank on all rows\n\n";
  print_run_header(out, c, results.placement, results.mesh_layout);
  out << "  reductions  ZeRO 0-2: gradients summed over sp, averaged over dp; ZeRO-3: averaged\n"
         "              over sp x dp (its reduce-scatter)";
  if (c.zero_stage >= 0) {
    out << "; ds_config.zero_optimization.stage = " << c.zero_stage << " selects " <<
        (c.zero_stage == 3 ? "ZeRO-3's" : "ZeRO 0-2's");
  }
  out << "\n  one-rank baseline: gradient norm " << number_text(results.baseline_norm)
      << " at step 1\n\n";
  out << "  gradient at step 1 / the one-rank gradient (norms; named where it is a mistake's factor):\n";
  // The reductions that ran, in the table's column order.
  std::vector<GradientReduction> columns;
  for (const ZeroStageFigures& f : results.variants) {
    if (f.variant.exact) continue;
    if (std::find(columns.begin(), columns.end(), f.variant.reduction) == columns.end()) {
      columns.push_back(f.variant.reduction);
    }
  }
  std::string header = "  loss convention              ";
  for (const GradientReduction reduction : columns) {
    std::string name = gradient_reduction_name(reduction);
    name.resize(25, ' ');
    header += name;
  }
  while (!header.empty() && header.back() == ' ') header.pop_back();
  out << header << '\n';
  const ZeroStageFigures* exact = nullptr;
  for (size_t i = 0; i < results.variants.size();) {
    const ZeroStageFigures& first = results.variants[i];
    if (first.variant.exact) {
      exact = &first;
      ++i;
      continue;
    }
    std::string row = "  " + std::string(loss_convention_name(first.variant.loss));
    row.resize(31, ' ');
    for (size_t column = 0; column < columns.size(); ++column, ++i) {
      const ZeroStageFigures& f = results.variants[i];
      std::string cell = number_text(f.gradient_scale) + (f.cause.empty() ? "" : " " + f.cause);
      cell.resize(25, ' ');
      row += cell;
    }
    while (!row.empty() && row.back() == ' ') row.pop_back();
    out << row << '\n';
  }
  bool all_agree = true;
  double worst_correct = 0;
  for (const ZeroStageFigures& f : results.variants) {
    all_agree = all_agree && f.ranks_agree;
    if (f.cause.empty() && !f.variant.exact) {
      worst_correct = std::max(worst_correct, f.max_difference);
    }
  }
  if (exact != nullptr) {
    out << "  global row count, exact sums " << number_text(exact->gradient_scale)
        << (exact->equals_baseline ? ", one-rank training bit for bit" : ", NOT bitwise one-rank training: a bug")
        << "\n                               (rows summed exactly over sp x dp inside backward)\n";
  }
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

nlohmann::json zero_stage_json(const ZeroStageResults& results) {
  const ReproConfig& c = results.config;
  nlohmann::json variants = nlohmann::json::array();
  for (const ZeroStageFigures& f : results.variants) {
    variants.push_back({{"loss", loss_convention_name(f.variant.loss)},
                        {"reduction", f.variant.exact ? "exact sums"
                                                      : gradient_reduction_name(f.variant.reduction)},
                        {"equals_baseline", f.equals_baseline},
                        {"gradient_scale", f.gradient_scale},
                        {"cause", f.cause},
                        {"ranks_agree", f.ranks_agree},
                        {"max_difference_from_baseline", f.max_difference},
                        {"seconds_per_step", f.seconds_per_step}});
  }
  return {{"schema", "seqpar-repro-zero-stage/2"},
                               {"sequence_parallel_size", c.sequence_parallel_size},
                               {"data_parallel_size", c.data_parallel_size},
                               {"rows", c.rows},
                               {"in_features", c.in_features},
                               {"out_features", c.out_features},
                               {"steps", c.steps},
                               {"placement", results.placement},
                               {"baseline_gradient_norm", results.baseline_norm},
                               {"variants", variants}};
}

namespace {

class ZeroStageScenario : public Scenario {
 public:
  void check(const ReproConfig& config, const Request& request) const override {
    check_takes_no_policy_or_plot("zero-stage", request);
    SEQPAR_INPUT_CHECK(!request.dump, "--dump: the zero-stage scenario writes no dump");
    check_zero_stage_config(config);
  }

  std::optional<Results> run(const RankGroups& groups, const ReproConfig& config, const Request&,
                             const Placement& placement, Progress*) const override {
    const ZeroStageResults results =
        run_zero_stage(groups, config, placement.device, placement.description);
    if (groups.world->rank() != 0) return std::nullopt;
    std::ostringstream text;
    print_zero_stage(text, results);
    return Results{text.str() + "\n", zero_stage_json(results), {}, "", {}, ""};
  }
};

}  // namespace

const Scenario& zero_stage_scenario() {
  static const ZeroStageScenario scenario;
  return scenario;
}

}  // namespace seqpar::repro
