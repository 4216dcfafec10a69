// Rank 0's parameters and the ranks' gradient carriers against the baseline's (the
// one-rank training): the tolerance derived from lr, and what both sides hold that
// carries the gradient (diagnosis.h).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "apps/diagnose/diagnosis.h"

namespace seqpar::diagnose {

ParameterDistance parameter_distance(const std::vector<float>& parameters, const std::vector<float>& baseline,
                                     const std::optional<double>& lr, Precision precision) {
  ParameterDistance distance;
  distance.elements = int64_t(baseline.size());
  distance.bitwise = std::memcmp(parameters.data(), baseline.data(), baseline.size() * sizeof(float)) == 0;
  for (size_t i = 0; i < baseline.size(); ++i) {
    const double apart = std::abs(double(parameters[i]) - baseline[i]);
    // The spacing of the run's precision at the value, never finer than the float32
    // the values are held in.
    const double ulp = std::max(double(std::abs(std::nextafter(baseline[i], INFINITY) - baseline[i])),
                                ulp_in(precision, baseline[i]));
    const double tolerance = kRoundingUlps * ulp + (lr ? 0.01 * *lr : 0);
    distance.max_difference = std::max(distance.max_difference, apart);
    distance.beyond_tolerance += apart > tolerance ? 1 : 0;
    distance.beyond_two_lr += lr && apart > 2.5 * *lr ? 1 : 0;
  }
  if (lr) distance.max_in_lr = distance.max_difference / *lr;
  return distance;
}

namespace {

// The clipping coefficient a side's moments carry (they hold the gradient after
// clipping, torch's min(1, max / (norm + 1e-6))), when its clip norm and the threshold
// are known; 1 without clipping.
std::optional<double> clip_coefficient(const RankState& state, const Settings& settings) {
  if (settings.clipping && *settings.clipping == 0) return 1.0;
  if (!settings.clipping || !state.clip_norm) return std::nullopt;
  return std::min(1.0, *settings.clipping / (double(*state.clip_norm) + 1e-6));
}

// What the ranks and the baseline both hold that carries the gradient: grad.* on both
// sides, else exp_avg on both, else one side's grad.* against the other's first-step
// exp_avg / (1 - b1). The moments hold the gradient after clipping: it is taken out by
// the side's clip norm where that and the threshold are known, and said otherwise.
struct Compared {
  std::vector<std::vector<float>> ranks;  // [rank][element]
  std::vector<float> baseline;
  std::string from;
};

// One side's gradient carrier: grad.* as saved, or exp_avg with clipping taken out
// (divided by (1 - b1) too when `as_gradient`, to stand beside a grad.*).
struct Carrier {
  const RankState& state;
  bool moments;  // exp_avg, else grad.*
};

std::vector<float> carried(const Carrier& side, const RunFiles& run, const Settings& settings, bool as_gradient,
                           bool& clipping_unknown) {
  if (!side.moments) return side.state.gradients.flat(prefixed("grad.", run.parameter_names));
  std::vector<float> values = side.state.exp_avg.flat(prefixed("exp_avg.", run.parameter_names));
  const std::optional<double> clip = clip_coefficient(side.state, settings);
  clipping_unknown = clipping_unknown || !clip;
  const double divisor = clip.value_or(1) * (as_gradient ? 1 - *settings.beta1 : 1);
  for (float& value : values) value = float(value / divisor);
  return values;
}

bool first_step_moments(const RankState& state, const RunFiles& run, const Settings& settings) {
  return !state.exp_avg.empty() && !state.exp_avg_sq.empty() && settings.beta1 && settings.beta2 &&
         moments_of_first_step(state.exp_avg.flat(prefixed("exp_avg.", run.parameter_names)),
                               state.exp_avg_sq.flat(prefixed("exp_avg_sq.", run.parameter_names)),
                               *settings.beta1, *settings.beta2, settings.precision.precision);
}

std::optional<Compared> comparable_gradients(const RunFiles& run, const Settings& settings, Diagnosis& diagnosis) {
  const RankState& base = *run.baseline;
  const RankState& rank0 = run.ranks[0];
  const bool ranks_grad = !rank0.gradients.empty(), base_grad = !base.gradients.empty();
  bool ranks_moments = !ranks_grad && !rank0.exp_avg.empty(), base_moments = !base_grad && !base.exp_avg.empty();
  if (ranks_grad && !base_grad && !first_step_moments(base, run, settings)) base_moments = false;
  if (base_grad && !ranks_grad && !first_step_moments(rank0, run, settings)) ranks_moments = false;
  if ((!ranks_grad && !ranks_moments) || (!base_grad && !base_moments)) return std::nullopt;
  const bool mixed = ranks_moments != base_moments;  // moments beside a grad.*: as a gradient
  bool clipping_unknown = false;
  Compared compared;
  for (const RankState& rank : run.ranks) {
    compared.ranks.push_back(carried({rank, ranks_moments}, run, settings, mixed, clipping_unknown));
  }
  compared.baseline = carried({base, base_moments}, run, settings, mixed, clipping_unknown);
  const auto name = [](bool moments) { return moments ? std::string("exp_avg") : std::string("grad.*"); };
  compared.from = name(ranks_moments) + (mixed ? " against the baseline's " + name(base_moments) : "");
  if (clipping_unknown) {
    diagnosis.notes.push_back("the moments hold the gradient after clipping; without clip_norm (on the ranks and the "
                              "baseline) and the threshold (--gradient-clipping), clipping that engaged can hide or "
                              "change a scale between them");
  } else if (ranks_moments || base_moments) {
    compared.from += " (clipping taken out by the clip norms)";
  }
  if (ranks_moments && base_moments && !(diagnosis.moments_are_first_step.value_or(false))) {
    diagnosis.notes.push_back("the moments compared are not known to be a first step's: past it, exp_avg mixes "
                              "the steps' gradients, and its ratio is the gradient's scale only if that was steady");
  }
  return compared;
}

}  // namespace

void compare_with_baseline(const RunFiles& run, const Settings& settings, const std::vector<float>& parameters,
                           Diagnosis& diagnosis) {
  diagnosis.baseline_distance =
      parameter_distance(parameters, run.baseline->parameters.flat(run.parameter_names), settings.lr,
                         settings.precision.precision);
  const std::optional<Compared> compared = comparable_gradients(run, settings, diagnosis);
  if (!compared) return;
  const bool agree = compare_ranks(compared->ranks, run.ranks[0].parameters, run.parameter_names).bitwise;
  auto& target = agree ? diagnosis.scale : diagnosis.mean_scale;
  target = scale_against(agree ? compared->ranks[0] : mean_of(compared->ranks), compared->baseline, settings);
  target->from = compared->from;
  if (run.ranks[0].local_gradients.empty() || run.baseline->gradients.empty()) return;
  std::vector<std::vector<float>> local;
  for (const RankState& rank : run.ranks) {
    local.push_back(rank.local_gradients.flat(prefixed("local_grad.", run.parameter_names)));
  }
  diagnosis.local_scale =
      scale_against(mean_of(local), run.baseline->gradients.flat(prefixed("grad.", run.parameter_names)), settings);
  diagnosis.local_scale->from = "local_grad.*";
}

}  // namespace seqpar::diagnose
