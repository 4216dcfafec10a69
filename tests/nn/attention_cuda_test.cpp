// nn/cuda/attention.cu and nn/cuda/rope.cu against the reference: out, the softmax's m
// and l, dq, dk and dv bit for bit under every kind of mask (causal, none, packed
// documents, key padding, a context-parallel rank's query and key positions, positions
// that repeat), for batches of 1 and 2, MHA, GQA and MQA, head dims from 1 to 256 and
// several scales; the backward's two halves against the whole; rows longer than a block
// of threads; the refusals; RoPE's rotation and its transpose. Fresh random inputs (the
// seed is printed), outputs carved from NaN.
#include <catch2/catch.hpp>

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

TEST_CASE("attention on the GPU gives the reference's bits for rows longer than a block of threads",
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
                       Long{1, 1024, 16, Heads{2, 2, "MHA 2"}, 1.0f}}) {       // a Ulysses rank's share
    for (const MaskCase& c : masks(l.batch, l.tokens, random)) {
      if (c.name == "none" || c.name == "scattered positions") continue;  // the others cover them
      INFO("B " << l.batch << ", " << l.heads.name << ", D " << l.dim << ", mask " << c.name << ", Sq "
                << c.queries << ", Sk " << l.tokens << ", spread " << l.spread << ", seed " << seed);
      check_case(generator, l.batch, l.heads, l.dim, c, l.tokens, std::nullopt, l.spread);
    }
  }
}

TEST_CASE("attention on the GPU refuses rows that do not fit a block and sizes that do not fit a grid",
          "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  const Device gpu = Device::cuda();
  // One query over 100,000 keys: the forward's and dq's rows of Sk scores do not fit.
  const int64_t many = 100000;
  const Tensor one = Tensor::zeros({1, 1, 1, 1}, gpu), long_keys = Tensor::zeros({1, many, 1, 1}, gpu);
  const nn::AttentionMask one_query = nn::AttentionMask::none().at_positions({0}, iota(0, many));
  CHECK_THROWS_WITH(nn::attention_forward(one, long_keys, long_keys, one_query),
                    Catch::Contains("Sk = 100000") && Catch::Contains("shared memory"));
  // 100,000 queries over one key: dk and dv's rows of Sq values do not fit, dq's do.
  const Tensor long_queries = Tensor::zeros({1, many, 1, 1}, gpu);
  const nn::AttentionMask one_key = nn::AttentionMask::none().at_positions(iota(0, many), {0});
  const nn::AttentionForward forward = nn::attention_forward(long_queries, one, one, one_key);
  CHECK_NOTHROW(nn::attention_backward_queries(long_queries, long_queries, one, one, forward, one_key));
  CHECK_THROWS_WITH(nn::attention_backward_keys(long_queries, long_queries, one, one, forward, one_key),
                    Catch::Contains("Sq = 100000") && Catch::Contains("shared memory"));
  // 65,536 sequences: more than a grid's z dim.
  const Tensor wide = Tensor::zeros({65536, 1, 1, 1}, gpu);
  CHECK_THROWS_WITH(nn::attention_forward(wide, wide, wide), Catch::Contains("B = 65536"));
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
