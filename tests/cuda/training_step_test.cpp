// The seed's training step (DeepSpeed issue #6868 at one rank) on the CPU and on the
// GPU: x [12000, 640] ~ N(0, 1), Linear(640 -> 16), loss = mean |linear(x) - x[:, :16]|,
// gradients clipped to norm 1.0, one AdamW step (lr 1e-4, weight decay 0.01).
#include <catch2/catch.hpp>

#include "autograd/variable.h"
#include "core/generator.h"
#include "nn/l1_loss.h"
#include "nn/linear.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/test_util.h"

using namespace seqpar;
using autograd::Variable;
using test::relative_error;

namespace {

struct StepResult {
  Tensor loss, norm, grad_weight, grad_bias, weight, bias;
};

// Everything is drawn on the host and copied, so both devices start from the same bits.
StepResult seed_step(Device device) {
  Generator generator(12345);
  nn::Linear linear(640, 16, generator, device);  // as the seed: the model, then x
  const Tensor x = generator.randn({12000, 640}, device);
  const Variable input(x), target(x.narrow(1, 0, 16));
  optim::AdamWOptions options;
  options.lr = 1e-4;
  options.weight_decay = 0.01;
  optim::AdamW optimizer(linear.parameters(), options);

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

TEST_CASE("the seed training step on the GPU matches the CPU to float32 rounding", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  const StepResult cpu = seed_step(Device::cpu());
  test::poison_pool(Device::cuda());
  const StepResult gpu = seed_step(Device::cuda());
  CHECK(gpu.loss.device() == Device::cuda());
  // The loss sums 192000 terms in double on both sides.
  CHECK(relative_error(gpu.loss, cpu.loss) < 1e-6);
  // dW reduces 12000 products in fp32 in a different order than Eigen; the norm and
  // the clipped gradients follow it.
  CHECK(relative_error(gpu.norm, cpu.norm) < 1e-5);
  CHECK(relative_error(gpu.grad_weight, cpu.grad_weight) < 1e-5);
  CHECK(relative_error(gpu.grad_bias, cpu.grad_bias) < 1e-5);
  // One AdamW step moves each parameter by about lr * sign(gradient): the parameters
  // agree to about float32 rounding of their values.
  CHECK(relative_error(gpu.weight, cpu.weight) < 1e-6);
  CHECK(relative_error(gpu.bias, cpu.bias) < 1e-6);
  WARN("seed step, GPU vs CPU: loss " << gpu.loss.item() << " vs " << cpu.loss.item()
       << "; norm " << gpu.norm.item() << " vs " << cpu.norm.item() << "; worst ulp distance "
       << "of weight " << test::max_ulp_distance(gpu.weight, cpu.weight) << ", bias "
       << test::max_ulp_distance(gpu.bias, cpu.bias));
}

TEST_CASE("the seed training step on the GPU is bitwise reproducible", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  const StepResult first = seed_step(Device::cuda());
  test::poison_pool(Device::cuda());
  const StepResult second = seed_step(Device::cuda());
  CHECK(test::bitwise_equal(first.loss, second.loss));
  CHECK(test::bitwise_equal(first.norm, second.norm));
  CHECK(test::bitwise_equal(first.grad_weight, second.grad_weight));
  CHECK(test::bitwise_equal(first.grad_bias, second.grad_bias));
  CHECK(test::bitwise_equal(first.weight, second.weight));
  CHECK(test::bitwise_equal(first.bias, second.bias));
}
