// Gradients of the elementwise ops and narrow against float64 finite differences.
#include <catch2/catch.hpp>

#include "autograd/ops.h"
#include "autograd/variable.h"
#include "core/generator.h"
#include "tests/gradcheck.h"

using namespace seqpar;
using autograd::Variable;
using test::MatrixD;

namespace {

struct Case {
  int64_t rows, columns;
  uint64_t seed;
};
// One row, one column, odd sizes: shapes where an indexing slip shows.
const std::vector<Case> kCases = {{1, 1, 101}, {1, 17, 102}, {7, 5, 103}, {33, 13, 104}};

using BinaryOp = std::function<Variable(const Variable&, const Variable&)>;
using BinaryReference = std::function<MatrixD(const MatrixD&, const MatrixD&)>;

// Checks d/da and (when the op reads it) d/db of op(a, b), where a is either a leaf
// or a window of columns of a wider leaf (a strided view, as the app's x[:, :16]).
void check_binary_op(const BinaryOp& op, const BinaryReference& reference, bool reads_b) {
  for (const Case& c : kCases) {
    for (const bool strided : {false, true}) {
      CAPTURE(c.rows, c.columns, strided);
      Generator generator(c.seed + (strided ? 1000 : 0));
      const int64_t first_column = strided ? 2 : 0, width = c.columns + (strided ? 5 : 0);
      Variable wide(generator.randn({c.rows, width}), /*requires_grad=*/true);
      Variable a = strided ? autograd::narrow(wide, 1, first_column, c.columns) : wide;
      Variable b(generator.randn({c.rows, c.columns}), /*requires_grad=*/true);
      const Tensor weights = generator.randn({c.rows, c.columns});
      op(a, b).backward(weights);

      const MatrixD weights_d = test::to_double(weights);
      const test::ScalarFunction f = [&](const std::vector<MatrixD>& in) {
        return test::weighted_sum(weights_d,
                                  reference(in[0].middleCols(first_column, c.columns), in[1]));
      };
      const std::vector<MatrixD> inputs{test::to_double(wide.data()), test::to_double(b.data())};
      CHECK(test::relative_error(test::to_double(wide.grad()),
                                 test::numeric_gradient(f, inputs, 0)) < 1e-4);
      if (reads_b) {
        CHECK(test::relative_error(test::to_double(b.grad()), test::numeric_gradient(f, inputs, 1)) <
              1e-4);
      } else {
        CHECK_FALSE(b.grad().defined());
      }
    }
  }
}

}  // namespace

TEST_CASE("add: gradients match finite differences", "[autograd]") {
  check_binary_op([](const Variable& a, const Variable& b) { return autograd::add(a, b); },
                  [](const MatrixD& a, const MatrixD& b) -> MatrixD { return a + b; }, true);
}

TEST_CASE("sub: gradients match finite differences", "[autograd]") {
  check_binary_op([](const Variable& a, const Variable& b) { return autograd::sub(a, b); },
                  [](const MatrixD& a, const MatrixD& b) -> MatrixD { return a - b; }, true);
}

TEST_CASE("mul by a scalar: gradient matches finite differences", "[autograd]") {
  const float scalar = -0.37f;
  check_binary_op([&](const Variable& a, const Variable&) { return autograd::mul(a, scalar); },
                  [&](const MatrixD& a, const MatrixD&) -> MatrixD {
                    return a * static_cast<double>(scalar);
                  },
                  false);
}

TEST_CASE("narrow: the gradient fills the window, zeros elsewhere", "[autograd]") {
  struct Window {
    int64_t dim, start, length;
  };
  for (const Case& c : kCases) {
    const int64_t rows = c.rows + 2, columns = c.columns + 3;  // room for a window
    for (const Window w : {Window{0, 1, c.rows}, Window{1, 2, c.columns}, Window{-1, 0, 1}}) {
      CAPTURE(c.rows, c.columns, w.dim, w.start, w.length);
      Generator generator(c.seed + 7 * static_cast<uint64_t>(w.dim + 2));
      Variable x(generator.randn({rows, columns}), /*requires_grad=*/true);
      Variable window = autograd::narrow(x, w.dim, w.start, w.length);
      CHECK(window.data().storage() == x.data().storage());  // a view, no copy
      const Tensor weights = generator.randn(window.shape());
      autograd::mul(window, 1.5f).backward(weights);

      const MatrixD weights_d = test::to_double(weights);
      const bool by_rows = w.dim == 0;
      const test::ScalarFunction f = [&](const std::vector<MatrixD>& in) {
        const MatrixD block = by_rows ? MatrixD(in[0].middleRows(w.start, w.length))
                                      : MatrixD(in[0].middleCols(w.start, w.length));
        return test::weighted_sum(weights_d, 1.5 * block);
      };
      const MatrixD numeric = test::numeric_gradient(f, {test::to_double(x.data())}, 0);
      CHECK(test::relative_error(test::to_double(x.grad()), numeric) < 1e-4);
    }
  }
}

TEST_CASE("narrow of a narrow sends the gradient to the right place", "[autograd]") {
  Generator generator(211);
  Variable x(generator.randn({6, 9}), /*requires_grad=*/true);
  Variable inner = autograd::narrow(autograd::narrow(x, 1, 3, 5), 0, 2, 3);  // x[2:5, 3:8]
  inner.backward(Tensor::ones({3, 5}));
  for (int64_t i = 0; i < 6; ++i) {
    for (int64_t j = 0; j < 9; ++j) {
      const bool inside = i >= 2 && i < 5 && j >= 3 && j < 8;
      CHECK(x.grad().at({i, j}) == (inside ? 1.0f : 0.0f));
    }
  }
}
