// Turns the gathered numbers into the figures and verdicts of the report.
// Pure functions over host vectors: no tensors, no ranks, easy to test.
//
// The scenario calls them as it goes: figures_of_step when a step ends (then the step's
// snapshots are dropped), signs_of_first_step on step 1, decide once at the end. Only
// the per-step scalars (StepFigures) outlive a step, so memory does not grow with the
// number of steps beyond a few hundred bytes per step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "apps/common/first_step.h"
#include "apps/common/verdict.h"
#include "apps/repro/policy.h"

namespace seqpar::repro {

// Host copies of one step, indexed [rank][parameter element] (weight row-major,
// then bias), as gathered on world rank 0.
struct StepRecord {
  std::vector<std::vector<float>> parameters;  // after the step
  std::vector<std::vector<float>> gradients;   // as the optimizer used them
  std::vector<float> losses, local_norms, used_norms;  // [rank]
};

// The one-rank baseline's state after one step.
struct BaselineStep {
  const std::vector<float>& parameters;  // [element]
  const std::vector<float>& gradients;   // [element]
  float loss = 0, norm = 0;
};

struct StepFigures {
  float max_cross_rank_difference = 0;  // max over elements of (max_r p - min_r p)
  int64_t differing_parameters = 0;     // elements not bitwise equal on every rank
  int64_t parameter_count = 0;
  LrHistogram histogram;
  float max_difference_from_baseline = 0;  // max over ranks and elements
  double max_ulps_from_baseline = 0;       // the same in units in the last place
  // Rank 0's parameters more than kRoundingUlps from the baseline's (for the policies
  // that compute another gradient, where only a tolerance can say how far they are).
  int64_t parameters_beyond_rounding = 0;
  // Rank 0's parameters and gradients not bitwise equal to the baseline's.
  int64_t parameters_unlike_baseline = 0;
  int64_t gradients_unlike_baseline = 0;
  // ||g - g_reference|| / ||g_reference|| for the gradient the optimizer used (rank 0).
  double gradient_relative_error = 0;
  std::vector<float> losses, local_norms, used_norms;  // [rank]
  float baseline_loss = 0, baseline_norm = 0;
  // Parameters, gradients, losses and norms (every rank's and the baseline's) that are
  // inf or NaN: the run overflowed, and no comparison of its numbers means anything.
  int64_t non_finite_values = 0;
};

struct PolicyFigures {
  const Policy* policy = nullptr;
  std::string skipped;
  std::vector<StepFigures> steps;  // [step - 1]
  SignAgreement first_step_signs;
  double gradient_scale = 1;  // rank 0's synchronized gradient norm / the baseline's, step 1
  double seconds_per_step = 0;           // the step itself, from a barrier (every rank)
  double analysis_seconds_per_step = 0;  // gathering its state on rank 0 and the figures
  Verdict verdict = Verdict::Skipped;
  std::string verdict_text;
  // The first step (1-based) where the condition behind the verdict broke, 0 when it
  // never did, and that condition in words ("ranks apart", ...).
  int64_t first_broken_step = 0;
  std::string broken_condition;
};

// One step's figures: every rank's state against the others and rank 0's against the
// reference's state after the same step.
StepFigures figures_of_step(const StepRecord& record, const BaselineStep& reference, double lr);

// The verdict (and first_broken_step) from figures.steps and figures.gradient_scale; a
// wrong scale is named against the mesh's sp and dp (dist::name_scale: "x sp (4)").
void decide(PolicyFigures& figures, double lr, int sp = 1, int dp = 1);

// Units in the last place between two floats (0 when bitwise equal).
double ulps_between(float a, float b);

// FNV-1a over the bytes of the values: a short fingerprint of a rank's parameters.
uint64_t fingerprint(const std::vector<float>& values);

}  // namespace seqpar::repro
