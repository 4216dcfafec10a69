#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>

#include "core/generator.h"
#include "tests/test_util.h"

using namespace seqpar;
using seqpar::test::bitwise_equal;

TEST_CASE("same seed gives bitwise-identical numbers", "[core][determinism]") {
  Generator a(12345), b(12345), c(12346);
  const Tensor first = a.randn({37, 11});
  CHECK(bitwise_equal(first, b.randn({37, 11})));
  CHECK_FALSE(bitwise_equal(first, c.randn({37, 11})));
  CHECK(bitwise_equal(a.uniform({9}, -1, 1), b.uniform({9}, -1, 1)));
}

TEST_CASE("the offset advances by whole Philox blocks and can be set", "[core]") {
  Generator generator(99);
  generator.randn({6});
  CHECK(generator.offset() == 8);  // 6 values round up to two blocks of 4
  const Tensor next = generator.randn({4});

  Generator jump(99, 8);
  CHECK(bitwise_equal(jump.randn({4}), next));

  // One draw of 8 is the same stream as two draws of 4.
  Generator whole(5), halves(5);
  const auto all = whole.randn({8}).to_vector();
  auto front = halves.randn({4}).to_vector();
  const auto back = halves.randn({4}).to_vector();
  front.insert(front.end(), back.begin(), back.end());
  CHECK(all == front);
}

TEST_CASE("randn and uniform have the right distribution", "[core]") {
  Generator generator(2024);
  const auto normal = generator.randn({200000}).to_vector();
  double sum = 0, square = 0;
  for (float v : normal) sum += v, square += double(v) * v;
  const double mean = sum / normal.size();
  const double variance = square / normal.size() - mean * mean;
  CHECK(std::abs(mean) < 0.01);              // 4.5 standard errors
  CHECK(std::abs(variance - 1.0) < 0.015);

  const auto uniform = generator.uniform({200000}, -0.5f, 1.5f).to_vector();
  double low = 1e9, high = -1e9, total = 0;
  for (float v : uniform) low = std::min<double>(low, v), high = std::max<double>(high, v), total += v;
  CHECK(low >= -0.5);
  CHECK(high <= 1.5);
  CHECK(std::abs(total / uniform.size() - 0.5) < 0.01);
  CHECK_THROWS_WITH(generator.uniform({2}, 1, 1), Catch::Contains("low (1)"));
}
