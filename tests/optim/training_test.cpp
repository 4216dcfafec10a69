// The issue's model trained on one CPU rank: Linear(640 -> 16), L1 (mean) against
// the first 16 input columns, clip at 1.0, AdamW(lr 1e-4, betas 0.9/0.999, eps 1e-8,
// weight decay 0.01). The loss must fall, and the run must be bitwise repeatable.
// [cuda]: the issue's step (x [12000, 640] ~ N(0, 1), one step) on the GPU matches the
// CPU to float32 rounding and is bitwise reproducible.
#include <catch2/catch.hpp>

#include <cstring>

#include "autograd/ops.h"
#include "core/generator.h"
#include "nn/l1_loss.h"
#include "nn/linear.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "tests/cuda_test_util.h"
#include "tests/test_util.h"

using namespace seqpar;
using autograd::Variable;

namespace {

struct TrainingRun {
  std::vector<float> losses;
  std::vector<Tensor> parameters;
};

// As the report's script: seed, build the model, then draw x from the same generator.
TrainingRun train_issue_model(int64_t rows, int steps) {
  Generator generator(12345);
  nn::Linear model(640, 16, generator);
  const Variable x(generator.randn({rows, 640}));
  const Variable target = autograd::narrow(x, 1, 0, 16);  // x[:, :16], a strided view
  optim::AdamW optimizer(model.parameters(),
                         optim::AdamWOptions(1e-4).betas({0.9, 0.999}).eps(1e-8).weight_decay(0.01));
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

TEST_CASE("one rank trains the issue's model: the loss falls for 20 steps", "[optim][training]") {
  const TrainingRun run = train_issue_model(/*rows=*/12000, /*steps=*/20);
  REQUIRE(run.losses.size() == 20);
  CAPTURE(run.losses);
  CHECK(run.losses.back() < run.losses.front());
  for (size_t i = 1; i < run.losses.size(); ++i) CHECK(run.losses[i] < run.losses[i - 1]);
}

TEST_CASE("the same seed gives a bitwise-identical 5-step run", "[optim][determinism]") {
  const TrainingRun first = train_issue_model(/*rows=*/1000, /*steps=*/5);
  const TrainingRun second = train_issue_model(/*rows=*/1000, /*steps=*/5);
  REQUIRE(first.parameters.size() == second.parameters.size());
  for (size_t i = 0; i < first.parameters.size(); ++i) {
    CHECK(test::bitwise_equal(first.parameters[i], second.parameters[i]));
  }
  CHECK(std::memcmp(first.losses.data(), second.losses.data(),
                    first.losses.size() * sizeof(float)) == 0);
}

// ---- [cuda]: the issue's training step on the GPU

namespace {

struct StepResult {
  Tensor loss, norm, grad_weight, grad_bias, weight, bias;
};

// Everything is drawn on the host and copied, so both devices start from the same bits.
StepResult issue_step(Device device) {
  Generator generator(12345);
  nn::Linear linear(640, 16, generator, device);  // as the report's script: the model, then x
  const Tensor x = generator.randn({12000, 640}, device);
  const Variable input(x), target(x.narrow(1, 0, 16));
  optim::AdamW optimizer(linear.parameters(), optim::AdamWOptions(1e-4).weight_decay(0.01));

  const Variable loss = nn::l1_loss(linear.forward(input), target);
  loss.backward();
  const Tensor norm = optim::clip_grad_norm(linear.parameters(), 1.0);
  StepResult result{loss.data(), norm, linear.weight().grad().clone(),
                    linear.bias().grad().clone(), Tensor(), Tensor()};
  optimizer.step();
  result.weight = linear.weight().data().clone();
  result.bias = linear.bias().data().clone();
  return result;
}

}  // namespace

TEST_CASE("the issue's training step on the GPU matches the CPU to float32 rounding", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  const StepResult cpu = issue_step(Device::cpu());
  test::poison_pool(Device::cuda());
  const StepResult gpu = issue_step(Device::cuda());
  CHECK(gpu.loss.device() == Device::cuda());
  // The loss sums 192000 terms in double on both sides.
  CHECK(test::relative_error(gpu.loss, cpu.loss) < 1e-6);
  // dW reduces 12000 products in fp32 in a different order than Eigen; the norm and
  // the clipped gradients follow it.
  CHECK(test::relative_error(gpu.norm, cpu.norm) < 1e-5);
  CHECK(test::relative_error(gpu.grad_weight, cpu.grad_weight) < 1e-5);
  CHECK(test::relative_error(gpu.grad_bias, cpu.grad_bias) < 1e-5);
  // One AdamW step moves each parameter by about lr * sign(gradient): the parameters
  // agree to about float32 rounding of their values.
  CHECK(test::relative_error(gpu.weight, cpu.weight) < 1e-6);
  CHECK(test::relative_error(gpu.bias, cpu.bias) < 1e-6);
  WARN("issue step, GPU vs CPU: loss " << gpu.loss.item() << " vs " << cpu.loss.item()
       << "; norm " << gpu.norm.item() << " vs " << cpu.norm.item() << "; worst ulp distance "
       << "of weight " << test::max_ulp_distance(gpu.weight, cpu.weight) << ", bias "
       << test::max_ulp_distance(gpu.bias, cpu.bias));
}

TEST_CASE("the issue's training step on the GPU is bitwise reproducible", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  const StepResult first = issue_step(Device::cuda());
  test::poison_pool(Device::cuda());
  const StepResult second = issue_step(Device::cuda());
  CHECK(test::bitwise_equal(first.loss, second.loss));
  CHECK(test::bitwise_equal(first.norm, second.norm));
  CHECK(test::bitwise_equal(first.grad_weight, second.grad_weight));
  CHECK(test::bitwise_equal(first.grad_bias, second.grad_bias));
  CHECK(test::bitwise_equal(first.weight, second.weight));
  CHECK(test::bitwise_equal(first.bias, second.bias));
}
