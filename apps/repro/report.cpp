#include "apps/repro/report.h"

#include "apps/repro/config_input.h"

#include <cstdio>
#include <algorithm>
#include <iomanip>
#include <set>
#include <sstream>

#include "apps/repro/scenario_list.h"
#include "core/error.h"

namespace seqpar::repro {

namespace {

// Every line after the first indented by `width` spaces, so a block lines up in a column.
std::string indent_lines(const std::string& text, size_t width) {
  std::string out;
  for (char c : text) {
    out += c;
    if (c == '\n') out += std::string(width, ' ');
  }
  while (!out.empty() && (out.back() == ' ' || out.back() == '\n')) out.pop_back();
  return out;
}

std::string without_prefix(const std::string& text, const std::string& prefix) {
  return text.rfind(prefix, 0) == 0 ? text.substr(prefix.size()) : text;
}

}  // namespace

// The config's keys that were accepted without changing the scenario, grouped by why,
// and those a user's config left to the scenario's defaults.
std::string config_notes(const ReproConfig& config) {
  std::vector<std::pair<std::string, std::string>> groups;  // reason, keys
  for (const ConfigNote& note : config.ignored) {
    auto group = std::find_if(groups.begin(), groups.end(),
                              [&](const auto& entry) { return entry.first == note.reason; });
    if (group == groups.end()) group = groups.insert(groups.end(), {note.reason, ""});
    group->second += (group->second.empty() ? "" : ", ") + without_prefix(note.key, "ds_config.");
  }
  std::string out;
  for (const auto& [reason, keys] : groups) {
    out += (out.empty() ? "  ignored     " : "              ") +
           wrap_text(printable(keys) + " (" + printable(reason) + ")", 14, kReportWidth) + "\n";
  }
  if (!config.taken_from_scenario.empty()) {
    // Each "key = value" kept on one line: its spaces are held apart from the wrapping.
    std::string keys;
    for (const std::string& key : config.taken_from_scenario) {
      std::string item = printable(without_prefix(key, "ds_config."));
      std::replace(item.begin(), item.end(), ' ', '\x01');
      keys += (keys.empty() ? "" : ", ") + item;
    }
    std::string text = wrap_text(std::string("by your config, so ") +
                                     scenario_config(config.scenario).file + "'s: " + keys,
                                 14, kReportWidth);
    std::replace(text.begin(), text.end(), '\x01', ' ');
    out += "  not given   " + text + "\n";
  }
  return out;
}

void print_setup(std::ostream& out, const ReproConfig& config, const std::string& placement,
                 const std::string& mesh_layout) {
  out << config_notes(config) << "  placement   " << placement << '\n'
      << "  mesh        " << indent_lines(without_prefix(mesh_layout, "mesh: "), 14) << '\n';
}

namespace {

void print_scenario(std::ostream& out, const RunResults& results) {
  const ReproConfig& c = results.config;
  const auto real = [](double value) { return shortest_float_text(value); };
  out << "seqpar-repro: DeepSpeed issue #6868, sequence-parallel ranks end a step with "
         "different parameters\n\n"
      << "  scenario    "
      << wrap_text(detail::concat("world ", c.world_size(), " = sp ", c.sequence_parallel_size, " x dp ",
                                  c.data_parallel_size, "; ", c.steps, " step(s); x: ", c.rows, " x ",
                                  c.in_features, " rows per replica (seed ", c.seed, "); Linear(",
                                  c.in_features, " -> ", c.out_features, "), L1 against x[:, :",
                                  c.out_features, "]; AdamW lr ", real(c.adamw.lr()), ", betas (",
                                  real(c.adamw.beta1()), ", ", real(c.adamw.beta2()), "), eps ",
                                  real(c.adamw.eps()), ", weight_decay ", real(c.adamw.weight_decay()),
                                  "; gradient_clipping ", real(c.gradient_clipping)),
                   14, kReportWidth)
      << '\n';
  print_setup(out, c, results.placement, results.mesh_layout);
  std::string prints;
  bool identical = true;
  for (size_t rank = 0; rank < results.initial_parameters.size(); ++rank) {
    const uint64_t print = fingerprint(results.initial_parameters[rank]);
    identical = identical && print == fingerprint(results.initial_parameters[0]);
    prints += printf_text(" %zu:%016llx", rank, (unsigned long long)print);
  }
  out << "  initial     " << wrap_text("parameters' fingerprint per rank:" + prints, 14, kReportWidth)
      << (identical ? "\n              identical on every rank: same seed, same calls, same numbers\n"
                    : "\n              NOT identical: the seeding is broken\n");
  const BaselineRun& baseline = results.baseline;
  out << printf_text("\none-rank baseline (all %lld rows): mean loss %.6f, gradient norm "
                       "%.6f, %.2f ms/step\n",
                       (long long)(c.rows * c.data_parallel_size), baseline.losses.front(),
                       baseline.norms.front(), 1e3 * baseline.seconds / double(c.steps));
}

// "0.8287" when every rank used the same norm, else "0.9168 to 0.9233".
std::string norm_range(const std::vector<float>& norms) {
  if (norms.empty()) return "-";
  const auto [low, high] = std::minmax_element(norms.begin(), norms.end());
  if (*low == *high) return printf_text("%.4f", *low);
  return printf_text("%.4f to %.4f", *low, *high);
}

void print_steps(std::ostream& out, const PolicyFigures& figures, double lr) {
  const int64_t steps = static_cast<int64_t>(figures.steps.size());
  const std::vector<int64_t> shown = steps_to_show(steps, figures.first_broken_step);
  out << "        across ranks:                             vs one rank:          gradient norm used\n"
         "  step  max |diff|             params differing   max |diff|  gradient  on the ranks (one rank)\n";
  for (const int64_t step : shown) {
    const StepFigures& s = figures.steps[size_t(step - 1)];
    out << printf_text("  %4lld  %10.3g (%5.2f lr)  %7lld / %-7lld  %10.3g  %8.2g  %s (%.4f)\n",
                         (long long)step, s.max_cross_rank_difference,
                         s.max_cross_rank_difference / lr, (long long)s.differing_parameters,
                         (long long)s.parameter_count, s.max_difference_from_baseline,
                         s.gradient_relative_error, norm_range(s.used_norms).c_str(),
                         s.baseline_norm);
  }
  const int64_t left_out = steps - static_cast<int64_t>(shown.size());
  if (left_out > 0) {
    out << printf_text("  (%lld of %lld rows left out; every step is in --json and the drift "
                         "plot)\n",
                         (long long)left_out, (long long)steps);
  }
  if (figures.broken_condition.empty()) return;  // no steps, no verdict
  if (figures.first_broken_step > 0) {
    out << "  first step with " << figures.broken_condition << ": " << figures.first_broken_step
        << '\n';
  } else {
    out << "  first step with " << figures.broken_condition << ": none in "
        << steps << " step(s)\n";
  }
}

void print_mechanism(std::ostream& out, const PolicyFigures& figures) {
  const LrHistogram& h = figures.steps.front().histogram;
  out << printf_text("  step 1, each rank vs rank 0, |diff| in units of lr:\n"
                       "    0: %lld   (0, 0.5): %lld   ~1: %lld   ~2: %lld   >2.5: %lld\n",
                       (long long)h.identical, (long long)h.below_half, (long long)h.about_one,
                       (long long)h.about_two, (long long)h.beyond);
  const SignAgreement& s = figures.first_step_signs;
  if (s.opposite == 0) return;
  out << printf_text(
      "  why 2 lr: Adam's first step moves a weight by about lr * sign(gradient). Where a rank's\n"
      "  gradient had the opposite sign from rank 0's (%lld pairs), the copies moved apart by\n"
      "  2 lr in %lld of them; where the signs agreed (%lld pairs), %.1f%% ended bitwise equal.\n",
      (long long)s.opposite, (long long)s.opposite_two_lr, (long long)s.same,
      s.same ? 100.0 * double(s.same_identical) / double(s.same) : 0.0);
  out << "  (the report saw the same: 0.0148 on rank 0 vs 0.0150 on rank 1, -0.0137 vs -0.0135)\n";
}

}  // namespace

std::vector<int64_t> steps_to_show(int64_t steps, int64_t also) {
  std::set<int64_t> shown;
  for (int64_t step = 1; step <= std::min<int64_t>(3, steps); ++step) shown.insert(step);
  for (int64_t decade = 1; decade <= steps; decade *= 10) {  // 1, 2, 5, 10, 20, 50, ...
    for (const int64_t factor : {1, 2, 5}) {
      if (decade * factor <= steps) shown.insert(decade * factor);
    }
    if (decade > steps / 10) break;
  }
  if (steps > 0) shown.insert(steps);
  if (also > 0 && also <= steps) shown.insert(also);
  return {shown.begin(), shown.end()};
}

void print_report(std::ostream& out, const RunResults& results) {
  print_scenario(out, results);
  const double lr = results.config.adamw.lr();
  for (const PolicyRun& run : results.policies) {
    const PolicyFigures& policy = run.figures;
    out << '\n' << wrap_text("policy " + policy.policy->name + ": " + policy.policy->summary, 2,
                             kReportWidth)
        << '\n';
    if (!policy.skipped.empty()) {
      out << "  skipped: " << policy.skipped << '\n';
      continue;
    }
    print_steps(out, policy, lr);
    if (policy.verdict == Verdict::RanksDiverge) print_mechanism(out, policy);
    out << printf_text("  %.2f ms/step on rank 0 (and %.2f ms/step gathering and analysing it)\n",
                         1e3 * policy.seconds_per_step, 1e3 * policy.analysis_seconds_per_step);
    out << "  " << wrap_text(std::string("verdict: ") + verdict_name(policy.verdict) + ": " +
                                 policy.verdict_text,
                             4, kReportWidth)
        << '\n';
  }
  out << "\nsummary\n";
  for (const PolicyRun& run : results.policies) {
    out << printf_text("  %-16s %s\n", run.figures.policy->name.c_str(), verdict_name(run.figures.verdict));
  }
}

}  // namespace seqpar::repro
