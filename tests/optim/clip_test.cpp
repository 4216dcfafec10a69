// Gradient-norm clipping: the norm, the coefficient, and what is left alone.
#include <catch2/catch.hpp>

#include <cmath>

#include "core/error.h"
#include "core/generator.h"
#include "optim/clip.h"
#include "tests/test_util.h"

using namespace seqpar;
using autograd::Variable;

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
