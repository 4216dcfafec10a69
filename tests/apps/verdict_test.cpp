// The one decision both programs draw (apps/common/verdict.h): a table of evidence, as
// seqpar-repro and seqpar-diagnose hand it over, against the verdict each must give; and
// the first-step figures both print (apps/common/first_step.h) against counts made here.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <string>

#include "apps/common/first_step.h"
#include "apps/common/verdict.h"

using namespace seqpar;

namespace {

using Zero = GradientEvidence::Zero;

VerdictEvidence against_baseline(bool parameters_bitwise) {
  VerdictEvidence e;
  e.has_baseline = true;
  e.parameters_bitwise = parameters_bitwise;
  return e;
}

GradientEvidence gradient(double ratio, std::optional<double> direction = {}, bool bitwise = false,
                          Zero zero = Zero::Neither, bool named = false) {
  GradientEvidence g;
  g.ratio = ratio;
  g.direction_error = direction;
  g.bitwise = bitwise;
  g.zero = zero;
  g.named_factor = named;
  return g;
}

DistanceEvidence distance(bool lr_known, int64_t beyond_tolerance, int64_t beyond_two_lr = 0) {
  return {lr_known, 1000, beyond_tolerance, beyond_two_lr};
}

}  // namespace

TEST_CASE("decide_verdict: evidence to verdict", "[verdict]") {
  struct Row {
    std::string what;
    VerdictEvidence evidence;
    Verdict expected;
  };
  std::vector<Row> rows;
  auto add = [&](std::string what, VerdictEvidence e, Verdict v) { rows.push_back({what, e, v}); };

  VerdictEvidence e;
  add("no baseline, ranks agree", e, Verdict::RanksAgree);
  e.ranks = 1;
  add("one rank, nothing to compare", e, Verdict::OneRank);
  e = {};
  e.clip_norm_formula_wrong = true;
  add("no baseline, mean of partial norms", e, Verdict::WrongClipNorm);
  e.ranks_differ = true;
  add("ranks differ", e, Verdict::RanksDiverge);
  e.non_finite = true;
  add("NaN before everything", e, Verdict::NumericallyInvalid);

  // seqpar-repro's evidence: the bits and the step-1 scale, no distance, no clip norm.
  e = against_baseline(true);
  e.gradient = gradient(1, {}, true);
  add("repro: the same bits", e, Verdict::Identical);
  e.gradient = gradient(4, {}, true);
  add("repro: bits equal but the norm 4x (scale before identity)", e, Verdict::WrongGradientScale);
  e = against_baseline(false);
  e.gradient = gradient(1.0000001, {}, false);
  add("repro: rounding apart", e, Verdict::NotExact);
  e.gradient = gradient(0.5);
  add("repro: half the gradient, direction unmeasured", e, Verdict::WrongGradientScale);

  // seqpar-diagnose's evidence.
  e = against_baseline(false);
  e.gradient = gradient(1, 0.3);
  add("right size, wrong direction", e, Verdict::WrongGradient);
  e.gradient = gradient(2, 0.3);
  add("scaled and turned, no named factor", e, Verdict::WrongGradient);
  e.gradient = gradient(2, 0.3, false, Zero::Neither, true);
  add("a named factor wins over the direction", e, Verdict::WrongGradientScale);
  e.gradient = gradient(std::nan(""), std::nan(""), false, Zero::OneSide);
  add("one side all zeros", e, Verdict::WrongGradient);
  e.gradient = gradient(1, 1e-7);
  e.clip_norm_ratio = 2;
  add("right gradient, clip norm 2x", e, Verdict::WrongClipNorm);
  e.gradient = gradient(2, 1e-7);
  add("clip norm 2x because the gradient is 2x", e, Verdict::WrongGradientScale);
  e = against_baseline(false);
  e.clip_norm_ratio = 1;
  e.distance = distance(true, 0);
  add("clip norm right, within rounding", e, Verdict::NotExact);
  e.distance = distance(true, 5, 1);
  add("a parameter beyond 2 lr", e, Verdict::UnlikeOneRank);
  e.distance = distance(true, 11);
  add("over 1% beyond the tolerance", e, Verdict::UnlikeOneRank);
  e.distance = distance(true, 10);
  add("1% beyond the tolerance is still rounding", e, Verdict::NotExact);
  e.distance = distance(false, 3);
  add("no lr: cannot tell rounding", e, Verdict::RanksAgree);
  e.ranks = 1;
  add("no lr, one rank", e, Verdict::OneRank);
  e = against_baseline(false);
  e.distance = distance(true, 0);
  add("close, gradient not saved", e, Verdict::ParametersClose);
  e.gradient = gradient(std::nan(""), std::nan(""), true, Zero::Both);
  e.clip_norm_ratio = 1;
  add("both gradients zero: the scale is not checked", e, Verdict::ParametersClose);
  e = against_baseline(true);
  e.distance = distance(true, 0);
  e.gradient = gradient(1, 0, true);
  add("diagnose: the same bits", e, Verdict::Identical);

  for (const Row& row : rows) {
    INFO(row.what);
    CHECK(verdict_name(decide_verdict(row.evidence)) == std::string(verdict_name(row.expected)));
  }
}

TEST_CASE("first-step figures against counts made here", "[verdict]") {
  const double lr = 1e-3;
  std::mt19937 generator(20261205);
  std::uniform_real_distribution<float> uniform(-1, 1);
  const int ranks = 3, n = 400;
  std::vector<std::vector<float>> gradients(ranks, std::vector<float>(n)), parameters = gradients;
  int64_t opposite = 0, opposite_two_lr = 0, same = 0, same_identical = 0, two_lr_bin = 0;
  for (int i = 0; i < n; ++i) {
    const float start = uniform(generator);
    for (int r = 0; r < ranks; ++r) {
      gradients[r][i] = uniform(generator);
      parameters[r][i] = start - float(lr) * (gradients[r][i] > 0 ? 1 : -1);  // Adam's first step
    }
    for (int r = 1; r < ranks; ++r) {
      const double apart = std::abs(double(parameters[r][i]) - parameters[0][i]) / lr;
      if ((gradients[r][i] > 0) != (gradients[0][i] > 0)) {
        ++opposite;
        opposite_two_lr += apart >= 1.5 && apart < 2.5;
      } else {
        ++same;
        same_identical += parameters[r][i] == parameters[0][i];
      }
      two_lr_bin += apart >= 1.5 && apart < 2.5;
    }
  }
  const SignAgreement signs = signs_of_first_step(parameters, gradients, lr);
  CHECK(signs.opposite == opposite);
  CHECK(signs.opposite_two_lr == opposite_two_lr);
  CHECK(signs.same == same);
  CHECK(signs.same_identical == same_identical);
  CHECK(opposite > 0);
  CHECK(same > 0);
  LrHistogram histogram;
  for (int r = 1; r < ranks; ++r) {
    for (int i = 0; i < n; ++i) histogram.add(parameters[r][i], parameters[0][i], lr);
  }
  CHECK(histogram.about_two == two_lr_bin);
  CHECK(histogram.identical + histogram.about_two == (ranks - 1) * n);
}
