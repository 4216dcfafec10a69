// Helpers of the Linear exactness tests (linear_exact_test.cpp, linear_chains_test.cpp):
// inputs from a seeded generator, bitwise comparisons, the test doubles that stand in for
// an all-reduce, exact reference values and the canonical fma chains written out.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <numeric>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "autograd/variable.h"
#include "core/device.h"
#include "core/exact_bins.h"
#include "core/exact_sums.h"
#include "core/tensor.h"
#include "nn/linear.h"
#include "tests/exact_reference.h"
#include "tests/test_util.h"

namespace seqpar::test::linear_exact {

using test::ReferenceSum;

// ---------------------------------------------------------------- inputs

// A test case's seed: its base mixed with Catch's --rng-seed.
inline uint64_t case_seed(uint64_t base) {
  return base + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(Catch::rngSeed());
}

// Normal samples times 2^e, e uniform in [-spread, spread]: values over many binades.
inline std::vector<float> spread_values(std::mt19937_64& rng, int64_t count, int spread) {
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> exponent(-spread, spread);
  std::vector<float> values(static_cast<size_t>(count));
  for (float& value : values) value = std::ldexp(normal(rng), exponent(rng));
  return values;
}

inline Tensor random_matrix(std::mt19937_64& rng, int64_t rows, int64_t cols, int spread) {
  return Tensor::from_data({rows, cols}, spread_values(rng, rows * cols, spread));
}

inline int64_t uniform(std::mt19937_64& rng, int64_t low, int64_t high) {
  return std::uniform_int_distribution<int64_t>(low, high)(rng);
}

// Rows `order[0], order[1], ...` of a matrix, as a new contiguous matrix.
inline Tensor gather_rows(const Tensor& matrix, const std::vector<int64_t>& order) {
  const int64_t cols = matrix.size(1);
  const std::vector<float> values = matrix.contiguous().to_vector();
  std::vector<float> gathered;
  gathered.reserve(order.size() * static_cast<size_t>(cols));
  for (const int64_t row : order) {
    gathered.insert(gathered.end(), values.begin() + row * cols, values.begin() + (row + 1) * cols);
  }
  return Tensor::from_data({static_cast<int64_t>(order.size()), cols}, gathered);
}

// ---------------------------------------------------------------- bitwise comparison

inline std::string hex(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  std::ostringstream out;
  out << std::hexfloat << value << " (0x" << std::hex << std::setw(8) << std::setfill('0') << bits
      << ")";
  return out.str();
}

// "" when `got` and `expected` hold the same bits (NaNs of any payload match), else the
// number of differing elements and the first of them, precisely.
inline std::string describe_difference(const Tensor& got, const Tensor& expected) {
  if (got.shape() != expected.shape()) {
    std::ostringstream out;
    out << "shape [";
    for (const int64_t size : got.shape()) out << size << ' ';
    out << "] vs [";
    for (const int64_t size : expected.shape()) out << size << ' ';
    out << "]";
    return out.str();
  }
  const std::vector<float> g = got.to_vector(), e = expected.to_vector();
  const int64_t cols = got.dim() == 2 ? got.size(1) : static_cast<int64_t>(g.size());
  int64_t differing = 0, first = -1;
  for (size_t i = 0; i < g.size(); ++i) {
    const bool same = (std::isnan(g[i]) && std::isnan(e[i])) ||
                      std::memcmp(&g[i], &e[i], sizeof(float)) == 0;
    if (!same && differing++ == 0) first = static_cast<int64_t>(i);
  }
  if (differing == 0) return "";
  std::ostringstream out;
  out << differing << " of " << g.size() << " elements differ; the first at [" << first / cols
      << ", " << first % cols << "]: got " << hex(g[first]) << ", expected " << hex(e[first]);
  return out.str();
}

#define CHECK_SAME_BITS(got, expected)                                \
  do {                                                                \
    const std::string difference_ = describe_difference(got, expected); \
    INFO(#got " vs " #expected ": " << difference_);                 \
    CHECK(difference_.empty());                                       \
  } while (0)

// ---------------------------------------------------------------- test doubles

// exact::CrossRankSums is the seam where the ranks of a group add the digits of their
// exact sums (dist/ implements it by an integer all-reduce). These two doubles simulate
// a group of ranks, one shard of rows each, in one thread:
//
// RecordingCombiner: keeps the unrounded sums (nn::linear_row_sums: dW's, then db's) of
// each backward it records: a rank's own partial sums, as it would hand them to an
// all-reduce.
struct RecordingCombiner {
  std::vector<exact::ExactSums> calls;
};

// Plays rank `rank` of a group whose members' sums were recorded in `ranks` (the same
// shards): its own row sums plus every other rank's recorded ones, rounded once, as
// dist's all_reduce_sums and ExactSums::round_into leave them on every member.
inline nn::LinearGradients all_reduced_backward(const std::vector<RecordingCombiner>& ranks,
                                                size_t rank, const Tensor& grad_y, const Tensor& x,
                                                const Tensor& weight) {
  exact::ExactSums sums = nn::linear_row_sums(grad_y, x, true, true);
  for (size_t other = 0; other < ranks.size(); ++other) {
    if (other != rank) sums.add(ranks[other].calls.at(0));  // checks the count and the device
  }
  nn::LinearGradients gradients;
  gradients.weight = Tensor::empty(weight.shape(), weight.device());
  gradients.bias = Tensor::empty({weight.size(0)}, weight.device());
  sums.round_into(gradients.weight, 0);
  sums.round_into(gradients.bias, weight.numel());
  return gradients;
}

// ---------------------------------------------------------------- exact values

// The exact value of sum i of host digits (core/exact_bins.h's layout: digit d of sum i at
// d * count + i), in units of 2^-149: Σ_k digit_k 2^(b_k + 149). Finite sums only.
inline mpz_class digits_value(const std::vector<int64_t>& digits, int64_t count, int64_t i) {
  mpz_class value = 0, digit;
  for (int k = 0; k < exact::kBins; ++k) {
    mpz_set_si(digit.get_mpz_t(), digits[static_cast<size_t>(k * count + i)]);
    mpz_mul_2exp(digit.get_mpz_t(), digit.get_mpz_t(),
                 static_cast<mp_bitcnt_t>(exact::bin_exponent(k) - exact::kLowestExponent));
    value += digit;
  }
  return value;
}

// ---------------------------------------------------------------- the canonical chains

// y[i, j] = (fma chain over k = 0, 1, ... from +0) + b[j], written out scalar.
inline Tensor chain_forward(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  const int64_t rows = x.size(0), in = x.size(1), out = weight.size(0);
  const std::vector<float> xv = x.contiguous().to_vector(), w = weight.to_vector(),
                           b = bias.to_vector();
  std::vector<float> y(static_cast<size_t>(rows * out));
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < out; ++j) {
      float chain = +0.0f;
      for (int64_t k = 0; k < in; ++k) chain = std::fma(xv[i * in + k], w[j * in + k], chain);
      y[i * out + j] = chain + b[j];
    }
  }
  return Tensor::from_data({rows, out}, y);
}

// dx[i, k] = fma chain over j = 0, 1, ... from +0 of dy[i, j] W[j, k].
inline Tensor chain_grad_x(const Tensor& grad_y, const Tensor& weight) {
  const int64_t rows = grad_y.size(0), out = weight.size(0), in = weight.size(1);
  const std::vector<float> dy = grad_y.contiguous().to_vector(), w = weight.to_vector();
  std::vector<float> dx(static_cast<size_t>(rows * in));
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t k = 0; k < in; ++k) {
      float chain = +0.0f;
      for (int64_t j = 0; j < out; ++j) chain = std::fma(dy[i * out + j], w[j * in + k], chain);
      dx[i * in + k] = chain;
    }
  }
  return Tensor::from_data({rows, in}, dx);
}

// dW and db from the definition: each element the reference exact sum, rounded once;
// every term is finite (add_finite throws otherwise).
// `exact_dw`, `exact_db`: the unrounded sums, in units of 2^-149.
struct ReferenceGradients {
  Tensor weight, bias;
  std::vector<mpz_class> exact_weight, exact_bias;
};
inline ReferenceGradients reference_gradients(const Tensor& grad_y, const Tensor& x) {
  const int64_t rows = x.size(0), in = x.size(1), out = grad_y.size(1);
  const std::vector<float> xv = x.contiguous().to_vector(), dy = grad_y.contiguous().to_vector();
  ReferenceGradients result;
  std::vector<float> dw(static_cast<size_t>(out * in)), db(static_cast<size_t>(out));
  for (int64_t j = 0; j < out; ++j) {
    for (int64_t k = 0; k < in; ++k) {
      ReferenceSum sum;
      for (int64_t i = 0; i < rows; ++i) {
        sum.add_finite(static_cast<double>(dy[i * out + j]) * static_cast<double>(xv[i * in + k]));
      }
      dw[j * in + k] = sum.rounded<float>();
      result.exact_weight.push_back(sum.units());
    }
    ReferenceSum sum;
    for (int64_t i = 0; i < rows; ++i) sum.add_finite(dy[i * out + j]);
    db[j] = sum.rounded<float>();
    result.exact_bias.push_back(sum.units());
  }
  result.weight = Tensor::from_data({out, in}, dw);
  result.bias = Tensor::from_data({out}, db);
  return result;
}

// ---------------------------------------------------------------- one sharded backward

struct Shape3 {
  int64_t rows, in, out;
};

inline std::string describe(const Shape3& s) {
  std::ostringstream out;
  out << "rows " << s.rows << ", in " << s.in << ", out " << s.out;
  return out.str();
}

inline std::string describe(const std::vector<int64_t>& sizes) {
  std::ostringstream out;
  out << sizes.size() << " shards [";
  for (size_t s = 0; s < sizes.size() && s < 24; ++s) out << (s ? ", " : "") << sizes[s];
  if (sizes.size() > 24) out << ", ...";
  out << "]";
  return out.str();
}

// Shard sizes (>= 0) adding up to `rows`, of one of several kinds.
inline std::vector<int64_t> random_partition(std::mt19937_64& rng, int64_t rows, int kind) {
  std::vector<int64_t> cuts;  // positions in [0, rows]; repeats make empty shards
  switch (kind) {
    case 0:  // a few uneven shards, one of them empty
      for (int64_t c = uniform(rng, 1, 6); c > 0; --c) cuts.push_back(uniform(rng, 0, rows));
      cuts.push_back(cuts.front());
      break;
    case 1:  // 1-row shards at both ends, an empty one at the start, the rest in between
      cuts = {0, std::min<int64_t>(1, rows), std::min<int64_t>(2, rows),
              std::max<int64_t>(rows - 1, 0)};
      break;
    case 2:  // many shards: every row alone for short batches, else 50 random cuts
      if (rows <= 64) {
        for (int64_t r = 1; r < rows; ++r) cuts.push_back(r);
      } else {
        for (int c = 0; c < 50; ++c) cuts.push_back(uniform(rng, 0, rows));
      }
      break;
    default:  // empty shards at both ends around two uneven ones
      cuts = {0, 0, uniform(rng, 0, rows), rows, rows};
      break;
  }
  std::sort(cuts.begin(), cuts.end());
  std::vector<int64_t> sizes;
  int64_t start = 0;
  for (const int64_t cut : cuts) {
    sizes.push_back(cut - start);
    start = cut;
  }
  sizes.push_back(rows - start);
  return sizes;
}

// Runs every shard of rows of (grad_y, x) as a group of ranks would:
// pass 1 records each shard's digits, pass 2 runs each shard again with a simulated
// all-reduce and checks that its dW and db are `expected`'s bits, and that the shards'
// exact digit values add up to `full`'s (the recorded digits of the full batch).
inline void check_sharded(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                   const std::vector<int64_t>& sizes, const nn::LinearGradients& expected,
                   const RecordingCombiner& full) {
  INFO(describe(sizes));
  std::vector<int64_t> starts;
  int64_t start = 0;
  for (const int64_t size : sizes) {
    starts.push_back(start);
    start += size;
  }
  REQUIRE(start == x.size(0));
  std::vector<RecordingCombiner> ranks(sizes.size());
  for (size_t s = 0; s < sizes.size(); ++s) {
    ranks[s].calls.push_back(nn::linear_row_sums(grad_y.narrow(0, starts[s], sizes[s]),
                                                 x.narrow(0, starts[s], sizes[s]), true, true));
  }
  bool every_shard_exact = true;
  for (size_t s = 0; s < sizes.size(); ++s) {
    INFO("shard " << s << " (rows " << starts[s] << " + " << sizes[s] << ")");
    const nn::LinearGradients shard = all_reduced_backward(
        ranks, s, grad_y.narrow(0, starts[s], sizes[s]), x.narrow(0, starts[s], sizes[s]), weight);
    const std::string dw = describe_difference(shard.weight, expected.weight);
    const std::string db = describe_difference(shard.bias, expected.bias);
    if (!dw.empty() || !db.empty()) {
      INFO("dW: " << dw << "; db: " << db);
      CHECK(dw.empty());
      CHECK(db.empty());
      every_shard_exact = false;
    }
  }
  CHECK(every_shard_exact);
  // The digits add as integers: the shards' exact values sum to the full batch's (dW's
  // sums first, then db's).
  const int64_t count = full.calls[0].count(), weight_count = weight.numel();
  REQUIRE(count == weight_count + weight.size(0));
  const std::vector<int64_t> whole = full.calls[0].to_host();
  std::vector<std::vector<int64_t>> parts;
  for (const RecordingCombiner& rank : ranks) parts.push_back(rank.calls[0].to_host());
  int64_t differing[2] = {0, 0};  // dW's, db's
  for (int64_t i = 0; i < count; ++i) {
    mpz_class total = 0;
    for (const auto& part : parts) total += digits_value(part, count, i);
    if (total != digits_value(whole, count, i)) ++differing[i < weight_count ? 0 : 1];
  }
  INFO("exact values differing from the full batch's: dW " << differing[0] << ", db " << differing[1]);
  CHECK(differing[0] == 0);
  CHECK(differing[1] == 0);
}

// Full-batch dW and db of (grad_y, x), with their digits recorded.
inline nn::LinearGradients recorded_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                                      RecordingCombiner& recorder) {
  nn::LinearGradients gradients = nn::linear_backward(grad_y, x, weight, true, true, true);
  recorder.calls.push_back(nn::linear_row_sums(grad_y, x, true, true));
  return gradients;
}

// Random shapes for the partition and order tests: rows 1..3000, in 1..200, out 1..40,
// with fixed edge shapes first (sizes not multiples of 8 or 16, and multiples).
inline std::vector<Shape3> random_shapes(std::mt19937_64& rng, int count) {
  std::vector<Shape3> shapes = {{1, 1, 1}, {3000, 200, 40}, {257, 17, 9}, {64, 16, 8}};
  while (static_cast<int>(shapes.size()) < count) {
    shapes.push_back({uniform(rng, 1, 3000), uniform(rng, 1, 200), uniform(rng, 1, 40)});
  }
  return shapes;
}


}  // namespace seqpar::test::linear_exact
