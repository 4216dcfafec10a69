// The ulysses scenario: its exact variant trains as one rank, bit for bit, over sp 2, 4
// and sp 2 x dp 2 for several steps; every mistake gets its verdict and the figure that
// names it; the shard-local-mask attention agrees with the op where the two masks agree.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <string>

#include "apps/repro/scenario.h"
#include "apps/repro/ulysses.h"
#include "apps/repro/ulysses_mask.h"
#include "core/generator.h"
#include "dist/local_process_group.h"
#include "nn/attention.h"
#include "tests/test_util.h"

using namespace seqpar;
using namespace seqpar::repro;

namespace {

UlyssesResults run_on_threads(const ReproConfig& config) {
  UlyssesResults results;
  dist::run_local_world(static_cast<int>(config.world_size()), [&](std::shared_ptr<dist::ProcessGroup> world) {
    const RankGroups groups = rank_groups(world, config);
    UlyssesResults mine = run_ulysses(groups, config, Device::cpu(), "test");
    if (world->rank() == 0) results = std::move(mine);
  });
  decide_ulysses(results);
  return results;
}

ReproConfig small(int64_t sp, int64_t dp, int64_t steps) {
  ReproConfig config;
  config.scenario = "ulysses";
  config.rows = 64;
  config.in_features = config.out_features = 16;
  config.heads = 4;
  config.head_dim = 4;
  config.sequence_parallel_size = sp;
  config.data_parallel_size = dp;
  config.steps = steps;
  config.adamw.lr(1e-3);
  return config;
}

std::map<std::string, const UlyssesFigures*> by_key(const UlyssesResults& results) {
  std::map<std::string, const UlyssesFigures*> figures;
  for (const UlyssesFigures& f : results.variants) figures[f.variant.key] = &f;
  return figures;
}

}  // namespace

TEST_CASE("ulysses: the exact variant is one-rank training bit for bit, every step", "[app][cpu]") {
  for (const auto& [sp, dp] : std::vector<std::pair<int64_t, int64_t>>{{2, 1}, {4, 1}, {2, 2}}) {
    INFO("sp " << sp << " x dp " << dp);
    const UlyssesResults results = run_on_threads(small(sp, dp, 3));
    const UlyssesFigures& exact = *by_key(results).at("exact");
    CHECK(exact.as_expected);
    CHECK(exact.diverged_at_step == 0);
    CHECK(exact.parameters_differing == 0);
    CHECK(exact.output_difference == 0);
    REQUIRE(exact.trace.parameters.size() == 3);
    for (size_t step = 0; step < 3; ++step) {
      CHECK(exact.trace.parameters[step] == results.baseline.parameters[step]);
      CHECK(exact.trace.rank_spread[step] == 0);
    }
    // The parameters moved: equality is not that of an untrained model.
    CHECK(results.baseline.parameters[0] != results.baseline.parameters[2]);
  }
}

TEST_CASE("ulysses: every variant's verdict, and the figure that names each mistake", "[app][cpu]") {
  const ReproConfig config = small(4, 1, 2);
  const UlyssesResults results = run_on_threads(config);
  const auto f = by_key(results);
  for (const UlyssesFigures& figures : results.variants) {
    INFO(figures.variant.name << ": " << figures.verdict);
    CHECK(figures.as_expected);
  }
  // correct: attention bitwise one rank's, ranks agree, parameters close but float sums.
  CHECK(f.at("correct")->output_difference == 0);
  CHECK(f.at("correct")->parameter_difference < 1e-5);
  // no all-to-all: shard 0 sees all its keys (causal); later shards lose mass.
  CHECK(f.at("no-all-to-all")->attention_difference_by_shard[0] == 0);
  CHECK(f.at("no-all-to-all")->attention_difference_by_shard[3] > 1e-3);
  CHECK(results.mass_lost_by_shard[0] == 0);
  for (size_t r = 1; r < 4; ++r) CHECK(results.mass_lost_by_shard[r] > 0.1);
  // local positions: shard 0's positions are right; the others' are not.
  CHECK(f.at("local-positions")->attention_difference_by_shard[0] == 0);
  CHECK(f.at("local-positions")->attention_difference_by_shard[1] > 0);
  // local mask: even shard 0 is wrong (it sees later shards' keys).
  CHECK(f.at("local-mask")->attention_difference_by_shard[0] > 1e-3);
  // #6868: the attention is right; the ranks part by 2·lr after Adam's first step.
  CHECK(f.at("issue-6868")->output_difference == 0);
  CHECK(std::fabs(f.at("issue-6868")->trace.rank_spread[0] / config.adamw.lr() - 2.0) < 1e-3);
  // heads not divisible: the layer refuses, naming H and sp.
  CHECK(results.uneven_heads_message.find("Hq = 5") != std::string::npos);
  CHECK(results.uneven_heads_message.find("sp = 4") != std::string::npos);
  CHECK(ulysses_text(results).find("refuses") != std::string::npos);
  CHECK(ulysses_json(results)["variants"].size() == results.variants.size());
}

TEST_CASE("ulysses: a config the scenario cannot run is refused by name", "[app][cpu]") {
  ReproConfig config = small(4, 1, 1);
  config.heads = 6;
  CHECK_THROWS_WITH(check_ulysses_config(config), Catch::Contains("repro.heads = 6"));
  config = small(4, 1, 1);
  config.out_features = 8;
  CHECK_THROWS_WITH(check_ulysses_config(config), Catch::Contains("repro.out_features"));
  config = small(4, 1, 1);
  config.rows = 66;
  CHECK_THROWS_WITH(check_ulysses_config(config), Catch::Contains("repro.rows = 66"));
}

// The mistaken mask is the op's causal mask over positions i mod n: with one shard of S
// tokens it is the ordinary causal mask, bit for bit; with shards of S/4 it is not, and
// its pairs are the ones the report counts.
TEST_CASE("ulysses: the shard-local mask is the causal mask over positions i mod S/P", "[app][cpu]") {
  Generator generator(5);
  const Shape shape{32, 2, 8};
  const Tensor q = generator.randn(shape), k = generator.randn(shape), v = generator.randn(shape);
  const auto attend = [&](const nn::AttentionMask& mask) { return nn::attention_forward(q, k, v, mask).out; };
  const Tensor causal = attend(true);
  CHECK(test::same_bits(attend(nn::AttentionMask::causal().at_positions(shard_local_positions(32, 32))), causal));
  CHECK_FALSE(test::same_bits(attend(nn::AttentionMask::causal().at_positions(shard_local_positions(32, 8))), causal));
  const nn::AttentionMask local = nn::AttentionMask::causal().at_positions(shard_local_positions(8, 4));
  int64_t hidden = 0, future = 0;
  for (int64_t i = 0; i < 8; ++i) {
    for (int64_t j = 0; j < 8; ++j) {
      hidden += j <= i && !local.visible(0, i, j);
      future += j > i && local.visible(0, i, j);
    }
  }
  const MaskDifference m = shard_local_mask_difference(8, 4);  // two shards of 4
  CHECK(m.causal_pairs == 36);
  CHECK(m.hidden_past == 6);      // j in shard 0 with local index > i's, i in shard 1
  CHECK(m.visible_future == 10);  // j in shard 1 with local index <= i's, i in shard 0
  CHECK(m.hidden_past == hidden);
  CHECK(m.visible_future == future);
}

TEST_CASE("ulysses: every config key the scenario ignores is listed in its report", "[app][cpu]") {
  // Through the config reader, as a user's run: keys the block never reads pass only as
  // "ignored" lines (as in the issue's own scenario), never silently.
  const ReproConfig config =
      parse_config("[repro]\nscenario = \"ulysses\"\n",
                   {"repro.rows=32", "repro.in_features=8", "repro.out_features=8", "repro.heads=2", "repro.head_dim=4",
                    "ds_config.sequence_parallel_size=2", "repro.dropout=0.25"},
                   "test");
  const std::string text = ulysses_text(run_on_threads(config));
  INFO(text);
  CHECK(text.find("  ignored     ") != std::string::npos);
  CHECK(text.find("train_micro_batch_size_per_gpu = 1") != std::string::npos);
  CHECK(text.find("repro.dropout = 0.25") != std::string::npos);
  CHECK(text.find("gradient_accumulation_steps = 1") != std::string::npos);
}
