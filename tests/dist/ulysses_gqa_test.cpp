// A Llama-shaped attention layer (nn::UlyssesBlock with 8 query heads over 2 kv heads of
// 128 dims, a batch of 2 sequences, packed documents whose boundaries fall inside the
// ranks' shards, causal) trained under the exact policy over sp {1, 2, 4, 8} x dp {1, 2}
// thread ranks equals one-rank training bit for bit, step after step. At sp 4 and 8 the
// ranks outnumber the kv heads: each holds copies of the kv head its query heads read,
// whose gradients meet in one exact sum.
#include <catch2/catch.hpp>

#include <vector>

#include "autograd/reshape.h"
#include "core/device.h"
#include "core/generator.h"
#include "dist/local_process_group.h"
#include "dist/mesh.h"
#include "nn/exact_gradient_sync.h"
#include "nn/l1_loss.h"
#include "nn/ulysses_block.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "tests/dist/dist_test_util.h"
#include "tests/test_util.h"

using namespace seqpar;
using autograd::Variable;

namespace {

constexpr int64_t kBatch = 2, kSequence = 32, kModelDim = 32;
constexpr int kSteps = 2;

nn::UlyssesBlockOptions llama_options() {
  nn::UlyssesBlockOptions options;
  options.model_dim = kModelDim;
  options.heads = 8;
  options.kv_heads = 2;
  options.head_dim = 128;
  options.documents = {0, 5, 13, 19, kSequence};  // boundaries inside shards of 4, 8 and 16
  return options;
}

// dp replicas, each a batch of kBatch sequences: replica r's inputs are [kBatch, S, d].
struct Data {
  Tensor inputs, targets;  // [dp, kBatch, S, d]
  explicit Data(int dp)
      : inputs(Generator(81).randn({dp, kBatch, kSequence, kModelDim})),
        targets(Generator(82).randn({dp, kBatch, kSequence, kModelDim})) {}
};

// Each rank's parameters after every step, flattened: the rank holds rows
// [first, first + rows) of replicas [replica, replica + replicas), one micro-batch each,
// and its gradient sums are added over `gradients` (sp x dp).
std::vector<std::vector<float>> train(const std::shared_ptr<nn::SequenceGroup>& group,
                                      const std::shared_ptr<dist::ProcessGroup>& gradients, const Data& data,
                                      int replica, int replicas, int64_t first, int64_t rows, int dp,
                                      Device device = Device::cpu()) {
  Generator generator(9);
  nn::UlyssesBlock block(llama_options(), group, generator, device);
  const std::vector<Variable> parameters = block.parameters();
  optim::AdamW optimizer(parameters, optim::AdamWOptions(1e-2).weight_decay(0.01));
  nn::ExactGradientSync sync(parameters, gradients);
  const nn::Reduction global_mean = nn::Reduction::sum_divided_by(dp * kBatch * kSequence * kModelDim);
  std::vector<std::vector<float>> after;
  for (int step = 0; step < kSteps; ++step) {
    optimizer.zero_grad();
    for (int r = replica; r < replica + replicas; ++r) {
      const Variable x(
          data.inputs.narrow(0, r, 1).narrow(2, first, rows).contiguous().view({kBatch, rows, kModelDim}).to(device));
      const Variable target(
          data.targets.narrow(0, r, 1).narrow(2, first, rows).contiguous().view({kBatch * rows, kModelDim}).to(device));
      sync.backward(nn::l1_loss(autograd::reshape(block.forward(x), {kBatch * rows, kModelDim}), target, global_mean));
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

// One rank holding every replica's batches whole, on `device`.
std::vector<std::vector<float>> train_one_rank(const Data& data, int dp, Device device = Device::cpu()) {
  std::vector<std::vector<float>> after;
  dist::run_local_world(1, [&](std::shared_ptr<dist::ProcessGroup> alone) {
    after = train(nn::sequence_group(alone), alone, data, 0, dp, 0, kSequence, dp, device);
  });
  return after;
}

}  // namespace

TEST_CASE("a Llama-shaped Ulysses layer (GQA 8 over 2, batch 2, packed documents) over sp {1, 2, 4, 8} x "
          "dp {1, 2} trains as one rank, bit for bit",
          "[dist][cpu]") {
  for (int dp : {1, 2}) {
    const Data data(dp);
    const std::vector<std::vector<float>> baseline = train_one_rank(data, dp);
    for (int sp : {1, 2, 4, 8}) {
      const dist::Mesh mesh(sp * dp, sp, dp);
      std::vector<std::vector<std::vector<float>>> traces(static_cast<size_t>(sp * dp));
      dist::run_local_world(sp * dp, [&](std::shared_ptr<dist::ProcessGroup> world) {
        const dist::MeshGroups groups = dist::build_mesh_groups(mesh, *world);
        const int64_t rows = kSequence / sp;
        traces[static_cast<size_t>(world->rank())] =
            train(nn::sequence_group(groups.sp_group), groups.sp_dp_group, data, groups.coordinates.dp_rank, 1,
                  groups.coordinates.sp_rank * rows, rows, dp);
      });
      for (int rank = 0; rank < sp * dp; ++rank) {
        for (int step = 0; step < kSteps; ++step) {
          INFO("sp " << sp << ", dp " << dp << ", rank " << rank << ", after step " << step + 1);
          CHECK(test::same_bits(traces[static_cast<size_t>(rank)][static_cast<size_t>(step)],
                                baseline[static_cast<size_t>(step)]));
        }
      }
    }
  }
}

// The same layer at sp 4 (past the kv heads) with its ranks as threads sharing one GPU:
// every rank ends each step with the CPU's one-rank parameters, bit for bit.
TEST_CASE("the Llama-shaped Ulysses layer at sp 4 on one GPU trains with the CPU's bits", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  const Data data(1);
  const int sp = 4;
  const std::vector<std::vector<float>> cpu = train_one_rank(data, 1);
  std::vector<std::vector<std::vector<float>>> gpu(sp);
  dist::run_local_world(sp, [&](std::shared_ptr<dist::ProcessGroup> world) {
    const int64_t rows = kSequence / sp;
    gpu[static_cast<size_t>(world->rank())] =
        train(nn::sequence_group(world), world, data, 0, 1, world->rank() * rows, rows, 1, Device::cuda());
  });
  for (int rank = 0; rank < sp; ++rank) {
    for (int step = 0; step < kSteps; ++step) {
      INFO("rank " << rank << ", after step " << step + 1);
      CHECK(test::same_bits(gpu[static_cast<size_t>(rank)][static_cast<size_t>(step)], cpu[static_cast<size_t>(step)]));
    }
  }
}
