// L1 loss with a row mask (ignore_index's counterpart): values and gradients against
// float64 references and finite differences for each reduction, the exact forward
// against the exact sum of the kept rows' terms, a mask of ones equal to no mask bit for
// bit, masked rows reaching neither the loss nor the gradient, and bad masks refused.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "autograd/node.h"
#include "autograd/ops.h"
#include "core/elementwise.h"
#include "core/error.h"
#include "core/generator.h"
#include "nn/l1_loss.h"
#include "tests/gradcheck.h"
#include "tests/nn/l1_loss_test_util.h"
#include "tests/test_util.h"

using namespace seqpar;
using autograd::Variable;
using test::MatrixD;
using test::same_float;
using namespace seqpar::test::l1;

namespace {

// A row mask of 0/1 values with about `keep` of the rows kept, drawn from rng.
std::vector<float> random_mask(std::mt19937_64& rng, int64_t rows, double keep) {
  std::bernoulli_distribution kept(keep);
  std::vector<float> mask(static_cast<size_t>(rows));
  for (float& value : mask) value = kept(rng) ? 1.0f : 0.0f;
  return mask;
}

int64_t kept_rows(const std::vector<float>& mask) {
  return static_cast<int64_t>(std::count(mask.begin(), mask.end(), 1.0f));
}

// The kept rows of a [n, m] tensor, in order, as a new contiguous tensor.
Tensor kept_rows_of(const Tensor& matrix, const std::vector<float>& mask) {
  std::vector<float> values;
  for (int64_t row = 0; row < matrix.size(0); ++row) {
    if (mask[static_cast<size_t>(row)] == 0.0f) continue;
    for (float v : matrix.narrow(0, row, 1).to_vector()) values.push_back(v);
  }
  return Tensor::from_data({kept_rows(mask), matrix.size(1)}, values);
}

bool is_positive_zero(float value) { return value == 0.0f && !std::signbit(value); }

// Every element of a masked row is +0 (bitwise), every other one is not (the inputs
// differ from the targets by at least 0.05, so sign(d) is never 0 there).
void check_masked_rows_zero(const Tensor& grad, const std::vector<float>& mask, int64_t columns) {
  for (int64_t row = 0; row < grad.size(0); ++row) {
    for (int64_t col = 0; col < columns; ++col) {
      const float g = grad.at({row, col});
      CAPTURE(row, col, g);
      if (mask[static_cast<size_t>(row)] == 0.0f) {
        CHECK(is_positive_zero(g));
      } else {
        CHECK(g != 0.0f);
      }
    }
  }
}

// As check_reduction, under a random row mask: the float64 reference sums only the
// kept rows, and the mean divides by kept rows x columns.
void check_masked_reduction(nn::Reduction reduction, double scale_for_sum) {
  std::mt19937_64 rng(2027);
  for (const Shape2& s : kShapes) {
    for (double keep : {1.0, 0.6, 0.3}) {
      Generator generator(s.seed + 100);
      std::vector<float> mask = random_mask(rng, s.rows, keep);
      if (kept_rows(mask) == 0) mask[0] = 1.0f;  // an all-masked mean is NaN: its own test
      const int64_t kept = kept_rows(mask);
      CAPTURE(s.rows, s.columns, keep, kept);
      Variable x(generator.randn({s.rows, s.columns + 3}), /*requires_grad=*/true);
      Variable target = autograd::narrow(x, 1, 0, s.columns);
      Variable input(seqpar::add(target.data(), away_from_zero(generator, target.shape())), true);
      const Tensor row_mask = Tensor::from_data({s.rows}, mask);
      Variable loss = nn::l1_loss(input, target, reduction, row_mask);
      REQUIRE(loss.shape() == Shape{});
      REQUIRE(loss.grad_fn()->name() == "MaskedL1LossBackward");
      loss.backward();

      const double scale = reduction.kind == nn::Reduction::Kind::Mean
                               ? 1.0 / static_cast<double>(kept * s.columns)
                               : scale_for_sum;
      const int64_t columns = s.columns;
      Eigen::VectorXd weights(s.rows);
      for (int64_t i = 0; i < s.rows; ++i) weights[i] = mask[static_cast<size_t>(i)];
      const test::ScalarFunction f = [&](const std::vector<MatrixD>& in) {
        return scale *
               (weights.asDiagonal() * (in[0] - in[1].leftCols(columns)).cwiseAbs()).sum();
      };
      const std::vector<MatrixD> inputs{test::to_double(input.data()), test::to_double(x.data())};
      CHECK(std::fabs(loss.data().item() - f(inputs)) <= 1e-6 * std::fabs(f(inputs)));
      CHECK(test::relative_error(test::to_double(input.grad()),
                                 test::numeric_gradient(f, inputs, 0)) < 1e-4);
      CHECK(test::relative_error(test::to_double(x.grad()), test::numeric_gradient(f, inputs, 1)) <
            1e-4);
      check_masked_rows_zero(input.grad(), mask, s.columns);
      check_masked_rows_zero(x.grad(), mask, s.columns);

      // The compute functions give autograd's numbers, and scale with grad_loss.
      const Tensor one = Tensor::from_data({}, {1.0f});
      CHECK(test::bitwise_equal(
          nn::l1_loss_backward(one, input.data(), target.data(), reduction, row_mask),
          input.grad()));
      const Tensor minus_three = Tensor::from_data({}, {-3.0f});
      const Tensor scaled =
          nn::l1_loss_backward(minus_three, input.data(), target.data(), reduction, row_mask);
      for (int64_t i = 0; i < s.rows; ++i) {
        const float expected = mask[static_cast<size_t>(i)] == 0.0f
                                   ? 0.0f
                                   : static_cast<float>(static_cast<double>(input.grad().at({i, 0})) * -3.0);
        CHECK(same_float(scaled.at({i, 0}), expected));
      }
    }
  }
}

}  // namespace

TEST_CASE("l1_loss with a row mask, mean: over the kept rows' elements, float64 and finite "
          "differences",
          "[nn][mask]") {
  check_masked_reduction(nn::Reduction::mean(), 0.0);
}

TEST_CASE("l1_loss with a row mask, sum: float64 and finite differences", "[nn][mask]") {
  check_masked_reduction(nn::Reduction::sum(), 1.0);
}

TEST_CASE("l1_loss with a row mask, sum / count: float64 and finite differences", "[nn][mask]") {
  check_masked_reduction(nn::Reduction::sum_divided_by(12000), 1.0 / 12000.0);
}

TEST_CASE("l1_loss with a row mask is the exact sum of the kept rows' terms rounded once (seed 31)",
          "[nn][mask][l1_loss]") {
  std::mt19937_64 rng(31);
  std::uniform_int_distribution<int64_t> size(1, 60);
  for (int trial = 0; trial < 40; ++trial) {
    const Shape shape{size(rng), size(rng)};
    const int spread = 10 * (trial % 4);
    const Tensor input = spread_values(rng, shape, spread);
    const Tensor target = spread_values(rng, {shape[0], shape[1] + 2}, spread).narrow(1, 1, shape[1]);
    const std::vector<float> mask = random_mask(rng, shape[0], trial % 2 ? 0.5 : 0.9);
    const Tensor row_mask = Tensor::from_data({shape[0]}, mask);
    CAPTURE(trial, shape, spread, kept_rows(mask));
    const Tensor input_kept = kept_rows_of(input, mask);
    const Tensor target_kept = kept_rows_of(target.contiguous(), mask);
    for (const nn::Reduction& reduction : kReductions) {
      CAPTURE(static_cast<int>(reduction.kind), reduction.divisor);
      const float loss = nn::l1_loss_forward(input, target, reduction, row_mask).item();
      // Independently: the exact reference over the kept rows alone, with the mean
      // counting only their elements.
      const float expected = reference_l1(input_kept, target_kept, reduction);
      CAPTURE(loss, expected);
      CHECK(same_float(loss, expected));
      // The masked loss is the unmasked loss of the kept rows, bit for bit.
      CHECK(same_float(loss, nn::l1_loss_forward(input_kept, target_kept, reduction).item()));
    }
  }
}

TEST_CASE("l1_loss with a mask of ones is the unmasked loss and gradient, bit for bit (seed 32)",
          "[nn][mask]") {
  std::mt19937_64 rng(32);
  for (const Shape shape : {Shape{1, 1}, Shape{17, 16}, Shape{300, 7}}) {
    CAPTURE(shape);
    const Tensor input = spread_values(rng, shape, 8), target = spread_values(rng, shape, 8);
    const Tensor ones = Tensor::ones({shape[0]});
    const Tensor grad_loss = Tensor::from_data({}, {0.37f});
    for (const nn::Reduction& reduction : kReductions) {
      CHECK(test::bitwise_equal(nn::l1_loss_forward(input, target, reduction, ones),
                                nn::l1_loss_forward(input, target, reduction)));
      CHECK(test::bitwise_equal(nn::l1_loss_backward(grad_loss, input, target, reduction, ones),
                                nn::l1_loss_backward(grad_loss, input, target, reduction)));
    }
  }
}

TEST_CASE("l1_loss: nothing in a masked row reaches the loss or the gradient", "[nn][mask]") {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  // Rows 1 and 3 masked, holding NaN, inf and inf - inf; rows 0 and 2 ordinary.
  Variable input(Tensor::from_data({4, 2}, {1.0f, 2.0f, nan, 5.0f, -1.0f, 0.5f, inf, -inf}), true);
  Variable target(Tensor::from_data({4, 2}, {0.0f, 3.0f, 1.0f, inf, 1.0f, 0.5f, inf, 2.0f}), true);
  const Tensor mask = Tensor::from_data({4}, {1.0f, 0.0f, 1.0f, 0.0f});
  // |1 - 0| + |2 - 3| + |-1 - 1| + |0.5 - 0.5| = 4 over 2 rows x 2 columns.
  Variable loss = nn::l1_loss(input, target, nn::Reduction::mean(), mask);
  CHECK(loss.data().item() == 1.0f);
  CHECK(nn::l1_loss_forward(input.data(), target.data(), nn::Reduction::sum(), mask).item() == 4.0f);
  loss.backward();
  CHECK(input.grad().to_vector() ==
        std::vector<float>{0.25f, -0.25f, 0.0f, 0.0f, -0.25f, 0.0f, 0.0f, 0.0f});
  CHECK(target.grad().to_vector() ==
        std::vector<float>{-0.25f, 0.25f, 0.0f, 0.0f, 0.25f, 0.0f, 0.0f, 0.0f});
  for (const Tensor& grad : {input.grad(), target.grad()}) {
    for (int64_t row : {1, 3}) {
      for (int64_t col : {0, 1}) CHECK(is_positive_zero(grad.at({row, col})));
    }
  }
  // A -0 in the mask is 0: the row is masked.
  const Tensor negative_zero = Tensor::from_data({4}, {1.0f, -0.0f, 1.0f, 0.0f});
  CHECK(nn::l1_loss_forward(input.data(), target.data(), nn::Reduction::sum(), negative_zero)
            .item() == 4.0f);
}

TEST_CASE("l1_loss with every row masked: the mean is NaN (as torch), sum 0, gradients +0",
          "[nn][mask]") {
  Generator generator(33);
  Variable input(generator.randn({5, 3}), true);
  Variable target(generator.randn({5, 3}));
  const Tensor none = Tensor::zeros({5});
  Variable mean = nn::l1_loss(input, target, nn::Reduction::mean(), none);
  CHECK(std::isnan(mean.data().item()));
  mean.backward();
  for (float g : input.grad().to_vector()) CHECK(is_positive_zero(g));
  CHECK(same_float(nn::l1_loss_forward(input.data(), target.data(), nn::Reduction::sum(), none).item(),
                   0.0f));
  CHECK(same_float(
      nn::l1_loss_forward(input.data(), target.data(), nn::Reduction::sum_divided_by(3), none).item(),
      0.0f));
  // No rows at all: as without a mask.
  const Tensor empty = Tensor::zeros({0, 4});
  CHECK(std::isnan(nn::l1_loss_forward(empty, empty, nn::Reduction::mean(), Tensor::zeros({0})).item()));
  CHECK(nn::l1_loss_forward(empty, empty, nn::Reduction::sum(), Tensor::zeros({0})).item() == 0.0f);
}

TEST_CASE("l1_loss rejects a bad row mask with a message naming its shape or value",
          "[nn][mask][errors]") {
  const Tensor a = Tensor::zeros({4, 3});
  const nn::Reduction mean = nn::Reduction::mean();
  CHECK_THROWS_WITH(nn::l1_loss_forward(a, a, mean, Tensor::ones({5})),
                    Catch::Contains("row_mask must have shape [4] (one value per row), got shape [5]"));
  CHECK_THROWS_WITH(nn::l1_loss_forward(a, a, mean, Tensor::ones({4, 1})),
                    Catch::Contains("got shape [4, 1]"));
  CHECK_THROWS_WITH(nn::l1_loss_forward(a, a, mean, Tensor::ones({})), Catch::Contains("got shape []"));
  CHECK_THROWS_WITH(nn::l1_loss_forward(a, a, mean, Tensor()), Catch::Contains("row_mask must be defined"));
  for (float bad : {0.5f, 2.0f, -1.0f, std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::infinity()}) {
    CAPTURE(bad);
    const Tensor mask = Tensor::from_data({4}, {1.0f, 0.0f, bad, 1.0f});
    CHECK_THROWS_WITH(nn::l1_loss_forward(a, a, mean, mask),
                      Catch::Contains("row_mask of shape [4] holds") && Catch::Contains("at row 2") &&
                          Catch::Contains("only 0 (ignore the row) and 1"));
    CHECK_THROWS_WITH(nn::l1_loss_backward(Tensor::ones({}), a, a, mean, mask),
                      Catch::Contains("l1_loss_backward: row_mask of shape [4] holds"));
    CHECK_THROWS_WITH(nn::l1_loss(Variable(a, true), Variable(a), mean, mask),
                      Catch::Contains("at row 2"));
  }
  CHECK_THROWS_WITH(nn::l1_loss_forward(a, a, mean, Tensor::from_data({4}, {1, 0.5f, 1, 1})),
                    Catch::Contains("holds 0.5 at row 1"));
  // The input's own checks come first.
  CHECK_THROWS_WITH(nn::l1_loss_forward(a, Tensor::zeros({4, 2}), mean, Tensor::ones({4})),
                    Catch::Contains("input has shape [4, 3] but target has shape [4, 2]"));
  CHECK(nn::unmasked_rows("test", Tensor::from_data({3}, {1, 0, 1}), 3, Device::cpu()) == 2);
}
