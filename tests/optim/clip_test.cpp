// Gradient-norm clipping: the norm (against an independent exact reference: GMP
// rationals, rounded by MPFR), the coefficient, and what is left alone.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "core/error.h"
#include "core/generator.h"
#include "optim/clip.h"
#include "tests/exact_reference.h"
#include "tests/test_util.h"

using namespace seqpar;
using autograd::Variable;
using test::ReferenceSum;
using test::same_float;

TEST_CASE("grad_norm is the L2 norm of all defined gradients", "[optim]") {
  Generator generator(401);
  std::vector<Variable> parameters{Variable(Tensor::zeros({33, 13}), true),
                                   Variable(Tensor::zeros({1}), true),
                                   Variable(Tensor::zeros({7}), true)};
  double squares = 0.0;
  for (size_t i = 0; i < 2; ++i) {  // the last parameter has no gradient: skipped
    parameters[i].set_grad(generator.randn(parameters[i].shape()));
    for (float g : parameters[i].grad().to_vector()) squares += static_cast<double>(g) * g;
  }
  const Tensor norm = optim::grad_norm(parameters);
  CHECK(norm.shape() == Shape{});
  CHECK(norm.item() == Approx(std::sqrt(squares)).epsilon(1e-6));
  CHECK(optim::grad_norm({parameters[2]}).item() == 0.0f);  // no gradients: norm 0
}

TEST_CASE("clip_grad_norm scales to max_norm when above it", "[optim]") {
  Generator generator(402);
  Variable a(Tensor::zeros({8, 4}), true), b(Tensor::zeros({4}), true);
  a.set_grad(generator.randn({8, 4}));
  b.set_grad(generator.randn({4}));
  const float before = optim::grad_norm({a, b}).item();
  REQUIRE(before > 1.0f);
  const Tensor returned = optim::clip_grad_norm({a, b}, 1.0);
  CHECK(returned.item() == before);  // the norm before clipping
  CHECK(optim::grad_norm({a, b}).item() == Approx(1.0).epsilon(1e-5));
}

TEST_CASE("clip_grad_norm leaves small gradients bitwise unchanged", "[optim]") {
  Generator generator(403);
  Variable a(Tensor::zeros({5, 3}), true);
  a.set_grad(generator.randn({5, 3}));
  const Tensor before = a.grad().clone();
  optim::clip_grad_norm({a}, 1e6);  // coefficient clamps to exactly 1
  CHECK(test::bitwise_equal(a.grad(), before));
}

TEST_CASE("clip_grads_with_norm uses the norm it is given", "[optim]") {
  // A distributed policy combines norms across ranks, then clips with the result.
  Variable a(Tensor::zeros({4}), true);
  a.set_grad(Tensor::full({4}, 2.0f));
  optim::clip_grads_with_norm({a}, 1.0, Tensor::full({}, 8.0f));
  const float coefficient = (1.0f / (8.0f + 1e-6f)) * 1.0f;  // torch's float32 formula
  CHECK(a.grad().to_vector() == std::vector<float>(4, 2.0f * coefficient));
}

TEST_CASE("clipping rejects bad arguments", "[optim][errors]") {
  Variable a(Tensor::zeros({4}), true);
  a.set_grad(Tensor::ones({4}));
  CHECK_THROWS_WITH(optim::clip_grad_norm({a}, -1.0), Catch::Contains("max_norm must be >= 0"));
  CHECK_THROWS_WITH(optim::clip_grads_with_norm({a}, 1.0, Tensor::zeros({2})),
                    Catch::Contains("total_norm must hold one element"));
}

// ---------------------------------------------------------------- exactness

namespace {

// The canonical norm of optim/clip.h, from the definition.
float reference_norm(const std::vector<std::vector<float>>& gradients) {
  ReferenceSum squared_norms;
  for (const std::vector<float>& gradient : gradients) {
    ReferenceSum squares;
    for (float g : gradient) squares.add(static_cast<double>(g) * static_cast<double>(g));
    const float norm = static_cast<float>(std::sqrt(squares.rounded<double>()));
    squared_norms.add(static_cast<double>(norm) * static_cast<double>(norm));
  }
  return static_cast<float>(std::sqrt(squared_norms.rounded<double>()));
}

std::vector<Variable> with_gradients(const std::vector<std::vector<float>>& gradients) {
  std::vector<Variable> parameters;
  for (const std::vector<float>& gradient : gradients) {
    const int64_t size = static_cast<int64_t>(gradient.size());
    Variable parameter(Tensor::zeros({size}), true);
    parameter.set_grad(Tensor::from_data({size}, gradient));
    parameters.push_back(parameter);
  }
  return parameters;
}

}  // namespace

TEST_CASE("grad_norm equals the exact definition (seed 4242)", "[optim][clip]") {
  std::mt19937_64 rng(4242);
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int64_t> size(0, 3000);
  for (int trial = 0; trial < 30; ++trial) {
    const int spread = 8 * (trial % 5);  // magnitudes up to 2^+-32: squares in the domain
    std::uniform_int_distribution<int> exponent(-spread, spread);
    std::vector<std::vector<float>> gradients(static_cast<size_t>(1 + trial % 7));
    for (auto& gradient : gradients) {
      gradient.resize(static_cast<size_t>(trial % 3 == 0 ? size(rng) / 100 : size(rng)));
      for (float& g : gradient) g = std::ldexp(normal(rng), exponent(rng));
    }
    CAPTURE(trial, gradients.size(), spread);
    const float norm = optim::grad_norm(with_gradients(gradients)).item();
    const float expected = reference_norm(gradients);
    CAPTURE(norm, expected);
    CHECK(same_float(norm, expected));
  }
}

TEST_CASE("grad_norm of special values follows the exact sums' rules", "[optim][clip]") {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<std::vector<std::vector<float>>> cases = {
      {{1.0f, inf}, {2.0f}},          // +inf
      {{1.0f, -inf}, {2.0f}},         // a square is +inf
      {{nan, 1.0f}, {inf}},           // NaN
      {{3e38f, 1.0f}, {1.0f}},        // a square past 2^129: +inf, as float32 squares
      {{1e19f, 1e19f}, {1e-20f}},     // large but in the domain: finite
      // squares below 2^-149: 2^-160 rounds to 0, 1.125 * 2^-149 to 2^-149
      {{std::ldexp(1.0f, -80), std::ldexp(3.0f, -76)}, {}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    CAPTURE(i);
    const float norm = optim::grad_norm(with_gradients(cases[i])).item();
    CHECK(same_float(norm, reference_norm(cases[i])));
  }
  CHECK(std::isinf(optim::grad_norm(with_gradients(cases[0])).item()));
  CHECK(std::isnan(optim::grad_norm(with_gradients(cases[2])).item()));
  CHECK(std::isfinite(optim::grad_norm(with_gradients(cases[4])).item()));
}

TEST_CASE("grad_norm does not depend on the order of the elements (seed 515)", "[optim][clip]") {
  std::mt19937_64 rng(515);
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> exponent(-25, 25);
  std::vector<std::vector<float>> gradients = {std::vector<float>(10000), std::vector<float>(16),
                                               std::vector<float>(777)};
  for (auto& gradient : gradients) {
    for (float& g : gradient) g = std::ldexp(normal(rng), exponent(rng));
  }
  const float norm = optim::grad_norm(with_gradients(gradients)).item();
  CHECK(same_float(norm, reference_norm(gradients)));
  for (int shuffle = 0; shuffle < 3; ++shuffle) {
    for (auto& gradient : gradients) std::shuffle(gradient.begin(), gradient.end(), rng);
    CHECK(same_float(optim::grad_norm(with_gradients(gradients)).item(), norm));
  }
}
