// L1 loss: values and gradients (in input and in target) against float64
// references for each reduction, and its argument checks.
#include <catch2/catch.hpp>

#include <cmath>

#include "autograd/node.h"
#include "autograd/ops.h"
#include "core/elementwise.h"
#include "core/error.h"
#include "core/generator.h"
#include "nn/l1_loss.h"
#include "tests/gradcheck.h"

using namespace seqpar;
using autograd::Variable;
using test::MatrixD;

namespace {

struct Shape2 {
  int64_t rows, columns;
  uint64_t seed;
};
const std::vector<Shape2> kShapes = {{1, 1, 41}, {1, 17, 42}, {7, 5, 43}, {33, 13, 44}};

// A difference at least 0.05 away from zero in either direction: |input - target|
// stays differentiable under the finite-difference step.
Tensor away_from_zero(Generator& generator, const Shape& shape) {
  std::vector<float> values = generator.randn(shape).to_vector();
  for (float& value : values) value = std::copysign(0.05f + std::fabs(value), value);
  return Tensor::from_data(shape, values);
}

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

TEST_CASE("Reduction scales: mean, sum and sum / count", "[nn]") {
  CHECK(nn::Reduction::mean().scale(8) == 0.125);
  CHECK(nn::Reduction::sum().scale(8) == 1.0);
  CHECK(nn::Reduction::sum_divided_by(4).scale(8) == 0.25);
  CHECK(std::isnan(nn::Reduction::mean().scale(0)));  // torch: the mean of nothing is NaN
  // A rank whose shard is empty contributes 0 to a sum over all ranks.
  const Tensor empty = Tensor::zeros({0, 16});
  CHECK(nn::l1_loss_forward(empty, empty, nn::Reduction::sum_divided_by(10)).item() == 0.0f);
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
  CHECK_THROWS_WITH(autograd::add(Variable(a), Variable(b)),
                    Catch::Contains("shapes differ: [4, 3] vs [4, 2]"));
}
