// The backward engine: dependency counting, gradient sums, accumulation across
// passes, grad mode, and the checks that name the Node at fault.
#include <catch2/catch.hpp>

#include "autograd/engine.h"
#include "autograd/node.h"
#include "autograd/ops.h"
#include "autograd/variable.h"
#include "core/error.h"
#include "core/generator.h"

using namespace seqpar;
using autograd::Variable;

namespace {

std::vector<float> scaled(const Tensor& tensor, float factor) {
  std::vector<float> values = tensor.to_vector();
  for (float& value : values) value *= factor;
  return values;
}

// A Node that passes its gradient through and counts how often it ran.
struct CountingNode : autograd::Node {
  std::vector<Tensor> apply(const Tensor& grad_output) override {
    ++runs;
    return {grad_output};
  }
  std::string name() const override { return "CountingBackward"; }
  int runs = 0;
};

// A broken op whose backward returns a gradient of the wrong shape.
struct WrongShapeNode : autograd::Node {
  std::vector<Tensor> apply(const Tensor&) override { return {Tensor::zeros({3, 3})}; }
  std::string name() const override { return "WrongShapeBackward"; }
};

}  // namespace

TEST_CASE("a Variable used twice gets the sum of both gradients", "[autograd]") {
  Generator generator(31);
  Variable a(generator.randn({4, 3}), /*requires_grad=*/true);
  const Tensor seed = generator.randn({4, 3});
  autograd::add(a, a).backward(seed);
  CHECK(a.grad().to_vector() == scaled(seed, 2.0f));
}

TEST_CASE("gradients meeting at an inner node are summed before it runs once", "[autograd]") {
  Generator generator(32);
  Variable a(generator.randn({2, 5}), true), b(generator.randn({2, 5}), true);
  // c = a + b feeds two branches: f = 2c + (c - a), so df/da = 2, df/db = 3.
  auto counter = std::make_shared<CountingNode>();
  Variable c_raw = autograd::add(a, b);
  counter->add_input(c_raw);
  Variable c = Variable::from_op(c_raw.data(), counter);
  Variable f = autograd::add(autograd::mul(c, 2.0f), autograd::sub(c, a));
  f.backward(Tensor::ones({2, 5}));
  CHECK(counter->runs == 1);
  CHECK(a.grad().to_vector() == std::vector<float>(10, 2.0f));
  CHECK(b.grad().to_vector() == std::vector<float>(10, 3.0f));
}

TEST_CASE(".grad() accumulates across backward passes until zero_grad", "[autograd]") {
  Generator generator(33);
  Variable w(generator.randn({3}), /*requires_grad=*/true);
  Variable y = autograd::mul(w, 3.0f);
  const Tensor seed = Tensor::ones({3});
  y.backward(seed);
  CHECK(w.grad().to_vector() == std::vector<float>(3, 3.0f));
  y.backward(seed);  // the graph is kept: a second pass adds in
  CHECK(w.grad().to_vector() == std::vector<float>(3, 6.0f));
  const float* memory = w.grad().data();
  w.zero_grad();
  CHECK(w.grad().to_vector() == std::vector<float>(3, 0.0f));
  CHECK(w.grad().data() == memory);  // zeroed in place
  autograd::mul(w, -1.0f).backward(seed);  // a new graph, same leaf
  CHECK(w.grad().to_vector() == std::vector<float>(3, -1.0f));
}

TEST_CASE("the leaf's gradient is a private copy", "[autograd]") {
  Variable w(Tensor::ones({2, 2}), /*requires_grad=*/true);
  Tensor seed = Tensor::full({2, 2}, 0.5f);
  autograd::add(w, Variable(Tensor::zeros({2, 2}))).backward(seed);
  CHECK(w.grad().storage() != seed.storage());
  seed.fill_(9.0f);
  CHECK(w.grad().to_vector() == std::vector<float>(4, 0.5f));
}

TEST_CASE("NoGradGuard records nothing and restores grad mode", "[autograd]") {
  Variable a(Tensor::ones({2}), /*requires_grad=*/true);
  CHECK(autograd::grad_mode_enabled());
  {
    autograd::NoGradGuard no_grad;
    CHECK_FALSE(autograd::grad_mode_enabled());
    {
      autograd::NoGradGuard nested;
    }
    CHECK_FALSE(autograd::grad_mode_enabled());  // the inner guard restores "off"
    Variable b = autograd::mul(autograd::add(a, a), 2.0f);
    CHECK(b.grad_fn() == nullptr);
    CHECK_FALSE(b.requires_grad());
    CHECK_THROWS_WITH(b.backward(Tensor::ones({2})), Catch::Contains("does not require grad"));
  }
  CHECK(autograd::grad_mode_enabled());
  Variable c = autograd::add(a, a);
  REQUIRE(c.grad_fn() != nullptr);
  CHECK(c.grad_fn()->name() == "AddBackward");
}

TEST_CASE("ops record a Node only when an input requires grad", "[autograd]") {
  Variable plain(Tensor::ones({2, 3}));
  CHECK(autograd::sub(plain, plain).grad_fn() == nullptr);
  Variable tracked(Tensor::ones({2, 3}), true);
  CHECK(autograd::sub(plain, tracked).grad_fn()->name() == "SubBackward");
  CHECK(autograd::mul(tracked, 2.0f).grad_fn()->name() == "MulBackward");
  CHECK(autograd::narrow(tracked, 1, 0, 2).grad_fn()->name() == "NarrowBackward");
  // Only the input that requires grad receives one.
  autograd::sub(plain, tracked).backward(Tensor::ones({2, 3}));
  CHECK_FALSE(plain.grad().defined());
  CHECK(tracked.grad().to_vector() == std::vector<float>(6, -1.0f));
}

TEST_CASE("a gradient of the wrong shape is an error naming the Node", "[autograd]") {
  Variable leaf(Tensor::ones({2, 2}), /*requires_grad=*/true);
  auto broken = std::make_shared<WrongShapeNode>();
  broken->add_input(leaf);
  Variable output = Variable::from_op(Tensor::zeros({2, 2}), broken);
  CHECK_THROWS_AS(output.backward(Tensor::ones({2, 2})), Error);
  CHECK_THROWS_WITH(output.backward(Tensor::ones({2, 2})),
                    Catch::Contains("backward of WrongShapeBackward: gradient for input 0 has "
                                    "shape [3, 3] but the input has shape [2, 2]"));
}

TEST_CASE("backward needs a gradient for a non-scalar output", "[autograd]") {
  Variable a(Tensor::ones({2, 3}), /*requires_grad=*/true);
  Variable b = autograd::mul(a, 2.0f);
  CHECK_THROWS_WITH(b.backward(), Catch::Contains("not a scalar") && Catch::Contains("[2, 3]"));
  CHECK_THROWS_WITH(b.backward(Tensor::ones({3, 2})),
                    Catch::Contains("gradient of shape [3, 2] for an output of shape [2, 3]"));
  Variable scalar = autograd::narrow(autograd::narrow(b, 0, 0, 1), 1, 0, 1);  // [1, 1]
  scalar.backward();
  CHECK(a.grad().at({0, 0}) == 2.0f);
  CHECK(a.grad().at({1, 2}) == 0.0f);
}

TEST_CASE("leaves and their switches", "[autograd]") {
  Variable leaf(Tensor::ones({2}));
  CHECK(leaf.is_leaf());
  CHECK_FALSE(leaf.requires_grad());
  CHECK_FALSE(leaf.gradient_edge().valid());
  leaf.set_requires_grad(true);
  CHECK(leaf.gradient_edge().node == leaf.gradient_edge().node);  // one sink per leaf
  Variable made = autograd::add(leaf, leaf);
  CHECK_FALSE(made.is_leaf());
  CHECK_THROWS_WITH(made.set_requires_grad(false), Catch::Contains("AddBackward"));
  Variable alias = leaf;  // copies alias one another
  alias.set_grad(Tensor::full({2}, 4.0f));
  CHECK(leaf.grad().to_vector() == std::vector<float>(2, 4.0f));
  CHECK_THROWS_WITH(leaf.set_grad(Tensor::ones({3})), Catch::Contains("[3]"));
  leaf.set_data(Tensor::full({2}, 7.0f));
  CHECK(alias.data().to_vector() == std::vector<float>(2, 7.0f));
  CHECK_THROWS_WITH(leaf.set_data(Tensor::ones({5})), Catch::Contains("shape [5]"));
}
