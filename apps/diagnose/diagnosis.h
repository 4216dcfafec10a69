// What seqpar-diagnose concludes from a run's saved tensors: the figures (each computed
// only when the tensors it needs were given), the verdict, and the catalogued pitfalls
// the evidence points to. Pure functions of the files' values and the settings.
//
// The verdicts are seqpar-repro's where the two overlap (apps/repro/analysis.h:
// "BROKEN: RANKS DIVERGE", "CONSISTENT, WRONG GRADIENT SCALE", "CONSISTENT, NOT EXACT",
// "IDENTICAL TO ONE-RANK TRAINING"), so the diagnosis of seqpar-repro's own dumps can be
// checked against its verdicts; the others say what only a user's files can show.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "apps/diagnose/inputs.h"
#include "apps/repro/analysis.h"

namespace seqpar::diagnose {

// The optimizer and mesh the run used, each known or not; `sources` says where each
// came from ("--lr", "ds_config.json", "seqpar-repro's metadata", "assumed: ...").
struct Settings {
  std::optional<double> lr, beta1, beta2, eps, weight_decay, clipping;
  int sp = 0, dp = 0;
  std::vector<std::string> sources;
};

// Where the ranks' copies of one tensor differ.
struct TensorDifference {
  std::string name;
  std::vector<int64_t> shape;
  int64_t differing = 0, elements = 0;  // elements not bitwise equal on every rank
  double max_difference = 0;            // max over elements of (max_r - min_r)
  int64_t first = -1;                   // flat index of the first differing element
  std::vector<int> ranks_unlike_rank0;  // at that element
};

struct Agreement {
  bool bitwise = true;
  int64_t differing = 0, elements = 0;
  double max_difference = 0;
  std::vector<TensorDifference> tensors;  // only those that differ
  std::vector<std::vector<int>> groups;   // ranks holding bitwise-equal copies
};

// The ranks' parameter differences against Adam's first-step rule: with m = (1-b1) g
// and v = (1-b2) g^2, the bias-corrected update is lr g / (|g| + eps), about lr sign(g).
struct FirstStepRule {
  repro::LrHistogram histogram;  // |p_r - p_0| / lr over r > 0 and every element
  bool two_lr_signature = false;  // the differences are 0 or about 2 lr, and some are 2 lr
  // With the gradients: opposite/same signs and how the copies ended (seqpar-repro's figures).
  std::optional<repro::SignAgreement> signs;
  int64_t rule_pairs = 0, rule_matching = 0;  // pairs whose difference the rule predicts to 1% of lr
  // With the initial parameters: each rank's own update is +-lr (or 0) per element.
  int64_t update_elements = 0, update_matching = 0;
};

struct ScaleFigure {
  double ratio = 0;          // ||g|| / ||g_ref||
  std::string cause;         // dist::name_scale's name, "" for 1 or none
  double direction_error = 0;  // ||g / ratio - g_ref|| / ||g_ref||
  double relative_error = 0;   // ||g - g_ref|| / ||g_ref||
  int64_t unlike_reference = 0;  // elements not bitwise equal
};

struct NormFigures {
  std::vector<float> clip_norms;             // [rank]
  std::vector<double> gradient_norms;        // [rank] ||grad.*||
  std::optional<double> mean_of_local_norms;  // mean over ranks of ||local_grad.*||
  std::optional<double> reference_norm;       // the reference's clip_norm, else ||its grad.*||
  bool ranks_agree = true;
  bool own_gradient_norms = false;  // each rank's clip norm is its own ||grad.*|| and they differ
  bool mean_of_partials = false;    // the clip norm is the mean of the local norms
  double to_gradient = 0;           // clip norm / ||grad.*|| (rank 0)
  std::string to_gradient_cause;
  std::optional<double> to_reference;  // clip norm / reference norm (rank 0)
  std::string to_reference_cause;
};

struct Cause {
  std::string pitfall;   // what went wrong, in a line
  std::string evidence;  // the figures that show it
  std::string fix;
  std::string scenario;  // the seqpar-repro command that reproduces it
};

struct Diagnosis {
  int ranks = 0;
  int64_t non_finite = 0;
  Agreement parameters;
  std::optional<Agreement> gradients;
  std::optional<FirstStepRule> first_step;  // with the lr and more than one rank
  // With exp_avg, exp_avg_sq and the betas: whether they are a first step's moments.
  std::optional<bool> moments_are_first_step;
  std::string gradients_from;  // "grad.*" or "exp_avg / (1 - beta1)"; "" when none
  std::optional<ScaleFigure> scale;        // rank 0's gradient (the ranks agree) against the reference
  std::optional<ScaleFigure> mean_scale;   // the mean of the ranks' gradients (they differ)
  std::optional<ScaleFigure> local_scale;  // the mean of the ranks' local gradients
  std::optional<NormFigures> norms;
  std::optional<bool> equals_reference;  // rank 0's parameters bitwise the reference's
  double max_difference_from_reference = 0;
  std::string layout;  // which group layout explains the ranks' groups
  std::string verdict, verdict_text;
  std::vector<Cause> causes;
  std::vector<std::string> notes;  // what could not be checked, and why
};

Diagnosis diagnose(const RunFiles& run, const Settings& settings);

// The parts, for the tests.
Agreement compare_ranks(const std::vector<std::vector<float>>& values, const TensorSet& layout,
                        const std::vector<std::string>& names);
FirstStepRule check_first_step(const RunFiles& run, const Settings& settings,
                               const std::vector<std::vector<float>>& gradients);
ScaleFigure scale_against(const std::vector<float>& gradient, const std::vector<float>& reference,
                          const Settings& settings);
// The mesh groups that match `groups` (ranks with equal copies), in words.
std::string explain_layout(const std::vector<std::vector<int>>& groups, int sp, int dp);
// The verdict, the causes and the notes, from the figures already in `diagnosis`.
void decide(Diagnosis& diagnosis);

// A figure as the report prints it: four significant digits (%.4g).
std::string number(double value);

}  // namespace seqpar::diagnose
