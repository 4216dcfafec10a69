#include "apps/repro/masked_tokens.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "autograd/ops.h"
#include "core/error.h"
#include "core/generator.h"
#include "nn/l1_loss.h"

namespace seqpar::repro {

namespace {

using autograd::Variable;

// The mask's numbers come from the configured seed's Philox stream at this position:
// far beyond every value the parameters and x could draw (memory bounds x to well
// below 2^50 values), so the mask never reuses a number of the data's.
constexpr uint64_t kMaskStreamOffset = uint64_t{1} << 60;

// The chance that a row is ignored, by its shard: from 10% to 80% over the sp ranks,
// rotating with the micro-batch, so each rank's count differs from the others' and
// from micro-batch to micro-batch. With one rank, micro-batches alternate.
double ignored_share(int64_t micro_batch, int64_t sp_rank, int64_t sp) {
  const int64_t level = sp > 1 ? (sp_rank + micro_batch) % sp : micro_batch % 2;
  return 0.1 + 0.7 * static_cast<double>(level) / static_cast<double>(std::max<int64_t>(sp - 1, 1));
}

// Every shard of the step: replica d, micro-batch k, sp rank r, as rows of x.
struct Shard {
  int64_t replica, micro_batch, sp_rank;
  RowRange rows;  // absolute rows of x
};

std::vector<Shard> shards_of(const ReproConfig& config) {
  const int64_t sp = config.sequence_parallel_size;
  std::vector<Shard> shards;
  for (int64_t d = 0; d < config.data_parallel_size; ++d) {
    const std::vector<RowRange> batches = micro_batches_of(config.rows, config.gradient_accumulation_steps);
    for (size_t k = 0; k < batches.size(); ++k) {
      for (int64_t r = 0; r < sp; ++r) {
        const RowRange part = shard_of(batches[k].count, sp, r);
        shards.push_back({d, static_cast<int64_t>(k), r,
                          {d * config.rows + batches[k].first + part.first, part.count}});
      }
    }
  }
  return shards;
}

int64_t valid_rows(const std::vector<float>& mask, RowRange rows) {
  int64_t valid = 0;
  for (int64_t i = rows.first; i < rows.first + rows.count; ++i) valid += mask[static_cast<size_t>(i)] != 0.0f;
  return valid;
}

ScenarioPlan plan(const ReproConfig& config, const RankData& data, const RankGroups& groups) {
  const Tensor& x = data.inputs;
  const Device device = x.device();
  const int64_t out = config.out_features, ga = config.gradient_accumulation_steps;
  const int64_t sp = config.sequence_parallel_size;
  const std::vector<float> mask_values = masked_tokens_mask(config);
  const int64_t all_rows = static_cast<int64_t>(mask_values.size());
  const Tensor mask = Tensor::from_data({all_rows}, mask_values, device);

  // This rank's part of each micro-batch, every rank's valid rows over the step, and
  // how uneven the parts' counts are.
  std::vector<RowRange> mine;
  std::vector<int64_t> valid_per_rank(static_cast<size_t>(config.data_parallel_size * sp), 0);
  double lowest = 1, highest = 0;
  int64_t fewest = all_rows, most = 0;
  for (const Shard& shard : shards_of(config)) {
    const int64_t valid = valid_rows(mask_values, shard.rows);
    valid_per_rank[static_cast<size_t>(shard.replica * sp + shard.sp_rank)] += valid;
    if (shard.replica == groups.dp_rank && shard.sp_rank == groups.sp_rank) mine.push_back(shard.rows);
    const double ignored = 1.0 - static_cast<double>(valid) / static_cast<double>(shard.rows.count);
    lowest = std::min(lowest, ignored);
    highest = std::max(highest, ignored);
    fewest = std::min(fewest, valid);
    most = std::max(most, valid);
  }
  const int64_t rank_valid = valid_per_rank[static_cast<size_t>(groups.dp_rank * sp + groups.sp_rank)];
  const int64_t total_valid = valid_rows(mask_values, {0, all_rows});
  // num_items_in_batch: the valid rows of every rank's micro-batches, all-reduced over
  // sp x dp as the trainer gathers them. A count below 2^24 (check() sees to it) is
  // exact in float32, and the all-reduce adds exactly.
  Tensor counted = Tensor::from_data({1}, {static_cast<float>(rank_valid)}, device);
  groups.sequence_data_parallel->all_reduce(counted, dist::ReduceOp::Sum);
  const int64_t global_valid = static_cast<int64_t>(counted.item());
  SEQPAR_CHECK(global_valid == total_valid, "masked-tokens: the ranks' valid rows add up to ",
               global_valid, ", but the mask holds ", total_valid);

  ScenarioPlan plan;
  // One rank: every replica's rows at once, the mean over every valid row.
  plan.baseline = [=](const nn::Linear& model, StepContext& context) {
    context.backward(nn::l1_loss(model.forward(rows_of(x, 0, all_rows)), target_of(x, 0, all_rows, out),
                                 nn::Reduction::mean(), mask));
  };
  // One backward per micro-batch, each on this rank's part of it.
  const auto accumulate = [=](nn::Reduction reduction, float loss_factor) {
    return [=](const nn::Linear& model, StepContext& context) {
      for (const RowRange& part : mine) {
        Variable loss = nn::l1_loss(model.forward(rows_of(x, part.first, part.count)),
                                    target_of(x, part.first, part.count, out), reduction,
                                    mask.narrow(0, part.first, part.count));
        if (loss_factor != 1.0f) loss = autograd::mul(loss, loss_factor);
        context.backward(loss);
      }
    };
  };
  const nn::Reduction global_count = nn::Reduction::sum_divided_by(global_valid * out);
  plan.variants = {
      // The trainer before the fix: each micro-batch's mean over its valid tokens, the
      // loss divided by the accumulation steps, DDP's average over the ranks.
      {"per-micro-batch mean, averaged", accumulate(nn::Reduction::mean(), 1.0f / static_cast<float>(ga)),
       average_over_all, {}, false},
      // Counted over the rank's whole step, but each rank by its own count.
      {"per-rank count, averaged", accumulate(nn::Reduction::sum_divided_by(rank_valid * out), 1.0f),
       average_over_all, {}, false},
      // num_items_in_batch: every part divided by the global count, all of it summed.
      {"global count (num_items_in_batch)", accumulate(global_count, 1.0f), sum_over_all, {}, false},
      {"global count, exact sums", accumulate(global_count, 1.0f), {}, {}, true},
  };

  std::string sizes, per_rank;
  for (const RowRange& batch : micro_batches_of(config.rows, ga)) {
    sizes += (sizes.empty() ? "" : ", ") + std::to_string(batch.count);
  }
  for (const int64_t valid : valid_per_rank) per_rank += (per_rank.empty() ? "" : " ") + std::to_string(valid);
  plan.notes = {
      detail::concat("mask        ", all_rows - total_valid, " of ", all_rows, " rows ignored (label -100); ",
                     total_valid, " valid: the one-rank mean's count"),
      detail::concat("            ignored per rank and micro-batch: ", percent_text(lowest, 0), " to ",
                     percent_text(highest, 0), "; valid rows there: ", fewest, " to ", most),
      detail::concat("accumulate  ", ga, " micro-batch(es) per step of ", sizes, " rows per replica"),
      detail::concat("            valid rows per rank over the step: ", per_rank)};
  plan.dump_tensors = {{"mask", mask}};
  return plan;
}

void check(const ReproConfig& config) {
  const int64_t ga = config.gradient_accumulation_steps, sp = config.sequence_parallel_size;
  const int64_t shares = ga * (ga + 1) / 2;  // validate() bounds ga, so this cannot overflow
  SEQPAR_INPUT_CHECK(config.rows / shares >= sp, "scenario masked-tokens: repro.rows = ", config.rows,
                     " is too few for ds_config.gradient_accumulation_steps = ", ga,
                     " and ds_config.sequence_parallel_size = ", sp,
                     ": the smallest micro-batch (rows x 1/", shares, ") must give every rank a row; ",
                     "at least ", sp * shares, " rows");
  SEQPAR_INPUT_CHECK(config.rows * config.data_parallel_size <= (int64_t{1} << 24),
                     "scenario masked-tokens: repro.rows x ds_config.data_parallel_size = ",
                     config.rows * config.data_parallel_size,
                     " must be at most 2^24, where the valid-row count all-reduced in float32 stays exact");
}

}  // namespace

std::vector<RowRange> micro_batches_of(int64_t rows, int64_t ga) {
  const int64_t shares = ga * (ga + 1) / 2;
  std::vector<RowRange> batches;
  int64_t first = 0;
  for (int64_t k = 0; k < ga; ++k) {
    const int64_t count = k + 1 < ga ? rows * (k + 1) / shares : rows - first;
    batches.push_back({first, count});
    first += count;
  }
  return batches;
}

std::vector<float> masked_tokens_mask(const ReproConfig& config) {
  Generator generator(config.seed, kMaskStreamOffset);
  const int64_t all_rows = config.data_parallel_size * config.rows;
  const std::vector<float> uniform = generator.uniform({all_rows}, 0.0f, 1.0f).to_vector();
  std::vector<float> mask(static_cast<size_t>(all_rows), 1.0f);
  for (const Shard& shard : shards_of(config)) {
    const double share = ignored_share(shard.micro_batch, shard.sp_rank, config.sequence_parallel_size);
    const auto first = static_cast<size_t>(shard.rows.first), end = first + static_cast<size_t>(shard.rows.count);
    for (size_t i = first; i < end; ++i) mask[i] = uniform[i] <= share ? 0.0f : 1.0f;
    // A part with no valid row would make a local mean NaN (torch's mean of nothing):
    // a real failure, but another one; this scenario is about the weights.
    if (valid_rows(mask, shard.rows) == 0) mask[first] = 1.0f;
  }
  return mask;
}

const PitfallScenario& masked_tokens_scenario() {
  static const PitfallScenario scenario{
      "masked-tokens",
      "ignored tokens (label -100) under gradient accumulation and sequence parallelism, "
      "against one rank's mean over every valid row",
      "a mean over a part's own valid tokens weighs each token by 1/(that part's count), so\n"
      "averaging such means over micro-batches and ranks gives (x1/n1 + x2/n2)/2, not\n"
      "(x1 + x2)/(n1 + n2): tokens of sparsely valid parts count more (a per-rank count\n"
      "fixes the micro-batches, not the ranks). Dividing every part's sum by the global\n"
      "valid count (num_items_in_batch, all-reduced) and summing gives the one-rank mean.\n",
      check, plan};
  return scenario;
}

}  // namespace seqpar::repro
