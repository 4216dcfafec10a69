// The kit seqpar-repro's pitfall scenarios are built from (shifted-targets,
// clipping-norms, dropout, masked-tokens, zero-stage).
//
// A scenario is a one-rank baseline and a list of variants, each one way a
// sequence-parallel job computes its gradient: the loss each rank takes on its rows
// (and micro-batches), how the ranks' gradients are combined, the norm it clips with.
// The kit trains the baseline and every variant from the same initial state on the same
// data and measures each variant against the baseline (VariantFigures).
//
// A variant marked `exact` keeps the exact row sums of its backward passes
// (nn/exact_gradients.h) and adds them over every micro-batch and every rank of sp x dp
// before it rounds once, so a loss normalized by the global count gives the one-rank
// gradient bit for bit, and the kit checks that it does.
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "apps/common/safetensors.h"
#include "apps/common/text.h"
#include "apps/repro/config.h"
#include "apps/repro/pipeline.h"
#include "apps/repro/policy.h"
#include "apps/repro/progress.h"
#include "apps/repro/scenario.h"
#include "autograd/variable.h"
#include "core/device.h"
#include "nn/exact_gradients.h"
#include "nn/linear.h"

namespace seqpar::repro {

// What a variant's step function gets: the step (from 0) and how to run a backward pass.
class StepContext {
 public:
  // exact_gradients: where an exact variant's backward passes keep their row sums.
  StepContext(int64_t step, nn::ExactGradients* exact_gradients);

  int64_t step() const { return step_; }

  // loss.backward(), once per micro-batch. Plain: the gradients accumulate in float32,
  // as frameworks accumulate them. Exact: the row sums add up exactly (see above).
  void backward(const autograd::Variable& loss);

 private:
  int64_t step_;
  nn::ExactGradients* exact_gradients_;
};

using StepFunction = std::function<void(const nn::Linear& model, StepContext& context)>;
using Parameters = std::vector<autograd::Variable>;

struct Variant {
  std::string name;  // a row of the report: "shard-local shift"
  // Forward, loss and backward on this rank (all rows for the baseline).
  StepFunction backward;
  // Combines the ranks' gradients; empty: nothing more to combine (exact variants).
  std::function<void(const Parameters&, const RankGroups&)> reduce;
  // The norm the step clips with; empty: the norm of the combined gradient.
  std::function<Tensor(const Parameters&, const RankGroups&)> clip_norm;
  bool exact = false;  // backward keeps exact row sums, added across sp x dp (see above)
};

// One scenario's plan for this rank (the same on every rank but for the data it cuts).
struct ScenarioPlan {
  StepFunction baseline;           // one rank, all rows, no combining
  std::vector<Variant> variants;   // in the report's order
  std::vector<std::string> notes;  // facts of the data, printed above the table
  NamedTensors dump_tensors;       // scenario inputs beside x, W and b in --dump
};

struct PitfallScenario {
  std::string name;   // --scenario
  std::string title;  // the report's first line
  std::string why;    // the causes, printed under the table
  // Fails (InputError, naming the key) when the configuration cannot run the scenario.
  std::function<void(const ReproConfig&)> check;
  std::function<ScenarioPlan(const ReproConfig&, const RankData&, const RankGroups&)> plan;
};

// A variant against the one-rank baseline.
struct VariantFigures {
  std::string name;
  bool exact = false;
  double gradient_scale = 0;  // ||g|| / ||g_ref|| at step 1 (rank 0's combined gradient)
  std::string cause;          // the scale named ("x sp (4)"), "" when it is 1 or unnamed
  double gradient_error = 0;  // ||g - g_ref|| / ||g_ref|| at step 1
  double clip_norm_scale = 0;  // the norm the step clipped with / the baseline's
  std::string clip_cause;
  bool ranks_agree = true;       // every rank's parameters bitwise equal after the last step
  bool equals_baseline = false;  // rank 0's final parameters, bitwise
  double max_difference = 0;     // rank 0's final parameters, largest |difference|
  double seconds_per_step = 0;
};

// --dump's files: a name and its tensors.
using DumpTensors = std::vector<std::pair<std::string, NamedTensors>>;

struct PitfallResults {
  std::string scenario, title, why;
  ReproConfig config;
  std::string placement, mesh_layout;
  double baseline_norm = 0;  // the one-rank gradient norm at step 1
  std::vector<std::string> notes;
  std::vector<VariantFigures> variants;
  // With --dump: inputs.safetensors (x, weight, bias, the plan's tensors), then
  // reference and variant<i>.safetensors (grad.* at step 1, final weight, bias, clip_norm).
  DumpTensors dump;
};

// Runs `scenario` on every rank (the same arguments everywhere): the baseline on world
// rank 0, every variant on every rank. The figures (with `keep_dump`, the dump's tensors)
// on world rank 0, which tells `progress` where it is; an empty result elsewhere.
PitfallResults run_pitfall(const PitfallScenario& scenario, const RankGroups& groups,
                           const ReproConfig& config, Device device, const std::string& placement,
                           bool keep_dump = false, Progress* progress = nullptr);

// The model, placement and mesh lines every scenario's report starts with.
void print_run_header(std::ostream& out, const ReproConfig& config, const std::string& placement,
                      const std::string& mesh_layout);
void print_pitfall(std::ostream& out, const PitfallResults& results);

// The kit's scenarios, each described in its file (shifted_targets.cpp, clipping_norms.cpp,
// dropout_scenario.h, masked_tokens.h).
const PitfallScenario& shifted_targets_scenario();
const PitfallScenario& clipping_norms_scenario();
const PitfallScenario& dropout_scenario();
const PitfallScenario& masked_tokens_scenario();

// The pipeline's Scenario for one of the kit's scenarios (pipeline.h), reported by
// print_pitfall and --json's schema seqpar-repro-pitfall/2; or by `own_report`, with no
// --dump.
std::unique_ptr<Scenario> kit_scenario(
    const PitfallScenario& scenario,
    std::function<Results(const PitfallResults&)> own_report = nullptr);

// The --json keys every kit scenario's document shares: the run's (with an empty
// "variants") and each variant's figures.
nlohmann::json run_json(const PitfallResults& results);
nlohmann::json figures_json(const VariantFigures& figures);

// What world rank 0 hands the pipeline: the report, --json's document and --dump's files.
Results scenario_results(std::string text, nlohmann::json json, DumpTensors dump);

// Refuses --policy and --plot, which only issue-6868 takes, naming `scenario`.
void check_takes_no_policy_or_plot(const std::string& scenario, const Request& request);

// Helpers the scenarios share.
// Rows [first, first + count) of x as a Variable, and its first `out` columns, the
// model's target (the default scenario's: y should reproduce x's leading features).
autograd::Variable rows_of(const Tensor& x, int64_t first, int64_t count);
autograd::Variable target_of(const Tensor& x, int64_t first, int64_t count, int64_t out);
// The rows [first, first + count) of a replica's `rows` that sequence-parallel rank
// `sp_rank` of `sp` holds, split as torch.tensor_split splits them (the first rows % sp
// ranks hold one row more).
struct RowRange {
  int64_t first = 0, count = 0;
};
RowRange shard_of(int64_t rows, int64_t sp, int64_t sp_rank);
// The combined-gradient conventions of DeepSpeed's reductions over sp x dp: ZeRO 0-2's,
// and the plain sum and average over every rank (DDP's; ZeRO-3's reduce-scatter).
void sum_over_sp_average_over_dp(const Parameters& parameters, const RankGroups& groups);
void sum_over_all(const Parameters& parameters, const RankGroups& groups);
void average_over_all(const Parameters& parameters, const RankGroups& groups);
// The parameters' gradients or values, one after another, on the host.
std::vector<float> flat_values(const Parameters& parameters, bool gradients);
// The largest |a[i] - b[i]| over i in [first, last).
double max_difference(const std::vector<float>& a, const std::vector<float>& b, size_t first, size_t last);
// A share as a percentage with `decimals` decimals ("12%", "0.25%"), for the reports.
std::string percent_text(double share, int decimals);

}  // namespace seqpar::repro
