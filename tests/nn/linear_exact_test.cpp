// Linear's canonical numerics (nn/cpu/linear.h, docs/numerics.md), each property
// on fresh random inputs, through the public API of nn/linear.h alone:
//
//   - dW and db do not depend on how the rows are split over ranks (shards run one
//     after another, their digits added by a simulated all-reduce, the test doubles of
//     tests/nn/linear_exact_util.h), nor on the order of the rows;
//   - dW and db are the exact sums of their terms rounded once to float32, against an
//     independent reference (tests/exact_reference.h: GMP rationals, rounded by MPFR or
//     by hand).
// The forward's and dx's chains, and the GPU's bits, are linear_chains_test.cpp's.
//
// The inputs come from std::mt19937_64 seeded per test case with a base seed mixed with
// Catch's --rng-seed (0 unless given): the default run is reproducible, and
// `--rng-seed time` draws fresh inputs. Every case reports its seed with INFO.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "tests/nn/linear_exact_util.h"

using namespace seqpar;
using namespace seqpar::test::linear_exact;


// ---------------------------------------------------------------- 1. partitions

TEST_CASE("linear_backward: dW and db do not depend on the split of the rows over ranks",
          "[exact][cpu]") {
  const uint64_t seed = case_seed(0x51a4d);
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  for (const Shape3& shape : random_shapes(rng, 9)) {
    INFO(describe(shape));
    const int spread = static_cast<int>(uniform(rng, 0, 20));
    INFO("spread 2^+-" << spread);
    const Tensor x = random_matrix(rng, shape.rows, shape.in, spread);
    const Tensor grad_y = random_matrix(rng, shape.rows, shape.out, spread);
    const Tensor weight = random_matrix(rng, shape.out, shape.in, 0);
    RecordingCombiner full;
    const nn::LinearGradients expected = recorded_backward(grad_y, x, weight, full);
    // Without a group, the same bits.
    const nn::LinearGradients alone = nn::linear_backward(grad_y, x, weight, false, true, true);
    CHECK_SAME_BITS(alone.weight, expected.weight);
    CHECK_SAME_BITS(alone.bias, expected.bias);
    for (int kind = 0; kind < 4; ++kind) {
      check_sharded(grad_y, x, weight, random_partition(rng, shape.rows, kind), expected, full);
    }
  }
}

TEST_CASE("the simulated all-reduce is not vacuous: a shard alone gives its own partial sums",
          "[exact][cpu]") {
  // Without the other shards' digits, a shard's dW is not the full batch's: the check
  // above would fail if the combiner were never called or added nothing.
  const uint64_t seed = case_seed(0x5eed);
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const Tensor x = random_matrix(rng, 100, 13, 0), grad_y = random_matrix(rng, 100, 5, 0);
  const Tensor weight = random_matrix(rng, 5, 13, 0);
  const nn::LinearGradients full = nn::linear_backward(grad_y, x, weight, false, true, true);
  const nn::LinearGradients first = nn::linear_backward(grad_y.narrow(0, 0, 60), x.narrow(0, 0, 60),
                                                        weight, false, true, true);
  CHECK_FALSE(describe_difference(first.weight, full.weight).empty());
  CHECK_FALSE(describe_difference(first.bias, full.bias).empty());
  // And with its digits combined with a recording of the rest, it is.
  std::vector<RecordingCombiner> ranks(2);
  for (int s = 0; s < 2; ++s) {
    ranks[static_cast<size_t>(s)].calls.push_back(nn::linear_row_sums(
        grad_y.narrow(0, s * 60, s == 0 ? 60 : 40), x.narrow(0, s * 60, s == 0 ? 60 : 40), true, true));
  }
  const nn::LinearGradients combined =
      all_reduced_backward(ranks, 0, grad_y.narrow(0, 0, 60), x.narrow(0, 0, 60), weight);
  CHECK_SAME_BITS(combined.weight, full.weight);
  CHECK_SAME_BITS(combined.bias, full.bias);
}

// ---------------------------------------------------------------- 2. row order

TEST_CASE("linear_backward: dW and db do not depend on the order of the rows", "[exact][cpu]") {
  const uint64_t seed = case_seed(0x0fde7);
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  for (const Shape3& shape : random_shapes(rng, 8)) {
    INFO(describe(shape));
    const int spread = static_cast<int>(uniform(rng, 0, 30));
    INFO("spread 2^+-" << spread);
    const Tensor x = random_matrix(rng, shape.rows, shape.in, spread);
    const Tensor grad_y = random_matrix(rng, shape.rows, shape.out, spread);
    const Tensor weight = random_matrix(rng, shape.out, shape.in, 0);
    RecordingCombiner recorded, recorded_shuffled;
    const nn::LinearGradients expected = recorded_backward(grad_y, x, weight, recorded);
    for (const bool reverse : {false, true}) {
      INFO((reverse ? "reversed" : "shuffled"));
      std::vector<int64_t> order(static_cast<size_t>(shape.rows));
      std::iota(order.begin(), order.end(), 0);
      if (reverse) {
        std::reverse(order.begin(), order.end());
      } else {
        std::shuffle(order.begin(), order.end(), rng);
      }
      RecordingCombiner permuted_digits;
      const nn::LinearGradients permuted = recorded_backward(
          gather_rows(grad_y, order), gather_rows(x, order), weight, permuted_digits);
      CHECK_SAME_BITS(permuted.weight, expected.weight);
      CHECK_SAME_BITS(permuted.bias, expected.bias);
      CHECK_SAME_BITS(permuted.x, gather_rows(expected.x, order));  // dx rows move with their rows
      // The same exact values (dW's sums and db's, one combine), not only roundings.
      const int64_t count = recorded.calls[0].count();
      const std::vector<int64_t> a = recorded.calls[0].to_host();
      const std::vector<int64_t> b = permuted_digits.calls[0].to_host();
      int64_t differing = 0;
      for (int64_t i = 0; i < count; ++i) {
        if (digits_value(a, count, i) != digits_value(b, count, i)) ++differing;
      }
      CHECK(differing == 0);
    }
  }
}

// ---------------------------------------------------------------- 3. accuracy

namespace {

// dW and db of linear_backward against the reference: the rounded bits, and the exact
// (unrounded) values of its row sums (linear_row_sums).
void check_against_reference(const Tensor& grad_y, const Tensor& x) {
  const Tensor weight = Tensor::ones({grad_y.size(1), x.size(1)});  // dW and db ignore it
  RecordingCombiner recorder;
  const nn::LinearGradients gradients = recorded_backward(grad_y, x, weight, recorder);
  const ReferenceGradients reference = reference_gradients(grad_y, x);
  CHECK_SAME_BITS(gradients.weight, reference.weight);
  CHECK_SAME_BITS(gradients.bias, reference.bias);
  // One combine: dW's sums, then db's.
  std::vector<mpz_class> exact_values = reference.exact_weight;
  exact_values.insert(exact_values.end(), reference.exact_bias.begin(), reference.exact_bias.end());
  const int64_t count = recorder.calls[0].count();
  const std::vector<int64_t> digits = recorder.calls[0].to_host();
  REQUIRE(static_cast<size_t>(count) == exact_values.size());
  int64_t differing = 0, first = -1, flagged = 0;
  for (int64_t i = 0; i < count; ++i) {
    if (digits[static_cast<size_t>(exact::kSpecialDigit * count + i)] != 0) ++flagged;
    if (digits_value(digits, count, i) != exact_values[static_cast<size_t>(i)] && differing++ == 0) {
      first = i;
    }
  }
  INFO(differing << " exact sums differ, the first at " << first << " (dW's "
                 << reference.exact_weight.size() << " sums, then db's)");
  CHECK(differing == 0);
  CHECK(flagged == 0);  // no sum saw a non-finite term
}

}  // namespace

TEST_CASE("linear_backward: dW and db are the exact sums rounded once (random, many binades)",
          "[exact][cpu]") {
  const uint64_t seed = case_seed(0xacc0);
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 24; ++trial) {
    const Shape3 shape{uniform(rng, 1, 300), uniform(rng, 1, 24), uniform(rng, 1, 9)};
    const int spread = 10 * (trial % 4);  // up to 2^+-30 each, products to 2^+-60
    INFO("trial " << trial << ", " << describe(shape) << ", spread 2^+-" << spread);
    check_against_reference(random_matrix(rng, shape.rows, shape.out, spread),
                            random_matrix(rng, shape.rows, shape.in, spread));
  }
}

TEST_CASE("linear_backward: dW and db round once through cancellation and ties", "[exact][cpu]") {
  const uint64_t seed = case_seed(0xcace1);
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const float tiny = std::ldexp(1.0f, -24), tinier = std::ldexp(1.0f, -80);
  SECTION("fixed cases with known results") {
    // dy column 0: 1e8, 1, -1e8 (a float sum in this order gives 0, the exact sum is 1);
    // column 1: 1, 2^-24, 2^-80 (a double sum stops at the tie 1 + 2^-24 and rounds to
    // 1; the exact sum is above the tie and rounds up); x: ones and threes.
    const Tensor grad_y = Tensor::from_data({3, 2}, {1e8f, 1.0f, 1.0f, tiny, -1e8f, tinier});
    const Tensor x = Tensor::from_data({3, 2}, {1.0f, 3.0f, 1.0f, 3.0f, 1.0f, 3.0f});
    const nn::LinearGradients g =
        nn::linear_backward(grad_y, x, Tensor::ones({2, 2}), false, true, true);
    const float above_one = std::nextafter(1.0f, 2.0f);
    // 3 (1 + 2^-24 + 2^-80) = 3 + 3 2^-24 + ...: the float above 3 + 2^-23 (3's ulp is 2^-22).
    const float above_three = std::nextafter(3.0f, 4.0f);
    CHECK(g.bias.to_vector() == std::vector<float>{1.0f, above_one});
    CHECK(g.weight.to_vector() == std::vector<float>{1.0f, 3.0f, above_one, above_three});
    check_against_reference(grad_y, x);
  }
  SECTION("cancelling columns in dy, then in x, amid random rows") {
    for (int trial = 0; trial < 8; ++trial) {
      const int64_t rows = uniform(rng, 3, 200), in = uniform(rng, 1, 12), out = uniform(rng, 1, 7);
      INFO("trial " << trial << ", rows " << rows << ", in " << in << ", out " << out);
      std::vector<float> dy = spread_values(rng, rows * out, 3), xv = spread_values(rng, rows * in, 3);
      const bool in_dy = trial % 2 == 0;
      std::vector<float>& target = in_dy ? dy : xv;
      const int64_t cols = in_dy ? out : in;
      const int64_t col = uniform(rng, 0, cols - 1);
      std::vector<float>& other = in_dy ? xv : dy;
      const int64_t other_cols = in_dy ? in : out;
      // Triples big, small, -big (the row of -big a copy of the row of big in the other
      // factor, so their products cancel exactly), shuffled among the other rows: the
      // small terms and the rest survive; a float or double sum in row order loses them.
      for (int64_t i = 0; i < rows; ++i) target[i * cols + col] = std::ldexp(1.0f, -40) * float(i % 3);
      for (int t = 0; t + 2 < rows && t < 30; t += 3) {
        std::copy(other.begin() + t * other_cols, other.begin() + (t + 1) * other_cols,
                  other.begin() + (t + 2) * other_cols);
        const float big = std::ldexp(1.0f + float(uniform(rng, 0, 1023)) / 1024.0f,
                                     static_cast<int>(uniform(rng, 20, 60)));
        const float small = static_cast<float>(uniform(rng, -7, 7));
        target[t * cols + col] = big;
        target[(t + 1) * cols + col] = small;
        target[(t + 2) * cols + col] = -big;
      }
      std::vector<int64_t> order(static_cast<size_t>(rows));
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      check_against_reference(gather_rows(Tensor::from_data({rows, out}, dy), order),
                              gather_rows(Tensor::from_data({rows, in}, xv), order));
    }
  }
  SECTION("terms from 2^-100 to 2^120 in one sum") {
    for (int trial = 0; trial < 6; ++trial) {
      INFO("trial " << trial);
      const int64_t rows = uniform(rng, 1, 100), in = uniform(rng, 1, 9), out = uniform(rng, 1, 5);
      INFO("rows " << rows << ", in " << in << ", out " << out);
      // Factors 2^e times a value in [1, 2), e in [-50, 59]: products 2^-100 .. 2^120,
      // so each sum mixes terms some 2^200 apart and its rounding depends on the small ones.
      std::uniform_int_distribution<int> exponent(-50, 59);
      std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
      auto draw = [&](int64_t count) {
        std::vector<float> values(static_cast<size_t>(count));
        for (float& v : values) v = (rng() & 1 ? -1.0f : 1.0f) * std::ldexp(mantissa(rng), exponent(rng));
        return values;
      };
      const std::vector<float> dy = draw(rows * out), xv = draw(rows * in);
      check_against_reference(Tensor::from_data({rows, out}, dy), Tensor::from_data({rows, in}, xv));
    }
  }
}

TEST_CASE("linear_backward: subnormal products on the 2^-149 grid are summed exactly",
          "[exact][cpu]") {
  const uint64_t seed = case_seed(0x5b9);
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 8; ++trial) {
    const int64_t rows = uniform(rng, 1, 200), in = uniform(rng, 1, 10), out = uniform(rng, 1, 6);
    INFO("trial " << trial << ", rows " << rows << ", in " << in << ", out " << out);
    std::vector<float> dy(static_cast<size_t>(rows * out)), xv(static_cast<size_t>(rows * in));
    if (trial % 2 == 0) {
      // x = a 2^-75, dy = b 2^-74 (small integers a, b): normal factors whose products
      // a b 2^-149 lie far below float32's normal range, on the grid.
      for (float& v : xv) v = std::ldexp(static_cast<float>(uniform(rng, -1000, 1000)), -75);
      for (float& v : dy) v = std::ldexp(static_cast<float>(uniform(rng, -1000, 1000)), -74);
    } else {
      // Subnormal dy (db sums them), x small integers: products subnormal multiples of 2^-149.
      for (float& v : xv) v = static_cast<float>(uniform(rng, -9, 9));
      for (float& v : dy) v = std::ldexp(static_cast<float>(uniform(rng, -5000, 5000)), -149);
    }
    check_against_reference(Tensor::from_data({rows, out}, dy), Tensor::from_data({rows, in}, xv));
  }
}

TEST_CASE("linear_backward: products below the grid are rounded to it, ties to even",
          "[exact][cpu]") {
  // The domain's rule (core/exact_bins.h): 3 2^-150 is 1.5 units of 2^-149, a tie that
  // goes to 2 units; 2^-150 is half a unit, a tie that goes to 0; 5 2^-151 = 1.25 units
  // goes to 1. Each row's term is rounded on its own before the sum.
  const float x_small = std::ldexp(1.0f, -100);
  const Tensor x = Tensor::from_data({3, 1}, {x_small, x_small, x_small});
  const Tensor grad_y = Tensor::from_data(
      {3, 3}, {std::ldexp(3.0f, -50), std::ldexp(1.0f, -50), std::ldexp(5.0f, -51),  //
               std::ldexp(3.0f, -50), std::ldexp(1.0f, -50), std::ldexp(5.0f, -51),  //
               std::ldexp(3.0f, -50), std::ldexp(1.0f, -50), std::ldexp(5.0f, -51)});
  const nn::LinearGradients g = nn::linear_backward(grad_y, x, Tensor::ones({3, 1}), false, true, false);
  const float unit = std::ldexp(1.0f, -149);
  CHECK(g.weight.to_vector() == std::vector<float>{6 * unit, 0.0f, 3 * unit});
  check_against_reference(grad_y, x);
}
