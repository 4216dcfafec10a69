#include "apps/repro/pitfall.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <ostream>
#include <sstream>

#include "apps/repro/report.h"
#include "core/elementwise.h"
#include "core/error.h"
#include "dist/consistency.h"
#include "optim/adamw.h"
#include "optim/clip.h"

namespace seqpar::repro {

using autograd::Variable;

StepContext::StepContext(int64_t step, nn::ExactGradients* exact_gradients)
    : step_(step), exact_gradients_(exact_gradients) {}

void StepContext::backward(const Variable& loss) {
  if (exact_gradients_ == nullptr) return loss.backward();
  // Every micro-batch's exact row sums add up in exact_gradients_, unrounded.
  const nn::ExactGradients::Recording recording(*exact_gradients_);
  loss.backward();
}

Variable rows_of(const Tensor& x, int64_t first, int64_t count) {
  return Variable(x.narrow(0, first, count));
}

Variable target_of(const Tensor& x, int64_t first, int64_t count, int64_t out) {
  return Variable(x.narrow(0, first, count).narrow(1, 0, out));
}

RowRange shard_of(int64_t rows, int64_t sp, int64_t sp_rank) {
  const int64_t base = rows / sp, extra = rows % sp;
  return {sp_rank * base + std::min(sp_rank, extra), base + (sp_rank < extra ? 1 : 0)};
}

namespace {

void reduce_over_all(const Parameters& parameters, const RankGroups& groups, dist::ReduceOp op, int divisor) {
  for (const Variable& parameter : parameters) {
    Tensor gradient = parameter.grad();
    groups.sequence_data_parallel->all_reduce(gradient, op);
    if (divisor > 1) mul_(gradient, 1.0f / static_cast<float>(divisor));
  }
}

}  // namespace

void sum_over_sp_average_over_dp(const Parameters& parameters, const RankGroups& groups) {
  reduce_over_all(parameters, groups, dist::ReduceOp::Sum, static_cast<int>(groups.dp));
}
void sum_over_all(const Parameters& parameters, const RankGroups& groups) {
  reduce_over_all(parameters, groups, dist::ReduceOp::Sum, 1);
}
void average_over_all(const Parameters& parameters, const RankGroups& groups) {
  reduce_over_all(parameters, groups, dist::ReduceOp::Avg, 1);
}

std::vector<float> flat_values(const Parameters& parameters, bool gradients) {
  std::vector<float> values;
  for (const Variable& parameter : parameters) {
    const std::vector<float> part = (gradients ? parameter.grad() : parameter.data()).to_vector();
    values.insert(values.end(), part.begin(), part.end());
  }
  return values;
}

double max_difference(const std::vector<float>& a, const std::vector<float>& b, size_t first, size_t last) {
  double difference = 0;
  for (size_t i = first; i < last; ++i) difference = std::fmax(difference, std::fabs(double(a[i]) - double(b[i])));
  return difference;
}

std::string percent_text(double share, int decimals) {
  char text[32];
  std::snprintf(text, sizeof text, "%.*f%%", decimals, 100.0 * share);
  return text;
}

namespace {

// What one training run of a step function gives on this rank.
struct TrainedRun {
  std::vector<float> first_gradient;    // combined, before clipping, at step 1 (weight, bias)
  double first_norm = 0;                // its norm
  double first_clip_norm = 0;           // the norm the step clipped with
  std::vector<float> final_parameters;  // weight, bias
  double seconds = 0;                   // the steps' wall time
};

// Trains a fresh model from `data`'s initial state with `variant` for config.steps
// steps (zero_grad, backward, reduce, clip, AdamW); groups == nullptr: the baseline,
// on this rank alone.
TrainedRun train_variant(const Variant& variant, const ReproConfig& config, const RankData& data,
                         Device device, const RankGroups* groups, Progress* progress) {
  SEQPAR_CHECK(groups != nullptr || (!variant.reduce && !variant.clip_norm && !variant.exact),
               "train_variant: the baseline runs on one rank and combines nothing");
  auto model = make_model(config, data, device);
  const Parameters parameters = model->parameters();
  optim::AdamW optimizer(parameters, config.adamw);
  nn::ExactGradients exact_gradients;
  TrainedRun run;
  for (int64_t step = 0; step < config.steps; ++step) {
    if (progress != nullptr) progress->set_step(variant.name, step, config.steps);
    if (groups != nullptr) groups->world->barrier();
    const auto start = std::chrono::steady_clock::now();
    model->zero_grad();
    StepContext context(step, variant.exact ? &exact_gradients : nullptr);
    variant.backward(*model, context);
    if (variant.exact) {
      // The exact row sums added over every rank of sp x dp as integers, rounded once.
      for (exact::ExactSums* sums : exact_gradients.sums()) {
        groups->sequence_data_parallel->all_reduce_sums(*sums);
      }
      exact_gradients.round_into_grads();
    }
    if (variant.reduce) variant.reduce(parameters, *groups);
    // The combined gradient's norm: what the step clips with unless the variant says
    // otherwise, and a figure at step 1.
    Tensor combined_norm;
    if (!variant.clip_norm || step == 0) combined_norm = optim::grad_norm(parameters);
    const Tensor clip_norm = variant.clip_norm ? variant.clip_norm(parameters, *groups) : combined_norm;
    if (step == 0) {
      run.first_gradient = flat_values(parameters, true);
      run.first_norm = combined_norm.item();
      run.first_clip_norm = clip_norm.item();
    }
    if (config.gradient_clipping > 0) {
      optim::clip_grads_with_norm(parameters, config.gradient_clipping, clip_norm);
    }
    optimizer.step();
    (void)clip_norm.item();  // waits for the device: the step's time is its own
    run.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  run.final_parameters = flat_values(parameters, false);
  return run;
}

NamedTensors run_tensors(const TrainedRun& run, const ReproConfig& config) {
  NamedTensors tensors = parameters_and_gradients(run.final_parameters, run.first_gradient, config);
  tensors.push_back({"clip_norm", Tensor::from_data({1}, {static_cast<float>(run.first_clip_norm)})});
  return tensors;
}

VariantFigures figures_of(const Variant& variant, const TrainedRun& run, const TrainedRun& baseline,
                          const RankGroups& groups) {
  VariantFigures figures;
  figures.name = variant.name;
  figures.exact = variant.exact;
  const auto scale = [&](double value) { return baseline.first_norm > 0 ? value / baseline.first_norm : 1.0; };
  const auto name_scale = [&](double value) {
    return dist::name_scale(value, static_cast<int>(groups.sp), static_cast<int>(groups.dp));
  };
  figures.gradient_scale = scale(run.first_norm);
  figures.cause = name_scale(figures.gradient_scale);
  double error = 0;
  for (size_t e = 0; e < run.first_gradient.size(); ++e) {
    const auto difference = static_cast<float>(double(run.first_gradient[e]) - double(baseline.first_gradient[e]));
    error += double(difference) * double(difference);
  }
  figures.gradient_error = scale(std::sqrt(error));
  figures.clip_norm_scale = scale(run.first_clip_norm);
  figures.clip_cause = name_scale(figures.clip_norm_scale);
  const std::vector<float>& mine = run.final_parameters;
  const std::vector<float>& theirs = baseline.final_parameters;
  figures.equals_baseline = std::memcmp(mine.data(), theirs.data(), mine.size() * sizeof(float)) == 0;
  figures.max_difference = max_difference(mine, theirs, 0, mine.size());
  return figures;
}

}  // namespace

PitfallResults run_pitfall(const PitfallScenario& scenario, const RankGroups& groups,
                           const ReproConfig& config, Device device, const std::string& placement,
                           bool keep_dump, Progress* progress) {
  scenario.check(config);
  if (progress != nullptr) progress->set_phase("drawing the data");
  const RankData data = draw_data(config, device);
  const ScenarioPlan plan = scenario.plan(config, data, groups);
  const bool is_root = groups.world->rank() == 0;
  if (!is_root) progress = nullptr;
  PitfallResults results{scenario.name, scenario.title, scenario.why, config, placement, groups.mesh_layout,
                         0, plan.notes, {}, {}};
  TrainedRun baseline;
  if (is_root) {
    baseline = train_variant(Variant{"one rank", plan.baseline, {}, {}, false}, config, data, device,
                             nullptr, progress);
    results.baseline_norm = baseline.first_norm;
    if (keep_dump) {
      NamedTensors inputs = {{"x", data.inputs}, {"weight", data.initial_weight}, {"bias", data.initial_bias}};
      inputs.insert(inputs.end(), plan.dump_tensors.begin(), plan.dump_tensors.end());
      for (auto& named : inputs) named.second = named.second.to(Device::cpu());
      results.dump.push_back({"inputs.safetensors", std::move(inputs)});
      results.dump.push_back({"reference.safetensors", run_tensors(baseline, config)});
    }
  }
  for (size_t i = 0; i < plan.variants.size(); ++i) {
    const TrainedRun run = train_variant(plan.variants[i], config, data, device, &groups, progress);
    const Tensor mine = Tensor::from_data({static_cast<int64_t>(run.final_parameters.size())},
                                          run.final_parameters);
    dist::ConsistencyChecker checker(groups.world, "world");
    const bool ranks_agree = checker.check(config.steps, {mine.to(device)}).consistent;
    if (!is_root) continue;
    results.variants.push_back(figures_of(plan.variants[i], run, baseline, groups));
    results.variants.back().ranks_agree = ranks_agree;
    results.variants.back().seconds_per_step = run.seconds / static_cast<double>(config.steps);
    if (keep_dump) results.dump.push_back({"variant" + std::to_string(i) + ".safetensors", run_tensors(run, config)});
  }
  return is_root ? results : PitfallResults{};
}

void print_run_header(std::ostream& out, const ReproConfig& c, const std::string& placement,
                      const std::string& mesh_layout) {
  out << "  model       Linear(" << c.in_features << ", " << c.out_features << "), L1 loss; "
      << c.rows << " rows per replica; " << c.steps << " step(s); gradient_clipping "
      << shortest_float_text(c.gradient_clipping) << '\n';
  print_setup(out, c, placement, mesh_layout);
}

void print_pitfall(std::ostream& out, const PitfallResults& results) {
  const ReproConfig& c = results.config;
  out << wrap_text("seqpar-repro scenario " + results.scenario + ": " + results.title, 2, kReportWidth)
      << "\n\n";
  print_run_header(out, c, results.placement, results.mesh_layout);
  for (const std::string& note : results.notes) out << "  " << note << '\n';
  out << "  one-rank baseline: gradient norm " << number_text(results.baseline_norm)
      << " at step 1\n\n";
  // Each column as wide as its widest cell, so the table stays within the report's width.
  std::vector<std::vector<std::string>> rows = {
      {"variant", "gradient", "error", "clip norm", "ranks", "after " + std::to_string(c.steps) + " step(s)"}};
  for (const VariantFigures& f : results.variants) {
    rows.push_back({f.name, number_text(f.gradient_scale) + (f.cause.empty() ? "" : " " + f.cause),
                    number_text(f.gradient_error),
                    number_text(f.clip_norm_scale) + (f.clip_cause.empty() ? "" : " " + f.clip_cause),
                    f.ranks_agree ? "agree" : "DIFFER",
                    f.equals_baseline ? "bitwise equal" : "max |diff| " + number_text(f.max_difference)});
  }
  std::vector<size_t> widths(rows.front().size(), 0);
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  for (const auto& row : rows) {
    std::string line = " ";
    for (size_t i = 0; i < row.size(); ++i) {
      line += " " + row[i] + (i + 1 < row.size() ? std::string(widths[i] - row[i].size() + 1, ' ') : "");
    }
    out << line << '\n';
  }
  out << "\n  gradient, clip norm: rank 0's at step 1 / one rank's on all rows.\n"
         "  error: ||g - g_one_rank|| / ||g_one_rank|| at step 1, rank 0's combined gradient.\n"
         "  after: rank 0's parameters against one-rank training's.\n";
  const bool exact_ok = std::all_of(results.variants.begin(), results.variants.end(), [](const VariantFigures& f) {
    return !f.exact || (f.equals_baseline && f.ranks_agree);
  });
  out << (exact_ok ? "  exact: every rank's and micro-batch's rows added exactly before one rounding\n"
                     "  (docs/numerics.md); one-rank training, bit for bit.\n"
                   : "  exact: NOT bitwise equal to one-rank training, which is a bug.\n");
  std::string why = results.why;
  while (!why.empty() && why.back() == '\n') why.pop_back();
  out << "\n  why: ";
  for (const char ch : why) out << ch << (ch == '\n' ? "  " : "");
  out << '\n';
}

Results scenario_results(std::string text, nlohmann::json json, DumpTensors dump) {
  Results results{std::move(text), std::move(json), {}, "", {}, ""};
  for (auto& [name, tensors] : dump) {
    results.dump.push_back({name, [tensors = std::move(tensors)] { return tensors; }});
  }
  return results;
}

void check_takes_no_policy_or_plot(const std::string& scenario, const Request& request) {
  SEQPAR_INPUT_CHECK(request.policy == "all", "--policy: scenario ", scenario,
                     " runs its own variants, not the policies; leave --policy out");
  SEQPAR_INPUT_CHECK(!request.plot_given || request.plot_path.empty(), "--plot: scenario ",
                     scenario, " draws no drift picture; leave --plot out");
}

nlohmann::json run_json(const PitfallResults& results) {
  const ReproConfig& c = results.config;
  return {{"sequence_parallel_size", c.sequence_parallel_size}, {"data_parallel_size", c.data_parallel_size},
          {"rows", c.rows}, {"in_features", c.in_features}, {"out_features", c.out_features},
          {"steps", c.steps}, {"placement", results.placement}, {"baseline_gradient_norm", results.baseline_norm},
          {"variants", nlohmann::json::array()}};
}

nlohmann::json figures_json(const VariantFigures& f) {
  return {{"gradient_scale", f.gradient_scale}, {"cause", f.cause}, {"ranks_agree", f.ranks_agree},
          {"equals_baseline", f.equals_baseline}, {"max_difference_from_baseline", f.max_difference},
          {"seconds_per_step", f.seconds_per_step}};
}

namespace {

// --json's document (schema seqpar-repro-pitfall/2).
nlohmann::json pitfall_json(const PitfallResults& results) {
  const ReproConfig& c = results.config;
  nlohmann::json json = run_json(results);
  json.update({{"schema", "seqpar-repro-pitfall/2"}, {"scenario", results.scenario},
               {"gradient_accumulation_steps", c.gradient_accumulation_steps},
               {"gradient_clipping", c.gradient_clipping}, {"seed", c.seed}, {"notes", results.notes}});
  for (const VariantFigures& f : results.variants) {
    nlohmann::json variant = figures_json(f);
    variant.update({{"name", f.name}, {"exact", f.exact}, {"gradient_error", f.gradient_error},
                    {"clip_norm_scale", f.clip_norm_scale}, {"clip_cause", f.clip_cause}});
    json["variants"].push_back(variant);
  }
  return json;
}

// A kit scenario as the pipeline runs it.
class KitScenario : public Scenario {
 public:
  KitScenario(const PitfallScenario& scenario, std::function<Results(const PitfallResults&)> own_report)
      : scenario_(scenario), own_report_(std::move(own_report)) {}

  void check(const ReproConfig& config, const Request& request) const override {
    check_takes_no_policy_or_plot(scenario_.name, request);
    SEQPAR_INPUT_CHECK(!own_report_ || !request.dump, "--dump: the ", scenario_.name,
                       " scenario writes no dump");
    scenario_.check(config);
  }

  std::optional<Results> run(const RankGroups& groups, const ReproConfig& config,
                             const Request& request, const Placement& placement,
                             Progress* progress) const override {
    PitfallResults results = run_pitfall(scenario_, groups, config, placement.device,
                                         placement.description, request.dump, progress);
    if (groups.world->rank() != 0) return std::nullopt;
    if (own_report_) return own_report_(results);
    std::ostringstream text;
    print_pitfall(text, results);
    return scenario_results(text.str() + "\n", pitfall_json(results), std::move(results.dump));
  }

 private:
  const PitfallScenario& scenario_;
  std::function<Results(const PitfallResults&)> own_report_;
};

}  // namespace

std::unique_ptr<Scenario> kit_scenario(const PitfallScenario& scenario,
                                       std::function<Results(const PitfallResults&)> own_report) {
  return std::make_unique<KitScenario>(scenario, std::move(own_report));
}

}  // namespace seqpar::repro
