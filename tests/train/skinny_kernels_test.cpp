// The skinny Linear kernels of the fused step (train/kernels/skinny.h, out_features <=
// 64): the forward and dW / db against float64 references, at shapes that exercise
// their edges: output groups of 16 with a partial last group, rows not a multiple of a
// warp's 8, columns not a multiple of 4 (the scalar loads), x a strided and misaligned
// window, several chunks of rows. And run to run, bit for bit.
//
// These kernels keep their own float summation order (not the canonical numerics of
// nn/linear_kernels.h, which nn's Linear follows) until the fused step adopts them, so
// they are compared with float64 to float32 rounding, not with nn bit for bit.
#include <catch2/catch.hpp>

#include <vector>

#include "core/generator.h"
#include "train/kernels/skinny.h"
#include "tests/cuda_test_util.h"
#include "tests/test_util.h"

using namespace seqpar;
using test::relative_error;

namespace {

// fp32 sums of up to 40000 products in the kernels' order against float64: normwise
// about 1e-6 at these lengths; a wrong element gives O(1).
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

// y = x Wᵀ + b, dW = dyᵀ x and db = Σ_rows dy in float64, rounded to float once.
struct Reference {
  Tensor y, weight, bias;
};
Reference float64_reference(const Tensor& x, const Tensor& weight, const Tensor& bias,
                            const Tensor& grad_y) {
  const int64_t rows = x.size(0), in = x.size(1), out = weight.size(0);
  const std::vector<float> xs = x.to_vector(), ws = weight.to_vector(), bs = bias.to_vector();
  const std::vector<float> dys = grad_y.to_vector();
  std::vector<double> y(rows * out), dw(out * in, 0.0), db(out, 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < out; ++j) {
      double sum = bs[j];
      for (int64_t k = 0; k < in; ++k) sum += double(xs[i * in + k]) * ws[j * in + k];
      y[i * out + j] = sum;
      const double dy = dys[i * out + j];
      db[j] += dy;
      for (int64_t k = 0; k < in; ++k) dw[j * in + k] += dy * xs[i * in + k];
    }
  }
  auto to_tensor = [](const std::vector<double>& values, const Shape& shape) {
    Tensor t = Tensor::empty(shape);
    for (size_t i = 0; i < values.size(); ++i) t.data()[i] = static_cast<float>(values[i]);
    return t;
  };
  return {to_tensor(y, {rows, out}), to_tensor(dw, {out, in}), to_tensor(db, {out})};
}

#ifdef SEQPAR_WITH_CUDA
namespace nd = train::kernels;

nd::RowsView rows_view(const Tensor& t) { return {t.data(), t.stride(0)}; }

// The skinny forward into a poisoned y, and dW and db from dy into poisoned outputs.
Reference run_skinny(const Tensor& x, const Tensor& weight, const Tensor& bias,
                     const Tensor& grad_y) {
  const int64_t rows = x.size(0), in = x.size(1), out = weight.size(0);
  const Device gpu = x.device();
  cuda::Stream stream = cuda::current_stream(gpu.index);
  Reference r{test::poisoned({rows, out}, gpu), test::poisoned({out, in}, gpu),
              test::poisoned({out}, gpu)};
  nd::skinny_forward_cuda(rows_view(x), weight.data(), bias.data(), rows, in, out, r.y.data(),
                          r.y.stride(0), stream);
  const nd::SkinnyGradScratch scratch = nd::skinny_grad_scratch(rows, in, out);
  const Tensor weight_partials = test::poisoned({scratch.weight_floats}, gpu);
  const Tensor bias_partials = test::poisoned({2 * scratch.bias_doubles}, gpu);
  nd::skinny_weight_grad_cuda(nd::GradSource{rows_view(grad_y), nullptr, 0.0f}, rows_view(x), rows,
                              in, out, r.weight.data(), r.bias.data(), weight_partials.data(),
                              reinterpret_cast<double*>(bias_partials.data()), nd::LossFinish{},
                              stream);
  return r;
}
#endif

void check_against_float64(const Shape3& s, bool strided) {
  INFO("rows " << s.rows << ", in " << s.in << ", out " << s.out << (strided ? ", strided" : ""));
  const Device gpu = Device::cuda();
  Generator generator(s.rows * 131 + s.in * 7 + s.out);
  const Tensor x = generator.randn({s.rows, s.in}), weight = generator.randn({s.out, s.in});
  const Tensor bias = generator.randn({s.out}), grad_y = generator.randn({s.rows, s.out});
  const Reference expected = float64_reference(x, weight, bias, grad_y);
#ifdef SEQPAR_WITH_CUDA
  const Tensor x_gpu = strided ? window_of(x, gpu) : x.to(gpu);
  const Reference skinny = run_skinny(x_gpu, weight.to(gpu), bias.to(gpu), grad_y.to(gpu));
  CHECK(relative_error(skinny.y, expected.y) < kTolerance);
  CHECK(relative_error(skinny.weight, expected.weight) < kTolerance);
  CHECK(relative_error(skinny.bias, expected.bias) < kTolerance);
#endif
}

}  // namespace

TEST_CASE("skinny linear kernels match float64 at odd shapes", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  const std::vector<Shape3> shapes = {
      {1001, 37, 33},   // partial output group, scalar loads (in % 4 != 0)
      {257, 640, 64},   // four full output groups
      {5000, 128, 3},   // many row chunks, few outputs
      {9, 4, 16},       // one column step, a partial warp tile
      {7, 300, 1},      // fewer rows than a warp tile
      {40000, 20, 16},  // rows_per_chunk > 256: dy staged in several rounds
  };
  for (const Shape3& s : shapes) check_against_float64(s, false);
  for (const Shape3& s : {Shape3{1001, 36, 17}, Shape3{3000, 640, 16}}) check_against_float64(s, true);
}

TEST_CASE("skinny linear kernels are bitwise reproducible", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
#ifdef SEQPAR_WITH_CUDA
  const Device gpu = Device::cuda();
  Generator generator(11);
  const Tensor x = generator.randn({12000, 640}, gpu), weight = generator.randn({16, 640}, gpu);
  const Tensor bias = generator.randn({16}, gpu), grad_y = generator.randn({12000, 16}, gpu);
  const Reference first = run_skinny(x, weight, bias, grad_y);
  test::poison_pool(gpu);
  const Reference second = run_skinny(x, weight, bias, grad_y);
  CHECK(test::bitwise_equal(first.y, second.y));
  CHECK(test::bitwise_equal(first.weight, second.weight));
  CHECK(test::bitwise_equal(first.bias, second.bias));
#endif
}
