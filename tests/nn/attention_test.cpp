// nn/attention.h: every mask and layout against a float64 attention written out here
// (its masks too), gradients against central finite differences of it; the CPU row
// bitwise the reference row; the scale; bad input. The bitwise identities (batches,
// documents, grouped-query heads, the work in parts) are in attention_split_test.cpp.
// Accuracy against float64 PyTorch: scripts/crosscheck_attention.py (the [.torch] case
// below writes its inputs).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "apps/common/safetensors.h"
#include "autograd/variable.h"
#include "core/generator.h"
#include "nn/attention.h"
#include "tests/gradcheck.h"
#include "tests/nn/attention_test_util.h"
#include "tests/test_util.h"

using namespace seqpar;
using namespace seqpar::test;
using autograd::Variable;
using test::MatrixD;
using test::same_bits;

namespace {

// Which keys a query sees, written out here independently of nn::AttentionMask.
using Visible = std::function<bool(int64_t b, int64_t i, int64_t j)>;

// A [B, S, H, D] tensor as the float64 matrix [B·S, H·D].
MatrixD as_rows(const Tensor& t) {
  const Tensor c = t.contiguous();
  return test::to_double(c.view({c.size(0) * c.size(1), c.size(2) * c.size(3)}));
}

// softmax(scale · q kᵀ) v over the visible keys, query head h reading kv head h / (Hq / Hkv);
// a row with no visible key gives 0.
MatrixD attention_double(const MatrixD& q, const MatrixD& k, const MatrixD& v, const Shapes& s,
                         double scale, const Visible& visible) {
  const int64_t group = s.heads / s.kv_heads, dim = s.dim;
  MatrixD out = MatrixD::Zero(q.rows(), q.cols());
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t kv = h / group;
      for (int64_t i = 0; i < s.queries; ++i) {
        const auto q_row = q.row(b * s.queries + i).segment(h * dim, dim);
        std::vector<double> score(s.keys, -INFINITY);
        double m = -INFINITY, l = 0.0;
        for (int64_t j = 0; j < s.keys; ++j) {
          if (!visible(b, i, j)) continue;
          score[j] = scale * q_row.dot(k.row(b * s.keys + j).segment(kv * dim, dim));
          m = std::max(m, score[j]);
        }
        if (m == -INFINITY) continue;
        for (int64_t j = 0; j < s.keys; ++j) l += std::exp(score[j] - m);
        for (int64_t j = 0; j < s.keys; ++j) {
          out.block(b * s.queries + i, h * dim, 1, dim) +=
              std::exp(score[j] - m) / l * v.block(b * s.keys + j, kv * dim, 1, dim);
        }
      }
    }
  }
  return out;
}

// The document of `position` among ascending boundaries c_0 = 0 < c_1 < ...
int64_t document(const std::vector<int64_t>& boundaries, int64_t position) {
  int64_t n = 0;
  while (n + 1 < static_cast<int64_t>(boundaries.size()) && boundaries[n + 1] <= position) ++n;
  return n;
}

// A mask as the library takes it, and the same mask written out.
struct MaskCase {
  std::string name;
  nn::AttentionMask mask;
  Visible visible;
};

// Masks for a call of B <= 2 sequences whose queries and keys are the same S tokens.
std::vector<MaskCase> masks_for(int64_t batch, int64_t tokens) {
  const std::vector<int64_t> docs = {0, tokens / 3, tokens / 3 + 1 + tokens / 4, tokens};
  std::vector<std::vector<int64_t>> per_sequence = {{0, tokens / 2, tokens}, {0, 1, tokens}};
  std::vector<int64_t> lengths = {tokens - tokens / 3, tokens};
  per_sequence.resize(batch);
  lengths.resize(batch);
  std::vector<int64_t> shard_local(tokens);
  for (int64_t t = 0; t < tokens; ++t) shard_local[t] = t % 4;
  return {
      {"causal", nn::AttentionMask::causal(), [](int64_t, int64_t i, int64_t j) { return j <= i; }},
      {"none", nn::AttentionMask::none(), [](int64_t, int64_t, int64_t) { return true; }},
      {"documents", nn::AttentionMask::documents(docs),
       [=](int64_t, int64_t i, int64_t j) { return j <= i && document(docs, i) == document(docs, j); }},
      {"documents per sequence, not causal", nn::AttentionMask::documents_per_sequence(per_sequence, false),
       [=](int64_t b, int64_t i, int64_t j) {
         return document(per_sequence[b], i) == document(per_sequence[b], j);
       }},
      {"key padding", nn::AttentionMask::none().with_key_lengths(lengths),
       [=](int64_t b, int64_t, int64_t j) { return j < lengths[b]; }},
      {"causal with key padding", nn::AttentionMask::causal().with_key_lengths(lengths),
       [=](int64_t b, int64_t i, int64_t j) { return j <= i && j < lengths[b]; }},
      {"causal over shard-local positions", nn::AttentionMask::causal().at_positions(shard_local),
       [=](int64_t, int64_t i, int64_t j) { return shard_local[j] <= shard_local[i]; }},
  };
}


}  // namespace

TEST_CASE("attention: every mask and layout against float64, gradients against finite differences",
          "[attention]") {
  const Shapes layouts[] = {square(2, 7, 4, 2, 3), square(2, 6, 2, 2, 4), square(1, 9, 3, 1, 2),
                            square(2, 5, 4, 4, 5)};
  uint64_t seed = 1100;
  for (const Shapes& s : layouts) {
    for (const MaskCase& m : masks_for(s.batch, s.queries)) {
      for (const Device device : {Device::reference(), Device::cpu()}) {
        INFO("B " << s.batch << ", S " << s.queries << ", Hq " << s.heads << ", Hkv " << s.kv_heads << ", D "
                  << s.dim << ", mask " << m.name << " on " << device);
        const Inputs in = random_inputs(s, ++seed, device, 1.5f);
        const float scale = seed % 2 == 0 ? nn::attention_scale(s.dim) : 0.3f;
        const std::vector<Tensor> got = run(in, m.mask, seed % 2 == 0 ? std::nullopt : std::optional<float>(scale));
        const MatrixD weights = as_rows(in.g);
        const auto attend = [&](const std::vector<MatrixD>& x) {
          return attention_double(x[0], x[1], x[2], s, scale, m.visible);
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
}

TEST_CASE("attention: queries and keys at given positions (Sq != Sk) against float64", "[attention]") {
  // A context-parallel rank's call: its 5 queries (a zigzag pair of chunks) against all
  // 12 keys, causal within packed documents.
  const Shapes s{2, 5, 12, 4, 2, 6};
  const std::vector<int64_t> queries = {1, 2, 9, 10, 11}, keys = range(0, 12), docs = {0, 4, 10, 12};
  const nn::AttentionMask mask = nn::AttentionMask::documents(docs).at_positions(queries, keys);
  const Visible visible = [&](int64_t, int64_t i, int64_t j) {
    return keys[j] <= queries[i] && document(docs, keys[j]) == document(docs, queries[i]);
  };
  for (const Device device : {Device::reference(), Device::cpu()}) {
    INFO(device);
    const Inputs in = random_inputs(s, 1900, device, 1.5f);
    const std::vector<Tensor> got = run(in, mask);
    const MatrixD weights = as_rows(in.g);
    const test::ScalarFunction loss = [&](const std::vector<MatrixD>& x) {
      return test::weighted_sum(weights, attention_double(x[0], x[1], x[2], s, nn::attention_scale(s.dim), visible));
    };
    const std::vector<MatrixD> x = {as_rows(in.q), as_rows(in.k), as_rows(in.v)};
    CHECK((as_rows(got[0]) - attention_double(x[0], x[1], x[2], s, nn::attention_scale(s.dim), visible))
              .cwiseAbs()
              .maxCoeff() < 1e-6);
    for (size_t which = 0; which < 3; ++which) {
      CHECK(test::relative_error(as_rows(got[which + 1]), test::numeric_gradient(loss, x, which)) < 1e-5);
    }
  }
}

TEST_CASE("attention: the CPU row gives the reference row's bits", "[attention]") {
  const Shapes layouts[] = {square(1, 1, 1, 1, 1),   square(2, 9, 2, 2, 7),   square(1, 17, 3, 1, 16),
                            square(2, 40, 8, 2, 128), square(1, 64, 4, 4, 16), square(2, 33, 6, 3, 64),
                            square(1, 12, 2, 1, 256)};
  uint64_t seed = 2200;
  for (const Shapes& s : layouts) {
    for (const MaskCase& m : masks_for(s.batch, s.queries)) {
      if (s.queries < 3 && m.name != "causal" && m.name != "none") continue;  // no room for documents
      INFO("B " << s.batch << ", S " << s.queries << ", Hq " << s.heads << ", Hkv " << s.kv_heads << ", D "
                << s.dim << ", mask " << m.name);
      // Spread 4: scores up to 16 D^(1/2), so the softmax ranges over many binades.
      const Inputs cpu = random_inputs(s, ++seed, Device::cpu(), 4.0f);
      const std::vector<Tensor> a = run(cpu, m.mask), b = run(on(cpu, Device::reference()), m.mask);
      for (size_t t = 0; t < a.size(); ++t) {
        INFO("output " << t << " (out, dq, dk, dv)");
        CHECK(same_bits(a[t], b[t]));
      }
    }
  }
}
TEST_CASE("attention: [S, H, D] is one sequence of [1, S, H, D]", "[attention]") {
  const Inputs in = random_inputs(square(1, 11, 4, 2, 8), 3800, Device::cpu(), 2.0f);
  const auto three = [](const Tensor& t) { return t.view({t.size(1), t.size(2), t.size(3)}); };
  const std::vector<Tensor> four = run(in, true), flat = run({three(in.q), three(in.k), three(in.v), three(in.g)}, true);
  for (size_t t = 0; t < four.size(); ++t) {
    CHECK(flat[t].dim() == 3);
    CHECK(same_bits(flat[t], four[t]));
  }
  CHECK(nn::attention_forward(three(in.q), three(in.k), three(in.v)).row_max.shape() == Shape{4, 11});
}

TEST_CASE("attention: under the causal mask, later tokens change nothing before them", "[attention]") {
  const Shapes s = square(1, 12, 2, 2, 8);
  const int64_t cut = 5;
  const Inputs in = random_inputs(s, 4400, Device::cpu());
  const Inputs changed = random_inputs(s, 4401, Device::cpu());
  // Tokens cut.. of k and v replaced: the outputs of queries 0..cut-1 keep their bits.
  Inputs mixed{in.q, in.k.clone(), in.v.clone(), in.g};
  mixed.k.narrow(1, cut, s.keys - cut).copy_(changed.k.narrow(1, cut, s.keys - cut));
  mixed.v.narrow(1, cut, s.keys - cut).copy_(changed.v.narrow(1, cut, s.keys - cut));
  const Tensor a = nn::attention_forward(in.q, in.k, in.v, true).out;
  const Tensor b = nn::attention_forward(mixed.q, mixed.k, mixed.v, true).out;
  CHECK(same_bits(a.narrow(1, 0, cut), b.narrow(1, 0, cut)));
  CHECK_FALSE(same_bits(a.narrow(1, cut, s.queries - cut), b.narrow(1, cut, s.queries - cut)));
  // Without the mask every output sees every key.
  const Tensor c = nn::attention_forward(mixed.q, mixed.k, mixed.v, false).out;
  CHECK_FALSE(same_bits(nn::attention_forward(in.q, in.k, in.v, false).out.narrow(1, 0, 1), c.narrow(1, 0, 1)));
}

TEST_CASE("attention: the scale is 1/sqrt(D) rounded once to float, or the one given", "[attention]") {
  CHECK(nn::attention_scale(16) == 0.25f);
  CHECK(nn::attention_scale(1) == 1.0f);
  CHECK(nn::attention_scale(2) == static_cast<float>(0.70710678118654752440));
  CHECK(nn::attention_scale(128) == static_cast<float>(0.08838834764831844055));
  const Inputs in = random_inputs(square(1, 6, 2, 2, 16), 4500, Device::cpu());
  CHECK(same_bits(nn::attention_forward(in.q, in.k, in.v, true, 0.25f).out, nn::attention_forward(in.q, in.k, in.v).out));
  CHECK_FALSE(same_bits(nn::attention_forward(in.q, in.k, in.v, true, 1.0f / 16).out,
                        nn::attention_forward(in.q, in.k, in.v).out));
}

TEST_CASE("attention: bad input is a clear error", "[attention]") {
  const Tensor a = Tensor::zeros({1, 4, 2, 8}), kv = Tensor::zeros({1, 4, 1, 8});
  const auto attend = [](const Tensor& q, const Tensor& k, const Tensor& v, const nn::AttentionMask& mask = true) {
    nn::attention_forward(q, k, v, mask);
  };
  using Catch::Contains;
  CHECK_NOTHROW(attend(a, kv, kv));  // GQA
  CHECK_THROWS_WITH(attend(a, kv, Tensor::zeros({1, 4, 2, 8})),
                    Contains("k and v must be one shape"));
  CHECK_THROWS_WITH(attend(Tensor::zeros({1, 4, 3, 8}), Tensor::zeros({1, 4, 2, 8}), Tensor::zeros({1, 4, 2, 8})),
                    Contains("3 heads are not a multiple of k and v's 2"));
  CHECK_THROWS_WITH(attend(Tensor::zeros({4, 16}), Tensor::zeros({4, 16}), Tensor::zeros({4, 16})),
                    Contains("q must be [B, S, Hq, D]"));
  CHECK_THROWS_WITH(attend(a, Tensor::zeros({2, 4, 2, 8}), Tensor::zeros({2, 4, 2, 8})), Contains("q holds 1 sequences and k 2"));
  CHECK_THROWS_WITH(attend(a, Tensor::zeros({1, 4, 2, 4}), Tensor::zeros({1, 4, 2, 4})), Contains("head dim 8 and k's 4"));
  const Tensor wide = Tensor::zeros({1, 2, 1, 257});
  CHECK_THROWS_WITH(attend(wide, wide, wide), Contains("head dim D = 257"));
  CHECK_THROWS_WITH(attend(a, a.to(Device::reference()), a), Contains("one device"));
  CHECK_THROWS_WITH(attend(a, Tensor::zeros({1, 6, 2, 8}), Tensor::zeros({1, 6, 2, 8})),
                    Contains("q has 4 tokens and k 6; say where they sit"));
  CHECK_THROWS_WITH(attend(a, a, a, nn::AttentionMask::causal().at_positions({0, 1, 2})),
                    Contains("3 query positions for 4 query tokens"));
  CHECK_THROWS_WITH(attend(a, a, a, nn::AttentionMask::documents({1, 4})), Contains("must start at 0"));
  CHECK_THROWS_WITH(attend(a, a, a, nn::AttentionMask::documents({0, 3, 3, 4})), Contains("boundary 2 is 3 after 3"));
  CHECK_THROWS_WITH(attend(a, a, a, nn::AttentionMask::documents({0, 2, 3})),
                    Contains("query 3 at position 3 lies outside the documents [0, 3)"));
  CHECK_THROWS_WITH(attend(a, a, a, nn::AttentionMask::documents_per_sequence({{0, 4}, {0, 4}, {0, 4}})),
                    Contains("boundaries for 3 sequences"));
  CHECK_THROWS_WITH(attend(a, a, a, nn::AttentionMask::none().with_key_lengths({4, 4})),
                    Contains("2 key lengths for a batch of 1"));
  CHECK_THROWS_WITH(attend(a, a, a, nn::AttentionMask::none().with_key_lengths({-1})), Contains("negative"));
  CHECK_THROWS_WITH(nn::attention_forward(a, a, a, true, INFINITY), Contains("scale must be finite"));
  const nn::AttentionForward forward = nn::attention_forward(a, a, a);
  CHECK_THROWS_WITH(nn::attention_backward(kv, a, a, a, forward), Contains("grad_out"));
  CHECK_THROWS_WITH(nn::attention_backward(a, a, a, a, nn::AttentionForward{a, a, a}),
                    Contains("the forward's tensors must be this q's"));
}

// Writes random cases for scripts/crosscheck_attention.py into $SEQPAR_CROSSCHECK_DIR
// (ctest's nn_attention_crosscheck runs both): random shapes, grouped-query heads, and
// each mask, described in the metadata for the script to rebuild on its own.
TEST_CASE("attention: cases for the PyTorch cross-check", "[.torch]") {
  const char* directory = std::getenv("SEQPAR_CROSSCHECK_DIR");
  REQUIRE(directory != nullptr);
  Generator shapes(5500);
  const Tensor draws = shapes.uniform({14, 4}, 0.0f, 1.0f);
  const auto list = [](const std::vector<int64_t>& values) {
    std::string text = "[";
    for (size_t n = 0; n < values.size(); ++n) text += (n ? "," : "") + std::to_string(values[n]);
    return text + "]";
  };
  for (int64_t n = 0; n < 14; ++n) {
    const int64_t tokens = 4 + static_cast<int64_t>(draws.at({n, 0}) * 92);
    const int64_t kv_heads = 1 + static_cast<int64_t>(draws.at({n, 1}) * 3);
    const int64_t heads = kv_heads * (1 + static_cast<int64_t>(draws.at({n, 3}) * 3));
    const int64_t dim = n == 0 ? 256 : n == 1 ? 128 : 1 + static_cast<int64_t>(draws.at({n, 2}) * 64);
    const int64_t batch = 1 + n % 2;
    const bool causal = n % 3 != 2;
    const std::vector<int64_t> docs = n % 4 == 1 ? std::vector<int64_t>{0, tokens / 3, tokens} : std::vector<int64_t>{};
    const std::vector<int64_t> lengths = n % 4 == 3 ? std::vector<int64_t>(batch, tokens - tokens / 4) : std::vector<int64_t>{};
    nn::AttentionMask mask = docs.empty() ? nn::AttentionMask(causal) : nn::AttentionMask::documents(docs, causal);
    if (!lengths.empty()) mask = mask.with_key_lengths(lengths);
    const float scale = n % 5 == 4 ? 0.125f : nn::attention_scale(dim);
    const Inputs in = random_inputs(square(batch, tokens, heads, kv_heads, dim), 5600 + n, Device::cpu(), 3.0f);
    const std::vector<Tensor> got = run(in, mask, scale);
    char scale_text[32];
    std::snprintf(scale_text, sizeof scale_text, "%.9g", scale);
    save_safetensors(std::string(directory) + "/attention" + std::to_string(n) + ".safetensors",
                     {{"q", in.q}, {"k", in.k}, {"v", in.v}, {"grad_out", in.g}, {"out", got[0]},
                      {"grad_q", got[1]}, {"grad_k", got[2]}, {"grad_v", got[3]}},
                     {{"causal", causal ? "1" : "0"}, {"documents", list(docs)}, {"key_lengths", list(lengths)},
                      {"scale", scale_text}});
  }
}
