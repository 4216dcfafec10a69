// Scenario "zero-stage": the gradient's scale under each of DeepSpeed's gradient
// reductions and each loss convention of sequence parallelism, measured.
//
// DeepSpeed's ZeRO stages 0-2 sum the gradients over the sequence-parallel ranks and
// average them over the data-parallel replicas; ZeRO-3's reduce-scatter averages over
// the whole sp x dp group. A rank's loss, for its part, can be
//   - the mean over its own rows (the report's script),
//   - its rows' share of the global mean (divided by the global row count),
//   - the mean over the replica's rows after an all-gather of the outputs whose backward
//     sums the gradients over the ranks (torch.distributed.nn.functional.all_gather),
//   - the same after an all-gather whose backward keeps each rank's own slice
//     (DeepSpeed's sequence cross_entropy).
// Each pairing gives a gradient 1, sp or 1/sp times the one-rank gradient; the table
// comes out of the runs (the first step's gradient norm against the one-rank
// reference's), not out of the code, and each factor is named (dist::name_scale).
// Every variant starts from the same initial parameters as the one-rank baseline.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "apps/repro/config.h"
#include "apps/repro/pitfall.h"
#include "apps/repro/policy_step.h"
#include "core/device.h"

namespace seqpar::repro {

enum class LossConvention { LocalMean, GlobalCount, GatherSumBackward, GatherSliceBackward };
enum class GradientReduction { SumSpAverageDp, AverageAll };

struct ZeroStageVariant {
  LossConvention loss;
  GradientReduction reduction;
  // The rows summed exactly over sp x dp inside backward (no reduction after it):
  // with the global-count loss, one-rank training bit for bit.
  bool exact = false;
};

// The kit's figures of a variant (pitfall.h), with the variant they are of.
struct ZeroStageFigures : VariantFigures {
  ZeroStageVariant variant;
};

struct ZeroStageResults {
  ReproConfig config;
  std::string placement, mesh_layout;
  double baseline_norm = 0;  // the one-rank gradient norm at step 1
  std::vector<ZeroStageFigures> variants;
};

const char* loss_convention_name(LossConvention loss);
const char* gradient_reduction_name(GradientReduction reduction);
// Every variant, in the report's order: each loss convention under each reduction (only
// the one ds_config.zero_optimization.stage selects, when given), then the exact one.
std::vector<ZeroStageVariant> zero_stage_variants(const ReproConfig& config);

// Fails (InputError) unless the replica's rows split evenly over sp, which the
// all-gather needs (one size everywhere). main checks it before any rank starts.
void check_zero_stage_config(const ReproConfig& config);

// Runs every variant on every rank (the same arguments everywhere); the figures on world
// rank 0, an empty result elsewhere (check_zero_stage_config first).
ZeroStageResults run_zero_stage(const RankGroups& groups, const ReproConfig& config, Device device,
                                const std::string& placement);

void print_zero_stage(std::ostream& out, const ZeroStageResults& results);
// The figures as --json's document (schema seqpar-repro-zero-stage/2).
nlohmann::json zero_stage_json(const ZeroStageResults& results);

}  // namespace seqpar::repro
