// The 128 x 128 GEMM (nn/linear_large.cu) serving all three products of a Linear: the
// forward y = x Wᵀ + b (both operands along K), dx = dy W (W read down its columns)
// and dW = dyᵀ x (both read down their columns), with one K range and with K split,
// against the CPU path, run to run, and against the 64 x 64 kernel; and its two slice
// depths against each other. Every shape has partial tiles at both edges of C; each
// case asserts that it reaches the large kernel with the split it is meant to test, so
// a dispatch that silently falls back fails.
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

// One product through both slice depths (LinearKernel::Slice8, Slice16): each reaches
// the large kernel with `splits` splits of whole slices of its depth. 16 deep must match
// the CPU and give the same bits again; with one split each element is the same fma
// chain in the same k order as 8 deep (the zeros past K add nothing), so the same bits
// as 8 deep. The depth that Auto uses (nn/linear_large.h's kLargeSlice) gives Auto's bits.
void check_slice_depths(LinearProduct product, const Tensor& left, const Tensor& right,
                        const Shape& shape, const Launch& launch, const Tensor& expected,
                        int64_t splits) {
  const Device gpu = Device::cuda();
  Tensor results[2];  // 8 deep, 16 deep
  for (const LinearKernel kernel : {LinearKernel::Slice8, LinearKernel::Slice16}) {
    const int64_t depth = kernel == LinearKernel::Slice8 ? 8 : 16;
    INFO("slices of " << depth);
    Tensor& result = results[depth == 8 ? 0 : 1];
    result = test::poisoned(shape, gpu);
    const nn::detail::GemmChoice choice =
        nn::detail::linear_gemm_choice(product, left, right, result, kernel);
    CHECK(choice.large);
    CHECK(choice.slice == depth);
    CHECK(choice.splits == splits);
    CHECK(choice.k_per_split % depth == 0);
    test::poison_pool(gpu);
    launch(result, kernel);
    CHECK(relative_error(result, expected) < kTolerance);

    const Tensor again = test::poisoned(shape, gpu);
    test::poison_pool(gpu);
    launch(again, kernel);
    CHECK(test::bitwise_equal(again, result));
  }
  if (splits == 1) CHECK(test::bitwise_equal(results[1], results[0]));

  const Tensor automatic = test::poisoned(shape, gpu);
  const int64_t auto_depth = nn::detail::linear_gemm_choice(product, left, right, automatic).slice;
  REQUIRE((auto_depth == 8 || auto_depth == 16));
  test::poison_pool(gpu);
  launch(automatic, LinearKernel::Auto);
  CHECK(test::bitwise_equal(automatic, results[auto_depth == 8 ? 0 : 1]));
}

using CheckProduct = void (*)(LinearProduct, const Tensor&, const Tensor&, const Shape&,
                              const Launch&, const Tensor&, int64_t);

// The three products of case `c`, each through `check` (with its launch, the CPU's
// result and the split it is meant to reach), then, if `public_api`, through the
// public API (its dispatch, its output allocation).
void check_large_products(const LargeCase& c, CheckProduct check, bool public_api) {
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
    check(LinearProduct::Output, x_gpu, weight_gpu, {c.rows, c.out},
          [&](const Tensor& y, LinearKernel kernel) {
            nn::detail::linear_forward_cuda(x_gpu, weight_gpu, bias_gpu, y, kernel);
          }, y_expected, c.output_splits);
  }
  {
    INFO("dx = dy W");
    check(LinearProduct::GradInput, grad_y_gpu, weight_gpu, {c.rows, c.in},
          [&](const Tensor& grad_x, LinearKernel kernel) {
            nn::detail::linear_backward_cuda(grad_y_gpu, x_gpu, weight_gpu, grad_x, Tensor(),
                                             Tensor(), kernel);
          }, expected.x, c.grad_input_splits);
  }
  {
    INFO("dW = dyᵀ x");
    check(LinearProduct::GradWeight, grad_y_gpu, x_gpu, {c.out, c.in},
          [&](const Tensor& grad_weight, LinearKernel kernel) {
            nn::detail::linear_backward_cuda(grad_y_gpu, x_gpu, weight_gpu, Tensor(),
                                             grad_weight, Tensor(), kernel);
          }, expected.weight, c.grad_weight_splits);
  }
  if (!public_api) return;
  test::poison_pool(gpu);
  CHECK(relative_error(nn::linear_forward(x_gpu, weight_gpu, bias_gpu), y_expected) < kTolerance);
  const nn::LinearGradients api = nn::linear_backward(grad_y_gpu, x_gpu, weight_gpu, true, true, false);
  CHECK(relative_error(api.x, expected.x) < kTolerance);
  CHECK(relative_error(api.weight, expected.weight) < kTolerance);
}

// The split counts are the same for both slice depths; the ranges are not (whole
// slices of 8 or of 16).
const std::vector<LargeCase> kLargeCases = {
    // dW over 11301 rows into 3 x 4 tiles: 11 splits of 1032 rows, the last 981 (a
    // partial slice), or of 1040, the last 901; y (K = 388) and dx (K = 260) have
    // enough tiles alone and end on a partial slice.
    {11301, 388, 260, 1, 1, 11},
    // y with K = in = 32772 into 2 x 2 tiles: 32 splits, the last 780 k long (532 with
    // 16-deep slices).
    {132, 32772, 132, 32, 1, 1},
    // dx with K = out = 32772 into 2 x 2 tiles: 32 splits.
    {132, 132, 32772, 1, 32, 1},
};
#endif

}  // namespace

TEST_CASE("the 128 x 128 GEMM serves y, dx and dW, with and without split K", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
#ifdef SEQPAR_WITH_CUDA
  for (const LargeCase& c : kLargeCases) {
    check_large_products(c, check_product, /*public_api=*/true);
  }
#endif
}

TEST_CASE("the 128 x 128 GEMM's 16-deep K slices give the 8-deep bits with one split",
          "[cuda][slice16]") {
  SEQPAR_REQUIRE_CUDA();
#ifdef SEQPAR_WITH_CUDA
  for (const LargeCase& c : kLargeCases) {
    check_large_products(c, check_slice_depths, /*public_api=*/false);
  }
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
