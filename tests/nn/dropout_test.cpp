// Dropout (nn/dropout.h) against a float64 reference that reads the mask's uniform
// values through Generator (an independent path to the same Philox stream), its
// statistics, its gradient, and the property sequence parallelism needs: a shard that
// passes its first global row draws exactly the rows' part of the whole sequence's mask.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "autograd/node.h"
#include "autograd/variable.h"
#include "core/error.h"
#include "core/generator.h"
#include "core/philox.h"
#include "nn/dropout.h"
#include "tests/test_util.h"

using namespace seqpar;
using autograd::Variable;
using Catch::Matchers::Contains;

namespace {

// The mask and values as nn/dropout.h defines them, computed without its code: the
// uniform values of positions offset + r * m + c come from Generator (which reads the
// stream through HostStream::at and philox::uniform), the keep probability and the
// scale in double, each rounded to float once, and the product in double rounded once
// (a product of two floats is exact in double).
struct Reference {
  std::vector<bool> kept;
  std::vector<float> values;
};

Reference reference_dropout(const Tensor& input, float p, uint64_t seed, uint64_t offset,
                            int64_t first_row) {
  const int64_t rows = input.size(0), columns = input.size(1);
  const float keep = static_cast<float>(1.0 - static_cast<double>(p));
  const float scale = static_cast<float>(1.0 / static_cast<double>(keep));
  Generator generator(seed, offset + static_cast<uint64_t>(first_row * columns));
  const std::vector<float> u = generator.uniform({rows, columns}, 0.0f, 1.0f).to_vector();
  const std::vector<float> x = input.contiguous().to_vector();
  Reference reference{std::vector<bool>(x.size()), std::vector<float>(x.size())};
  for (size_t i = 0; i < x.size(); ++i) {
    reference.kept[i] = u[i] <= keep;
    reference.values[i] =
        reference.kept[i] ? static_cast<float>(static_cast<double>(x[i]) * static_cast<double>(scale))
                          : 0.0f;
  }
  return reference;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

uint64_t fresh_seed() { return std::random_device{}(); }

}  // namespace

TEST_CASE("dropout's keep probability, scale and threshold", "[nn][dropout]") {
  for (const float p : {0.0f, 0.1f, 0.25f, 0.5f, 0.9f, 1e-7f, 0.99999994f}) {
    CAPTURE(p);
    const float keep = static_cast<float>(1.0 - static_cast<double>(p));
    CHECK(nn::dropout_keep_probability(p) == keep);
    CHECK(nn::dropout_scale(p) == static_cast<float>(1.0 / static_cast<double>(keep)));
    // The threshold is the last word whose uniform value is at most keep.
    const uint32_t threshold = nn::dropout_keep_threshold(p);
    CHECK(philox::uniform(threshold) <= keep);
    if (threshold != std::numeric_limits<uint32_t>::max()) {
      CHECK(philox::uniform(threshold + 1) > keep);
    }
  }
  CHECK(nn::dropout_keep_threshold(0.0f) == std::numeric_limits<uint32_t>::max());
  CHECK(nn::dropout_scale(0.0f) == 1.0f);
  CHECK(nn::dropout_scale(0.5f) == 2.0f);
  CHECK(nn::dropout_positions(3, 5) == 16);
  CHECK(nn::dropout_positions(4, 4) == 16);
  CHECK(nn::dropout_positions(0, 7) == 0);
}

TEST_CASE("dropout equals the float64 reference: values exactly 0 or x * scale", "[nn][dropout]") {
  struct Case {
    int64_t rows, columns;
    float p;
    uint64_t offset;
    int64_t first_row;
  };
  // Odd widths and offsets, so Philox blocks straddle rows; an offset past the first
  // 4 x 65536 words, where the stream's counter steps.
  const std::vector<Case> cases = {{1, 1, 0.1f, 0, 0},      {7, 5, 0.5f, 3, 2},
                                   {33, 13, 0.25f, 1, 0},   {64, 37, 0.9f, 262141, 5},
                                   {100, 16, 0.1f, 0, 1000}, {5, 3, 0.3f, (uint64_t{1} << 40) + 2, 7}};
  for (const Case& c : cases) {
    const uint64_t seed = fresh_seed();
    CAPTURE(c.rows, c.columns, c.p, c.offset, c.first_row, seed);
    Generator generator(seed ^ 0x5eed);
    const Tensor x = generator.randn({c.rows, c.columns});
    const nn::DropoutMask mask{c.p, seed, c.offset, c.first_row};
    const Tensor y = nn::dropout_forward(x, mask);
    const Reference reference = reference_dropout(x, c.p, seed, c.offset, c.first_row);
    CHECK(same_bits(y.to_vector(), reference.values));
    const std::vector<float> keep = nn::dropout_keep_mask(c.rows, c.columns, mask).to_vector();
    const std::vector<float> xs = x.to_vector(), ys = y.to_vector();
    const float scale = nn::dropout_scale(c.p);
    for (size_t i = 0; i < ys.size(); ++i) {
      CHECK(keep[i] == (reference.kept[i] ? 1.0f : 0.0f));
      // Every element is exactly +0 or exactly x * scale.
      const bool zero = ys[i] == 0.0f && !std::signbit(ys[i]);
      CHECK((zero || ys[i] == xs[i] * scale));
    }
  }
}

TEST_CASE("dropout keeps about 1 - p of a large tensor", "[nn][dropout]") {
  const int64_t rows = 1000, columns = 1000;
  const double n = static_cast<double>(rows * columns);
  for (const float p : {0.1f, 0.5f, 0.9f, 0.01f}) {
    const uint64_t seed = fresh_seed();
    CAPTURE(p, seed);
    const std::vector<float> keep =
        nn::dropout_keep_mask(rows, columns, {p, seed, 12345, 0}).to_vector();
    double kept = 0, kept_first_half = 0, kept_even_columns = 0;
    for (int64_t i = 0; i < rows * columns; ++i) {
      kept += keep[i];
      if (i < rows * columns / 2) kept_first_half += keep[i];
      if (i % 2 == 0) kept_even_columns += keep[i];
    }
    // Binomial: within 6 standard deviations (a false failure about once in 10^9 runs).
    const double q = 1.0 - static_cast<double>(p);
    const double sigma = std::sqrt(q * (1 - q) / n);
    CHECK(std::fabs(kept / n - q) < 6 * sigma);
    CHECK(std::fabs(kept_first_half / (n / 2) - q) < 6 * sigma * std::sqrt(2.0));
    CHECK(std::fabs(kept_even_columns / (n / 2) - q) < 6 * sigma * std::sqrt(2.0));
  }
}

TEST_CASE("dropout's gradient is the mask times scale times the incoming gradient", "[nn][dropout]") {
  const uint64_t seed = fresh_seed();
  CAPTURE(seed);
  Generator generator(seed);
  const int64_t rows = 41, columns = 23;
  const float p = 0.3f;
  Variable x(generator.randn({rows, columns}), /*requires_grad=*/true);
  Variable y = nn::dropout(x, p, seed, 9, 17);
  REQUIRE(y.grad_fn());
  CHECK(y.grad_fn()->name() == "DropoutBackward");
  const Tensor g = generator.randn({rows, columns});
  y.backward(g);
  // The reference, applied to g: the same mask (x's reference picks it) and scale.
  const Reference reference = reference_dropout(g, p, seed, 9, 17);
  CHECK(same_bits(x.grad().to_vector(), reference.values));
  // And the mask is the forward's: where y is x * scale, the gradient is g * scale.
  const Reference forward = reference_dropout(x.data(), p, seed, 9, 17);
  CHECK(forward.kept == reference.kept);
  CHECK(same_bits(y.data().to_vector(), forward.values));
  // No gradient wanted: no graph.
  CHECK_FALSE(nn::dropout(Variable(x.data()), p, seed, 9, 17).grad_fn());
}

TEST_CASE("a shard that passes its first global row draws the sequence's mask for its rows",
          "[nn][dropout]") {
  const uint64_t seed = fresh_seed();
  CAPTURE(seed);
  Generator generator(seed);
  // 1001 rows over 4 shards (251, 250, 250, 250); 37 columns: blocks straddle rows and shards.
  const int64_t rows = 1001, columns = 37;
  const uint64_t offset = 4 * 1001 * 37 + 3;  // as if a few steps had drawn before
  const float p = 0.1f;
  const Tensor x = generator.randn({rows, columns});
  const Tensor whole = nn::dropout_forward(x, {p, seed, offset, 0});
  const Tensor whole_mask = nn::dropout_keep_mask(rows, columns, {p, seed, offset, 0});
  int64_t first_row = 0;
  for (const Tensor& shard : x.tensor_split(4)) {
    const int64_t n = shard.size(0);
    CAPTURE(first_row, n);
    const Tensor rows_of_whole = whole.narrow(0, first_row, n);
    CHECK(test::bitwise_equal(nn::dropout_forward(shard, {p, seed, offset, first_row}),
                              rows_of_whole));
    const Tensor same_offset_mask = nn::dropout_keep_mask(n, columns, {p, seed, offset, 0});
    if (first_row == 0) {
      CHECK(test::bitwise_equal(nn::dropout_forward(shard, {p, seed, offset, 0}), rows_of_whole));
    } else {
      // The bug: every shard with the same offset draws the first shard's rows' mask.
      CHECK_FALSE(test::bitwise_equal(nn::dropout_forward(shard, {p, seed, offset, 0}),
                                      rows_of_whole));
      CHECK(test::bitwise_equal(same_offset_mask, whole_mask.narrow(0, 0, n)));
      CHECK_FALSE(test::bitwise_equal(same_offset_mask, whole_mask.narrow(0, first_row, n)));
    }
    // Its gradient too.
    const Tensor g = generator.randn({n, columns});
    Tensor g_whole = Tensor::zeros({rows, columns});
    g_whole.narrow(0, first_row, n).copy_(g);
    CHECK(test::bitwise_equal(nn::dropout_backward(g, {p, seed, offset, first_row}),
                              nn::dropout_backward(g_whole, {p, seed, offset, 0}).narrow(0, first_row, n)));
    first_row += n;
  }
}

TEST_CASE("dropout draws a fresh mask for a new seed or an advanced offset", "[nn][dropout]") {
  const uint64_t seed = fresh_seed();
  CAPTURE(seed);
  const int64_t rows = 64, columns = 16;
  const Tensor first = nn::dropout_keep_mask(rows, columns, {0.5f, seed, 0, 0});
  const Tensor next = nn::dropout_keep_mask(
      rows, columns, {0.5f, seed, nn::dropout_positions(rows, columns), 0});
  const Tensor other_seed = nn::dropout_keep_mask(rows, columns, {0.5f, seed + 1, 0, 0});
  CHECK_FALSE(test::bitwise_equal(first, next));
  CHECK_FALSE(test::bitwise_equal(first, other_seed));
  CHECK(test::bitwise_equal(first, nn::dropout_keep_mask(rows, columns, {0.5f, seed, 0, 0})));
}

TEST_CASE("dropout with p = 0 is the identity", "[nn][dropout]") {
  Generator generator(fresh_seed());
  Variable x(generator.randn({50, 30}), true);
  Variable y = nn::dropout(x, 0.0f, 1, 0, 3);
  CHECK(test::bitwise_equal(y.data(), x.data()));
  const Tensor g = generator.randn({50, 30});
  y.backward(g);
  CHECK(test::bitwise_equal(x.grad(), g));
}

TEST_CASE("dropout of a strided view equals dropout of its copy", "[nn][dropout]") {
  Generator generator(fresh_seed());
  const Tensor wide = generator.randn({20, 40});
  const Tensor window = wide.narrow(1, 5, 16);
  const nn::DropoutMask mask{0.2f, 77, 5, 3};
  CHECK(test::bitwise_equal(nn::dropout_forward(window, mask),
                            nn::dropout_forward(window.contiguous(), mask)));
  // One column: a column-strided view.
  const Tensor column = wide.narrow(1, 7, 1);
  CHECK(test::bitwise_equal(nn::dropout_forward(column, mask),
                            nn::dropout_forward(column.contiguous(), mask)));
}

TEST_CASE("dropout drops non-finite values to +0", "[nn][dropout]") {
  const int64_t rows = 20, columns = 20;
  const nn::DropoutMask mask{0.5f, 3, 0, 0};
  const std::vector<float> keep = nn::dropout_keep_mask(rows, columns, mask).to_vector();
  std::vector<float> values(rows * columns);
  for (size_t i = 0; i < values.size(); ++i) {
    values[i] = i % 3 == 0   ? std::numeric_limits<float>::quiet_NaN()
                : i % 3 == 1 ? -std::numeric_limits<float>::infinity()
                             : -1.0f;
  }
  const std::vector<float> y =
      nn::dropout_forward(Tensor::from_data({rows, columns}, values), mask).to_vector();
  for (size_t i = 0; i < y.size(); ++i) {
    if (keep[i] == 0.0f) {
      CHECK((y[i] == 0.0f && !std::signbit(y[i])));
    } else if (i % 3 == 0) {
      CHECK(std::isnan(y[i]));
    } else {
      CHECK(y[i] == values[i] * 2.0f);
    }
  }
}

TEST_CASE("dropout rejects a bad p, a negative first row, a non-matrix and overflow",
          "[nn][dropout]") {
  const Tensor x = Tensor::ones({4, 3});
  CHECK_THROWS_WITH(nn::dropout_forward(x, {1.0f, 0, 0, 0}), Contains("got p = 1"));
  CHECK_THROWS_WITH(nn::dropout_forward(x, {1.5f, 0, 0, 0}), Contains("got p = 1.5"));
  CHECK_THROWS_WITH(nn::dropout_forward(x, {-0.1f, 0, 0, 0}), Contains("got p = -0.1"));
  CHECK_THROWS_WITH(nn::dropout_forward(x, {std::numeric_limits<float>::quiet_NaN(), 0, 0, 0}),
                    Contains("p must be in [0, 1), got p = nan"));
  CHECK_THROWS_WITH(nn::dropout(Variable(x, true), 2.0f, 0, 0), Contains("got p = 2"));
  CHECK_THROWS_WITH(nn::dropout_forward(x, {0.1f, 0, 0, -1}), Contains("first_row must be at least 0, got -1"));
  CHECK_THROWS_WITH(nn::dropout_forward(Tensor::ones({12}), {0.1f, 0, 0, 0}),
                    Contains("must be [n, m], got shape [12]"));
  CHECK_THROWS_WITH(nn::dropout_forward(x, {0.1f, 0, std::numeric_limits<uint64_t>::max() - 10, 0}),
                    Contains("does not fit in the 64-bit Philox position"));
  // The last position that fits is fine.
  CHECK_NOTHROW(nn::dropout_forward(x, {0.1f, 0, std::numeric_limits<uint64_t>::max() - 12, 0}));
  CHECK(nn::dropout_forward(Tensor::ones({0, 3}), {0.1f, 0, 0, 0}).shape() == Shape{0, 3});
}
