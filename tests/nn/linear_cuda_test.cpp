// nn/cuda/linear.cu and nn/cuda/linear_row_sums.cu against the CPU path, bit for bit: y = x Wᵀ + b
// and dx = dy W by the two GEMM kernels (each element one fma chain over k from +0,
// then + bias, as on the CPU), dW and db by the exact row sums. Fixed shapes that reach
// each GEMM kernel on purpose (checked with linear_uses_gemm128, so a dispatch that
// silently changes fails), random shapes, odd sizes and strided x views.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "core/generator.h"
#include "nn/linear.h"
#include "nn/cuda/linear.h"
#ifdef SEQPAR_WITH_CUDA
#include <cuda_runtime.h>

#include "core/cuda_runtime.h"
#include "nn/cuda/gemm_tile128.h"
#endif
#include "tests/cuda_test_util.h"
#include "tests/test_util.h"

using namespace seqpar;

namespace {

struct LinearCase {
  int64_t rows, in, out;
};

// How x sits in memory on the GPU: contiguous, or a window [rows, in] of a wider buffer
// (one row and `column` floats in, row stride in + pad), as a rank's slice of a batch.
struct XLayout {
  int64_t pad = 0, column = 0;
};

Tensor place_x(const Tensor& x, XLayout layout, Device device) {
  if (layout.pad == 0) return x.to(device);
  const int64_t rows = x.size(0), in = x.size(1);
  Tensor wide = Tensor::zeros({rows + 1, in + layout.pad}, device);
  Tensor window = wide.narrow(0, 1, rows).narrow(1, layout.column, in);
  window.copy_(x);
  return window;
}

// Which GEMM kernel each product of a case is meant to reach (the 128 x 128 one or not).
struct Kernels {
  bool output_large, grad_input_large;
};

// One case through the launchers (poisoned outputs, each gradient alone too) and the
// public API (poisoned pool): every output the CPU's bits. With `kernels`, also that y
// and dx reach the GEMM kernels it names.
void check_case(const LinearCase& c, XLayout layout, const Kernels* kernels = nullptr) {
  INFO("rows " << c.rows << ", in " << c.in << ", out " << c.out << ", x pad " << layout.pad
               << " column " << layout.column);
  const Device gpu = Device::cuda();
  Generator generator(c.rows * 7919 + c.in * 31 + c.out + layout.pad);
  const Tensor x = generator.randn({c.rows, c.in}), weight = generator.randn({c.out, c.in});
  const Tensor bias = generator.randn({c.out}), grad_y = generator.randn({c.rows, c.out});
  const Tensor y_cpu = nn::linear_forward(x, weight, bias);
  const nn::LinearGradients cpu = nn::linear_backward(grad_y, x, weight, true, true, true);

  const Tensor x_gpu = place_x(x, layout, gpu);
  const Tensor weight_gpu = weight.to(gpu), bias_gpu = bias.to(gpu), grad_y_gpu = grad_y.to(gpu);
#ifdef SEQPAR_WITH_CUDA
  const Tensor y = test::poisoned({c.rows, c.out}, gpu);
  const Tensor grad_x = test::poisoned({c.rows, c.in}, gpu);
  const Tensor grad_weight = test::poisoned({c.out, c.in}, gpu);
  const Tensor grad_bias = test::poisoned({c.out}, gpu);
  if (kernels != nullptr) {
    using nn::detail::LinearProduct;
    CHECK(nn::detail::linear_uses_gemm128(LinearProduct::Output, x_gpu, weight_gpu, y) ==
          kernels->output_large);
    CHECK(nn::detail::linear_uses_gemm128(LinearProduct::GradInput, grad_y_gpu, weight_gpu,
                                             grad_x) == kernels->grad_input_large);
  }
  nn::detail::linear_forward_cuda(x_gpu, weight_gpu, bias_gpu, y);
  CHECK(test::bitwise_equal(y, y_cpu));
  nn::detail::linear_backward_cuda(grad_y_gpu, x_gpu, weight_gpu, grad_x, grad_weight, grad_bias);
  CHECK(test::bitwise_equal(grad_x, cpu.x));
  CHECK(test::bitwise_equal(grad_weight, cpu.weight));
  CHECK(test::bitwise_equal(grad_bias, cpu.bias));

  // Each gradient alone (undefined outputs are skipped, the others still written).
  const Tensor grad_x_only = test::poisoned({c.rows, c.in}, gpu);
  nn::detail::linear_backward_cuda(grad_y_gpu, x_gpu, weight_gpu, grad_x_only, Tensor(), Tensor());
  CHECK(test::bitwise_equal(grad_x_only, cpu.x));
  const Tensor grad_weight_only = test::poisoned({c.out, c.in}, gpu);
  nn::detail::linear_backward_cuda(grad_y_gpu, x_gpu, weight_gpu, Tensor(), grad_weight_only,
                                   Tensor());
  CHECK(test::bitwise_equal(grad_weight_only, cpu.weight));
#endif
  // Through the public API too (its dispatch, its output allocation).
  test::poison_pool(gpu);
  CHECK(test::bitwise_equal(nn::linear_forward(x_gpu, weight_gpu, bias_gpu), y_cpu));
  test::poison_pool(gpu);
  const nn::LinearGradients api = nn::linear_backward(grad_y_gpu, x_gpu, weight_gpu, true, true, true);
  CHECK(test::bitwise_equal(api.x, cpu.x));
  CHECK(test::bitwise_equal(api.weight, cpu.weight));
  CHECK(test::bitwise_equal(api.bias, cpu.bias));
}

}  // namespace

TEST_CASE("linear on the GPU gives the CPU's bits", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  const std::vector<LinearCase> cases = {
      {1, 640, 16},    {17, 1, 16},    {17, 16, 1},    {333, 1000, 1},
      {333, 17, 640},  {640, 640, 16}, {640, 16, 640}, {333, 640, 1000},
      {12000, 640, 16},  // the Linear on the full batch
      {3000, 640, 16},   // and on one rank's shard at sp 4
      {70, 2100, 16},    // a wide input
      {0, 16, 16},       // a shard with no rows
  };
  for (const LinearCase& c : cases) check_case(c, {});
  for (const LinearCase& c : {LinearCase{17, 16, 16}, LinearCase{3000, 640, 16},
                              LinearCase{1, 640, 16}}) {
    check_case(c, {5, 3});  // row stride in + 5, 3 floats in: not 16-byte aligned
  }
}

TEST_CASE("linear on the GPU gives the CPU's bits at random shapes", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  std::mt19937 random(2024);
  auto size = [&](int64_t most) { return std::uniform_int_distribution<int64_t>(1, most)(random); };
  for (int i = 0; i < 24; ++i) {
    const LinearCase c{size(900), size(300), size(300)};
    XLayout layout;  // every third case with x contiguous, the others a window
    if (i % 3 != 0) {
      layout.pad = size(8);
      layout.column = size(layout.pad);
    }
    check_case(c, layout);
  }
}

TEST_CASE("linear's products reach each GEMM kernel by shape, with the CPU's bits", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  struct KernelCase {
    LinearCase shape;
    XLayout layout;
    Kernels kernels;
  };
  // The 128 x 128 kernel needs 128 tiles of C and operands aligned for its 16-byte loads
  // (K % 4 along K; x's row stride % 4 and 16-byte start); else the 64 x 64 one. Every
  // shape has partial tiles at the edges of C and a partial last K slice.
  const std::vector<KernelCase> cases = {
      {{16400, 36, 20}, {}, {true, true}},       // 129 x 1 tiles for y and for dx
      {{16400, 36, 20}, {4, 4}, {true, true}},   // x a window, row stride 40, aligned
      {{16400, 36, 20}, {3, 1}, {false, true}},  // x a window, row stride 39: y steps aside
      {{16400, 37, 20}, {}, {false, false}},     // K = 37 for y, 37 rows of Wᵀ for dx
      {{1100, 4, 1800}, {}, {true, false}},      // y 9 x 15 tiles, K = 4; dx 9 x 1
      {{1300, 68, 1540}, {}, {true, false}},     // y 11 x 13 tiles; dx 11 x 1
      {{1300, 1540, 68}, {}, {false, true}},     // y 11 x 1; dx 11 x 13 tiles, K = 68
      {{640, 16, 640}, {}, {false, false}},      // 25 tiles: too few
  };
  for (const KernelCase& c : cases) check_case(c.shape, c.layout, &c.kernels);
}

#ifdef SEQPAR_WITH_CUDA
namespace {

// The 128 x 128 kernel's products for contiguous x [rows, in], W [out, in], dy [rows, out]:
// y = x Wᵀ + b, and dx = dy W with W read down its columns.
nn::detail::Gemm output_gemm(const Tensor& x, const Tensor& weight, const Tensor& bias,
                             const Tensor& y) {
  const int64_t rows = x.size(0), in = x.size(1), out = weight.size(0);
  return {rows, out, in, {x.data(), in, 1}, {weight.data(), in, 1}, y.data(), out, bias.data()};
}
nn::detail::Gemm grad_input_gemm(const Tensor& grad_y, const Tensor& weight, const Tensor& dx) {
  const int64_t rows = grad_y.size(0), out = weight.size(0), in = weight.size(1);
  return {rows, in, out, {grad_y.data(), out, 1}, {weight.data(), 1, in}, dx.data(), in, nullptr};
}

// y and dx through the 128 x 128 kernel, into poisoned outputs, against the CPU's bits.
void check_gemm128(const Tensor& x, const Tensor& weight, const Tensor& bias,
                   const Tensor& grad_y, const Tensor& y_cpu, const Tensor& dx_cpu) {
  const Device gpu = x.device();
  cudaStream_t stream = cuda::current_stream(gpu.index);
  const Tensor y = test::poisoned(y_cpu.shape(), gpu);
  nn::detail::gemm128_cuda<true, true>(output_gemm(x, weight, bias, y), stream);
  CHECK(test::bitwise_equal(y, y_cpu));
  const Tensor dx = test::poisoned(dx_cpu.shape(), gpu);
  nn::detail::gemm128_cuda<true, false>(grad_input_gemm(grad_y, weight, dx), stream);
  CHECK(test::bitwise_equal(dx, dx_cpu));
}

}  // namespace
#endif

TEST_CASE("the large GEMM gives the CPU's bits, eager and captured into a graph", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
#ifdef SEQPAR_WITH_CUDA
  using nn::detail::Gemm;
  using nn::detail::Operand;
  // y = x Wᵀ + b and dx = dy W, each K with a partial last slice at both depths
  // (1000 = 31 x 32 + 8, 20 < 32), and partial tiles of C at the edges.
  for (const LinearCase& c : {LinearCase{1100, 1000, 260}, LinearCase{16400, 20, 132}}) {
    INFO("rows " << c.rows << ", in " << c.in << ", out " << c.out);
    Generator generator(c.rows + 3 * c.in + 7 * c.out);
    const Tensor x = generator.randn({c.rows, c.in}), weight = generator.randn({c.out, c.in});
    const Tensor bias = generator.randn({c.out}), grad_y = generator.randn({c.rows, c.out});
    const Tensor y_cpu = nn::linear_forward(x, weight, bias);
    const Tensor dx_cpu = nn::linear_backward(grad_y, x, weight, true, false, false).x;
    const Device gpu = Device::cuda();
    const Tensor x_gpu = x.to(gpu), weight_gpu = weight.to(gpu), bias_gpu = bias.to(gpu);
    const Tensor grad_y_gpu = grad_y.to(gpu);
    const int device = gpu.index;
    check_gemm128(x_gpu, weight_gpu, bias_gpu, grad_y_gpu, y_cpu, dx_cpu);
    // Captured into a graph and replayed: the same kernel (its shared-memory limit is
    // raised inside the capture), the same bits.
    const Tensor y = test::poisoned({c.rows, c.out}, gpu);
    cudaStream_t stream = cuda::current_stream(device);
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) == cudaSuccess);
    nn::detail::gemm128_cuda<true, true>(output_gemm(x_gpu, weight_gpu, bias_gpu, y), stream);
    REQUIRE(cudaStreamEndCapture(stream, &graph) == cudaSuccess);
    REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
    REQUIRE(cudaGraphLaunch(exec, stream) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    CHECK(test::bitwise_equal(y, y_cpu));
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
#endif
}

namespace {

// ±2^-100 u, u in [1, 2), signs at random: every product of two is below half the
// smallest subnormal, so it rounds to a zero of its own sign, and a chain of them ends
// on the sign of its last product.
Tensor underflowing(std::mt19937_64& rng, const Shape& shape) {
  std::uniform_real_distribution<float> u(1.0f, 2.0f);
  std::bernoulli_distribution negative(0.5);
  std::vector<float> values(static_cast<size_t>(shape_numel(shape)));
  for (float& v : values) v = std::ldexp(negative(rng) ? -u(rng) : u(rng), -100);
  return Tensor::from_data(shape, values);
}

int64_t negative_zeros(const Tensor& t) {
  int64_t count = 0;
  for (const float v : t.to_vector()) count += v == 0.0f && std::signbit(v);
  return count;
}

}  // namespace

TEST_CASE("both GEMM kernels keep a chain's -0 past K (seed 17)", "[cuda]") {
  // A chain of underflowing products ends -0 about half the time, and a bias of -0
  // keeps it; the k each kernel stages past K (K not a multiple of its slice) must not
  // turn it into +0. y and dx, through the 64 x 64 kernel and the 128 x 128 one at both
  // depths, against the CPU's bits.
  SEQPAR_REQUIRE_CUDA();
#ifdef SEQPAR_WITH_CUDA
  using nn::detail::LinearProduct;
  std::mt19937_64 rng(17);
  const Device gpu = Device::cuda();
  const int device = gpu.index;
  for (const LinearCase& c : {LinearCase{100, 20, 30}, LinearCase{16400, 20, 132}}) {
    INFO("rows " << c.rows << ", in " << c.in << ", out " << c.out);
    const Tensor x = underflowing(rng, {c.rows, c.in}), weight = underflowing(rng, {c.out, c.in});
    const Tensor grad_y = underflowing(rng, {c.rows, c.out});
    const Tensor bias = Tensor::full({c.out}, -0.0f);
    const Tensor y_cpu = nn::linear_forward(x, weight, bias);
    const Tensor dx_cpu = nn::linear_backward(grad_y, x, weight, true, false, false).x;
    CHECK(negative_zeros(y_cpu) > y_cpu.numel() / 4);  // the case this test is about
    CHECK(negative_zeros(dx_cpu) > dx_cpu.numel() / 4);
    const Tensor x_gpu = x.to(gpu), weight_gpu = weight.to(gpu), bias_gpu = bias.to(gpu);
    const Tensor grad_y_gpu = grad_y.to(gpu);
    const bool large = c.rows > 1000;
    const Tensor y = test::poisoned({c.rows, c.out}, gpu), dx = test::poisoned({c.rows, c.in}, gpu);
    CHECK(nn::detail::linear_uses_gemm128(LinearProduct::Output, x_gpu, weight_gpu, y) == large);
    CHECK(nn::detail::linear_uses_gemm128(LinearProduct::GradInput, grad_y_gpu, weight_gpu, dx) ==
          large);
    nn::detail::linear_forward_cuda(x_gpu, weight_gpu, bias_gpu, y);
    CHECK(test::bitwise_equal(y, y_cpu));
    nn::detail::linear_backward_cuda(grad_y_gpu, x_gpu, weight_gpu, dx, Tensor(), Tensor());
    CHECK(test::bitwise_equal(dx, dx_cpu));
    if (!large) continue;
    check_gemm128(x_gpu, weight_gpu, bias_gpu, grad_y_gpu, y_cpu, dx_cpu);
  }
#endif
}

TEST_CASE("the few-outputs forward (out <= 16, in <= 768) gives the CPU's bits", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  // Narrow shapes, float4 and scalar reads of x (in % 4, windows), a partial last block;
  // and the first shapes past each limit, which take a GEMM with the same bits.
  const std::vector<std::pair<LinearCase, bool>> cases = {
      {{12000, 640, 16}, true}, {{129, 768, 16}, true}, {{300, 3, 1}, true},
      {{1, 5, 7}, true},        {{300, 769, 16}, false}, {{300, 640, 17}, false},
  };
  for (const auto& [c, narrow] : cases) {
#ifdef SEQPAR_WITH_CUDA
    Generator generator(c.rows + c.in + c.out);
    const Tensor x = generator.randn({c.rows, c.in}).to(Device::cuda());
    CHECK(nn::detail::few_outputs_forward_fits(nn::detail::const_rows_of(x), c.out) == narrow);
#else
    (void)narrow;
#endif
    check_case(c, {});
    check_case(c, {5, 3});  // row stride in + 5, 3 floats in: the scalar reads
  }
}

namespace {
// Each case twice: x contiguous, then x as a view one column into a wider matrix.
std::vector<std::pair<LinearCase, bool>> cases_with_shift(const std::vector<LinearCase>& cases) {
  std::vector<std::pair<LinearCase, bool>> all;
  for (const LinearCase& c : cases) {
    all.emplace_back(c, false);
    all.emplace_back(c, true);
  }
  return all;
}

// The largest |x[., c]| of each column, NaNs passed over (as std::fmax does), computed
// on the host: what the few-outputs forward's x_largest must hold, as floats' bits.
std::vector<float> host_column_maxima(const Tensor& x) {
  const Tensor contiguous = x.contiguous();
  const std::vector<float> v = contiguous.to_vector();
  const int64_t rows = x.size(0), cols = x.size(1);
  std::vector<float> largest(static_cast<size_t>(cols), 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      largest[c] = std::fmax(largest[c], std::fabs(v[r * cols + c]));
    }
  }
  return largest;
}
}  // namespace

TEST_CASE("every variant of the few-outputs forward gives the CPU's bits", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
#ifdef SEQPAR_WITH_CUDA
  // 4, 8 or 16 outputs a thread: the same chains, other threads. Widths that leave a
  // thread's group partly (10, 7) or wholly (1: three of four groups idle) past `out`.
  // Aligned rows with in % 4 == 0 take the staged kernel (tiles of 32 columns: whole,
  // 640 and 768; a last partial one, 100; one partial tile, 12 and 4); the others, and
  // x as a view one column in (rows not 16-byte aligned), read x from each thread's row.
  // Each also with x's column maxima (x_largest), found in the same pass over x by the
  // staged kernel and by a pass of their own otherwise; one case holds a NaN, an
  // infinity and a huge negative x (NaN passed over, |x| not x).
  // 5000 rows: a last block partly past the rows.
  const std::vector<LinearCase> cases = {{12000, 640, 16}, {5000, 128, 16}, {129, 768, 16},
                                         {77, 100, 16},    {33, 12, 10},    {5, 4, 16},
                                         {300, 3, 1},      {1, 5, 7},       {70, 96, 16}};
  for (const auto& [c, shifted] : cases_with_shift(cases)) {
    Generator generator(c.rows * 3 + c.in * 5 + c.out);
    Tensor wide = generator.randn({c.rows, c.in + 1});
    const Tensor weight = generator.randn({c.out, c.in}), bias = generator.randn({c.out});
    if (c.in == 96) {
      float* w = wide.data();
      w[5 * (c.in + 1) + 8] = std::nanf("");
      w[9 * (c.in + 1) + 9] = -INFINITY;
      w[69 * (c.in + 1) + 41] = -1.0e30f;
    }
    const Tensor x = wide.narrow(1, shifted ? 1 : 0, c.in);
    const std::vector<float> largest_cpu = host_column_maxima(x);
    const Tensor y_cpu = nn::linear_forward(x, weight, bias);
    const Tensor x_gpu = shifted ? wide.to(Device::cuda()).narrow(1, 1, c.in) : x.contiguous().to(Device::cuda());
    const Tensor weight_gpu = weight.to(Device::cuda()), bias_gpu = bias.to(Device::cuda());
    for (int per_thread : {4, 8, 16}) {
      INFO("rows " << c.rows << ", in " << c.in << ", out " << c.out << ", " << per_thread
                   << " outputs a thread" << (shifted ? ", x one column in" : ""));
      const Tensor y = test::poisoned({c.rows, c.out}, Device::cuda());
      nn::detail::few_outputs_forward_cuda(nn::detail::const_rows_of(x_gpu), weight_gpu.data(),
                                      weight_gpu.stride(0), bias_gpu.data(), c.out, y.data(),
                                      y.stride(0), 0, nullptr, per_thread);
      CHECK(test::same_bits(y, y_cpu));
      const Tensor y_too = test::poisoned({c.rows, c.out}, Device::cuda());
      const Tensor largest = Tensor::zeros({c.in}, Device::cuda());  // +0.0: bits 0
      nn::detail::few_outputs_forward_cuda(nn::detail::const_rows_of(x_gpu), weight_gpu.data(),
                                      weight_gpu.stride(0), bias_gpu.data(), c.out,
                                      y_too.data(), y_too.stride(0), 0,
                                      reinterpret_cast<unsigned int*>(largest.data()), per_thread);
      CHECK(test::same_bits(y_too, y_cpu));
      CHECK(test::bitwise_equal(largest, Tensor::from_data({c.in}, largest_cpu)));
      if (shifted) continue;
      // W as a view: rows in + 4 floats apart, from its first float and from its second.
      for (int64_t offset : {0, 1}) {
        INFO("W a view " << offset << " floats into rows of " << c.in + 4);
        const Tensor wide_weight = test::poisoned({c.out, c.in + 4}, Device::cuda());
        const Tensor weight_view = wide_weight.narrow(1, offset, c.in);
        weight_view.copy_(weight);
        const Tensor y_view = test::poisoned({c.rows, c.out}, Device::cuda());
        nn::detail::few_outputs_forward_cuda(nn::detail::const_rows_of(x_gpu), weight_view.data(),
                                        weight_view.stride(0), bias_gpu.data(), c.out, y_view.data(),
                                        y_view.stride(0), 0, nullptr, per_thread);
        CHECK(test::same_bits(y_view, y_cpu));
      }
    }
  }
#endif
}

TEST_CASE("the few-outputs forward captured into a graph takes the same kernel and bits", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
#ifdef SEQPAR_WITH_CUDA
  // The staged kernel needs its shared-memory limit raised, which every launch does, a
  // captured one too (the strictest capture mode, which refuses calls unsafe during a
  // capture): a graph captured before any eager launch runs the same kernel.
  const LinearCase c{12000, 640, 16};
  Generator generator(2026);
  const Tensor x = generator.randn({c.rows, c.in}), weight = generator.randn({c.out, c.in});
  const Tensor bias = generator.randn({c.out});
  const Tensor y_cpu = nn::linear_forward(x, weight, bias);
  const Tensor x_gpu = x.to(Device::cuda()), weight_gpu = weight.to(Device::cuda());
  const Tensor bias_gpu = bias.to(Device::cuda());
  const Tensor largest = Tensor::zeros({c.in}, Device::cuda());
  const Tensor y = test::poisoned({c.rows, c.out}, Device::cuda());
  cudaStream_t stream = cuda::current_stream(0);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) == cudaSuccess);
  nn::detail::few_outputs_forward_cuda(nn::detail::const_rows_of(x_gpu), weight_gpu.data(),
                                       weight_gpu.stride(0), bias_gpu.data(), c.out, y.data(),
                                       y.stride(0), 0, reinterpret_cast<unsigned int*>(largest.data()));
  REQUIRE(cudaStreamEndCapture(stream, &graph) == cudaSuccess);
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  REQUIRE(cudaGraphLaunch(exec, stream) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
  CHECK(test::same_bits(y, y_cpu));
  CHECK(test::bitwise_equal(largest, Tensor::from_data({c.in}, host_column_maxima(x))));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
#endif
}
