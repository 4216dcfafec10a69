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

}  // namespace seqpar
