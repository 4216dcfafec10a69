// The skinny Linear kernels (train/kernels/skinny_weight_grad.cu, out_features <= 64) against the CPU
// path, at shapes that exercise their edges: output groups of 16 with a partial last
// group, rows not a multiple of a warp's 8, columns not a multiple of 4 (the scalar
// loads), x a strided and misaligned window, several chunks of rows. And the general
// kernel still serves out_features = 65.
#include <catch2/catch.hpp>

#include "core/generator.h"
#include "nn/linear.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/test_util.h"

using namespace seqpar;
using test::relative_error;

namespace {

constexpr double kTolerance = 1e-5;

struct Shape3 {
  int64_t rows, in, out;
};

// A [rows, in] window of a wider buffer: row stride in + 3, first element 1 float in.
Tensor window_of(const Tensor& values, Device device) {
  Tensor wide = Tensor::zeros({values.size(0) + 1, values.size(1) + 3}, device);
  Tensor window = wide.narrow(0, 1, values.size(0)).narrow(1, 1, values.size(1));
  window.copy_(values);
  return window;
}

void check_against_cpu(const Shape3& s, bool strided) {
  INFO("rows " << s.rows << ", in " << s.in << ", out " << s.out << (strided ? ", strided" : ""));
  const Device gpu = Device::cuda();
  Generator generator(s.rows * 131 + s.in * 7 + s.out);
  const Tensor x = generator.randn({s.rows, s.in}), weight = generator.randn({s.out, s.in});
  const Tensor bias = generator.randn({s.out}), grad_y = generator.randn({s.rows, s.out});
  const Tensor y_cpu = nn::linear_forward(x, weight, bias);
  const nn::LinearGradients cpu = nn::linear_backward(grad_y, x, weight, false, true, true);

  const Tensor x_gpu = strided ? window_of(x, gpu) : x.to(gpu);
  const Tensor weight_gpu = weight.to(gpu), bias_gpu = bias.to(gpu), grad_y_gpu = grad_y.to(gpu);
  test::poison_pool(gpu);
  CHECK(relative_error(nn::linear_forward(x_gpu, weight_gpu, bias_gpu), y_cpu) < kTolerance);
  test::poison_pool(gpu);
  const nn::LinearGradients api = nn::linear_backward(grad_y_gpu, x_gpu, weight_gpu, false, true, true);
  CHECK(relative_error(api.weight, cpu.weight) < kTolerance);
  CHECK(relative_error(api.bias, cpu.bias) < kTolerance);
#ifdef SEQPAR_WITH_CUDA
  // The general kernels on the same inputs agree to rounding (another summation order).
  const Tensor y_general = test::poisoned({s.rows, s.out}, gpu);
  nn::detail::linear_forward_cuda(x_gpu, weight_gpu, bias_gpu, y_general,
                                  nn::detail::LinearKernel::General);
  CHECK(relative_error(y_general, y_cpu) < kTolerance);
  const Tensor dw_general = test::poisoned({s.out, s.in}, gpu);
  nn::detail::linear_backward_cuda(grad_y_gpu, x_gpu, weight_gpu, Tensor(), dw_general, Tensor(),
                                   nn::detail::LinearKernel::General);
  CHECK(relative_error(dw_general, cpu.weight) < kTolerance);
#endif
}

}  // namespace

TEST_CASE("skinny linear kernels match the CPU at odd shapes", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  const std::vector<Shape3> shapes = {
      {1001, 37, 33},   // partial output group, scalar loads (in % 4 != 0)
      {257, 640, 64},   // four full output groups
      {100, 1024, 65},  // just past the skinny limit: the general GEMM
      {5000, 128, 3},   // many row chunks, few outputs
      {9, 4, 16},       // one column step, a partial warp tile
      {7, 300, 1},      // fewer rows than a warp tile
      {40000, 20, 16},  // rows_per_chunk > 256: dy staged in several rounds
  };
  for (const Shape3& s : shapes) check_against_cpu(s, false);
  for (const Shape3& s : {Shape3{1001, 36, 17}, Shape3{3000, 640, 16}}) check_against_cpu(s, true);
}

TEST_CASE("skinny linear kernels are bitwise reproducible", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  const Device gpu = Device::cuda();
  Generator generator(11);
  const Tensor x = generator.randn({12000, 640}, gpu), weight = generator.randn({16, 640}, gpu);
  const Tensor bias = generator.randn({16}, gpu), grad_y = generator.randn({12000, 16}, gpu);
  const Tensor y1 = nn::linear_forward(x, weight, bias);
  const nn::LinearGradients g1 = nn::linear_backward(grad_y, x, weight, false, true, true);
  test::poison_pool(gpu);
  const Tensor y2 = nn::linear_forward(x, weight, bias);
  const nn::LinearGradients g2 = nn::linear_backward(grad_y, x, weight, false, true, true);
  CHECK(test::bitwise_equal(y1, y2));
  CHECK(test::bitwise_equal(g1.weight, g2.weight));
  CHECK(test::bitwise_equal(g1.bias, g2.bias));
}

TEST_CASE("the 128 x 128 forward GEMM matches the CPU and the 64 x 64 kernel", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  const Device gpu = Device::cuda();
  // Enough 128 x 128 tiles for the large kernel; partial tiles at both edges.
  for (const Shape3& s : {Shape3{2000, 68, 2100}, Shape3{1024, 256, 2048}, Shape3{1100, 4, 1800}}) {
    INFO("rows " << s.rows << ", in " << s.in << ", out " << s.out);
    Generator generator(s.rows + s.in + s.out);
    const Tensor x = generator.randn({s.rows, s.in}), weight = generator.randn({s.out, s.in});
    const Tensor bias = generator.randn({s.out});
    const Tensor expected = nn::linear_forward(x, weight, bias);
    const Tensor x_gpu = x.to(gpu), weight_gpu = weight.to(gpu), bias_gpu = bias.to(gpu);
    test::poison_pool(gpu);
    const Tensor y = nn::linear_forward(x_gpu, weight_gpu, bias_gpu);
    CHECK(relative_error(y, expected) < kTolerance);
    test::poison_pool(gpu);
    CHECK(test::bitwise_equal(nn::linear_forward(x_gpu, weight_gpu, bias_gpu), y));
#ifdef SEQPAR_WITH_CUDA
    const Tensor tiled = test::poisoned({s.rows, s.out}, gpu);
    const nn::detail::GemmChoice choice = nn::detail::linear_gemm_choice(
        nn::detail::LinearProduct::Output, x_gpu, weight_gpu, tiled);
    CHECK((choice.large && choice.splits == 1));  // enough tiles alone: the kernel as before
    nn::detail::linear_forward_cuda(x_gpu, weight_gpu, bias_gpu, tiled, nn::detail::LinearKernel::Tiled64);
    CHECK(relative_error(tiled, expected) < kTolerance);
#endif
  }
}
