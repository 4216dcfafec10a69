// The verdicts of seqpar-repro and seqpar-diagnose: one vocabulary and one decision, so a
// diagnosis of seqpar-repro's own dumps can be checked against the run's verdict, and a
// reader learns one set of names and one order of checks. seqpar-repro knows everything
// it needs (it ran the one-rank baseline) and reaches only the first six; seqpar-diagnose
// knows what the user saved, so it also has the verdicts that say what could not be checked.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>

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

// Rank 0's gradient against the one-rank baseline's.
struct GradientEvidence {
  enum class Zero { Neither, OneSide, Both };  // which sides are all zeros
  Zero zero = Zero::Neither;  // with a zero side there is no ratio or direction
  double ratio = 1;           // ||g|| / ||g_baseline||
  bool named_factor = false;  // dist::name_scale named the ratio (x sp, 1/dp, ...)
  // ||g / ratio - g_baseline|| / ||g_baseline||; absent where it was not measured (then a
  // ratio off 1 counts as a pure scale).
  std::optional<double> direction_error;
  bool bitwise = false;       // equal to the baseline's bit for bit
};

// Rank 0's parameters against the baseline's, with a tolerance in units of lr.
struct DistanceEvidence {
  bool lr_known = false;
  int64_t elements = 0;
  int64_t beyond_tolerance = 0;  // beyond rounding (plus 1% of lr when it is known)
  int64_t beyond_two_lr = 0;     // more than a step can explain
};

// What one program knows of a run. A part left empty was not compared.
struct VerdictEvidence {
  int ranks = 2;              // 1: one rank's files, no agreement to check
  bool non_finite = false;    // some value is inf or NaN
  bool ranks_differ = false;  // the ranks' parameters are not bitwise equal
  // Against the one-rank baseline; absent without one.
  bool has_baseline = false;
  bool parameters_bitwise = false;            // rank 0's parameters equal the baseline's
  std::optional<GradientEvidence> gradient;
  std::optional<double> clip_norm_ratio;      // rank 0's clip norm / the baseline's
  std::optional<DistanceEvidence> distance;   // absent: the gradient decides alone
  // Without a baseline: the clip norm matches a known wrong formula (the mean of the
  // ranks' partial norms, squares of a replicated gradient summed over the ranks).
  bool clip_norm_formula_wrong = false;
  // What rounding can explain, for this run's precision: seqpar-repro's float32 runs use
  // the constants above; seqpar-diagnose derives them from the run's precision and
  // reduction lengths (apps/diagnose/precision.h), so a bf16 run is judged at bf16's.
  double gradient_rounding = kGradientRounding;
  double scale_rounding = kScaleRounding;
};

// The verdict, from the first check that fails: finite values, the ranks' agreement, then
// the baseline (bitwise, a zero gradient, the gradient's scale, its direction, the clip
// norm, the parameters' distance), or without one what the ranks alone can show.
Verdict decide_verdict(const VerdictEvidence& evidence);

}  // namespace seqpar
