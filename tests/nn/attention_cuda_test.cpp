// nn/cuda/attention.cu and nn/cuda/rope.cu against the reference: out, the softmax's m
// and l, dq, dk and dv bit for bit under every kind of mask (causal, none, packed
// documents, key padding, a context-parallel rank's query and key positions, positions
// that repeat), for batches of 1 and 2, MHA, GQA and MQA, head dims from 1 to 256 and
// several scales; the backward's two halves against the whole; rows longer than a tile
// and sequences of many tiles, whole up to 1,024 tokens and sampled at 16,384 and
// 131,072; the refusals; RoPE's rotation and its transpose. Fresh random inputs (the
// seed is printed), outputs carved from NaN.
#include <catch2/catch.hpp>

#include <algorithm>
#include <optional>
#include <random>
#include <string>
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

// out, m, l, dq, dk, dv
std::vector<Tensor> attend(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                           const nn::AttentionMask& mask, std::optional<float> scale) {
  const nn::AttentionForward forward = nn::attention_forward(q, k, v, mask, scale);
  const nn::AttentionGrads grads = nn::attention_backward(g, q, k, v, forward, mask, scale);
  return {forward.out, forward.row_max, forward.row_sum, grads.q, grads.k, grads.v};
}

// How the heads are laid out: Hq query heads over Hkv kv heads.
struct Heads {
  int64_t heads, kv_heads;
  const char* name;
};

// A mask and the query tokens it takes (the keys are always the sequence's S tokens).
struct MaskCase {
  std::string name;
  int64_t queries;
  nn::AttentionMask mask;
};

std::vector<int64_t> iota(int64_t first, int64_t end) {
  std::vector<int64_t> values;
  for (int64_t t = first; t < end; ++t) values.push_back(t);
  return values;
}

std::vector<int64_t> concat(std::vector<int64_t> a, const std::vector<int64_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Every kind of mask for `batch` sequences of `tokens` (at least 12) key tokens.
std::vector<MaskCase> masks(int64_t batch, int64_t tokens, std::mt19937_64& random) {
  using nn::AttentionMask;
  const int64_t S = tokens;
  // Context parallelism over 2 ranks with the zigzag split: the sequence in 4 chunks,
  // rank 0 holding chunks 0 and 3, rank 1 chunks 1 and 2. Rank 1's queries are its own
  // tokens; its keys are gathered from both ranks in rank order, so their positions do
  // not ascend.
  const int64_t chunk = S / 4;
  const std::vector<int64_t> rank0 = concat(iota(0, chunk), iota(S - chunk, S));
  const std::vector<int64_t> rank1 = iota(chunk, S - chunk);
  const std::vector<int64_t> gathered = concat(rank0, rank1);
  // Each shard numbering its tokens from 0: positions repeat (still a valid mask).
  std::vector<int64_t> shard_local(S), scattered(S);
  for (int64_t t = 0; t < S; ++t) shard_local[t] = t % (S / 4);
  for (int64_t& p : scattered) p = static_cast<int64_t>(random() % 7) - 2;
  // Per sequence: one list for a single sequence, else a different split for each.
  std::vector<std::vector<int64_t>> per_sequence = {{0, 3, S}, {0, S / 2, S - 1, S}};
  per_sequence.resize(static_cast<size_t>(batch));
  // Key lengths: the second sequence (if any) wholly padded, so its rows see no key.
  std::vector<int64_t> lengths = {S - 4, 0}, causal_lengths = {S / 2 + 1, S - 3};
  lengths.resize(static_cast<size_t>(batch));
  causal_lengths.resize(static_cast<size_t>(batch));
  return {
      {"causal", S, AttentionMask::causal()},
      {"none", S, AttentionMask::none()},
      {"documents with boundaries inside", S, AttentionMask::documents({0, 5, 11, S})},
      {"documents, not causal", S, AttentionMask::documents({0, 7, S}, false)},
      {"documents per sequence", S, AttentionMask::documents_per_sequence(per_sequence)},
      {"key padding, not causal", S, AttentionMask::none().with_key_lengths(lengths)},
      {"key padding, causal", S, AttentionMask::causal().with_key_lengths(causal_lengths)},
      {"a context-parallel rank (Sq != Sk)", static_cast<int64_t>(rank1.size()),
       AttentionMask::causal().at_positions(rank1, gathered)},
      {"a context-parallel rank with documents and key padding", static_cast<int64_t>(rank1.size()),
       AttentionMask::documents({0, S / 2 - 1, S}).with_key_lengths(lengths).at_positions(rank1, gathered)},
      {"shard-local positions, repeated", S, AttentionMask::causal().at_positions(shard_local)},
      {"scattered positions", S, AttentionMask::causal().at_positions(scattered)},
  };
}

std::string describe(std::optional<float> scale) {
  return scale ? std::to_string(*scale) : std::string("default");
}

// Forward and backward on the GPU against the reference, and the backward's halves on
// the GPU against its whole, for one mask of one layout.
void check_case(Generator& generator, int64_t batch, const Heads& heads, int64_t dim, const MaskCase& c,
                int64_t tokens, std::optional<float> scale, float spread) {
  const Tensor q = generator.uniform({batch, c.queries, heads.heads, dim}, -spread, spread);
  const Tensor k = generator.uniform({batch, tokens, heads.kv_heads, dim}, -spread, spread);
  const Tensor v = generator.randn({batch, tokens, heads.kv_heads, dim});
  const Tensor g = generator.randn({batch, c.queries, heads.heads, dim});
  const Device gpu = Device::cuda(), ref = Device::reference();
  const std::vector<Tensor> expected = attend(q.to(ref), k.to(ref), v.to(ref), g.to(ref), c.mask, scale);
  test::poison_pool(gpu);
  const Tensor qg = q.to(gpu), kg = k.to(gpu), vg = v.to(gpu), gg = g.to(gpu);
  const std::vector<Tensor> got = attend(qg, kg, vg, gg, c.mask, scale);
  const char* what[] = {"out", "row_max", "row_sum", "dq", "dk", "dv"};
  for (size_t t = 0; t < got.size(); ++t) {
    INFO(what[t]);
    CHECK(test::bitwise_equal(got[t], expected[t]));
  }
  // The halves, on the GPU's own forward.
  const nn::AttentionForward forward{got[0], got[1], got[2]};
  test::poison_pool(gpu);
  const Tensor dq = nn::attention_backward_queries(gg, qg, kg, vg, forward, c.mask, scale);
  test::poison_pool(gpu);
  const nn::AttentionKeyGrads key_grads = nn::attention_backward_keys(gg, qg, kg, vg, forward, c.mask, scale);
  CHECK(test::bitwise_equal(dq, got[3]));
  CHECK(test::bitwise_equal(key_grads.k, got[4]));
  CHECK(test::bitwise_equal(key_grads.v, got[5]));
}

const Heads kMha{4, 4, "MHA 4"}, kGqa{8, 2, "GQA 8 over 2"}, kMqa{4, 1, "MQA 4 over 1"};

}  // namespace

TEST_CASE("attention on the GPU gives the reference's bits under every mask, layout, head dim and scale",
          "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  const uint64_t seed = std::random_device{}();
  Generator generator(seed);
  std::mt19937_64 random(seed);
  const int64_t tokens = 23;
  for (const int64_t batch : {int64_t{1}, int64_t{2}}) {
    const std::vector<MaskCase> cases = masks(batch, tokens, random);
    for (const Heads& heads : {kMha, kGqa, kMqa}) {
      for (const int64_t dim : {int64_t{1}, int64_t{7}, int64_t{64}, int64_t{128}, int64_t{256}}) {
        for (const std::optional<float> scale : {std::optional<float>(), std::optional<float>(0.125f),
                                                 std::optional<float>(-1.5f)}) {
          for (const MaskCase& c : cases) {
            INFO("B " << batch << ", " << heads.name << ", D " << dim << ", scale " << describe(scale)
                      << ", mask " << c.name << ", Sq " << c.queries << ", Sk " << tokens << ", seed " << seed);
            check_case(generator, batch, heads, dim, c, tokens, scale, 2.0f);
          }
        }
      }
    }
  }
}

TEST_CASE("attention on the GPU gives the reference's bits over many tiles",
          "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  const uint64_t seed = std::random_device{}();
  Generator generator(seed);
  std::mt19937_64 random(seed);
  struct Long {
    int64_t batch, tokens, dim;
    Heads heads;
    float spread;
  };
  for (const Long l : {Long{2, 300, 64, kGqa, 2.0f}, Long{1, 129, 256, kMqa, 8.0f},  // 8: exponentials down to 0
                       Long{1, 1024, 16, Heads{2, 2, "MHA 2"}, 1.0f},           // a Ulysses rank's share
                       Long{1, 700, 128, kGqa, 2.0f}, Long{1, 200, 200, kMha, 2.0f}}) {  // tiles cut short
    for (const MaskCase& c : masks(l.batch, l.tokens, random)) {
      if (c.name == "none" || c.name == "scattered positions") continue;  // the others cover them
      INFO("B " << l.batch << ", " << l.heads.name << ", D " << l.dim << ", mask " << c.name << ", Sq "
                << c.queries << ", Sk " << l.tokens << ", spread " << l.spread << ", seed " << seed);
      check_case(generator, l.batch, l.heads, l.dim, c, l.tokens, std::nullopt, l.spread);
    }
  }
}

TEST_CASE("attention on the GPU takes rows of any length, and refuses sizes that do not fit a grid", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  const uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  Generator generator(seed);
  // One query over 100,000 keys, and 100,000 queries over one key: tiles, not rows, in
  // shared memory.
  const int64_t many = 100000;
  const Tensor one = generator.randn({1, 1, 1, 8}), long_keys = generator.randn({1, many, 1, 8});
  const Tensor long_values = generator.randn({1, many, 1, 8});
  for (const bool long_rows : {true, false}) {
    INFO((long_rows ? "one query over 100,000 keys" : "100,000 queries over one key"));
    const Tensor& q = long_rows ? one : long_keys;
    const Tensor& k = long_rows ? long_keys : one;
    const Tensor& v = long_rows ? long_values : one;
    const Tensor g = generator.randn(q.shape());
    const nn::AttentionMask mask = long_rows ? nn::AttentionMask::none().at_positions({0}, iota(0, many))
                                             : nn::AttentionMask::none().at_positions(iota(0, many), {0});
    const std::vector<Tensor> expected = attend(q, k, v, g, mask, std::nullopt);
    test::poison_pool(Device::cuda());
    const std::vector<Tensor> got =
        attend(q.to(Device::cuda()), k.to(Device::cuda()), v.to(Device::cuda()), g.to(Device::cuda()), mask,
               std::nullopt);
    for (size_t t = 0; t < got.size(); ++t) CHECK(test::bitwise_equal(got[t], expected[t]));
  }
  // 65,536 sequences: more than a grid's z dim.
  const Tensor wide = Tensor::zeros({65536, 1, 1, 1}, Device::cuda());
  CHECK_THROWS_WITH(nn::attention_forward(wide, wide, wide), Catch::Contains("B = 65536"));
}

namespace {

// Tokens `tokens` of a [B, S, H, D] tensor, as a [B, tokens.size(), H, D] tensor on the CPU.
Tensor tokens_of(const Tensor& t, const std::vector<int64_t>& tokens) {
  const Tensor host = t.to(Device::cpu());
  const int64_t batch = t.size(0), length = t.size(1), width = t.size(2) * t.size(3);
  const int64_t picked = static_cast<int64_t>(tokens.size());
  Tensor out = Tensor::empty({batch, picked, t.size(2), t.size(3)}, Device::cpu());
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t n = 0; n < picked; ++n) {
      std::copy_n(host.data() + (b * length + tokens[n]) * width, width, out.data() + (b * picked + n) * width);
    }
  }
  return out;
}

// Rows `tokens` of row statistics [B, H, S], as [B, H, tokens.size()] on the CPU.
Tensor statistics_of(const Tensor& t, const std::vector<int64_t>& tokens) {
  const Tensor host = t.to(Device::cpu());
  const int64_t planes = t.size(0) * t.size(1), length = t.size(2), picked = static_cast<int64_t>(tokens.size());
  Tensor out = Tensor::empty({t.size(0), t.size(1), picked}, Device::cpu());
  for (int64_t p = 0; p < planes; ++p) {
    for (int64_t n = 0; n < picked; ++n) out.data()[p * picked + n] = host.data()[p * length + tokens[n]];
  }
  return out;
}

// `count` distinct tokens of [0, length) in order, the first and the last among them.
std::vector<int64_t> sample_tokens(int64_t length, int64_t count, std::mt19937_64& random) {
  std::vector<int64_t> tokens = {0, length - 1};
  while (static_cast<int64_t>(tokens.size()) < count) tokens.push_back(static_cast<int64_t>(random() % length));
  std::sort(tokens.begin(), tokens.end());
  tokens.erase(std::unique(tokens.begin(), tokens.end()), tokens.end());
  return tokens;
}

// Attention at a length whose whole recomputation on the CPU would take minutes: the
// GPU's whole forward and backward, then sampled query rows (out, m, l, dq) and key
// columns (dk, dv) recomputed on the CPU at those rows' and columns' positions. A row's
// values depend on its query and every key only, a key column's on its key and every
// query's row statistics, so the samples are checked exactly.
void check_long(Generator& generator, std::mt19937_64& random, int64_t tokens, const Heads& heads, int64_t dim,
                const std::vector<int64_t>& documents, int64_t key_length) {
  const Device gpu = Device::cuda(), cpu = Device::cpu();
  const Tensor q = generator.uniform({1, tokens, heads.heads, dim}, -2.0f, 2.0f).to(gpu);
  const Tensor k = generator.uniform({1, tokens, heads.kv_heads, dim}, -2.0f, 2.0f).to(gpu);
  const Tensor v = generator.randn({1, tokens, heads.kv_heads, dim}).to(gpu);
  const Tensor g = generator.randn({1, tokens, heads.heads, dim}).to(gpu);
  nn::AttentionMask mask = documents.empty() ? nn::AttentionMask::causal() : nn::AttentionMask::documents(documents);
  if (key_length < tokens) mask = mask.with_key_lengths({key_length});
  const nn::AttentionForward forward = nn::attention_forward(q, k, v, mask);
  const nn::AttentionGrads grads = nn::attention_backward(g, q, k, v, forward, mask);
  const std::vector<int64_t> all = iota(0, tokens);

  const std::vector<int64_t> rows = sample_tokens(tokens, 40, random);
  const nn::AttentionMask row_mask = mask.at_positions(rows, all);
  const Tensor q_rows = tokens_of(q, rows), g_rows = tokens_of(g, rows);
  const Tensor k_cpu = k.to(cpu), v_cpu = v.to(cpu);
  const nn::AttentionForward expected = nn::attention_forward(q_rows, k_cpu, v_cpu, row_mask);
  CHECK(test::bitwise_equal(tokens_of(forward.out, rows), expected.out));
  CHECK(test::bitwise_equal(statistics_of(forward.row_max, rows), expected.row_max));
  CHECK(test::bitwise_equal(statistics_of(forward.row_sum, rows), expected.row_sum));
  CHECK(test::bitwise_equal(tokens_of(grads.q, rows),
                            nn::attention_backward_queries(g_rows, q_rows, k_cpu, v_cpu, expected, row_mask)));

  const std::vector<int64_t> columns = sample_tokens(tokens, 40, random);
  const nn::AttentionMask column_mask = mask.at_positions(all, columns);
  const nn::AttentionForward gpu_forward{forward.out.to(cpu), forward.row_max.to(cpu), forward.row_sum.to(cpu)};
  const nn::AttentionKeyGrads key_grads = nn::attention_backward_keys(
      g.to(cpu), q.to(cpu), tokens_of(k, columns), tokens_of(v, columns), gpu_forward, column_mask);
  CHECK(test::bitwise_equal(tokens_of(grads.k, columns), key_grads.k));
  CHECK(test::bitwise_equal(tokens_of(grads.v, columns), key_grads.v));
}

}  // namespace

TEST_CASE("attention on the GPU at 16,384 tokens: sampled rows and key columns are the CPU's", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  const uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  Generator generator(seed);
  std::mt19937_64 random(seed);
  const int64_t tokens = 16384;
  SECTION("causal, GQA 8 over 2, D 128") { check_long(generator, random, tokens, {8, 2, "GQA 8 over 2"}, 128, {}, tokens); }
  SECTION("packed documents off the tiles' edges and key padding, MHA, D 64") {
    check_long(generator, random, tokens, {4, 4, "MHA 4"}, 64, {0, 1000, 1001, 5000, 9999, tokens}, tokens - 300);
  }
  SECTION("causal, MQA, D 100 (no float4 loads)") {
    check_long(generator, random, tokens, {4, 1, "MQA 4 over 1"}, 100, {}, tokens);
  }
}

TEST_CASE("attention on the GPU at 131,072 tokens: sampled rows and key columns are the CPU's",
          "[cuda][long]") {
  SEQPAR_REQUIRE_CUDA();
  const uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  Generator generator(seed);
  std::mt19937_64 random(seed);
  check_long(generator, random, 131072, {8, 2, "GQA 8 over 2"}, 128, {}, 131072);
}

TEST_CASE("attention's autograd on the GPU equals the CPU's", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  const uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  Generator generator(seed);
  const Tensor q = generator.uniform({2, 150, 4, 24}, -3, 3), k = generator.uniform({2, 150, 2, 24}, -3, 3);
  const Tensor v = generator.randn({2, 150, 2, 24}), g = generator.randn({2, 150, 4, 24});
  const nn::AttentionMask mask = nn::AttentionMask::documents({0, 40, 150}).with_key_lengths({150, 120});
  std::vector<Tensor> results[2];
  const Device devices[] = {Device::cpu(), Device::cuda()};
  for (int where = 0; where < 2; ++where) {
    Variable qv(q.to(devices[where]), true), kv(k.to(devices[where]), true), vv(v.to(devices[where]), true);
    Variable out = nn::scaled_dot_product_attention(qv, kv, vv, mask);
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
