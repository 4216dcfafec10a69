// The CRT dW on the GPU (nn/cuda/exact_dw_crt.cu) against the reference's exact sums, bit for
// bit: the cases of exact_dw_crt_util.h (subnormals, mixed binades, NaN and infinities,
// elements outside their windows, pairs past 2^129), random shapes, chunkings and list
// capacities, the seed shape with a randn dy, a shape of several int8 products, strided
// views and x's maxima handed in.
#include <catch2/catch.hpp>

#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "core/exact_sums.h"
#include "core/tensor.h"
#include "nn/cuda/exact_dw_crt.h"
#include "nn/cpu/linear.h"
#include "nn/cuda/linear.h"
#include "nn/reference/linear.h"
#ifdef SEQPAR_WITH_CUDA
#include "core/cuda_runtime.h"
#include "core/device_buffer.h"
#endif
#include "tests/cuda_test_util.h"
#include "tests/nn/exact_dw_crt_util.h"
#include "tests/test_util.h"

using namespace seqpar;
using namespace seqpar::test::crt_dw;

#ifdef SEQPAR_WITH_CUDA
namespace {

uint64_t case_seed(uint64_t base) {
  return base + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(Catch::rngSeed());
}

// The exact sums of dW for host dy and x: the plain reference for small shapes, the
// CPU's general binned loops (tested against it, the same exact values) for large ones.
exact::ExactSums expected_sums(const Tensor& dy, const Tensor& x) {
  const int64_t count = dy.size(1) * x.size(1);
  exact::ExactSums sums(count, Device::cpu());
  const auto dy_rows = nn::detail::const_rows_of(dy), x_rows = nn::detail::const_rows_of(x);
  if (count * x.size(0) <= (int64_t{1} << 24)) {
    nn::reference::linear_weight_sums(dy_rows, x_rows, sums, 0);
  } else {
    nn::detail::accumulate_weight_grad_cpu(dy_rows, x_rows, sums, nn::detail::WeightGradPath::General);
  }
  return sums;
}

// A copy of `t` on the GPU, as a window of a buffer `pad` floats wider (pad 0: contiguous).
Tensor on_gpu(const Tensor& t, int64_t pad) {
  const Device gpu = Device::cuda();
  if (pad == 0) return t.to(gpu);
  Tensor wide = Tensor::zeros({t.size(0), t.size(1) + pad}, gpu);
  Tensor window = wide.narrow(1, pad / 2, t.size(1));
  window.copy_(t);
  return window;
}

// The GPU's sums (into sums of which dW's are the first out * in, like dW + db) against
// the expected ones: the same exact values, the same bits once rounded.
void check_gpu(const Tensor& dy, const Tensor& x, const exact::ExactSums& expected,
               const nn::detail::CrtChunks& chunks, int64_t pad = 0, bool hand_in_maxima = false) {
  INFO("rows per product " << chunks.rows_per_product << ", outside capacity " << chunks.outside_capacity
                           << ", pad " << pad << ", maxima handed in " << hand_in_maxima);
  const int64_t out = dy.size(1), in = x.size(1), count = out * in;
  const Tensor dy_gpu = on_gpu(dy, pad), x_gpu = on_gpu(x, pad);
  const auto x_rows = nn::detail::const_rows_of(x_gpu);
  exact::ExactSums sums(count + out, Device::cuda());  // extra sums after dW's stay zero
  DeviceBuffer<unsigned int> x_largest(in, Device::cuda());
  if (hand_in_maxima) {
    x_largest.zero();
    nn::detail::column_maxima_cuda(x_rows, x_largest.data(), nullptr, cuda::current_stream(Device::cuda().index));
  }
  nn::detail::accumulate_weight_grad_crt_cuda(nn::detail::const_rows_of(dy_gpu), x_rows, sums,
                                              hand_in_maxima ? x_largest.data() : nullptr, chunks);
  const std::vector<int64_t> got = sums.to_host();
  CHECK(differing_sums(got, count + out, expected.to_host(), count, count) == 0);
  for (int64_t i = count; i < count + out; ++i) {
    for (int d = 0; d < exact::kDigits; ++d) CHECK(got[static_cast<size_t>(d * (count + out) + i)] == 0);
  }
  const Tensor rounded = test::poisoned({out, in}, Device::cuda());
  Tensor reference = Tensor::empty({out, in});
  sums.round_into(rounded, 0);
  expected.round_into(reference);
  CHECK(test::bitwise_equal(rounded.to(Device::cpu()), reference));
}

void check_case(const Case& c, uint64_t seed, const std::vector<nn::detail::CrtChunks>& cuts) {
  INFO(c.name << ": " << c.rows << " x " << c.in << " -> " << c.out << ", seed " << seed);
  std::mt19937_64 rng(seed);
  const Tensor dy = matrix(rng, c.rows, c.out, c.dy), x = matrix(rng, c.rows, c.in, c.x);
  const exact::ExactSums expected = expected_sums(dy, x);
  for (const nn::detail::CrtChunks& cut : cuts) check_gpu(dy, x, expected, cut);
}

}  // namespace
#endif

TEST_CASE("crt dW on the GPU gives the reference's exact sums", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
#ifdef SEQPAR_WITH_CUDA
  // Whole, in products of 64 and of 100 rows, and with lists of 1 or 3 elements (so
  // that chunks with more outside elements are scanned instead).
  const std::vector<nn::detail::CrtChunks> cuts = {{0, 0}, {64, 0}, {100, 3}, {0, 1}};
  uint64_t seed = case_seed(100);
  for (const Case& c : cases()) check_case(c, seed++, cuts);
#endif
}

TEST_CASE("crt dW on the GPU at random shapes and exponent ranges", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
#ifdef SEQPAR_WITH_CUDA
  std::mt19937_64 rng(case_seed(200));
  const auto uniform = [&](int64_t low, int64_t high) {
    return std::uniform_int_distribution<int64_t>(low, high)(rng);
  };
  for (int n = 0; n < 30; ++n) {
    const auto spread = [&] {
      const int low = static_cast<int>(uniform(-140, 100));
      return Spread{low, low + static_cast<int>(uniform(0, 40)), n % 3 == 0 ? 0.05 : 0.0, n % 4 == 0 ? 0.005 : 0.0};
    };
    const Case c{"random", uniform(1, 3000), uniform(1, 150), uniform(1, 90), spread(), spread()};
    check_case(c, rng(), {{0, 0}, {uniform(1, 700), uniform(1, 50)}});
  }
#endif
}

TEST_CASE("crt dW on the GPU: the seed shape with a randn dy, strided views, maxima handed in", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
#ifdef SEQPAR_WITH_CUDA
  std::mt19937_64 rng(case_seed(300));
  const Tensor dy = matrix(rng, 12000, 16, {0, 0}), x = matrix(rng, 12000, 640, {0, 0});
  const exact::ExactSums expected = expected_sums(dy, x);
  check_gpu(dy, x, expected, {});
  check_gpu(dy, x, expected, {}, 3);
  check_gpu(dy, x, expected, {}, 0, true);
  check_gpu(dy, x, expected, {4096, 0}, 5, true);
#endif
}

TEST_CASE("crt dW on the GPU: rows over several int8 products", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
#ifdef SEQPAR_WITH_CUDA
  // 300,000 rows: three products of crt::kRowsPerProduct, the last partial, folded
  // modulo each m between them; 13 moduli.
  std::mt19937_64 rng(case_seed(400));
  const Tensor dy = matrix(rng, 300000, 48, {-2, 2}), x = matrix(rng, 300000, 72, {-4, 4, 0.0, 1e-6});
  const exact::ExactSums expected = expected_sums(dy, x);
  check_gpu(dy, x, expected, {});
  check_gpu(dy, x, expected, {50000, 16});
#endif
}

TEST_CASE("crt dW on the GPU: every pair past 2^129 takes the binned sum, the same bits", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
#ifdef SEQPAR_WITH_CUDA
  // Every column of both near 2^64 or more: no pair has an integer part; the products
  // overflow to infinity where the reference's do. Then one x column of an infinity
  // (no window: every element outside) beside ordinary ones.
  std::mt19937_64 rng(case_seed(500));
  const Case huge{"huge", 500, 21, 7, {64, 70}, {64, 66}};
  check_case(huge, rng(), {{0, 0}, {128, 2}});
  Tensor x = matrix(rng, 400, 33, {-3, 3});
  x.data()[5 * 33 + 7] = std::numeric_limits<float>::infinity();
  const Tensor dy = matrix(rng, 400, 9, {-3, 3, 0.05});
  check_gpu(dy, x, expected_sums(dy, x), {});
  check_gpu(dy, x, expected_sums(dy, x), {64, 8});
#endif
}
