// seqpar-repro's checks, driven through its library on CPU threads: the bug, the
// fixes, and the exact policy against one-rank training in several set-ups.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>

#include "apps/repro/analysis.h"
#include "apps/repro/config.h"
#include "apps/repro/report.h"
#include "apps/repro/scenario.h"
#include "dist/local_process_group.h"

using namespace seqpar;
using namespace seqpar::repro;

namespace {

// Runs `config` with every policy as CPU threads; returns rank 0's figures.
std::vector<PolicyFigures> run_on_threads(const ReproConfig& config, RunResults* keep = nullptr) {
  std::vector<const Policy*> policies;
  for (const Policy& policy : all_policies()) policies.push_back(&policy);
  RunResults results;
  dist::run_local_world(static_cast<int>(config.world_size()),
                        [&](std::shared_ptr<dist::ProcessGroup> world) {
    const RankGroups groups = rank_groups(world, config);
    RunResults mine = run_scenario(groups, config, policies, Device::cpu(), "test");
    if (world->rank() == 0) results = std::move(mine);
  });
  std::vector<PolicyFigures> figures;
  for (const PolicyRun& run : results.policies) figures.push_back(run.figures);
  if (keep) *keep = std::move(results);
  return figures;
}

const PolicyFigures& figures_of(const std::vector<PolicyFigures>& all, PolicyKind kind) {
  for (const PolicyFigures& figures : all) {
    if (figures.policy->kind == kind) return figures;
  }
  FAIL("policy missing");
  return all.front();
}

void check_consistent_and_exact(const std::vector<PolicyFigures>& figures) {
  const PolicyFigures& exact = figures_of(figures, PolicyKind::Exact);
  REQUIRE(exact.skipped.empty());
  for (const StepFigures& step : exact.steps) {
    // Exact row sums: the same bits as one rank on all rows, at every step.
    CHECK(step.differing_parameters == 0);
    CHECK(step.parameters_unlike_baseline == 0);
    CHECK(step.gradients_unlike_baseline == 0);
  }
  CHECK(exact.verdict == Verdict::Identical);
  const PolicyFigures& with_mpu = figures_of(figures, PolicyKind::WithMpu);
  if (with_mpu.skipped.empty()) {
    for (const StepFigures& step : with_mpu.steps) CHECK(step.differing_parameters == 0);
  }
}

}  // namespace

TEST_CASE("the report's scenario: deepspeed-0.16 drifts by 2 lr, the fixes agree",
          "[repro]") {
  RunResults results;
  const ReproConfig config;  // the defaults are the report's values
  const auto figures = run_on_threads(config, &results);

  for (const auto& parameters : results.initial_parameters) {
    CHECK(fingerprint(parameters) == fingerprint(results.initial_parameters[0]));
  }
  const PolicyFigures& broken = figures_of(figures, PolicyKind::DeepSpeed016);
  const StepFigures& step = broken.steps.front();
  CHECK(broken.verdict == Verdict::RanksDiverge);
  CHECK(step.max_cross_rank_difference == Approx(2e-4).epsilon(0.02));
  CHECK(step.differing_parameters > 1000);
  // The mechanism: opposite gradient signs end 2 lr apart.
  CHECK(broken.first_step_signs.opposite_two_lr > 0.99 * broken.first_step_signs.opposite);
  CHECK(step.histogram.about_two > 0);
  // Each rank clipped with a different (its own) norm.
  CHECK(step.used_norms[0] != step.used_norms[1]);

  const PolicyFigures& with_mpu = figures_of(figures, PolicyKind::WithMpu);
  CHECK(with_mpu.steps.front().differing_parameters == 0);
  CHECK(with_mpu.verdict == Verdict::WrongGradientScale);
  CHECK(with_mpu.gradient_scale == Approx(4).epsilon(1e-4));  // sp times too large
  check_consistent_and_exact(figures);
  CHECK(figures_of(figures, PolicyKind::Exact).gradient_scale == Approx(1).epsilon(1e-5));
}

TEST_CASE("exact equals one-rank training: uneven rows, sp 3 x dp 2, steps, active clipping",
          "[repro]") {
  ReproConfig config;
  config.sequence_parallel_size = 3;
  config.data_parallel_size = 2;
  config.rows = 1001;        // 334 + 334 + 333 per replica
  config.in_features = 37;
  config.out_features = 5;
  config.steps = 4;
  config.gradient_clipping = 0.05;  // well below the gradient norm: clipping is active
  config.seed = 777;
  RunResults results;
  const auto figures = run_on_threads(config, &results);
  CHECK(results.baseline.norms.front() > 0.05);
  check_consistent_and_exact(figures);
  CHECK(figures_of(figures, PolicyKind::DeepSpeed016).verdict == Verdict::RanksDiverge);
  // sp times too large before clipping; clipping (active for both) restores the scale,
  // but not the direction: means over unequal shards (334, 334, 333 rows) weight the
  // rows unequally ("slightly off" in docs/deepspeed-6868.md, "The gradient scale").
  const PolicyFigures& with_mpu = figures_of(figures, PolicyKind::WithMpu);
  CHECK(with_mpu.gradient_scale == Approx(3).epsilon(1e-2));
  CHECK(with_mpu.steps.front().gradient_relative_error > kGradientRounding);
  CHECK(with_mpu.steps.front().gradient_relative_error < 1e-2);
}

TEST_CASE("with-mpu's sp-times gradient changes what clipping does", "[repro]") {
  ReproConfig config;
  config.rows = 400;
  config.in_features = 24;
  config.out_features = 4;
  config.steps = 2;
  RunResults results;
  run_on_threads(config, &results);
  // A threshold twice the true norm: exact does not clip, with-mpu (4x) clips to 2x.
  config.gradient_clipping = 2 * results.baseline.norms.front();
  const auto figures = run_on_threads(config);
  CHECK(figures_of(figures, PolicyKind::Exact).steps.front().gradient_relative_error <=
        kGradientRounding);
  const PolicyFigures& with_mpu = figures_of(figures, PolicyKind::WithMpu);
  CHECK(with_mpu.verdict == Verdict::WrongGradientScale);
  CHECK(with_mpu.steps.front().gradient_relative_error == Approx(1.0).epsilon(1e-3));
}

TEST_CASE("exact handles a row count torch.chunk cannot split over the ranks", "[repro]") {
  ReproConfig config;
  config.in_features = 8;
  config.out_features = 3;
  config.sequence_parallel_size = 4;
  config.rows = 6;  // torch.chunk(6, 4): 2, 2, 2: three pieces for four ranks
  const auto figures = run_on_threads(config);
  CHECK_THAT(figures_of(figures, PolicyKind::DeepSpeed016).skipped, Catch::Contains("3 pieces"));
  CHECK_FALSE(figures_of(figures, PolicyKind::WithMpu).skipped.empty());
  check_consistent_and_exact(figures);
}

TEST_CASE("single rank: every policy is one-rank training", "[repro]") {
  ReproConfig config;
  config.sequence_parallel_size = 1;
  config.rows = 50;
  config.in_features = 9;
  config.out_features = 2;
  config.steps = 2;
  const auto figures = run_on_threads(config);
  for (const PolicyFigures& policy : figures) {  // one rank: nothing to combine, same bits
    CHECK(policy.steps.back().parameters_unlike_baseline == 0);
    CHECK(policy.steps.back().gradients_unlike_baseline == 0);
  }
}

TEST_CASE("long runs: figures per step, the final state kept, a short report", "[repro]") {
  ReproConfig config;
  config.rows = 40;
  config.in_features = 6;
  config.out_features = 2;
  config.steps = 300;
  RunResults results;
  const auto figures = run_on_threads(config, &results);
  CHECK(results.baseline.losses.size() == 300);
  CHECK(results.baseline.parameters.size() == size_t(parameter_count(config)));
  for (const PolicyRun& run : results.policies) {
    CHECK(run.figures.steps.size() == 300);
    CHECK(run.last.parameters.size() == size_t(config.world_size()));
  }
  const PolicyFigures& broken = figures_of(figures, PolicyKind::DeepSpeed016);
  CHECK(broken.verdict == Verdict::RanksDiverge);
  CHECK(broken.first_broken_step == 1);
  CHECK(figures_of(figures, PolicyKind::WithMpu).verdict == Verdict::WrongGradientScale);
  check_consistent_and_exact(figures);
  CHECK(figures_of(figures, PolicyKind::Exact).first_broken_step == 0);
  // The exact policy's final state is the baseline's, bit for bit.
  const PolicyRun& exact = results.policies[size_t(PolicyKind::Exact)];
  REQUIRE(exact.figures.policy->kind == PolicyKind::Exact);
  CHECK(exact.last.parameters[0] == results.baseline.parameters);

  std::ostringstream report;
  print_report(report, results);
  const std::string text = report.str();
  CHECK(std::count(text.begin(), text.end(), '\n') < 100);
  CHECK_THAT(text, Catch::Contains("first step with ranks apart: 1\n"));
  CHECK_THAT(text, Catch::Contains("(290 of 300 rows left out"));
}

TEST_CASE("the report's rows: first steps, log-spaced, the first broken one, the last",
          "[repro]") {
  CHECK(steps_to_show(1) == std::vector<int64_t>{1});
  CHECK(steps_to_show(4) == std::vector<int64_t>{1, 2, 3, 4});
  CHECK(steps_to_show(1000) ==
        std::vector<int64_t>{1, 2, 3, 5, 10, 20, 50, 100, 200, 500, 1000});
  CHECK(steps_to_show(2500, 7) ==
        std::vector<int64_t>{1, 2, 3, 5, 7, 10, 20, 50, 100, 200, 500, 1000, 2000, 2500});
}

TEST_CASE("analysis helpers", "[repro]") {
  CHECK(ulps_between(1.0f, 1.0f) == 0);
  CHECK(ulps_between(1.0f, std::nextafter(1.0f, 2.0f)) == Approx(1));
  CHECK(ulps_between(0.25f, 0.25f + 4 * (std::nextafter(0.25f, 1.0f) - 0.25f)) == Approx(4));
  CHECK(fingerprint({1.0f, 2.0f}) != fingerprint({2.0f, 1.0f}));
}

TEST_CASE("no verdict from values that are not finite", "[repro]") {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> reference_parameters = {1, 2}, reference_gradients = {0.5f, 0.5f};
  const BaselineStep reference{reference_parameters, reference_gradients, 1, 1};
  // Every rank holds NaN alike: bitwise "agreement" that must not read as a verdict.
  StepRecord record{{{nan, 2}, {nan, 2}}, {{0.5f, 0.5f}, {0.5f, 0.5f}}, {1, 1}, {1, 1}, {1, 1}};
  PolicyFigures figures;
  figures.steps.push_back(figures_of_step(record, reference, 1e-4));
  record.parameters = {{inf, 2}, {inf, 2}};
  figures.steps.push_back(figures_of_step(record, reference, 1e-4));
  CHECK(figures.steps[0].non_finite_values == 2);
  decide(figures, 1e-4);
  CHECK(figures.verdict == Verdict::NumericallyInvalid);
  CHECK(std::string(verdict_name(figures.verdict)) == "NUMERICALLY INVALID");
  CHECK(figures.first_broken_step == 1);
  CHECK_THAT(figures.verdict_text, Catch::Contains("inf or NaN"));
  // Finite figures keep their verdicts.
  PolicyFigures finite;
  finite.steps.push_back(figures_of_step(
      StepRecord{{{1, 2}, {1, 2}}, {{0.5f, 0.5f}, {0.5f, 0.5f}}, {1, 1}, {1, 1}, {1, 1}}, reference,
      1e-4));
  decide(finite, 1e-4);
  CHECK(finite.verdict == Verdict::Identical);
}

TEST_CASE("the drift picture ends for infinite and NaN differences", "[repro]") {
  RunResults results;
  results.config.steps = 2;
  PolicyRun run;
  run.figures.policy = &all_policies()[0];
  for (const float difference : {std::numeric_limits<float>::infinity(),
                                 std::numeric_limits<float>::quiet_NaN()}) {
    StepFigures step;
    step.max_cross_rank_difference = difference;
    run.figures.steps.push_back(step);
  }
  results.policies.push_back(run);
  const std::string svg = drift_svg(results);  // used to loop forever drawing grid lines up to inf
  CHECK_THAT(svg, Catch::EndsWith("</svg>\n"));
  CHECK_THAT(svg, !Catch::Contains("inf") && !Catch::Contains("nan"));
}

TEST_CASE("both programs' verdicts come from one vocabulary of distinct names", "[repro]") {
  // The names both reports print, written out: a renamed verdict must change them here too.
  const std::vector<std::pair<Verdict, std::string>> names = {
      {Verdict::Skipped, "SKIPPED"},
      {Verdict::NumericallyInvalid, "NUMERICALLY INVALID"},
      {Verdict::RanksDiverge, "BROKEN: RANKS DIVERGE"},
      {Verdict::WrongGradientScale, "CONSISTENT, WRONG GRADIENT SCALE"},
      {Verdict::NotExact, "CONSISTENT, NOT EXACT"},
      {Verdict::Identical, "IDENTICAL TO ONE-RANK TRAINING"},
      {Verdict::WrongGradient, "CONSISTENT, WRONG GRADIENT"},
      {Verdict::WrongClipNorm, "CONSISTENT, WRONG CLIP NORM"},
      {Verdict::UnlikeOneRank, "CONSISTENT, UNLIKE ONE-RANK TRAINING"},
      {Verdict::ParametersClose, "PARAMETERS CLOSE, GRADIENT NOT CHECKED"},
      {Verdict::RanksAgree, "RANKS AGREE"},
      {Verdict::OneRank, "ONE RANK"}};
  for (const auto& [verdict, name] : names) CHECK(verdict_name(verdict) == name);
  // Only the verdicts that say something went wrong owe a cause.
  for (Verdict fine : {Verdict::Skipped, Verdict::NotExact, Verdict::Identical, Verdict::ParametersClose,
                       Verdict::RanksAgree, Verdict::OneRank}) {
    CHECK_FALSE(names_a_fault(fine));
  }
  for (Verdict wrong : {Verdict::NumericallyInvalid, Verdict::RanksDiverge, Verdict::WrongGradientScale,
                        Verdict::WrongGradient, Verdict::WrongClipNorm, Verdict::UnlikeOneRank}) {
    CHECK(names_a_fault(wrong));
  }
}
