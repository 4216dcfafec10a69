// Linear's canonical numerics (nn/linear_kernels.h, docs/numerics.md), each property
// on fresh random inputs, through the public API of nn/linear.h alone:
//
//   - dW and db do not depend on how the rows are split over ranks (shards run one
//     after another, their digits added by a simulated all-reduce, see the test
//     doubles below), nor on the order of the rows;
//   - dW and db are the exact sums of their terms rounded once to float32, against an
//     independent reference (tests/exact_reference.h: GMP rationals, rounded by MPFR or
//     by hand);
//   - y and dx are, bit for bit, the scalar fma chains over the feature index from +0
//     written out in this file; a row gives the same bits in any batch or slice;
//   - [cuda]: the GPU gives the CPU's bits for all four, strided x and the 128 x 128
//     GEMM included.
//
// The inputs come from std::mt19937_64 seeded per test case with a base seed mixed with
// Catch's --rng-seed (0 unless given): the default run is reproducible, and
// `--rng-seed time` draws fresh inputs. Every case reports its seed with INFO.
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
#include "core/exact_sum.h"
#include "core/exact_sums.h"
#include "core/tensor.h"
#include "nn/linear.h"
#include "tests/exact_reference.h"
#include "tests/test_util.h"

using namespace seqpar;
using test::ReferenceSum;

namespace {

// ---------------------------------------------------------------- inputs

// A test case's seed: its base mixed with Catch's --rng-seed.
uint64_t case_seed(uint64_t base) {
  return base + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(Catch::rngSeed());
}

// Normal samples times 2^e, e uniform in [-spread, spread]: values over many binades.
std::vector<float> spread_values(std::mt19937_64& rng, int64_t count, int spread) {
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> exponent(-spread, spread);
  std::vector<float> values(static_cast<size_t>(count));
  for (float& value : values) value = std::ldexp(normal(rng), exponent(rng));
  return values;
}

Tensor random_matrix(std::mt19937_64& rng, int64_t rows, int64_t cols, int spread) {
  return Tensor::from_data({rows, cols}, spread_values(rng, rows * cols, spread));
}

int64_t uniform(std::mt19937_64& rng, int64_t low, int64_t high) {
  return std::uniform_int_distribution<int64_t>(low, high)(rng);
}

// Rows `order[0], order[1], ...` of a matrix, as a new contiguous matrix.
Tensor gather_rows(const Tensor& matrix, const std::vector<int64_t>& order) {
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

std::string hex(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  std::ostringstream out;
  out << std::hexfloat << value << " (0x" << std::hex << std::setw(8) << std::setfill('0') << bits
      << ")";
  return out.str();
}

// "" when `got` and `expected` hold the same bits (NaNs of any payload match), else the
// number of differing elements and the first of them, precisely.
std::string describe_difference(const Tensor& got, const Tensor& expected) {
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
// RecordingCombiner, pass 1: a group of one that keeps a copy of the digits of every
// combine() (linear_backward makes one for dW, then one for db) and leaves the sums as
// they are: each shard's own partial sums, recorded.
class RecordingCombiner : public exact::CrossRankSums {
 public:
  void combine(exact::ExactSums& sums) override {
    exact::ExactSums copy(sums.count(), sums.device());
    copy.copy_from(sums);
    calls.push_back(std::move(copy));
  }
  std::vector<exact::ExactSums> calls;
};

// SimulatedAllReduce, pass 2: plays rank `rank` of the group whose members' digits were
// recorded in pass 1 (the same shards, the same calls): its n-th combine() adds the n-th
// recorded sums of every other rank into `sums`, which then hold the digit-wise total
// over the group, as dist's all-reduce leaves them on every member.
class SimulatedAllReduce : public exact::CrossRankSums {
 public:
  SimulatedAllReduce(const std::vector<RecordingCombiner>& ranks, size_t rank)
      : ranks_(ranks), rank_(rank) {}
  void combine(exact::ExactSums& sums) override {
    for (size_t other = 0; other < ranks_.size(); ++other) {
      if (other == rank_) continue;
      if (calls_ >= ranks_[other].calls.size()) {
        throw std::logic_error("SimulatedAllReduce: more combine() calls than recorded");
      }
      sums.add(ranks_[other].calls[calls_]);  // checks the count and the device
    }
    ++calls_;
  }
  size_t calls() const { return calls_; }

 private:
  const std::vector<RecordingCombiner>& ranks_;
  size_t rank_, calls_ = 0;
};

// ---------------------------------------------------------------- exact values

// The exact value of sum i of host digits (core/exact_sum.h's layout: digit d of sum i at
// d * count + i), in units of 2^-149: Σ_k digit_k 2^(b_k + 149). Finite sums only.
mpz_class digits_value(const std::vector<int64_t>& digits, int64_t count, int64_t i) {
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
Tensor chain_forward(const Tensor& x, const Tensor& weight, const Tensor& bias) {
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
Tensor chain_grad_x(const Tensor& grad_y, const Tensor& weight) {
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
ReferenceGradients reference_gradients(const Tensor& grad_y, const Tensor& x) {
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

std::string describe(const Shape3& s) {
  std::ostringstream out;
  out << "rows " << s.rows << ", in " << s.in << ", out " << s.out;
  return out.str();
}

std::string describe(const std::vector<int64_t>& sizes) {
  std::ostringstream out;
  out << sizes.size() << " shards [";
  for (size_t s = 0; s < sizes.size() && s < 24; ++s) out << (s ? ", " : "") << sizes[s];
  if (sizes.size() > 24) out << ", ...";
  out << "]";
  return out.str();
}

// Shard sizes (>= 0) adding up to `rows`, of one of several kinds.
std::vector<int64_t> random_partition(std::mt19937_64& rng, int64_t rows, int kind) {
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

// Runs linear_backward on every shard of rows of (grad_y, x) as a group of ranks would:
// pass 1 records each shard's digits, pass 2 runs each shard again under a simulated
// all-reduce and checks that its dW and db are `expected`'s bits, and that the shards'
// exact digit values add up to `full`'s (the recorded digits of the full batch).
void check_sharded(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
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
    exact::CrossRankScope scope(ranks[s]);
    nn::linear_backward(grad_y.narrow(0, starts[s], sizes[s]), x.narrow(0, starts[s], sizes[s]),
                        weight, false, true, true);
    REQUIRE(ranks[s].calls.size() == 2);  // dW, then db
  }
  bool every_shard_exact = true;
  for (size_t s = 0; s < sizes.size(); ++s) {
    INFO("shard " << s << " (rows " << starts[s] << " + " << sizes[s] << ")");
    SimulatedAllReduce all_reduce(ranks, s);
    exact::CrossRankScope scope(all_reduce);
    const nn::LinearGradients shard =
        nn::linear_backward(grad_y.narrow(0, starts[s], sizes[s]), x.narrow(0, starts[s], sizes[s]),
                            weight, false, true, true);
    REQUIRE(all_reduce.calls() == 2);
    CHECK_FALSE(shard.x.defined());
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
  // The digits add as integers: the shards' exact values sum to the full batch's.
  for (size_t call = 0; call < 2; ++call) {
    const int64_t count = full.calls[call].count();
    const std::vector<int64_t> whole = full.calls[call].to_host();
    std::vector<std::vector<int64_t>> parts;
    for (const RecordingCombiner& rank : ranks) parts.push_back(rank.calls[call].to_host());
    int64_t differing = 0;
    for (int64_t i = 0; i < count; ++i) {
      mpz_class total = 0;
      for (const auto& part : parts) total += digits_value(part, count, i);
      if (total != digits_value(whole, count, i)) ++differing;
    }
    INFO((call == 0 ? "dW" : "db") << ": exact values differing from the full batch's");
    CHECK(differing == 0);
  }
}

// Full-batch dW and db of (grad_y, x), with their digits recorded.
nn::LinearGradients recorded_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                                      RecordingCombiner& recorder) {
  exact::CrossRankScope scope(recorder);
  nn::LinearGradients gradients = nn::linear_backward(grad_y, x, weight, true, true, true);
  REQUIRE(recorder.calls.size() == 2);
  return gradients;
}

// Random shapes for the partition and order tests: rows 1..3000, in 1..200, out 1..40,
// with fixed edge shapes first (sizes not multiples of 8 or 16, and multiples).
std::vector<Shape3> random_shapes(std::mt19937_64& rng, int count) {
  std::vector<Shape3> shapes = {{1, 1, 1}, {3000, 200, 40}, {257, 17, 9}, {64, 16, 8}};
  while (static_cast<int>(shapes.size()) < count) {
    shapes.push_back({uniform(rng, 1, 3000), uniform(rng, 1, 200), uniform(rng, 1, 40)});
  }
  return shapes;
}

}  // namespace

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
    // Outside any scope combine_across_ranks does nothing: the same bits.
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
    exact::CrossRankScope scope(ranks[static_cast<size_t>(s)]);
    nn::linear_backward(grad_y.narrow(0, s * 60, s == 0 ? 60 : 40),
                        x.narrow(0, s * 60, s == 0 ? 60 : 40), weight, false, true, true);
  }
  SimulatedAllReduce all_reduce(ranks, 0);
  exact::CrossRankScope scope(all_reduce);
  const nn::LinearGradients combined = nn::linear_backward(
      grad_y.narrow(0, 0, 60), x.narrow(0, 0, 60), weight, false, true, true);
  CHECK(all_reduce.calls() == 2);
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
      for (size_t call = 0; call < 2; ++call) {  // the same exact values, not only roundings
        const int64_t count = recorded.calls[call].count();
        const std::vector<int64_t> a = recorded.calls[call].to_host();
        const std::vector<int64_t> b = permuted_digits.calls[call].to_host();
        int64_t differing = 0;
        for (int64_t i = 0; i < count; ++i) {
          if (digits_value(a, count, i) != digits_value(b, count, i)) ++differing;
        }
        CHECK(differing == 0);
      }
    }
  }
}

// ---------------------------------------------------------------- 3. accuracy

namespace {

// dW and db of linear_backward against the reference: the rounded bits, and the exact
// (unrounded) values of the digits the op hands to combine_across_ranks.
void check_against_reference(const Tensor& grad_y, const Tensor& x) {
  const Tensor weight = Tensor::ones({grad_y.size(1), x.size(1)});  // dW and db ignore it
  RecordingCombiner recorder;
  const nn::LinearGradients gradients = recorded_backward(grad_y, x, weight, recorder);
  const ReferenceGradients reference = reference_gradients(grad_y, x);
  CHECK_SAME_BITS(gradients.weight, reference.weight);
  CHECK_SAME_BITS(gradients.bias, reference.bias);
  const std::vector<mpz_class>* exact_values[2] = {&reference.exact_weight, &reference.exact_bias};
  for (size_t call = 0; call < 2; ++call) {
    const int64_t count = recorder.calls[call].count();
    const std::vector<int64_t> digits = recorder.calls[call].to_host();
    REQUIRE(static_cast<size_t>(count) == exact_values[call]->size());
    int64_t differing = 0, first = -1, flagged = 0;
    for (int64_t i = 0; i < count; ++i) {
      if (digits[static_cast<size_t>(exact::kSpecialDigit * count + i)] != 0) ++flagged;
      if (digits_value(digits, count, i) != (*exact_values[call])[static_cast<size_t>(i)] &&
          differing++ == 0) {
        first = i;
      }
    }
    INFO((call == 0 ? "dW" : "db") << ": " << differing << " exact sums differ, the first at "
                                   << first);
    CHECK(differing == 0);
    CHECK(flagged == 0);  // no sum saw a non-finite term
  }
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
  // The domain's rule (core/exact_sum.h): 3 2^-150 is 1.5 units of 2^-149, a tie that
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

// ---------------------------------------------------------------- 4. the chains

TEST_CASE("linear: y and dx are the fma chains over the feature index from +0", "[exact][cpu]") {
  const uint64_t seed = case_seed(0xc4a1);
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  std::vector<Shape3> shapes = {{1, 1, 1}, {5, 200, 40}, {33, 17, 9}, {4, 16, 16}, {7, 1, 33}};
  while (shapes.size() < 14) {
    shapes.push_back({uniform(rng, 1, 200), uniform(rng, 1, 200), uniform(rng, 1, 40)});
  }
  for (const Shape3& shape : shapes) {
    const int spread = static_cast<int>(uniform(rng, 0, 20));
    INFO(describe(shape) << ", spread 2^+-" << spread);
    std::vector<float> xv = spread_values(rng, shape.rows * shape.in, spread);
    std::vector<float> dy = spread_values(rng, shape.rows * shape.out, spread);
    std::vector<float> w = spread_values(rng, shape.out * shape.in, 2);
    std::vector<float> b = spread_values(rng, shape.out, spread);
    // Chains of -0 products: row 0 of x and of dy zero, W's row 0 and column 0
    // negative, b[0] = -0. y[0, 0] and dx[0, 0] are +0 from a chain that starts at +0
    // (+0 + -0 = +0), -0 from one that starts at -0.
    if (shape.rows > 1) {
      std::fill(xv.begin(), xv.begin() + shape.in, 0.0f);
      std::fill(dy.begin(), dy.begin() + shape.out, 0.0f);
    }
    for (int64_t k = 0; k < shape.in; ++k) w[k] = -std::fabs(w[k]);
    for (int64_t j = 0; j < shape.out; ++j) w[j * shape.in] = -std::fabs(w[j * shape.in]);
    b[0] = -0.0f;
    // x as a column window of a wider matrix: a strided view, as a rank's x[:, a:b].
    const int64_t pad = uniform(rng, 0, 3);
    std::vector<float> wide_values;
    for (int64_t i = 0; i < shape.rows; ++i) {
      for (int64_t p = 0; p < pad; ++p) wide_values.push_back(99.0f);
      wide_values.insert(wide_values.end(), xv.begin() + i * shape.in, xv.begin() + (i + 1) * shape.in);
      wide_values.push_back(-99.0f);
    }
    const Tensor x = Tensor::from_data({shape.rows, shape.in}, xv);
    const Tensor x_view =
        Tensor::from_data({shape.rows, shape.in + pad + 1}, wide_values).narrow(1, pad, shape.in);
    const Tensor grad_y = Tensor::from_data({shape.rows, shape.out}, dy);
    const Tensor weight = Tensor::from_data({shape.out, shape.in}, w);
    const Tensor bias = Tensor::from_data({shape.out}, b);

    const Tensor y = nn::linear_forward(x, weight, bias);
    CHECK_SAME_BITS(y, chain_forward(x, weight, bias));
    CHECK_SAME_BITS(nn::linear_forward(x_view, weight, bias), y);
    const nn::LinearGradients g = nn::linear_backward(grad_y, x, weight, true, true, true);
    CHECK_SAME_BITS(g.x, chain_grad_x(grad_y, weight));
    const nn::LinearGradients g_view = nn::linear_backward(grad_y, x_view, weight, true, true, true);
    CHECK_SAME_BITS(g_view.x, g.x);
    CHECK_SAME_BITS(g_view.weight, g.weight);
    CHECK_SAME_BITS(g_view.bias, g.bias);
    if (shape.rows > 1) {  // the chains of -0 products
      const float y00 = y.at({0, 0}), dx00 = g.x.at({0, 0});
      CHECK((y00 == 0.0f && !std::signbit(y00)));
      CHECK((dx00 == 0.0f && !std::signbit(dx00)));
    }

    // Through autograd and the module's functional form: the same bits.
    autograd::Variable xv_var(x, true), w_var(weight, true), b_var(bias, true);
    autograd::Variable y_var = nn::linear(xv_var, w_var, b_var);
    y_var.backward(grad_y);
    CHECK_SAME_BITS(y_var.data(), y);
    CHECK_SAME_BITS(xv_var.grad(), g.x);
    CHECK_SAME_BITS(w_var.grad(), g.weight);
    CHECK_SAME_BITS(b_var.grad(), g.bias);

    // Row slices: the forward and dx of a slice are the slice of the full ones.
    for (int slice = 0; slice < 4; ++slice) {
      const int64_t start = uniform(rng, 0, shape.rows - 1);
      const int64_t length = uniform(rng, 0, shape.rows - start);
      INFO("rows " << start << " + " << length);
      CHECK_SAME_BITS(nn::linear_forward(x.narrow(0, start, length), weight, bias),
                      y.narrow(0, start, length).contiguous());
      CHECK_SAME_BITS(nn::linear_forward(x_view.narrow(0, start, length), weight, bias),
                      y.narrow(0, start, length).contiguous());
      CHECK_SAME_BITS(nn::linear_backward(grad_y.narrow(0, start, length),
                                          x.narrow(0, start, length), weight, true, false, false)
                          .x,
                      g.x.narrow(0, start, length).contiguous());
    }
  }
}

TEST_CASE("linear: a row gives the same bits in batches of any size and at any position",
          "[exact][cpu]") {
  const uint64_t seed = case_seed(0xb47c);
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  for (const Shape3& shape : {Shape3{1, 37, 11}, Shape3{1, 200, 40}, Shape3{1, 8, 16}}) {
    INFO("in " << shape.in << ", out " << shape.out);
    const Tensor weight = random_matrix(rng, shape.out, shape.in, 1);
    const Tensor bias = random_matrix(rng, 1, shape.out, 1).view({shape.out});
    const Tensor row = random_matrix(rng, 1, shape.in, 10);
    const Tensor dy_row = random_matrix(rng, 1, shape.out, 10);
    const Tensor y_alone = nn::linear_forward(row, weight, bias);
    const Tensor dx_alone = nn::linear_backward(dy_row, row, weight, true, false, false).x;
    CHECK_SAME_BITS(y_alone, chain_forward(row, weight, bias));
    for (const int64_t batch : {1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 33, 100}) {
      const int64_t position = uniform(rng, 0, batch - 1);
      INFO("batch " << batch << ", row at " << position);
      Tensor x = random_matrix(rng, batch, shape.in, 10);
      Tensor dy = random_matrix(rng, batch, shape.out, 10);
      x.narrow(0, position, 1).copy_(row);
      dy.narrow(0, position, 1).copy_(dy_row);
      CHECK_SAME_BITS(nn::linear_forward(x, weight, bias).narrow(0, position, 1).contiguous(), y_alone);
      CHECK_SAME_BITS(
          nn::linear_backward(dy, x, weight, true, false, false).x.narrow(0, position, 1).contiguous(),
          dx_alone);
    }
  }
}

// ---------------------------------------------------------------- 5. the GPU

namespace {

// The GPU's y, dx, dW and db against the CPU's, bitwise; x optionally a column window of a
// wider matrix (on each device).
void check_gpu_matches_cpu(std::mt19937_64& rng, const Shape3& shape, int spread, bool strided) {
  INFO(describe(shape) << ", spread 2^+-" << spread << (strided ? ", strided x" : ""));
  const Device gpu = Device::cuda(0);
  const int64_t pad = strided ? 3 : 0;
  const Tensor wide = random_matrix(rng, shape.rows, shape.in + pad + (strided ? 2 : 0), spread);
  const Tensor x = wide.narrow(1, pad, shape.in);
  const Tensor weight = random_matrix(rng, shape.out, shape.in, 1);
  const Tensor bias = random_matrix(rng, 1, shape.out, spread).view({shape.out});
  const Tensor grad_y = random_matrix(rng, shape.rows, shape.out, spread);
  const Tensor x_gpu = strided ? wide.to(gpu).narrow(1, pad, shape.in) : x.to(gpu);
  const Tensor weight_gpu = weight.to(gpu), bias_gpu = bias.to(gpu), grad_y_gpu = grad_y.to(gpu);

  const Tensor y = nn::linear_forward(x, weight, bias);
  CHECK_SAME_BITS(nn::linear_forward(x_gpu, weight_gpu, bias_gpu).to(Device::cpu()), y);
  const nn::LinearGradients g = nn::linear_backward(grad_y, x, weight, true, true, true);
  const nn::LinearGradients g_gpu =
      nn::linear_backward(grad_y_gpu, x_gpu, weight_gpu, true, true, true);
  CHECK_SAME_BITS(g_gpu.x.to(Device::cpu()), g.x);
  CHECK_SAME_BITS(g_gpu.weight.to(Device::cpu()), g.weight);
  CHECK_SAME_BITS(g_gpu.bias.to(Device::cpu()), g.bias);
}

}  // namespace

TEST_CASE("linear on the GPU gives the CPU's bits for y, dx, dW and db", "[exact][cuda]") {
  SEQPAR_REQUIRE_CUDA();
  const uint64_t seed = case_seed(0x6b0);
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  std::vector<Shape3> shapes = {{1, 1, 1}, {257, 17, 9}, {3000, 200, 40}, {64, 16, 8},
                                {333, 640, 100}, {17, 130, 65}};
  while (shapes.size() < 12) {
    shapes.push_back({uniform(rng, 1, 3000), uniform(rng, 1, 200), uniform(rng, 1, 40)});
  }
  for (const Shape3& shape : shapes) {
    const int spread = static_cast<int>(uniform(rng, 0, 20));
    check_gpu_matches_cpu(rng, shape, spread, false);
    check_gpu_matches_cpu(rng, shape, spread, true);
  }
  // A large aligned shape, which takes the 128 x 128 GEMM for y and dx.
  check_gpu_matches_cpu(rng, {2048, 512, 256}, 4, false);
  check_gpu_matches_cpu(rng, {2048, 512, 256}, 4, true);
}

TEST_CASE("linear on the GPU: shards combined by the simulated all-reduce give the CPU's full "
          "batch",
          "[exact][cuda]") {
  SEQPAR_REQUIRE_CUDA();
  const uint64_t seed = case_seed(0x6b1);
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const Device gpu = Device::cuda(0);
  for (const Shape3& shape : {Shape3{3000, 200, 40}, Shape3{1001, 17, 9}, Shape3{5, 3, 2}}) {
    INFO(describe(shape));
    const Tensor x = random_matrix(rng, shape.rows, shape.in, 10);
    const Tensor grad_y = random_matrix(rng, shape.rows, shape.out, 10);
    const Tensor weight = random_matrix(rng, shape.out, shape.in, 0);
    const nn::LinearGradients cpu = nn::linear_backward(grad_y, x, weight, false, true, true);
    const Tensor x_gpu = x.to(gpu), grad_y_gpu = grad_y.to(gpu), weight_gpu = weight.to(gpu);
    RecordingCombiner full;
    const nn::LinearGradients full_gpu = recorded_backward(grad_y_gpu, x_gpu, weight_gpu, full);
    CHECK_SAME_BITS(full_gpu.weight.to(Device::cpu()), cpu.weight);
    for (int kind = 0; kind < 4; ++kind) {
      // check_sharded compares on the tensors' device: the GPU shards against the CPU's bits.
      const nn::LinearGradients expected{Tensor(), cpu.weight.to(gpu), cpu.bias.to(gpu)};
      check_sharded(grad_y_gpu, x_gpu, weight_gpu, random_partition(rng, shape.rows, kind),
                    expected, full);
    }
  }
}
