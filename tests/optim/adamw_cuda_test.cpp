// optim/cuda/adamw.cu against the CPU path: several steps, many tensors, through both launch
// shapes (multi-tensor tables for small tensors, a grid-stride launch per large one).
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <vector>

#include "autograd/variable.h"
#include "core/generator.h"
#include "optim/adamw.h"
#include "optim/cuda/adamw.h"
#include "tests/cuda_test_util.h"
#include "tests/test_util.h"

using namespace seqpar;
using autograd::Variable;

namespace {

struct Distances {
  int64_t params = 0, exp_avgs = 0, exp_avg_sqs = 0;                  // worst ulp distances
  bool guards_intact = true;  // nothing outside the tensors changed
};

// The size from which optim/cuda/adamw.cu gives a tensor a launch of its own; the tests put
// tensors on both sides of it.
constexpr int64_t kLarge = int64_t{1} << 20;
#ifdef SEQPAR_WITH_CUDA
static_assert(kLarge == optim::detail::kAdamWLargeTensorElements);
#endif

// A tensor of `size` elements `offset` elements into a buffer on `device`, between guard
// elements that no kernel may touch. An offset that is not a multiple of 4 puts the
// tensor off the 16-byte boundaries that float4 accesses need.
constexpr float kGuard = 1234.5f;
struct Guarded {
  Tensor buffer, view;
  int64_t offset, size;
  Guarded(int64_t size, int64_t offset, Device device)
      : buffer(Tensor::full({offset + size + 1}, kGuard, device)),
        view(buffer.narrow(0, offset, size)),
        offset(offset),
        size(size) {}
  bool guards_intact() const {
    const std::vector<float> all = buffer.to_vector();
    for (int64_t i = 0; i < static_cast<int64_t>(all.size()); ++i) {
      if ((i < offset || i >= offset + size) && !(all[i] == kGuard)) return false;
    }
    return true;
  }
};

// Runs `steps` AdamW steps with the same fresh gradients on CPU and GPU copies of
// parameters of the given sizes; returns the worst distances seen after any step. A
// GPU parameter with a nonzero entry in `offsets` is a view that many elements into a
// guarded buffer; the others are allocations of their own.
Distances run_on_both(const std::vector<int64_t>& sizes, const optim::AdamWOptions& options,
                         int steps, const std::vector<int64_t>& offsets = {}) {
  const Device gpu = Device::cuda();
  Generator generator(2718);
  std::vector<Variable> cpu_params, gpu_params;
  std::vector<Guarded> views;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const Tensor values = generator.randn({sizes[i]});
    cpu_params.emplace_back(values.clone(), true);
    if (i < offsets.size() && offsets[i] != 0) {
      views.emplace_back(sizes[i], offsets[i], gpu);
      views.back().view.copy_(values);
      gpu_params.emplace_back(views.back().view, true);
    } else {
      gpu_params.emplace_back(values.to(gpu), true);
    }
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
  for (const Guarded& view : views) worst.guards_intact = worst.guards_intact && view.guards_intact();
  return worst;
}

optim::AdamWOptions seed_options() {
  return optim::AdamWOptions().lr(1e-4).weight_decay(0.01);
}

optim::AdamWOptions other_options() {
  return optim::AdamWOptions().lr(3e-3).betas({0.8, 0.95}).eps(1e-6).weight_decay(0.1);
}

// The two parameters, a large tensor (a launch of its own), two small ones of
// 256 and 74 chunks (with the rest, more blocks than one launch table holds) and 25
// small odd ones (more tensors than one table holds).
std::vector<int64_t> many_sizes() {
  std::vector<int64_t> sizes = {16 * 640, 16, 1, 4097, 1500001, kLarge - 1, 300001};
  for (int i = 0; i < 25; ++i) sizes.push_back(3 + 2 * i);
  return sizes;
}

// A small model (under 20,000 elements: the launches take chunks of 256, one element a
// thread) in more tensors than one launch table holds.
std::vector<int64_t> small_sizes() {
  std::vector<int64_t> sizes = {16 * 640, 16, 1, 257};
  for (int i = 0; i < 30; ++i) sizes.push_back(3 + 7 * i);
  return sizes;
}

}  // namespace

TEST_CASE("AdamW on the GPU matches the CPU bitwise", "[cuda][adamw]") {
  SEQPAR_REQUIRE_CUDA();
  // Both paths take the same float scalars (detail::adamw_step_scalars, rounded once
  // from doubles as PyTorch does) and the same float operations in the same order, so
  // the results are bitwise equal: with the hyperparameters and with others.
  for (const std::vector<int64_t>& sizes : {many_sizes(), small_sizes()}) {
    for (const optim::AdamWOptions& options : {seed_options(), other_options()}) {
      INFO(sizes.size() << " tensors");
      const Distances worst = run_on_both(sizes, options, 5);
      CHECK(worst.params == 0);
      CHECK(worst.exp_avgs == 0);
      CHECK(worst.exp_avg_sqs == 0);
    }
  }
}

TEST_CASE("AdamW on the GPU is bitwise reproducible", "[cuda][adamw]") {
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

TEST_CASE("AdamW on the GPU matches the CPU bitwise on large tensors and a misaligned view",
          "[cuda][adamw]") {
  SEQPAR_REQUIRE_CUDA();
  // Large tensors take the grid-stride kernel: float4s with a one-element tail
  // (3,000,001), float4s only (2,097,152), the threshold itself; the parameter 1 float
  // into its buffer is misaligned against its gradient and state, so it goes one
  // element at a time. The small one and the one just under the threshold share a
  // multi-tensor launch.
  const std::vector<int64_t> sizes = {3'000'001, 2'097'152, 1000, 1'500'001, kLarge - 1, kLarge};
  const std::vector<int64_t> offsets = {0, 0, 0, 1, 0, 0};
  for (const optim::AdamWOptions& options : {seed_options(), other_options()}) {
    const Distances worst = run_on_both(sizes, options, 3, offsets);
    CHECK(worst.params == 0);
    CHECK(worst.exp_avgs == 0);
    CHECK(worst.exp_avg_sqs == 0);
    CHECK(worst.guards_intact);
  }
}

#ifdef SEQPAR_WITH_CUDA
TEST_CASE("AdamW's large-tensor launches match the CPU bitwise at every alignment",
          "[cuda][adamw]") {
  SEQPAR_REQUIRE_CUDA();
  // Through the launcher, so that all four tensors of a parameter (param, grad,
  // exp_avg, exp_avg_sq) can sit at chosen offsets: the same offset in all four (1, 2,
  // 3: a scalar head of 3, 2, 1 elements before the float4s), offsets that are all
  // multiples of 4 (float4s from the first element), offsets that disagree (one
  // element at a time), and small tensors for the multi-tensor path.
  struct Layout {
    int64_t size;
    std::array<int64_t, 4> offsets;  // param, grad, exp_avg, exp_avg_sq
  };
  const std::vector<Layout> layouts = {
      {3'000'001, {1, 1, 1, 1}},     // head 3, tail 2
      {2'097'152, {2, 2, 2, 2}},     // head 2, tail 2
      {kLarge + 1, {3, 3, 3, 3}},    // head 1, no tail
      {kLarge + 3, {0, 4, 8, 12}},   // no head, tail 3
      {1'500'001, {0, 1, 0, 0}},     // misaligned differently: all one by one
      {1000, {1, 1, 1, 1}},          // multi-tensor
      {kLarge - 1, {0, 0, 0, 0}},    // multi-tensor, just under the threshold
      {300'001, {2, 3, 0, 1}},       // multi-tensor, in a second table (257 + 74 chunks > 320)
  };
  const Device gpu = Device::cuda();
  const optim::AdamWOptions options = other_options();
  Generator generator(31415);
  std::vector<Variable> cpu_params;
  std::vector<std::array<Guarded, 4>> device;  // param, grad, exp_avg, exp_avg_sq
  optim::detail::AdamWTensors tensors;
  for (const Layout& layout : layouts) {
    const int64_t n = layout.size;
    const std::array<int64_t, 4>& o = layout.offsets;
    device.push_back({Guarded(n, o[0], gpu), Guarded(n, o[1], gpu), Guarded(n, o[2], gpu),
                      Guarded(n, o[3], gpu)});
    const Tensor values = generator.randn({n});
    cpu_params.emplace_back(values.clone(), true);
    device.back()[0].view.copy_(values);
    device.back()[2].view.fill_(0.0f);  // the state starts at zeros, as AdamW's does
    device.back()[3].view.fill_(0.0f);
    tensors.params.push_back(device.back()[0].view.data());
    tensors.grads.push_back(device.back()[1].view.data());
    tensors.exp_avgs.push_back(device.back()[2].view.data());
    tensors.exp_avg_sqs.push_back(device.back()[3].view.data());
    tensors.sizes.push_back(n);
  }
  optim::AdamW cpu(cpu_params, options);
  for (int64_t step = 1; step <= 3; ++step) {
    INFO("step " << step);
    for (size_t i = 0; i < layouts.size(); ++i) {
      const Tensor grad = generator.randn({layouts[i].size});
      cpu_params[i].set_grad(grad);
      device[i][1].view.copy_(grad);
    }
    cpu.step();
    optim::detail::adamw_step_cuda(tensors, optim::detail::adamw_step_scalars(options, step),
                                   gpu.index);
    for (size_t i = 0; i < layouts.size(); ++i) {
      INFO("tensor of " << layouts[i].size << " elements at offsets " << layouts[i].offsets[0]
                        << ", " << layouts[i].offsets[1] << ", " << layouts[i].offsets[2] << ", "
                        << layouts[i].offsets[3]);
      CHECK(test::max_ulp_distance(device[i][0].view, cpu_params[i].data()) == 0);
      CHECK(test::max_ulp_distance(device[i][2].view, cpu.exp_avg(i)) == 0);
      CHECK(test::max_ulp_distance(device[i][3].view, cpu.exp_avg_sq(i)) == 0);
    }
  }
  for (size_t i = 0; i < layouts.size(); ++i) {
    INFO("tensor of " << layouts[i].size << " elements");
    for (const Guarded& guarded : device[i]) CHECK(guarded.guards_intact());
  }
}
#endif
