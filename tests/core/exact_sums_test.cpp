// core/exact_sums.h: ExactSums on the CPU (of_values, add, copy_from, round_into,
// check_term_count), the cross-rank scopes, and ExactSums on the GPU against the CPU,
// checked against the independent reference of tests/exact_reference.h. The arithmetic
// of the sums themselves: tests/core/exact_bins_test.cpp.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "core/exact_bins.h"
#include "core/exact_sums.h"
#include "core/tensor.h"
#include "tests/cuda_test_util.h"
#include "tests/exact_reference.h"
#include "tests/test_util.h"

using namespace seqpar;
using exact::kDigits;
using test::exact_reference;
using test::random_float;
using test::same_bits;

namespace {

const float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kMax = std::numeric_limits<float>::max();

}  // namespace

// ---------------------------------------------------------------- 5. ExactSums

namespace {

// Every float in a strided sweep over all bit patterns (all exponents, subnormals,
// both signs, infinities and NaNs), plus the edges.
std::vector<float> float_sweep(uint32_t start, uint32_t step) {
  std::vector<float> values;
  for (uint64_t bits = start; bits <= 0xffffffffu; bits += step) {
    const uint32_t b = static_cast<uint32_t>(bits);
    float value;
    std::memcpy(&value, &b, sizeof value);
    values.push_back(value);
  }
  const float edges[] = {0.0f, -0.0f, std::numeric_limits<float>::denorm_min(),
                         -std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min(),
                         -std::numeric_limits<float>::min(), kMax, -kMax, kInf, -kInf, kNaN,
                         std::nextafter(std::numeric_limits<float>::min(), 0.0f), 1.0f, -1.0f};
  values.insert(values.end(), std::begin(edges), std::end(edges));
  return values;
}

float plus_zero(float value) { return value == 0 ? 0.0f : value; }

}  // namespace

TEST_CASE("ExactSums::of_values rounds back to the values themselves", "[exact][cpu]") {
  const uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const std::vector<float> values =
      float_sweep(std::uniform_int_distribution<uint32_t>(0, 4000)(rng), 4001);
  const Tensor input = Tensor::from_data({static_cast<int64_t>(values.size())}, values);
  const exact::ExactSums sums = exact::ExactSums::of_values(input);
  REQUIRE(sums.count() == input.numel());
  const Tensor out = Tensor::full({input.numel()}, 123.0f);
  sums.round_into(out);
  const std::vector<float> rounded = out.to_vector();
  int64_t mismatches = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    if (!same_bits(rounded[i], plus_zero(values[i]))) {
      if (++mismatches <= 5) {
        uint32_t bits;
        std::memcpy(&bits, &values[i], sizeof bits);
        FAIL_CHECK("value bits 0x" << std::hex << bits << std::dec << " (" << values[i]
                                   << ") rounded to " << rounded[i]);
      }
    }
  }
  CHECK(mismatches == 0);
  // -0 becomes +0 bitwise.
  const Tensor negative_zero = Tensor::from_data({1}, {-0.0f});
  const Tensor zero_out = Tensor::full({1}, 1.0f);
  exact::ExactSums::of_values(negative_zero).round_into(zero_out);
  const float z = zero_out.item();
  CHECK(same_bits(z, 0.0f));
  CHECK_FALSE(std::signbit(z));
  // A strided (non-contiguous) input.
  const Tensor matrix = Tensor::from_data({2, 3}, {1, 2, 3, 4, 5, 6});
  const Tensor column = matrix.narrow(1, 1, 1);
  const Tensor column_out = Tensor::zeros({2});
  exact::ExactSums::of_values(column).round_into(column_out);
  CHECK(column_out.to_vector() == std::vector<float>{2, 5});
}

TEST_CASE("ExactSums: two of_values added round to the exactly rounded sum", "[exact][cpu]") {
  const uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const int64_t count = 20000;
  std::vector<float> a(count), b(count);
  const std::vector<float> specials = {0.0f, -0.0f, kInf, -kInf, kNaN, kMax, -kMax,
                                       std::numeric_limits<float>::denorm_min()};
  std::uniform_int_distribution<int> kind(0, 9);
  std::uniform_int_distribution<size_t> pick(0, specials.size() - 1);
  for (int64_t i = 0; i < count; ++i) {
    a[i] = random_float(rng, -149, 127);
    // b: near a's magnitude (cancellation, ties), anywhere, or special.
    const int k = kind(rng);
    if (k < 4) {
      b[i] = -a[i] * (1.0f + random_float(rng, -30, -1));
    } else if (k < 8) {
      b[i] = random_float(rng, -149, 127);
    } else {
      b[i] = specials[pick(rng)];
    }
    if (kind(rng) == 0) std::swap(a[i], b[i]);
  }
  exact::ExactSums sums = exact::ExactSums::of_values(Tensor::from_data({count}, a));
  const exact::ExactSums other = exact::ExactSums::of_values(Tensor::from_data({count}, b));
  sums.add(other);
  const Tensor out = Tensor::full({count}, kNaN);
  sums.round_into(out);
  const std::vector<float> got = out.to_vector();
  int64_t mismatches = 0;
  for (int64_t i = 0; i < count; ++i) {
    // Two references: GMP/MPFR, and the hardware's own correctly rounded a + b
    // (IEEE, round to nearest even), whose exact zeros the sums make +0.
    const float want = exact_reference<float>({a[i], b[i]});
    const float hardware = plus_zero(a[i] + b[i]);
    if (!same_bits(got[i], want) || !same_bits(want, hardware)) {
      if (++mismatches <= 5) {
        FAIL_CHECK(a[i] << " + " << b[i] << ": got " << got[i] << ", reference " << want
                        << ", hardware " << hardware);
      }
    }
  }
  CHECK(mismatches == 0);

  // copy_from gives the same digits; add and copy_from refuse mismatched counts.
  exact::ExactSums copy(count, Device::cpu());
  copy.copy_from(sums);
  CHECK(copy.to_host() == sums.to_host());
  exact::ExactSums wrong(count + 1, Device::cpu());
  CHECK_THROWS_AS(wrong.add(sums), Error);
  CHECK_THROWS_AS(wrong.copy_from(sums), Error);
  CHECK_THROWS_AS(sums.round_into(Tensor::zeros({count + 1})), Error);

  // A part of the sums rounds to that part of the whole's rounding; a part past the end,
  // or a strided output, is refused naming the range.
  const Tensor whole = Tensor::empty({count});
  sums.round_into(whole);
  const int64_t first = count / 3, length = count / 2;
  const Tensor part = test::poisoned({length}, Device::cpu());
  sums.round_into(part, first);
  CHECK(test::bitwise_equal(part, whole.narrow(0, first, length)));
  CHECK_THROWS_WITH(sums.round_into(Tensor::zeros({length}), count - length + 1),
                    Catch::Contains("sums " + std::to_string(count - length + 1)));
  CHECK_THROWS_WITH(sums.round_into(Tensor::zeros({4, 2}).narrow(1, 0, 1), 0),
                    Catch::Contains("strided"));
}

TEST_CASE("check_term_count allows kMaxTerms and names the op above it", "[exact][cpu]") {
  CHECK_NOTHROW(exact::check_term_count("some_op", 0));
  CHECK_NOTHROW(exact::check_term_count("some_op", exact::kMaxTerms));
  CHECK_THROWS_AS(exact::check_term_count("some_op", exact::kMaxTerms + 1), Error);
  CHECK_THROWS_WITH(exact::check_term_count("some_op", exact::kMaxTerms + 1),
                    Catch::Contains("some_op") && Catch::Contains(std::to_string(exact::kMaxTerms + 1)) &&
                        Catch::Contains(std::to_string(exact::kMaxTerms)));
  CHECK_THROWS_WITH(exact::check_term_count("l1_loss", int64_t{1} << 40), Catch::Contains("l1_loss"));
  // kMaxTerms terms of the largest in-bin part stay within int64 digits.
  CHECK(exact::kMaxTerms * (int64_t{1} << (exact::kBinBits - 1)) <=
        std::numeric_limits<int64_t>::max() / 2 + 1);
}

// ---------------------------------------------------------------- 7. CUDA

namespace {

std::vector<float> random_values_with_specials(std::mt19937_64& rng, int64_t count) {
  std::vector<float> values(static_cast<size_t>(count));
  const std::vector<float> specials = {0.0f, -0.0f, kInf, -kInf, kNaN, kMax, -kMax,
                                       std::numeric_limits<float>::denorm_min(),
                                       -std::numeric_limits<float>::min()};
  std::uniform_int_distribution<int> kind(0, 19);
  std::uniform_int_distribution<size_t> pick(0, specials.size() - 1);
  for (float& value : values) {
    value = kind(rng) == 0 ? specials[pick(rng)] : random_float(rng, -149, 127);
  }
  return values;
}

}  // namespace


TEST_CASE("ExactSums on a GPU give the CPU's digits and bits", "[exact][cuda]") {
  SEQPAR_REQUIRE_CUDA();
  const uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const Device gpu = Device::cuda(0);
  for (const int64_t count : {int64_t{0}, int64_t{1}, int64_t{257}, int64_t{100003}}) {
    CAPTURE(count);
    const std::vector<float> a = random_values_with_specials(rng, count);
    const std::vector<float> b = random_values_with_specials(rng, count);
    const Tensor a_cpu = Tensor::from_data({count}, a), b_cpu = Tensor::from_data({count}, b);
    exact::ExactSums cpu = exact::ExactSums::of_values(a_cpu);
    exact::ExactSums on_gpu = exact::ExactSums::of_values(a_cpu.to(gpu));
    REQUIRE(on_gpu.device() == gpu);
    CHECK(on_gpu.to_host() == cpu.to_host());

    // round_into: the values themselves, as on the CPU.
    const Tensor gpu_out = seqpar::test::poisoned({count}, gpu);
    on_gpu.round_into(gpu_out);
    const Tensor cpu_out = Tensor::full({count}, kNaN);
    cpu.round_into(cpu_out);
    const std::vector<float> g = gpu_out.to_vector(), c = cpu_out.to_vector();
    for (int64_t i = 0; i < count; ++i) {
      if (!same_bits(g[i], c[i]) || !same_bits(c[i], plus_zero(a[i]))) {
        FAIL("element " << i << ": " << a[i] << " rounded to " << g[i] << " (GPU), " << c[i] << " (CPU)");
      }
    }

    // add and round_into.
    cpu.add(exact::ExactSums::of_values(b_cpu));
    on_gpu.add(exact::ExactSums::of_values(b_cpu.to(gpu)));
    CHECK(on_gpu.to_host() == cpu.to_host());
    const Tensor gpu_sum = seqpar::test::poisoned({count}, gpu);
    on_gpu.round_into(gpu_sum);
    const Tensor cpu_sum = Tensor::full({count}, kNaN);
    cpu.round_into(cpu_sum);
    const std::vector<float> gs = gpu_sum.to_vector(), cs = cpu_sum.to_vector();
    for (int64_t i = 0; i < count; ++i) {
      const float want = exact_reference<float>({a[i], b[i]});
      if (!same_bits(gs[i], cs[i]) || !same_bits(cs[i], want)) {
        FAIL("element " << i << ": " << a[i] << " + " << b[i] << " gave " << gs[i] << " (GPU), "
                        << cs[i] << " (CPU), reference " << want);
      }
    }

    // copy_from on the GPU.
    exact::ExactSums copy(count, gpu);
    copy.copy_from(on_gpu);
    CHECK(copy.to_host() == cpu.to_host());
  }
}

TEST_CASE("ExactSums on a GPU: more sums than one grid covers", "[exact][cuda]") {
  SEQPAR_REQUIRE_CUDA();
  // blocks_for() clamps at 65536 blocks of 256 threads: the kernels' loops must stride.
  const int64_t count = int64_t{65536} * 256 + 1001;
  const Device gpu = Device::cuda(0);
  std::vector<float> values(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) values[i] = static_cast<float>(i % 1000003) * 0.25f - 7.0f;
  const Tensor input = Tensor::from_data({count}, values, gpu);
  exact::ExactSums sums = exact::ExactSums::of_values(input);
  sums.add(exact::ExactSums::of_values(input));
  const Tensor out = seqpar::test::poisoned({count}, gpu);
  sums.round_into(out);
  const std::vector<float> got = out.to_vector();
  int64_t mismatches = 0;
  for (int64_t i = 0; i < count; ++i) mismatches += !same_bits(got[i], plus_zero(2 * values[i]));
  CHECK(mismatches == 0);
}
