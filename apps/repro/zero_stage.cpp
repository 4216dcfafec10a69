#include "apps/repro/zero_stage.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <ostream>

#include "autograd/node.h"
#include "apps/repro/scenario.h"
#include "core/elementwise.h"
#include "core/error.h"
#include "core/generator.h"
#include "core/output_file.h"
#include "dist/consistency.h"
#include "nn/l1_loss.h"
#include "nn/linear.h"
#include "optim/adamw.h"
#include "optim/clip.h"

namespace seqpar::repro {

namespace {

using autograd::Variable;
using Clock = std::chrono::steady_clock;

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

std::vector<float> flat_parameters(const nn::Linear& model) {
  std::vector<float> values = model.weight().data().to_vector();
  const std::vector<float> bias = model.bias().data().to_vector();
  values.insert(values.end(), bias.begin(), bias.end());
  return values;
}

// Clip (when configured) and step: the same on every path.
Tensor clip_and_step(const std::vector<Variable>& parameters, optim::AdamW& optimizer,
                     double clipping) {
  const Tensor norm = optim::grad_norm(parameters);
  if (clipping > 0) optim::clip_grads_with_norm(parameters, clipping, norm);
  optimizer.step();
  return norm;
}

struct Reference {
  double first_norm = 0;
  std::vector<float> final_parameters;
};

// One rank on every row, the mean loss: what every variant is measured against.
Reference train_reference(const ReproConfig& config, const RankData& data, Device device) {
  auto model = make_model(config, data, device);
  const std::vector<Variable> parameters = model->parameters();
  optim::AdamW optimizer(parameters, config.adamw);
  const Variable x(data.inputs), target(data.inputs.narrow(1, 0, config.out_features));
  Reference reference;
  for (int64_t step = 0; step < config.steps; ++step) {
    model->zero_grad();
    nn::l1_loss(model->forward(x), target, nn::Reduction::mean()).backward();
    const Tensor norm = clip_and_step(parameters, optimizer, config.gradient_clipping);
    if (step == 0) reference.first_norm = norm.item();
  }
  reference.final_parameters = flat_parameters(*model);
  return reference;
}

// One variant on this rank; returns its first reduced gradient norm and its seconds.
struct VariantRun {
  double first_norm = 0, seconds = 0;
  std::vector<float> final_parameters;
};

VariantRun train_variant(const ZeroStageVariant& variant, const RankGroups& groups,
                         const ReproConfig& config, const RankData& data, Device device) {
  auto model = make_model(config, data, device);
  const std::vector<Variable> parameters = model->parameters();
  optim::AdamW optimizer(parameters, config.adamw);
  const int64_t shard_rows = config.rows / groups.sp;
  const Tensor replica = data.inputs.narrow(0, groups.dp_rank * config.rows, config.rows);
  const Tensor shard = replica.narrow(0, groups.sp_rank * shard_rows, shard_rows);
  const Variable x(shard), target(shard.narrow(1, 0, config.out_features));
  const Variable replica_target(replica.narrow(1, 0, config.out_features));
  VariantRun run;
  for (int64_t step = 0; step < config.steps; ++step) {
    groups.world->barrier();
    const auto start = Clock::now();
    model->zero_grad();
    const Variable y = model->forward(x);
    Variable loss;
    switch (variant.loss) {
      case LossConvention::LocalMean:
        loss = nn::l1_loss(y, target, nn::Reduction::mean());
        break;
      case LossConvention::GlobalCount:
        loss = nn::l1_loss(y, target,
                           nn::Reduction::sum_divided_by(config.data_parallel_size * config.rows *
                                                         config.out_features));
        break;
      case LossConvention::GatherSumBackward:
      case LossConvention::GatherSliceBackward:
        loss = nn::l1_loss(all_gather_rows(y, groups.sequence_parallel,
                                           variant.loss == LossConvention::GatherSumBackward),
                           replica_target, nn::Reduction::mean());
        break;
    }
    loss.backward();
    for (const Variable& parameter : parameters) {
      Tensor gradient = parameter.grad();
      if (variant.reduction == GradientReduction::SumSpAverageDp) {
        groups.sequence_data_parallel->all_reduce(gradient, dist::ReduceOp::Sum);
        mul_(gradient, 1.0f / static_cast<float>(groups.dp));
      } else {
        groups.sequence_data_parallel->all_reduce(gradient, dist::ReduceOp::Avg);
      }
    }
    const Tensor norm = clip_and_step(parameters, optimizer, config.gradient_clipping);
    const double norm_value = norm.item();  // waits for the device
    run.seconds += std::chrono::duration<double>(Clock::now() - start).count();
    if (step == 0) run.first_norm = norm_value;
  }
  run.final_parameters = flat_parameters(*model);
  return run;
}

std::string scale_text(double scale) {
  char text[32];
  std::snprintf(text, sizeof text, "%.4g", scale);
  return text;
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

std::vector<ZeroStageVariant> zero_stage_variants() {
  std::vector<ZeroStageVariant> variants;
  for (LossConvention loss : {LossConvention::LocalMean, LossConvention::GlobalCount,
                              LossConvention::GatherSumBackward, LossConvention::GatherSliceBackward}) {
    for (GradientReduction reduction : {GradientReduction::SumSpAverageDp, GradientReduction::AverageAll}) {
      variants.push_back({loss, reduction});
    }
  }
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
  check_zero_stage_config(config);
  const RankData data = draw_data(config, device);
  dist::ProcessGroup& world = *groups.world;
  const bool is_root = world.rank() == 0;
  ZeroStageResults results;
  Reference reference;
  if (is_root) {
    reference = train_reference(config, data, device);
    results.reference_norm = reference.first_norm;
  }
  for (const ZeroStageVariant& variant : zero_stage_variants()) {
    const VariantRun run = train_variant(variant, groups, config, data, device);
    // Every rank's final parameters, to see whether the copies agree.
    const Tensor mine = Tensor::from_data({static_cast<int64_t>(run.final_parameters.size())},
                                          run.final_parameters, device);
    dist::ConsistencyChecker checker(groups.world, "world");
    const dist::ConsistencyReport consistency = checker.check(config.steps, {mine});
    if (!is_root) continue;
    ZeroStageFigures figures;
    figures.variant = variant;
    figures.scale = reference.first_norm > 0 ? run.first_norm / reference.first_norm : 1;
    figures.cause = dist::name_scale(figures.scale, static_cast<int>(groups.sp),
                                     static_cast<int>(groups.dp));
    figures.ranks_agree = consistency.consistent;
    for (size_t i = 0; i < run.final_parameters.size(); ++i) {
      figures.max_difference_from_reference =
          std::max(figures.max_difference_from_reference,
                   std::fabs(double(run.final_parameters[i]) - double(reference.final_parameters[i])));
    }
    figures.seconds_per_step = run.seconds / static_cast<double>(config.steps);
    results.variants.push_back(figures);
  }
  if (!is_root) return {};
  results.config = config;
  results.placement = placement;
  results.mesh_layout = groups.mesh_layout;
  return results;
}

void print_zero_stage(std::ostream& out, const ZeroStageResults& results) {
  const ReproConfig& c = results.config;
  out << "seqpar-repro scenario zero-stage: the gradient's scale under each ZeRO stage's\n"
         "reduction and each sequence-parallel loss convention, against one rank on all rows\n\n";
  out << "  model       Linear(" << c.in_features << ", " << c.out_features << "), L1 loss; "
      << c.rows << " rows per replica; " << c.steps << " step(s); gradient_clipping "
      << c.gradient_clipping << '\n';
  out << "  placement   " << results.placement << '\n';
  out << "  mesh        ";
  std::string layout = results.mesh_layout;
  while (!layout.empty() && layout.back() == '\n') layout.pop_back();
  for (const char c : layout) out << c << (c == '\n' ? "              " : "");
  out << '\n';
  out << "  reductions  ZeRO 0-2: gradients summed over sp, averaged over dp; ZeRO-3: averaged\n"
         "              over sp x dp (its reduce-scatter)\n";
  out << "  one-rank reference: gradient norm " << scale_text(results.reference_norm)
      << " at step 1\n\n";
  out << "  gradient at step 1 / the one-rank gradient (norms; named where it is a mistake's factor):\n";
  char line[256];
  std::snprintf(line, sizeof line, "  %-28s %-24s %-24s\n", "loss convention", "ZeRO 0-2", "ZeRO-3");
  out << line;
  for (size_t i = 0; i + 1 < results.variants.size(); i += 2) {
    auto cell = [](const ZeroStageFigures& f) {
      return scale_text(f.scale) + (f.cause.empty() ? "" : " " + f.cause);
    };
    std::snprintf(line, sizeof line, "  %-28s %-24s %-24s\n",
                  loss_convention_name(results.variants[i].variant.loss),
                  cell(results.variants[i]).c_str(), cell(results.variants[i + 1]).c_str());
    out << line;
  }
  bool all_agree = true;
  double worst_correct = 0;
  for (const ZeroStageFigures& f : results.variants) {
    all_agree = all_agree && f.ranks_agree;
    if (f.cause.empty()) worst_correct = std::max(worst_correct, f.max_difference_from_reference);
  }
  out << "\n  after " << c.steps << " step(s): the ranks' parameters "
      << (all_agree ? "agree bitwise in every variant (each\n  reduction spans sp x dp)"
                    : "DIFFER in some variant")
      << "; the variants with the right scale are within " << scale_text(worst_correct)
      << "\n  of one-rank training (float32 sums in another order; the default scenario's exact\n"
         "  policy makes it 0)\n\n";
  out << "  why: a local mean is 1/shard of a sum, sp times the global mean's 1/rows, and a\n"
         "  sum-backward all-gather hands each rank sp copies of its slice's gradient; ZeRO\n"
         "  0-2 then adds sp of those, while ZeRO-3's average divides by sp. A loss already\n"
         "  normalized by the global row count (or a slice backward) is right under a sum and\n"
         "  1/sp under ZeRO-3's average.\n";
}

void write_zero_stage_json(const std::string& path, const ZeroStageResults& results) {
  const ReproConfig& c = results.config;
  nlohmann::json variants = nlohmann::json::array();
  for (const ZeroStageFigures& f : results.variants) {
    variants.push_back({{"loss", loss_convention_name(f.variant.loss)},
                        {"reduction", gradient_reduction_name(f.variant.reduction)},
                        {"gradient_scale", f.scale},
                        {"cause", f.cause},
                        {"ranks_agree", f.ranks_agree},
                        {"max_difference_from_reference", f.max_difference_from_reference},
                        {"seconds_per_step", f.seconds_per_step}});
  }
  const nlohmann::json root = {{"schema", "seqpar-repro-zero-stage/1"},
                               {"sequence_parallel_size", c.sequence_parallel_size},
                               {"data_parallel_size", c.data_parallel_size},
                               {"rows", c.rows},
                               {"in_features", c.in_features},
                               {"out_features", c.out_features},
                               {"steps", c.steps},
                               {"placement", results.placement},
                               {"reference_gradient_norm", results.reference_norm},
                               {"variants", variants}};
  const std::string text = root.dump(2) + "\n";
  if (path == "-") {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
    return;
  }
  write_output_file(path, text);
}

}  // namespace seqpar::repro
