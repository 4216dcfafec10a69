// Linear: forward and gradients against float64 references, the module's
// initialization and parameter names, and its argument checks.
#include <catch2/catch.hpp>

#include <cmath>

#include "autograd/node.h"
#include "autograd/ops.h"
#include "core/device.h"
#include "core/error.h"
#include "core/generator.h"
#include "nn/l1_loss.h"
#include "nn/linear.h"
#include "tests/gradcheck.h"
#include "tests/test_util.h"

using namespace seqpar;
using autograd::Variable;
using test::MatrixD;

namespace {

// y = x Wᵀ + b in double; b is a 1 x out row.
MatrixD linear_reference(const MatrixD& x, const MatrixD& weight, const MatrixD& bias) {
  MatrixD y = x * weight.transpose();
  y.rowwise() += bias.row(0);
  return y;
}

struct LinearCase {
  int64_t rows, in_features, out_features;
  uint64_t seed;
};
const std::vector<LinearCase> kCases = {
    {1, 1, 1, 11}, {1, 17, 3, 12}, {7, 5, 4, 13}, {33, 13, 6, 14}, {5, 64, 16, 15}};

}  // namespace

TEST_CASE("linear: forward and gradients match float64 references", "[nn]") {
  for (const LinearCase& c : kCases) {
    for (const bool strided : {false, true}) {
      CAPTURE(c.rows, c.in_features, c.out_features, strided);
      Generator generator(c.seed + (strided ? 100 : 0));
      // A strided x is a window of columns of a wider leaf, as a rank's x[:, a:b].
      const int64_t first_column = strided ? 3 : 0;
      const int64_t width = c.in_features + (strided ? 4 : 0);
      Variable wide(generator.randn({c.rows, width}), /*requires_grad=*/true);
      Variable x = strided ? autograd::narrow(wide, 1, first_column, c.in_features) : wide;
      Variable weight(generator.randn({c.out_features, c.in_features}), true);
      Variable bias(generator.randn({c.out_features}), true);
      const Tensor weights = generator.randn({c.rows, c.out_features});

      Variable y = nn::linear(x, weight, bias);
      REQUIRE(y.grad_fn()->name() == "LinearBackward");
      y.backward(weights);

      const std::vector<MatrixD> inputs{test::to_double(wide.data()),
                                        test::to_double(weight.data()),
                                        test::to_double(bias.data())};
      const MatrixD expected = linear_reference(
          inputs[0].middleCols(first_column, c.in_features), inputs[1], inputs[2]);
      CHECK(test::relative_error(test::to_double(y.data()), expected) < 1e-5);

      const MatrixD weights_d = test::to_double(weights);
      const test::ScalarFunction f = [&](const std::vector<MatrixD>& in) {
        return test::weighted_sum(
            weights_d, linear_reference(in[0].middleCols(first_column, c.in_features), in[1], in[2]));
      };
      const Variable* leaves[] = {&wide, &weight, &bias};
      for (size_t k = 0; k < 3; ++k) {
        CAPTURE(k);
        CHECK(test::relative_error(test::to_double(leaves[k]->grad()),
                                   test::numeric_gradient(f, inputs, k)) < 1e-4);
      }
    }
  }
}

TEST_CASE("linear: the app's graph, L1 of the leading m columns of x against linear(x)", "[nn]") {
  // loss = mean |x[:, :m] - (x Wᵀ + b)|, differentiated in x (both uses), W and b.
  const int64_t rows = 9, in_features = 11, out_features = 4;
  Generator generator(17);
  Variable x(generator.randn({rows, in_features}), true);
  Variable weight(generator.randn({out_features, in_features}), true);
  Variable bias(generator.randn({out_features}), true);
  Variable prediction = nn::linear(x, weight, bias);
  Variable target = autograd::narrow(x, 1, 0, out_features);
  const MatrixD distance = (test::to_double(prediction.data()) - test::to_double(target.data()));
  REQUIRE(distance.cwiseAbs().minCoeff() > 1e-3);  // |d| is differentiable there
  nn::l1_loss(prediction, target, nn::Reduction::mean()).backward();

  const test::ScalarFunction f = [&](const std::vector<MatrixD>& in) {
    const MatrixD y = linear_reference(in[0], in[1], in[2]);
    return (y - in[0].leftCols(out_features)).cwiseAbs().sum() / static_cast<double>(y.size());
  };
  const std::vector<MatrixD> inputs{test::to_double(x.data()), test::to_double(weight.data()),
                                    test::to_double(bias.data())};
  CHECK(test::relative_error(test::to_double(x.grad()), test::numeric_gradient(f, inputs, 0)) <
        1e-4);
  CHECK(test::relative_error(test::to_double(weight.grad()),
                             test::numeric_gradient(f, inputs, 1)) < 1e-4);
  CHECK(test::relative_error(test::to_double(bias.grad()), test::numeric_gradient(f, inputs, 2)) <
        1e-4);
}

TEST_CASE("linear: a shard with no rows gives an empty output and zero gradients", "[nn]") {
  Generator generator(18);
  const Tensor x = generator.randn({0, 6});
  const Tensor weight = generator.randn({3, 6}), bias = generator.randn({3});
  CHECK(nn::linear_forward(x, weight, bias).shape() == Shape{0, 3});
  const nn::LinearGradients gradients =
      nn::linear_backward(Tensor::zeros({0, 3}), x, weight, true, true, true);
  CHECK(gradients.x.shape() == Shape{0, 6});
  CHECK(gradients.weight.to_vector() == std::vector<float>(18, 0.0f));
  CHECK(gradients.bias.to_vector() == std::vector<float>(3, 0.0f));
}

TEST_CASE("linear_backward computes only the gradients asked for", "[nn]") {
  Generator generator(19);
  const Tensor x = generator.randn({4, 5}), weight = generator.randn({2, 5});
  const nn::LinearGradients only_weight =
      nn::linear_backward(generator.randn({4, 2}), x, weight, false, true, false);
  CHECK_FALSE(only_weight.x.defined());
  CHECK(only_weight.weight.shape() == Shape{2, 5});
  CHECK_FALSE(only_weight.bias.defined());
}

// ---------------------------------------------------------------- the module

namespace {
struct TinyModel : nn::Module {
  explicit TinyModel(Generator& generator)
      : linear(std::make_shared<nn::Linear>(640, 16, generator)) {
    register_module("linear", linear);
  }
  std::shared_ptr<nn::Linear> linear;
};
}  // namespace

TEST_CASE("Linear is initialized like torch.nn.Linear from the generator", "[nn]") {
  Generator generator(12345), replay(12345);
  nn::Linear layer(640, 16, generator);
  const float bound = static_cast<float>(1.0 / std::sqrt(640.0));
  // Weight first, then bias, each uniform in ±1/sqrt(in_features).
  CHECK(test::bitwise_equal(layer.weight().data(), replay.uniform({16, 640}, -bound, bound)));
  CHECK(test::bitwise_equal(layer.bias().data(), replay.uniform({16}, -bound, bound)));
  CHECK(generator.offset() == replay.offset());
  for (float value : layer.weight().data().to_vector()) CHECK(std::fabs(value) <= bound);
  CHECK(layer.weight().requires_grad());
  CHECK(layer.weight().is_leaf());
  CHECK(layer.in_features() == 640);
  CHECK(layer.out_features() == 16);
}

TEST_CASE("Module names parameters with dotted paths and zeroes their gradients", "[nn]") {
  Generator generator(5);
  TinyModel model(generator);
  const auto named = model.named_parameters();
  REQUIRE(named.size() == 2);
  CHECK(named[0].first == "linear.weight");
  CHECK(named[1].first == "linear.bias");
  CHECK(named[0].second.shape() == Shape{16, 640});
  CHECK(model.parameters().size() == 2);
  CHECK(model.linear->named_parameters()[0].first == "weight");

  Variable x(generator.randn({3, 640}));
  nn::l1_loss(model.linear->forward(x), autograd::narrow(x, 1, 0, 16)).backward();
  CHECK(model.parameters()[0].grad().defined());
  model.zero_grad();
  for (const Variable& p : model.parameters()) {
    CHECK(p.grad().to_vector() == std::vector<float>(p.data().numel(), 0.0f));
  }
}

TEST_CASE("linear rejects bad arguments with messages that name them", "[nn][errors]") {
  Generator generator(6);
  const Tensor x = generator.randn({4, 5}), weight = generator.randn({3, 6});
  const Tensor bias = generator.randn({3});
  CHECK_THROWS_AS(nn::linear_forward(x, weight, bias), Error);
  CHECK_THROWS_WITH(nn::linear_forward(x, weight, bias),
                    Catch::Contains("x of shape [4, 5] has 5 features but weight of shape [3, 6] "
                                    "expects 6"));
  CHECK_THROWS_WITH(nn::linear_forward(x, generator.randn({3, 5}), generator.randn({4})),
                    Catch::Contains("bias must be [3]") && Catch::Contains("got shape [4]"));
  CHECK_THROWS_WITH(nn::linear_forward(generator.randn({5}), weight, bias),
                    Catch::Contains("x must be [n, in_features], got shape [5]"));
  CHECK_THROWS_WITH(nn::linear_backward(generator.randn({4, 2}), x, generator.randn({3, 5}), true,
                                        true, true),
                    Catch::Contains("grad_y has shape [4, 2] but the output has shape [4, 3]"));
  CHECK_THROWS_WITH(nn::Linear(0, 4, generator), Catch::Contains("in_features must be positive"));
  CHECK_THROWS_WITH(nn::Linear(4, -1, generator), Catch::Contains("out_features must be positive"));
  CHECK_THROWS_WITH(nn::linear(Variable(x), Variable(), Variable(bias)),
                    Catch::Contains("must all be defined"));
}

TEST_CASE("tensors on the wrong device are errors that name the devices", "[nn][errors]") {
  Generator generator(7);
  if (cuda_device_count() == 0) {
    // Without a GPU no tensor can live on one: asking for it is the error.
    CHECK_THROWS_WITH(nn::Linear(8, 2, generator, Device::cuda(0)), Catch::Contains("cuda:0"));
    return;
  }
  const Tensor x = generator.randn({4, 8}), weight = generator.randn({2, 8}, Device::cuda(0));
  const Tensor bias = generator.randn({2}, Device::cuda(0));
  CHECK_THROWS_WITH(nn::linear_forward(x, weight, bias),
                    Catch::Contains("x is on cpu but weight is on cuda:0"));
  CHECK_THROWS_WITH(nn::l1_loss_forward(x, x.to(Device::cuda(0)), nn::Reduction::mean()),
                    Catch::Contains("input is on cpu but target is on cuda:0"));
}
