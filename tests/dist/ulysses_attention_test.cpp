// Ulysses attention over the threads group: the exchanges against a plain model of
// where each value must land, their gradients, the layer against one rank attending
// over the whole sequence (bit for bit, in forward and in backward), and the shapes it
// must refuse.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "autograd/variable.h"
#include "core/error.h"
#include "core/generator.h"
#include "dist/local_process_group.h"
#include "nn/attention.h"
#include "nn/ulysses_all_to_all.h"
#include "nn/ulysses_attention.h"
#include "tests/dist/all_to_all_model.h"
#include "tests/dist/dist_test_util.h"

using namespace seqpar;
using autograd::Variable;
using Catch::Matchers::Contains;

namespace {

// Runs `body(rank, group)` on `ranks` threads, each with its group as nn sees it.
template <typename Body>
void on_ranks(int ranks, Body body) {
  dist::run_local_world(ranks, [&](std::shared_ptr<dist::ProcessGroup> world) {
    body(world->rank(), nn::sequence_group(world));
  });
}

// Rows [first, first + count) of a [S, H, D] tensor, heads [head, head + heads).
Tensor block_of(const Tensor& full, int64_t first, int64_t count, int64_t head, int64_t heads) {
  return full.narrow(0, first, count).narrow(1, head, heads).contiguous();
}

}  // namespace

// shard_heads hands rank j every token of heads group j; shard_sequence gives every
// rank its own tokens back. Both checked against the full tensor, which no rank holds.
TEST_CASE("shard_heads and shard_sequence put every value where the layout says", "[dist][cpu]") {
  const int64_t sequence = 12, heads = 8, head_dim = 3;
  Generator generator(31);
  const Tensor full = generator.randn({sequence, heads, head_dim});
  for (int ranks : {1, 2, 4}) {
    const int64_t tokens = sequence / ranks, group_heads = heads / ranks;
    std::vector<std::vector<float>> by_heads(ranks), back(ranks);
    on_ranks(ranks, [&](int rank, std::shared_ptr<nn::SequenceGroup> group) {
      const Tensor mine = full.narrow(0, rank * tokens, tokens);
      const Tensor head_shard = nn::shard_heads(mine, *group);
      by_heads[static_cast<size_t>(rank)] = head_shard.to_vector();
      back[static_cast<size_t>(rank)] = nn::shard_sequence(head_shard, *group).to_vector();
    });
    for (int rank = 0; rank < ranks; ++rank) {
      INFO("sp " << ranks << ", rank " << rank);
      const size_t r = static_cast<size_t>(rank);
      CHECK(test::same_bits(by_heads[r], block_of(full, 0, sequence, rank * group_heads, group_heads).to_vector()));
      CHECK(test::same_bits(back[r], block_of(full, rank * tokens, tokens, 0, heads).to_vector()));
    }
  }
}

// The gradient of an exchange lands where the value came from: with L = Σ <out, w>,
// dL/dx on rank r is w's values at the places x's values went.
TEST_CASE("the exchanges' gradients are the inverse exchanges", "[dist][cpu]") {
  const int64_t sequence = 8, heads = 4, head_dim = 2;
  const int ranks = 2;
  const int64_t tokens = sequence / ranks, group_heads = heads / ranks;
  Generator generator(32);
  const Tensor full = generator.randn({sequence, heads, head_dim});
  const Tensor weights = generator.randn({sequence, heads, head_dim});  // dL/d(full layout)
  std::vector<std::vector<float>> grads(ranks), plain_grads(ranks);
  std::vector<Tensor> plain_inputs, plain_weights;
  for (int rank = 0; rank < ranks; ++rank) {
    plain_inputs.push_back(Generator(40 + rank).randn({4, 3}));
    plain_weights.push_back(Generator(50 + rank).randn({4, 3}));
  }
  on_ranks(ranks, [&](int rank, std::shared_ptr<nn::SequenceGroup> group) {
    const size_t r = static_cast<size_t>(rank);
    const Variable x(full.narrow(0, rank * tokens, tokens).contiguous(), /*requires_grad=*/true);
    // This rank's output is heads group `rank` of every token; its gradient the same block of w.
    nn::shard_heads(x, group).backward(block_of(weights, 0, sequence, rank * group_heads, group_heads));
    grads[r] = x.grad().to_vector();
    const Variable plain(plain_inputs[r], /*requires_grad=*/true);
    nn::all_to_all(plain, group).backward(plain_weights[r]);
    plain_grads[r] = plain.grad().to_vector();
  });
  for (int rank = 0; rank < ranks; ++rank) {
    const size_t r = static_cast<size_t>(rank);
    CHECK(test::same_bits(grads[r], block_of(weights, rank * tokens, tokens, 0, heads).to_vector()));
    // The plain all-to-all is its own inverse: the gradient is the exchange of the weights.
    CHECK(test::same_bits(plain_grads[r], test::all_to_all_model(plain_weights, rank)));
  }
}

// P ranks, each with its S/P tokens, against one rank attending over all S: the same
// output rows and the same gradients of q, k and v, bit for bit.
TEST_CASE("UlyssesAttention on 1, 2 and 4 ranks equals one rank's attention, bit for bit",
          "[dist][cpu]") {
  const int64_t sequence = 16, heads = 4, head_dim = 8;
  Generator generator(33);
  const Tensor q = generator.randn({sequence, heads, head_dim});
  const Tensor k = generator.randn({sequence, heads, head_dim});
  const Tensor v = generator.randn({sequence, heads, head_dim});
  const Tensor grad_out = generator.randn({sequence, heads * head_dim});
  for (const bool causal : {true, false}) {
    const Variable q1(q, true), k1(k, true), v1(v, true);
    const Variable one = nn::scaled_dot_product_attention(q1, k1, v1, causal);
    one.backward(grad_out.view({sequence, heads, head_dim}));
    for (int ranks : {1, 2, 4}) {
      const int64_t tokens = sequence / ranks;
      struct Seen { std::vector<float> out, dq, dk, dv; };
      std::vector<Seen> seen(static_cast<size_t>(ranks));
      on_ranks(ranks, [&](int rank, std::shared_ptr<nn::SequenceGroup> group) {
        auto mine = [&](const Tensor& t) { return Variable(t.narrow(0, rank * tokens, tokens).contiguous(), true); };
        const Variable qr = mine(q), kr = mine(k), vr = mine(v);
        const Variable out = nn::UlyssesAttention(group, causal).forward(qr, kr, vr);
        out.backward(grad_out.narrow(0, rank * tokens, tokens).contiguous());
        seen[static_cast<size_t>(rank)] = {out.data().to_vector(), qr.grad().to_vector(),
                                           kr.grad().to_vector(), vr.grad().to_vector()};
      });
      for (int rank = 0; rank < ranks; ++rank) {
        INFO("sp " << ranks << ", rank " << rank << (causal ? ", causal" : ", not causal"));
        const Seen& s = seen[static_cast<size_t>(rank)];
        auto rows = [&](const Tensor& t) { return t.narrow(0, rank * tokens, tokens).contiguous().to_vector(); };
        CHECK(test::same_bits(s.out, rows(one.data())));
        CHECK(test::same_bits(s.dq, rows(q1.grad())));
        CHECK(test::same_bits(s.dk, rows(k1.grad())));
        CHECK(test::same_bits(s.dv, rows(v1.grad())));
      }
    }
  }
}

// Grouped-query heads, a batch and packed documents whose boundaries fall inside the
// ranks' shards: sp 1, 2 (the kv heads split), 4 and 8 (past the 2 kv heads: each rank
// gets copies of the kv head its query heads read) give one rank's rows and gradients.
TEST_CASE("UlyssesAttention with GQA, a batch and packed documents over sp {1, 2, 4, 8} equals one rank",
          "[dist][cpu]") {
  const int64_t batch = 2, sequence = 32, heads = 8, kv_heads = 2, head_dim = 16;
  Generator generator(34);
  const Tensor q = generator.randn({batch, sequence, heads, head_dim});
  const Tensor k = generator.randn({batch, sequence, kv_heads, head_dim});
  const Tensor v = generator.randn({batch, sequence, kv_heads, head_dim});
  const Tensor grad_out = generator.randn({batch, sequence, heads * head_dim});
  const nn::AttentionMask mask = nn::AttentionMask::documents({0, 5, 13, 19, 32});
  const Variable q1(q, true), k1(k, true), v1(v, true);
  const Variable one = nn::scaled_dot_product_attention(q1, k1, v1, mask);
  one.backward(grad_out.view({batch, sequence, heads, head_dim}));
  for (int ranks : {1, 2, 4, 8}) {
    const int64_t tokens = sequence / ranks;
    struct Seen { Tensor out, dq, dk, dv; };
    std::vector<Seen> seen(static_cast<size_t>(ranks));
    on_ranks(ranks, [&](int rank, std::shared_ptr<nn::SequenceGroup> group) {
      auto mine = [&](const Tensor& t) { return Variable(t.narrow(1, rank * tokens, tokens).contiguous(), true); };
      const Variable qr = mine(q), kr = mine(k), vr = mine(v);
      const Variable out = nn::UlyssesAttention(group, nn::UlyssesAttentionOptions{mask, true, {}, {}}).forward(qr, kr, vr);
      out.backward(grad_out.narrow(1, rank * tokens, tokens).contiguous());
      seen[static_cast<size_t>(rank)] = {out.data(), qr.grad(), kr.grad(), vr.grad()};
    });
    for (int rank = 0; rank < ranks; ++rank) {
      INFO("sp " << ranks << ", rank " << rank);
      const Seen& s = seen[static_cast<size_t>(rank)];
      auto rows = [&](const Tensor& t) { return t.narrow(1, rank * tokens, tokens).contiguous().to_vector(); };
      CHECK(test::same_bits(s.out.to_vector(), rows(one.data().view({batch, sequence, heads * head_dim}))));
      CHECK(test::same_bits(s.dq.to_vector(), rows(q1.grad())));
      CHECK(test::same_bits(s.dk.to_vector(), rows(k1.grad())));
      CHECK(test::same_bits(s.dv.to_vector(), rows(v1.grad())));
    }
  }
}

// repeat_kv_heads' backward adds the copies exactly: attention over repeated heads is
// grouped-query attention, bit for bit.
TEST_CASE("attention over repeated kv heads gives grouped-query attention's bits", "[dist][cpu]") {
  Generator generator(35);
  const Tensor q = generator.randn({2, 9, 6, 8}), k = generator.randn({2, 9, 2, 8}), v = generator.randn({2, 9, 2, 8});
  const Tensor g = generator.randn({2, 9, 6, 8});
  const Variable qa(q, true), ka(k, true), va(v, true), qb(q, true), kb(k, true), vb(v, true);
  nn::scaled_dot_product_attention(qa, ka, va).backward(g);
  nn::scaled_dot_product_attention(qb, nn::repeat_kv_heads(kb, 3), nn::repeat_kv_heads(vb, 3)).backward(g);
  CHECK(test::same_bits(qa.grad().to_vector(), qb.grad().to_vector()));
  CHECK(test::same_bits(ka.grad().to_vector(), kb.grad().to_vector()));
  CHECK(test::same_bits(va.grad().to_vector(), vb.grad().to_vector()));
}

TEST_CASE("UlyssesAttention refuses heads that do not split over sp, naming Hq and sp",
          "[dist][cpu]") {
  REQUIRE_THROWS_WITH(on_ranks(4,
                               [](int, std::shared_ptr<nn::SequenceGroup> group) {
                                 const Variable x(Tensor::zeros({2, 6, 4}));
                                 nn::UlyssesAttention(group).forward(x, x, x);
                               }),
                      Contains("Hq = 6 query heads do not split evenly over sp = 4 ranks of group world") &&
                          Contains("uneven head splits are not supported"));
  REQUIRE_THROWS_WITH(on_ranks(2,
                               [](int, std::shared_ptr<nn::SequenceGroup> group) {
                                 const Variable q(Tensor::zeros({2, 4, 4}));
                                 const Variable k(Tensor::zeros({2, 4, 2}));
                                 nn::UlyssesAttention(group).forward(q, k, q);
                               }),
                      Contains("k and v must be one shape, with q's batch, tokens and head dim; got q [2, 4, 4], "
                               "k [2, 4, 2], v [2, 4, 4]"));
  REQUIRE_THROWS_WITH(nn::UlyssesAttention(nn::single_rank_group()).forward(
                          Variable(Tensor::zeros({2, 8})), Variable(Tensor::zeros({2, 8})),
                          Variable(Tensor::zeros({2, 8}))),
                      Contains("q must be [B, S/sp, Hq, D] or [S/sp, Hq, D], got [2, 8]"));
}

// A sequence cut unevenly, or ranks that disagree on the heads, are named in the user's
// terms on every rank: S and sp, and what each rank passed (not the exchange's shapes).
TEST_CASE("UlyssesAttention names S and sp, and each rank's shapes, when the ranks disagree", "[dist][cpu]") {
  std::vector<std::string> messages(4);
  const auto run = [&](const std::function<Shape(int)>& shape_of_rank) {
    on_ranks(4, [&](int rank, std::shared_ptr<nn::SequenceGroup> group) {
      const Variable x(Tensor::zeros(shape_of_rank(rank)));
      try {
        nn::UlyssesAttention(group).forward(x, x, x);
      } catch (const Error& e) {
        messages[static_cast<size_t>(rank)] = e.what();
      }
    });
  };
  run([](int rank) { return Shape{1, rank == 0 ? 258 : 256, 4, 16}; });
  for (const std::string& m : messages) {
    CHECK_THAT(m, Contains("rank 0: 258, rank 1: 256") && Contains("S = 1026 does not split evenly over sp = 4"));
  }
  run([](int rank) { return Shape{64, rank == 2 ? 8 : 4, 16}; });
  for (const std::string& m : messages) {
    CHECK_THAT(m, Contains("passed different batches, heads or head dims") &&
                      Contains("rank 1 q [64, 4, 16], k and v [64, 4, 16]; rank 2 q [64, 8, 16]"));
  }
}
