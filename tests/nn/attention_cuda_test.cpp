// nn/cuda/attention.cu and nn/cuda/rope.cu against the reference: out, the softmax's m
// and l, dq, dk and dv bit for bit, under every kind of mask, at shapes from one token
// to a Ulysses rank's [1024, 2, 16] and the widest head; RoPE's rotation and its
// transpose. Fresh random inputs (the seed is printed), outputs carved from NaN.
#include <catch2/catch.hpp>

#include <random>
#include <vector>

#include "autograd/variable.h"
#include "core/generator.h"
#include "nn/attention.h"
#include "nn/rope.h"
#include "tests/cuda_test_util.h"
#include "tests/test_util.h"

using namespace seqpar;
using autograd::Variable;

namespace {

struct Outputs {
  std::vector<Tensor> tensors;  // out, m, l, dq, dk, dv
};

Outputs attend(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
               const nn::AttentionMask& mask) {
  const nn::AttentionForward forward = nn::attention_forward(q, k, v, mask);
  const nn::AttentionGrads grads = nn::attention_backward(g, q, k, v, forward, mask);
  return {{forward.out, forward.row_max, forward.row_sum, grads.q, grads.k, grads.v}};
}

std::vector<int64_t> modulo_positions(int64_t tokens, int64_t shard) {
  std::vector<int64_t> positions(tokens);
  for (int64_t t = 0; t < tokens; ++t) positions[t] = t % shard;
  return positions;
}

void check_attention_case(int64_t tokens, int64_t heads, int64_t dim, float spread) {
  const uint64_t seed = std::random_device{}();
  Generator generator(seed);
  const Shape shape{tokens, heads, dim};
  const Tensor q = generator.uniform(shape, -spread, spread), k = generator.uniform(shape, -spread, spread);
  const Tensor v = generator.randn(shape), g = generator.randn(shape);
  const Device gpu = Device::cuda(), ref = Device::reference();
  std::mt19937_64 shuffle(seed);
  std::vector<int64_t> random_positions(tokens);
  for (int64_t& p : random_positions) p = static_cast<int64_t>(shuffle() % 7) - 2;
  const std::vector<nn::AttentionMask> masks = {
      true, false, nn::AttentionMask::causal().at_positions(modulo_positions(tokens, std::max<int64_t>(1, tokens / 4))),
      nn::AttentionMask::causal().at_positions(random_positions)};
  const char* names[] = {"causal", "none", "causal over i mod S/4", "causal over random positions"};
  for (size_t m = 0; m < masks.size(); ++m) {
    INFO("S " << tokens << ", H " << heads << ", D " << dim << ", spread " << spread << ", mask "
              << names[m] << ", seed " << seed);
    const Outputs expected = attend(q.to(ref), k.to(ref), v.to(ref), g.to(ref), masks[m]);
    test::poison_pool(gpu);
    const Outputs got = attend(q.to(gpu), k.to(gpu), v.to(gpu), g.to(gpu), masks[m]);
    const char* what[] = {"out", "row_max", "row_sum", "dq", "dk", "dv"};
    for (size_t t = 0; t < got.tensors.size(); ++t) {
      INFO(what[t]);
      CHECK(test::bitwise_equal(got.tensors[t], expected.tensors[t]));
    }
  }
}

}  // namespace

TEST_CASE("attention on the GPU gives the reference's bits under every mask", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  check_attention_case(1, 1, 1, 1.0f);
  check_attention_case(7, 3, 5, 4.0f);
  check_attention_case(33, 2, 64, 4.0f);
  check_attention_case(129, 4, 16, 8.0f);  // scores far apart: exponentials down to 0
  check_attention_case(200, 1, 128, 2.0f);
  check_attention_case(1024, 2, 16, 1.0f);  // a Ulysses rank's share of the scenario
}

TEST_CASE("attention's autograd on the GPU equals the CPU's", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  const uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  Generator generator(seed);
  const Shape shape{300, 3, 24};
  const Tensor q = generator.uniform(shape, -3, 3), k = generator.uniform(shape, -3, 3);
  const Tensor v = generator.randn(shape), g = generator.randn(shape);
  std::vector<Tensor> results[2];
  const Device devices[] = {Device::cpu(), Device::cuda()};
  for (int where = 0; where < 2; ++where) {
    Variable qv(q.to(devices[where]), true), kv(k.to(devices[where]), true), vv(v.to(devices[where]), true);
    Variable out = nn::scaled_dot_product_attention(qv, kv, vv, true);
    out.backward(g.to(devices[where]));
    results[where] = {out.data(), qv.grad(), kv.grad(), vv.grad()};
  }
  for (size_t t = 0; t < 4; ++t) CHECK(test::bitwise_equal(results[1][t], results[0][t]));
}

TEST_CASE("RoPE on the GPU gives the reference's bits, forward and backward", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  const uint64_t seed = std::random_device{}();
  Generator generator(seed);
  struct Case { int64_t tokens, heads, dim, first; };
  for (const Case c : {Case{1, 1, 2, 0}, Case{37, 3, 16, 500}, Case{256, 8, 16, 768}, Case{9, 2, 128, 1 << 20}}) {
    INFO("S " << c.tokens << ", H " << c.heads << ", D " << c.dim << ", first position " << c.first
              << ", seed " << seed);
    std::vector<int64_t> positions(c.tokens);
    for (int64_t t = 0; t < c.tokens; ++t) positions[t] = c.first + t;
    const Tensor x = generator.uniform({c.tokens, c.heads, c.dim}, -10.0f, 10.0f);
    const nn::RopeTable host(positions, c.dim), device(positions, c.dim, 10000.0f, Device::cuda());
    test::poison_pool(Device::cuda());
    CHECK(test::bitwise_equal(nn::rope_forward(x.to(Device::cuda()), device), nn::rope_forward(x, host)));
    test::poison_pool(Device::cuda());
    CHECK(test::bitwise_equal(nn::rope_backward(x.to(Device::cuda()), device), nn::rope_backward(x, host)));
  }
}
