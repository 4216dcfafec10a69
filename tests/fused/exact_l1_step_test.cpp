// fused::ExactL1Step (the fused step on the exact numerics) against the public API bit
// for bit: loss, norm, gradients and parameters over several steps, on the GPU and on
// the CPU, at the issue's shape and at odd ones (strided x, out above the narrow
// forward's 16, in above its 768, a NaN target, residuals of exactly zero); graph
// replay equal to eager runs, past AdamW's scalar table; and 4 ranks of a threads
// group, each on its rows with its digits added, equal to one rank on all rows.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

#include "autograd/variable.h"
#include "core/elementwise.h"
#include "core/error.h"
#include "core/generator.h"
#include "dist/local_process_group.h"
#include "nn/l1_loss.h"
#include "nn/linear.h"
#include "nn/cuda/linear.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "tests/cuda_test_util.h"
#include "tests/test_util.h"
#include "tests/fused/step_test_util.h"
#include "bench/fused/exact_l1_step.h"
#ifdef SEQPAR_WITH_CUDA
#include "bench/fused/kernels/exact_step.h"
#endif

using namespace seqpar;
using test::issue_adamw;
using test::model_on;
using test::place;
using test::same_bits;
using autograd::Variable;

namespace {

struct Problem {
  int64_t rows, in, out;
  double max_norm;
  bool strided = false;     // x as a misaligned window of a wider buffer
  bool nan_target = false;  // one target element NaN: dy holds a NaN (the general dW path)
  bool zero_model = false;  // W = b = 0 and some targets 0: residuals of exactly zero
  bool far_targets = false;  // some targets near ±1000: loss terms past the L1 sum's fixed point
};

using Outcome = test::StepOutcome;

using Data = test::StepData;
Data draw(const Problem& p) {
  Data data = test::draw_model_and_x(p.rows + 31 * p.in + p.out, p.rows, p.in, p.out);
  Generator generator(p.rows + 7);
  data.target = generator.randn({p.rows, p.out});
  float* target = data.target.data();
  if (p.nan_target) target[(p.rows / 2) * p.out + p.out - 1] = std::numeric_limits<float>::quiet_NaN();
  if (p.zero_model) {
    data.weight.fill_(0.0f);
    data.bias.fill_(0.0f);
    for (int64_t i = 0; i < p.rows * p.out; i += 3) target[i] = 0.0f;
  }
  if (p.far_targets) {  // in some blocks' rows only
    for (int64_t i = 0; i < p.rows * p.out; i += 997) target[i] = i % 2 ? 1000.0f : -1000.0f;
  }
  return data;
}


// The public API: forward, L1 mean, backward, clip, AdamW. Its gradients are clipped in
// place; the step keeps them unclipped, so the unclipped ones are kept here too.
Outcome public_api_steps(const Problem& p, const Data& data, Device device, int steps) {
  nn::Linear model = model_on(data, device);
  const Variable input(place(data.x, device, p.strided)), target(data.target.to(device));
  optim::AdamW optimizer(model.parameters(), issue_adamw());
  Outcome outcome;
  for (int step = 0; step < steps; ++step) {
    model.zero_grad();
    const Variable loss = nn::l1_loss(model.forward(input), target);
    loss.backward();
    outcome.grad_weight = model.weight().grad().clone();
    outcome.grad_bias = model.bias().grad().clone();
    outcome.norm = optim::clip_grad_norm(model.parameters(), p.max_norm);
    outcome.loss = loss.data();
    optimizer.step();
  }
  outcome.weight = model.weight().data().clone();
  outcome.bias = model.bias().data().clone();
  return outcome;
}

Outcome outcome_of(const fused::ExactL1Step& step, const nn::Linear& model) {
  return {step.loss().clone(),        step.total_norm().clone(),  step.grad_weight().clone(),
          step.grad_bias().clone(),   model.weight().data().clone(), model.bias().data().clone()};
}

// The fused step, eager or captured, alternating over `batches` copies of the batch.
Outcome exact_steps(const Problem& p, const Data& data, int steps, bool graph, int batches = 1) {
  const Device gpu = Device::cuda();
  nn::Linear model = model_on(data, gpu);
  std::vector<fused::Batch> list;
  for (int b = 0; b < batches; ++b) {
    list.push_back({place(data.x, gpu, p.strided), data.target.to(gpu)});
  }
  fused::ExactL1Step step(model, list, nn::Reduction::mean(), issue_adamw(), p.max_norm);
  return test::run_steps(step, model, steps, graph, batches);
}

// Bit for bit, NaNs included: the same bits, or both NaN (a NaN's payload is not part of
// the numerics' contract).
void check_bitwise(const Outcome& a, const Outcome& b) {
  CHECK(same_bits(a.loss, b.loss));
  CHECK(same_bits(a.norm, b.norm));
  CHECK(same_bits(a.grad_weight, b.grad_weight));
  CHECK(same_bits(a.grad_bias, b.grad_bias));
  CHECK(same_bits(a.weight, b.weight));
  CHECK(same_bits(a.bias, b.bias));
}

}  // namespace

TEST_CASE("the exact fused step gives the public API's bits on the GPU and the CPU", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  const std::vector<Problem> problems = {
      {12000, 640, 16, 0.05},                  // the issue's shape, clipping active
      {1001, 37, 5, 0.05, /*strided=*/true},   // odd sizes, misaligned x
      {333, 64, 40, 0.5},                      // out > 16: the GEMM forward
      {500, 1100, 16, 0.5},                    // in > 768: the GEMM forward
      {700, 48, 8, 1.0e6, false, /*nan_target=*/true},
      {640, 96, 16, 0.05, false, false, /*zero_model=*/true},
      {3000, 64, 16, 0.05, false, false, false, /*far_targets=*/true},
      {48, 20000, 16, 0.05},                   // 320,016 parameters: two or more a thread at the end
  };
#ifdef SEQPAR_WITH_CUDA
  // The last problem's finishing grid would not all be resident with one parameter a
  // thread (on an H200: 1251 blocks of 256), so its threads take several each.
  CHECK(fused::kernels::exact_finish_grid(16 * 20000 + 16, 16 * 20000, 0).per_thread >= 2);
#endif
  for (const Problem& p : problems) {
    INFO("rows " << p.rows << ", in " << p.in << ", out " << p.out << ", max_norm " << p.max_norm
                 << (p.nan_target ? ", a NaN target" : "") << (p.zero_model ? ", zero model" : "")
                 << (p.far_targets ? ", targets near 1000" : ""));
    const Data data = draw(p);
    test::poison_pool(Device::cuda());
    const Outcome fused = exact_steps(p, data, 3, /*graph=*/false);
    check_bitwise(fused, public_api_steps(p, data, Device::cuda(), 3));
    check_bitwise(fused, public_api_steps(p, data, Device::cpu(), 3));
    if (p.nan_target) {
      CHECK(std::isnan(fused.loss.item()));
      CHECK(std::isnan(fused.grad_bias.to_vector()[static_cast<size_t>(p.out - 1)]));
    }
  }
}

TEST_CASE("the exact step's kernels at small shapes equal the public API's (for the sanitizers)",
          "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  // Small enough for compute-sanitizer (scripts/exact-checks.sh): the L1 kernel's
  // shared-memory tallies, the finishing kernel's block digits, grid-wide wait and last block, NaN and
  // zero residuals, eager and replayed.
  for (const Problem& p : {Problem{1001, 37, 5, 0.05, true}, Problem{700, 48, 8, 1.0e6, false, true},
                           Problem{640, 96, 16, 0.05, false, false, true}}) {
    INFO("rows " << p.rows << ", in " << p.in << ", out " << p.out);
    const Data data = draw(p);
    const Outcome api = public_api_steps(p, data, Device::cuda(), 2);
    check_bitwise(exact_steps(p, data, 2, false), api);
    check_bitwise(exact_steps(p, data, 2, true), api);
  }
}

namespace {
// A test double for a combine across ranks that fails once: the first combine throws,
// as a peer's failure would, and later ones keep the sums (one rank).
class FailsOnceCombiner : public exact::CrossRankSums {
 public:
  void combine(exact::ExactSums&) override {
    if (!failed_) {
      failed_ = true;
      SEQPAR_FAIL("FailsOnceCombiner: the first combine fails");
    }
  }

 private:
  bool failed_ = false;
};
}  // namespace

TEST_CASE("a step after one that threw between its sums and its finish starts from zero digits",
          "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  // The finishing kernel zeroes the digits for the next step; a step that threw before
  // it was enqueued left them holding its sums, which the next step must clear first.
  const Problem p{1001, 37, 5, 0.05};
  const Data data = draw(p);
  const Device gpu = Device::cuda();
  nn::Linear clean_model = model_on(data, gpu), model = model_on(data, gpu);
  const std::vector<fused::Batch> batch = {{data.x.to(gpu), data.target.to(gpu)}};
  const nn::Reduction reduction = nn::Reduction::sum_divided_by(p.rows * p.out);
  fused::ExactL1Step clean(clean_model, batch, reduction, issue_adamw(), p.max_norm);
  clean.run();
  FailsOnceCombiner combiner;
  fused::ExactL1Step step(model, batch, reduction, issue_adamw(), p.max_norm, &combiner);
  CHECK_THROWS_WITH(step.run(), Catch::Contains("the first combine fails"));
  step.run();  // the parameters are as they started: the failed step never reached AdamW
  CHECK(same_bits(step.loss(), clean.loss()));
  CHECK(same_bits(step.grad_weight(), clean.grad_weight()));
  CHECK(same_bits(step.grad_bias(), clean.grad_bias()));
  CHECK(same_bits(step.total_norm(), clean.total_norm()));
}

TEST_CASE("graph replay of the exact step equals eager runs and the public API, past AdamW's "
          "scalar table", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  for (const Problem& p : {Problem{12000, 640, 16, 0.05}, Problem{1001, 37, 5, 0.05, true}}) {
    INFO("rows " << p.rows << ", in " << p.in << ", out " << p.out);
    const Data data = draw(p);
    const Outcome eager = exact_steps(p, data, 6, false, 2);
    test::poison_pool(Device::cuda());
    check_bitwise(eager, exact_steps(p, data, 6, true, 2));
    check_bitwise(eager, exact_steps(p, data, 6, false, 2));  // and run to run
  }
  // More steps than one table of AdamW's scalars holds: each replay takes its own step's.
  const Problem small{64, 8, 4, 0.05};
  const Data data = draw(small);
  const int steps = static_cast<int>(fused::detail::AdamWSchedule::kTableSteps) + 3;
  check_bitwise(exact_steps(small, data, steps, true), public_api_steps(small, data, Device::cuda(), steps));
}

TEST_CASE("the exact step over 4 ranks of a threads group equals one rank on all rows, bit for "
          "bit", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  // Rank r holds rows tensor_split(4)[r] (uneven: 1001 rows), its loss is its share of
  // the mean over every row, and its dW and db digits are added over the group before
  // they are rounded.
  for (const Problem& p : {Problem{12000, 640, 16, 0.05}, Problem{1001, 37, 5, 0.05}}) {
    INFO("rows " << p.rows);
    const Data data = draw(p);
    const Outcome one_rank = exact_steps(p, data, 3, false);
    const Device gpu = Device::cuda();
    const Tensor x = data.x.to(gpu), target = data.target.to(gpu);
    // The ranks' threads only record; Catch's assertions run on this thread.
    std::mutex mutex;
    std::vector<Outcome> ranks(4);
    std::vector<std::string> capture_errors(4);
    dist::run_local_world(4, [&](std::shared_ptr<dist::ProcessGroup> world) {
      const size_t rank = static_cast<size_t>(world->rank());
      nn::Linear model = model_on(data, gpu);
      dist::GroupSums sums(*world);
      fused::ExactL1Step step(model, {{x.tensor_split(4)[rank], target.tensor_split(4)[rank]}},
                              nn::Reduction::sum_divided_by(p.rows * p.out), issue_adamw(),
                              p.max_norm, &sums);
      std::string capture_error;
      try {
        step.capture();
      } catch (const Error& error) {
        capture_error = error.what();
      }
      for (int s = 0; s < 3; ++s) step.run();
      const Outcome outcome = outcome_of(step, model);
      std::lock_guard<std::mutex> lock(mutex);
      ranks[rank] = outcome;
      capture_errors[rank] = capture_error;
    });
    for (const std::string& error : capture_errors) {
      CHECK_THAT(error, Catch::Contains("cannot be captured; use run()"));
    }
    for (const Outcome& rank : ranks) {
      CHECK(same_bits(rank.norm, one_rank.norm));
      CHECK(same_bits(rank.grad_weight, one_rank.grad_weight));
      CHECK(same_bits(rank.grad_bias, one_rank.grad_bias));
      CHECK(same_bits(rank.weight, one_rank.weight));
      CHECK(same_bits(rank.bias, one_rank.bias));
    }
  }
}

TEST_CASE("the exact step refuses what it cannot train, naming it", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  const Device gpu = Device::cuda();
  Generator generator(3);
  nn::Linear wide(8, 65, generator, gpu);
  const Tensor x = generator.randn({10, 8}, gpu);
  CHECK_THROWS_WITH(fused::ExactL1Step(wide, {{x, generator.randn({10, 65}, gpu)}},
                                       nn::Reduction::mean(), issue_adamw(), 1.0),
                    Catch::Contains("out_features 65"));
  nn::Linear model(8, 4, generator, gpu);
  CHECK_THROWS_WITH(fused::ExactL1Step(model, {{x, generator.randn({9, 4}, gpu)}},
                                       nn::Reduction::mean(), issue_adamw(), 1.0),
                    Catch::Contains("target must be [10, 4]"));
  CHECK_THROWS_WITH(fused::ExactL1Step(model, {{x, generator.randn({10, 4}, gpu)}},
                                       nn::Reduction::mean(), issue_adamw(), 0.0),
                    Catch::Contains("max_norm must be positive"));
  CHECK_THROWS_WITH(fused::ExactL1Step(model, {{Tensor::zeros({0, 8}, gpu), Tensor::zeros({0, 4}, gpu)}},
                                       nn::Reduction::mean(), issue_adamw(), 1.0),
                    Catch::Contains("ExactL1Step: the batches have no rows"));
  fused::ExactL1Step step(model, {{x, generator.randn({10, 4}, gpu)}}, nn::Reduction::mean(),
                          issue_adamw(), 1.0);
  CHECK_THROWS_WITH(step.replay(), Catch::Contains("capture() first"));
  CHECK_THROWS_WITH(step.run(1), Catch::Contains("batch 1 of 1"));
#ifdef SEQPAR_WITH_CUDA
  // db is s times a count of signs: the L1 kernel takes only a finite s.
  CHECK_THROWS_WITH(fused::kernels::exact_l1_cuda(nullptr, nullptr, 4, 10, 4, INFINITY, {}, nullptr),
                    Catch::Contains("the loss scale inf is not finite"));
  // The forward with the L1 loss in its epilogue: likewise, and only where its staged
  // kernel runs, with x's maxima.
  const nn::detail::ConstRows rows{x.data(), 10, 8, 8};
  unsigned int* no_maxima = nullptr;
  CHECK_THROWS_WITH(fused::kernels::few_outputs_forward_exact_l1_cuda(rows, nullptr, 8, nullptr, 4, nullptr, 0, no_maxima,
                                                             {nullptr, 4, INFINITY}, {}),
                    Catch::Contains("x's maxima are required"));
  unsigned int maxima_word = 0;
  CHECK_THROWS_WITH(fused::kernels::few_outputs_forward_exact_l1_cuda(rows, nullptr, 8, nullptr, 4, nullptr, 0, &maxima_word,
                                                             {nullptr, 4, INFINITY}, {}),
                    Catch::Contains("the loss scale inf is not finite"));
  const nn::detail::ConstRows odd{x.data(), 10, 7, 8};  // in % 4 != 0: not the staged kernel
  CHECK_FALSE(fused::kernels::few_outputs_forward_exact_l1_fits(odd, 4));
  CHECK_THROWS_WITH(fused::kernels::few_outputs_forward_exact_l1_cuda(odd, nullptr, 8, nullptr, 4, nullptr, 0, &maxima_word,
                                                             {nullptr, 4, 1.0f}, {}),
                    Catch::Contains("10 x 7 -> 4 is not a Linear with few outputs with 16-byte-aligned rows of x"));
#endif
}

TEST_CASE("the fused step refuses a model on the CPU, naming the step", "[fused]") {
  Generator generator(1);
  const nn::Linear model(8, 4, generator);  // on the CPU
  const Tensor x = generator.randn({10, 8}), target = generator.randn({10, 4});
#ifdef SEQPAR_WITH_CUDA
  const std::string why = "the model must be on a GPU, it is on cpu";
#else
  const std::string why = "this seqpar was built without CUDA; use the public API";
#endif
  CHECK_THROWS_WITH(fused::ExactL1Step(model, {{x, target}}, nn::Reduction::mean(), issue_adamw(), 1.0),
                    Catch::Contains("ExactL1Step: " + why));
}
