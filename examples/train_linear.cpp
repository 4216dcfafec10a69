// Trains a Linear layer to copy the first 16 of its 64 inputs, with seqpar as a library.
#include <cstdio>

#include <seqpar/seqpar.h>

int main() {
  using namespace seqpar;
  Generator generator(42);  // every random number comes from an explicit seed
  nn::Linear model(64, 16, generator);
  const autograd::Variable x(generator.randn({256, 64}));
  const autograd::Variable target(x.data().narrow(1, 0, 16));  // x[:, :16]
  optim::AdamW optimizer(model.parameters(), optim::AdamWOptions().lr(1e-2).weight_decay(0.01));
  for (int step = 1; step <= 60; ++step) {
    optimizer.zero_grad();
    const autograd::Variable loss = nn::l1_loss(model.forward(x), target);
    loss.backward();
    optim::clip_grad_norm(model.parameters(), /*max_norm=*/1.0);
    optimizer.step();
    if (step == 1 || step % 10 == 0) std::printf("step %2d  loss %.4f\n", step, loss.data().item());
  }
  return 0;
}
