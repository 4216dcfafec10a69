// Context-parallel attention over the threads group: cp {1, 2, 3, 4} ranks, contiguous
// and zigzag shards, grouped-query heads, a batch, packed documents whose boundaries
// cross the shards: every rank's output rows and its q, k and v gradients are one
// rank's attention, bit for bit. A group that files a gathered chunk under the wrong
// rank must break that equality: the test can fail.
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "core/generator.h"
#include "dist/local_process_group.h"
#include "nn/attention.h"
#include "nn/context_parallel_attention.h"
#include "tests/dist/dist_test_util.h"
#include "tests/dist/swapped_group.h"

using namespace seqpar;
using autograd::Variable;
using Catch::Matchers::Contains;

namespace {

constexpr int64_t kBatch = 2, kSequence = 24, kHeads = 8, kDim = 8;

// Rows `positions` of every sequence of a [B, S, H, D] tensor, in that order.
Tensor tokens_at(const Tensor& t, const std::vector<int64_t>& positions) {
  Tensor out = Tensor::empty({t.size(0), static_cast<int64_t>(positions.size()), t.size(2), t.size(3)});
  for (size_t n = 0; n < positions.size(); ++n) {
    out.narrow(1, static_cast<int64_t>(n), 1).copy_(t.narrow(1, positions[n], 1));
  }
  return out;
}

struct Inputs {
  Tensor q, k, v, g;
};

struct Seen {
  std::vector<float> out, dq, dk, dv;
};

// Every rank's output and gradients, each over its own positions.
std::vector<Seen> run_cp(const Inputs& in, int ranks, const nn::ContextParallelOptions& options, bool swap = false,
                         Device device = Device::cpu()) {
  std::vector<Seen> seen(static_cast<size_t>(ranks));
  dist::run_local_world(ranks, [&](std::shared_ptr<dist::ProcessGroup> world) {
    std::shared_ptr<nn::SequenceGroup> group = nn::sequence_group(world);
    if (swap) group = std::make_shared<test::SwappedSlices>(group, test::SwappedSlices::Which::AllGather);
    const nn::ContextParallelAttention attention(group, options);
    const std::vector<int64_t> mine = attention.positions(kSequence / ranks);
    const Variable q(tokens_at(in.q, mine).to(device), true), k(tokens_at(in.k, mine).to(device), true);
    const Variable v(tokens_at(in.v, mine).to(device), true);
    const Variable out = attention.forward(q, k, v);
    out.backward(tokens_at(in.g, mine).to(device));
    seen[static_cast<size_t>(world->rank())] = {out.data().to_vector(), q.grad().to_vector(), k.grad().to_vector(),
                                                v.grad().to_vector()};
  });
  return seen;
}

}  // namespace

TEST_CASE("context-parallel attention over cp {1, 2, 3, 4}, contiguous and zigzag, equals one rank",
          "[dist][cpu]") {
  for (const int64_t kv_heads : {int64_t{8}, int64_t{2}, int64_t{1}}) {
    Generator generator(60 + static_cast<uint64_t>(kv_heads));
    const Inputs in{generator.randn({kBatch, kSequence, kHeads, kDim}), generator.randn({kBatch, kSequence, kv_heads, kDim}),
                    generator.randn({kBatch, kSequence, kv_heads, kDim}), generator.randn({kBatch, kSequence, kHeads, kDim})};
    const std::vector<std::pair<std::string, nn::AttentionMask>> masks = {
        {"causal", nn::AttentionMask::causal()},
        {"packed documents", nn::AttentionMask::documents({0, 5, 11, 18, kSequence})},
        {"no mask, key padding", nn::AttentionMask::none().with_key_lengths({kSequence, 15})}};
    for (const auto& [name, mask] : masks) {
      const Variable q(in.q, true), k(in.k, true), v(in.v, true);
      const Variable one = nn::scaled_dot_product_attention(q, k, v, mask);
      one.backward(in.g);
      for (const auto layout : {nn::ContextParallelLayout::Contiguous, nn::ContextParallelLayout::Zigzag}) {
        for (const int ranks : {1, 2, 3, 4}) {
          const std::vector<Seen> seen = run_cp(in, ranks, {mask, layout, {}});
          for (int rank = 0; rank < ranks; ++rank) {
            INFO(kHeads << " query heads over " << kv_heads << ", " << name << ", cp " << ranks
                        << (layout == nn::ContextParallelLayout::Zigzag ? " zigzag" : " contiguous") << ", rank "
                        << rank);
            const std::vector<int64_t> mine = nn::context_parallel_positions(kSequence, ranks, rank, layout);
            const Seen& s = seen[static_cast<size_t>(rank)];
            CHECK(test::same_bits(s.out, tokens_at(one.data(), mine).to_vector()));
            CHECK(test::same_bits(s.dq, tokens_at(q.grad(), mine).to_vector()));
            CHECK(test::same_bits(s.dk, tokens_at(k.grad(), mine).to_vector()));
            CHECK(test::same_bits(s.dv, tokens_at(v.grad(), mine).to_vector()));
          }
        }
      }
    }
  }
}

TEST_CASE("context-parallel attention with a gather filed under the wrong rank is not one rank's",
          "[dist][cpu]") {
  Generator generator(70);
  const Inputs in{generator.randn({kBatch, kSequence, kHeads, kDim}), generator.randn({kBatch, kSequence, 2, kDim}),
                  generator.randn({kBatch, kSequence, 2, kDim}), generator.randn({kBatch, kSequence, kHeads, kDim})};
  const Variable q(in.q, true), k(in.k, true), v(in.v, true);
  const Variable one = nn::scaled_dot_product_attention(q, k, v, true);
  one.backward(in.g);
  const std::vector<Seen> seen = run_cp(in, 2, {true, nn::ContextParallelLayout::Zigzag, {}}, /*swap=*/true);
  bool differs = false;
  for (int rank = 0; rank < 2; ++rank) {
    const std::vector<int64_t> mine = nn::context_parallel_positions(kSequence, 2, rank, nn::ContextParallelLayout::Zigzag);
    differs = differs || !test::same_bits(seen[static_cast<size_t>(rank)].out, tokens_at(one.data(), mine).to_vector()) ||
              !test::same_bits(seen[static_cast<size_t>(rank)].dk, tokens_at(k.grad(), mine).to_vector());
  }
  CHECK(differs);
}

TEST_CASE("context parallelism's positions and refusals", "[dist][cpu]") {
  using nn::ContextParallelLayout;
  CHECK(nn::context_parallel_positions(8, 2, 1, ContextParallelLayout::Contiguous) == std::vector<int64_t>{4, 5, 6, 7});
  CHECK(nn::context_parallel_positions(8, 2, 0, ContextParallelLayout::Zigzag) == std::vector<int64_t>{0, 1, 6, 7});
  CHECK(nn::context_parallel_positions(8, 2, 1, ContextParallelLayout::Zigzag) == std::vector<int64_t>{2, 3, 4, 5});
  CHECK_THROWS_WITH(nn::context_parallel_positions(10, 4, 0, ContextParallelLayout::Contiguous),
                    Contains("S = 10 tokens do not split evenly over cp = 4"));
  CHECK_THROWS_WITH(nn::context_parallel_positions(12, 4, 0, ContextParallelLayout::Zigzag),
                    Contains("do not split into 2 · cp = 8 equal chunks"));
  std::vector<std::string> messages(2);
  dist::run_local_world(2, [&](std::shared_ptr<dist::ProcessGroup> world) {
    const Variable x(Tensor::zeros({1, world->rank() == 0 ? 5 : 4, 2, 4}));
    try {
      nn::ContextParallelAttention(nn::sequence_group(world)).forward(x, x, x);
    } catch (const Error& e) {
      messages[static_cast<size_t>(world->rank())] = e.what();
    }
  });
  for (const std::string& m : messages) {
    CHECK_THAT(m, Contains("rank 0: 5, rank 1: 4") && Contains("S = 9 does not split evenly over cp = 2"));
  }
}

// The ranks as threads sharing one GPU, the kernels bitwise the reference's: cp 4,
// zigzag, grouped-query heads, packed documents, against the CPU's one rank.
TEST_CASE("context-parallel attention on one GPU gives the CPU's one-rank bits", "[dist][cuda]") {
  if (cuda_device_count() == 0) {
    WARN("no CUDA device: skipped");
    return;
  }
  Generator generator(71);
  const Inputs in{generator.randn({kBatch, kSequence, kHeads, kDim}), generator.randn({kBatch, kSequence, 2, kDim}),
                  generator.randn({kBatch, kSequence, 2, kDim}), generator.randn({kBatch, kSequence, kHeads, kDim})};
  const nn::AttentionMask mask = nn::AttentionMask::documents({0, 5, 11, 18, kSequence});
  const Variable q(in.q, true), k(in.k, true), v(in.v, true);
  const Variable one = nn::scaled_dot_product_attention(q, k, v, mask);
  one.backward(in.g);
  const std::vector<Seen> seen = run_cp(in, 4, {mask, nn::ContextParallelLayout::Zigzag, {}}, false, Device::cuda());
  for (int rank = 0; rank < 4; ++rank) {
    INFO("rank " << rank);
    const std::vector<int64_t> mine = nn::context_parallel_positions(kSequence, 4, rank, nn::ContextParallelLayout::Zigzag);
    const Seen& s = seen[static_cast<size_t>(rank)];
    CHECK(test::same_bits(s.out, tokens_at(one.data(), mine).to_vector()));
    CHECK(test::same_bits(s.dq, tokens_at(q.grad(), mine).to_vector()));
    CHECK(test::same_bits(s.dk, tokens_at(k.grad(), mine).to_vector()));
    CHECK(test::same_bits(s.dv, tokens_at(v.grad(), mine).to_vector()));
  }
}
