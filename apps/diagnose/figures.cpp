// The figures of a diagnosis, each from the tensors it needs (diagnosis.h).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "apps/diagnose/diagnosis.h"
#include "dist/consistency.h"

namespace seqpar::diagnose {

namespace {

bool bitwise_equal(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

double norm_of(const std::vector<float>& values) {
  double square = 0;
  for (float value : values) square += double(value) * value;
  return std::sqrt(square);
}

// Adam's first-step direction for one element: g / (|g| + eps), about sign(g).
double first_step_direction(float gradient, double eps) {
  return double(gradient) / (std::abs(double(gradient)) + eps);
}

}  // namespace

// Adam's moments after one step are m = (1-b1) g and v = (1-b2) g^2, so
// v = (1-b2)/(1-b1)^2 m^2 element by element; later steps mix in older gradients. Each
// side carries a few roundings in the run's precision (m: the product and its storage,
// so m^2 four; v: three), far fewer than kRoundingUlps units in the last place (32 u),
// the tolerance; a later step's gradient moves v off the relation by far more.
bool moments_of_first_step(const std::vector<float>& m, const std::vector<float>& v, double b1, double b2,
                           Precision precision) {
  const double factor = (1 - b2) / ((1 - b1) * (1 - b1));
  const double tolerance = kRoundingUlps * 2 * unit_roundoff(coarser(precision, Precision::Float32));
  for (size_t i = 0; i < m.size(); ++i) {
    const double expected = factor * double(m[i]) * m[i];
    if (std::abs(double(v[i]) - expected) > tolerance * expected + 1e-30) return false;
  }
  return true;
}


Agreement compare_ranks(const std::vector<std::vector<float>>& values, const TensorSet& layout,
                        const std::vector<std::string>& names) {
  Agreement agreement;
  size_t offset = 0;
  for (const std::string& name : names) {
    const StoredTensor& tensor = *layout.find(name);
    TensorDifference difference{name, tensor.shape, 0, int64_t(tensor.values.size()), 0, -1, {}};
    for (size_t i = offset; i < offset + tensor.values.size(); ++i) {
      float low = values[0][i], high = values[0][i];
      bool equal = true;
      for (const auto& rank : values) {
        low = std::min(low, rank[i]);
        high = std::max(high, rank[i]);
        equal = equal && bitwise_equal(rank[i], values[0][i]);
      }
      if (equal) continue;
      ++difference.differing;
      difference.max_difference = std::max(difference.max_difference, double(high) - double(low));
      if (difference.first >= 0) continue;
      difference.first = int64_t(i - offset);
      for (size_t rank = 1; rank < values.size(); ++rank) {
        if (!bitwise_equal(values[rank][i], values[0][i])) difference.ranks_unlike_rank0.push_back(int(rank));
      }
    }
    offset += tensor.values.size();
    agreement.elements += difference.elements;
    if (difference.differing == 0) continue;
    agreement.bitwise = false;
    agreement.differing += difference.differing;
    agreement.max_difference = std::max(agreement.max_difference, difference.max_difference);
    agreement.tensors.push_back(std::move(difference));
  }
  for (size_t rank = 0; rank < values.size(); ++rank) {
    bool placed = false;
    for (auto& group : agreement.groups) {
      const auto& first = values[size_t(group[0])];
      if (std::memcmp(first.data(), values[rank].data(), first.size() * sizeof(float)) == 0) {
        group.push_back(int(rank));
        placed = true;
        break;
      }
    }
    if (!placed) agreement.groups.push_back({int(rank)});
  }
  return agreement;
}

FirstStepRule check_first_step(const RunFiles& run, const Settings& settings,
                               const std::vector<std::vector<float>>& gradients) {
  const double lr = *settings.lr, eps = settings.eps.value_or(1e-8);
  const double tolerance = 0.01 * lr;
  std::vector<std::vector<float>> parameters;
  for (const RankState& rank : run.ranks) parameters.push_back(rank.parameters.flat(run.parameter_names));
  FirstStepRule rule;
  for (size_t r = 1; r < parameters.size(); ++r) {
    for (size_t i = 0; i < parameters[0].size(); ++i) rule.histogram.add(parameters[r][i], parameters[0][i], lr);
  }
  const LrHistogram& h = rule.histogram;
  const int64_t moved = h.about_one + h.about_two + h.beyond;
  rule.two_lr_signature = h.about_two > 0 && h.beyond == 0 && h.about_two >= 0.9 * double(moved);
  if (!gradients.empty()) {
    rule.signs = signs_of_first_step(parameters, gradients, lr);
    for (size_t r = 1; r < parameters.size(); ++r) {
      for (size_t i = 0; i < parameters[0].size(); ++i) {
        const double predicted =
            -lr * (first_step_direction(gradients[r][i], eps) - first_step_direction(gradients[0][i], eps));
        ++rule.rule_pairs;
        if (std::abs(double(parameters[r][i]) - parameters[0][i] - predicted) <= tolerance) ++rule.rule_matching;
      }
    }
  }
  if (run.initial) {
    const std::vector<float> initial = run.initial->flat(run.parameter_names);
    const double decay = 1 - lr * settings.weight_decay.value_or(0);
    for (size_t r = 0; r < parameters.size(); ++r) {
      for (size_t i = 0; i < initial.size(); ++i) {
        const double update = double(parameters[r][i]) - initial[i] * decay;
        const double expected = gradients.empty() ? lr : lr * std::abs(first_step_direction(gradients[r][i], eps));
        ++rule.update_elements;
        if (std::abs(std::abs(update) - expected) <= tolerance || std::abs(update) <= tolerance) ++rule.update_matching;
      }
    }
  }
  return rule;
}

ScaleFigure scale_against(const std::vector<float>& gradient, const std::vector<float>& baseline,
                          const Settings& settings) {
  ScaleFigure figure;
  const double baseline_norm = norm_of(baseline), norm = norm_of(gradient);
  if (baseline_norm == 0 || norm == 0) {
    // No ratio through a zero: the side that is all zeros is named instead.
    figure.zero = norm == baseline_norm ? "both gradients" : norm == 0 ? "the ranks' gradient" : "the baseline's gradient";
    figure.ratio = figure.relative_error = figure.direction_error = std::nan("");
    for (size_t i = 0; i < baseline.size(); ++i) figure.unlike_reference += bitwise_equal(gradient[i], baseline[i]) ? 0 : 1;
    return figure;
  }
  figure.ratio = norm / baseline_norm;
  if (settings.sp > 0) figure.cause = dist::name_scale(figure.ratio, settings.sp, std::max(settings.dp, 1));
  double apart = 0, off_direction = 0;
  for (size_t i = 0; i < baseline.size(); ++i) {
    apart += std::pow(double(gradient[i]) - baseline[i], 2);
    off_direction += std::pow(double(gradient[i]) / figure.ratio - baseline[i], 2);
    if (!bitwise_equal(gradient[i], baseline[i])) ++figure.unlike_reference;
  }
  figure.relative_error = std::sqrt(apart) / baseline_norm;
  figure.direction_error = std::sqrt(off_direction) / baseline_norm;
  return figure;
}

std::vector<float> mean_of(const std::vector<std::vector<float>>& values) {
  std::vector<double> sum(values[0].size(), 0);
  for (const auto& rank : values) {
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += rank[i];
  }
  std::vector<float> mean(sum.size());
  for (size_t i = 0; i < sum.size(); ++i) mean[i] = float(sum[i] / double(values.size()));
  return mean;
}

std::vector<std::string> prefixed(const std::string& prefix, const std::vector<std::string>& names) {
  std::vector<std::string> result;
  for (const std::string& name : names) result.push_back(prefix + name);
  return result;
}

namespace {

NormFigures norm_figures(const RunFiles& run, const Settings& settings,
                         const std::vector<std::vector<float>>& gradients) {
  NormFigures norms;
  for (const RankState& rank : run.ranks) norms.clip_norms.push_back(*rank.clip_norm);
  for (const auto& gradient : gradients) norms.gradient_norms.push_back(norm_of(gradient));
  for (float norm : norms.clip_norms) norms.ranks_agree = norms.ranks_agree && bitwise_equal(norm, norms.clip_norms[0]);
  const int sp = std::max(settings.sp, 1), dp = std::max(settings.dp, 1);
  const auto close = [](double a, double b) { return std::abs(a - b) <= 1e-4 * std::abs(b); };
  if (!gradients.empty()) {
    norms.own_gradient_norms = !norms.ranks_agree;
    for (size_t r = 0; r < gradients.size(); ++r) {
      norms.own_gradient_norms = norms.own_gradient_norms && close(norms.clip_norms[r], norms.gradient_norms[r]);
    }
    norms.to_gradient = norms.gradient_norms[0] > 0 ? norms.clip_norms[0] / norms.gradient_norms[0] : std::nan("");
    norms.to_gradient_cause = dist::name_scale(norms.to_gradient, sp, dp);
  }
  if (!run.ranks[0].local_gradients.empty()) {
    double sum = 0;
    for (const RankState& rank : run.ranks) sum += norm_of(rank.local_gradients.flat(prefixed("local_grad.", run.parameter_names)));
    norms.mean_of_local_norms = sum / double(run.ranks.size());
    norms.mean_of_partials = run.ranks.size() > 1 && close(norms.clip_norms[0], *norms.mean_of_local_norms);
  }
  if (run.baseline && !run.baseline->gradients.empty()) {
    std::vector<std::string> names;
    for (const std::string& name : run.parameter_names) names.push_back("grad." + name);
    norms.reference_norm = norm_of(run.baseline->gradients.flat(names));
  } else if (run.baseline && run.baseline->clip_norm) {
    norms.reference_norm = *run.baseline->clip_norm;
  }
  if (norms.reference_norm && *norms.reference_norm > 0) {
    norms.to_reference = norms.clip_norms[0] / *norms.reference_norm;
    norms.to_reference_cause = dist::name_scale(*norms.to_reference, sp, dp);
  }
  return norms;
}

int64_t count_non_finite(const RunFiles& run) {
  int64_t count = 0;
  const auto add = [&](const TensorSet& set) {
    for (const StoredTensor& tensor : set.tensors) {
      for (float value : tensor.values) count += std::isfinite(value) ? 0 : 1;
    }
  };
  const auto add_state = [&](const RankState& state) {
    for (const TensorSet* set : {&state.parameters, &state.gradients, &state.local_gradients, &state.exp_avg,
                                 &state.exp_avg_sq}) {
      add(*set);
    }
    if (state.clip_norm && !std::isfinite(*state.clip_norm)) ++count;
  };
  for (const RankState& rank : run.ranks) add_state(rank);
  if (run.baseline) add_state(*run.baseline);
  if (run.initial) add(*run.initial);
  return count;
}

// Each rank's gradient: as saved, else recovered from a first step's moments (m / (1-b1)).
struct RankGradients {
  std::vector<std::vector<float>> values;  // [rank][element]; empty when none
  std::string from;                        // where they came from
  std::optional<bool> moments_are_first_step;
};

RankGradients gradients_of(const RunFiles& run, const Settings& settings, Diagnosis& diagnosis) {
  RankGradients gradients;
  const RankState& first = run.ranks[0];
  if (!first.gradients.empty()) {
    for (const RankState& rank : run.ranks) gradients.values.push_back(rank.gradients.flat(prefixed("grad.", run.parameter_names)));
    gradients.from = "grad.*";
  }
  if (first.exp_avg.empty() || first.exp_avg_sq.empty()) return gradients;
  if (!settings.beta1 || !settings.beta2) {
    diagnosis.notes.push_back("exp_avg and exp_avg_sq were given but not the betas (--betas or a ds_config): not used");
    return gradients;
  }
  bool first_step = true;
  std::vector<std::vector<float>> recovered;
  for (const RankState& rank : run.ranks) {
    const auto m = rank.exp_avg.flat(prefixed("exp_avg.", run.parameter_names));
    const auto v = rank.exp_avg_sq.flat(prefixed("exp_avg_sq.", run.parameter_names));
    first_step = first_step && moments_of_first_step(m, v, *settings.beta1, *settings.beta2,
                                                     settings.precision.precision);
    recovered.emplace_back();
    for (float value : m) recovered.back().push_back(float(value / (1 - *settings.beta1)));
  }
  gradients.moments_are_first_step = first_step;
  if (gradients.values.empty() && first_step) {
    gradients.values = std::move(recovered);
    gradients.from = "exp_avg / (1 - beta1)";
  }
  return gradients;
}

}  // namespace

Tolerances tolerances_of(const Settings& settings, const std::optional<AttentionFigures>& attention) {
  Tolerances t;
  t.precision = settings.precision.precision;
  const int64_t sequence = attention ? attention->rows_per_shard * attention->sp : 0;
  if (settings.tokens) {
    t.tokens = *settings.tokens;
  } else if (sequence > 0) {
    t.tokens = sequence * attention->sequences;  // the baseline saw the whole batch
  } else {
    t.tokens = kAssumedTokens;
    t.tokens_assumed = true;
  }
  t.sequence = sequence > 0 ? sequence : t.tokens;
  t.sequence_known = sequence > 0;
  t.gradient = gradient_bound(t.precision, t.tokens, t.sequence);
  // A ratio of norms errs by no more than the difference of the vectors (the triangle
  // inequality): the gradient's bound covers it; kScaleRounding stays the floor, the
  // distance at which seqpar-repro calls a float32 gradient scaled.
  t.scale = std::max(kScaleRounding, t.gradient);
  return t;
}

Diagnosis diagnose(const RunFiles& run, const Settings& settings) {
  if (run.parameter_names.empty()) return diagnose_attention_only(run, settings);
  Diagnosis diagnosis;
  diagnosis.ranks = int(run.ranks.size());
  diagnosis.non_finite = count_non_finite(run);
  const TensorSet& layout = run.ranks[0].parameters;
  std::vector<std::vector<float>> parameters;
  for (const RankState& rank : run.ranks) parameters.push_back(rank.parameters.flat(run.parameter_names));
  diagnosis.parameters = compare_ranks(parameters, layout, run.parameter_names);
  const RankGradients saved = gradients_of(run, settings, diagnosis);
  const std::vector<std::vector<float>>& gradients = saved.values;
  if (!gradients.empty()) diagnosis.gradients = compare_ranks(gradients, layout, run.parameter_names);
  if (settings.lr && run.ranks.size() > 1) {
    diagnosis.first_step = check_first_step(run, settings, gradients);
  }
  diagnosis.moments_are_first_step = saved.moments_are_first_step;
  diagnosis.gradients_from = saved.from;
  if (run.baseline) compare_with_baseline(run, settings, parameters[0], diagnosis);
  if (run.ranks[0].clip_norm) diagnosis.norms = norm_figures(run, settings, gradients);
  if (run.ranks.size() > 1) {
    diagnosis.layout = explain_layout(diagnosis.parameters.groups, settings.sp, std::max(settings.dp, 1));
  }
  compare_attention(run, settings, diagnosis);
  diagnosis.tolerances = tolerances_of(settings, diagnosis.attention);
  decide(diagnosis);
  gather_evidence(diagnosis, run, settings);
  attention_evidence(diagnosis, run, settings);
  return diagnosis;
}

}  // namespace seqpar::diagnose
