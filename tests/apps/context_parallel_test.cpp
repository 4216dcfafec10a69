// The context-parallel scenario: its exact variants (CP contiguous and zigzag, USP, and
// USP after Ulysses' refusal at the head wall) train as one rank, bit for bit, for
// several steps; the ring is close and not exact; every mistake gets its own verdict
// and the figure that names it; a config it cannot run is refused by key.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <string>

#include "apps/repro/context_parallel.h"
#include "dist/local_process_group.h"

using namespace seqpar;
using namespace seqpar::repro;

namespace {

CpResults run_on_threads(const ReproConfig& config) {
  CpResults results;
  dist::run_local_world(static_cast<int>(config.world_size()), [&](std::shared_ptr<dist::ProcessGroup> world) {
    const RankGroups groups = rank_groups(world, config);
    CpResults mine = run_context_parallel(groups, config, Device::cpu(), "test");
    if (world->rank() == 0) results = std::move(mine);
  });
  decide_context_parallel(results);
  return results;
}

ReproConfig small(int64_t sp, int64_t heads, int64_t steps) {
  ReproConfig config;
  config.scenario = "context-parallel";
  config.rows = 64;
  config.in_features = config.out_features = 16;
  config.heads = heads;
  config.head_dim = 4;
  config.sequence_parallel_size = sp;
  config.data_parallel_size = 1;
  config.steps = steps;
  config.adamw.lr(1e-3);
  return config;
}

std::map<std::string, const CpFigures*> by_key(const CpResults& results) {
  std::map<std::string, const CpFigures*> figures;
  for (const CpFigures& f : results.variants) figures[f.variant.key] = &f;
  return figures;
}

}  // namespace

TEST_CASE("context-parallel: the exact variants are one-rank training bit for bit, every step", "[app][cpu]") {
  for (const auto& [sp, heads] : std::vector<std::pair<int64_t, int64_t>>{{2, 1}, {4, 2}, {4, 1}}) {
    INFO("sp " << sp << ", " << heads << " heads");
    const CpResults results = run_on_threads(small(sp, heads, 3));
    for (const std::string key : {"contiguous", "zigzag", "usp", "head-wall"}) {
      INFO(key);
      const CpFigures& f = *by_key(results).at(key);
      CHECK(f.as_expected);
      CHECK(f.output_difference == 0);
      CHECK(f.gradient_difference == 0);
      REQUIRE(f.trace.parameters.size() == 3);
      for (size_t step = 0; step < 3; ++step) {
        CHECK(f.trace.parameters[step] == results.baseline.parameters[step]);
        CHECK(f.trace.rank_spread[step] == 0);
      }
    }
    // The parameters moved: equality is not that of an untrained model.
    CHECK(results.baseline.parameters[0] != results.baseline.parameters[2]);
  }
}

TEST_CASE("context-parallel: every variant's verdict, and the figure that names each mistake", "[app][cpu]") {
  const ReproConfig config = small(4, 2, 2);
  const CpResults results = run_on_threads(config);
  REQUIRE(results.ulysses == 2);
  REQUIRE(results.cp == 2);
  const auto f = by_key(results);
  for (const CpFigures& figures : results.variants) {
    INFO(figures.variant.name << ": " << figures.verdict);
    CHECK(figures.as_expected);
  }
  // ring: ranks agree, close; its forward is the mistakes' forward.
  CHECK(f.at("ring")->gradient_difference < 1e-4);
  CHECK(f.at("ring")->verdict.find("close") != std::string::npos);
  // stale K/V, dK/dV not reduced: the forward is the ring's, the gradients are wrong.
  for (const std::string key : {"stale-kv", "dkv-not-reduced"}) {
    CHECK(f.at(key)->output_difference == f.at("ring")->output_difference);
    CHECK(f.at(key)->gradient_difference > 1e-2);
    CHECK(f.at(key)->verdict.find("WRONG gradient") != std::string::npos);
  }
  // Which projections' gradients each spoils: stale K/V also dq; unreduced dK/dV not it.
  CHECK(f.at("stale-kv")->gradient_difference_by_projection[0] > 1e-2);
  CHECK(f.at("dkv-not-reduced")->gradient_difference_by_projection[0] < 1e-4);
  CHECK(f.at("dkv-not-reduced")->gradient_difference_by_projection[1] > 1e-2);
  CHECK(f.at("stale-kv")->verdict != f.at("dkv-not-reduced")->verdict);
  CHECK(f.at("stale-kv")->trace.first_gradients != f.at("dkv-not-reduced")->trace.first_gradients);
  // loss per rank: the same model, a loss and gradients cp = 4 times one rank's.
  CHECK(f.at("loss-per-rank")->output_difference == 0);
  CHECK(std::fabs(f.at("loss-per-rank")->trace.losses.front() / results.baseline.losses.front() - 4) < 1e-4);
  CHECK(f.at("loss-per-rank")->gradient_ratio == 4);
  // unpermuted positions: a wrong model, though the ranks agree.
  CHECK(f.at("unpermuted-positions")->output_difference > 1e-3);
  CHECK(f.at("unpermuted-positions")->verdict.find("WRONG model") != std::string::npos);
  // the head wall: the layer refuses Ulysses over 4 ranks of 2 heads, naming both.
  CHECK(results.head_wall_message.find("Hq = 2") != std::string::npos);
  CHECK(results.head_wall_message.find("sp = 4") != std::string::npos);
  CHECK(context_parallel_text(results).find("refused") != std::string::npos);
  const nlohmann::json json = context_parallel_json(results);
  CHECK(json["schema"] == "seqpar-repro-context-parallel/1");
  CHECK(json["variants"].size() == results.variants.size());
}

TEST_CASE("context-parallel: contiguous causal shards are uneven work, zigzag even", "[app][cpu]") {
  // S 16 over 2 ranks: positions 0-7 see 36 keys in all, 8-15 see 100; zigzag gives each 68.
  CHECK(causal_pairs_by_rank(16, 2, false) == std::vector<int64_t>{36, 100});
  CHECK(causal_pairs_by_rank(16, 2, true) == std::vector<int64_t>{68, 68});
  const std::vector<int64_t> contiguous = causal_pairs_by_rank(256, 4, false);
  CHECK(contiguous.back() > 6 * contiguous.front());
  CHECK(usp_ulysses_degree(2, 4) == 2);
  CHECK(usp_ulysses_degree(8, 8) == 4);
  CHECK(usp_ulysses_degree(3, 4) == 1);
}

TEST_CASE("context-parallel: a config the scenario cannot run is refused by name", "[app][cpu]") {
  ReproConfig config = small(4, 2, 1);
  config.rows = 60;
  CHECK_THROWS_WITH(check_context_parallel_config(config), Catch::Contains("repro.rows = 60"));
  config = small(4, 2, 1);
  config.out_features = 8;
  CHECK_THROWS_WITH(check_context_parallel_config(config), Catch::Contains("repro.out_features"));
  config = small(4, 2, 1);
  config.head_dim = 3;
  CHECK_THROWS_WITH(check_context_parallel_config(config), Catch::Contains("repro.head_dim = 3"));
  config = small(1, 2, 1);
  CHECK_THROWS_WITH(check_context_parallel_config(config), Catch::Contains("ds_config.sequence_parallel_size = 1"));
  config = small(2, 2, 1);
  config.data_parallel_size = 2;
  CHECK_THROWS_WITH(check_context_parallel_config(config), Catch::Contains("ds_config.data_parallel_size = 2"));
}

TEST_CASE("context-parallel: every config key the scenario ignores is listed in its report", "[app][cpu]") {
  const ReproConfig config = parse_config("[repro]\nscenario = \"context-parallel\"\n",
                                          {"repro.rows=32", "repro.in_features=8", "repro.out_features=8",
                                           "repro.heads=2", "repro.head_dim=4", "ds_config.sequence_parallel_size=2",
                                           "repro.dropout=0.2"},
                                          "test");
  check_context_parallel_config(config);
  const CpResults results = run_on_threads(config);
  const std::string text = context_parallel_text(results);
  INFO(text);
  CHECK(text.find("repro.dropout = 0.2") != std::string::npos);
  CHECK(text.find("gradient_accumulation_steps") != std::string::npos);
}
