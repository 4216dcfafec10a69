// exact::add_scaled_integer (core/exact_bins.h), the way integer sums such as the
// fixed-point dW of nn/one_magnitude.h enter the digits: p * 2^t added into existing
// digits must change their value by exactly p * 2^t, checked against GMP rationals.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>

#include "core/exact_bins.h"
#include "core/exact_fixed_point.h"
#include "tests/exact_reference.h"

using namespace seqpar;
using exact::kDigits;

TEST_CASE("add_scaled_integer adds p * 2^t exactly, in any unit, either sign", "[exact][cpu]") {
  // The digits' value against GMP: Σ digit_k 2^b_k before plus p 2^t must equal after.
  auto value_of = [](const int64_t (&digits)[kDigits]) {
    mpq_class value = 0;
    for (int k = 0; k < exact::kBins; ++k) {
      mpq_class unit = exact::bin_exponent(k) >= 0
                           ? mpq_class(mpz_class(1) << exact::bin_exponent(k))
                           : mpq_class(mpz_class(1), mpz_class(1) << -exact::bin_exponent(k));
      unit.canonicalize();
      value += mpq_class(mpz_class(std::to_string(digits[k]))) * unit;
    }
    return value;
  };
  auto scaled = [](exact::Int128 p, int t) {
    const bool negative = p < 0;
    exact::UInt128 magnitude = negative ? -static_cast<exact::UInt128>(p) : p;
    mpz_class n = 0;
    for (int shift = 96; shift >= 0; shift -= 32) {
      n = (n << 32) + mpz_class(static_cast<unsigned long>((magnitude >> shift) & 0xffffffffu));
    }
    if (negative) n = -n;
    mpq_class value = t >= 0 ? mpq_class(n * (mpz_class(1) << t))
                             : mpq_class(n, mpz_class(1) << -t);
    value.canonicalize();
    return value;
  };
  std::mt19937_64 random(20261130);
  for (int trial = 0; trial < 20000; ++trial) {
    // Magnitudes from 1 bit to 93 (the limit), units from 2^-149 up to where the top
    // digit still fits.
    const int bits = 1 + static_cast<int>(random() % 93);
    exact::Int128 p = static_cast<exact::Int128>(random()) << 64 | random();
    p = static_cast<exact::Int128>(static_cast<exact::UInt128>(p) >> (128 - bits));
    if (random() % 2) p = -p;
    const int highest_t = std::min(exact::kTopBinExponent + exact::kBinBits - 1,
                                   exact::kTopBinExponent + 61 - bits);
    const int t = exact::kLowestExponent +
                  static_cast<int>(random() % static_cast<uint64_t>(highest_t - exact::kLowestExponent + 1));
    int64_t digits[kDigits] = {};
    for (int k = 0; k < exact::kBins; ++k) {  // an earlier sum's digits, either sign
      digits[k] = static_cast<int64_t>(random() % (uint64_t{1} << 40)) - (int64_t{1} << 39);
    }
    const mpq_class before = value_of(digits);
    exact::add_scaled_integer(digits, 1, p, t);
    INFO("trial " << trial << ": " << bits << " bits at 2^" << t);
    const bool exact = value_of(digits) == before + scaled(p, t);  // (no mpq printing)
    REQUIRE(exact);
  }
  // The edges: the grid's last unit, the top bin's, and p = 0 (no digit touched).
  int64_t digits[kDigits] = {};
  exact::add_scaled_integer(digits, 1, 3, exact::kLowestExponent);
  CHECK(digits[exact::kBins - 1] == 3);
  exact::add_scaled_integer(digits, 1, -5, exact::kTopBinExponent + exact::kBinBits - 1);
  CHECK(digits[0] == -5 * (int64_t{1} << (exact::kBinBits - 1)));
  int64_t untouched[kDigits] = {1, 2, 3, 4, 5, 6, 7, 8, 0};
  exact::add_scaled_integer(untouched, 1, 0, 0);
  CHECK(untouched[0] == 1);
  CHECK(untouched[7] == 8);
}

TEST_CASE("slice_scaled_product gives add_scaled_integer's digits for an int64 times a significand",
          "[exact][cpu]") {
  // The GPU's one-magnitude dW adds integer * significand * 2^t through these slices;
  // they must change each digit exactly as add_scaled_integer's 128-bit path does.
  std::mt19937_64 random(20261201);
  int sliced = 0, refused = 0;
  for (int trial = 0; trial < 50000; ++trial) {
    // Integers of every width up to int64's, significands of 1 to 24 bits (a float's),
    // with the extremes of both among them.
    const int bits = 1 + static_cast<int>(random() % 63);
    int64_t integer = static_cast<int64_t>(random() >> (64 - bits));
    if (trial % 97 == 0) integer = INT64_MAX;
    if (random() % 2) integer = -integer;
    if (trial % 101 == 0) integer = INT64_MIN + 1;
    const int significand_bits = 1 + static_cast<int>(random() % 24);
    uint32_t significand = static_cast<uint32_t>(random() >> (64 - significand_bits)) |
                           (uint32_t{1} << (significand_bits - 1));
    if (trial % 89 == 0) significand = 0xffffffu;
    const exact::Int128 product = exact::Int128{integer} * significand;
    // Units from 2^-149 up to where the product's top still fits the top digit.
    int width = 0;
    for (exact::UInt128 m = product < 0 ? -static_cast<exact::UInt128>(product) : product; m != 0; m >>= 1) ++width;
    const int highest_t = std::min(exact::kTopBinExponent + exact::kBinBits - 1,
                                   exact::kTopBinExponent + 61 - width);
    const int t = exact::kLowestExponent +
                  static_cast<int>(random() % static_cast<uint64_t>(highest_t - exact::kLowestExponent + 1));
    int64_t expected[kDigits] = {}, actual[kDigits] = {};
    exact::add_scaled_integer(expected, 1, product, t);
    int64_t slices[4];
    int lowest = -1;
    INFO("trial " << trial << ": " << integer << " * " << significand << " at 2^" << t);
    if (!exact::slice_scaled_product(integer, significand, t, slices, lowest)) {
      // Refused only where a slice would land above bin 0.
      CHECK(t - exact::kLowestExponent >= (exact::kBins - 3) * exact::kBinBits);
      ++refused;
      continue;
    }
    ++sliced;
    REQUIRE(lowest >= 3);
    REQUIRE(lowest < exact::kBins);
    for (int i = 0; i < 4; ++i) actual[lowest - i] += slices[i];
    for (int k = 0; k < kDigits; ++k) REQUIRE(actual[k] == expected[k]);
  }
  CHECK(sliced > 30000);
  CHECK(refused > 100);
}
