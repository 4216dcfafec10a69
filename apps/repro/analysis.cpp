#include "apps/repro/analysis.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "apps/common/text.h"
#include "core/error.h"
#include "dist/consistency.h"

namespace seqpar::repro {

namespace {

// ||a - b|| / ||b||, accumulated in double.
double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  double difference = 0, baseline = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    difference += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    baseline += double(b[i]) * b[i];
  }
  return baseline > 0 ? std::sqrt(difference / baseline) : std::sqrt(difference);
}

int64_t count_non_finite(const std::vector<float>& values) {
  int64_t count = 0;
  for (float value : values) count += std::isfinite(value) ? 0 : 1;
  return count;
}

// What seqpar-repro knows, for the shared decision (apps/common/verdict.h): every step
// against the baseline, bit for bit, and the gradient's scale at step 1. It measures no
// clip norm or lr-scaled distance: with the bits at hand, any difference is NotExact.
VerdictEvidence evidence_of(const PolicyFigures& figures) {
  VerdictEvidence evidence;
  evidence.has_baseline = evidence.parameters_bitwise = true;
  GradientEvidence gradient;
  gradient.ratio = figures.gradient_scale;
  gradient.bitwise = true;
  for (const StepFigures& step : figures.steps) {
    evidence.non_finite = evidence.non_finite || step.non_finite_values > 0;
    evidence.ranks_differ = evidence.ranks_differ || step.differing_parameters > 0;
    evidence.parameters_bitwise = evidence.parameters_bitwise && step.parameters_unlike_baseline == 0;
    gradient.bitwise = gradient.bitwise && step.gradients_unlike_baseline == 0;
  }
  evidence.gradient = gradient;
  return evidence;
}

// The first step (1-based) where `broke` holds, 0 when none.
template <typename Condition>
int64_t first_step_where(const std::vector<StepFigures>& steps, Condition broke) {
  for (size_t step = 0; step < steps.size(); ++step) {
    if (broke(steps[step])) return static_cast<int64_t>(step + 1);
  }
  return 0;
}

}  // namespace

double ulps_between(float a, float b) {
  if (bitwise_equal(a, b) || a == b) return 0;
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<double>::infinity();
  const float larger = std::max(std::abs(a), std::abs(b));
  const float ulp = std::nextafter(larger, std::numeric_limits<float>::infinity()) - larger;
  return std::abs(double(a) - double(b)) / ulp;
}

StepFigures figures_of_step(const StepRecord& record, const BaselineStep& baseline, double lr) {
  StepFigures figures;
  figures.parameter_count = static_cast<int64_t>(baseline.parameters.size());
  const std::vector<std::vector<float>>& parameters = record.parameters;
  const std::vector<float>& expected = baseline.parameters;
  for (size_t i = 0; i < expected.size(); ++i) {
    float low = parameters[0][i], high = parameters[0][i];
    bool all_equal = true;
    for (size_t rank = 0; rank < parameters.size(); ++rank) {
      const float value = parameters[rank][i];
      low = std::min(low, value);
      high = std::max(high, value);
      all_equal = all_equal && bitwise_equal(value, parameters[0][i]);
      if (rank > 0) figures.histogram.add(value, parameters[0][i], lr);
      figures.max_difference_from_baseline =
          std::max(figures.max_difference_from_baseline, std::abs(value - expected[i]));
      figures.max_ulps_from_baseline =
          std::max(figures.max_ulps_from_baseline, ulps_between(value, expected[i]));
    }
    figures.max_cross_rank_difference = std::max(figures.max_cross_rank_difference, high - low);
    if (!all_equal) ++figures.differing_parameters;
    if (!bitwise_equal(parameters[0][i], expected[i])) ++figures.parameters_unlike_baseline;
    if (ulps_between(parameters[0][i], expected[i]) > kRoundingUlps) {
      ++figures.parameters_beyond_rounding;
    }
  }
  figures.gradient_relative_error =
      relative_error(record.gradients[0], baseline.gradients);
  for (size_t i = 0; i < expected.size(); ++i) {
    if (!bitwise_equal(record.gradients[0][i], baseline.gradients[i])) {
      ++figures.gradients_unlike_baseline;
    }
  }
  figures.losses = record.losses;
  figures.local_norms = record.local_norms;
  figures.used_norms = record.used_norms;
  figures.baseline_loss = baseline.loss;
  figures.baseline_norm = baseline.norm;
  for (const auto& rank_values : record.parameters) figures.non_finite_values += count_non_finite(rank_values);
  for (const auto& rank_values : record.gradients) figures.non_finite_values += count_non_finite(rank_values);
  figures.non_finite_values += count_non_finite(baseline.parameters) +
                               count_non_finite(baseline.gradients) + count_non_finite(record.losses) +
                               count_non_finite(record.used_norms) +
                               count_non_finite({baseline.loss, baseline.norm});
  return figures;
}

void decide(PolicyFigures& figures, double lr, int sp, int dp) {
  const std::vector<StepFigures>& steps = figures.steps;
  const StepFigures* worst = &steps.front();
  double gradient_error = 0;
  for (const StepFigures& step : steps) {
    if (step.max_cross_rank_difference > worst->max_cross_rank_difference) worst = &step;
    gradient_error = std::max(gradient_error, step.gradient_relative_error);
  }
  const StepFigures& last = steps.back();
  figures.verdict = decide_verdict(evidence_of(figures));
  if (figures.verdict == Verdict::NumericallyInvalid) {
    // Comparisons with NaN are false and inf - inf is NaN: figures from such values would
    // read as agreement. So the first non-finite value ends the analysis.
    figures.broken_condition = "values not finite";
    figures.first_broken_step =
        first_step_where(steps, [](const StepFigures& step) { return step.non_finite_values > 0; });
    figures.verdict_text = printf_text(
        "at step %.0f, %.0f parameters, gradients, losses or norms are inf or NaN (the "
        "training overflowed); no verdict can be drawn from them. Lower the learning rate "
        "or turn gradient clipping on.",
        double(figures.first_broken_step), double(steps[size_t(figures.first_broken_step - 1)].non_finite_values));
  } else if (figures.verdict == Verdict::RanksDiverge) {
    figures.broken_condition = "ranks apart";
    figures.first_broken_step =
        first_step_where(steps, [](const StepFigures& step) { return step.differing_parameters > 0; });
    figures.verdict_text = printf_text(
        "the ranks hold different parameters: up to %.3g apart (%.2f lr) in %.0f parameters. "
        "Each rank stepped on its own shard's gradient; the copies of one model have diverged.",
        worst->max_cross_rank_difference, worst->max_cross_rank_difference / lr,
        double(worst->differing_parameters));
  } else if (figures.verdict == Verdict::WrongGradientScale) {
    figures.broken_condition = "the gradient norm off the baseline's";
    figures.first_broken_step = first_step_where(steps, [](const StepFigures& step) {
      return step.baseline_norm > 0 && scale_is_off(double(step.used_norms[0]) / step.baseline_norm);
    });
    const std::string cause = dist::name_scale(figures.gradient_scale, sp, dp);
    figures.verdict_text = printf_text(
        "the ranks agree bitwise, but the gradient is %.3gx the one-rank gradient", figures.gradient_scale);
    if (!cause.empty()) figures.verdict_text += " (" + cause + ")";
    figures.verdict_text += printf_text(
        ". Adam is nearly blind to a steady scale (max %.3g from one-rank training here); "
        "clipping is not: it acts as if its threshold were %.3gx the configured one.",
        last.max_difference_from_baseline, 1 / figures.gradient_scale);
  } else {
    // Anything short of the same bits is a difference: with exact row sums, summing the
    // rows of several ranks is the same arithmetic as summing them on one.
    figures.broken_condition = "parameters or gradients unlike one-rank training";
    figures.first_broken_step = first_step_where(steps, [](const StepFigures& step) {
      return step.parameters_unlike_baseline > 0 || step.gradients_unlike_baseline > 0;
    });
    if (figures.verdict == Verdict::Identical) {
      figures.verdict_text = printf_text(
          "0 of %.0f parameters differ from one-rank training, bit for bit, at every one of "
          "the %.0f step(s); the ranks agree bitwise.",
          double(last.parameter_count), double(steps.size()));
    } else {
      const StepFigures& first_apart = steps[size_t(figures.first_broken_step - 1)];
      figures.verdict_text = printf_text(
          "the ranks agree bitwise, but from step %.0f on they differ from one-rank training: "
          "%.0f parameters differ (by up to %.3g), ",
          double(figures.first_broken_step), double(first_apart.parameters_unlike_baseline),
          last.max_difference_from_baseline);
      figures.verdict_text += printf_text("the gradient by %.3g (relative).", gradient_error);
    }
  }
}

uint64_t fingerprint(const std::vector<float>& values) {
  uint64_t hash = 1469598103934665603ull;
  const auto* bytes = reinterpret_cast<const unsigned char*>(values.data());
  for (size_t i = 0; i < values.size() * sizeof(float); ++i) {
    hash = (hash ^ bytes[i]) * 1099511628211ull;
  }
  return hash;
}

}  // namespace seqpar::repro
