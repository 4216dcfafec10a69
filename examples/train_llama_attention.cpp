// Trains the attention of a Llama-shaped layer — 8 query heads sharing 2 kv heads of 128
// dims, a batch of 2 sequences each packing 4 documents, causal within each document —
// with its sequences split over 4 sequence-parallel ranks and 2 data-parallel replicas
// (8 threads of this process). Four ranks are more than the 2 kv heads: each rank gets a
// copy of the kv head its query heads read, and the copies' gradients are added back
// exactly. The projections' gradients are summed exactly over all 8 ranks and rounded
// once, so the ranks train as one rank holding everything would: the program checks it
// bit for bit at the end.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include <seqpar/seqpar.h>
#include <seqpar/autograd/reshape.h>
#include <seqpar/nn/ulysses_block.h>

using namespace seqpar;

namespace {

constexpr int kSp = 4, kDp = 2, kSteps = 10;
constexpr int64_t kBatch = 2, kSequence = 64;

nn::UlyssesBlockOptions llama_attention() {
  nn::UlyssesBlockOptions options;
  options.model_dim = 32;
  options.heads = 8;
  options.kv_heads = 2;
  options.head_dim = 128;
  // Document boundaries: 10, 23 and 50 fall inside ranks' shards of 16 tokens.
  options.documents = {0, 10, 23, 50, kSequence};
  return options;
}

// One training run of `block` on rows [first, first + rows) of replica `replica`'s batch.
// `sum_over_ranks` adds the exact sums' digits over every rank (nothing for one rank).
// Returns the parameters after the last step; rank 0 prints the whole run's loss.
template <typename SumOverRanks, typename LossOverRanks>
std::vector<float> train(nn::UlyssesBlock& block, const Tensor& inputs, const Tensor& targets, int replicas,
                         int64_t first, int64_t rows, SumOverRanks sum_over_ranks, LossOverRanks loss_over_ranks,
                         bool print) {
  const std::vector<autograd::Variable> parameters = block.parameters();
  optim::AdamW optimizer(parameters, optim::AdamWOptions(3e-3).weight_decay(0.01));
  const int64_t width = block.options().model_dim;
  // Each loss is its rows' share of the mean over every replica's batch.
  const nn::Reduction share = nn::Reduction::sum_divided_by(kDp * kBatch * kSequence * width);
  for (int step = 1; step <= kSteps; ++step) {
    optimizer.zero_grad();
    nn::ExactGradients exact;
    float loss = 0.0f;
    {
      const nn::ExactGradients::Recording recording(exact);
      for (int r = 0; r < replicas; ++r) {
        const autograd::Variable x(inputs.narrow(0, r, 1).narrow(2, first, rows).contiguous().view({kBatch, rows, width}));
        const autograd::Variable y(targets.narrow(0, r, 1).narrow(2, first, rows).contiguous().view({kBatch * rows, width}));
        const autograd::Variable part = nn::l1_loss(autograd::reshape(block.forward(x), {kBatch * rows, width}), y, share);
        part.backward();
        loss += part.data().item();
      }
    }
    for (exact::ExactSums* sums : exact.sums()) sum_over_ranks(*sums);
    exact.round_into_grads();
    optim::clip_grad_norm(parameters, /*max_norm=*/1.0);
    optimizer.step();
    loss = loss_over_ranks(loss);
    if (print && (step == 1 || step % 2 == 0)) std::printf("step %2d  loss %.4f\n", step, loss);
  }
  std::vector<float> values;
  for (const autograd::Variable& p : parameters) {
    const std::vector<float> own = p.data().to_vector();
    values.insert(values.end(), own.begin(), own.end());
  }
  return values;
}

}  // namespace

int main() {
  const nn::UlyssesBlockOptions options = llama_attention();
  // Each replica's batch [2, S, d_model]; the target of token t is the mean of its
  // document's tokens up to t: what causal attention within documents gives when every
  // score is equal, and what the layer must learn to produce.
  const Tensor inputs = Generator(1).randn({kDp, kBatch, kSequence, options.model_dim});
  Tensor targets = Tensor::empty(inputs.shape());
  for (int64_t r = 0; r < kDp; ++r) {
    for (int64_t b = 0; b < kBatch; ++b) {
      std::vector<float> running(static_cast<size_t>(options.model_dim));
      for (int64_t t = 0, document_start = 0, n = 0; t < kSequence; ++t) {
        if (t == options.documents[static_cast<size_t>(n)]) {
          document_start = t;
          ++n;
          std::fill(running.begin(), running.end(), 0.0f);
        }
        for (int64_t c = 0; c < options.model_dim; ++c) {
          running[static_cast<size_t>(c)] += inputs.at({r, b, t, c});
          targets.set({r, b, t, c}, running[static_cast<size_t>(c)] / static_cast<float>(t - document_start + 1));
        }
      }
    }
  }

  // sp 4 x dp 2: rank (sp_rank, dp_rank) holds rows sp_rank * S/4 ... of replica dp_rank.
  const dist::Mesh mesh(kSp * kDp, kSp, kDp);
  std::vector<std::vector<float>> trained(kSp * kDp);
  dist::run_local_world(kSp * kDp, [&](std::shared_ptr<dist::ProcessGroup> world) {
    const dist::MeshGroups groups = dist::build_mesh_groups(mesh, *world);
    Generator generator(42);  // the same initial layer on every rank
    nn::UlyssesBlock block(options, nn::sequence_group(groups.sp_group), generator);
    const int64_t rows = kSequence / kSp;
    trained[static_cast<size_t>(world->rank())] = train(
        block, inputs.narrow(0, groups.coordinates.dp_rank, 1), targets.narrow(0, groups.coordinates.dp_rank, 1), 1,
        groups.coordinates.sp_rank * rows, rows, [&](exact::ExactSums& sums) { groups.sp_dp_group->all_reduce_sums(sums); },
        [&](float loss) {
          Tensor total = Tensor::full({1}, loss);
          world->all_reduce(total);  // the loss of every rank's rows
          return total.item();
        },
        world->rank() == 0);
  });

  // One rank holding both replicas' batches whole.
  Generator generator(42);
  nn::UlyssesBlock alone(options, nn::single_rank_group(), generator);
  const std::vector<float> one_rank = train(alone, inputs, targets, kDp, 0, kSequence, [](exact::ExactSums&) {},
                                            [](float loss) { return loss; }, false);
  for (const std::vector<float>& rank : trained) {
    const bool same_bits = rank.size() == one_rank.size() &&
                           std::memcmp(rank.data(), one_rank.data(), rank.size() * sizeof(float)) == 0;
    if (!same_bits) {
      std::printf("a rank's parameters differ from one-rank training\n");
      return 1;
    }
  }
  return 0;
}
