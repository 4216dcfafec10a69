#include "apps/repro/dropout_scenario.h"

#include <cstdio>
#include <string>
#include <vector>

#include "core/error.h"
#include "nn/dropout.h"
#include "nn/l1_loss.h"

namespace seqpar::repro {

uint64_t dropout_mask_offset(const ReproConfig& config, uint64_t random_offset, int64_t step) {
  const int64_t all_rows = config.data_parallel_size * config.rows;
  return random_offset + static_cast<uint64_t>(step) * nn::dropout_positions(all_rows, config.out_features);
}

namespace {

using autograd::Variable;

// The one-rank mask of step `step` over every replica's rows (1 kept, 0 dropped), on the host.
Tensor one_rank_mask(const ReproConfig& config, uint64_t random_offset, int64_t step) {
  const nn::DropoutMask mask{static_cast<float>(config.dropout), config.seed,
                             dropout_mask_offset(config, random_offset, step), 0};
  return nn::dropout_keep_mask(config.data_parallel_size * config.rows, config.out_features, mask);
}

ScenarioPlan plan(const ReproConfig& config, const RankData& data, const RankGroups& groups) {
  const Tensor& x = data.inputs;
  const int64_t rows = config.rows, out = config.out_features, dp = config.data_parallel_size;
  const int64_t sp = config.sequence_parallel_size;
  const int64_t global_count = dp * rows * out;
  const float p = static_cast<float>(config.dropout);
  const uint64_t seed = config.seed;
  // Every rank advances the offset by one whole mask per step, so each step draws fresh words.
  const auto offset_at = [config, first = data.random_offset](int64_t step) {
    return dropout_mask_offset(config, first, step);
  };

  // Rows [first, first + count) with the mask of rows [mask_first_row, + count).
  const auto masked = [=](int64_t first, int64_t count, int64_t mask_first_row, int64_t divisor) {
    return [=](const nn::Linear& model, StepContext& context) {
      const Variable y = nn::dropout(model.forward(rows_of(x, first, count)), p, seed, offset_at(context.step()),
                                     mask_first_row);
      context.backward(nn::l1_loss(y, target_of(x, first, count, out), nn::Reduction::sum_divided_by(divisor)));
    };
  };
  ScenarioPlan plan;
  plan.baseline = masked(0, x.size(0), 0, global_count);
  const RowRange shard = shard_of(rows, sp, groups.sp_rank);
  const int64_t replica_first = groups.dp_rank * rows, first = replica_first + shard.first;
  // The same seed and offset on every sp rank: each shard's mask starts at its replica's
  // first row, as if the shard were the whole sequence. Divided by the replica's count
  // for DeepSpeed's sum over sp and average over dp; by every replica's for the exact
  // sums, which add over sp x dp.
  plan.variants = {
      {"same seed and offset on every rank", masked(first, shard.count, replica_first, rows * out),
       sum_over_sp_average_over_dp, {}, false},
      {"mask keyed by global row", masked(first, shard.count, first, rows * out), sum_over_sp_average_over_dp, {},
       false},
      {"global row, exact sums", masked(first, shard.count, first, global_count), {}, {}, true},
  };
  if (groups.world->rank() == 0) {  // the notes and the dump are world rank 0's
    const Tensor mask = one_rank_mask(config, data.random_offset, 0);
    double kept = 0;
    for (const float value : mask.to_vector()) kept += value;
    kept /= static_cast<double>(mask.numel());
    const int64_t outside_first_shards = rows - shard_of(rows, sp, 0).count;
    const double q = 1.0 - static_cast<double>(p);
    const double expected = 2 * q * (1 - q) * static_cast<double>(outside_first_shards) / static_cast<double>(rows);
    plan.notes = {
        detail::concat("dropout     p = ", config.dropout, " on the Linear's output, kept values x ",
                       nn::dropout_scale(p), "; the mask of element"),
        detail::concat("            (row, column) is word offset + row x ", out,
                       " + column of repro.seed's stream, row the"),
        detail::concat("            global row of all ", dp * rows, " rows; offset ", data.random_offset,
                       " (after the data's words), + ", dropout_mask_offset(config, 0, 1), " a step"),
        detail::concat("masks       step 1's one-rank mask keeps ", percent_text(kept, 2), " (1 - p = ",
                       percent_text(q, 2), "); with the same seed and"),
        detail::concat("            offset on every rank, ",
                       percent_text(same_offset_mask_mismatch(config, data.random_offset, 0), 2),
                       " of the mask's elements are wrong (independent"),
        detail::concat("            words: 2p(1-p) x the rows beyond the first shards = ", percent_text(expected, 2),
                       ")"),
    };
    plan.dump_tensors = {{"dropout_mask", mask}};
  }
  return plan;
}

void check(const ReproConfig& config) {
  SEQPAR_INPUT_CHECK(config.dropout > 0, "scenario dropout: repro.dropout = ", config.dropout,
                     " drops nothing, so every variant would be right; set it in (0, 1)");
  // The op keeps an element with probability 1 - p in float32, which is 1 for p up to
  // 2^-25 (about 3e-08): such a p drops nothing either.
  SEQPAR_INPUT_CHECK(nn::dropout_keep_probability(static_cast<float>(config.dropout)) < 1.0f,
                     "scenario dropout: repro.dropout = ", config.dropout,
                     " drops nothing: 1 - p rounds to 1 in float32 (p must exceed about 3e-08)");
}

}  // namespace

double same_offset_mask_mismatch(const ReproConfig& config, uint64_t random_offset, int64_t step) {
  const int64_t rows = config.rows, out = config.out_features, sp = config.sequence_parallel_size;
  const std::vector<float> mask = one_rank_mask(config, random_offset, step).to_vector();
  int64_t wrong = 0;
  for (int64_t replica = 0; replica < config.data_parallel_size; ++replica) {
    for (int64_t rank = 0; rank < sp; ++rank) {
      const RowRange shard = shard_of(rows, sp, rank);
      // The rank draws the words of rows [replica start, + count) for its rows [first, + count).
      const int64_t drawn = replica * rows * out, right = (replica * rows + shard.first) * out;
      for (int64_t i = 0; i < shard.count * out; ++i) {
        wrong += mask[static_cast<size_t>(drawn + i)] != mask[static_cast<size_t>(right + i)];
      }
    }
  }
  return static_cast<double>(wrong) / static_cast<double>(mask.size());
}

const PitfallScenario& dropout_scenario() {
  static const PitfallScenario scenario{
      "dropout",
      "dropout on the Linear's output, its mask drawn per shard or by global row, against one rank on all rows",
      "every rank calls dropout on its own shard with the same seed and offset, so it reads\n"
      "the words of positions 0, 1, ... of its shard: each shard gets the mask of the first\n"
      "shard's rows. The ranks agree and the mask keeps 1 - p of the elements, so nothing\n"
      "looks wrong, but no one-rank run draws that mask and the gradient follows it. Keying\n"
      "each element's word by its global row (offset + row x columns + column) gives every\n"
      "shard its rows of the one-rank mask: the one-rank gradient up to rounding, and with\n"
      "the exact sums bit for bit.\n",
      check, plan};
  return scenario;
}

}  // namespace seqpar::repro
