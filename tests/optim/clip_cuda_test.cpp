// optim/cuda/clip.cu against the CPU path: the total norm, and clipping active and inactive.
// The norm is an exact reduction and the clipping the same float operations on both
// sides (optim/clip.h), so everything is bitwise the CPU's.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "autograd/variable.h"
#include "core/generator.h"
#include "optim/clip.h"
#include "optim/cuda/clip.h"
#include "tests/cuda_test_util.h"
#include "tests/test_util.h"

using namespace seqpar;
using autograd::Variable;

namespace {

// Parameters with random gradients, the same values on `device`.
std::vector<Variable> parameters_with_gradients(const std::vector<int64_t>& sizes, Device device) {
  Generator generator(31337);
  std::vector<Variable> parameters;
  for (int64_t size : sizes) {
    Variable parameter(generator.randn({size}, device), true);
    parameter.set_grad(generator.randn({size}, device));
    parameters.push_back(parameter);
  }
  return parameters;
}

// Worst ulp distance between the GPU and CPU gradients.
int64_t gradient_ulps(const std::vector<Variable>& gpu, const std::vector<Variable>& cpu) {
  int64_t worst = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    worst = std::max(worst, test::max_ulp_distance(gpu[i].grad(), cpu[i].grad()));
  }
  return worst;
}

}  // namespace

TEST_CASE("gradient norm and clipping on the GPU match the CPU", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  const Device gpu = Device::cuda();
  // the parameters; then more tensors and blocks than one launch table holds,
  // in a large model and in a small one (whose launches take chunks of 256 elements).
  std::vector<int64_t> many = {16 * 640, 16, 1, 0, 4097, 1500001, 0};
  for (int i = 0; i < 25; ++i) many.push_back(3 + 2 * i);
  std::vector<int64_t> small = {16 * 640, 0, 16, 1, 257};
  for (int i = 0; i < 30; ++i) small.push_back(3 + 7 * i);
  for (const std::vector<int64_t>& sizes : {std::vector<int64_t>{16 * 640, 16}, many, small}) {
    INFO(sizes.size() << " tensors");
    const std::vector<Variable> cpu = parameters_with_gradients(sizes, Device::cpu());
    const Tensor norm_expected = optim::grad_norm(cpu);
#ifdef SEQPAR_WITH_CUDA
    {  // the launcher, writing into a poisoned scalar
      const std::vector<Variable> device = parameters_with_gradients(sizes, gpu);
      std::vector<const float*> grads;
      for (const Variable& parameter : device) grads.push_back(parameter.grad().data());
      const Tensor norm = test::poisoned({}, gpu);
      optim::detail::grad_norm_cuda(grads, sizes, norm, 0);
      CHECK(test::bitwise_equal(norm, norm_expected));
    }
#endif
    for (const double fraction : {2.0, 0.25}) {  // clipping inactive, then active
      INFO("max_norm = " << fraction << " x the norm");
      const double max_norm = fraction * norm_expected.item();
      const std::vector<Variable> cpu_clipped = parameters_with_gradients(sizes, Device::cpu());
      const std::vector<Variable> gpu_clipped = parameters_with_gradients(sizes, gpu);
      const std::vector<Variable> untouched = parameters_with_gradients(sizes, Device::cpu());
      optim::clip_grad_norm(cpu_clipped, max_norm);
      test::poison_pool(gpu);
      const Tensor norm = optim::clip_grad_norm(gpu_clipped, max_norm);
      CHECK(norm.device() == gpu);
      CHECK(test::bitwise_equal(norm, norm_expected));
      CHECK(gradient_ulps(gpu_clipped, cpu_clipped) == 0);
      if (fraction > 1.0) CHECK(gradient_ulps(gpu_clipped, untouched) == 0);
    }
  }
}

TEST_CASE("gradient norm on the GPU of empty gradients is +0, as on the CPU", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  for (const std::vector<int64_t>& sizes : {std::vector<int64_t>{}, std::vector<int64_t>{0, 0}}) {
    INFO(sizes.size() << " tensors");
    const Tensor expected = optim::grad_norm(parameters_with_gradients(sizes, Device::cpu()));
    CHECK(expected.item() == 0.0);
#ifdef SEQPAR_WITH_CUDA
    const std::vector<Variable> device = parameters_with_gradients(sizes, Device::cuda());
    std::vector<const float*> grads;
    for (const Variable& parameter : device) grads.push_back(parameter.grad().data());
    const Tensor norm = test::poisoned({}, Device::cuda());  // the launcher must write it
    optim::detail::grad_norm_cuda(grads, sizes, norm, 0);
    CHECK(test::bitwise_equal(norm, expected));
#endif
  }
}

TEST_CASE("gradient norm on the GPU is bitwise reproducible", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  const std::vector<Variable> parameters =
      parameters_with_gradients({16 * 640, 16, 1500001}, Device::cuda());
  const Tensor first = optim::grad_norm(parameters);
  test::poison_pool(Device::cuda());
  CHECK(test::bitwise_equal(optim::grad_norm(parameters), first));
}

TEST_CASE("gradient norm on the GPU is bitwise the CPU's over a wide range (seed 12)", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  std::mt19937_64 rng(12);
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> exponent(-40, 40);  // squares stay in the exact domain
  for (int trial = 0; trial < 4; ++trial) {
    std::vector<Variable> cpu, gpu;
    for (int64_t size : {int64_t{1000003}, int64_t{1}, int64_t{0}, int64_t{20000 + trial}}) {
      std::vector<float> values(static_cast<size_t>(size));
      for (float& value : values) value = std::ldexp(normal(rng), exponent(rng));
      if (trial == 3 && size == 1) values[0] = std::numeric_limits<float>::infinity();
      const Tensor gradient = Tensor::from_data({size}, values);
      cpu.emplace_back(Tensor::zeros({size}), true);
      cpu.back().set_grad(gradient);
      gpu.emplace_back(Tensor::zeros({size}, Device::cuda()), true);
      gpu.back().set_grad(gradient.to(Device::cuda()));
    }
    CAPTURE(trial);
    test::poison_pool(Device::cuda());
    const Tensor norm = optim::grad_norm(gpu);
    CHECK(test::bitwise_equal(norm.to(Device::cpu()), optim::grad_norm(cpu)));
  }
}
