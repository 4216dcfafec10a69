// optim/clip.cu against the CPU path: the total norm, and clipping active and inactive.
#include <catch2/catch.hpp>

#include <vector>

#include "autograd/variable.h"
#include "core/generator.h"
#include "optim/clip.h"
#include "tests/cuda/cuda_test_util.h"
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
  // The seed's parameters; then more tensors and blocks than one launch table holds.
  std::vector<int64_t> many = {16 * 640, 16, 1, 4097, 1500001};
  for (int i = 0; i < 25; ++i) many.push_back(3 + 2 * i);
  for (const std::vector<int64_t>& sizes : {std::vector<int64_t>{16 * 640, 16}, many}) {
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
      // Both sum squares in double and round each norm once: equal up to the order of
      // double additions.
      CHECK(test::max_ulp_distance(norm, norm_expected) <= 1);
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
      CHECK(test::max_ulp_distance(norm, norm_expected) <= 1);
      CHECK(gradient_ulps(gpu_clipped, cpu_clipped) <= 1);
      if (fraction > 1.0) CHECK(gradient_ulps(gpu_clipped, untouched) == 0);
    }
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
