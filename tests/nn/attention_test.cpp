// nn/attention.h: gradients against central finite differences of a float64
// re-implementation; the CPU row bitwise the reference row; invariance under the heads
// a call holds; the causal mask, over indices and over given positions; bad input. Accuracy against float64 PyTorch:
// scripts/crosscheck_attention.py (the [.torch] case below writes its inputs).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "autograd/variable.h"
#include "core/generator.h"
#include "apps/common/safetensors.h"
#include "nn/attention.h"
#include "tests/gradcheck.h"
#include "tests/test_util.h"

using namespace seqpar;
using autograd::Variable;
using test::MatrixD;
using test::same_bits;

namespace {

struct Inputs {
  Tensor q, k, v, g;
};

Inputs random_inputs(int64_t tokens, int64_t heads, int64_t dim, uint64_t seed, Device device,
                     float spread = 1.0f) {
  Generator generator(seed);
  const Shape shape{tokens, heads, dim};
  return {generator.uniform(shape, -spread, spread).to(device),
          generator.uniform(shape, -spread, spread).to(device),
          generator.randn(shape).to(device), generator.randn(shape).to(device)};
}

// Forward and backward through autograd: out, dq, dk, dv.
std::vector<Tensor> run(const Inputs& in, const nn::AttentionMask& mask) {
  Variable q(in.q, true), k(in.k, true), v(in.v, true);
  Variable out = nn::scaled_dot_product_attention(q, k, v, mask);
  out.backward(in.g);
  return {out.data(), q.grad(), k.grad(), v.grad()};
}

// The float64 attention of q, k, v given as [S, H·D] matrices.
// A causal mask here is written out independently of nn::AttentionMask: key j is
// visible to query i iff position[j] <= position[i].
MatrixD attention_double(const MatrixD& q, const MatrixD& k, const MatrixD& v, int64_t heads,
                         bool causal, std::vector<int64_t> positions = {}) {
  const int64_t tokens = q.rows(), dim = q.cols() / heads;
  if (positions.empty()) {
    for (int64_t t = 0; t < tokens; ++t) positions.push_back(t);
  }
  MatrixD out = MatrixD::Zero(tokens, q.cols());
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < tokens; ++i) {
      std::vector<double> s(tokens, -INFINITY);
      double m = -INFINITY, l = 0.0;
      for (int64_t j = 0; j < tokens; ++j) {
        if (causal && positions[j] > positions[i]) continue;
        s[j] = q.row(i).segment(h * dim, dim).dot(k.row(j).segment(h * dim, dim)) / std::sqrt(double(dim));
        m = std::max(m, s[j]);
      }
      for (int64_t j = 0; j < tokens; ++j) l += std::exp(s[j] - m);
      for (int64_t j = 0; j < tokens; ++j) {
        out.block(i, h * dim, 1, dim) += std::exp(s[j] - m) / l * v.block(j, h * dim, 1, dim);
      }
    }
  }
  return out;
}

// Positions as a sequence-parallel mistake makes them (each shard of `shard` tokens
// numbered from 0) and as a packed batch might (runs restarting, repeats).
std::vector<int64_t> shard_local_positions(int64_t tokens, int64_t shard) {
  std::vector<int64_t> positions(tokens);
  for (int64_t t = 0; t < tokens; ++t) positions[t] = t % shard;
  return positions;
}

MatrixD as_rows(const Tensor& t) { return test::to_double(t.contiguous().view({t.size(0), t.size(1) * t.size(2)})); }

}  // namespace

TEST_CASE("attention: gradients match central finite differences in float64", "[attention]") {
  struct Case { int64_t tokens, heads, dim; bool causal; std::vector<int64_t> positions; };
  const Case cases[] = {{5, 2, 3, true, {}}, {6, 1, 8, false, {}}, {4, 3, 2, false, {}},
                        {7, 2, 5, true, {}}, {6, 2, 4, true, {2, 0, 1, 2, 0, 1}}};
  uint64_t seed = 1100;
  for (const Case& c : cases) {
    const nn::AttentionMask mask =
        c.positions.empty() ? nn::AttentionMask(c.causal) : nn::AttentionMask::causal_over(c.positions);
    for (const Device device : {Device::reference(), Device::cpu()}) {
      INFO("S " << c.tokens << ", H " << c.heads << ", D " << c.dim << ", causal " << c.causal
                << (c.positions.empty() ? "" : " over positions") << " on " << device);
      const Inputs in = random_inputs(c.tokens, c.heads, c.dim, ++seed, device, 1.5f);
      const std::vector<Tensor> got = run(in, mask);
      const MatrixD weights = as_rows(in.g);
      const auto attend = [&](const std::vector<MatrixD>& x) {
        return attention_double(x[0], x[1], x[2], c.heads, c.causal, c.positions);
      };
      const test::ScalarFunction loss = [&](const std::vector<MatrixD>& x) {
        return test::weighted_sum(weights, attend(x));
      };
      const std::vector<MatrixD> x = {as_rows(in.q), as_rows(in.k), as_rows(in.v)};
      CHECK((as_rows(got[0]) - attend(x)).cwiseAbs().maxCoeff() < 1e-6);
      for (size_t which = 0; which < 3; ++which) {
        INFO("input " << "qkv"[which]);
        CHECK(test::relative_error(as_rows(got[which + 1]), test::numeric_gradient(loss, x, which)) < 1e-5);
      }
    }
  }
}

TEST_CASE("attention: the CPU row gives the reference row's bits", "[attention]") {
  struct Case { int64_t tokens, heads, dim; };
  const Case cases[] = {{1, 1, 1}, {9, 2, 7}, {17, 3, 16}, {40, 1, 128}, {64, 4, 16}, {33, 2, 64}};
  uint64_t seed = 2200;
  for (const Case& c : cases) {
    const std::vector<nn::AttentionMask> masks = {
        true, false, nn::AttentionMask::causal_over(shard_local_positions(c.tokens, 4))};
    for (size_t which = 0; which < masks.size(); ++which) {
      INFO("S " << c.tokens << ", H " << c.heads << ", D " << c.dim
                << ", mask " << (which == 0 ? "causal" : which == 1 ? "none" : "causal over i mod 4"));
      // Spread 4: scores up to 16 D^(1/2), so the softmax ranges over many binades.
      const Inputs cpu = random_inputs(c.tokens, c.heads, c.dim, ++seed, Device::cpu(), 4.0f);
      const Inputs ref{cpu.q.to(Device::reference()), cpu.k.to(Device::reference()),
                       cpu.v.to(Device::reference()), cpu.g.to(Device::reference())};
      const std::vector<Tensor> a = run(cpu, masks[which]), b = run(ref, masks[which]);
      for (size_t t = 0; t < a.size(); ++t) {
        INFO("output " << t << " (out, dq, dk, dv)");
        CHECK(same_bits(a[t], b[t]));
      }
    }
  }
}

TEST_CASE("attention: a causal mask over positions", "[attention]") {
  const int64_t tokens = 24, heads = 2, dim = 8;
  for (const Device device : {Device::reference(), Device::cpu()}) {
    INFO(device);
    const Inputs in = random_inputs(tokens, heads, dim, 2900, device, 2.0f);
    // Positions 0..S-1 are the ordinary causal mask, bit for bit.
    std::vector<int64_t> identity(tokens);
    for (int64_t t = 0; t < tokens; ++t) identity[t] = t;
    const std::vector<Tensor> plain = run(in, true), over = run(in, nn::AttentionMask::causal_over(identity));
    for (size_t t = 0; t < plain.size(); ++t) CHECK(same_bits(plain[t], over[t]));
    // Shard-local and shuffled positions (repeats, gaps, negatives) against float64.
    const std::vector<std::vector<int64_t>> cases = {
        shard_local_positions(tokens, 6), {5, -3, 5, 0, 9, 9, 1, 2, 40, -3, 7, 7,
                                           8, 1, 0, 0, 3, 12, 11, 10, 6, 6, 2, 5}};
    for (const std::vector<int64_t>& positions : cases) {
      const std::vector<Tensor> got = run(in, nn::AttentionMask::causal_over(positions));
      const MatrixD expected =
          attention_double(as_rows(in.q), as_rows(in.k), as_rows(in.v), heads, true, positions);
      CHECK((as_rows(got[0]) - expected).cwiseAbs().maxCoeff() < 1e-6);
      CHECK((as_rows(got[0]) - as_rows(plain[0])).cwiseAbs().maxCoeff() > 1e-3);  // another mask
    }
  }
}

TEST_CASE("attention: any subset of heads gives those heads' bits of the full call", "[attention]") {
  // As a Ulysses rank holding H/P heads (or an uneven share) computes them.
  const int64_t tokens = 29, heads = 7, dim = 12;
  for (const Device device : {Device::reference(), Device::cpu()}) {
    const Inputs in = random_inputs(tokens, heads, dim, 3300, device, 3.0f);
    const std::vector<Tensor> full = run(in, true);
    for (const auto& [first, count] : std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {2, 3}, {4, 3}, {6, 1}}) {
      INFO(device << ": heads " << first << " .. " << first + count - 1);
      const Inputs part{in.q.narrow(1, first, count), in.k.narrow(1, first, count),
                        in.v.narrow(1, first, count), in.g.narrow(1, first, count)};
      const std::vector<Tensor> got = run(part, true);
      for (size_t t = 0; t < got.size(); ++t) CHECK(same_bits(got[t], full[t].narrow(1, first, count)));
    }
  }
}

TEST_CASE("attention: under the causal mask, later tokens change nothing before them", "[attention]") {
  const int64_t tokens = 12, heads = 2, dim = 8, cut = 5;
  const Inputs in = random_inputs(tokens, heads, dim, 4400, Device::cpu());
  const Inputs changed = random_inputs(tokens, heads, dim, 4401, Device::cpu());
  // Tokens cut.. of k and v replaced: the outputs of queries 0..cut-1 keep their bits.
  Inputs mixed{in.q, in.k.clone(), in.v.clone(), in.g};
  mixed.k.narrow(0, cut, tokens - cut).copy_(changed.k.narrow(0, cut, tokens - cut));
  mixed.v.narrow(0, cut, tokens - cut).copy_(changed.v.narrow(0, cut, tokens - cut));
  const Tensor a = nn::attention_forward(in.q, in.k, in.v, true).out;
  const Tensor b = nn::attention_forward(mixed.q, mixed.k, mixed.v, true).out;
  CHECK(same_bits(a.narrow(0, 0, cut), b.narrow(0, 0, cut)));
  CHECK_FALSE(same_bits(a.narrow(0, cut, tokens - cut), b.narrow(0, cut, tokens - cut)));
  // Without the mask every output sees every key.
  const Tensor c = nn::attention_forward(mixed.q, mixed.k, mixed.v, false).out;
  CHECK_FALSE(same_bits(nn::attention_forward(in.q, in.k, in.v, false).out.narrow(0, 0, 1), c.narrow(0, 0, 1)));
}

TEST_CASE("attention: the scale is 1/sqrt(D) rounded once to float", "[attention]") {
  CHECK(nn::attention_scale(16) == 0.25f);
  CHECK(nn::attention_scale(1) == 1.0f);
  CHECK(nn::attention_scale(2) == static_cast<float>(0.70710678118654752440));
  CHECK(nn::attention_scale(128) == static_cast<float>(0.08838834764831844055));
}

TEST_CASE("attention: bad input is a clear error", "[attention]") {
  const Tensor a = Tensor::zeros({4, 2, 8}), b = Tensor::zeros({4, 2, 4});
  const auto attend = [](const Tensor& q, const Tensor& k, const Tensor& v) {
    nn::attention_forward(q, k, v, true);
  };
  CHECK_THROWS_WITH(attend(a, b, a), Catch::Contains("q, k and v must have one shape"));
  CHECK_THROWS_WITH(attend(Tensor::zeros({4, 16}), Tensor::zeros({4, 16}), Tensor::zeros({4, 16})),
                    Catch::Contains("q must be [S, H, D]"));
  const Tensor wide = Tensor::zeros({2, 1, 129});
  CHECK_THROWS_WITH(attend(wide, wide, wide), Catch::Contains("head dim D = 129"));
  CHECK_THROWS_WITH(attend(a, a.to(Device::reference()), a), Catch::Contains("one device"));
  const nn::AttentionForward forward = nn::attention_forward(a, a, a, true);
  CHECK_THROWS_WITH(nn::attention_backward(b, a, a, a, forward, true), Catch::Contains("grad_out"));
  CHECK_THROWS_WITH(nn::attention_forward(a, a, a, nn::AttentionMask::causal_over({0, 1, 2})),
                    Catch::Contains("3 positions for S = 4 tokens"));
  nn::AttentionMask unmasked = nn::AttentionMask::causal_over({0, 1, 2, 3});
  unmasked.causal = false;
  CHECK_THROWS_WITH(nn::attention_forward(a, a, a, unmasked), Catch::Contains("not causal"));
}

// Writes random cases for scripts/crosscheck_attention.py into $SEQPAR_CROSSCHECK_DIR
// (ctest's nn_attention_crosscheck runs both).
TEST_CASE("attention: cases for the PyTorch cross-check", "[.torch]") {
  const char* directory = std::getenv("SEQPAR_CROSSCHECK_DIR");
  REQUIRE(directory != nullptr);
  Generator shapes(5500);
  const Tensor draws = shapes.uniform({12, 3}, 0.0f, 1.0f);
  for (int64_t n = 0; n < 12; ++n) {
    const int64_t tokens = 1 + static_cast<int64_t>(draws.at({n, 0}) * 96);
    const int64_t heads = 1 + static_cast<int64_t>(draws.at({n, 1}) * 4);
    const int64_t dim = n == 0 ? 128 : 1 + static_cast<int64_t>(draws.at({n, 2}) * 64);
    const bool causal = n % 2 == 0;
    const Inputs in = random_inputs(tokens, heads, dim, 5600 + n, Device::cpu(), 3.0f);
    const std::vector<Tensor> got = run(in, causal);
    save_safetensors(std::string(directory) + "/attention" + std::to_string(n) + ".safetensors",
                     {{"q", in.q}, {"k", in.k}, {"v", in.v}, {"grad_out", in.g}, {"out", got[0]},
                      {"grad_q", got[1]}, {"grad_k", got[2]}, {"grad_v", got[3]}},
                     {{"causal", causal ? "1" : "0"}});
  }
}
