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
  CHECK(results.uneven_heads_message.find("H = 5") != std::string::npos);
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

// One shard of S tokens: the shard-local mask is the causal mask, so the demonstration's
// attention must agree with nn's op (float32 tolerance: it sums in double), forward and
// backward. With shards of S/4 it must not.
TEST_CASE("ulysses: the shard-local-mask attention is the causal op when one shard holds all",
          "[app][cpu]") {
  Generator generator(5);
  const Shape shape{32, 2, 8};
  autograd::Variable q(generator.randn(shape), true), k(generator.randn(shape), true), v(generator.randn(shape), true);
  const Tensor g = generator.randn(shape);
  const auto run = [&](bool op, int64_t shard) {
    for (autograd::Variable* x : {&q, &k, &v}) x->zero_grad();
    const autograd::Variable out = op ? nn::scaled_dot_product_attention(q, k, v, true)
                                      : shard_local_mask_attention(q, k, v, shard);
    out.backward(g);
    return std::vector<std::vector<float>>{out.data().to_vector(), q.grad().to_vector(), k.grad().to_vector(),
                                           v.grad().to_vector()};
  };
  const auto expected = run(true, 0), same = run(false, 32), other = run(false, 8);
  double worst = 0, apart = 0;
  for (size_t t = 0; t < expected.size(); ++t) {
    for (size_t i = 0; i < expected[t].size(); ++i) {
      worst = std::fmax(worst, std::fabs(expected[t][i] - same[t][i]) / (1 + std::fabs(expected[t][i])));
      apart = std::fmax(apart, std::fabs(expected[t][i] - other[t][i]));
    }
  }
  CHECK(worst < 1e-5);
  CHECK(apart > 1e-2);
  const MaskDifference m = shard_local_mask_difference(8, 4);  // two shards of 4
  CHECK(m.causal_pairs == 36);
  CHECK(m.hidden_past == 6);      // j in shard 0 with local index > i's, i in shard 1
  CHECK(m.visible_future == 10);  // j in shard 1 with local index <= i's, i in shard 0
}
