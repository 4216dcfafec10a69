// nn/attention.h's bitwise identities, the numerics' promise that the bits depend on
// nothing but the inputs: a batch is its sequences, packed documents are their documents,
// grouped-query heads are repeated kv heads summed exactly, any subset of kv heads is
// those heads of the full call, the work split over ranks as context parallelism splits
// it (queries with the gathered keys, keys with the gathered queries) is the whole call,
// and a row with no visible key gives +0. On the reference and the CPU rows.
#include <catch2/catch.hpp>

#include <string>
#include <utility>
#include <vector>

#include "autograd/variable.h"
#include "core/generator.h"
#include "nn/attention.h"
#include "tests/exact_reference.h"
#include "tests/nn/attention_test_util.h"
#include "tests/test_util.h"

using namespace seqpar;
using namespace seqpar::test;
using autograd::Variable;
using test::same_bits;

TEST_CASE("attention: a batch gives each sequence's bits alone", "[attention]") {
  const Shapes s = square(3, 14, 4, 2, 8);
  const std::vector<std::vector<int64_t>> docs = {{0, 5, 14}, {0, 14}, {0, 1, 2, 9, 14}};
  const std::vector<int64_t> lengths = {14, 10, 3};
  for (const Device device : {Device::reference(), Device::cpu()}) {
    for (const bool causal : {true, false}) {
      INFO(device << (causal ? ", causal" : ", not causal"));
      const Inputs in = random_inputs(s, 2500 + causal, device, 2.0f);
      const std::vector<Tensor> whole =
          run(in, nn::AttentionMask::documents_per_sequence(docs, causal).with_key_lengths(lengths));
      for (int64_t b = 0; b < s.batch; ++b) {
        const Inputs one{in.q.narrow(0, b, 1), in.k.narrow(0, b, 1), in.v.narrow(0, b, 1), in.g.narrow(0, b, 1)};
        const std::vector<Tensor> alone = run(one, nn::AttentionMask::documents(docs[b], causal).with_key_lengths({lengths[b]}));
        for (size_t t = 0; t < alone.size(); ++t) CHECK(same_bits(alone[t], whole[t].narrow(0, b, 1)));
      }
    }
  }
}

TEST_CASE("attention: packed documents give each document's bits alone", "[attention]") {
  const Shapes s = square(2, 20, 4, 1, 8);
  const std::vector<int64_t> docs = {0, 3, 4, 11, 20};
  for (const Device device : {Device::reference(), Device::cpu()}) {
    INFO(device);
    const Inputs in = random_inputs(s, 2600, device, 2.0f);
    const std::vector<Tensor> packed = run(in, nn::AttentionMask::documents(docs));
    for (size_t n = 0; n + 1 < docs.size(); ++n) {
      const int64_t first = docs[n], length = docs[n + 1] - docs[n];
      const Inputs one{in.q.narrow(1, first, length), in.k.narrow(1, first, length), in.v.narrow(1, first, length),
                       in.g.narrow(1, first, length)};
      const std::vector<Tensor> alone = run(one, nn::AttentionMask::causal());
      for (size_t t = 0; t < alone.size(); ++t) CHECK(same_bits(alone[t], packed[t].narrow(1, first, length)));
    }
    // Positions that restart at each document are not a document mask: the second
    // document's first query would see the first document.
    std::vector<int64_t> restarting;
    for (size_t n = 0; n + 1 < docs.size(); ++n) {
      for (int64_t t = docs[n]; t < docs[n + 1]; ++t) restarting.push_back(t - docs[n]);
    }
    CHECK_FALSE(same_bits(run(in, nn::AttentionMask::causal().at_positions(restarting))[0], packed[0]));
  }
}

TEST_CASE("attention: grouped-query heads are the kv heads repeated, their dk and dv summed exactly",
          "[attention]") {
  for (const auto& [heads, kv_heads] : std::vector<std::pair<int64_t, int64_t>>{{8, 2}, {4, 1}, {6, 3}}) {
    const Shapes s = square(2, 13, heads, kv_heads, 16);
    const int64_t group = heads / kv_heads;
    for (const Device device : {Device::reference(), Device::cpu()}) {
      INFO(device << ": " << heads << " query heads over " << kv_heads);
      const Inputs in = random_inputs(s, 2700 + heads, device, 3.0f);
      const nn::AttentionMask mask = nn::AttentionMask::documents({0, 6, 13});
      const std::vector<Tensor> grouped = run(in, mask);
      // Each kv head repeated for its query heads: plain multi-head attention.
      const Shape repeated{s.batch, s.keys, heads, s.dim};
      Inputs mha{in.q, Tensor::empty(repeated, device), Tensor::empty(repeated, device), in.g};
      for (int64_t h = 0; h < heads; ++h) {
        mha.k.narrow(2, h, 1).copy_(in.k.narrow(2, h / group, 1));
        mha.v.narrow(2, h, 1).copy_(in.v.narrow(2, h / group, 1));
      }
      const std::vector<Tensor> multi = run(mha, mask);
      CHECK(same_bits(grouped[0], multi[0]));
      CHECK(same_bits(grouped[1], multi[1]));
      for (size_t which : {size_t{2}, size_t{3}}) {
        INFO("d" << (which == 2 ? "k" : "v"));
        const Tensor per_head = multi[which].contiguous(), got = grouped[which].contiguous();
        bool all_equal = true;
        for (int64_t n = 0; n < got.numel(); ++n) {
          const int64_t d = n % s.dim, kv = (n / s.dim) % kv_heads, row = n / (s.dim * kv_heads);
          std::vector<double> terms;
          for (int64_t r = 0; r < group; ++r) {
            terms.push_back(per_head.data()[(row * heads + kv * group + r) * s.dim + d]);
          }
          all_equal = all_equal && same_bits(got.data()[n], test::exact_reference<float>(terms));
        }
        CHECK(all_equal);
      }
    }
  }
}

TEST_CASE("attention: any subset of kv heads gives those heads' bits of the full call", "[attention]") {
  // As a Ulysses rank holding its share of the kv heads and their query heads computes them.
  const Shapes s = square(2, 29, 6, 3, 12);
  for (const Device device : {Device::reference(), Device::cpu()}) {
    const Inputs in = random_inputs(s, 3300, device, 3.0f);
    const std::vector<Tensor> full = run(in, true);
    for (const auto& [first, count] : std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {1, 2}, {2, 1}}) {
      INFO(device << ": kv heads " << first << " .. " << first + count - 1);
      const Inputs part{in.q.narrow(2, 2 * first, 2 * count), in.k.narrow(2, first, count),
                        in.v.narrow(2, first, count), in.g.narrow(2, 2 * first, 2 * count)};
      const std::vector<Tensor> got = run(part, true);
      CHECK(same_bits(got[0], full[0].narrow(2, 2 * first, 2 * count)));
      CHECK(same_bits(got[1], full[1].narrow(2, 2 * first, 2 * count)));
      CHECK(same_bits(got[2], full[2].narrow(2, first, count)));
      CHECK(same_bits(got[3], full[3].narrow(2, first, count)));
    }
  }
}

// Context parallelism emulated on one rank: the sequence's queries cut into parts, each
// attending to every key (gathered); its keys cut into parts, each given every query
// with its g and forward (gathered). Contiguous and zigzag shards, documents whose
// boundaries fall inside shards.
TEST_CASE("attention: queries and keys in parts, as context parallelism splits them, give the whole's bits",
          "[attention]") {
  const Shapes s = square(2, 24, 4, 2, 8);
  const std::vector<int64_t> all = range(0, s.queries);
  const std::vector<std::pair<std::string, nn::AttentionMask>> masks = {
      {"causal", nn::AttentionMask::causal()},
      {"documents", nn::AttentionMask::documents({0, 5, 13, 24})},
      {"none, key padding", nn::AttentionMask::none().with_key_lengths({17, 24})}};
  for (const Device device : {Device::reference(), Device::cpu()}) {
    const Inputs in = random_inputs(s, 3500, device, 3.0f);
    for (const auto& [name, mask] : masks) {
      const nn::AttentionForward whole = nn::attention_forward(in.q, in.k, in.v, mask);
      const nn::AttentionGrads grads = nn::attention_backward(in.g, in.q, in.k, in.v, whole, mask);
      for (const bool zigzag : {false, true}) {
        for (const int ranks : {2, 3, 4}) {
          INFO(device << ", " << name << ", " << ranks << (zigzag ? " zigzag" : " contiguous") << " parts");
          for (int rank = 0; rank < ranks; ++rank) {
            const std::vector<int64_t> mine = shard_positions(s.queries, ranks, rank, zigzag);
            // The queries' side: forward and dq against every key.
            const nn::AttentionMask queries = mask.at_positions(mine, all);
            const Tensor q = tokens_at(in.q, mine), g = tokens_at(in.g, mine);
            const nn::AttentionForward part = nn::attention_forward(q, in.k, in.v, queries);
            CHECK(same_bits(part.out, tokens_at(whole.out, mine)));
            const Tensor dq = nn::attention_backward_queries(g, q, in.k, in.v, part, queries);
            CHECK(same_bits(dq, tokens_at(grads.q, mine)));
            // The keys' side: dk and dv from every query.
            const nn::AttentionMask keys = mask.at_positions(all, mine);
            const nn::AttentionKeyGrads dkv = nn::attention_backward_keys(
                in.g, in.q, tokens_at(in.k, mine), tokens_at(in.v, mine), whole, keys);
            CHECK(same_bits(dkv.k, tokens_at(grads.k, mine)));
            CHECK(same_bits(dkv.v, tokens_at(grads.v, mine)));
          }
        }
      }
    }
  }
}

TEST_CASE("attention: a row with no visible key outputs +0 and passes no gradient", "[attention]") {
  const Shapes s = square(2, 6, 2, 1, 4);
  for (const Device device : {Device::reference(), Device::cpu()}) {
    INFO(device);
    const Inputs in = random_inputs(s, 3700, device);
    const nn::AttentionMask mask = nn::AttentionMask::none().with_key_lengths({0, 6});
    const std::vector<Tensor> got = run(in, mask);
    for (const Tensor& t : got) CHECK(same_bits(t.narrow(0, 0, 1), Tensor::zeros({1, t.size(1), t.size(2), t.size(3)})));
    const nn::AttentionForward forward = nn::attention_forward(in.q, in.k, in.v, mask);
    CHECK(forward.row_max.narrow(0, 0, 1).to_vector() == std::vector<float>(12, -INFINITY));
    CHECK(forward.row_sum.narrow(0, 0, 1).to_vector() == std::vector<float>(12, 0.0f));
    // The other sequence as if alone.
    const Inputs second{in.q.narrow(0, 1, 1), in.k.narrow(0, 1, 1), in.v.narrow(0, 1, 1), in.g.narrow(0, 1, 1)};
    const std::vector<Tensor> alone = run(second, false);
    for (size_t t = 0; t < alone.size(); ++t) CHECK(same_bits(alone[t], got[t].narrow(0, 1, 1)));
  }
}
