// Trains a small attention block with its sequence split over 2 ranks (threads of this
// process), as DeepSpeed-Ulysses splits it: each rank holds half of the 1024 tokens,
// and two all-to-alls inside the attention give each rank every token of half the heads.
// The projections' gradients are sums over rows both ranks hold; the exact gradient sync
// adds their exact digits across the ranks and rounds them once, so both ranks train as
// one rank would.
#include <cstdio>
#include <vector>

#include <seqpar/seqpar.h>

int main() {
  using namespace seqpar;
  const int sp = 2;
  const int64_t sequence = 1024;
  const nn::UlyssesBlockOptions options;  // d_model 128, 8 heads of 16, causal
  Generator data(1);
  const Tensor x = data.randn({sequence, options.model_dim});
  // The target of token t is the mean of tokens 0..t: what causal attention gives when
  // every score is equal, and what the block must learn to produce.
  Tensor target = Tensor::empty(x.shape());
  std::vector<float> running_sum(static_cast<size_t>(options.model_dim), 0.0f);
  for (int64_t t = 0; t < sequence; ++t) {
    for (int64_t c = 0; c < options.model_dim; ++c) {
      running_sum[static_cast<size_t>(c)] += x.at({t, c});
      target.set({t, c}, running_sum[static_cast<size_t>(c)] / static_cast<float>(t + 1));
    }
  }
  dist::run_local_world(sp, [&](std::shared_ptr<dist::ProcessGroup> group) {
    Generator generator(42);  // the same initial block on every rank
    nn::UlyssesBlock block(options, nn::sequence_group(group), generator);
    optim::AdamW optimizer(block.parameters(), optim::AdamWOptions(5e-3).weight_decay(0.01));
    nn::ExactGradientSync sync(block.parameters(), group);
    const int64_t rows = sequence / sp, first = group->rank() * rows;  // this rank's tokens
    const autograd::Variable x_here(x.narrow(0, first, rows)), target_here(target.narrow(0, first, rows));
    // Each rank's loss is its rows' share of the mean over the whole sequence.
    const nn::Reduction share = nn::Reduction::sum_divided_by(sequence * options.model_dim);
    for (int step = 1; step <= 30; ++step) {
      optimizer.zero_grad();
      const autograd::Variable loss = nn::l1_loss(block.forward(x_here), target_here, share);
      sync.backward(loss);  // loss.backward(), its exact row sums recorded
      sync.synchronize();   // added over the ranks, rounded once: one-rank gradients
      optim::clip_grad_norm(block.parameters(), /*max_norm=*/1.0);
      optimizer.step();
      Tensor total = loss.data().clone();
      group->all_reduce(total);  // the whole sequence's loss
      if (group->rank() == 0 && (step == 1 || step % 5 == 0)) {
        std::printf("step %2d  loss %.4f\n", step, total.item());
      }
    }
  });
  return 0;
}
