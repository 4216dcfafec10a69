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

// One training run of `block` on rows [first, first + rows) of the `replicas` batches it
// is given; the gradients are summed exactly over `gradients` (sp x dp), the loss over
// `world` for the printout. Returns the parameters after the last step.
std::vector<float> train(nn::UlyssesBlock& block, const std::shared_ptr<dist::ProcessGroup>& gradients,
                         const std::shared_ptr<dist::ProcessGroup>& world, const Tensor& inputs,
                         const Tensor& targets, int64_t first, int64_t rows) {
  const std::vector<autograd::Variable> parameters = block.parameters();
  optim::AdamW optimizer(parameters, optim::AdamWOptions(3e-3).weight_decay(0.01));
  nn::ExactGradientSync sync(parameters, gradients);
  const int64_t width = block.options().model_dim;
  // Each loss is its rows' share of the mean over every replica's batch.
  const nn::Reduction share = nn::Reduction::sum_divided_by(kDp * kBatch * kSequence * width);
  for (int step = 1; step <= kSteps; ++step) {
    optimizer.zero_grad();
    Tensor loss = Tensor::zeros({1});
    for (int64_t r = 0; r < inputs.size(0); ++r) {  // one micro-batch per replica held
      const Tensor x = inputs.narrow(0, r, 1).narrow(2, first, rows).contiguous().view({kBatch, rows, width});
      const Tensor y = targets.narrow(0, r, 1).narrow(2, first, rows).contiguous().view({kBatch * rows, width});
      const autograd::Variable out = autograd::reshape(block.forward(autograd::Variable(x)), {kBatch * rows, width});
      const autograd::Variable part = nn::l1_loss(out, autograd::Variable(y), share);
      sync.backward(part);  // part.backward(), its exact row sums recorded
      loss.set({0}, loss.item() + part.data().item());
    }
    sync.synchronize();  // added over sp x dp, rounded once: one-rank training's gradients
    optim::clip_grad_norm(parameters, /*max_norm=*/1.0);
    optimizer.step();
    world->all_reduce(loss);  // every rank's rows
    if (world->rank() == 0 && world->size() > 1 && (step == 1 || step % 2 == 0)) {
      std::printf("step %2d  loss %.4f\n", step, loss.item());
    }
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
    const int64_t rows = kSequence / kSp, replica = groups.coordinates.dp_rank;
    trained[static_cast<size_t>(world->rank())] =
        train(block, groups.sp_dp_group, world, inputs.narrow(0, replica, 1), targets.narrow(0, replica, 1),
              groups.coordinates.sp_rank * rows, rows);
  });

  // One rank holding both replicas' batches whole.
  std::vector<float> one_rank;
  dist::run_local_world(1, [&](std::shared_ptr<dist::ProcessGroup> alone) {
    Generator generator(42);
    nn::UlyssesBlock block(options, nn::sequence_group(alone), generator);
    one_rank = train(block, alone, alone, inputs, targets, 0, kSequence);
  });
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
