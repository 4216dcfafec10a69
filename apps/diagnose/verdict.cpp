// From the figures to the verdict and the catalogued pitfalls they point to. A cause is
// named only when its signature is in the figures; otherwise the verdict says what is
// wrong and "no known signature".
#include <cmath>
#include <cstdio>

#include "apps/diagnose/context_parallel_evidence.h"
#include "apps/diagnose/diagnosis.h"

namespace seqpar::diagnose {

namespace {

std::string groups_text(const std::vector<std::vector<int>>& groups) {
  std::string text;
  for (const auto& group : groups) {
    text += text.empty() ? "{" : " {";
    for (size_t i = 0; i < group.size(); ++i) text += (i ? "," : "") + std::to_string(group[i]);
    text += "}";
  }
  return text;
}

// The mesh's groups (dist/mesh.h): sp groups of consecutive ranks, dp groups sp apart.
std::vector<std::vector<int>> mesh_groups(int sp, int dp, bool sequence_parallel) {
  std::vector<std::vector<int>> groups;
  for (int g = 0; g < (sequence_parallel ? dp : sp); ++g) {
    groups.emplace_back();
    for (int i = 0; i < (sequence_parallel ? sp : dp); ++i) {
      groups.back().push_back(sequence_parallel ? g * sp + i : g + i * sp);
    }
  }
  return groups;
}

const char* const kGroupOfOneFix =
    "reduce the gradients over every rank that holds a copy of the parameters (sp x dp): "
    "with DeepSpeed, pass deepspeed.initialize an mpu whose sequence-data-parallel group "
    "spans them (or leave data_parallel_size out of the config)";

Cause group_of_one(const std::string& evidence) {
  return {"the gradient reduction did not span every rank that holds a copy of the parameters: "
          "the ranks stepped on different gradients (their own shards')",
          evidence, kGroupOfOneFix, "seqpar-repro --scenario issue-6868 --policy deepspeed-0.16"};
}

// A gradient scale that dist::name_scale named, as a pitfall.
Cause scale_cause(const ScaleFigure& scale) {
  const std::string evidence = "the gradient is " + number_text(scale.ratio) + "x the one-rank gradient (" +
                               scale.cause + "), its direction the same to " + number_text(scale.direction_error);
  if (scale.cause.rfind("x sp ", 0) == 0) {
    return {"each rank's loss is a mean over its own rows and the gradients are summed over sp: "
            "the sum of sp means is sp times the mean",
            evidence,
            "divide each rank's loss sum by the element count of the whole batch (all ranks' rows), "
            "or average the gradients over sp instead of summing",
            "seqpar-repro --scenario issue-6868 --policy with-mpu"};
  }
  return {"the gradient's normalization and its reduction do not match (a mean divided twice, or a "
          "sum where an average belongs, over sp or dp)",
          evidence,
          "make the shares of all sp x dp ranks add up to the batch's mean: divide by the global "
          "count and sum, or take local means and average",
          "seqpar-repro --scenario zero-stage"};
}

void add_direction_causes(Diagnosis& diagnosis, double error) {
  // A Ulysses mistake the attention tensors named (compare_attention) turns the gradient
  // too: beside it, the loss-side pitfalls below would only be guesses.
  if (diagnosis.attention && explains_the_gradient(*diagnosis.attention)) return;
  const std::string evidence = "with the scale taken out, the gradient still differs from the "
                               "one-rank gradient by " + number_text(error) + " (relative; rounding in " +
                               precision_name(diagnosis.tolerances.precision) + " up to " +
                               number_text(diagnosis.tolerances.gradient) + "): rows are "
                               "weighed differently or missing; the tensors alone cannot tell which";
  diagnosis.causes.push_back({"targets shifted inside each shard (each shard's last row loses its target)",
                              evidence, "shift the labels before the sequence is cut into shards",
                              "seqpar-repro --scenario shifted-targets"});
  diagnosis.causes.push_back({"the same dropout mask on every shard", evidence,
                              "key the mask by the global row (or offset each rank's generator)",
                              "seqpar-repro --scenario dropout"});
  diagnosis.causes.push_back({"means over each rank's or micro-batch's own valid tokens", evidence,
                              "divide by the global count of valid tokens (num_items_in_batch)",
                              "seqpar-repro --scenario masked-tokens"});
}

void add_clip_causes(Diagnosis& diagnosis) {
  if (!diagnosis.norms) return;
  const NormFigures& norms = *diagnosis.norms;
  const std::string clipped = "clipping used " + number_text(norms.clip_norms[0]);
  if (norms.mean_of_partials) {
    diagnosis.causes.push_back(
        {"gradient clipping used the mean of the ranks' partial norms",
         clipped + ", the mean of the ranks' local gradient norms (" + number_text(*norms.mean_of_local_norms) + ")" +
             (norms.to_reference ? ", " + number_text(*norms.to_reference) + "x the one-rank norm" : ""),
         "clip after the reduction, with the norm of the reduced gradient",
         "seqpar-repro --scenario clipping-norms"});
  } else if (norms.to_gradient_cause.find("sqrt") != std::string::npos) {
    diagnosis.causes.push_back(
        {"gradient clipping summed the squares of the replicated gradient over the ranks",
         clipped + ", " + number_text(norms.to_gradient) + "x the norm of the gradient stepped with (" +
             norms.to_gradient_cause + "): each element counted on every rank",
         "count each element once: the reduced gradient's norm on one copy, or squares of disjoint slices",
         "seqpar-repro --scenario clipping-norms"});
  }
}

void explain_divergent(Diagnosis& diagnosis) {
  const Agreement& p = diagnosis.parameters;
  diagnosis.verdict_text = "the ranks hold different parameters: " + std::to_string(p.differing) + " of " +
                           std::to_string(p.elements) + " elements differ, by up to " + number_text(p.max_difference) + ".";
  std::string evidence;
  if (diagnosis.gradients && !diagnosis.gradients->bitwise) {
    evidence = "the ranks' gradients differ too (" + std::to_string(diagnosis.gradients->differing) + " elements)";
  }
  const FirstStepRule* rule = diagnosis.first_step ? &*diagnosis.first_step : nullptr;
  if (rule && rule->two_lr_signature) {
    evidence += std::string(evidence.empty() ? "" : "; ") + "the differences are 0 or 2 lr (" +
                std::to_string(rule->histogram.about_two) + " element pairs about 2 lr apart): Adam's first "
                "step moves each copy by lr along the sign of its own gradient";
  }
  if (rule && rule->rule_pairs > 0 && rule->rule_matching == rule->rule_pairs) {
    evidence += "; Adam's first-step rule predicts every difference from the gradients";
  }
  if (diagnosis.mean_scale && diagnosis.mean_scale->direction_error < 1e-3) {
    const ScaleFigure& mean = *diagnosis.mean_scale;
    evidence += "; the ranks' gradients average to " +
                (std::abs(mean.ratio - 1) <= 1e-3 ? std::string("the one-rank gradient")
                                                  : number_text(mean.ratio) + "x the one-rank gradient") +
                (mean.cause.empty() ? "" : " (" + mean.cause + ")") + " (direction to " + number_text(mean.direction_error) +
                "): each rank held its part of it";
  }
  if (diagnosis.norms && diagnosis.norms->own_gradient_norms) {
    evidence += "; each rank clipped with its own gradient's norm";
  }
  if (!evidence.empty() && (!diagnosis.gradients || !diagnosis.gradients->bitwise)) {
    diagnosis.causes.push_back(group_of_one(evidence));
  } else if (diagnosis.norms && !diagnosis.norms->ranks_agree) {
    diagnosis.causes.push_back({"the ranks stepped on the same gradient but clipped it with different norms",
                                "clip norms " + number_text(diagnosis.norms->clip_norms.front()) + " to " +
                                    number_text(diagnosis.norms->clip_norms.back()),
                                kGroupOfOneFix, "seqpar-repro --scenario issue-6868 --policy deepspeed-0.16"});
  }
}

// Rank 0's parameters against the baseline's, in words: bitwise, or how far, and
// against which tolerance.
std::string distance_text(const ParameterDistance& d) {
  if (d.bitwise) return "rank 0's parameters equal the baseline's bit for bit";
  std::string text = "rank 0's parameters are within " + number_text(d.max_difference) + " of the baseline's";
  if (d.max_in_lr) text += " (" + number_text(*d.max_in_lr) + " lr)";
  return text;
}

// The texts of the verdicts that the parameters' distance from the baseline decided:
// what the gradient checks left open.
void explain_by_parameters(Diagnosis& diagnosis, const std::string& agree) {
  const ParameterDistance& d = *diagnosis.baseline_distance;
  if (diagnosis.kind == Verdict::UnlikeOneRank) {
    diagnosis.verdict_text =
        agree + ", but rank 0's parameters are up to " + number_text(d.max_difference) + " (" + number_text(*d.max_in_lr) +
        " lr) from the baseline's, " + std::to_string(d.beyond_tolerance) + " of " + std::to_string(d.elements) +
        " elements beyond rounding: a step moves a parameter by about lr, so this is not rounding. Check that the "
        "baseline started from the same parameters, saw the same batch and used the same lr.";
  } else if (diagnosis.kind == Verdict::RanksAgree || diagnosis.kind == Verdict::OneRank) {
    diagnosis.verdict_text = agree + "; rank 0's parameters differ from the baseline's by up to " +
                             number_text(d.max_difference) + ". Without the lr (--lr or --ds-config) whether that "
                             "is rounding cannot be told.";
  } else if (diagnosis.kind == Verdict::ParametersClose) {
    diagnosis.verdict_text =
        agree + " and " + distance_text(d) + ", but the gradient was not compared: after Adam's first step a "
        "steady x k in the gradient (x sp, a mean divided twice) is nearly invisible in the parameters. Save "
        "grad.* (or exp_avg and exp_avg_sq) on the ranks and the baseline, or clip_norm, to check it.";
  } else {
    diagnosis.verdict_text = agree + " and match one-rank training up to rounding: " + distance_text(d) +
                             (d.max_in_lr ? " (the tolerance: 16 units in the last place of " +
                                            precision_name(diagnosis.tolerances.precision) + " plus 1% of lr, "
                                            "beyond it " + std::to_string(d.beyond_tolerance) + " elements)" : "") +
                             (diagnosis.scale ? "; gradient within " + number_text(diagnosis.scale->relative_error) +
                                                " (relative, from " + diagnosis.scale->from + ")" : "") + ".";
  }
}

// The ranks agree and the gradient (if saved) is right, but the clip norm is not the
// baseline's. Without a gradient, a named factor of the clip norm is the gradient's.
void explain_clip_norm(Diagnosis& diagnosis, const std::string& agree) {
  const ScaleFigure* scale = diagnosis.scale ? &*diagnosis.scale : nullptr;
  const NormFigures* norms = &*diagnosis.norms;
  if (norms->to_reference_cause.empty() && !norms->mean_of_local_norms) {
    diagnosis.notes.push_back("the clip norm's factor is none of the usual ones; save each rank's gradient "
                              "before the reduction as local_grad.NAME to test for the mean of partial norms");
  }
  diagnosis.verdict_text = agree + (scale ? "; the gradient is the one-rank gradient" : "") +
                           ", but clipping used a norm " + number_text(*norms->to_reference) + "x the one-rank norm" +
                           (norms->to_reference_cause.empty() ? "" : " (" + norms->to_reference_cause + ")") + ".";
  if (!scale && !norms->to_reference_cause.empty() && !norms->mean_of_partials &&
      norms->to_gradient_cause.find("sqrt") == std::string::npos) {
    // No gradient saved: the clip norm is the gradient's norm, so its factor is the
    // gradient's, as far as the norm can tell.
    ScaleFigure by_norm;
    by_norm.ratio = *norms->to_reference;
    by_norm.cause = norms->to_reference_cause;
    Cause cause = scale_cause(by_norm);
    cause.evidence = "the clip norm (the gradient's norm) is " + number_text(by_norm.ratio) + "x the baseline's (" +
                     by_norm.cause + "); no gradient was saved to check its direction";
    diagnosis.causes.push_back(cause);
  }
}

// The texts and causes of the verdicts drawn against the baseline.
void explain_against_baseline(Diagnosis& diagnosis) {
  const ScaleFigure* scale = diagnosis.scale ? &*diagnosis.scale : nullptr;
  const std::string agree = diagnosis.ranks > 1 ? "the ranks agree bitwise" : "one rank's files (no agreement to check)";
  if (diagnosis.kind == Verdict::Identical) {
    diagnosis.verdict_text = "the parameters" + std::string(scale ? " and gradients (" + scale->from + ")" : "") +
                             " equal the baseline's (one-rank training) bit for bit; " + agree + ".";
  } else if (diagnosis.kind == Verdict::WrongGradient && !scale->zero.empty()) {
    diagnosis.verdict_text = agree + ", but " + scale->zero + " (" + scale->from + ") is all zeros and the other's "
                             "is not: no ratio or direction can be formed. A step that never reached backward, a "
                             "gradient saved before it was computed, or one zeroed before it was saved?";
  } else if (diagnosis.kind == Verdict::WrongGradientScale) {
    // A named factor, or a pure scale: the direction is right, only the size is off.
    diagnosis.verdict_text = agree + ", but the gradient (" + scale->from + ") is " + number_text(scale->ratio) +
                             "x the one-rank gradient" + (scale->cause.empty() ? "" : " (" + scale->cause + ")") +
                             ". Adam hardly sees a steady scale; clipping does.";
    // The attention's input gradients, scaled alike by cp, already named the loss per rank.
    const bool named = diagnosis.attention && loss_normalized_per_rank(*diagnosis.attention);
    if (!scale->cause.empty() && !named) diagnosis.causes.push_back(scale_cause(*scale));
    if (scale->direction_error > diagnosis.tolerances.gradient) add_direction_causes(diagnosis, scale->direction_error);
  } else if (diagnosis.kind == Verdict::WrongGradient) {
    diagnosis.verdict_text = agree + "; the gradient (" + scale->from + ") has the one-rank size but points "
                             "elsewhere: " + number_text(scale->direction_error) + " relative error with the scale taken out.";
    add_direction_causes(diagnosis, scale->direction_error);
  } else if (diagnosis.kind == Verdict::WrongClipNorm) {
    explain_clip_norm(diagnosis, agree);
  } else {
    explain_by_parameters(diagnosis, agree);
  }
  add_clip_causes(diagnosis);
}

// What the figures in `diagnosis` tell the shared decision (apps/common/verdict.h).
VerdictEvidence evidence_of(const Diagnosis& diagnosis) {
  VerdictEvidence evidence;
  evidence.gradient_rounding = diagnosis.tolerances.gradient;
  evidence.scale_rounding = diagnosis.tolerances.scale;
  evidence.ranks = diagnosis.ranks;
  evidence.non_finite = diagnosis.non_finite > 0;
  evidence.ranks_differ = !diagnosis.parameters.bitwise;
  if (const auto& scale = diagnosis.scale) {
    GradientEvidence gradient;
    gradient.zero = scale->zero.empty()                   ? GradientEvidence::Zero::Neither
                    : scale->zero == "both gradients"     ? GradientEvidence::Zero::Both
                                                          : GradientEvidence::Zero::OneSide;
    gradient.ratio = scale->ratio;
    gradient.named_factor = !scale->cause.empty();
    gradient.direction_error = scale->direction_error;
    gradient.bitwise = scale->unlike_reference == 0;
    evidence.gradient = gradient;
  }
  if (const auto& norms = diagnosis.norms) {
    evidence.clip_norm_ratio = norms->to_reference;
    evidence.clip_norm_formula_wrong =
        norms->mean_of_partials || norms->to_gradient_cause.find("sqrt") != std::string::npos;
  }
  if (const auto& distance = diagnosis.baseline_distance) {
    evidence.has_baseline = true;
    evidence.parameters_bitwise = distance->bitwise;
    evidence.distance = DistanceEvidence{distance->max_in_lr.has_value(), distance->elements,
                                         distance->beyond_tolerance, distance->beyond_two_lr};
  }
  return evidence;
}

}  // namespace

std::string explain_layout(const std::vector<std::vector<int>>& groups, int sp, int dp) {
  const std::string found = "the ranks fall into " + std::to_string(groups.size()) +
                            " group(s) of equal copies: " + groups_text(groups);
  if (groups.size() == 1) return found + ", one replica as it should be.";
  size_t ranks = 0;
  for (const auto& group : groups) ranks += group.size();
  if (sp <= 0 || size_t(sp) * size_t(dp) != ranks) {
    return found + "; give --sp and --dp to match them against the mesh.";
  }
  if (groups.size() == ranks) {
    return found + ": every rank stepped alone. A reduction over a group of one does nothing: in a sp " +
           std::to_string(sp) + " x dp " + std::to_string(dp) + " mesh the data-parallel groups are " +
           groups_text(mesh_groups(sp, dp, false)) +
           (dp == 1 ? ", one rank each; DeepSpeed without an mpu reduces over them." : ".");
  }
  if (groups == mesh_groups(sp, dp, false)) {
    return found + ": the mesh's data-parallel groups. The gradients were reduced over dp, not over sp x dp "
                   "(DeepSpeed without an mpu takes its group from the mesh's data-parallel dimension).";
  }
  if (groups == mesh_groups(sp, dp, true)) {
    return found + ": the mesh's sequence-parallel groups. The gradients were reduced over sp, not across "
                   "the data-parallel replicas.";
  }
  return found + "; no group layout of the sp " + std::to_string(sp) + " x dp " + std::to_string(dp) +
         " mesh explains them.";
}

void decide(Diagnosis& diagnosis) {
  diagnosis.kind = decide_verdict(evidence_of(diagnosis));
  if (diagnosis.kind == Verdict::NumericallyInvalid) {
    diagnosis.verdict_text = std::to_string(diagnosis.non_finite) +
                             " values are inf or NaN (the training overflowed): no comparison of them means anything.";
  } else if (diagnosis.kind == Verdict::RanksDiverge) {
    explain_divergent(diagnosis);
  } else if (diagnosis.baseline_distance) {
    explain_against_baseline(diagnosis);
  } else {
    diagnosis.verdict_text = diagnosis.ranks > 1 ? "the ranks hold bitwise-equal parameters." : "one rank's files.";
    diagnosis.verdict_text += " Without the one-rank training's files (--baseline) the gradient's scale cannot be checked.";
    add_clip_causes(diagnosis);
  }
  diagnosis.verdict = verdict_name(diagnosis.kind);
  if (diagnosis.causes.empty() && names_a_fault(diagnosis.kind)) {
    diagnosis.notes.push_back("no known signature: the figures match none of the catalogued pitfalls");
  }
}

}  // namespace seqpar::diagnose
