// Turns the gathered numbers into the figures and verdicts of the report.
// Pure functions over host vectors: no tensors, no ranks, easy to test.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "apps/repro/scenario.h"

namespace seqpar::repro {

// |p_r - p_0| / lr for every rank r > 0 and every parameter, in bins around the
// multiples of lr that Adam's first step produces.
struct LrHistogram {
  int64_t identical = 0;      // bitwise equal
  int64_t below_half = 0;     // (0, 0.5) lr: rounding-level differences
  int64_t about_one = 0;      // [0.5, 1.5) lr
  int64_t about_two = 0;      // [1.5, 2.5) lr: opposite moves of ±lr
  int64_t beyond = 0;         // >= 2.5 lr
};

// Rank r's gradient against rank 0's, element by element, with how far the parameter
// copies ended apart: the mechanism behind the 2·lr peak.
struct SignAgreement {
  int64_t opposite = 0, opposite_two_lr = 0;  // signs differ / ... and ended ~2 lr apart
  int64_t same = 0, same_identical = 0;       // signs agree / ... and ended bitwise equal
};

struct StepFigures {
  float max_cross_rank_difference = 0;  // max over elements of (max_r p - min_r p)
  int64_t differing_parameters = 0;     // elements not bitwise equal on every rank
  int64_t parameter_count = 0;
  LrHistogram histogram;
  float max_difference_from_reference = 0;  // max over ranks and elements
  double max_ulps_from_reference = 0;       // the same in units in the last place
  // Rank 0's parameters more than kRoundingUlps from the reference's (for the policies
  // that compute another gradient, where only a tolerance can say how far they are).
  int64_t parameters_beyond_rounding = 0;
  // Rank 0's parameters and gradients not bitwise equal to the reference's.
  int64_t parameters_unlike_reference = 0;
  int64_t gradients_unlike_reference = 0;
  // ||g - g_reference|| / ||g_reference|| for the gradient the optimizer used (rank 0).
  double gradient_relative_error = 0;
  std::vector<float> losses, local_norms, used_norms;  // [rank]
  float reference_loss = 0, reference_norm = 0;
};

enum class Verdict { Skipped, RanksDiverge, WrongGradientScale, NotExact, Identical };

struct PolicyFigures {
  const Policy* policy = nullptr;
  std::string skipped;
  std::vector<StepFigures> steps;
  SignAgreement first_step_signs;
  double gradient_scale = 1;  // rank 0's synchronized gradient norm / the reference's, step 1
  double seconds_per_step = 0;
  Verdict verdict = Verdict::Skipped;
  std::string verdict_text;
};

// Within this many units in the last place, two float32 results "agree to rounding".
constexpr double kRoundingUlps = 16;
// A gradient within this normwise relative error of the reference's is the same
// gradient summed in another order (float32 sums of 10^4 terms differ by ~1e-7).
constexpr double kGradientRounding = 1e-5;

PolicyFigures analyze(const PolicyRun& run, const ReferenceRun& reference, double lr);

// Units in the last place between two floats (0 when bitwise equal).
double ulps_between(float a, float b);

const char* verdict_name(Verdict verdict);

// FNV-1a over the bytes of the values: a short fingerprint of a rank's parameters.
uint64_t fingerprint(const std::vector<float>& values);

}  // namespace seqpar::repro
