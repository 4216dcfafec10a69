#include "apps/common/verdict.h"

namespace seqpar {

const char* verdict_name(Verdict verdict) {
  switch (verdict) {
    case Verdict::Skipped: return "SKIPPED";
    case Verdict::NumericallyInvalid: return "NUMERICALLY INVALID";
    case Verdict::RanksDiverge: return "BROKEN: RANKS DIVERGE";
    case Verdict::WrongGradientScale: return "CONSISTENT, WRONG GRADIENT SCALE";
    case Verdict::NotExact: return "CONSISTENT, NOT EXACT";
    case Verdict::Identical: return "IDENTICAL TO ONE-RANK TRAINING";
    case Verdict::WrongGradient: return "CONSISTENT, WRONG GRADIENT";
    case Verdict::WrongClipNorm: return "CONSISTENT, WRONG CLIP NORM";
    case Verdict::UnlikeOneRank: return "CONSISTENT, UNLIKE ONE-RANK TRAINING";
    case Verdict::ParametersClose: return "PARAMETERS CLOSE, GRADIENT NOT CHECKED";
    case Verdict::RanksAgree: return "RANKS AGREE";
    case Verdict::OneRank: return "ONE RANK";
  }
  return "?";
}

bool names_a_fault(Verdict verdict) {
  switch (verdict) {
    case Verdict::NumericallyInvalid:
    case Verdict::RanksDiverge:
    case Verdict::WrongGradientScale:
    case Verdict::WrongGradient:
    case Verdict::WrongClipNorm:
    case Verdict::UnlikeOneRank: return true;
    default: return false;
  }
}

namespace {

// A clip norm off the baseline's that the gradient's own scale does not explain.
bool clip_norm_off(const VerdictEvidence& e) {
  if (!e.clip_norm_ratio || std::abs(*e.clip_norm_ratio - 1) <= e.scale_rounding) return false;
  const auto& g = e.gradient;
  return !(g && g->zero == GradientEvidence::Zero::Neither &&
           std::abs(*e.clip_norm_ratio / g->ratio - 1) <= e.scale_rounding);
}

// With the gradient and clip norm right (or not compared): what the parameters' distance
// from the baseline can tell.
Verdict decide_by_distance(const VerdictEvidence& e) {
  // A gradient of zeros on both sides leaves the scale unchecked, whatever the clip norm.
  const bool both_zero = e.gradient && e.gradient->zero == GradientEvidence::Zero::Both;
  const bool scale_checked = (e.gradient || e.clip_norm_ratio) && !both_zero;
  if (!e.distance) return scale_checked ? Verdict::NotExact : Verdict::ParametersClose;
  const DistanceEvidence& d = *e.distance;
  if (d.lr_known && (d.beyond_two_lr > 0 || double(d.beyond_tolerance) > 0.01 * double(d.elements))) {
    return Verdict::UnlikeOneRank;  // farther than a step: not rounding
  }
  if (!d.lr_known && !e.parameters_bitwise && d.beyond_tolerance > 0) {
    return e.ranks > 1 ? Verdict::RanksAgree : Verdict::OneRank;  // rounding or not: unknown
  }
  return scale_checked ? Verdict::NotExact : Verdict::ParametersClose;
}

Verdict decide_against_baseline(const VerdictEvidence& e) {
  using Zero = GradientEvidence::Zero;
  const GradientEvidence* g = e.gradient ? &*e.gradient : nullptr;
  const bool scaled = g && g->zero == Zero::Neither && std::abs(g->ratio - 1) > e.scale_rounding;
  if (e.parameters_bitwise && (!g || g->bitwise) && !scaled && !clip_norm_off(e)) {
    return Verdict::Identical;
  }
  if (g && g->zero == Zero::OneSide) return Verdict::WrongGradient;
  if (g && g->zero == Zero::Neither) {
    const bool pure_scale = !g->direction_error || *g->direction_error <= e.gradient_rounding;
    if (g->named_factor || (scaled && pure_scale)) return Verdict::WrongGradientScale;
    if (g->direction_error && *g->direction_error > e.gradient_rounding) return Verdict::WrongGradient;
  }
  if (clip_norm_off(e)) return Verdict::WrongClipNorm;
  return decide_by_distance(e);
}

}  // namespace

Verdict decide_verdict(const VerdictEvidence& e) {
  if (e.non_finite) return Verdict::NumericallyInvalid;
  if (e.ranks_differ) return Verdict::RanksDiverge;
  if (e.has_baseline) return decide_against_baseline(e);
  if (e.clip_norm_formula_wrong) return Verdict::WrongClipNorm;
  return e.ranks > 1 ? Verdict::RanksAgree : Verdict::OneRank;
}

}  // namespace seqpar
