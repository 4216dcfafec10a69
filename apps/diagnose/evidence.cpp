// The evidence lines of a diagnosis: each check the verdict could rest on, what it
// showed, or why the files given could not support it and what to save to make it.
#include <cmath>

#include "apps/diagnose/diagnosis.h"

namespace seqpar::diagnose {

namespace {

void add(Diagnosis& diagnosis, const std::string& check, bool checked, const std::string& text) {
  diagnosis.evidence.push_back({check, checked, text});
}

void ranks_evidence(Diagnosis& d, const RunFiles& run) {
  if (d.ranks == 1) {
    add(d, "agreement between ranks", false, "one rank's file: give every rank's (--ranks 'model_rank*.safetensors')");
    return;
  }
  add(d, "agreement between ranks", true,
      d.parameters.bitwise ? "parameters bitwise equal on all " + std::to_string(d.ranks) + " ranks"
                           : std::to_string(d.parameters.differing) + " of " + std::to_string(d.parameters.elements) +
                                 " parameter elements differ, by up to " + number_text(d.parameters.max_difference));
  if (d.gradients) {
    add(d, "gradients between ranks", true,
        (d.gradients->bitwise ? "bitwise equal (" : std::to_string(d.gradients->differing) + " elements differ (") +
            d.gradients_from + ")");
  } else {
    add(d, "gradients between ranks", false,
        run.ranks[0].exp_avg.empty() ? "save grad.* on each rank (or exp_avg and exp_avg_sq)"
                                     : "the moments are not a first step's, or the betas are unknown: save grad.*");
  }
}

void first_step_evidence(Diagnosis& d, const Settings& settings) {
  if (d.ranks == 1 || d.parameters.bitwise) return;
  if (!d.first_step) {
    add(d, "Adam's first-step rule (2 lr)", false, "no lr: give --lr or --ds-config");
    return;
  }
  const FirstStepRule& rule = *d.first_step;
  std::string text = rule.two_lr_signature ? "the differences are 0 or about 2 lr" : "no 2 lr signature";
  if (rule.rule_pairs > 0) {
    text += "; the rule predicts " + std::to_string(rule.rule_matching) + " of " + std::to_string(rule.rule_pairs) +
            " differences";
  }
  add(d, "Adam's first-step rule (2 lr)", true, text + " (lr " + number_text(*settings.lr) + ")");
}

void baseline_evidence(Diagnosis& d, const RunFiles& run, const Settings& settings) {
  if (!d.baseline_distance) {
    add(d, "parameters against one-rank training", false,
        "give the baseline's parameters after the same step (--baseline, one process on the whole batch)");
  } else {
    const ParameterDistance& p = *d.baseline_distance;
    std::string text = p.bitwise ? "bitwise equal" : "within " + number_text(p.max_difference);
    if (!p.bitwise && p.max_in_lr) {
      text += " (" + number_text(*p.max_in_lr) + " lr); " + std::to_string(p.beyond_tolerance) + " of " +
              std::to_string(p.elements) + " elements beyond rounding (16 ulps of " +
              precision_name(d.tolerances.precision) + " plus 1% of lr)";
    } else if (!p.bitwise) {
      text += "; no lr (--lr), so no tolerance: whether that is rounding is not judged";
    }
    add(d, "parameters against one-rank training", true, text);
  }
  const ScaleFigure* scale = d.scale ? &*d.scale : d.mean_scale ? &*d.mean_scale : nullptr;
  if (scale && !scale->zero.empty()) {
    add(d, "gradient scale", true, scale->zero + " (" + scale->from + ") all zeros: no ratio formed");
  } else if (scale) {
    add(d, "gradient scale", true, number_text(scale->ratio) + "x the baseline's" +
        (scale->cause.empty() ? "" : " (" + scale->cause + ")") + ", direction to " + number_text(scale->direction_error) +
        " (from " + scale->from + ")");
  } else {
    const bool ranks_carry = !run.ranks[0].gradients.empty() || !run.ranks[0].exp_avg.empty();
    const bool base_carries = run.baseline && (!run.baseline->gradients.empty() || !run.baseline->exp_avg.empty());
    std::string why = !run.baseline ? "give --baseline with grad.* or exp_avg"
                      : !ranks_carry ? "save grad.* or exp_avg on the ranks"
                      : !base_carries ? "save grad.* or exp_avg in the baseline"
                                      : "the ranks and the baseline carry different kinds: save grad.* on both";
    if (d.norms && d.norms->to_reference) why += "; the clip norms compare the gradients' norms instead";
    else if (d.baseline_distance) why += "; after Adam's first step a steady x k is nearly invisible in the parameters";
    add(d, "gradient scale", false, why);
  }
  if (d.moments_are_first_step) {
    add(d, "first step or later (moments)", true,
        *d.moments_are_first_step ? "a first step's moments: exp_avg = (1 - b1) g"
                                  : "past the first step: exp_avg mixes the steps' gradients, so its ratio is the "
                                    "gradient's scale only if the scale was steady");
  } else if (!run.ranks[0].exp_avg.empty() && !(settings.beta1 && settings.beta2)) {
    add(d, "first step or later (moments)", false, "no betas: give --betas or --ds-config");
  }
}

void clip_evidence(Diagnosis& d, const Settings& settings) {
  if (!d.norms) {
    add(d, "clip norm", false, "save clip_norm (the norm clipping compared with its threshold) on each rank");
    return;
  }
  std::string text = number_text(d.norms->clip_norms[0]) + " on rank 0";
  if (settings.clipping && *settings.clipping > 0) {
    text += d.norms->clip_norms[0] > *settings.clipping ? ", above the threshold: clipping engaged"
                                                        : ", within the threshold: no clipping";
  }
  if (d.norms->to_reference) text += "; " + number_text(*d.norms->to_reference) + "x the baseline's";
  add(d, "clip norm", true, text);
}

}  // namespace

void tolerance_evidence(Diagnosis& d) {
  const Tolerances& t = d.tolerances;
  add(d, "rounding tolerances", true,
      precision_name(t.precision) + " (unit roundoff u = " + number_text(unit_roundoff(t.precision)) +
          "): a gradient within 2 (sqrt(N) u_acc + sqrt(S + 3) u) = " + number_text(t.gradient) + " (normwise, "
          "relative) of the baseline's is rounding, for N = " + std::to_string(t.tokens) + " tokens, S = " +
          std::to_string(t.sequence) + (t.sequence_known ? " (the attention's)" : " (no attention saved: S taken as N)") +
          (t.tokens_assumed ? " (assumed: give --tokens, or save the baseline's attention)" : ""));
}

void gather_evidence(Diagnosis& diagnosis, const RunFiles& run, const Settings& settings) {
  if (diagnosis.non_finite > 0) {
    add(diagnosis, "finite values", true, std::to_string(diagnosis.non_finite) + " values are inf or NaN: nothing "
        "else is compared");
    return;
  }
  ranks_evidence(diagnosis, run);
  first_step_evidence(diagnosis, settings);
  baseline_evidence(diagnosis, run, settings);
  clip_evidence(diagnosis, settings);
  tolerance_evidence(diagnosis);
}

}  // namespace seqpar::diagnose
