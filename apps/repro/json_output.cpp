// --json FILE: the report's figures, built as a toml++ table and written with its
// JSON formatter (one library for both formats). Schema: apps/repro/README.md.
#include "third_party/toml.h"

#include <sstream>

#include "apps/repro/report.h"
#include "core/error.h"
#include "core/output_file.h"

namespace seqpar::repro {

namespace {

toml::array numbers(const std::vector<float>& values) {
  toml::array array;
  for (float value : values) array.push_back(double(value));
  return array;
}

toml::table step_table(const StepFigures& s, size_t step) {
  const LrHistogram& h = s.histogram;
  return toml::table{
      {"step", int64_t(step + 1)},
      {"max_cross_rank_difference", double(s.max_cross_rank_difference)},
      {"differing_parameters", s.differing_parameters},
      {"parameters", s.parameter_count},
      {"difference_in_lr_units",
       toml::table{{"identical", h.identical}, {"below_half", h.below_half},
                   {"about_one", h.about_one}, {"about_two", h.about_two}, {"beyond", h.beyond}}},
      {"max_difference_from_reference", double(s.max_difference_from_reference)},
      {"max_ulps_from_reference", s.max_ulps_from_reference},
      {"parameters_beyond_rounding", s.parameters_beyond_rounding},
      {"parameters_unlike_reference", s.parameters_unlike_reference},
      {"gradients_unlike_reference", s.gradients_unlike_reference},
      {"gradient_relative_error", s.gradient_relative_error},
      {"loss_per_rank", numbers(s.losses)},
      {"local_gradient_norm_per_rank", numbers(s.local_norms)},
      {"used_gradient_norm_per_rank", numbers(s.used_norms)},
      {"reference_loss", double(s.reference_loss)},
      {"reference_gradient_norm", double(s.reference_norm)},
  };
}

toml::table policy_table(const PolicyFigures& figures) {
  toml::table table{{"name", figures.policy->name}, {"verdict", verdict_name(figures.verdict)}};
  if (!figures.skipped.empty()) {
    table.insert("skipped", figures.skipped);
    return table;
  }
  toml::array steps;
  for (size_t step = 0; step < figures.steps.size(); ++step) {
    steps.push_back(step_table(figures.steps[step], step));
  }
  const SignAgreement& s = figures.first_step_signs;
  table.insert("verdict_text", figures.verdict_text);
  table.insert("gradient_scale", figures.gradient_scale);
  table.insert("seconds_per_step", figures.seconds_per_step);
  table.insert("broken_condition", figures.broken_condition);
  table.insert("first_broken_step", figures.first_broken_step);
  table.insert("first_step_signs", toml::table{{"opposite", s.opposite},
                                               {"opposite_two_lr", s.opposite_two_lr},
                                               {"same", s.same},
                                               {"same_identical", s.same_identical}});
  table.insert("steps", std::move(steps));
  return table;
}

}  // namespace

void write_json(const std::string& path, const RunResults& results) {
  const ReproConfig& c = results.config;
  toml::array fingerprints;
  for (const auto& parameters : results.initial_parameters) {
    char text[17];
    std::snprintf(text, sizeof text, "%016llx", (unsigned long long)fingerprint(parameters));
    fingerprints.push_back(std::string(text));
  }
  toml::array policies;
  for (const PolicyRun& run : results.policies) policies.push_back(policy_table(run.figures));
  toml::table root{
      {"schema", "seqpar-repro/3"},
      {"world_size", c.world_size()},
      {"sequence_parallel_size", c.sequence_parallel_size},
      {"data_parallel_size", c.data_parallel_size},
      {"rows", c.rows},
      {"steps", c.steps},
      {"lr", c.adamw.lr},
      {"placement", results.placement},
      {"initial_parameter_fingerprints", std::move(fingerprints)},
      {"reference", toml::table{{"losses", numbers(results.reference.losses)},
                                {"gradient_norms", numbers(results.reference.norms)},
                                {"seconds_per_step", results.reference.seconds / double(c.steps)}}},
      {"policies", std::move(policies)},
  };
  std::ostringstream text;
  text << toml::json_formatter{root} << '\n';
  write_output_file(path, text.str());
}

}  // namespace seqpar::repro
