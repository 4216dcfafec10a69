// optim/adamw.cu against the CPU path: several steps, many tensors, one launch each.
#include <catch2/catch.hpp>

#include <algorithm>
#include <vector>

#include "autograd/variable.h"
#include "core/generator.h"
#include "optim/adamw.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/test_util.h"

using namespace seqpar;
using autograd::Variable;

namespace {

struct Distances {
  int64_t params = 0, exp_avgs = 0, exp_avg_sqs = 0;                  // worst ulp distances
};

// Runs `steps` AdamW steps with the same fresh gradients on CPU and GPU copies of
// parameters of the given sizes; returns the worst distances seen after any step.
Distances run_on_both(const std::vector<int64_t>& sizes, const optim::AdamWOptions& options,
                         int steps) {
  const Device gpu = Device::cuda();
  Generator generator(2718);
  std::vector<Variable> cpu_params, gpu_params;
  for (int64_t size : sizes) {
    const Tensor values = generator.randn({size});
    cpu_params.emplace_back(values.clone(), true);
    gpu_params.emplace_back(values.to(gpu), true);
  }
  optim::AdamW cpu(cpu_params, options), device(gpu_params, options);
  Distances worst;
  for (int step = 0; step < steps; ++step) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      const Tensor grad = generator.randn({sizes[i]});
      cpu_params[i].set_grad(grad);
      gpu_params[i].set_grad(grad.to(gpu));
    }
    cpu.step();
    device.step();
    for (size_t i = 0; i < sizes.size(); ++i) {
      worst.params = std::max(worst.params,
                              test::max_ulp_distance(gpu_params[i].data(), cpu_params[i].data()));
      worst.exp_avgs = std::max(worst.exp_avgs,
                                test::max_ulp_distance(device.exp_avg(i), cpu.exp_avg(i)));
      worst.exp_avg_sqs = std::max(
          worst.exp_avg_sqs, test::max_ulp_distance(device.exp_avg_sq(i), cpu.exp_avg_sq(i)));
    }
  }
  return worst;
}

// The seed's two parameters, a tensor of 367 chunks (more blocks than one launch table
// holds) and 25 small odd ones (more tensors than one table holds).
std::vector<int64_t> many_sizes() {
  std::vector<int64_t> sizes = {16 * 640, 16, 1, 4097, 1500001};
  for (int i = 0; i < 25; ++i) sizes.push_back(3 + 2 * i);
  return sizes;
}

}  // namespace

TEST_CASE("AdamW on the GPU matches the CPU bitwise", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  // Both paths take the same float scalars (detail::adamw_step_scalars, rounded once
  // from doubles as PyTorch does) and the same float operations in the same order, so
  // the results are bitwise equal: with the seed's hyperparameters and with others.
  optim::AdamWOptions seed_options;
  seed_options.lr = 1e-4;
  seed_options.weight_decay = 0.01;
  optim::AdamWOptions other_options;
  other_options.lr = 3e-3;
  other_options.beta1 = 0.8;
  other_options.beta2 = 0.95;
  other_options.eps = 1e-6;
  other_options.weight_decay = 0.1;
  for (const optim::AdamWOptions& options : {seed_options, other_options}) {
    const Distances worst = run_on_both(many_sizes(), options, 5);
    CHECK(worst.params == 0);
    CHECK(worst.exp_avgs == 0);
    CHECK(worst.exp_avg_sqs == 0);
  }
}

TEST_CASE("AdamW on the GPU is bitwise reproducible", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  const Device gpu = Device::cuda();
  auto run = [&] {
    Generator generator(11);
    Variable weight(generator.randn({16, 640}, gpu), true), bias(generator.randn({16}, gpu), true);
    optim::AdamW optimizer({weight, bias}, optim::AdamWOptions{});
    for (int step = 0; step < 3; ++step) {
      weight.set_grad(generator.randn({16, 640}, gpu));
      bias.set_grad(generator.randn({16}, gpu));
      optimizer.step();
    }
    return std::make_pair(weight.data(), bias.data());
  };
  const auto first = run();
  test::poison_pool(gpu);
  const auto second = run();
  CHECK(test::bitwise_equal(first.first, second.first));
  CHECK(test::bitwise_equal(first.second, second.second));
}
