// Scenario issue-6868 (the default): the bug report's run under each gradient policy,
// against one-rank training (scenario.cpp runs it, report.cpp words it). Its outputs:
// the report, --json (the schema in docs/repro.md), the drift picture and its
// series (--plot, 2 steps or more), and --dump (every rank's final state per policy).
#include <cstdio>
#include <memory>
#include <sstream>

#include "apps/common/output_file.h"
#include "apps/common/text.h"
#include "apps/repro/pipeline.h"
#include "apps/repro/report.h"
#include "apps/repro/scenario.h"
#include "core/error.h"

namespace seqpar::repro {

namespace {

using nlohmann::json;

json step_json(const StepFigures& s, size_t step) {
  const LrHistogram& h = s.histogram;
  return {{"step", step + 1},
          {"max_cross_rank_difference", s.max_cross_rank_difference},
          {"differing_parameters", s.differing_parameters},
          {"parameters", s.parameter_count},
          {"difference_in_lr_units",
           {{"identical", h.identical}, {"below_half", h.below_half}, {"about_one", h.about_one},
            {"about_two", h.about_two}, {"beyond", h.beyond}}},
          {"max_difference_from_baseline", s.max_difference_from_baseline},
          {"max_ulps_from_baseline", s.max_ulps_from_baseline},
          {"parameters_beyond_rounding", s.parameters_beyond_rounding},
          {"parameters_unlike_baseline", s.parameters_unlike_baseline},
          {"gradients_unlike_baseline", s.gradients_unlike_baseline},
          {"gradient_relative_error", s.gradient_relative_error},
          {"loss_per_rank", s.losses},
          {"local_gradient_norm_per_rank", s.local_norms},
          {"used_gradient_norm_per_rank", s.used_norms},
          {"baseline_loss", s.baseline_loss},
          {"baseline_gradient_norm", s.baseline_norm}};
}

json policy_json(const PolicyFigures& figures) {
  json policy = {{"name", figures.policy->name}, {"verdict", verdict_name(figures.verdict)}};
  if (!figures.skipped.empty()) {
    policy["skipped"] = figures.skipped;
    return policy;
  }
  const SignAgreement& signs = figures.first_step_signs;
  policy.update({{"verdict_text", figures.verdict_text},
                 {"gradient_scale", figures.gradient_scale},
                 {"seconds_per_step", figures.seconds_per_step},
                 {"analysis_seconds_per_step", figures.analysis_seconds_per_step},
                 {"broken_condition", figures.broken_condition},
                 {"first_broken_step", figures.first_broken_step},
                 {"first_step_signs",
                  {{"opposite", signs.opposite}, {"opposite_two_lr", signs.opposite_two_lr},
                   {"same", signs.same}, {"same_identical", signs.same_identical}}}});
  json steps = json::array();
  for (size_t step = 0; step < figures.steps.size(); ++step) {
    steps.push_back(step_json(figures.steps[step], step));
  }
  policy["steps"] = std::move(steps);
  return policy;
}

// The run as the JSON document; schema 4 renamed the one-rank run "baseline"
// (reference_loss became baseline_loss, and so on).
json results_json(const RunResults& results) {
  const ReproConfig& c = results.config;
  json fingerprints = json::array();
  for (const auto& parameters : results.initial_parameters) {
    char text[17];
    std::snprintf(text, sizeof text, "%016llx", (unsigned long long)fingerprint(parameters));
    fingerprints.push_back(text);
  }
  json policies = json::array();
  for (const PolicyRun& run : results.policies) policies.push_back(policy_json(run.figures));
  return {{"schema", "seqpar-repro/4"},
          {"world_size", c.world_size()},
          {"sequence_parallel_size", c.sequence_parallel_size},
          {"data_parallel_size", c.data_parallel_size},
          {"rows", c.rows},
          {"steps", c.steps},
          {"lr", c.adamw.lr()},
          {"placement", results.placement},
          {"initial_parameter_fingerprints", fingerprints},
          {"baseline",
           {{"losses", results.baseline.losses},
            {"gradient_norms", results.baseline.norms},
            {"seconds_per_step", results.baseline.seconds / double(c.steps)}}},
          {"policies", policies}};
}

// The dump's files, each made as it is written, so the dump is never held whole.
std::vector<DumpFile> dump_files(const std::shared_ptr<const RunResults>& results) {
  const ReproConfig& config = results->config;
  std::vector<DumpFile> files;
  files.push_back({"inputs.safetensors", [results, &config] {
                     NamedTensors inputs = unflatten(results->initial_parameters[0], config, "");
                     inputs.insert(inputs.begin(), {"x", results->inputs});
                     return inputs;
                   }});
  files.push_back({"reference.safetensors", [results, &config] {
                     return parameters_and_gradients(results->baseline.parameters,
                                                     results->baseline.gradients, config);
                   }});
  for (const PolicyRun& run : results->policies) {
    if (!run.figures.skipped.empty()) continue;
    const StepRecord& last = run.last;
    for (size_t rank = 0; rank < last.parameters.size(); ++rank) {
      files.push_back({run.figures.policy->name + "/rank" + std::to_string(rank) + ".safetensors",
                       [results, &last, &config, rank] {
                         return parameters_and_gradients(last.parameters[rank],
                                                         last.gradients[rank], config);
                       }});
    }
  }
  return files;
}

// The drift picture shows how the ranks drift over steps: one step is a point, no picture.
bool draws_plot(const Request& request, const ReproConfig& config) {
  return !request.plot_path.empty() && config.steps > 1;
}

// The CSV beside the picture: drift.svg's is drift.csv. A path without an extension (a
// device such as /dev/stdout) gets none; another extension than .svg is refused.
std::optional<std::string> drift_csv_path(const std::string& plot_path) {
  const std::string svg = ".svg";
  if (plot_path.size() <= svg.size() ||
      plot_path.compare(plot_path.size() - svg.size(), svg.size(), svg) != 0) {
    return std::nullopt;
  }
  return plot_path.substr(0, plot_path.size() - svg.size()) + ".csv";
}

// The picture and its series, and the report's line naming them.
void add_plot(Results& out, const RunResults& results, const Request& request) {
  if (!draws_plot(request, results.config)) {
    if (request.plot_given && !request.plot_path.empty()) {
      out.files_text = "drift picture: none for a single step (--steps 2 or more draws one)\n";
    }
    return;
  }
  out.files.push_back({request.plot_path, drift_svg(results)});
  const auto csv = drift_csv_path(request.plot_path);
  if (csv) out.files.push_back({*csv, drift_csv(results)});
  out.files_text = "drift picture: " + printable(request.plot_path) +
                   (csv ? " (its series: " + printable(*csv) + ")" : "") + "\n";
}

class Issue6868 : public Scenario {
 public:
  void check(const ReproConfig& config, const Request& request) const override {
    if (!draws_plot(request, config)) return;
    if (const auto csv = drift_csv_path(request.plot_path)) check_output_path("--plot", *csv);
  }

  std::optional<Results> run(const RankGroups& groups, const ReproConfig& config,
                             const Request& request, const Placement& placement,
                             Progress* progress) const override {
    std::vector<const Policy*> policies;
    for (const Policy& policy : all_policies()) {
      if (request.policy == "all" || request.policy == policy.name) policies.push_back(&policy);
    }
    auto results = std::make_shared<const RunResults>(
        run_scenario(groups, config, policies, placement.device, placement.description, progress));
    if (groups.world->rank() != 0) return std::nullopt;
    Results out;
    std::ostringstream text;
    print_report(text, *results);
    out.text = text.str() + "\n";
    out.json = results_json(*results);
    if (request.dump) out.dump = dump_files(results);
    out.dump_checker = "scripts/crosscheck.py";
    add_plot(out, *results, request);
    return out;
  }
};

}  // namespace

const Scenario& issue6868_scenario() {
  static const Issue6868 scenario;
  return scenario;
}

}  // namespace seqpar::repro
