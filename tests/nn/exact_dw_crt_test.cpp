// The CRT dW's arithmetic (nn/cuda/exact_dw_crt.h) on the CPU: each shared function against an
// independent computation, and the whole scheme (the host model of exact_dw_crt_model.h)
// against the reference's exact sums (nn/reference/linear.h) on random shapes, exponent
// ranges, chunkings and partitions of the rows.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "core/exact_fixed_point.h"
#include "core/exact_bins.h"
#include "core/exact_sums.h"
#include "core/tensor.h"
#include "nn/cuda/exact_dw_crt.h"
#include "nn/reference/linear.h"
#include "tests/nn/exact_dw_crt_model.h"
#include "tests/nn/exact_dw_crt_util.h"
#include "tests/test_util.h"

using namespace seqpar;
using namespace seqpar::test::crt_dw;

namespace {

uint64_t case_seed(uint64_t base) {
  return base + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(Catch::rngSeed());
}

// The model's sums and the reference's for dy, x: the same exact value in every sum, and
// the same bits once rounded.
void check_against_reference(const Tensor& dy, const Tensor& x, int64_t rows_per_product) {
  const nn::detail::ConstRows dy_rows = nn::detail::const_rows_of(dy), x_rows = nn::detail::const_rows_of(x);
  const int64_t count = dy.size(1) * x.size(1);
  exact::ExactSums model(count, Device::cpu()), reference(count, Device::cpu());
  crt_weight_sums_model(dy_rows, x_rows, model, rows_per_product);
  nn::reference::linear_weight_sums(dy_rows, x_rows, reference, 0);
  CHECK(differing_sums(model.to_host(), count, reference.to_host(), count, count) == 0);
  Tensor a = Tensor::empty({dy.size(1), x.size(1)}), b = Tensor::empty({dy.size(1), x.size(1)});
  model.round_into(a);
  reference.round_into(b);
  CHECK(test::bitwise_equal(a, b));
}

void check_case(const Case& c, uint64_t seed, int64_t rows_per_product) {
  INFO(c.name << ": " << c.rows << " x " << c.in << " -> " << c.out << ", seed " << seed
              << ", rows per product " << rows_per_product);
  std::mt19937_64 rng(seed);
  const Tensor dy = matrix(rng, c.rows, c.out, c.dy), x = matrix(rng, c.rows, c.in, c.x);
  check_against_reference(dy, x, rows_per_product);
}

}  // namespace

TEST_CASE("crt: residues are the symmetric residues of the exact integers", "[cpu]") {
  std::mt19937_64 rng(case_seed(1));
  for (int n = 0; n < 20000; ++n) {
    const int bits = 1 + static_cast<int>(rng() % crt::kMaxWindowBits);  // |V| < 2^44
    const auto magnitude = static_cast<int64_t>(rng() >> (64 - bits));
    const int64_t v = rng() % 2 ? magnitude : -magnitude;
    for (int i = 0; i < crt::kMaxModuli; ++i) {
      const int m = crt::modulus(i), r = crt::window_residue_at(v, i);
      INFO("V " << v << " modulo " << m << ": " << r);
      CHECK(2 * std::abs(r) < m);
      CHECK((v - r) % m == 0);
    }
  }
}

TEST_CASE("crt: a window's residues in 32 bits at the edges of the split and the window", "[cpu]") {
  const int64_t edge = (int64_t{1} << crt::kMaxWindowBits) - 1, split = int64_t{1} << 22;
  for (const int64_t v : {int64_t{0}, int64_t{1}, int64_t{-1}, split - 1, split, -split, -split - 1,
                          edge, -edge, edge - split, -edge + split}) {
    for (int i = 0; i < crt::kMaxModuli; ++i) {
      const int m = crt::modulus(i), r = crt::window_residue_at(v, i);
      INFO("V " << v << " modulo " << m << ": " << r);
      CHECK(2 * std::abs(r) < m);
      CHECK((v - r) % m == 0);
    }
  }
}

namespace {
// quotient_below_2_31 against integer division around every 9973rd multiple of m and
// at the last 2^16 values below 2^31; with `every`, at every u below 2^31 (the hidden
// test below: about a minute on one core).
template <int kIndex>
void check_quotients(bool every) {
  constexpr uint32_t m = crt::modulus(kIndex);
  const auto check = [](uint32_t u) {
    INFO("u " << u << " / " << crt::modulus(kIndex));
    REQUIRE(crt::quotient_below_2_31<m>(u) == u / m);
  };
  if (every) {
    uint64_t exact = 0;
    for (uint32_t u = 0; u < (1u << 31); ++u) exact += crt::quotient_below_2_31<m>(u) == u / m;
    CHECK(exact == (uint64_t{1} << 31));  // one CHECK a modulus: 2^31 of them would take hours
    return;
  }
  for (uint64_t k = 0; k * m < (uint64_t{1} << 31); k += 9973) {
    for (int64_t d = -2; d <= 2; ++d) {
      const int64_t u = static_cast<int64_t>(k * m) + d;
      if (u >= 0 && u < (int64_t{1} << 31)) check(static_cast<uint32_t>(u));
    }
  }
  for (uint32_t u = (1u << 31) - (1u << 16); u < (1u << 31); ++u) check(u);
}
template <int... kIndex>
void check_all_quotients(bool every, std::integer_sequence<int, kIndex...>) {
  (check_quotients<kIndex>(every), ...);
}
}  // namespace

TEST_CASE("crt: a multiply-high and a shift divide every u below 2^31 by each modulus", "[cpu]") {
  check_all_quotients(false, std::make_integer_sequence<int, crt::kMaxModuli>{});
}

// All 2^31 x 16 quotients: not run by default (`seqpar_nn_tests "[.exhaustive]"`).
TEST_CASE("crt: the multiply-high quotient, exhaustively", "[.exhaustive][cpu]") {
  check_all_quotients(true, std::make_integer_sequence<int, crt::kMaxModuli>{});
}

TEST_CASE("crt: Garner's value is the signed integer of its residues", "[cpu]") {
  std::mt19937_64 rng(case_seed(2));
  for (int count = 1; count <= crt::kMaxModuli; ++count) {
    const crt::Table table = crt::crt_table(count);
    const exact::UInt128 half = table.product / 2;
    for (int n = 0; n < 500; ++n) {
      const exact::UInt128 random = (exact::UInt128{rng()} << 64) | rng();
      const auto magnitude = static_cast<exact::Int128>(n % 7 == 0 ? half : random % (half + 1));
      const exact::Int128 s = rng() % 2 ? magnitude : -magnitude;
      int residues[crt::kMaxModuli] = {};
      for (int i = 0; i < count; ++i) {
        residues[i] = static_cast<int>(((s % table.moduli[i]) + table.moduli[i]) % table.moduli[i]);
      }
      CHECK((crt::signed_value(table, residues) == s));
    }
  }
}

TEST_CASE("crt: a wide integer times 2^t enters the digits with its exact value", "[cpu]") {
  // Against exact::add_scaled_integer of its 62-bit pieces (each below that function's 2^93).
  std::mt19937_64 rng(case_seed(3));
  for (int n = 0; n < 20000; ++n) {
    const int bits = 1 + static_cast<int>(rng() % 126);
    const exact::UInt128 random = (exact::UInt128{rng()} << 64) | rng();
    const auto magnitude = static_cast<exact::Int128>(random >> (128 - bits));
    const exact::Int128 value = rng() % 2 ? magnitude : -magnitude;
    // t from -149 up to where |value| 2^t nears 2^160, and low enough for the pieces.
    const int highest = std::min(160 - bits, 129 - 62);
    const int t = -149 + static_cast<int>(rng() % static_cast<uint64_t>(highest + 150));
    int64_t wide[exact::kDigits] = {}, pieces[exact::kDigits] = {};
    crt::add_wide_scaled_integer(wide, 1, value, t);
    const exact::Int128 high = value / (exact::Int128{1} << 62), low = value - high * (exact::Int128{1} << 62);
    exact::add_scaled_integer(pieces, 1, low, t);
    exact::add_scaled_integer(pieces, 1, high, t + 62);
    int64_t difference[exact::kDigits] = {};
    for (int d = 0; d < exact::kBins; ++d) difference[d] = wide[d] - pieces[d];
    INFO("bits " << bits << ", t " << t);
    CHECK(exact::round_to_double(difference) == 0.0);
    for (int d = 1; d < exact::kBins; ++d) CHECK(std::abs(wide[d]) < (int64_t{1} << exact::kBinBits));
  }
}

TEST_CASE("crt: the plan's moduli hold every sum of its window's products", "[cpu]") {
  for (const int64_t rows : {int64_t{1}, int64_t{2}, int64_t{3000}, int64_t{12000}, int64_t{131072},
                             int64_t{1} << 20, exact::kMaxTerms}) {
    const crt::Plan plan = crt::plan_for_rows(rows);
    const crt::Table table = crt::crt_table(plan.moduli);
    INFO(rows << " rows: " << plan.moduli << " moduli, window " << plan.window_bits);
    const auto bound = [&](int w) {
      const exact::UInt128 largest = (exact::UInt128{1} << w) - 1;
      return 2 * static_cast<exact::UInt128>(rows) * largest * largest;
    };
    CHECK(plan.window_bits >= crt::kMinWindowBits);
    CHECK(plan.window_bits <= crt::kMaxWindowBits);
    CHECK(table.product > bound(plan.window_bits));
    CHECK((plan.window_bits == crt::kMaxWindowBits || table.product <= bound(plan.window_bits + 1)));
    if (plan.moduli > 1) CHECK(crt::crt_table(plan.moduli - 1).product <= bound(crt::kMinWindowBits));
  }
  CHECK(crt::plan_for_rows(12000).moduli == 12);
  CHECK(crt::plan_for_rows(int64_t{1} << 20).moduli == 13);
}

TEST_CASE("crt: the scheme on the CPU gives the reference's exact sums", "[cpu]") {
  uint64_t seed = case_seed(10);
  for (const Case& c : cases()) {
    for (const int64_t rows_per_product : {crt::kRowsPerProduct, int64_t{64}, int64_t{7}}) {
      check_case(c, seed++, rows_per_product);
    }
  }
}

TEST_CASE("crt: the scheme on the CPU at random shapes and exponent ranges", "[cpu]") {
  std::mt19937_64 rng(case_seed(20));
  const auto uniform = [&](int64_t low, int64_t high) {
    return std::uniform_int_distribution<int64_t>(low, high)(rng);
  };
  for (int n = 0; n < 24; ++n) {
    const auto spread = [&] {
      const int low = static_cast<int>(uniform(-140, 100));
      return Spread{low, low + static_cast<int>(uniform(0, 40)), n % 3 == 0 ? 0.05 : 0.0,
                    n % 4 == 0 ? 0.005 : 0.0};
    };
    const Case c{"random", uniform(1, 900), uniform(1, 24), uniform(1, 12), spread(), spread()};
    check_case(c, rng(), uniform(1, 400));
  }
}

TEST_CASE("crt: sums at the moduli's bound (every product the window's largest, one sign)", "[cpu]") {
  // V = 2^W - 2^(W - 24) (every bit of the window's top 24) in every element: S = rows V^2,
  // within a factor (1 - 2^-24)^2 of rows 2^(2W), near the bound the
  // plan's moduli must exceed twice. A window one bit too wide (or a modulus short)
  // wraps S around Π and fails here.
  for (const int64_t rows : {int64_t{1}, int64_t{700}, int64_t{3001}}) {
    const float largest = std::nextafter(2.0f, 0.0f);  // 2 - 2^-23: every bit of a 24-bit window
    for (const float sign : {1.0f, -1.0f}) {
      INFO(rows << " rows, sign " << sign);
      const Tensor dy = Tensor::full({rows, 3}, sign * largest), x = Tensor::full({rows, 5}, largest * 0x1p-20f);
      check_against_reference(dy, x, crt::kRowsPerProduct);
      check_against_reference(dy, x, 64);
    }
  }
}

TEST_CASE("crt: two halves of the rows, their digits added, give the whole's bits", "[cpu]") {
  std::mt19937_64 rng(case_seed(30));
  for (const Case& c : cases()) {
    if (c.rows < 2) continue;
    INFO(c.name);
    const Tensor dy = matrix(rng, c.rows, c.out, c.dy), x = matrix(rng, c.rows, c.in, c.x);
    const int64_t cut = c.rows / 3, count = c.out * c.in;
    exact::ExactSums whole(count, Device::cpu()), first(count, Device::cpu()), second(count, Device::cpu());
    crt_weight_sums_model(nn::detail::const_rows_of(dy), nn::detail::const_rows_of(x), whole, 64);
    const auto part = [&](int64_t begin, int64_t rows, exact::ExactSums& sums) {
      crt_weight_sums_model(nn::detail::const_rows_of(dy.narrow(0, begin, rows)),
                            nn::detail::const_rows_of(x.narrow(0, begin, rows)), sums, 64);
    };
    part(0, cut, first);
    part(cut, c.rows - cut, second);
    first.add(second);
    CHECK(differing_sums(first.to_host(), count, whole.to_host(), count, count) == 0);
    Tensor a = Tensor::empty({c.out, c.in}), b = Tensor::empty({c.out, c.in});
    first.round_into(a);
    whole.round_into(b);
    CHECK(test::bitwise_equal(a, b));
  }
}
