// The host side of the CRT dW's arithmetic (nn/cuda/exact_dw_crt.h): the plan for a row count
// and Garner's table.
#include "nn/cuda/exact_dw_crt.h"

#include "core/error.h"

namespace seqpar::nn::detail::crt {

namespace {

constexpr int greatest_common_divisor(int a, int b) { return b == 0 ? a : greatest_common_divisor(b, a % b); }
constexpr bool pairwise_coprime_and_odd() {
  for (int i = 0; i < kMaxModuli; ++i) {
    if (modulus(i) % 2 == 0 || modulus(i) > 255) return false;
    for (int j = 0; j < i; ++j) {
      if (greatest_common_divisor(modulus(i), modulus(j)) != 1) return false;
    }
  }
  return true;
}
static_assert(pairwise_coprime_and_odd(), "Garner's reconstruction needs pairwise coprime moduli");

exact::UInt128 product_of_first(int count) {
  exact::UInt128 product = 1;
  for (int i = 0; i < count; ++i) product *= static_cast<unsigned>(modulus(i));
  return product;
}

// Whether `count` moduli hold every sum of `rows` products of two window integers:
// |S| <= rows (2^W - 1)^2, and the symmetric range of an odd product P is |S| <= (P - 1) / 2.
bool covers(int count, int64_t rows, int window_bits) {
  const exact::UInt128 largest = (exact::UInt128{1} << window_bits) - 1;
  return product_of_first(count) > 2 * static_cast<exact::UInt128>(rows) * largest * largest;
}

// m^-1 modulo p (m and p coprime), by trying: p < 256.
int inverse_modulo(int m, int p) {
  for (int candidate = 1; candidate < p; ++candidate) {
    if ((m % p) * candidate % p == 1) return candidate;
  }
  SEQPAR_CHECK(false, "crt: ", m, " has no inverse modulo ", p);
  return 0;
}

}  // namespace

Plan plan_for_rows(int64_t rows) {
  SEQPAR_CHECK(rows >= 1 && rows <= exact::kMaxTerms, "crt: ", rows, " rows (1 to 2^32)");
  int count = 1;
  while (!covers(count, rows, kMinWindowBits)) ++count;  // 16 moduli cover 2^32 rows
  int window_bits = kMinWindowBits;
  while (window_bits < kMaxWindowBits && covers(count, rows, window_bits + 1)) ++window_bits;
  return {count, window_bits};
}

Table crt_table(int moduli) {
  SEQPAR_CHECK(moduli >= 1 && moduli <= kMaxModuli, "crt: ", moduli, " moduli (1 to ", kMaxModuli, ")");
  Table table{};
  table.count = moduli;
  for (int i = 0; i < moduli; ++i) {
    table.moduli[i] = modulus(i);
    for (int j = 0; j < i; ++j) table.inverses[j][i] = inverse_modulo(modulus(j), modulus(i));
  }
  table.product = product_of_first(moduli);
  return table;
}

}  // namespace seqpar::nn::detail::crt
