// The verdicts of seqpar-repro and seqpar-diagnose: one vocabulary, so a diagnosis of
// seqpar-repro's own dumps can be checked against the run's verdict, and a reader learns
// one set of names. seqpar-repro knows everything (it ran the one-rank baseline) and
// reaches only the first six; seqpar-diagnose knows what the user saved, so it also has
// the verdicts that say what could not be checked.
#pragma once

#include <cmath>

namespace seqpar {

enum class Verdict {
  Skipped,             // the run was not made (seqpar-repro: a policy the mesh refuses)
  NumericallyInvalid,  // some value is inf or NaN: no verdict is drawn from the figures
  RanksDiverge,        // the copies of one model hold different parameters
  WrongGradientScale,  // the ranks agree; the gradient is k x the one-rank gradient
  NotExact,            // the ranks agree and match one-rank training up to rounding
  Identical,           // the ranks agree and equal one-rank training bit for bit
  // What only a user's files can leave open or show:
  WrongGradient,       // the ranks agree; the gradient points elsewhere, or one side is all zeros
  WrongClipNorm,       // the ranks agree; clipping used a norm unlike the one-rank norm
  UnlikeOneRank,       // the ranks agree; the parameters are farther from the baseline than a step
  ParametersClose,     // the ranks agree and the parameters are close; the gradient was not compared
  RanksAgree,          // the ranks agree; nothing to compare them with (no baseline, or no lr)
  OneRank              // one rank's files and nothing to compare them with
};

// The name both programs print: "BROKEN: RANKS DIVERGE", ...
const char* verdict_name(Verdict verdict);

// Whether the verdict says something is wrong, so the report owes a cause (or "no known
// signature"); the others are all-clears or say only what could not be checked.
bool names_a_fault(Verdict verdict);

// Within this many units in the last place, two float32 results "agree to rounding".
constexpr double kRoundingUlps = 16;
// A gradient within this normwise relative error of the baseline's is the same
// gradient summed in another order (float32 sums of 10^4 terms differ by ~1e-7).
constexpr double kGradientRounding = 1e-5;
// A gradient (or clip norm) more than this far from 1x the baseline's is scaled: the
// usual faults scale it by sp, dp or their roots, far beyond any rounding.
constexpr double kScaleRounding = 1e-3;
inline bool scale_is_off(double ratio) { return std::abs(ratio - 1) > kScaleRounding; }

}  // namespace seqpar
