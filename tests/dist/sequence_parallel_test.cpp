// The exactness matrix of sequence parallelism past the head wall: a Llama-shaped block
// (nn::LongContextBlock: 8 query heads over 8, 2 or 1 kv heads, a batch of 2 sequences of
// packed documents whose boundaries fall inside the ranks' shards, causal) trained over
// ulysses {1, 2, 4} x cp {1, 2, 4} (ulysses x cp <= 8) x dp {1, 2} thread ranks, with both
// layouts of the cp split, ends every step with the parameters of one rank training on
// everything (nn::UlyssesBlock on one rank, plain attention: another path to the same
// model), bit for bit. A cp group that files one gathered K/V chunk under the wrong rank,
// or hands the backward the previous step's gathers, must break the equality: the test
// can fail.
#include <catch2/catch.hpp>

#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "autograd/reshape.h"
#include "core/device.h"
#include "core/error.h"
#include "core/generator.h"
#include "dist/local_process_group.h"
#include "dist/mesh.h"
#include "nn/attention.h"
#include "nn/exact_gradient_sync.h"
#include "nn/l1_loss.h"
#include "nn/long_context_block.h"
#include "nn/sequence_parallel_attention.h"
#include "nn/ulysses_block.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "tests/dist/dist_test_util.h"
#include "tests/dist/swapped_group.h"

using namespace seqpar;
using autograd::Variable;
using Catch::Matchers::Contains;
using Layout = nn::ContextParallelLayout;

namespace {

constexpr int64_t kBatch = 2, kSequence = 16, kModelDim = 16, kHeads = 8, kHeadDim = 8;
constexpr int kSteps = 3;
// Boundaries at 3, 9 and 13: inside shards of 2, 4 and 8 tokens, in either layout.
const std::vector<int64_t> kDocuments = {0, 3, 9, 13, kSequence};

nn::LongContextBlockOptions block_options(int64_t kv_heads, Layout layout) {
  nn::LongContextBlockOptions options;
  options.model_dim = kModelDim;
  options.heads = kHeads;
  options.kv_heads = kv_heads;
  options.head_dim = kHeadDim;
  options.documents = kDocuments;
  options.layout = layout;
  return options;
}

// dp replicas, each a batch of kBatch sequences, fresh random values per kv-head count.
struct Data {
  Tensor inputs, targets;  // [dp, kBatch, S, d]
  Data(int dp, uint64_t seed)
      : inputs(Generator(seed).randn({dp, kBatch, kSequence, kModelDim})),
        targets(Generator(seed + 1).randn({dp, kBatch, kSequence, kModelDim})) {}
};

// Rows `positions` of every sequence of replica r: [kBatch, positions, d].
Tensor rows_at(const Tensor& all, int replica, const std::vector<int64_t>& positions) {
  const Tensor mine = all.narrow(0, replica, 1).view({kBatch, kSequence, kModelDim});
  Tensor out = Tensor::empty({kBatch, static_cast<int64_t>(positions.size()), kModelDim});
  for (size_t n = 0; n < positions.size(); ++n) {
    out.narrow(1, static_cast<int64_t>(n), 1).copy_(mine.narrow(1, positions[n], 1));
  }
  return out;
}

using Trace = std::vector<std::vector<float>>;  // the parameters after each step

// kSteps of AdamW on `forward`'s block: replicas [replica, replica + replicas), the rows
// at `positions` of each, gradients summed exactly over `gradients`.
template <typename Forward>
Trace train(const std::vector<Variable>& parameters, const Forward& forward,
            const std::shared_ptr<dist::ProcessGroup>& gradients, const Data& data, int replica, int replicas,
            const std::vector<int64_t>& positions, int dp) {
  optim::AdamW optimizer(parameters, optim::AdamWOptions(1e-2).weight_decay(0.01));
  nn::ExactGradientSync sync(parameters, gradients);
  const nn::Reduction global_mean = nn::Reduction::sum_divided_by(dp * kBatch * kSequence * kModelDim);
  const int64_t rows = static_cast<int64_t>(positions.size());
  Trace after;
  for (int step = 0; step < kSteps; ++step) {
    optimizer.zero_grad();
    for (int r = replica; r < replica + replicas; ++r) {
      const Device device = parameters.front().data().device();
      const Variable x(rows_at(data.inputs, r, positions).to(device));
      const Variable target(rows_at(data.targets, r, positions).view({kBatch * rows, kModelDim}).to(device));
      sync.backward(nn::l1_loss(autograd::reshape(forward(x), {kBatch * rows, kModelDim}), target, global_mean));
    }
    sync.synchronize();
    optim::clip_grad_norm(parameters, /*max_norm=*/1.0);
    optimizer.step();
    std::vector<float> values;
    for (const Variable& p : parameters) {
      const std::vector<float> own = p.data().to_vector();
      values.insert(values.end(), own.begin(), own.end());
    }
    after.push_back(values);
  }
  return after;
}

// One rank holding every replica's sequences whole: the Ulysses block on one rank, whose
// attention is the plain one (same options, same draws from the same seed).
Trace train_one_rank(const Data& data, int dp, int64_t kv_heads) {
  Trace after;
  dist::run_local_world(1, [&](std::shared_ptr<dist::ProcessGroup> alone) {
    nn::UlyssesBlockOptions options;
    options.model_dim = kModelDim;
    options.heads = kHeads;
    options.kv_heads = kv_heads;
    options.head_dim = kHeadDim;
    options.documents = kDocuments;
    Generator generator(9);
    const nn::UlyssesBlock block(options, nn::single_rank_group(), generator);
    std::vector<int64_t> every(kSequence);
    for (int64_t t = 0; t < kSequence; ++t) every[static_cast<size_t>(t)] = t;
    after = train(block.parameters(), [&](const Variable& x) { return block.forward(x); }, alone, data, 0, dp, every,
                  dp);
  });
  return after;
}

std::shared_ptr<nn::SequenceGroup> level(const std::shared_ptr<dist::ProcessGroup>& group) {
  return group ? nn::sequence_group(group) : nn::single_rank_group();
}

// A mistake put into the cp group (a test double of tests/dist/swapped_group.h), or none.
using WrapGroup = std::function<std::shared_ptr<nn::SequenceGroup>(std::shared_ptr<nn::SequenceGroup>)>;

// Every rank's trace over the mesh ulysses x cp x dp, its cp group through `wrap_cp`.
std::vector<Trace> train_mesh(const Data& data, int ulysses, int cp, int dp, int64_t kv_heads, Layout layout,
                              const WrapGroup& wrap_cp = {}, Device device = Device::cpu()) {
  const dist::Mesh mesh(ulysses * cp * dp, ulysses, cp, dp);
  std::vector<Trace> traces(static_cast<size_t>(mesh.world_size()));
  dist::run_local_world(mesh.world_size(), [&](std::shared_ptr<dist::ProcessGroup> world) {
    const dist::MeshGroups groups = dist::build_mesh_groups(mesh, *world);
    std::shared_ptr<nn::SequenceGroup> cp_group = level(groups.cp_group);
    if (wrap_cp) cp_group = wrap_cp(cp_group);
    Generator generator(9);
    const nn::LongContextBlock block(block_options(kv_heads, layout), level(groups.ulysses_group), cp_group,
                                     generator, device);
    const std::vector<int64_t> mine = block.positions(kSequence / (ulysses * cp));
    traces[static_cast<size_t>(world->rank())] =
        train(block.parameters(), [&](const Variable& x) { return block.forward(x); }, groups.sp_dp_group, data,
              groups.coordinates.dp_rank, 1, mine, dp);
  });
  return traces;
}

void check_matrix(int64_t kv_heads) {
  const std::vector<std::pair<int, int>> splits = {{1, 1}, {1, 2}, {1, 4}, {2, 1}, {2, 2}, {2, 4}, {4, 1}, {4, 2}};
  for (const int dp : {1, 2}) {
    const Data data(dp, 100 + static_cast<uint64_t>(kv_heads));
    const Trace baseline = train_one_rank(data, dp, kv_heads);
    for (const auto& [ulysses, cp] : splits) {
      for (const Layout layout : {Layout::Contiguous, Layout::Zigzag}) {
        const std::vector<Trace> traces = train_mesh(data, ulysses, cp, dp, kv_heads, layout);
        for (size_t rank = 0; rank < traces.size(); ++rank) {
          for (int step = 0; step < kSteps; ++step) {
            INFO(kHeads << " query heads over " << kv_heads << ", ulysses " << ulysses << " x cp " << cp << " x dp "
                        << dp << (layout == Layout::Zigzag ? ", zigzag" : ", contiguous") << ", rank " << rank
                        << ", after step " << step + 1);
            CHECK(test::same_bits(traces[rank][static_cast<size_t>(step)], baseline[static_cast<size_t>(step)]));
          }
        }
      }
    }
  }
}

}  // namespace

TEST_CASE("USP, 8 query heads over 8 kv heads: ulysses x cp x dp trains as one rank, bit for bit", "[dist][cpu]") {
  check_matrix(8);
}

TEST_CASE("USP, 8 query heads over 2 kv heads: ulysses x cp x dp trains as one rank, bit for bit", "[dist][cpu]") {
  check_matrix(2);
}

TEST_CASE("USP, 8 query heads over 1 kv head: ulysses x cp x dp trains as one rank, bit for bit", "[dist][cpu]") {
  check_matrix(1);
}

TEST_CASE("USP on one GPU, ranks as threads: ulysses 2 x cp 2 x dp 2 trains with the CPU's one-rank bits",
          "[dist][cuda]") {
  if (cuda_device_count() == 0) {
    WARN("no CUDA device: skipped");
    return;
  }
  const Data data(2, 102);
  const Trace baseline = train_one_rank(data, 2, 2);
  for (const Layout layout : {Layout::Contiguous, Layout::Zigzag}) {
    const std::vector<Trace> traces = train_mesh(data, 2, 2, 2, 2, layout, {}, Device::cuda());
    for (size_t rank = 0; rank < traces.size(); ++rank) {
      for (int step = 0; step < kSteps; ++step) {
        INFO((layout == Layout::Zigzag ? "zigzag" : "contiguous") << ", rank " << rank << ", after step " << step + 1);
        CHECK(test::same_bits(traces[rank][static_cast<size_t>(step)], baseline[static_cast<size_t>(step)]));
      }
    }
  }
}

TEST_CASE("USP with a cp gather filed under the wrong rank does not train as one rank", "[dist][cpu]") {
  const Data data(1, 200);
  const Trace baseline = train_one_rank(data, 1, 2);
  const WrapGroup swap = [](std::shared_ptr<nn::SequenceGroup> group) -> std::shared_ptr<nn::SequenceGroup> {
    return std::make_shared<test::SwappedSlices>(std::move(group), test::SwappedSlices::Which::AllGather);
  };
  for (const Layout layout : {Layout::Contiguous, Layout::Zigzag}) {
    const std::vector<Trace> traces = train_mesh(data, 2, 2, 1, 2, layout, swap);
    bool differs = false;
    for (const Trace& trace : traces) differs = differs || !test::same_bits(trace.front(), baseline.front());
    CHECK(differs);
  }
}

// The cp layer gathers 7 times a step (K and V forward; O, m, l, dO and Q backward). From
// step 2's first backward gather on, the double hands back step 1's: the forward is
// fresh, the backward's queries stale. Step 1 must still be one rank's (the double is the
// only fault), step 2 not.
TEST_CASE("USP whose backward reuses the previous step's gathered queries does not train as one rank",
          "[dist][cpu]") {
  const Data data(1, 210);
  const Trace baseline = train_one_rank(data, 1, 2);
  const WrapGroup stale = [](std::shared_ptr<nn::SequenceGroup> group) -> std::shared_ptr<nn::SequenceGroup> {
    return std::make_shared<test::StaleGathers>(std::move(group), /*period=*/7, /*first_stale=*/7 + 2);
  };
  const std::vector<Trace> traces = train_mesh(data, 2, 2, 1, 2, Layout::Zigzag, stale);
  bool differs = false;
  for (const Trace& trace : traces) {
    CHECK(test::same_bits(trace[0], baseline[0]));
    differs = differs || !test::same_bits(trace[1], baseline[1]);
  }
  CHECK(differs);
}

TEST_CASE("USP's positions: the cp layout's, split contiguously over the Ulysses ranks", "[dist][cpu]") {
  // ulysses 2 x cp 2, zigzag, S = 16: cp rank 0 holds chunks 0 and 3 of 4 ({0-3, 12-15}),
  // cp rank 1 chunks 1 and 2 ({4-11}); each Ulysses pair splits its cp rank's 8 in two.
  const dist::Mesh mesh(4, 2, 2, 1);
  std::vector<std::vector<int64_t>> seen(4);
  dist::run_local_world(4, [&](std::shared_ptr<dist::ProcessGroup> world) {
    const dist::MeshGroups groups = dist::build_mesh_groups(mesh, *world);
    const nn::SequenceParallelAttention attention(level(groups.ulysses_group), level(groups.cp_group),
                                                  {nn::AttentionMask::causal(), Layout::Zigzag, {}});
    seen[static_cast<size_t>(world->rank())] = attention.positions(4);
  });
  CHECK(seen[0] == std::vector<int64_t>{0, 1, 2, 3});
  CHECK(seen[1] == std::vector<int64_t>{12, 13, 14, 15});
  CHECK(seen[2] == std::vector<int64_t>{4, 5, 6, 7});
  CHECK(seen[3] == std::vector<int64_t>{8, 9, 10, 11});
}

TEST_CASE("USP refuses heads that do not split over ulysses and a missing group, naming them", "[dist][cpu]") {
  CHECK_THROWS_WITH(nn::SequenceParallelAttention(nn::single_rank_group(), nullptr),
                    Contains("no context-parallel group"));
  std::vector<std::string> messages(4);
  const dist::Mesh mesh(4, 4, 1, 1);
  dist::run_local_world(4, [&](std::shared_ptr<dist::ProcessGroup> world) {
    const dist::MeshGroups groups = dist::build_mesh_groups(mesh, *world);
    const nn::SequenceParallelAttention attention(level(groups.ulysses_group), level(groups.cp_group));
    const Variable q(Tensor::zeros({1, 2, 6, 4})), kv(Tensor::zeros({1, 2, 2, 4}));
    try {
      attention.forward(q, kv, kv);
    } catch (const Error& e) {
      messages[static_cast<size_t>(world->rank())] = e.what();
    }
  });
  for (const std::string& m : messages) CHECK_THAT(m, Contains("Hq = 6 query heads do not split evenly over sp = 4"));
}

// The layer alone, on one sequence given 3-D ([s, H, D]): every rank's output rows and
// its q, k, v gradients are one rank's attention at its positions, bit for bit, over
// ulysses 2 x cp 2 (zigzag) and ulysses 4 x cp 2 (contiguous), 8 query heads over 2 kv heads.
TEST_CASE("USP on one sequence (3-D) gives one rank's outputs and gradients at its positions", "[dist][cpu]") {
  Generator generator(220);
  const Tensor q = generator.randn({kSequence, kHeads, kHeadDim}), k = generator.randn({kSequence, 2, kHeadDim});
  const Tensor v = generator.randn({kSequence, 2, kHeadDim}), g = generator.randn({kSequence, kHeads * kHeadDim});
  const nn::AttentionMask mask = nn::AttentionMask::documents(kDocuments);
  const Variable q1(q, true), k1(k, true), v1(v, true);
  const Variable one =
      autograd::reshape(nn::scaled_dot_product_attention(q1, k1, v1, mask), {kSequence, kHeads * kHeadDim});
  one.backward(g);
  const auto rows = [](const Tensor& t, const std::vector<int64_t>& at) {
    std::vector<float> out;
    for (const int64_t p : at) {
      const std::vector<float> row = t.narrow(0, p, 1).contiguous().to_vector();
      out.insert(out.end(), row.begin(), row.end());
    }
    return out;
  };
  using Split = std::tuple<int, int, Layout>;
  for (const Split& split : std::vector<Split>{{2, 2, Layout::Zigzag}, {4, 2, Layout::Contiguous}}) {
    const int ulysses = std::get<0>(split), cp = std::get<1>(split);  // named, for the rank threads' lambda
    const Layout layout = std::get<2>(split);
    const dist::Mesh mesh(ulysses * cp, ulysses, cp, 1);
    struct Seen {
      std::vector<int64_t> at;
      std::vector<float> out, dq, dk, dv;
    };
    std::vector<Seen> seen(static_cast<size_t>(ulysses * cp));
    dist::run_local_world(ulysses * cp, [&](std::shared_ptr<dist::ProcessGroup> world) {
      const dist::MeshGroups groups = dist::build_mesh_groups(mesh, *world);
      const nn::SequenceParallelAttention attention(level(groups.ulysses_group), level(groups.cp_group),
                                                    {mask, layout, {}});
      Seen& mine = seen[static_cast<size_t>(world->rank())];
      mine.at = attention.positions(kSequence / (ulysses * cp));
      const Variable qr(Tensor::from_data({static_cast<int64_t>(mine.at.size()), kHeads, kHeadDim}, rows(q, mine.at)),
                        true);
      const Variable kr(Tensor::from_data({static_cast<int64_t>(mine.at.size()), 2, kHeadDim}, rows(k, mine.at)), true);
      const Variable vr(Tensor::from_data({static_cast<int64_t>(mine.at.size()), 2, kHeadDim}, rows(v, mine.at)), true);
      const Variable out = attention.forward(qr, kr, vr);
      out.backward(Tensor::from_data(out.shape(), rows(g, mine.at)));
      mine.out = out.data().to_vector();
      mine.dq = qr.grad().to_vector();
      mine.dk = kr.grad().to_vector();
      mine.dv = vr.grad().to_vector();
    });
    for (size_t rank = 0; rank < seen.size(); ++rank) {
      INFO("ulysses " << ulysses << " x cp " << cp << ", rank " << rank);
      const Seen& s = seen[rank];
      CHECK(test::same_bits(s.out, rows(one.data(), s.at)));
      CHECK(test::same_bits(s.dq, rows(q1.grad(), s.at)));
      CHECK(test::same_bits(s.dk, rows(k1.grad(), s.at)));
      CHECK(test::same_bits(s.dv, rows(v1.grad(), s.at)));
    }
  }
}
