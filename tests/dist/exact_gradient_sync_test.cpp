// nn::ExactGradientSync over thread ranks. Used as documented, it gives every rank
// one-rank training's gradients and parameters, bit for bit, compared with one rank that
// holds every row and runs plain backward passes. Misused, it refuses with an error that
// names the mistake: above all the footgun of a loss.backward() one line outside the
// recording, which would otherwise leave each rank its own gradient.
#include <catch2/catch.hpp>

#include <random>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "core/generator.h"
#include "dist/local_process_group.h"
#include "nn/exact_gradient_sync.h"
#include "nn/l1_loss.h"
#include "nn/linear.h"
#include "optim/adamw.h"
#include "tests/test_util.h"

using namespace seqpar;
using autograd::Variable;

namespace {

// Two Linears, so that the first one's gradient flows through the second's dx.
struct Model {
  Generator generator;  // first, as it initialises the Linears
  nn::Linear first, second;
  Model(int64_t in, int64_t hidden, int64_t out, uint64_t seed)
      : generator(seed), first(in, hidden, generator), second(hidden, out, generator) {}
  Variable forward(const Variable& x) const { return second.forward(first.forward(x)); }
  std::vector<Variable> parameters() const {
    std::vector<Variable> all = first.parameters();
    for (const Variable& parameter : second.parameters()) all.push_back(parameter);
    return all;
  }
};

struct Problem {
  int64_t in = 0, hidden = 0, out = 0, rows = 0;
  uint64_t seed = 0;
  Tensor x, target;
  Model model() const { return Model(in, hidden, out, seed); }
  nn::Reduction share() const { return nn::Reduction::sum_divided_by(rows * out); }  // the mean over all rows
};

Problem random_problem(uint64_t seed) {
  std::mt19937_64 draw(seed);
  Problem p;
  p.in = 3 + int64_t(draw() % 20);
  p.hidden = 2 + int64_t(draw() % 12);
  p.out = 1 + int64_t(draw() % 6);
  p.rows = 12 + int64_t(draw() % 60);
  p.seed = seed;
  Generator data(seed + 2);
  p.x = data.randn({p.rows, p.in});
  p.target = data.randn({p.rows, p.out});
  return p;
}

std::vector<std::vector<float>> values(const std::vector<Variable>& parameters, bool gradients) {
  std::vector<std::vector<float>> all;
  for (const Variable& parameter : parameters) {
    all.push_back((gradients ? parameter.grad() : parameter.data()).to_vector());
  }
  return all;
}

bool same_bits(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].size() != b[i].size()) return false;
    for (size_t j = 0; j < a[i].size(); ++j) {
      if (!test::same_bits(a[i][j], b[i][j])) return false;
    }
  }
  return true;
}

constexpr int kSteps = 3;

// What one rank (or the one-rank reference) saw at each step: its gradients before the
// sync, after it, and its parameters after AdamW's step.
struct Trace {
  std::vector<std::vector<std::vector<float>>> partial, gradients, parameters;
};

// The error a world of `ranks` threads ended with ("" if none), each rank running `body`
// on a fresh model of `p` and a sync over the world.
template <typename Body>
std::string world_error(const Problem& p, int ranks, Body body) {
  try {
    dist::run_local_world(ranks, [&](std::shared_ptr<dist::ProcessGroup> world) {
      const Model model = p.model();
      nn::ExactGradientSync sync(model.parameters(), world);
      const Variable x(p.x), target(p.target);
      body(model, sync, x, target);
    });
  } catch (const std::exception& error) {
    return error.what();
  }
  return "";
}

}  // namespace

TEST_CASE("ExactGradientSync gives every rank one-rank training's bits", "[dist][exact_gradient_sync]") {
  const uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  const Problem p = random_problem(seed);
  const int ranks = 2 + int(seed % 3);
  INFO(ranks << " ranks, " << p.rows << " rows, Linear " << p.in << " -> " << p.hidden << " -> " << p.out);

  // The reference: one rank, every row, plain backward.
  Trace reference;
  {
    const Model model = p.model();
    optim::AdamW optimizer(model.parameters(), optim::AdamWOptions(1e-2));
    for (int step = 0; step < kSteps; ++step) {
      optimizer.zero_grad();
      nn::l1_loss(model.forward(Variable(p.x)), Variable(p.target), p.share()).backward();
      reference.gradients.push_back(values(model.parameters(), true));
      optimizer.step();
      reference.parameters.push_back(values(model.parameters(), false));
    }
  }

  // Each rank its share of the rows (uneven), in two micro-batches.
  const std::vector<Tensor> x_shards = p.x.tensor_split(ranks), target_shards = p.target.tensor_split(ranks);
  std::vector<Trace> traces(static_cast<size_t>(ranks));
  dist::run_local_world(ranks, [&](std::shared_ptr<dist::ProcessGroup> world) {
    const size_t rank = static_cast<size_t>(world->rank());
    const Model model = p.model();
    optim::AdamW optimizer(model.parameters(), optim::AdamWOptions(1e-2));
    nn::ExactGradientSync sync(model.parameters(), world);
    const std::vector<Tensor> x_parts = x_shards[rank].tensor_split(2);
    const std::vector<Tensor> target_parts = target_shards[rank].tensor_split(2);
    for (int step = 0; step < kSteps; ++step) {
      optimizer.zero_grad();
      for (size_t part = 0; part < 2; ++part) {
        sync.backward(nn::l1_loss(model.forward(Variable(x_parts[part])), Variable(target_parts[part]), p.share()));
      }
      traces[rank].partial.push_back(values(model.parameters(), true));
      sync.synchronize();
      traces[rank].gradients.push_back(values(model.parameters(), true));
      optimizer.step();
      traces[rank].parameters.push_back(values(model.parameters(), false));
    }
  });

  for (size_t rank = 0; rank < traces.size(); ++rank) {
    for (int step = 0; step < kSteps; ++step) {
      INFO("rank " << rank << ", step " << step + 1);
      // Before the sync each rank holds its own rows' gradient: what the sync must replace.
      CHECK_FALSE(same_bits(traces[rank].partial[step], reference.gradients[step]));
      CHECK(same_bits(traces[rank].gradients[step], reference.gradients[step]));
      CHECK(same_bits(traces[rank].parameters[step], reference.parameters[step]));
    }
  }
}

TEST_CASE("ExactGradientSync refuses a backward outside the recording", "[dist][exact_gradient_sync]") {
  const Problem p = random_problem(std::random_device{}());
  // The footgun: the forward inside the scope, loss.backward() one line below it.
  const std::string footgun = world_error(p, 2, [&](const Model& model, nn::ExactGradientSync& sync,
                                                    const Variable& x, const Variable& target) {
    Variable loss;
    {
      const nn::ExactGradientSync::Recording recording(sync);
      loss = nn::l1_loss(model.forward(x), target, p.share());
    }
    loss.backward();
    sync.synchronize();
  });
  CHECK_THAT(footgun, Catch::Contains("ExactGradientSync over world: parameter 0") &&
                          Catch::Contains("received a gradient outside a recording (after the last recording)") &&
                          Catch::Contains("this rank's own partial gradient"));

  // A second micro-batch outside, after one inside: refused all the same.
  const std::string second = world_error(p, 2, [&](const Model& model, nn::ExactGradientSync& sync,
                                                   const Variable& x, const Variable& target) {
    sync.backward(nn::l1_loss(model.forward(x), target, p.share()));
    nn::l1_loss(model.forward(x), target, p.share()).backward();
    sync.synchronize();
  });
  CHECK_THAT(second, Catch::Contains("received a gradient outside a recording (after the last recording)"));

  // A backward before the recording: refused as the recording begins.
  const std::string before = world_error(p, 2, [&](const Model& model, nn::ExactGradientSync& sync,
                                                   const Variable& x, const Variable& target) {
    nn::l1_loss(model.forward(x), target, p.share()).backward();
    sync.backward(nn::l1_loss(model.forward(x), target, p.share()));
  });
  CHECK_THAT(before, Catch::Contains("received a gradient outside a recording (before this recording began)"));

  // Used as documented, the same program runs.
  CHECK(world_error(p, 2, [&](const Model& model, nn::ExactGradientSync& sync, const Variable& x,
                              const Variable& target) {
          sync.backward(nn::l1_loss(model.forward(x), target, p.share()));
          sync.synchronize();
        }) == "");
}

TEST_CASE("ExactGradientSync refuses a sync of nothing while gradients exist", "[dist][exact_gradient_sync]") {
  const Problem p = random_problem(std::random_device{}());
  // A gradient from before the sync was made: nothing recorded, a gradient held.
  std::string error;
  try {
    dist::run_local_world(2, [&](std::shared_ptr<dist::ProcessGroup> world) {
      const Model model = p.model();
      nn::l1_loss(model.forward(Variable(p.x)), Variable(p.target), p.share()).backward();
      nn::ExactGradientSync sync(model.parameters(), world);
      sync.synchronize();
    });
  } catch (const std::exception& caught) {
    error = caught.what();
  }
  CHECK_THAT(error, Catch::Contains("parameter 0") && Catch::Contains("holds a gradient but nothing was recorded"));

  // A gradient set by hand.
  CHECK_THAT(world_error(p, 2, [&](const Model& model, nn::ExactGradientSync& sync, const Variable&,
                                   const Variable&) {
               model.second.bias().set_grad(Tensor::ones(model.second.bias().shape()));
               sync.synchronize();
             }),
             Catch::Contains("parameter 3") && Catch::Contains("holds a gradient but nothing was recorded"));

  // Nothing recorded and no gradient: nothing to do.
  CHECK(world_error(p, 2, [&](const Model&, nn::ExactGradientSync& sync, const Variable&, const Variable&) {
          sync.synchronize();
        }) == "");
}

TEST_CASE("ExactGradientSync refuses gradients it cannot make exact", "[dist][exact_gradient_sync]") {
  const Problem p = random_problem(std::random_device{}());
  // A parameter added to the output: its gradient comes from add's backward, a float sum
  // with no exact digits.
  std::string error;
  try {
    dist::run_local_world(2, [&](std::shared_ptr<dist::ProcessGroup> world) {
      const Model model = p.model();
      const Variable offset(Tensor::zeros({p.rows, p.out}), /*requires_grad=*/true);
      std::vector<Variable> parameters = model.parameters();
      parameters.push_back(offset);
      nn::ExactGradientSync sync(parameters, world);
      sync.backward(nn::l1_loss(autograd::add(model.forward(Variable(p.x)), offset), Variable(p.target), p.share()));
      sync.synchronize();
    });
  } catch (const std::exception& caught) {
    error = caught.what();
  }
  CHECK_THAT(error, Catch::Contains("parameter 4") && Catch::Contains("from an op that keeps no exact sums"));

  // A recorded Linear whose parameters the sync was not given.
  error.clear();
  try {
    dist::run_local_world(2, [&](std::shared_ptr<dist::ProcessGroup> world) {
      const Model model = p.model();
      nn::ExactGradientSync sync(model.second.parameters(), world);
      sync.backward(nn::l1_loss(model.forward(Variable(p.x)), Variable(p.target), p.share()));
      sync.synchronize();
    });
  } catch (const std::exception& caught) {
    error = caught.what();
  }
  CHECK_THAT(error, Catch::Contains("not one of the sync's 2 parameters"));

  // No group.
  CHECK_THROWS_WITH(nn::ExactGradientSync(p.model().parameters(), std::shared_ptr<dist::ProcessGroup>()),
                    Catch::Contains("no group"));
}
