// AdamW and gradient clipping against an independent float64 re-implementation
// of torch.optim.AdamW and torch.nn.utils.clip_grad_norm_.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <tuple>

#include "core/error.h"
#include "core/generator.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "tests/test_util.h"

using namespace seqpar;
using autograd::Variable;

namespace {

using Values = std::vector<double>;

std::vector<double> to_doubles(const Tensor& tensor) {
  const std::vector<float> values = tensor.to_vector();
  return Values(values.begin(), values.end());
}

// torch.optim.AdamW's formulas, in double, one parameter at a time.
struct ReferenceAdamW {
  optim::AdamWOptions options;
  std::vector<Values> params, exp_avgs, exp_avg_sqs;
  std::vector<int64_t> steps;

  ReferenceAdamW(const std::vector<Variable>& variables, optim::AdamWOptions options)
      : options(options) {
    for (const Variable& variable : variables) {
      params.push_back(to_doubles(variable.data()));
      exp_avgs.emplace_back(params.back().size(), 0.0);
      exp_avg_sqs.emplace_back(params.back().size(), 0.0);
      steps.push_back(0);
    }
  }

  void step(size_t index, const Values& grad) {
    const int64_t step = ++steps[index];
    const double bias_correction1 = 1.0 - std::pow(options.beta1(), step);
    const double bias_correction2 = 1.0 - std::pow(options.beta2(), step);
    Values &p = params[index], &m = exp_avgs[index], &v = exp_avg_sqs[index];
    for (size_t i = 0; i < p.size(); ++i) {
      p[i] *= 1.0 - options.lr() * options.weight_decay();
      m[i] = options.beta1() * m[i] + (1.0 - options.beta1()) * grad[i];
      v[i] = options.beta2() * v[i] + (1.0 - options.beta2()) * grad[i] * grad[i];
      const double denom = std::sqrt(v[i] / bias_correction2) + options.eps();
      p[i] -= options.lr() / bias_correction1 * m[i] / denom;
    }
  }
};

// torch.nn.utils.clip_grad_norm_ in double: returns the norm before clipping.
double reference_clip(std::vector<Values>& grads, double max_norm) {
  double squares = 0.0;
  for (const Values& grad : grads) {
    for (double g : grad) squares += g * g;
  }
  const double total = std::sqrt(squares);
  const double coefficient = std::min(1.0, max_norm / (total + 1e-6));
  for (Values& grad : grads) {
    for (double& g : grad) g *= coefficient;
  }
  return total;
}

// |actual - expected| within `relative` of max(|expected|, 1).
void check_close(const Tensor& actual, const Values& expected, double relative) {
  const std::vector<float> values = actual.to_vector();
  REQUIRE(values.size() == expected.size());
  double worst = 0.0;
  for (size_t i = 0; i < values.size(); ++i) {
    worst = std::max(worst, std::fabs(values[i] - expected[i]) /
                                std::max(std::fabs(expected[i]), 1.0));
  }
  CHECK(worst <= relative);
}

std::vector<Variable> make_parameters(Generator& generator) {
  return {Variable(generator.randn({7, 5}), true), Variable(generator.randn({5}), true),
          Variable(generator.randn({1}), true), Variable(generator.randn({1, 17}), true)};
}

const optim::AdamWOptions kOptions =
    optim::AdamWOptions().lr(1e-2).betas({0.9, 0.999}).eps(1e-8).weight_decay(0.1);

// Several steps of (fresh gradients, optional clipping, AdamW) on both sides.
void run_against_reference(uint64_t seed, double max_norm, bool clip) {
  Generator generator(seed);
  std::vector<Variable> parameters = make_parameters(generator);
  optim::AdamW optimizer(parameters, kOptions);
  ReferenceAdamW reference(parameters, kOptions);
  for (int step = 1; step <= 6; ++step) {
    std::vector<Values> grads;
    for (const Variable& p : parameters) {
      p.set_grad(generator.randn(p.shape()));
      grads.push_back(to_doubles(p.grad()));
    }
    if (clip) {
      const double expected_norm = reference_clip(grads, max_norm);
      const float norm = optim::clip_grad_norm(parameters, max_norm).item();
      CHECK(std::fabs(norm - expected_norm) <= 1e-6 * expected_norm);
      for (size_t i = 0; i < parameters.size(); ++i) check_close(parameters[i].grad(), grads[i], 1e-6);
    }
    optimizer.step();
    for (size_t i = 0; i < parameters.size(); ++i) {
      reference.step(i, grads[i]);
      CAPTURE(step, i);
      check_close(parameters[i].data(), reference.params[i], 1e-5);
      check_close(optimizer.exp_avg(i), reference.exp_avgs[i], 1e-5);
      check_close(optimizer.exp_avg_sq(i), reference.exp_avg_sqs[i], 1e-5);
    }
  }
  CHECK(optimizer.step_count() == 6);
}

}  // namespace

TEST_CASE("AdamW matches a float64 reference over several steps", "[optim]") {
  run_against_reference(301, 0.0, /*clip=*/false);
}

TEST_CASE("clip then AdamW match float64 with clipping active", "[optim]") {
  run_against_reference(302, /*max_norm=*/0.5, /*clip=*/true);  // norms are ~7: clipped
}

TEST_CASE("clip then AdamW match float64 with clipping inactive", "[optim]") {
  run_against_reference(303, /*max_norm=*/1e9, /*clip=*/true);
}

TEST_CASE("AdamW's first step moves each weight by about lr * sign(g)", "[optim]") {
  // The mechanism behind the bug: ranks whose local gradients differ in sign
  // move a weight in opposite directions, 2 * lr apart.
  Generator generator(304);
  Variable p(generator.randn({64}), true);
  const std::vector<float> before = p.data().to_vector();
  p.set_grad(generator.randn({64}));
  optim::AdamW optimizer({p}, optim::AdamWOptions(1e-4).weight_decay(0.0));
  optimizer.step();
  const std::vector<float> after = p.data().to_vector(), grad = p.grad().to_vector();
  for (size_t i = 0; i < before.size(); ++i) {
    CHECK(after[i] - before[i] == Approx(grad[i] > 0 ? -1e-4 : 1e-4).epsilon(1e-2));
  }
}

TEST_CASE("AdamW with zero gradients only decays the weights", "[optim]") {
  Generator generator(305);
  Variable p(generator.randn({3, 3}), true);
  const Tensor before = p.data().clone();
  p.set_grad(Tensor::zeros({3, 3}));
  optim::AdamW optimizer({p}, optim::AdamWOptions(1e-3).weight_decay(0.5));
  optimizer.step();
  const float decay = static_cast<float>(1.0 - 1e-3 * 0.5);
  const std::vector<float> expected_before = before.to_vector(), after = p.data().to_vector();
  for (size_t i = 0; i < after.size(); ++i) CHECK(after[i] == expected_before[i] * decay);
}

TEST_CASE("AdamW skips parameters without a gradient, and each counts its own steps", "[optim]") {
  Generator generator(306);
  Variable early(generator.randn({4}), true), late(generator.randn({4}), true);
  Variable twin(late.data().clone(), true);  // what `late` would be if it had started later
  optim::AdamW optimizer({early, late}, kOptions);
  optim::AdamW fresh({twin}, kOptions);

  early.set_grad(generator.randn({4}));
  const Tensor late_before = late.data().clone();
  optimizer.step();
  CHECK(test::bitwise_equal(late.data(), late_before));
  CHECK_FALSE(optimizer.exp_avg(1).defined());

  const Tensor grad = generator.randn({4});
  late.set_grad(grad);
  twin.set_grad(grad.clone());
  optimizer.step();  // late's first step: bias corrections of step 1, as in PyTorch
  fresh.step();
  CHECK(test::bitwise_equal(late.data(), twin.data()));
  CHECK(optimizer.step_count() == 2);
  CHECK(fresh.step_count() == 1);
}

TEST_CASE("AdamWOptions: PyTorch's defaults, named setters that chain, getters", "[optim]") {
  const optim::AdamWOptions defaults;
  CHECK(defaults.lr() == 1e-3);
  CHECK(defaults.betas() == std::tuple<double, double>{0.9, 0.999});
  CHECK(defaults.eps() == 1e-8);
  CHECK(defaults.weight_decay() == 1e-2);

  const optim::AdamWOptions options =
      optim::AdamWOptions().lr(3e-4).betas({0.8, 0.95}).eps(1e-6).weight_decay(0.25);
  CHECK(options.lr() == 3e-4);
  CHECK(options.beta1() == 0.8);
  CHECK(options.beta2() == 0.95);
  CHECK(options.eps() == 1e-6);
  CHECK(options.weight_decay() == 0.25);
  CHECK(optim::AdamWOptions(5e-5).lr() == 5e-5);  // the constructor's argument is lr, as libtorch's

  Variable p(Tensor::zeros({2}), true);
  const optim::AdamW optimizer({p}, 2e-4);  // AdamW(parameters, lr), as torch.optim.AdamW
  CHECK(optimizer.options().lr() == 2e-4);
  CHECK(optimizer.options().weight_decay() == 1e-2);
}

TEST_CASE("AdamW::zero_grad clears the gradients (set_to_none) or zeros them in place", "[optim]") {
  Generator generator(307);
  Variable a(generator.randn({3, 2}), true), b(generator.randn({5}), true);
  optim::AdamW optimizer({a, b});
  a.set_grad(generator.randn({3, 2}));
  b.set_grad(generator.randn({5}));

  SECTION("by default, as PyTorch's: undefined, and the next step skips them") {
    optimizer.zero_grad();
    CHECK_FALSE(a.grad().defined());
    CHECK_FALSE(b.grad().defined());
    const Tensor before = a.data().clone();
    optimizer.step();
    CHECK(test::bitwise_equal(a.data(), before));
    CHECK_FALSE(optimizer.exp_avg(0).defined());
  }
  SECTION("set_to_none = false: zeros in the same memory") {
    const float* memory = a.grad().data();
    optimizer.zero_grad(/*set_to_none=*/false);
    REQUIRE(a.grad().defined());
    CHECK(a.grad().data() == memory);
    CHECK(test::bitwise_equal(a.grad(), Tensor::zeros({3, 2})));
    CHECK(test::bitwise_equal(b.grad(), Tensor::zeros({5})));
  }
  SECTION("the next backward pass gives its own gradient, not a sum with the last") {
    const Tensor fresh = generator.randn({5});
    for (const bool set_to_none : {true, false}) {
      optimizer.zero_grad(set_to_none);
      b.backward(fresh);  // b is a leaf: its gradient is the seed
      CHECK(test::bitwise_equal(b.grad(), fresh));
    }
  }
}

TEST_CASE("AdamW rejects invalid options with messages that name them", "[optim][errors]") {
  Variable p(Tensor::zeros({2}), true);
  auto with = [](auto change) {
    optim::AdamWOptions options;
    change(options);
    return options;
  };
  CHECK_THROWS_AS(optim::AdamW({p}, with([](auto& o) { o.lr(-1e-3); })), Error);
  CHECK_THROWS_WITH(optim::AdamW({p}, with([](auto& o) { o.lr(-1e-3); })),
                    Catch::Contains("learning rate (lr)") && Catch::Contains("-0.001"));
  CHECK_THROWS_WITH(optim::AdamW({p}, with([](auto& o) { o.betas({1.0, 0.999}); })),
                    Catch::Contains("beta1 must be in [0, 1), got 1"));
  CHECK_THROWS_WITH(optim::AdamW({p}, with([](auto& o) { o.betas({0.9, -0.5}); })),
                    Catch::Contains("beta2 must be in [0, 1), got -0.5"));
  CHECK_THROWS_WITH(optim::AdamW({p}, with([](auto& o) { o.eps(-1.0); })),
                    Catch::Contains("eps must be >= 0"));
  CHECK_THROWS_WITH(optim::AdamW({p}, with([](auto& o) { o.weight_decay(-0.1); })),
                    Catch::Contains("weight_decay must be >= 0"));
  CHECK_THROWS_WITH(optim::AdamW({Variable()}, optim::AdamWOptions{}),
                    Catch::Contains("parameter 0 is undefined"));
}
