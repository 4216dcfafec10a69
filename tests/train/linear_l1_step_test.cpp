// train::LinearL1Step (the fused, graph-capturable step) against the public API to
// float32 rounding, on the CPU and on the GPU (the step keeps its own float summation
// order, train/kernels/, until it adopts the exact numerics of nn's Linear, so the two
// agree to rounding, not bit for bit), graph replay bit for bit equal to eager runs, across AdamW's scalar-table refresh, at odd shapes, and
// split over 4 ranks of a threads group with the "exact" loss and a sum all-reduce.
// Which gradient synchronizations capture() accepts; a stream-ordered one captured
// into the graph. (The same over NCCL on 2 GPUs: seqpar-bench --nproc 2.)
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <vector>

#include "autograd/variable.h"
#include "core/elementwise.h"
#include "core/generator.h"
#include "dist/local_process_group.h"
#include "nn/l1_loss.h"
#include "nn/linear.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "tests/cuda_test_util.h"
#include "tests/test_util.h"
#include "tests/train/step_test_util.h"
#include "train/linear_l1_step.h"

using namespace seqpar;
using test::issue_adamw;
using test::model_on;
using test::place;
using autograd::Variable;
using test::relative_error;

namespace {

struct Problem {
  int64_t rows, in, out;
  double max_norm;
  bool strided;  // x as a misaligned window of a wider buffer
};

using Outcome = test::StepOutcome;

// The model, then x, from one generator (as the report's script draws them); target =
// x[:, :out] when in >= out, else a draw of its own.
using Data = test::StepData;
Data draw(const Problem& p) {
  Data data = test::draw_model_and_x(p.rows + 17 * p.in + p.out, p.rows, p.in, p.out);
  Generator generator(p.rows + 7);
  data.target = p.in >= p.out ? data.x.narrow(1, 0, p.out) : generator.randn({p.rows, p.out});
  return data;
}

// The public API: forward, L1 mean, backward, clip, AdamW.
Outcome public_api_steps(const Problem& p, const Data& data, Device device, int steps) {
  nn::Linear model = model_on(data, device);
  const Tensor x = place(data.x, device, p.strided);
  const Variable input(x), target(p.in >= p.out ? x.narrow(1, 0, p.out) : data.target.to(device));
  optim::AdamW optimizer(model.parameters(), issue_adamw());
  Outcome outcome;
  for (int step = 0; step < steps; ++step) {
    model.zero_grad();
    const Variable loss = nn::l1_loss(model.forward(input), target);
    loss.backward();
    outcome.norm = optim::clip_grad_norm(model.parameters(), p.max_norm);
    outcome.loss = loss.data();
    optimizer.step();
  }
  outcome.grad_weight = model.weight().grad().clone();
  outcome.grad_bias = model.bias().grad().clone();
  outcome.weight = model.weight().data().clone();
  outcome.bias = model.bias().data().clone();
  return outcome;
}

// The fused step, eager or captured, alternating over `batches` copies of the batch.
Outcome fused_steps(const Problem& p, const Data& data, int steps, bool graph, int batches = 1) {
  const Device gpu = Device::cuda();
  nn::Linear model = model_on(data, gpu);
  std::vector<train::Batch> list;
  for (int b = 0; b < batches; ++b) {
    const Tensor x = place(data.x, gpu, p.strided);
    list.push_back({x, p.in >= p.out ? x.narrow(1, 0, p.out) : data.target.to(gpu)});
  }
  train::LinearL1Step step(model, list, nn::Reduction::mean(), issue_adamw(), p.max_norm);
  return test::run_steps(step, model, steps, graph, batches);
}

// Parameters after `steps` AdamW steps of learning rate `lr` from gradients that differ
// by float rounding (the fused step's summation order against nn's): each element
// within a few ulp or 1e-4 of the steps' total reach, steps * lr (the rounding
// differences accumulate step by step); where the gradient is near zero (its rounding
// can flip the sign of AdamW's step there), within steps * lr.
void check_parameters_close(const Tensor& actual, const Tensor& expected, const Tensor& grad,
                            double lr, int steps) {
  const std::vector<float> a = actual.to_vector(), e = expected.to_vector(), g = grad.to_vector();
  REQUIRE(a.size() == e.size());
  REQUIRE(g.size() == e.size());
  double largest_grad = 0.0;
  for (float value : g) largest_grad = std::max(largest_grad, std::fabs(double(value)));
  int64_t near_zero = 0, outside = 0;
  for (size_t i = 0; i < e.size(); ++i) {
    const double difference = std::fabs(double(a[i]) - double(e[i]));
    const double few_ulp = 8 * std::ldexp(std::fabs(double(e[i])), -23);
    if (difference <= std::max(few_ulp, 1e-4 * steps * lr)) continue;
    if (std::fabs(double(g[i])) <= 1e-3 * largest_grad && difference <= steps * lr) {
      ++near_zero;
    } else {
      ++outside;
    }
  }
  INFO(near_zero << " of " << e.size() << " elements near a zero gradient off by more");
  CHECK(outside == 0);
}

void check_bitwise(const Outcome& a, const Outcome& b) {
  CHECK(test::bitwise_equal(a.loss, b.loss));
  CHECK(test::bitwise_equal(a.norm, b.norm));
  CHECK(test::bitwise_equal(a.grad_weight, b.grad_weight));
  CHECK(test::bitwise_equal(a.grad_bias, b.grad_bias));
  CHECK(test::bitwise_equal(a.weight, b.weight));
  CHECK(test::bitwise_equal(a.bias, b.bias));
}

}  // namespace

TEST_CASE("the fused issue step matches the CPU public API to float32 rounding", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  for (const Problem& p : {Problem{12000, 640, 16, 1.0, false}, Problem{1001, 37, 5, 0.05, true},
                           Problem{333, 64, 40, 0.5, false},
                           Problem{500, 1100, 16, 0.5, false}}) {  // in > 1024: two passes
    INFO("rows " << p.rows << ", in " << p.in << ", out " << p.out << ", max_norm " << p.max_norm);
    const Data data = draw(p);
    const Outcome cpu = public_api_steps(p, data, Device::cpu(), 1);
    test::poison_pool(Device::cuda());
    const Outcome fused = fused_steps(p, data, 1, /*graph=*/false);
    CHECK(relative_error(fused.loss, cpu.loss) < 1e-6);
    CHECK(relative_error(fused.norm, cpu.norm) < 1e-5);
    // The fused step keeps the gradients before clipping; the public API clips them.
    const float coefficient = std::min(1.0f, static_cast<float>(p.max_norm) / (cpu.norm.item() + 1e-6f));
    CHECK(relative_error(mul(fused.grad_weight, coefficient), cpu.grad_weight) < 1e-5);
    CHECK(relative_error(mul(fused.grad_bias, coefficient), cpu.grad_bias) < 1e-5);
    CHECK(relative_error(fused.weight, cpu.weight) < 1e-6);
    CHECK(relative_error(fused.bias, cpu.bias) < 1e-6);
  }
}

TEST_CASE("the fused step matches the GPU public API over steps while the clip is inactive",
          "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  // The step sums in its own order (train/kernels/), nn's Linear in the exact numerics:
  // gradients agree to float32 rounding, parameters to a few ulp (see
  // check_parameters_close).
  const Problem p{12000, 640, 16, 1.0e6, false};
  const Data data = draw(p);
  const Outcome api = public_api_steps(p, data, Device::cuda(), 5);
  const Outcome fused = fused_steps(p, data, 5, /*graph=*/false);
  CHECK(relative_error(fused.loss, api.loss) < 1e-6);
  CHECK(relative_error(fused.norm, api.norm) < 1e-5);
  CHECK(relative_error(fused.grad_weight, api.grad_weight) < 1e-5);
  CHECK(relative_error(fused.grad_bias, api.grad_bias) < 1e-5);
  const double lr = issue_adamw().lr;
  check_parameters_close(fused.weight, api.weight, api.grad_weight, lr, 5);
  check_parameters_close(fused.bias, api.bias, api.grad_bias, lr, 5);
}

TEST_CASE("graph replay of the fused step equals eager runs bit for bit", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  for (const Problem& p : {Problem{12000, 640, 16, 0.05, false}, Problem{1001, 37, 5, 0.05, true},
                           Problem{300, 1100, 20, 0.05, true}}) {
    INFO("rows " << p.rows << ", in " << p.in << ", out " << p.out);
    const Data data = draw(p);
    const Outcome eager = fused_steps(p, data, 6, false, 2);
    test::poison_pool(Device::cuda());
    const Outcome replayed = fused_steps(p, data, 6, true, 2);
    check_bitwise(eager, replayed);
    check_bitwise(eager, fused_steps(p, data, 6, false, 2));  // and run to run
  }
}

TEST_CASE("replayed steps keep AdamW's bias corrections past the scalar table", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  // Small, so that more steps than one table holds take little time; clip inactive, so
  // the public API (its own bias corrections, on the host) must agree at every step
  // count: to float32 rounding, as the step sums in its own order (train/kernels/).
  // A wrong correction past the table would move every element by about lr.
  const Problem p{64, 8, 4, 1.0e6, false};
  const Data data = draw(p);
  const int steps = static_cast<int>(train::LinearL1Step::kTableSteps) + 3;
  const Outcome api = public_api_steps(p, data, Device::cuda(), steps);
  const Outcome replayed = fused_steps(p, data, steps, true);
  const double lr = issue_adamw().lr;
  check_parameters_close(replayed.weight, api.weight, api.grad_weight, lr, steps);
  check_parameters_close(replayed.bias, api.bias, api.grad_bias, lr, steps);
}

TEST_CASE("the fused step over 4 ranks of a threads group equals one rank", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  // The "exact" policy: rank r holds rows tensor_split(4)[r], its loss is its sum over
  // (all rows x out), and the gradients are summed over the ranks before the clip.
  const Problem p{12000, 640, 16, 0.1, false};
  const Data data = draw(p);
  const Outcome one_rank = fused_steps(p, data, 2, false);
  const Device gpu = Device::cuda();
  const Tensor x = data.x.to(gpu);
  std::mutex mutex;
  std::vector<Tensor> weights(4);
  dist::run_local_world(4, [&](std::shared_ptr<dist::ProcessGroup> world) {
    const int rank = world->rank();
    nn::Linear model = model_on(data, gpu);
    const Tensor shard = x.tensor_split(4)[static_cast<size_t>(rank)];
    train::LinearL1Step step(model, {{shard, shard.narrow(1, 0, p.out)}},
                             nn::Reduction::sum_divided_by(p.rows * p.out), issue_adamw(),
                             p.max_norm,
                             train::GradientSync::on_host([&](Tensor& gradients) {
                               world->all_reduce(gradients, dist::ReduceOp::Sum);
                             }));
    step.run();
    step.run();
    const Tensor weight = model.weight().data().clone();
    std::lock_guard<std::mutex> lock(mutex);
    weights[static_cast<size_t>(rank)] = weight;
  });
  for (int rank = 1; rank < 4; ++rank) CHECK(test::bitwise_equal(weights[rank], weights[0]));
  CHECK(relative_error(weights[0], one_rank.weight) < 1e-5);
}

TEST_CASE("a step can be captured unless its gradient synchronization meets on the host", "[train]") {
  const train::GradientSync::Hook hook = [](Tensor&) {};
  CHECK(train::GradientSync{}.capturable());                          // one rank, no hook
  CHECK_FALSE(train::GradientSync::on_host(hook).capturable());       // a threads group
  CHECK(train::GradientSync::stream_ordered(hook).capturable());      // all_reduce_enqueue
  CHECK(train::GradientSync::on_host(nullptr).capturable());          // no hook after all
  CHECK(train::GradientSync::stream_ordered(hook).only_enqueues);
}

TEST_CASE("a stream-ordered gradient synchronization is captured into the step's graph", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  // Two ranks holding the same rows, summing their gradients, stand in for the
  // all-reduce: each rank's loss is its sum over 2 x (rows x out), and the hook
  // doubles the gradients on the stream (exact: a power of two), which is the sum
  // of the two identical partial gradients. That equals the one-rank mean-loss step
  // bit for bit: same gradients, norm and parameters; the loss is half.
  const Problem p{1001, 64, 16, 0.05, false};
  const Data data = draw(p);
  const Outcome one_rank = fused_steps(p, data, 4, /*graph=*/false);
  auto doubled_steps = [&](bool graph) {
    const Device gpu = Device::cuda();
    nn::Linear model = model_on(data, gpu);
    const Tensor x = data.x.to(gpu);
    int calls = 0;
    train::LinearL1Step step(model, {{x, x.narrow(1, 0, p.out)}},
                             nn::Reduction::sum_divided_by(2 * p.rows * p.out), issue_adamw(),
                             p.max_norm,
                             train::GradientSync::stream_ordered([&](Tensor& gradients) {
                               ++calls;
                               mul_(gradients, 2.0f);
                             }));
    step.run();  // as with NCCL: one eager step before the capture
    if (graph) {
      step.capture();
      CHECK(step.captured());
    }
    for (int s = 1; s < 4; ++s) {
      if (graph) step.replay();
      else step.run();
    }
    CHECK(calls == (graph ? 2 : 4));  // replays run the captured hook, not the host's
    return Outcome{step.loss().clone(), step.total_norm().clone(), step.grad_weight().clone(),
                   step.grad_bias().clone(), model.weight().data().clone(),
                   model.bias().data().clone()};
  };
  {  // the same hook declared as meeting on the host: refused, nothing captured
    const Device gpu = Device::cuda();
    nn::Linear model = model_on(data, gpu);
    const Tensor x = data.x.to(gpu);
    train::LinearL1Step step(model, {{x, x.narrow(1, 0, p.out)}}, nn::Reduction::mean(),
                             issue_adamw(), p.max_norm,
                             train::GradientSync::on_host([](Tensor&) {}));
    CHECK_THROWS_WITH(step.capture(), Catch::Contains("cannot be captured; use run()"));
    CHECK_FALSE(step.captured());
    step.run();
  }
  const Outcome eager = doubled_steps(false);
  test::poison_pool(Device::cuda());
  const Outcome replayed = doubled_steps(true);
  check_bitwise(eager, replayed);
  CHECK(test::bitwise_equal(eager.norm, one_rank.norm));
  CHECK(test::bitwise_equal(eager.grad_weight, one_rank.grad_weight));
  CHECK(test::bitwise_equal(eager.grad_bias, one_rank.grad_bias));
  CHECK(test::bitwise_equal(eager.weight, one_rank.weight));
  CHECK(test::bitwise_equal(eager.bias, one_rank.bias));
  CHECK(eager.loss.item() == 0.5f * one_rank.loss.item());
}
