// One AdamW step on the model through the installed headers and libraries.
#include <cstdio>

#include "core/generator.h"
#include "core/version.h"
#include "nn/l1_loss.h"
#include "nn/linear.h"
#include "optim/adamw.h"

int main() {
  seqpar::Generator generator(12345);
  seqpar::nn::Linear linear(640, 16, generator);
  const seqpar::autograd::Variable x(generator.randn({64, 640}));
  const seqpar::autograd::Variable target(x.data().narrow(1, 0, 16));
  seqpar::optim::AdamW optimizer({linear.weight(), linear.bias()}, {1e-4, 0.9, 0.999, 1e-8, 0.01});
  const seqpar::autograd::Variable loss = seqpar::nn::l1_loss(linear.forward(x), target);
  loss.backward();
  optimizer.step();
  std::printf("seqpar %s: loss %.6f\n", seqpar::kSeqparVersion, loss.data().item());
  return 0;
}
