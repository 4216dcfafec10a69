// Every fast path of Linear against the plain reference (nn/reference/linear.h), bit for
// bit: the CPU's vector loops and one-magnitude sums on [cpu], the CUDA kernels on
// [cuda], at random shapes with random data (a spread of exponents, zeros, a dy of one
// magnitude as an L1 loss gives, and strided views). Then nn::ExactGradients: ranks'
// and micro-batches' exact sums added before one rounding give one-rank training's
// gradients.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "autograd/variable.h"
#include "core/device.h"
#include "core/tensor.h"
#include "nn/exact_gradients.h"
#include "nn/l1_loss.h"
#include "nn/linear.h"
#include "tests/test_util.h"

namespace seqpar {
namespace {

int64_t uniform(std::mt19937_64& rng, int64_t low, int64_t high) {
  return std::uniform_int_distribution<int64_t>(low, high)(rng);
}

// Random floats of either sign with exponents spread over ±spread, and some zeros.
Tensor random_matrix(std::mt19937_64& rng, int64_t rows, int64_t cols, int spread) {
  std::vector<float> values(static_cast<size_t>(rows * cols));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : values) {
    const int64_t kind = uniform(rng, 0, 49);
    v = kind == 0 ? 0.0f : std::ldexp(normal(rng), static_cast<int>(uniform(rng, -spread, spread)));
  }
  return Tensor::from_data({rows, cols}, values);
}

// dy of one magnitude: ±f or 0, what an L1 loss's backward gives.
Tensor one_magnitude_matrix(std::mt19937_64& rng, int64_t rows, int64_t cols) {
  const float f = std::ldexp(1.0f + static_cast<float>(uniform(rng, 0, 1023)) / 1024.0f,
                             static_cast<int>(uniform(rng, -30, 0)));
  std::vector<float> values(static_cast<size_t>(rows * cols));
  for (float& v : values) {
    const int64_t sign = uniform(rng, -1, 1);
    v = sign == 0 ? 0.0f : static_cast<float>(sign) * f;
  }
  return Tensor::from_data({rows, cols}, values);
}

struct Case {
  Tensor x, weight, bias, grad_y;
  std::string description;
};

Case random_case(std::mt19937_64& rng, int index) {
  const int64_t rows = uniform(rng, 1, 300), in = uniform(rng, 1, 70), out = uniform(rng, 1, 20);
  const int spread = static_cast<int>(uniform(rng, 0, 24));
  Case c;
  // Every third case: x a column window of a wider tensor (a row stride past its width).
  const int64_t extra = index % 3 == 0 ? uniform(rng, 1, 9) : 0;
  c.x = random_matrix(rng, rows, in + extra, spread).narrow(1, 0, in);
  c.weight = random_matrix(rng, out, in, 2);
  c.bias = random_matrix(rng, 1, out, 2).view({out});
  c.grad_y = index % 2 == 0 ? one_magnitude_matrix(rng, rows, out) : random_matrix(rng, rows, out, spread);
  c.description = std::to_string(rows) + " x " + std::to_string(in) + " -> " + std::to_string(out) +
                  ", spread 2^+-" + std::to_string(spread) + (index % 2 == 0 ? ", dy = +-f" : "") +
                  (extra > 0 ? ", x a window" : "");
  return c;
}

// y, dx, dW and db on `device` against the reference device, bit for bit.
void check_against_reference(const Case& c, Device device) {
  INFO(c.description << " on " << device);
  const Device reference = Device::reference();
  const Tensor y_ref = nn::linear_forward(c.x.to(reference), c.weight.to(reference), c.bias.to(reference));
  const nn::LinearGradients g_ref = nn::linear_backward(c.grad_y.to(reference), c.x.to(reference),
                                                        c.weight.to(reference), true, true, true);
  const Tensor x = c.x.device() == device ? c.x : c.x.contiguous().to(device);
  const Tensor y = nn::linear_forward(x, c.weight.to(device), c.bias.to(device));
  const nn::LinearGradients g =
      nn::linear_backward(c.grad_y.to(device), x, c.weight.to(device), true, true, true);
  CHECK(test::same_bits(y, y_ref));
  CHECK(test::same_bits(g.x, g_ref.x));
  CHECK(test::same_bits(g.weight, g_ref.weight));
  CHECK(test::same_bits(g.bias, g_ref.bias));
}

uint64_t fresh_seed() { return std::random_device{}(); }

}  // namespace

TEST_CASE("Linear on the CPU gives the reference's bits at random shapes", "[nn][linear][cpu]") {
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 24; ++i) check_against_reference(random_case(rng, i), Device::cpu());
}

TEST_CASE("Linear on the GPU gives the reference's bits at random shapes", "[nn][linear][cuda]") {
  SEQPAR_REQUIRE_CUDA();
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 24; ++i) check_against_reference(random_case(rng, i), Device::cuda(0));
}

TEST_CASE("the reference's Linear is what its header says: fma chains and exact sums",
          "[nn][linear][cpu]") {
  // Independent of every implementation: y by a double dot product where the chain is
  // exact (small integers), dW and db by integer sums of integer data.
  std::vector<float> xs, ws, dys;
  for (int i = 0; i < 6 * 5; ++i) xs.push_back(static_cast<float>((i * 7) % 11 - 5));
  for (int i = 0; i < 3 * 5; ++i) ws.push_back(static_cast<float>((i * 5) % 7 - 3));
  for (int i = 0; i < 6 * 3; ++i) dys.push_back(static_cast<float>((i * 3) % 5 - 2));
  const Device reference = Device::reference();
  const Tensor x = Tensor::from_data({6, 5}, xs).to(reference);
  const Tensor weight = Tensor::from_data({3, 5}, ws).to(reference);
  const Tensor bias = Tensor::from_data({3}, {0.5f, -1.0f, 2.0f}).to(reference);
  const Tensor dy = Tensor::from_data({6, 3}, dys).to(reference);
  const std::vector<float> y = nn::linear_forward(x, weight, bias).to_vector();
  const nn::LinearGradients g = nn::linear_backward(dy, x, weight, true, true, true);
  const std::vector<float> dx = g.x.to_vector(), dw = g.weight.to_vector(), db = g.bias.to_vector();
  const std::vector<float> b = {0.5f, -1.0f, 2.0f};
  for (int i = 0; i < 6; ++i) {
    for (int j = 0; j < 3; ++j) {
      double sum = 0;
      for (int k = 0; k < 5; ++k) sum += double(xs[i * 5 + k]) * ws[j * 5 + k];
      CHECK(y[i * 3 + j] == static_cast<float>(sum + b[j]));
    }
    for (int k = 0; k < 5; ++k) {
      double sum = 0;
      for (int j = 0; j < 3; ++j) sum += double(dys[i * 3 + j]) * ws[j * 5 + k];
      CHECK(dx[i * 5 + k] == static_cast<float>(sum));
    }
  }
  for (int j = 0; j < 3; ++j) {
    double bias_sum = 0;
    for (int i = 0; i < 6; ++i) bias_sum += dys[i * 3 + j];
    CHECK(db[j] == static_cast<float>(bias_sum));
    for (int k = 0; k < 5; ++k) {
      double sum = 0;
      for (int i = 0; i < 6; ++i) sum += double(dys[i * 3 + j]) * xs[i * 5 + k];
      CHECK(dw[j * 5 + k] == static_cast<float>(sum));
    }
  }
}

namespace {

// One rank of a simulated group: its own copy of the parameters, its ExactGradients.
struct SimulatedRank {
  autograd::Variable weight, bias;
  nn::ExactGradients exact;
};

// A micro-batch's L1 loss over rows [first, first + count) of x, as a share of the mean
// over all `total` rows (the exact policy's global scale).
void backward_on_rows(SimulatedRank& rank, const Tensor& x, int64_t first, int64_t count,
                      int64_t total, int64_t out) {
  const autograd::Variable rows(x.narrow(0, first, count));
  const autograd::Variable target(x.narrow(0, first, count).narrow(1, 0, out));
  const nn::ExactGradients::Recording recording(rank.exact);
  nn::l1_loss(nn::linear(rows, rank.weight, rank.bias), target, nn::Reduction::sum_divided_by(total * out))
      .backward();
}

void check_exact_gradients(Device device) {
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed << ", " << device);
  std::mt19937_64 rng(seed);
  const int64_t rows = uniform(rng, 40, 400), in = uniform(rng, 17, 60), out = uniform(rng, 1, 16);
  const Tensor x = random_matrix(rng, rows, in, 3).to(device);
  const Tensor weight = random_matrix(rng, out, in, 1).to(device), bias = Tensor::zeros({out}, device);
  // One rank, all rows, one pass: the gradients the group must reproduce.
  SimulatedRank one{autograd::Variable(weight.clone(), true), autograd::Variable(bias.clone(), true), {}};
  nn::l1_loss(nn::linear(autograd::Variable(x), one.weight, one.bias),
              autograd::Variable(x.narrow(1, 0, out)), nn::Reduction::sum_divided_by(rows * out))
      .backward();
  // Three ranks with uneven shards, each in two micro-batches.
  const int64_t cuts[4] = {0, uniform(rng, 1, rows / 3), uniform(rng, rows / 3 + 1, rows - 2), rows};
  std::vector<SimulatedRank> ranks;
  for (int r = 0; r < 3; ++r) {
    ranks.push_back({autograd::Variable(weight.clone(), true), autograd::Variable(bias.clone(), true), {}});
    const int64_t first = cuts[r], count = cuts[r + 1] - cuts[r], half = count / 2;
    backward_on_rows(ranks.back(), x, first, half, rows, out);
    backward_on_rows(ranks.back(), x, first + half, count - half, rows, out);
  }
  // What each rank's backward left in .grad is its own partial gradient, not the group's.
  CHECK_FALSE(test::same_bits(ranks[0].weight.grad(), one.weight.grad()));
  // The all-reduce, simulated: each rank's sums become the digit-wise total of all three.
  const size_t ops = ranks[0].exact.sums().size();
  REQUIRE(ops == 1);  // one Linear: dW's sums then db's, micro-batches added in place
  exact::ExactSums total(ranks[0].exact.sums()[0]->count(), device);
  for (SimulatedRank& rank : ranks) total.add(*rank.exact.sums()[0]);
  for (SimulatedRank& rank : ranks) {
    rank.exact.sums()[0]->copy_from(total);
    rank.exact.round_into_grads();
    CHECK(rank.exact.empty());
    CHECK(test::same_bits(rank.weight.grad(), one.weight.grad()));
    CHECK(test::same_bits(rank.bias.grad(), one.bias.grad()));
  }
}

}  // namespace

TEST_CASE("ExactGradients: ranks' and micro-batches' sums rounded once are one rank's gradients",
          "[nn][exact][cpu]") {
  check_exact_gradients(Device::cpu());
  check_exact_gradients(Device::reference());
}

TEST_CASE("ExactGradients on a GPU: one rank's gradients", "[nn][exact][cuda]") {
  SEQPAR_REQUIRE_CUDA();
  check_exact_gradients(Device::cuda(0));
}

TEST_CASE("ExactGradients records nothing outside a Recording", "[nn][exact][cpu]") {
  nn::ExactGradients exact;
  const autograd::Variable x(Tensor::ones({4, 3})), w(Tensor::ones({2, 3}), true), b(Tensor::zeros({2}), true);
  nn::l1_loss(nn::linear(x, w, b), autograd::Variable(Tensor::zeros({4, 2})), nn::Reduction::mean()).backward();
  CHECK(exact.empty());
  {
    const nn::ExactGradients::Recording recording(exact);
    nn::l1_loss(nn::linear(x, w, b), autograd::Variable(Tensor::zeros({4, 2})), nn::Reduction::mean())
        .backward();
  }
  CHECK(exact.sums().size() == 1);
}

}  // namespace seqpar
