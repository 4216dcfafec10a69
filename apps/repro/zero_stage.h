// Scenario "zero-stage": the gradient's scale under each of DeepSpeed's gradient
// reductions (ZeRO 0-2: a sum over sp, an average over dp; ZeRO-3's reduce-scatter: an
// average over sp x dp) and each loss convention of sequence parallelism, measured by
// the pitfall kit (pitfall.h) against the one-rank gradient and named (dist::name_scale).
#pragma once

#include <iosfwd>
#include <vector>

#include "apps/repro/pitfall.h"

namespace seqpar::repro {

// A rank's loss: the mean over its own rows (the report's script), its rows' share of
// the global mean, or the replica's mean after an all-gather of the outputs whose
// backward sums over the ranks (torch.distributed.nn.functional.all_gather) or keeps
// each rank's slice (DeepSpeed's sequence cross_entropy).
enum class LossConvention { LocalMean, GlobalCount, GatherSumBackward, GatherSliceBackward };
enum class GradientReduction { SumSpAverageDp, AverageAll };

struct ZeroStageVariant {
  LossConvention loss;
  GradientReduction reduction;
  // The rows summed exactly over sp x dp inside backward (no reduction after it):
  // with the global-count loss, one-rank training bit for bit.
  bool exact = false;
};

// The kit's figures of a variant, with the variant they are of.
struct ZeroStageFigures : VariantFigures {
  ZeroStageVariant variant;
};

struct ZeroStageResults {
  PitfallResults run;
  std::vector<ZeroStageFigures> variants;  // run.variants, in the report's order
};

const char* loss_convention_name(LossConvention loss);
const char* gradient_reduction_name(GradientReduction reduction);

// Fails (InputError) unless the replica's rows split evenly over sp, which the
// all-gather needs (one size everywhere).
void check_zero_stage_config(const ReproConfig& config);

// Runs every variant on every rank (the same arguments everywhere); the figures on world
// rank 0, an empty result elsewhere.
ZeroStageResults run_zero_stage(const RankGroups& groups, const ReproConfig& config, Device device,
                                const std::string& placement);

void print_zero_stage(std::ostream& out, const ZeroStageResults& results);

}  // namespace seqpar::repro
