// dW when dy has one magnitude (dy = ±f or 0, as an L1 loss's backward gives:
// nn/one_magnitude.h, fixed-point integer sums), and db then (f times a count of signs). On the CPU against the general binned
// row sums (the exact values of the digits, and the rounded bits); on the GPU
// (nn/cuda/one_magnitude_dw_few_outputs.cuh, and nn/cuda/one_magnitude_dw_many_outputs.cu's int8 GEMM for 64 outputs
// or more, cut into chunks of rows in several ways) against the CPU, bit for bit. The inputs aim at each way
// out of the fixed-point window: elements tiny next to their column's largest,
// subnormals, products below the bins' grid (a tiny f), products near 2^129 (a huge f),
// infinities and NaNs in x (with dy = 0 beside them: 0 * inf is NaN), columns of zeros,
// every dy zero; and odd shapes (partial chunks, column blocks and output groups;
// strided views).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/device_buffer.h"
#include "core/exact_bins.h"
#include "core/exact_sums.h"
#include "nn/linear.h"
#include "nn/cpu/linear.h"
#include "nn/cuda/linear.h"
#include "nn/one_magnitude.h"
#include "tests/cuda_test_util.h"
#include "tests/test_util.h"

using namespace seqpar;

namespace {

struct Case {
  const char* name;
  int64_t rows, in, out;
  float f;                    // dy's one magnitude
  double zero_fraction;       // of dy set to ±0
  int exponent_low, exponent_high;  // x = randn * 2^e, e uniform in [low, high] per element
  double non_finite_fraction = 0;   // of x set to +-inf or NaN
};

Tensor from_values(const std::vector<float>& values, const Shape& shape) {
  Tensor tensor = Tensor::empty(shape);
  std::copy(values.begin(), values.end(), tensor.data());
  return tensor;
}

struct Inputs {
  Tensor x, dy;
};

Inputs make_inputs(const Case& c, int64_t pad) {
  std::mt19937 random(static_cast<unsigned>(c.rows * 131 + c.in * 7 + c.out + pad));
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<double> uniform;
  std::uniform_int_distribution<int> exponent(c.exponent_low, c.exponent_high);
  std::vector<float> x(static_cast<size_t>(c.rows * c.in)), dy(static_cast<size_t>(c.rows * c.out));
  for (float& value : x) {
    value = std::ldexp(normal(random), exponent(random));
    const double u = uniform(random);
    if (u < c.non_finite_fraction / 3) {
      value = std::numeric_limits<float>::infinity();
    } else if (u < 2 * c.non_finite_fraction / 3) {
      value = -std::numeric_limits<float>::infinity();
    } else if (u < c.non_finite_fraction) {
      value = std::numeric_limits<float>::quiet_NaN();
    }
  }
  for (float& value : dy) {
    const double u = uniform(random);
    value = u < c.zero_fraction / 2 ? 0.0f : u < c.zero_fraction ? -0.0f
            : (random() % 2 ? c.f : -c.f);
  }
  return {from_values(x, {c.rows, c.in}), from_values(dy, {c.rows, c.out})};
}

// What a sum's flags word makes of it: finite (0), +inf (1), -inf (2) or NaN (3).
int outcome(int64_t flags) {
  const bool nan = flags / exact::kNaNFlag != 0;
  const bool positive = (flags & exact::kFlagFieldMask) != 0;
  const bool negative = ((flags / exact::kNegativeInfinityFlag) & exact::kFlagFieldMask) != 0;
  if (nan || (positive && negative)) return 3;
  return positive ? 1 : negative ? 2 : 0;
}

// The CPU's one-magnitude loop against its general binned sums: the same exact value
// in every sum (so the same bits, and the same flags for the non-finite).
void check_cpu(const Case& c) {
  INFO(c.name << ": " << c.rows << " x " << c.in << " -> " << c.out << ", f " << c.f);
  const Inputs inputs = make_inputs(c, 0);
  const nn::detail::ConstRows dy = nn::detail::const_rows_of(inputs.dy);
  const nn::detail::ConstRows x = nn::detail::const_rows_of(inputs.x);
  exact::ExactSums fixed_point(c.out * c.in, Device::cpu()), binned(c.out * c.in, Device::cpu());
  nn::detail::accumulate_weight_grad_cpu(dy, x, fixed_point);
  nn::detail::accumulate_weight_grad_cpu(dy, x, binned, nn::detail::WeightGradPath::General);
  const std::vector<int64_t> a = fixed_point.to_host(), b = binned.to_host();
  const int64_t count = c.out * c.in;
  int64_t differing = 0;
  for (int64_t i = 0; i < count; ++i) {
    // Digits may carry differently between bins: the difference of the two sets of
    // digits must have the exact value 0, and its rounding to double is 0 exactly then
    // (a nonzero multiple of 2^-149 rounds to a nonzero double). Flags must match.
    int64_t difference[exact::kDigits] = {};
    for (int d = 0; d < exact::kBins; ++d) {
      difference[d] = a[static_cast<size_t>(d * count + i)] - b[static_cast<size_t>(d * count + i)];
    }
    // The flags say which non-finite terms a sum saw; how they were or-ed and added
    // depends on the split (a NaN or both infinities give NaN either way), so they are
    // compared by what they make of the sum.
    const size_t flags = static_cast<size_t>(exact::kSpecialDigit * count + i);
    if (outcome(a[flags]) != outcome(b[flags]) || exact::round_to_double(difference) != 0.0) {
      ++differing;
    }
  }
  CHECK(differing == 0);
  Tensor rounded_a = Tensor::empty({c.out, c.in}), rounded_b = Tensor::empty({c.out, c.in});
  fixed_point.round_into(rounded_a);
  binned.round_into(rounded_b);
  CHECK(test::bitwise_equal(rounded_a, rounded_b));
}

// pad > 0: x and dy as views, each row `pad` floats wider than the tensor, starting
// `offset` floats into it (offset 0 with a row of a multiple of 4 floats: rows 16-byte
// aligned, as the dW kernel's 16-byte copies want, with a partial 16 bytes at each
// row's end when the tensor's width is not a multiple of 4).
void check(const Case& c, int64_t pad = 0, int64_t offset = -1) {
  if (offset < 0) offset = pad;
  INFO(c.name << ": " << c.rows << " x " << c.in << " -> " << c.out << ", f " << c.f
              << ", pad " << pad << ", offset " << offset);
  const Inputs inputs = make_inputs(c, pad);
  const Tensor x_cpu = inputs.x, dy_cpu = inputs.dy;
  const Tensor weight = Tensor::zeros({c.out, c.in});
  const nn::LinearGradients cpu = nn::linear_backward(dy_cpu, x_cpu, weight, false, true, true);
#ifdef SEQPAR_WITH_CUDA
  const Device gpu = Device::cuda();
  // Strided views: each tensor a window of a wider buffer.
  auto place = [&](const Tensor& t) {
    if (pad == 0) return t.to(gpu);
    Tensor wide = Tensor::zeros({t.size(0), t.size(1) + pad}, gpu);
    Tensor window = wide.narrow(1, offset, t.size(1));
    window.copy_(t);
    return window;
  };
  const Tensor x_gpu = place(x_cpu), dy_gpu = place(dy_cpu);
  const Tensor grad_weight = test::poisoned({c.out, c.in}, gpu);
  const Tensor grad_bias = test::poisoned({c.out}, gpu);
  nn::detail::linear_backward_cuda(dy_gpu, x_gpu, weight.to(gpu), Tensor(), grad_weight, grad_bias);
  CHECK(test::bitwise_equal(grad_weight, cpu.weight));
  CHECK(test::bitwise_equal(grad_bias, cpu.bias));
  // As autograd runs it: x's column maxima left by the forward's pass, handed to the
  // backward (the few-outputs forward's own pass up to 16 outputs, a pass of their own above).
  DeviceBuffer<unsigned int> x_largest(c.in, gpu);
  x_largest.zero();
  const Tensor y = Tensor::empty({c.rows, c.out}, gpu);
  nn::detail::linear_forward_cuda(x_gpu, weight.to(gpu), Tensor(), y, x_largest.data());
  const Tensor grad_weight_given_maxima = test::poisoned({c.out, c.in}, gpu);
  nn::detail::linear_backward_cuda(dy_gpu, x_gpu, weight.to(gpu), Tensor(), grad_weight_given_maxima,
                                   Tensor(), x_largest.data());
  CHECK(test::bitwise_equal(grad_weight_given_maxima, cpu.weight));
  // db alone: f times each column's sign sum, counted in the maxima pass over dy.
  const Tensor grad_bias_alone = test::poisoned({c.out}, gpu);
  nn::detail::linear_backward_cuda(dy_gpu, x_gpu, weight.to(gpu), Tensor(), Tensor(), grad_bias_alone);
  CHECK(test::bitwise_equal(grad_bias_alone, cpu.bias));
#else
  (void)pad;
#endif
}

}  // namespace

const std::vector<Case>& cases() {
  static const float l1_scale = 1.0f / 192000.0f;  // the mean over 12,000 x 16
  static const std::vector<Case> all = {
      {"the issue's L1 shape", 12000, 640, 16, l1_scale, 0.01, 0, 0},
      {"dy of many outputsnamic range: many elements outside the window", 3000, 96, 16, l1_scale, 0.05, -70, 10},
      {"subnormal x", 1500, 64, 16, 0.5f, 0.0, -160, -120},
      {"products below the grid (tiny f)", 1500, 64, 16, 0x1p-140f, 0.1, -30, 0},
      {"subnormal f", 700, 33, 5, 0x1p-145f, 0.1, -10, 10},
      {"products near 2^129 (huge f)", 700, 64, 16, 0x1p100f, 0.1, 20, 28},
      {"infinities and NaNs in x", 1100, 70, 16, l1_scale, 0.2, -3, 3, 0.002},
      {"every dy zero", 600, 40, 16, l1_scale, 1.0, -3, 3, 0.01},
      {"two output groups, partial", 1025, 37, 20, 0.25f, 0.1, -5, 5},
      {"one row", 1, 300, 3, 3.0f, 0.0, -2, 2},
      {"chunk edges", 1537, 32, 16, 1.5f, 0.3, -40, 0},
      // The window's unit raised to 2^-149 (a huge f lets it reach below): every float
      // is then a multiple of it, subnormals included.
      {"x near the subnormals, a huge f", 1500, 64, 16, 0x1p30f, 0.1, -160, -110},
      // Columns whose largest |x| is at least 2^125: no window on the GPU (its float
      // cut would overflow), every element on its own, far past a warp's list.
      {"x near float's largest, a tiny f", 600, 40, 16, 0x1p-30f, 0.1, 124, 124},
  };
  return all;
}

// dy of many outputs (at least kManyOutputsMin): the int8 GEMM path of nn/cuda/one_magnitude_dw_many_outputs.cu on the GPU.
const std::vector<Case>& many_outputs_cases() {
  static const float l1_scale = 1.0f / 192000.0f;
  static const std::vector<Case> all = {
      {"many outputs: the int8 GEMM path", 2000, 96, 160, l1_scale, 0.01, 0, 0},
      {"many outputs, odd edges", 1001, 37, 131, 0.25f, 0.1, -5, 5},
      {"many outputs, many elements outside the window", 1500, 64, 128, l1_scale, 0.05, -70, 10},
      {"many outputs, subnormal x", 700, 40, 129, 0.5f, 0.0, -160, -120},
      {"many outputs, products below the grid (tiny f)", 600, 48, 130, 0x1p-140f, 0.1, -30, 0},
      {"many outputs, subnormal f", 500, 33, 129, 0x1p-145f, 0.1, -10, 10},
      {"many outputs, products near 2^129 (huge f)", 500, 48, 130, 0x1p100f, 0.1, 20, 28},
      {"many outputs, infinities and NaNs in x", 700, 40, 140, l1_scale, 0.2, -3, 3, 0.002},
      {"many outputs, every dy zero", 300, 40, 128, l1_scale, 1.0, -3, 3, 0.01},
      {"many outputs, one row", 1, 50, 200, 3.0f, 0.0, -2, 2},
      {"many outputs, the fewest outputs it takes", 900, 70, 64, 0.25f, 0.05, -25, 5},
  };
  return all;
}

TEST_CASE("dW from a one-magnitude dy on the CPU: the fixed-point sums equal the binned sums",
          "[cpu]") {
  for (const Case& c : cases()) check_cpu(c);
}

TEST_CASE("dy's sign fragments follow PTX's m16n8k32 A layout, each sign its own byte", "[cpu]") {
  // The PTX ISA's A fragment of mma.m16n8k32 with .s8 (row-major A, M = 16 outputs,
  // K = 32 rows of a step): lane 4 g + t holds four 32-bit registers a0..a3, register i
  // the four bytes k = 4 t + 16 (i / 2) + b (b = 0..3) of row m = g + 8 (i % 2) of A.
  // Lane by lane, register by register, that is where sign_fragment_byte must put the
  // sign of dy[step row k, output m]; and every byte of a step is some sign's.
  std::vector<int> seen(2 * 512, 0);
  for (int step = 0; step < 2; ++step) {
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane / 4, t = lane % 4;
      for (int i = 0; i < 4; ++i) {
        for (int b = 0; b < 4; ++b) {
          const int m = g + 8 * (i % 2), k = 4 * t + 16 * (i / 2) + b;
          const int64_t byte = nn::detail::sign_fragment_byte(32 * step + k, m);
          INFO("step " << step << ", lane " << lane << ", a" << i << " byte " << b);
          REQUIRE(byte == 512 * step + 16 * lane + 4 * i + b);
          ++seen[static_cast<size_t>(byte)];
        }
      }
    }
  }
  CHECK(std::count(seen.begin(), seen.end(), 1) == static_cast<long>(seen.size()));
}

TEST_CASE("dW from a one-magnitude dy on the GPU gives the CPU's exact bits", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  for (const Case& c : cases()) check(c);
  check(cases()[1], 3);     // strided dy and x, rows not 16-byte aligned
  check(cases()[8], 3, 0);  // 37 columns in rows of 40: aligned, a partial 16 bytes at the end
}

TEST_CASE("dW from a many-outputs one-magnitude dy on the CPU: the fixed-point sums equal the binned sums",
          "[cpu]") {
  for (const Case& c : many_outputs_cases()) check_cpu(c);
}

TEST_CASE("dW from a many-outputs one-magnitude dy on the GPU (int8 GEMM) gives the CPU's exact bits",
          "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  for (const Case& c : many_outputs_cases()) check(c);
  check(many_outputs_cases()[1], 5);  // strided dy and x
}

TEST_CASE("the many-outputs dW's bits do not depend on how its rows are cut into chunks and folds",
          "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
#ifdef SEQPAR_WITH_CUDA
  // Chunks of 128 to 640 rows (the last one partial), folded after every chunk, every
  // two or every three: each cut adds the same integers, so the same bits as the CPU.
  // x spans 2^35 in magnitude: many elements fall outside their columns' windows.
  const Case c{"many outputs, cut into chunks", 1391, 45, 150, 1.0f / 3000.0f, 0.05, -30, 5};
  const Inputs inputs = make_inputs(c, 0);
  const Tensor weight = Tensor::zeros({c.out, c.in});
  const nn::LinearGradients cpu = nn::linear_backward(inputs.dy, inputs.x, weight, false, true, false);
  const Device gpu = Device::cuda();
  const Tensor x = inputs.x.to(gpu), dy = inputs.dy.to(gpu);
  // The last two list only 1 or 8 of a chunk's many elements outside their windows, so
  // those chunks are scanned for them instead.
  const nn::detail::ManyOutputsChunks cuts[] = {{128, 128, 0}, {128, 256, 0}, {256, 768, 0}, {640, 0, 0},
                                         {0, 128, 0},   {128, 256, 8}, {0, 0, 1}};
  for (const nn::detail::ManyOutputsChunks& cut : cuts) {
    INFO("rows per chunk " << cut.rows_per_chunk << ", rows per fold " << cut.rows_per_fold
                           << ", outside list " << cut.outside_capacity);
    exact::ExactSums sums(c.out * c.in, gpu);
    nn::detail::accumulate_weight_grad_cuda(nn::detail::const_rows_of(dy), nn::detail::const_rows_of(x),
                                            sums, nullptr, cut);
    const Tensor grad_weight = test::poisoned({c.out, c.in}, gpu);
    sums.round_into(grad_weight);
    CHECK(test::bitwise_equal(grad_weight, cpu.weight));
  }
#endif
}

TEST_CASE("dW from a dy of two magnitudes takes the binned row sums, the same bits, and the host can tell", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
#ifdef SEQPAR_WITH_CUDA
  // One element of another magnitude (here 2f) is enough to leave the fixed-point path;
  // if either path missed its turn or both worked, dW would be off by a whole row's share.
  std::mt19937 random(5);
  std::normal_distribution<float> normal;
  for (const int64_t out : {16, 130}) {  // the narrow and the many-outputs one-magnitude kernels
    const int64_t rows = 2000, in = 64;
    std::vector<float> x(rows * in), dy(rows * out);
    for (float& value : x) value = normal(random);
    for (float& value : dy) value = random() % 2 ? 0.125f : -0.125f;
    // The host learns which kernel did the work when it asks: the one-magnitude one for
    // this dy, the binned one once an element has another magnitude.
    using nn::detail::WeightGradKernel;
    const Device gpu = Device::cuda();
    const auto kernel_for = [&](const std::vector<float>& dy_values) {
      exact::ExactSums sums(out * in, gpu);
      const Tensor dy_gpu = from_values(dy_values, {rows, out}).to(gpu);
      const Tensor x_gpu = from_values(x, {rows, in}).to(gpu);
      WeightGradKernel taken = WeightGradKernel::None;
      nn::detail::accumulate_weight_grad_cuda(nn::detail::const_rows_of(dy_gpu), nn::detail::const_rows_of(x_gpu),
                                              sums, nullptr, {}, &taken);
      return taken;
    };
    CHECK(kernel_for(dy) == (out == 16 ? WeightGradKernel::OneMagnitudeFewOutputs
                                       : WeightGradKernel::OneMagnitudeManyOutputs));
    dy[777] = 0.25f;
    CHECK(kernel_for(dy) == WeightGradKernel::Binned);
    const Tensor x_cpu = from_values(x, {rows, in}), dy_cpu = from_values(dy, {rows, out});
    const Tensor weight = Tensor::zeros({out, in});
    const nn::LinearGradients cpu = nn::linear_backward(dy_cpu, x_cpu, weight, false, true, true);
    const Tensor grad_weight = test::poisoned({out, in}, gpu), grad_bias = test::poisoned({out}, gpu);
    nn::detail::linear_backward_cuda(dy_cpu.to(gpu), x_cpu.to(gpu), weight.to(gpu), Tensor(),
                                     grad_weight, grad_bias);
    CHECK(test::bitwise_equal(grad_weight, cpu.weight));
    CHECK(test::bitwise_equal(grad_bias, cpu.bias));
  }
#endif
}

TEST_CASE("dW from a randn dy of many outputs takes the CRT path, the reference's bits", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
#ifdef SEQPAR_WITH_CUDA
  // With many outputs the host reads dy's words and, dy being of many magnitudes, runs
  // the CRT on int8 products (enough terms for it) instead of the one-magnitude GEMMs.
  std::mt19937 random(11);
  std::normal_distribution<float> normal;
  const int64_t rows = 3000, in = 96, out = 80;
  std::vector<float> x(rows * in), dy(rows * out);
  for (float& value : x) value = normal(random);
  for (float& value : dy) value = normal(random);
  const Tensor x_cpu = from_values(x, {rows, in}), dy_cpu = from_values(dy, {rows, out});
  const Tensor weight = Tensor::zeros({out, in});
  const nn::LinearGradients cpu = nn::linear_backward(dy_cpu, x_cpu, weight, false, true, true);
  const Device gpu = Device::cuda();
  const Tensor x_gpu = x_cpu.to(gpu), dy_gpu = dy_cpu.to(gpu);
  exact::ExactSums sums(out * in, gpu);
  nn::detail::WeightGradKernel taken = nn::detail::WeightGradKernel::None;
  nn::detail::accumulate_weight_grad_cuda(nn::detail::const_rows_of(dy_gpu), nn::detail::const_rows_of(x_gpu),
                                          sums, nullptr, {}, &taken);
  CHECK(taken == nn::detail::WeightGradKernel::Crt);
  const Tensor grad_weight = test::poisoned({out, in}, gpu);
  sums.round_into(grad_weight);
  CHECK(test::bitwise_equal(grad_weight, cpu.weight));
  // And through the public backward, db beside it.
  const Tensor grad_weight_too = test::poisoned({out, in}, gpu), grad_bias = test::poisoned({out}, gpu);
  nn::detail::linear_backward_cuda(dy_gpu, x_gpu, weight.to(gpu), Tensor(), grad_weight_too, grad_bias);
  CHECK(test::bitwise_equal(grad_weight_too, cpu.weight));
  CHECK(test::bitwise_equal(grad_bias, cpu.bias));
#endif
}
