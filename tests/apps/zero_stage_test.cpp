// The zero-stage scenario (apps/repro/zero_stage.h) on CPU threads: the factor each
// loss convention and reduction gives must come out of the run as the analysis of
// DeepSpeed's reductions says (1, sp or 1/sp; with dp replicas, 1/dp and 1/(sp dp) where
// a global-count loss meets an average over dp), and every variant's ranks must agree.
#include <catch2/catch.hpp>

#include <map>
#include <sstream>
#include <string>

#include "apps/repro/scenario.h"
#include "apps/repro/zero_stage.h"
#include "core/error.h"
#include "dist/local_process_group.h"

using namespace seqpar;
using namespace seqpar::repro;

namespace {

ZeroStageResults run_on_threads(const ReproConfig& config) {
  ZeroStageResults results;
  dist::run_local_world(static_cast<int>(config.world_size()),
                        [&](std::shared_ptr<dist::ProcessGroup> world) {
    const RankGroups groups = rank_groups(world, config);
    ZeroStageResults mine = run_zero_stage(groups, config, Device::cpu(), "test");
    if (world->rank() == 0) results = std::move(mine);
  });
  return results;
}

ReproConfig small(int64_t sp, int64_t dp) {
  ReproConfig config;
  config.rows = 480;
  config.in_features = 24;
  config.out_features = 4;
  config.sequence_parallel_size = sp;
  config.data_parallel_size = dp;
  config.steps = 2;
  return config;
}

// "loss / reduction" -> the cause the run named.
std::map<std::string, std::string> causes(const ZeroStageResults& results) {
  std::map<std::string, std::string> named;
  for (const ZeroStageFigures& f : results.variants) {
    if (f.variant.exact) continue;
    named[std::string(loss_convention_name(f.variant.loss)) + " / " +
          gradient_reduction_name(f.variant.reduction)] = f.cause;
  }
  return named;
}

}  // namespace

TEST_CASE("zero-stage: each loss convention's factor under ZeRO 0-2 and ZeRO-3, sp 4", "[app]") {
  const ZeroStageResults results = run_on_threads(small(4, 1));
  REQUIRE(results.variants.size() == 9);
  const std::map<std::string, std::string> expected = {
      {"local mean / ZeRO 0-2", "x sp (4)"},
      {"local mean / ZeRO-3", ""},
      {"global row count / ZeRO 0-2", ""},
      {"global row count / ZeRO-3", "x 1/sp (0.25)"},
      {"all-gather, sum backward / ZeRO 0-2", "x sp (4)"},
      {"all-gather, sum backward / ZeRO-3", ""},
      {"all-gather, slice backward / ZeRO 0-2", ""},
      {"all-gather, slice backward / ZeRO-3", "x 1/sp (0.25)"},
  };
  CHECK(causes(results) == expected);
  for (const ZeroStageFigures& f : results.variants) {
    INFO(loss_convention_name(f.variant.loss) << " / " << gradient_reduction_name(f.variant.reduction));
    CHECK(f.ranks_agree);
    if (f.variant.exact) {
      CHECK(f.equals_baseline);
      CHECK(f.max_difference == 0);
    }
    if (f.cause.empty()) {
      CHECK(f.gradient_scale == Approx(1.0).epsilon(1e-5));
      CHECK(f.max_difference < 1e-6);  // the same training, up to rounding
    }
  }
  std::ostringstream report;
  print_zero_stage(report, results);
  CHECK(report.str().find("local mean                   4 x sp (4)") != std::string::npos);
}

TEST_CASE("zero-stage: with dp 2 replicas a global-count loss is 1/dp under ZeRO 0-2", "[app]") {
  const ZeroStageResults results = run_on_threads(small(4, 2));
  const std::map<std::string, std::string> named = causes(results);
  CHECK(named.at("local mean / ZeRO 0-2") == "x sp (4)");
  CHECK(named.at("local mean / ZeRO-3") == "");
  CHECK(named.at("global row count / ZeRO 0-2") == "x 1/dp (0.5)");
  CHECK(named.at("global row count / ZeRO-3") == "x 1/(sp*dp) (0.125)");
  CHECK(named.at("all-gather, slice backward / ZeRO 0-2") == "");
  for (const ZeroStageFigures& f : results.variants) {
    CHECK(f.ranks_agree);
    if (f.variant.exact) CHECK(f.equals_baseline);
  }
}

TEST_CASE("zero-stage: ds_config.zero_optimization.stage selects the reduction", "[app]") {
  for (const int64_t stage : {1, 3}) {
    INFO("stage " << stage);
    ReproConfig config = small(4, 1);
    config.zero_stage = stage;
    const ZeroStageResults results = run_on_threads(config);
    REQUIRE(results.variants.size() == 5);  // four conventions under one reduction, and exact
    const std::map<std::string, std::string> named = causes(results);
    const std::string reduction = stage == 3 ? "ZeRO-3" : "ZeRO 0-2";
    CHECK(named.size() == 4);
    CHECK(named.at("local mean / " + reduction) == (stage == 3 ? "" : "x sp (4)"));
    CHECK(named.at("global row count / " + reduction) == (stage == 3 ? "x 1/sp (0.25)" : ""));
    CHECK(results.variants.back().variant.exact);
    CHECK(results.variants.back().equals_baseline);
    std::ostringstream report;
    print_zero_stage(report, results);
    CHECK(report.str().find("ds_config.zero_optimization.stage = " + std::to_string(stage)) != std::string::npos);
  }
}

TEST_CASE("zero-stage: rows that do not split evenly over sp are refused", "[app]") {
  ReproConfig config = small(4, 1);
  config.rows = 481;
  CHECK_THROWS_WITH(check_zero_stage_config(config), Catch::Contains("repro.rows = 481"));
  CHECK_THROWS_AS(check_zero_stage_config(config), InputError);
}
