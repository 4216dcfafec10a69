// L1 loss: values and gradients (in input and in target) against float64
// references for each reduction, the exact forward against an independent exact
// reference (GMP rationals, rounded by MPFR), and its argument checks. The row mask's
// cases are l1_loss_mask_test.cpp's.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "autograd/node.h"
#include "autograd/ops.h"
#include "core/elementwise.h"
#include "core/error.h"
#include "core/generator.h"
#include "nn/l1_loss.h"
#include "tests/exact_reference.h"
#include "tests/gradcheck.h"
#include "tests/nn/l1_loss_test_util.h"
#include "tests/test_util.h"

using namespace seqpar;
using autograd::Variable;
using test::MatrixD;
using test::ReferenceSum;
using test::same_bits;
using test::same_float;
using namespace seqpar::test::l1;

namespace {

// Checks loss = reduce(|input - x[:, :m]|) where x is wider than input: the target
// is a strided view, as the app's x[:, :16], and its gradient flows back into x.
void check_reduction(nn::Reduction reduction, double scale_for_numel_of_1) {
  for (const Shape2& s : kShapes) {
    CAPTURE(s.rows, s.columns);
    Generator generator(s.seed);
    Variable x(generator.randn({s.rows, s.columns + 3}), /*requires_grad=*/true);
    Variable target = autograd::narrow(x, 1, 0, s.columns);
    Variable input(seqpar::add(target.data(), away_from_zero(generator, target.shape())), true);
    Variable loss = nn::l1_loss(input, target, reduction);
    REQUIRE(loss.shape() == Shape{});
    REQUIRE(loss.grad_fn()->name() == "L1LossBackward");
    loss.backward();

    const double scale = reduction.kind == nn::Reduction::Kind::Mean
                             ? 1.0 / static_cast<double>(s.rows * s.columns)
                             : scale_for_numel_of_1;
    const int64_t columns = s.columns;
    const test::ScalarFunction f = [&](const std::vector<MatrixD>& in) {
      return scale * (in[0] - in[1].leftCols(columns)).cwiseAbs().sum();
    };
    const std::vector<MatrixD> inputs{test::to_double(input.data()), test::to_double(x.data())};
    CHECK(std::fabs(loss.data().item() - f(inputs)) <= 1e-6 * std::fabs(f(inputs)));
    CHECK(test::relative_error(test::to_double(input.grad()), test::numeric_gradient(f, inputs, 0)) <
          1e-4);
    CHECK(test::relative_error(test::to_double(x.grad()), test::numeric_gradient(f, inputs, 1)) <
          1e-4);
  }
}

}  // namespace

TEST_CASE("l1_loss mean: value and gradients match float64", "[nn]") {
  check_reduction(nn::Reduction::mean(), 0.0);
}

TEST_CASE("l1_loss sum: value and gradients match float64", "[nn]") {
  check_reduction(nn::Reduction::sum(), 1.0);
}

TEST_CASE("l1_loss sum / count: value and gradients match float64", "[nn]") {
  check_reduction(nn::Reduction::sum_divided_by(12000), 1.0 / 12000.0);
}

TEST_CASE("l1_loss scales its gradient by the incoming gradient", "[nn]") {
  Generator generator(45);
  Variable target(generator.randn({3, 4}));
  Variable input(seqpar::add(target.data(), away_from_zero(generator, {3, 4})), true);
  autograd::mul(nn::l1_loss(input, target, nn::Reduction::sum()), -2.5f).backward();
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t j = 0; j < 4; ++j) {
      const float sign = input.data().at({i, j}) > target.data().at({i, j}) ? 1.0f : -1.0f;
      CHECK(input.grad().at({i, j}) == -2.5f * sign);
    }
  }
  CHECK_FALSE(target.grad().defined());  // the target did not require grad
}

TEST_CASE("l1_loss has no gradient where input equals target (sign(0) = 0)", "[nn]") {
  Variable input(Tensor::from_data({1, 3}, {1.0f, 2.0f, 3.0f}), true);
  Variable target(Tensor::from_data({1, 3}, {1.0f, 0.0f, 5.0f}));
  nn::l1_loss(input, target, nn::Reduction::sum()).backward();
  CHECK(input.grad().to_vector() == std::vector<float>{0.0f, 1.0f, -1.0f});
}

TEST_CASE("l1_loss's backward from the forward's signs is bitwise the backward from the inputs (seed 31)",
          "[nn][l1_loss]") {
  // The autograd node keeps the signs (nn/l1_loss.h): they must give the same bits,
  // the zeros' signs included, for any incoming gradient, also for a strided target.
  std::mt19937_64 rng(31);
  bool saw_negative_zero = false;
  for (const Shape2& s : kShapes) {
    CAPTURE(s.rows, s.columns);
    const auto [input, wide] = with_sign_corners(rng, {s.rows, s.columns + 2});
    const Tensor target = wide.narrow(1, 2, s.columns), in = input.narrow(1, 0, s.columns);
    for (const nn::Reduction& reduction : kReductions) {
      CAPTURE(static_cast<int>(reduction.kind), reduction.divisor);
      nn::L1Signs signs;
      const Tensor loss = nn::l1_loss_forward(in, target, reduction, &signs);
      CHECK(same_bits(loss, nn::l1_loss_forward(in, target, reduction)));
      CHECK(signs.shape == in.shape());
      for (const float g : {0.37f, -2.5f, 0.0f, -0.0f}) {
        CAPTURE(g);
        const Tensor grad_loss = Tensor::from_data({}, {g});
        const Tensor want = nn::l1_loss_backward(grad_loss, in, target, reduction);
        CHECK(same_bits(nn::l1_loss_backward(grad_loss, signs, reduction), want));
        for (const float value : want.to_vector()) saw_negative_zero |= value == 0.0f && std::signbit(value);
      }
    }
  }
  CHECK(saw_negative_zero);  // the corners reached a -0 gradient
}

TEST_CASE("l1_loss's gradient is the forward's: inputs changed in place afterwards do not reach it",
          "[nn]") {
  Variable input(Tensor::from_data({1, 3}, {1.0f, 2.0f, 3.0f}), true);
  Variable target(Tensor::from_data({1, 3}, {0.0f, 5.0f, 3.0f}), true);
  Variable loss = nn::l1_loss(input, target, nn::Reduction::sum());
  input.data().copy_(Tensor::from_data({1, 3}, {-1.0f, 9.0f, 4.0f}));
  target.data().copy_(Tensor::from_data({1, 3}, {7.0f, 7.0f, 7.0f}));
  loss.backward();
  CHECK(input.grad().to_vector() == std::vector<float>{1.0f, -1.0f, 0.0f});
  CHECK(target.grad().to_vector() == std::vector<float>{-1.0f, 1.0f, 0.0f});
}

TEST_CASE("Reduction scales: mean, sum and sum / count", "[nn]") {
  CHECK(nn::Reduction::mean().scale(8) == 0.125);
  CHECK(nn::Reduction::sum().scale(8) == 1.0);
  CHECK(nn::Reduction::sum_divided_by(4).scale(8) == 0.25);
  CHECK(std::isnan(nn::Reduction::mean().scale(0)));  // torch: the mean of nothing is NaN
  // A rank whose shard is empty contributes 0 to a sum over all ranks.
  const Tensor empty = Tensor::zeros({0, 16});
  CHECK(nn::l1_loss_forward(empty, empty, nn::Reduction::sum_divided_by(10)).item() == 0.0f);
  CHECK(std::isnan(nn::l1_loss_forward(empty, empty, nn::Reduction::mean()).item()));
}

TEST_CASE("l1_loss rejects bad arguments with messages that name them", "[nn][errors]") {
  CHECK_THROWS_AS(nn::Reduction::sum_divided_by(0), Error);
  CHECK_THROWS_WITH(nn::Reduction::sum_divided_by(0),
                    Catch::Contains("count must be positive, got 0"));
  CHECK_THROWS_WITH(nn::Reduction::sum_divided_by(-3), Catch::Contains("got -3"));
  const Tensor a = Tensor::zeros({4, 3}), b = Tensor::zeros({4, 2});
  CHECK_THROWS_WITH(nn::l1_loss_forward(a, b, nn::Reduction::mean()),
                    Catch::Contains("input has shape [4, 3] but target has shape [4, 2]"));
  CHECK_THROWS_WITH(nn::l1_loss_forward(Tensor::zeros({4}), Tensor::zeros({4}), nn::Reduction::sum()),
                    Catch::Contains("input must be [n, m], got shape [4]"));
  const nn::Reduction broken{nn::Reduction::Kind::SumDividedBy, 0};  // built by hand
  CHECK_THROWS_WITH(nn::l1_loss_forward(a, a, broken), Catch::Contains("positive count"));
  CHECK_THROWS_WITH(nn::l1_loss_backward(Tensor::zeros({2}), a, a, nn::Reduction::sum()),
                    Catch::Contains("grad_loss must hold one element"));
  CHECK_THROWS_WITH(nn::l1_loss_backward(Tensor::from_data({}, {1.0f}), nn::L1Signs{},
                                         nn::Reduction::sum()),
                    Catch::Contains("the signs must be a forward's, [n, m] with one code an element"));
  CHECK_THROWS_WITH(autograd::add(Variable(a), Variable(b)),
                    Catch::Contains("shapes differ: [4, 3] vs [4, 2]"));
}

// ---------------------------------------------------------------- exactness

namespace {

void check_against_reference(const Tensor& input, const Tensor& target) {
  for (const nn::Reduction& reduction : kReductions) {
    CAPTURE(static_cast<int>(reduction.kind), reduction.divisor);
    const float loss = nn::l1_loss_forward(input, target, reduction).item();
    const float expected = reference_l1(input, target, reduction);
    CAPTURE(loss, expected);
    CHECK(same_float(loss, expected));
  }
}

}  // namespace

TEST_CASE("l1_loss equals the exact sum of its terms rounded once (seed 2024)", "[nn][l1_loss]") {
  std::mt19937_64 rng(2024);
  std::uniform_int_distribution<int64_t> size(1, 60);
  for (int trial = 0; trial < 40; ++trial) {
    const Shape shape{size(rng), size(rng)};
    const int spread = trial % 4 == 0 ? 0 : 10 * (trial % 4);  // up to 2^±30
    CAPTURE(trial, shape, spread);
    check_against_reference(spread_values(rng, shape, spread), spread_values(rng, shape, spread));
  }
}

TEST_CASE("l1_loss rounds once: no double rounding, cancellation, large sums", "[nn][l1_loss]") {
  const Tensor zeros = Tensor::zeros({1, 3});
  // 1 + 2^-24 + 2^-80: a double sum stops at the tie 1 + 2^-24 and rounds to 1; the
  // exact sum is above the tie and rounds up.
  const Tensor tie = Tensor::from_data({1, 3}, {1.0f, std::ldexp(1.0f, -24), std::ldexp(1.0f, -80)});
  CHECK(nn::l1_loss_forward(tie, zeros, nn::Reduction::sum()).item() == std::nextafter(1.0f, 2.0f));
  check_against_reference(tie, zeros);
  // Cancelling signs in the inputs and targets, terms of very different sizes.
  check_against_reference(Tensor::from_data({2, 3}, {1e8f, 1.0f, -1e8f, 3e-5f, -1e30f, 1e-30f}),
                          Tensor::from_data({2, 3}, {-1e8f, 1.0f, 1e8f, -1e-7f, 1e30f, 7.0f}));
  // Sums beyond float32's range round to +inf; just below it they stay finite.
  const float big = std::numeric_limits<float>::max() / 2;
  const Tensor bigs = Tensor::full({4, 1}, big);
  CHECK(nn::l1_loss_forward(bigs, Tensor::zeros({4, 1}), nn::Reduction::sum()).item() ==
        std::numeric_limits<float>::infinity());
  CHECK(nn::l1_loss_forward(bigs, Tensor::zeros({4, 1}), nn::Reduction::mean()).item() == big);
  check_against_reference(bigs, Tensor::zeros({4, 1}));
}

TEST_CASE("l1_loss is exact for subnormal differences (seed 7)", "[nn][l1_loss]") {
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<int> units(-5000, 5000);
  for (int trial = 0; trial < 10; ++trial) {
    CAPTURE(trial);
    std::vector<float> a(64 * 3), b(64 * 3);
    for (size_t i = 0; i < a.size(); ++i) {  // multiples of 2^-149: their differences too
      a[i] = std::ldexp(static_cast<float>(units(rng)), -149);
      b[i] = i % 5 == 0 ? 0.0f : std::ldexp(static_cast<float>(units(rng)), -149);
    }
    // With the mean, s * |d| falls below 2^-149: the domain's rounding to the grid.
    check_against_reference(Tensor::from_data({64, 3}, a), Tensor::from_data({64, 3}, b));
  }
}

TEST_CASE("l1_loss with NaN or infinite inputs is NaN or +inf, as IEEE", "[nn][l1_loss]") {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  struct Case {
    std::vector<float> input, target;
    float expected;
  };
  const std::vector<Case> cases = {
      {{1.0f, inf, 2.0f}, {0.0f, 0.0f, 0.0f}, inf},      // |d| = inf
      {{1.0f, -inf, 2.0f}, {0.0f, 0.0f, 0.0f}, inf},     // |-inf| = inf
      {{1.0f, inf, -inf}, {0.0f, 3.0f, 0.0f}, inf},      // both infinities are +inf terms
      {{1.0f, nan, 2.0f}, {0.0f, 0.0f, 0.0f}, nan},      // a NaN input
      {{1.0f, 2.0f, 3.0f}, {0.0f, nan, 0.0f}, nan},      // a NaN target
      {{inf, 2.0f, 3.0f}, {inf, 0.0f, 0.0f}, nan},       // inf - inf
      {{nan, inf, 3.0f}, {0.0f, 0.0f, 0.0f}, nan},       // NaN wins over inf
      {{3e38f, -3e38f, 1.0f}, {-3e38f, 3e38f, 0.0f}, inf},  // d overflows to +-inf
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    CAPTURE(i);
    const Tensor input = Tensor::from_data({3, 1}, cases[i].input);
    const Tensor target = Tensor::from_data({3, 1}, cases[i].target);
    for (const nn::Reduction& reduction : kReductions) {
      CHECK(same_float(nn::l1_loss_forward(input, target, reduction).item(), cases[i].expected));
    }
    check_against_reference(input, target);
  }
}

TEST_CASE("l1_loss does not depend on the order of the rows (seed 99)", "[nn][l1_loss]") {
  std::mt19937_64 rng(99);
  for (const Shape shape : {Shape{97, 13}, Shape{1000, 16}, Shape{5, 1}}) {
    CAPTURE(shape);
    const Tensor input = spread_values(rng, shape, 20);
    // The target a window of a wider tensor, as the app's x[:, :16].
    const Tensor target = spread_values(rng, {shape[0], shape[1] + 5}, 20).narrow(1, 0, shape[1]);
    std::vector<int64_t> order(static_cast<size_t>(shape[0]));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<float> input_permuted, target_permuted;
    for (int64_t row : order) {
      for (float v : input.narrow(0, row, 1).to_vector()) input_permuted.push_back(v);
      for (float v : target.narrow(0, row, 1).to_vector()) target_permuted.push_back(v);
    }
    const Tensor input_p = Tensor::from_data(shape, input_permuted);
    const Tensor target_p = Tensor::from_data(shape, target_permuted);
    for (const nn::Reduction& reduction : kReductions) {
      CAPTURE(static_cast<int>(reduction.kind));
      const float loss = nn::l1_loss_forward(input, target, reduction).item();
      CHECK(same_float(nn::l1_loss_forward(input_p, target_p, reduction).item(), loss));
      CHECK(same_float(loss, reference_l1(input, target.contiguous(), reduction)));
    }
  }
}
