// nn/linear.cu against the CPU path (Eigen): y = x Wᵀ + b, dx, dW, db.
#include <catch2/catch.hpp>

#include <tuple>

#include "core/generator.h"
#include "nn/linear.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/test_util.h"

using namespace seqpar;
using test::relative_error;

namespace {

// fp32 GEMMs summing up to 12000 products in a different order than Eigen: rounding
// grows with the length of the sums (about 1e-6 normwise at K = 12000); a wrong
// element gives O(1). db is summed in double on both sides.
constexpr double kTolerance = 1e-5;

struct LinearCase {
  int64_t rows, in, out;
};

// x as a window [rows, in] of a wider, offset buffer: row stride in + 5, first element
// 3 floats in (not 16-byte aligned), as a rank's column slice of a larger batch.
Tensor strided_rows(const Tensor& values, Device device) {
  const int64_t rows = values.size(0), in = values.size(1);
  Tensor wide = Tensor::zeros({rows + 1, in + 5}, device);
  Tensor window = wide.narrow(0, 1, rows).narrow(1, 3, in);
  window.copy_(values);
  return window;
}

void check_linear_case(const LinearCase& shape, bool strided_x) {
  INFO("rows " << shape.rows << ", in " << shape.in << ", out " << shape.out
               << (strided_x ? ", strided x" : ""));
  const Device gpu = Device::cuda();
  Generator generator(shape.rows * 7919 + shape.in * 31 + shape.out);
  const Tensor x = generator.randn({shape.rows, shape.in});
  const Tensor weight = generator.randn({shape.out, shape.in});
  const Tensor bias = generator.randn({shape.out});
  const Tensor grad_y = generator.randn({shape.rows, shape.out});

  const Tensor y_expected = nn::linear_forward(x, weight, bias);
  const nn::LinearGradients expected = nn::linear_backward(grad_y, x, weight, true, true, true);

  const Tensor x_gpu = strided_x ? strided_rows(x, gpu) : x.to(gpu);
  const Tensor weight_gpu = weight.to(gpu), bias_gpu = bias.to(gpu), grad_y_gpu = grad_y.to(gpu);
#ifdef SEQPAR_WITH_CUDA
  const Tensor y = test::poisoned({shape.rows, shape.out}, gpu);
  nn::detail::linear_forward_cuda(x_gpu, weight_gpu, bias_gpu, y);
  CHECK(relative_error(y, y_expected) < kTolerance);

  const Tensor grad_x = test::poisoned({shape.rows, shape.in}, gpu);
  const Tensor grad_weight = test::poisoned({shape.out, shape.in}, gpu);
  const Tensor grad_bias = test::poisoned({shape.out}, gpu);
  nn::detail::linear_backward_cuda(grad_y_gpu, x_gpu, weight_gpu, grad_x, grad_weight, grad_bias);
  CHECK(relative_error(grad_x, expected.x) < kTolerance);
  CHECK(relative_error(grad_weight, expected.weight) < kTolerance);
  CHECK(relative_error(grad_bias, expected.bias) < kTolerance);

  // Each gradient alone (undefined outputs are skipped, the others still written).
  const Tensor grad_weight_only = test::poisoned({shape.out, shape.in}, gpu);
  nn::detail::linear_backward_cuda(grad_y_gpu, x_gpu, weight_gpu, Tensor(), grad_weight_only,
                                   Tensor());
  CHECK(test::bitwise_equal(grad_weight_only, grad_weight));
#endif
  // Through the public API too (its dispatch, its output allocation).
  test::poison_pool(gpu);
  CHECK(relative_error(nn::linear_forward(x_gpu, weight_gpu, bias_gpu), y_expected) < kTolerance);
  const nn::LinearGradients api = nn::linear_backward(grad_y_gpu, x_gpu, weight_gpu, true, true, true);
  CHECK(relative_error(api.x, expected.x) < kTolerance);
  CHECK(relative_error(api.weight, expected.weight) < kTolerance);
  CHECK(relative_error(api.bias, expected.bias) < kTolerance);
}

}  // namespace

TEST_CASE("linear forward and backward on the GPU match the CPU", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  const std::vector<LinearCase> cases = {
      {1, 640, 16},    {17, 1, 16},    {17, 16, 1},   {333, 1000, 1},
      {333, 17, 640},  {640, 640, 16}, {640, 16, 640}, {333, 640, 1000},
      {12000, 640, 16},  // the seed: dW reduces over 12000 rows (split-K)
      {3000, 640, 16},   // the seed's shard at sp 4
      {70, 2100, 16},    // a wide input: more 64-column steps than the forward's ring holds
  };
  for (const LinearCase& shape : cases) check_linear_case(shape, false);
  for (const LinearCase& shape : {LinearCase{17, 16, 16}, LinearCase{3000, 640, 16},
                                  LinearCase{1, 640, 16}}) {
    check_linear_case(shape, true);
  }
}

TEST_CASE("linear on the GPU is bitwise reproducible", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  const Device gpu = Device::cuda();
  Generator generator(3);
  const Tensor x = generator.randn({12000, 640}, gpu), weight = generator.randn({16, 640}, gpu);
  const Tensor bias = generator.randn({16}, gpu), grad_y = generator.randn({12000, 16}, gpu);
  auto run = [&] {
    const Tensor y = nn::linear_forward(x, weight, bias);
    nn::LinearGradients gradients = nn::linear_backward(grad_y, x, weight, true, true, true);
    return std::make_tuple(y, gradients.x, gradients.weight, gradients.bias);
  };
  const auto first = run();
  test::poison_pool(gpu);
  const auto second = run();
  CHECK(test::bitwise_equal(std::get<0>(first), std::get<0>(second)));
  CHECK(test::bitwise_equal(std::get<1>(first), std::get<1>(second)));
  CHECK(test::bitwise_equal(std::get<2>(first), std::get<2>(second)));
  CHECK(test::bitwise_equal(std::get<3>(first), std::get<3>(second)));
}
