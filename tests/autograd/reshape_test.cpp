// reshape: values in row-major order under the new shape, a view when it can be one,
// and the gradient carried back element for element into the input's shape.
#include <catch2/catch.hpp>

#include "autograd/ops.h"
#include "autograd/reshape.h"
#include "core/generator.h"

using namespace seqpar;
using autograd::Variable;
using Catch::Matchers::Contains;

TEST_CASE("reshape of a contiguous input is a view with the same values", "[autograd][cpu]") {
  Generator generator(11);
  const Variable x(generator.randn({4, 6}));
  const Variable y = autograd::reshape(x, {4, 2, 3});
  CHECK(y.shape() == Shape{4, 2, 3});
  CHECK(y.data().storage() == x.data().storage());
  CHECK(y.data().to_vector() == x.data().to_vector());
  CHECK(y.data().at({3, 1, 2}) == x.data().at({3, 5}));
}

// A window of columns (not contiguous) is copied; its gradient lands in the window
// of the wider leaf, zeros elsewhere.
TEST_CASE("reshape of a strided window copies and carries the gradient back", "[autograd][cpu]") {
  Generator generator(12);
  const Variable wide(generator.randn({4, 6}), /*requires_grad=*/true);
  const Variable window = autograd::narrow(wide, 1, 1, 3);
  const Variable y = autograd::reshape(window, {2, 6});
  CHECK(y.data().to_vector() == window.data().contiguous().to_vector());
  const Tensor weights = generator.randn({2, 6});
  y.backward(weights);
  const std::vector<float> w = weights.to_vector();
  for (int64_t row = 0; row < 4; ++row) {
    for (int64_t column = 0; column < 6; ++column) {
      const bool inside = column >= 1 && column < 4;
      const float expected = inside ? w[static_cast<size_t>(row * 3 + column - 1)] : 0.0f;
      CHECK(wide.grad().at({row, column}) == expected);
    }
  }
}

TEST_CASE("reshape refuses a shape with another element count", "[autograd][cpu]") {
  const Variable x(Tensor::zeros({4, 6}));
  REQUIRE_THROWS_WITH(autograd::reshape(x, {5, 5}),
                      Contains("cannot view [4, 6] (24 elements) as [5, 5] (25 elements)"));
}
