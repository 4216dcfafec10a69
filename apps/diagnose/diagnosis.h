// What seqpar-diagnose concludes from a run's saved tensors: the figures (each computed
// only when the tensors it needs were given), the verdict, and the catalogued pitfalls
// the evidence points to. Pure functions of the files' values and the settings.
//
// The verdicts are seqpar-repro's (one vocabulary, apps/common/verdict.h), so the
// diagnosis of seqpar-repro's own dumps can be checked against its verdicts; some say
// what only a user's files can show or leave open.
// "Consistent" and "one-rank training" are said only of what was compared: each verdict
// comes with its evidence lines, what was checked and what could not be.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "apps/common/verdict.h"
#include "apps/diagnose/attention_evidence.h"
#include "apps/diagnose/inputs.h"
#include "apps/diagnose/precision.h"
#include "apps/common/first_step.h"
#include "apps/common/text.h"  // number_text: a figure as the reports print it

namespace seqpar::diagnose {

// The optimizer and mesh the run used, each known or not; `sources` says where each
// came from ("--lr", "ds_config.json", "seqpar-repro's metadata", "assumed: ...").
struct Settings {
  std::optional<double> lr, beta1, beta2, eps, weight_decay, clipping;
  int sp = 0, dp = 0;
  RunPrecision precision;          // what every rounding tolerance is derived from (precision.h)
  std::optional<int64_t> tokens;   // tokens of the batch: the length of a weight gradient's sum
  std::optional<AttentionLayout> attention_layout;  // --attention-layout; else read from the shapes
  std::vector<std::string> sources;
};

// The tolerances of one diagnosis, from the run's precision (precision.h): what two
// correct runs can differ by. `tokens_assumed`: the batch's token count was unknown and
// kAssumedTokens stood in for it (the report says so).
struct Tolerances {
  Precision precision = Precision::Float32;
  int64_t tokens = 0;
  int64_t sequence = 0;  // the attention's keys per query (S); `tokens` when unknown
  bool sequence_known = false;  // S from the saved attention
  bool tokens_assumed = false;
  double gradient = 0;  // normwise relative: gradient_bound(precision, tokens, sequence)
  double scale = 0;     // |ratio - 1|: the larger of kScaleRounding and `gradient`
};
// 2^13 tokens when the batch's count is unknown: with it float32's bound is 2.2e-5, the
// order of the 1e-5 seqpar-repro judges its float32 gradients by (kGradientRounding);
// the report says it was assumed and asks for --tokens.
constexpr int64_t kAssumedTokens = 8192;
// `tokens`: the settings', else the attention's rows (all sequences), else
// kAssumedTokens; `sequence`: the attention's S, else `tokens`.
Tolerances tolerances_of(const Settings& settings, const std::optional<AttentionFigures>& attention);

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
  LrHistogram histogram;  // |p_r - p_0| / lr over r > 0 and every element
  bool two_lr_signature = false;  // the differences are 0 or about 2 lr, and some are 2 lr
  // With the gradients: opposite/same signs and how the copies ended (seqpar-repro's figures).
  std::optional<SignAgreement> signs;
  int64_t rule_pairs = 0, rule_matching = 0;  // pairs whose difference the rule predicts to 1% of lr
  // With the initial parameters: each rank's own update is +-lr (or 0) per element.
  int64_t update_elements = 0, update_matching = 0;
};

struct ScaleFigure {
  std::string from;          // what was compared: "grad.*", "exp_avg", ...
  // "" or which side is all zeros ("the ranks' gradient", "the baseline's gradient",
  // "both gradients"): then no ratio is formed and the figures below are NaN.
  std::string zero;
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

// A fix is given only where the evidence tells the cause apart from the others it could
// be; otherwise `fix` is empty and `tell_apart` says what would tell them apart.
struct Cause {
  std::string pitfall;   // what went wrong, in a line
  std::string evidence;  // the figures that show it
  std::string fix;       // "" when the evidence leaves several causes open
  std::string scenario;  // the seqpar-repro command that reproduces it
  std::string tell_apart = "";  // what to save or check to tell the open causes apart
};

// One thing the verdict rests on: what was checked and what it showed, or why it could
// not be checked with the files given and what to save to check it.
struct EvidenceLine {
  std::string check;  // "gradient scale"
  bool checked = false;
  std::string text;   // the finding, or "save grad.* or exp_avg"
};

// Rank 0's parameters against the baseline's, element by element, with a tolerance
// derived from the numbers: kRoundingUlps units in the last place of the baseline's
// value in the run's precision (a bf16 parameter's ulp, not float32's), plus 1% of lr when the lr is known (Adam's first step moves a parameter by
// about lr, so a distance near lr is a step taken differently, not rounding).
struct ParameterDistance {
  bool bitwise = false;
  double max_difference = 0;
  std::optional<double> max_in_lr;  // max_difference / lr
  int64_t beyond_tolerance = 0, elements = 0;
  int64_t beyond_two_lr = 0;        // more than 2.5 lr apart: more than a step can explain
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
  std::optional<ParameterDistance> baseline_distance;  // with --baseline
  std::optional<AttentionFigures> attention;  // the ranks' and the baseline's 'attention', by shard
  Tolerances tolerances;
  std::string layout;  // which group layout explains the ranks' groups
  Verdict kind = Verdict::Skipped;
  std::string verdict, verdict_text;  // verdict_name(kind), and what it rests on in words
  std::vector<Cause> causes;
  std::vector<EvidenceLine> evidence;  // what the verdict rests on, in order
  std::vector<std::string> notes;      // about the files and settings
};

Diagnosis diagnose(const RunFiles& run, const Settings& settings);

// The parts, for the tests.
Agreement compare_ranks(const std::vector<std::vector<float>>& values, const TensorSet& layout,
                        const std::vector<std::string>& names);
FirstStepRule check_first_step(const RunFiles& run, const Settings& settings,
                               const std::vector<std::vector<float>>& gradients);
ScaleFigure scale_against(const std::vector<float>& gradient, const std::vector<float>& baseline,
                          const Settings& settings);
ParameterDistance parameter_distance(const std::vector<float>& parameters, const std::vector<float>& baseline,
                                     const std::optional<double>& lr, Precision precision = Precision::Float32);
// The mesh groups that match `groups` (ranks with equal copies), in words.
std::string explain_layout(const std::vector<std::vector<int>>& groups, int sp, int dp);
// Rank 0's parameters, and the ranks' gradients (rank 0's when they agree, else their
// mean, and the mean of their local gradients), against the baseline (baseline.cpp).
void compare_with_baseline(const RunFiles& run, const Settings& settings, const std::vector<float>& parameters,
                           Diagnosis& diagnosis);
// Shared by figures.cpp and baseline.cpp: "grad." + each name; the elementwise mean
// over ranks; whether Adam's moments are a first step's.
std::vector<std::string> prefixed(const std::string& prefix, const std::vector<std::string>& names);
std::vector<float> mean_of(const std::vector<std::vector<float>>& values);
bool moments_of_first_step(const std::vector<float>& m, const std::vector<float>& v, double b1, double b2,
                           Precision precision = Precision::Float32);
// The verdict, the causes and the notes, from the figures already in `diagnosis`.
void decide(Diagnosis& diagnosis);
// The evidence lines, from the figures and what the files held (evidence.cpp).
void gather_evidence(Diagnosis& diagnosis, const RunFiles& run, const Settings& settings);

// The attention tensors (attention_evidence.cpp): their figures and the cause they name
// (before decide); their evidence line, and the verdict raised when the attention is
// wrong (after gather_evidence); the diagnosis of files with attention and no parameters.
void compare_attention(const RunFiles& run, const Settings& settings, Diagnosis& diagnosis);
void attention_evidence(Diagnosis& diagnosis, const RunFiles& run, const Settings& settings);
Diagnosis diagnose_attention_only(const RunFiles& run, const Settings& settings);

}  // namespace seqpar::diagnose
