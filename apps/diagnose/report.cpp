#include "apps/diagnose/report.h"

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

namespace seqpar::diagnose {

namespace {

std::string percent(int64_t part, int64_t whole) {
  return whole > 0 ? number_text(100.0 * double(part) / double(whole)) + "%" : "-";
}

// Flat index -> [i, j, ...] in a row-major tensor of `shape`.
std::string position(int64_t flat, const std::vector<int64_t>& shape) {
  std::vector<int64_t> index(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    index[d] = shape[d] > 0 ? flat % shape[d] : 0;
    flat = shape[d] > 0 ? flat / shape[d] : 0;
  }
  return shape_text(index);
}

// `text` after `lead`, broken at spaces into lines of at most kWidth columns, each
// continuation indented under the first line's text.
constexpr size_t kWidth = 92;
std::string wrapped(const std::string& lead, const std::string& text) {
  return lead + wrap_text(text, lead.size(), kWidth) + "\n";
}

void print_agreement(std::ostream& out, const char* what, const Agreement& agreement, const std::string& prefix) {
  if (agreement.bitwise) {
    out << "  " << what << ": bitwise equal on every rank (" << agreement.elements << " elements)\n";
    return;
  }
  out << "  " << what << ": " << agreement.differing << " of " << agreement.elements
      << " elements differ between ranks, by up to " << number_text(agreement.max_difference) << '\n';
  for (const TensorDifference& t : agreement.tensors) {
    std::string ranks;
    for (int rank : t.ranks_unlike_rank0) ranks += (ranks.empty() ? "" : ",") + std::to_string(rank);
    out << "    " << prefix << t.name << ' ' << shape_text(t.shape) << ": " << t.differing << " of " << t.elements
        << " differ (max " << number_text(t.max_difference) << "); first at " << position(t.first, t.shape)
        << ", where rank(s) " << ranks << " differ from rank 0\n";
  }
}

void print_first_step(std::ostream& out, const FirstStepRule& rule, double lr) {
  const LrHistogram& h = rule.histogram;
  const int64_t pairs = h.identical + h.below_half + h.about_one + h.about_two + h.beyond;
  out << "  differences from rank 0 in units of lr = " << number_text(lr) << " (" << pairs << " element pairs): "
      << "equal " << h.identical << ", below 0.5 lr " << h.below_half << ", about 1 lr " << h.about_one
      << ", about 2 lr " << h.about_two << ", beyond " << h.beyond << '\n';
  if (rule.two_lr_signature) {
    out << "    the 2 lr signature: on Adam's first step every copy moves by lr along the sign of its own\n"
           "    gradient, so copies whose gradients have opposite signs end 2 lr apart\n";
  }
  if (h.beyond > 0) {
    out << "    " << h.beyond << " pairs are more than 2.5 lr apart: not a first step's parameters (copies\n"
           "    drift by up to 2 lr a step), so Adam's first-step rule is not applied\n";
  }
  if (rule.signs && h.beyond == 0) {
    const SignAgreement& s = *rule.signs;
    out << "  gradient signs against rank 0's: " << s.opposite << " opposite (" << s.opposite_two_lr
        << " of them ended about 2 lr apart), " << s.same << " the same (" << s.same_identical
        << " ended bitwise equal)\n";
    out << "  Adam's first-step rule (lr g / (|g| + eps)) predicts " << rule.rule_matching << " of " << rule.rule_pairs
        << " differences to 1% of lr (" << percent(rule.rule_matching, rule.rule_pairs) << ")\n";
  }
  if (rule.update_elements > 0) {
    out << "  against the initial parameters: " << rule.update_matching << " of " << rule.update_elements
        << " updates are lr or 0 as Adam's first step makes them (" << percent(rule.update_matching, rule.update_elements)
        << ")\n";
  }
}

void print_scale(std::ostream& out, const char* what, const ScaleFigure& scale) {
  if (!scale.zero.empty()) {
    out << "  " << what << " (" << scale.from << "): " << scale.zero << " all zeros; no ratio formed\n";
    return;
  }
  out << "  " << what << " (" << scale.from << "): " << number_text(scale.ratio) << "x the one-rank gradient's norm"
      << (scale.cause.empty() ? "" : " (" + scale.cause + ")") << "; relative error " << number_text(scale.relative_error)
      << ", " << number_text(scale.direction_error) << " with the scale taken out; " << scale.unlike_reference
      << " elements not bitwise equal\n";
}

void print_norms(std::ostream& out, const NormFigures& norms, const std::optional<double>& threshold) {
  out << "  clip norm: " << number_text(norms.clip_norms[0]) << " on rank 0";
  if (threshold && *threshold > 0) {
    out << (norms.clip_norms[0] > *threshold ? ", above" : ", within") << " the threshold " << number_text(*threshold)
        << (norms.clip_norms[0] > *threshold ? " (the step scaled the gradient by " +
                                                   number_text(*threshold / norms.clip_norms[0]) + ")"
                                             : " (no clipping)");
  }
  if (!norms.ranks_agree) {
    out << ", differing between ranks (";
    for (size_t r = 0; r < norms.clip_norms.size(); ++r) out << (r ? ", " : "") << number_text(norms.clip_norms[r]);
    out << ")";
  }
  out << '\n';
  if (!norms.gradient_norms.empty() && norms.gradient_norms[0] == 0) {
    out << "    rank 0's gradient is all zeros: the clip norm is not compared with it\n";
  } else if (!norms.gradient_norms.empty()) {
    out << "    " << number_text(norms.to_gradient) << "x the norm of rank 0's gradient ("
        << number_text(norms.gradient_norms[0]) << ")" << (norms.to_gradient_cause.empty() ? "" : " " + norms.to_gradient_cause)
        << (norms.own_gradient_norms ? "; each rank's is its own gradient's norm" : "") << '\n';
  }
  if (norms.mean_of_local_norms) {
    out << "    the mean of the ranks' local gradient norms is " << number_text(*norms.mean_of_local_norms)
        << (norms.mean_of_partials ? ": the clip norm is that mean" : "") << '\n';
  }
  if (norms.to_reference) {
    out << "    " << number_text(*norms.to_reference) << "x the one-rank norm (" << number_text(*norms.reference_norm) << ")"
        << (norms.to_reference_cause.empty() ? "" : " " + norms.to_reference_cause) << '\n';
  }
}

// The optimizer's step counts skipped, the first few by name.
std::string skipped_text(const std::vector<std::string>& skipped) {
  std::string text = "skipped " + std::to_string(skipped.size()) +
                     " optimizer step count(s), not per-parameter tensors: ";
  for (size_t i = 0; i < skipped.size() && i < 3; ++i) text += (i ? ", " : "") + skipped[i];
  return text + (skipped.size() > 3 ? ", ..." : "");
}

}  // namespace

void print_diagnosis(std::ostream& out, const RunFiles& run, const Settings& settings, const Diagnosis& diagnosis) {
  out << "seqpar-diagnose: " << diagnosis.ranks << " rank(s), " << run.parameter_names.size() << " parameter tensor(s)";
  if (settings.sp > 0) out << ", sp " << settings.sp << " x dp " << std::max(settings.dp, 1);
  if (settings.lr) out << ", lr " << number_text(*settings.lr);
  out << '\n';
  for (const std::string& source : settings.sources) out << wrapped("  settings: ", source);
  out << "\nWhat the files show\n";
  if (!run.parameter_names.empty()) print_agreement(out, "parameters", diagnosis.parameters, "");
  if (diagnosis.gradients) print_agreement(out, ("gradients (" + diagnosis.gradients_from + ")").c_str(), *diagnosis.gradients, "grad.");
  if (diagnosis.moments_are_first_step) {
    out << "  Adam's moments: " << (*diagnosis.moments_are_first_step
        ? "a first step's (exp_avg_sq = (1-b2)/(1-b1)^2 exp_avg^2 everywhere)"
        : "past the first step (exp_avg_sq is not (1-b2)/(1-b1)^2 exp_avg^2): the 2 lr rule does not apply") << '\n';
  }
  if (diagnosis.first_step && !diagnosis.parameters.bitwise) print_first_step(out, *diagnosis.first_step, *settings.lr);
  if (diagnosis.baseline_distance) {
    const ParameterDistance& d = *diagnosis.baseline_distance;
    out << "  against the baseline (one-rank training): rank 0's parameters "
        << (d.bitwise ? "are bitwise equal" : "differ by up to " + number_text(d.max_difference)) << '\n';
  }
  if (diagnosis.scale) print_scale(out, "gradient scale", *diagnosis.scale);
  if (diagnosis.mean_scale) print_scale(out, "the ranks' gradients, averaged", *diagnosis.mean_scale);
  if (diagnosis.local_scale) print_scale(out, "the ranks' local gradients, averaged", *diagnosis.local_scale);
  if (diagnosis.norms) print_norms(out, *diagnosis.norms, settings.clipping);
  if (!diagnosis.layout.empty()) out << wrapped("  layout: ", diagnosis.layout);
  if (diagnosis.attention) print_attention(out, *diagnosis.attention);
  out << "\nWhat the verdict rests on\n";
  for (const EvidenceLine& line : diagnosis.evidence) {
    out << wrapped("  " + line.check + ": ", (line.checked ? "" : "not checked - ") + line.text);
  }
  out << "\nVerdict: " << diagnosis.verdict << '\n' << wrapped("  ", diagnosis.verdict_text);
  for (const Cause& cause : diagnosis.causes) {
    out << '\n' << wrapped("Likely cause: ", cause.pitfall) << wrapped("  evidence:   ", cause.evidence);
    // A fix only where the evidence told this cause apart; else what would.
    if (!cause.fix.empty()) out << wrapped("  fix:        ", cause.fix);
    if (!cause.tell_apart.empty()) out << wrapped("  tell apart: ", cause.tell_apart);
    out << "  reproduce:  " << cause.scenario << '\n';
  }
  if (!diagnosis.notes.empty() || !run.set_aside.empty() || !run.skipped.empty() || !run.notes.empty()) out << '\n';
  for (const std::string& note : run.notes) out << wrapped("Note: ", note);
  for (const std::string& note : diagnosis.notes) out << wrapped("Note: ", note);
  for (const std::string& aside : run.set_aside) out << "Note: not a parameter, not used: " << aside << '\n';
  if (!run.skipped.empty()) out << wrapped("Note: ", skipped_text(run.skipped));
}

namespace {

nlohmann::json baseline_distance(const std::optional<ParameterDistance>& d) {
  using nlohmann::json;
  if (!d) return nullptr;
  return {{"bitwise", d->bitwise}, {"max_difference", d->max_difference},
          {"max_in_lr", d->max_in_lr ? json(*d->max_in_lr) : json(nullptr)},
          {"beyond_tolerance", d->beyond_tolerance}, {"beyond_two_and_a_half_lr", d->beyond_two_lr},
          {"elements", d->elements}};
}

}  // namespace

std::string diagnosis_json(const RunFiles& run, const Settings& settings, const Diagnosis& diagnosis) {
  using nlohmann::json;
  const auto finite = [](double value) { return std::isfinite(value) ? json(value) : json(nullptr); };
  const auto scale = [&](const std::optional<ScaleFigure>& figure) {
    if (!figure) return json(nullptr);
    return json{{"ratio", finite(figure->ratio)}, {"cause", figure->cause}, {"from", figure->from},
                {"zero", figure->zero.empty() ? json(nullptr) : json(figure->zero)},
                {"relative_error", finite(figure->relative_error)},
                {"direction_error", finite(figure->direction_error)}, {"unlike_reference", figure->unlike_reference}};
  };
  const bool compared = diagnosis.parameters.elements > 0;
  json out = {{"schema", "seqpar-diagnose/1"},
              {"ranks", diagnosis.ranks},
              {"sequence_parallel_size", settings.sp},
              {"data_parallel_size", std::max(settings.dp, 1)},
              {"lr", settings.lr ? json(*settings.lr) : json(nullptr)},
              {"verdict", diagnosis.verdict},
              {"verdict_text", diagnosis.verdict_text},
              // Over no parameters (files holding attention alone) nothing agreed or differed.
              {"parameters_agree", compared ? json(diagnosis.parameters.bitwise) : json(nullptr)},
              {"differing_parameters", compared ? json(diagnosis.parameters.differing) : json(nullptr)},
              {"max_cross_rank_difference", compared ? json(diagnosis.parameters.max_difference) : json(nullptr)},
              {"rank_groups", diagnosis.parameters.groups},
              {"gradients_agree", diagnosis.gradients ? json(diagnosis.gradients->bitwise) : json(nullptr)},
              {"two_lr_signature", diagnosis.first_step ? json(diagnosis.first_step->two_lr_signature) : json(nullptr)},
              {"equals_reference", diagnosis.baseline_distance ? json(diagnosis.baseline_distance->bitwise) : json(nullptr)},
              {"baseline_distance", baseline_distance(diagnosis.baseline_distance)},
              {"gradient_scale", scale(diagnosis.scale)},
              {"mean_gradient_scale", scale(diagnosis.mean_scale)},
              {"local_gradient_scale", scale(diagnosis.local_scale)},
              {"layout", diagnosis.layout},
              {"precision", precision_name(settings.precision.precision)},
              {"tolerances", {{"precision", precision_name(diagnosis.tolerances.precision)},
                              {"tokens", diagnosis.tolerances.tokens},
                              {"tokens_assumed", diagnosis.tolerances.tokens_assumed},
                              {"sequence", diagnosis.tolerances.sequence},
                              {"gradient", diagnosis.tolerances.gradient},
                              {"scale", diagnosis.tolerances.scale}}},
              {"settings", settings.sources},
              {"notes", diagnosis.notes},
              {"attention", attention_json(diagnosis.attention)}};
  if (diagnosis.norms) {
    const NormFigures& n = *diagnosis.norms;
    out["clip_norm"] = {{"per_rank", n.clip_norms},
                        {"to_gradient", finite(n.to_gradient)}, {"to_gradient_cause", n.to_gradient_cause},
                        {"to_reference", n.to_reference ? finite(*n.to_reference) : json(nullptr)},
                        {"to_reference_cause", n.to_reference_cause},
                        {"mean_of_partials", n.mean_of_partials}, {"own_gradient_norms", n.own_gradient_norms}};
  } else {
    out["clip_norm"] = nullptr;
  }
  out["evidence"] = json::array();
  for (const EvidenceLine& line : diagnosis.evidence) {
    out["evidence"].push_back({{"check", line.check}, {"checked", line.checked}, {"text", line.text}});
  }
  out["file_notes"] = run.notes;
  out["skipped"] = run.skipped;
  out["causes"] = json::array();
  for (const Cause& cause : diagnosis.causes) {
    out["causes"].push_back({{"pitfall", cause.pitfall}, {"evidence", cause.evidence},
                             {"fix", cause.fix.empty() ? json(nullptr) : json(cause.fix)},
                             {"tell_apart", cause.tell_apart.empty() ? json(nullptr) : json(cause.tell_apart)},
                             {"scenario", cause.scenario}});
  }
  // Names from the files may hold bytes that are not UTF-8: they come out as U+FFFD.
  return out.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

}  // namespace seqpar::diagnose
