// The 128 x 128 GEMM (nn/linear_large.cu) serving all three products of a Linear: the
// forward y = x Wᵀ + b (both operands along K), dx = dy W (W read down its columns)
// and dW = dyᵀ x (both read down their columns), with one K range and with K split,
// against the CPU path, run to run, and against the 64 x 64 kernel. Every shape has
// partial tiles at both edges of C; each case asserts that it reaches the large kernel
// with the split it is meant to test, so a dispatch that silently falls back fails.
#include <catch2/catch.hpp>

#include <functional>
#include <vector>

#include "core/generator.h"
#include "nn/linear.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/test_util.h"

using namespace seqpar;
using test::relative_error;

namespace {

// fp32 sums of up to ~33000 products in another order than Eigen's (see linear_test.cpp).
constexpr double kTolerance = 1e-5;

struct LargeCase {
  int64_t rows, in, out;
  // The K splits each product gets (linear.cu's choose_gemm): y, dx, dW.
  int64_t output_splits, grad_input_splits, grad_weight_splits;
};

#ifdef SEQPAR_WITH_CUDA
using nn::detail::LinearKernel;
using nn::detail::LinearProduct;
using Launch = std::function<void(const Tensor& result, LinearKernel kernel)>;

// One product: `launch` writes it into a poisoned `shape` with the given kernel. It must
// reach the large kernel with `splits` splits, match the CPU, give the same bits again
// (the pool poisoned in between, so split scratch starts as NaN), and agree with the
// 64 x 64 kernel to rounding.
void check_product(LinearProduct product, const Tensor& left, const Tensor& right,
                   const Shape& shape, const Launch& launch, const Tensor& expected,
                   int64_t splits) {
  const Device gpu = Device::cuda();
  const Tensor large = test::poisoned(shape, gpu);
  const nn::detail::GemmChoice choice = nn::detail::linear_gemm_choice(product, left, right, large);
  CHECK(choice.large);
  CHECK(choice.splits == splits);
  test::poison_pool(gpu);
  launch(large, LinearKernel::Auto);
  CHECK(relative_error(large, expected) < kTolerance);

  const Tensor again = test::poisoned(shape, gpu);
  test::poison_pool(gpu);
  launch(again, LinearKernel::Auto);
  CHECK(test::bitwise_equal(again, large));

  const Tensor tiled = test::poisoned(shape, gpu);
  CHECK_FALSE(nn::detail::linear_gemm_choice(product, left, right, tiled, LinearKernel::Tiled64).large);
  test::poison_pool(gpu);
  launch(tiled, LinearKernel::Tiled64);
  CHECK(relative_error(tiled, expected) < kTolerance);
  CHECK(relative_error(tiled, large) < kTolerance);
}

void check_large_case(const LargeCase& c) {
  INFO("rows " << c.rows << ", in " << c.in << ", out " << c.out);
  const Device gpu = Device::cuda();
  Generator generator(c.rows * 101 + c.in * 11 + c.out);
  const Tensor x = generator.randn({c.rows, c.in}), weight = generator.randn({c.out, c.in});
  const Tensor bias = generator.randn({c.out}), grad_y = generator.randn({c.rows, c.out});
  const Tensor y_expected = nn::linear_forward(x, weight, bias);
  const nn::LinearGradients expected = nn::linear_backward(grad_y, x, weight, true, true, false);

  const Tensor x_gpu = x.to(gpu), weight_gpu = weight.to(gpu), bias_gpu = bias.to(gpu);
  const Tensor grad_y_gpu = grad_y.to(gpu);
  {
    INFO("y = x Wᵀ + b");
    check_product(LinearProduct::Output, x_gpu, weight_gpu, {c.rows, c.out},
                  [&](const Tensor& y, LinearKernel kernel) {
                    nn::detail::linear_forward_cuda(x_gpu, weight_gpu, bias_gpu, y, kernel);
                  }, y_expected, c.output_splits);
  }
  {
    INFO("dx = dy W");
    check_product(LinearProduct::GradInput, grad_y_gpu, weight_gpu, {c.rows, c.in},
                  [&](const Tensor& grad_x, LinearKernel kernel) {
                    nn::detail::linear_backward_cuda(grad_y_gpu, x_gpu, weight_gpu, grad_x,
                                                     Tensor(), Tensor(), kernel);
                  }, expected.x, c.grad_input_splits);
  }
  {
    INFO("dW = dyᵀ x");
    check_product(LinearProduct::GradWeight, grad_y_gpu, x_gpu, {c.out, c.in},
                  [&](const Tensor& grad_weight, LinearKernel kernel) {
                    nn::detail::linear_backward_cuda(grad_y_gpu, x_gpu, weight_gpu, Tensor(),
                                                     grad_weight, Tensor(), kernel);
                  }, expected.weight, c.grad_weight_splits);
  }
  // Through the public API too (its dispatch, its output allocation).
  test::poison_pool(gpu);
  CHECK(relative_error(nn::linear_forward(x_gpu, weight_gpu, bias_gpu), y_expected) < kTolerance);
  const nn::LinearGradients api = nn::linear_backward(grad_y_gpu, x_gpu, weight_gpu, true, true, false);
  CHECK(relative_error(api.x, expected.x) < kTolerance);
  CHECK(relative_error(api.weight, expected.weight) < kTolerance);
}
#endif

}  // namespace

TEST_CASE("the 128 x 128 GEMM serves y, dx and dW, with and without split K", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
#ifdef SEQPAR_WITH_CUDA
  const std::vector<LargeCase> cases = {
      // dW over 11301 rows into 3 x 4 tiles: 11 splits of 1032 rows, the last 981 (a
      // partial slice); y and dx have enough tiles alone.
      {11301, 388, 260, 1, 1, 11},
      // y with K = in = 32772 into 2 x 2 tiles: 32 splits, the last 780 k long.
      {132, 32772, 132, 32, 1, 1},
      // dx with K = out = 32772 into 2 x 2 tiles: 32 splits.
      {132, 132, 32772, 1, 32, 1},
  };
  for (const LargeCase& c : cases) check_large_case(c);
#endif
}

TEST_CASE("the 128 x 128 GEMM steps aside for operands it cannot load", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
#ifdef SEQPAR_WITH_CUDA
  // x as a window of a wider buffer: row stride in + 4 and 16-byte aligned keeps the
  // large kernel; row stride in + 3, one float in, sends y and dW to the 64 x 64 one.
  const Device gpu = Device::cuda();
  const int64_t rows = 11301, in = 388, out = 260;
  Generator generator(5);
  const Tensor x = generator.randn({rows, in}), weight = generator.randn({out, in});
  const Tensor bias = generator.randn({out}), grad_y = generator.randn({rows, out});
  const Tensor y_expected = nn::linear_forward(x, weight, bias);
  const nn::LinearGradients expected = nn::linear_backward(grad_y, x, weight, false, true, false);
  const Tensor weight_gpu = weight.to(gpu), bias_gpu = bias.to(gpu), grad_y_gpu = grad_y.to(gpu);
  for (const int64_t pad : {int64_t{4}, int64_t{3}}) {
    INFO("x row stride in + " << pad);
    Tensor wide = Tensor::zeros({rows + 1, in + pad}, gpu);
    Tensor x_window = wide.narrow(0, 1, rows).narrow(1, pad == 4 ? 4 : 1, in);
    x_window.copy_(x);
    const Tensor y = test::poisoned({rows, out}, gpu), grad_weight = test::poisoned({out, in}, gpu);
    const bool aligned = pad == 4;
    CHECK(nn::detail::linear_gemm_choice(LinearProduct::Output, x_window, weight_gpu, y).large == aligned);
    CHECK(nn::detail::linear_gemm_choice(LinearProduct::GradWeight, grad_y_gpu, x_window,
                                         grad_weight).large == aligned);
    nn::detail::linear_forward_cuda(x_window, weight_gpu, bias_gpu, y);
    CHECK(relative_error(y, y_expected) < kTolerance);
    nn::detail::linear_backward_cuda(grad_y_gpu, x_window, weight_gpu, Tensor(), grad_weight, Tensor());
    CHECK(relative_error(grad_weight, expected.weight) < kTolerance);
  }
#endif
}
