// Linear's forward and dx chains (nn/cpu/linear.h, docs/numerics.md): y and dx are,
// bit for bit, the scalar fma chains over the feature index from +0 written out in
// tests/nn/linear_exact_util.h, and a row gives the same bits in any batch or slice;
// [cuda]: the GPU gives the CPU's bits for y, dx, dW and db, strided x and the
// 128 x 128 GEMM included. Seeds as in linear_exact_test.cpp.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "tests/nn/linear_exact_util.h"

using namespace seqpar;
using namespace seqpar::test::linear_exact;

// ---------------------------------------------------------------- 4. the chains

TEST_CASE("linear: y and dx are the fma chains over the feature index from +0", "[exact][cpu]") {
  const uint64_t seed = case_seed(0xc4a1);
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  std::vector<Shape3> shapes = {{1, 1, 1}, {5, 200, 40}, {33, 17, 9}, {4, 16, 16}, {7, 1, 33}};
  while (shapes.size() < 14) {
    shapes.push_back({uniform(rng, 1, 200), uniform(rng, 1, 200), uniform(rng, 1, 40)});
  }
  for (const Shape3& shape : shapes) {
    const int spread = static_cast<int>(uniform(rng, 0, 20));
    INFO(describe(shape) << ", spread 2^+-" << spread);
    std::vector<float> xv = spread_values(rng, shape.rows * shape.in, spread);
    std::vector<float> dy = spread_values(rng, shape.rows * shape.out, spread);
    std::vector<float> w = spread_values(rng, shape.out * shape.in, 2);
    std::vector<float> b = spread_values(rng, shape.out, spread);
    // Chains of -0 products: row 0 of x and of dy zero, W's row 0 and column 0
    // negative, b[0] = -0. y[0, 0] and dx[0, 0] are +0 from a chain that starts at +0
    // (+0 + -0 = +0), -0 from one that starts at -0.
    if (shape.rows > 1) {
      std::fill(xv.begin(), xv.begin() + shape.in, 0.0f);
      std::fill(dy.begin(), dy.begin() + shape.out, 0.0f);
    }
    for (int64_t k = 0; k < shape.in; ++k) w[k] = -std::fabs(w[k]);
    for (int64_t j = 0; j < shape.out; ++j) w[j * shape.in] = -std::fabs(w[j * shape.in]);
    b[0] = -0.0f;
    // x as a column window of a wider matrix: a strided view, as a rank's x[:, a:b].
    const int64_t pad = uniform(rng, 0, 3);
    std::vector<float> wide_values;
    for (int64_t i = 0; i < shape.rows; ++i) {
      for (int64_t p = 0; p < pad; ++p) wide_values.push_back(99.0f);
      wide_values.insert(wide_values.end(), xv.begin() + i * shape.in, xv.begin() + (i + 1) * shape.in);
      wide_values.push_back(-99.0f);
    }
    const Tensor x = Tensor::from_data({shape.rows, shape.in}, xv);
    const Tensor x_view =
        Tensor::from_data({shape.rows, shape.in + pad + 1}, wide_values).narrow(1, pad, shape.in);
    const Tensor grad_y = Tensor::from_data({shape.rows, shape.out}, dy);
    const Tensor weight = Tensor::from_data({shape.out, shape.in}, w);
    const Tensor bias = Tensor::from_data({shape.out}, b);

    const Tensor y = nn::linear_forward(x, weight, bias);
    CHECK_SAME_BITS(y, chain_forward(x, weight, bias));
    CHECK_SAME_BITS(nn::linear_forward(x_view, weight, bias), y);
    const nn::LinearGradients g = nn::linear_backward(grad_y, x, weight, true, true, true);
    CHECK_SAME_BITS(g.x, chain_grad_x(grad_y, weight));
    const nn::LinearGradients g_view = nn::linear_backward(grad_y, x_view, weight, true, true, true);
    CHECK_SAME_BITS(g_view.x, g.x);
    CHECK_SAME_BITS(g_view.weight, g.weight);
    CHECK_SAME_BITS(g_view.bias, g.bias);
    if (shape.rows > 1) {  // the chains of -0 products
      const float y00 = y.at({0, 0}), dx00 = g.x.at({0, 0});
      CHECK((y00 == 0.0f && !std::signbit(y00)));
      CHECK((dx00 == 0.0f && !std::signbit(dx00)));
    }

    // Through autograd and the module's functional form: the same bits.
    autograd::Variable xv_var(x, true), w_var(weight, true), b_var(bias, true);
    autograd::Variable y_var = nn::linear(xv_var, w_var, b_var);
    y_var.backward(grad_y);
    CHECK_SAME_BITS(y_var.data(), y);
    CHECK_SAME_BITS(xv_var.grad(), g.x);
    CHECK_SAME_BITS(w_var.grad(), g.weight);
    CHECK_SAME_BITS(b_var.grad(), g.bias);

    // Row slices: the forward and dx of a slice are the slice of the full ones.
    for (int slice = 0; slice < 4; ++slice) {
      const int64_t start = uniform(rng, 0, shape.rows - 1);
      const int64_t length = uniform(rng, 0, shape.rows - start);
      INFO("rows " << start << " + " << length);
      CHECK_SAME_BITS(nn::linear_forward(x.narrow(0, start, length), weight, bias),
                      y.narrow(0, start, length).contiguous());
      CHECK_SAME_BITS(nn::linear_forward(x_view.narrow(0, start, length), weight, bias),
                      y.narrow(0, start, length).contiguous());
      CHECK_SAME_BITS(nn::linear_backward(grad_y.narrow(0, start, length),
                                          x.narrow(0, start, length), weight, true, false, false)
                          .x,
                      g.x.narrow(0, start, length).contiguous());
    }
  }
}

TEST_CASE("linear: a row gives the same bits in batches of any size and at any position",
          "[exact][cpu]") {
  const uint64_t seed = case_seed(0xb47c);
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  for (const Shape3& shape : {Shape3{1, 37, 11}, Shape3{1, 200, 40}, Shape3{1, 8, 16}}) {
    INFO("in " << shape.in << ", out " << shape.out);
    const Tensor weight = random_matrix(rng, shape.out, shape.in, 1);
    const Tensor bias = random_matrix(rng, 1, shape.out, 1).view({shape.out});
    const Tensor row = random_matrix(rng, 1, shape.in, 10);
    const Tensor dy_row = random_matrix(rng, 1, shape.out, 10);
    const Tensor y_alone = nn::linear_forward(row, weight, bias);
    const Tensor dx_alone = nn::linear_backward(dy_row, row, weight, true, false, false).x;
    CHECK_SAME_BITS(y_alone, chain_forward(row, weight, bias));
    for (const int64_t batch : {1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 33, 100}) {
      const int64_t position = uniform(rng, 0, batch - 1);
      INFO("batch " << batch << ", row at " << position);
      Tensor x = random_matrix(rng, batch, shape.in, 10);
      Tensor dy = random_matrix(rng, batch, shape.out, 10);
      x.narrow(0, position, 1).copy_(row);
      dy.narrow(0, position, 1).copy_(dy_row);
      CHECK_SAME_BITS(nn::linear_forward(x, weight, bias).narrow(0, position, 1).contiguous(), y_alone);
      CHECK_SAME_BITS(
          nn::linear_backward(dy, x, weight, true, false, false).x.narrow(0, position, 1).contiguous(),
          dx_alone);
    }
  }
}

// ---------------------------------------------------------------- 5. the GPU

namespace {

// The GPU's y, dx, dW and db against the CPU's, bitwise; x optionally a column window of a
// wider matrix (on each device).
void check_gpu_matches_cpu(std::mt19937_64& rng, const Shape3& shape, int spread, bool strided) {
  INFO(describe(shape) << ", spread 2^+-" << spread << (strided ? ", strided x" : ""));
  const Device gpu = Device::cuda(0);
  const int64_t pad = strided ? 3 : 0;
  const Tensor wide = random_matrix(rng, shape.rows, shape.in + pad + (strided ? 2 : 0), spread);
  const Tensor x = wide.narrow(1, pad, shape.in);
  const Tensor weight = random_matrix(rng, shape.out, shape.in, 1);
  const Tensor bias = random_matrix(rng, 1, shape.out, spread).view({shape.out});
  const Tensor grad_y = random_matrix(rng, shape.rows, shape.out, spread);
  const Tensor x_gpu = strided ? wide.to(gpu).narrow(1, pad, shape.in) : x.to(gpu);
  const Tensor weight_gpu = weight.to(gpu), bias_gpu = bias.to(gpu), grad_y_gpu = grad_y.to(gpu);

  const Tensor y = nn::linear_forward(x, weight, bias);
  CHECK_SAME_BITS(nn::linear_forward(x_gpu, weight_gpu, bias_gpu).to(Device::cpu()), y);
  const nn::LinearGradients g = nn::linear_backward(grad_y, x, weight, true, true, true);
  const nn::LinearGradients g_gpu =
      nn::linear_backward(grad_y_gpu, x_gpu, weight_gpu, true, true, true);
  CHECK_SAME_BITS(g_gpu.x.to(Device::cpu()), g.x);
  CHECK_SAME_BITS(g_gpu.weight.to(Device::cpu()), g.weight);
  CHECK_SAME_BITS(g_gpu.bias.to(Device::cpu()), g.bias);
}

}  // namespace

TEST_CASE("linear on the GPU gives the CPU's bits for y, dx, dW and db", "[exact][cuda]") {
  SEQPAR_REQUIRE_CUDA();
  const uint64_t seed = case_seed(0x6b0);
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  std::vector<Shape3> shapes = {{1, 1, 1}, {257, 17, 9}, {3000, 200, 40}, {64, 16, 8},
                                {333, 640, 100}, {17, 130, 65}};
  while (shapes.size() < 12) {
    shapes.push_back({uniform(rng, 1, 3000), uniform(rng, 1, 200), uniform(rng, 1, 40)});
  }
  for (const Shape3& shape : shapes) {
    const int spread = static_cast<int>(uniform(rng, 0, 20));
    check_gpu_matches_cpu(rng, shape, spread, false);
    check_gpu_matches_cpu(rng, shape, spread, true);
  }
  // A large aligned shape, which takes the 128 x 128 GEMM for y and dx.
  check_gpu_matches_cpu(rng, {2048, 512, 256}, 4, false);
  check_gpu_matches_cpu(rng, {2048, 512, 256}, 4, true);
}

TEST_CASE("linear on the GPU: shards combined by the simulated all-reduce give the CPU's full "
          "batch",
          "[exact][cuda]") {
  SEQPAR_REQUIRE_CUDA();
  const uint64_t seed = case_seed(0x6b1);
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const Device gpu = Device::cuda(0);
  for (const Shape3& shape : {Shape3{3000, 200, 40}, Shape3{1001, 17, 9}, Shape3{5, 3, 2}}) {
    INFO(describe(shape));
    const Tensor x = random_matrix(rng, shape.rows, shape.in, 10);
    const Tensor grad_y = random_matrix(rng, shape.rows, shape.out, 10);
    const Tensor weight = random_matrix(rng, shape.out, shape.in, 0);
    const nn::LinearGradients cpu = nn::linear_backward(grad_y, x, weight, false, true, true);
    const Tensor x_gpu = x.to(gpu), grad_y_gpu = grad_y.to(gpu), weight_gpu = weight.to(gpu);
    RecordingCombiner full;
    const nn::LinearGradients full_gpu = recorded_backward(grad_y_gpu, x_gpu, weight_gpu, full);
    CHECK_SAME_BITS(full_gpu.weight.to(Device::cpu()), cpu.weight);
    for (int kind = 0; kind < 4; ++kind) {
      // check_sharded compares on the tensors' device: the GPU shards against the CPU's bits.
      const nn::LinearGradients expected{Tensor(), cpu.weight.to(gpu), cpu.bias.to(gpu)};
      check_sharded(grad_y_gpu, x_gpu, weight_gpu, random_partition(rng, shape.rows, kind),
                    expected, full);
    }
  }
}
