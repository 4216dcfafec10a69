// The seed's model trained on one CPU rank: Linear(640 -> 16), L1 (mean) against
// the first 16 input columns, clip at 1.0, AdamW(lr 1e-4, betas 0.9/0.999, eps 1e-8,
// weight decay 0.01). The loss must fall, and the run must be bitwise repeatable.
#include <catch2/catch.hpp>

#include <cstring>

#include "autograd/ops.h"
#include "core/generator.h"
#include "nn/l1_loss.h"
#include "nn/linear.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "tests/test_util.h"

using namespace seqpar;
using autograd::Variable;

namespace {

struct TrainingRun {
  std::vector<float> losses;
  std::vector<Tensor> parameters;
};

// As the seed script: seed, build the model, then draw x from the same generator.
TrainingRun train_seed_model(int64_t rows, int steps) {
  Generator generator(12345);
  nn::Linear model(640, 16, generator);
  const Variable x(generator.randn({rows, 640}));
  const Variable target = autograd::narrow(x, 1, 0, 16);  // x[:, :16], a strided view
  optim::AdamW optimizer(model.parameters(), {/*lr=*/1e-4, /*beta1=*/0.9, /*beta2=*/0.999,
                                              /*eps=*/1e-8, /*weight_decay=*/0.01});
  TrainingRun run;
  for (int step = 0; step < steps; ++step) {
    model.zero_grad();
    Variable loss = nn::l1_loss(model.forward(x), target, nn::Reduction::mean());
    loss.backward();
    optim::clip_grad_norm(model.parameters(), 1.0);
    optimizer.step();
    run.losses.push_back(loss.data().item());
  }
  for (const Variable& parameter : model.parameters()) run.parameters.push_back(parameter.data());
  return run;
}

}  // namespace

TEST_CASE("one rank trains the seed's model: the loss falls for 20 steps", "[optim][training]") {
  const TrainingRun run = train_seed_model(/*rows=*/12000, /*steps=*/20);
  REQUIRE(run.losses.size() == 20);
  CAPTURE(run.losses);
  CHECK(run.losses.back() < run.losses.front());
  for (size_t i = 1; i < run.losses.size(); ++i) CHECK(run.losses[i] < run.losses[i - 1]);
}

TEST_CASE("the same seed gives a bitwise-identical 5-step run", "[optim][determinism]") {
  const TrainingRun first = train_seed_model(/*rows=*/1000, /*steps=*/5);
  const TrainingRun second = train_seed_model(/*rows=*/1000, /*steps=*/5);
  REQUIRE(first.parameters.size() == second.parameters.size());
  for (size_t i = 0; i < first.parameters.size(); ++i) {
    CHECK(test::bitwise_equal(first.parameters[i], second.parameters[i]));
  }
  CHECK(std::memcmp(first.losses.data(), second.losses.data(),
                    first.losses.size() * sizeof(float)) == 0);
}
