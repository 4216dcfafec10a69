// dist::ConsistencyChecker over a threads world of 4: a toy least-squares gradient
// computed per shard, combined correctly and in each of the usual wrong ways. The
// checker must stay quiet for the correct one and name each mistake: ranks apart (a
// missing reduction), a group of one, a gradient sp times, 1/sp times or sqrt(sp) times
// the reference.
#include <catch2/catch.hpp>

#include <cmath>
#include <mutex>
#include <random>
#include <vector>

#include "dist/consistency.h"
#include "dist/local_process_group.h"

using namespace seqpar;

namespace {

constexpr int kWorld = 4;
constexpr int kRows = 40, kIn = 3;

struct Problem {
  std::vector<float> x, y, w;  // x [rows, in], y [rows], w [in]
};

Problem make_problem() {
  std::mt19937 random(11);
  std::normal_distribution<float> normal;
  Problem p;
  for (int i = 0; i < kRows * kIn; ++i) p.x.push_back(normal(random));
  for (int i = 0; i < kRows; ++i) p.y.push_back(normal(random));
  for (int i = 0; i < kIn; ++i) p.w.push_back(normal(random));
  return p;
}

// Σ over rows [begin, end) of 2 (x w - y) x / divisor: the gradient of the squared error
// summed over those rows and divided by `divisor`.
std::vector<float> gradient(const Problem& p, int begin, int end, double divisor) {
  std::vector<double> g(kIn, 0.0);
  for (int row = begin; row < end; ++row) {
    double residual = -p.y[row];
    for (int k = 0; k < kIn; ++k) residual += double(p.x[row * kIn + k]) * p.w[k];
    for (int k = 0; k < kIn; ++k) g[k] += 2 * residual * p.x[row * kIn + k] / divisor;
  }
  return std::vector<float>(g.begin(), g.end());
}

double norm(const std::vector<float>& values) {
  double squares = 0;
  for (float value : values) squares += double(value) * value;
  return std::sqrt(squares);
}

enum class Combine { Correct, Missing, LocalMeanSummed, AveragedTwice, ReplicatedSummedNorm };

// Every rank's report of step 1 after combining its shard's gradient `how`, then a
// plain SGD step checked as the parameters.
struct Seen {
  dist::ConsistencyReport gradients, parameters;
};

std::vector<Seen> run(Combine how) {
  const Problem p = make_problem();
  const double reference = norm(gradient(p, 0, kRows, kRows));
  std::vector<Seen> seen(kWorld);
  dist::run_local_world(kWorld, [&](std::shared_ptr<dist::ProcessGroup> world) {
    const int rank = world->rank(), shard = kRows / kWorld;
    const int begin = rank * shard, end = begin + shard;
    std::vector<float> g;
    switch (how) {
      case Combine::Correct:  // the global count, summed over the group: the mean
      case Combine::Missing:  // ... and never summed
        g = gradient(p, begin, end, kRows);
        break;
      case Combine::LocalMeanSummed:  // each rank's own mean, summed: x sp
      case Combine::AveragedTwice:    // each rank's own mean, then averaged twice: x 1/sp
        g = gradient(p, begin, end, shard);
        break;
      case Combine::ReplicatedSummedNorm:  // the right gradient, its norm from 4 copies
        g = gradient(p, 0, kRows, kRows);
        break;
    }
    Tensor grad = Tensor::from_data({kIn}, g);
    if (how == Combine::AveragedTwice) {
      world->all_reduce(grad, dist::ReduceOp::Avg);
      grad = Tensor::from_data({kIn}, [&] {
        std::vector<float> v = grad.to_vector();
        for (float& value : v) value /= kWorld;
        return v;
      }());
    } else if (how != Combine::Missing && how != Combine::ReplicatedSummedNorm) {
      world->all_reduce(grad, dist::ReduceOp::Sum);
    }
    dist::ConsistencyChecker gradients(world, "sp");
    std::vector<Tensor> checked{grad};
    if (how == Combine::ReplicatedSummedNorm) {
      // The norm of a replicated gradient taken as if each copy were a shard's part:
      // the sum of 4 equal squares, so sqrt(4) times the one-copy norm.
      std::vector<float> v = grad.to_vector();
      for (float& value : v) value *= 2.0f;  // sqrt(kWorld), exactly
      checked = {Tensor::from_data({kIn}, v)};
    }
    seen[static_cast<size_t>(rank)].gradients = gradients.check(1, checked, reference);
    std::vector<float> w = p.w, used = grad.to_vector();
    for (int k = 0; k < kIn; ++k) w[k] -= 0.1f * used[k];
    dist::ConsistencyChecker parameters(world, "sp");
    seen[static_cast<size_t>(rank)].parameters =
        parameters.check(1, {Tensor::from_data({kIn}, w)});
  });
  return seen;
}

}  // namespace

TEST_CASE("the consistency checker passes a correct reduction", "[dist]") {
  for (const Seen& s : run(Combine::Correct)) {
    CHECK(s.gradients.consistent);
    CHECK(s.parameters.consistent);
    REQUIRE(s.gradients.norm_ratio);
    CHECK(*s.gradients.norm_ratio == Approx(1.0).epsilon(1e-6));
    CHECK(s.gradients.scale_cause.empty());
    CHECK(s.parameters.summary() == "sp: step 1: consistent");
  }
}

TEST_CASE("the consistency checker finds a missing reduction: ranks apart", "[dist]") {
  const std::vector<Seen> seen = run(Combine::Missing);
  for (const Seen& s : seen) {
    CHECK_FALSE(s.gradients.consistent);
    CHECK_FALSE(s.parameters.consistent);
    REQUIRE(s.parameters.divergence);
    CHECK(s.parameters.divergence->tensor == 0);
    CHECK(s.parameters.divergence->element == 0);  // every element differs here
    CHECK(s.parameters.divergence->differing_elements == kIn);
    CHECK(s.parameters.divergence->max_difference > 0);
    CHECK(s.parameters.fingerprints.size() == size_t(kWorld));
    CHECK(s.parameters.summary().find("ranks differ: 3 of 3 elements") != std::string::npos);
  }
  // Every rank reports the same thing: the check is a collective.
  CHECK(seen[0].parameters.fingerprints == seen[3].parameters.fingerprints);
}

TEST_CASE("the consistency checker names a gradient sp, 1/sp and sqrt(sp) times too large",
          "[dist]") {
  for (const auto& [how, cause] : std::vector<std::pair<Combine, std::string>>{
           {Combine::LocalMeanSummed, "x sp (4)"},
           {Combine::AveragedTwice, "x 1/sp (0.25)"},
           {Combine::ReplicatedSummedNorm, "x sqrt(sp) (2)"}}) {
    for (const Seen& s : run(how)) {
      INFO(s.gradients.summary());
      CHECK(s.gradients.consistent);  // the ranks agree: only the scale is wrong
      CHECK(s.gradients.scale_cause == cause);
    }
  }
}

TEST_CASE("the consistency checker names a group of one", "[dist]") {
  std::vector<dist::ConsistencyReport> reports(kWorld);
  dist::run_local_world(kWorld, [&](std::shared_ptr<dist::ProcessGroup> world) {
    // The mistake of #6868: a data-parallel group of each rank alone, where the sp
    // replicas should have been.
    std::vector<std::shared_ptr<dist::ProcessGroup>> alone;
    for (int r = 0; r < kWorld; ++r) alone.push_back(world->new_group({r}, ""));
    const auto& mine = alone[static_cast<size_t>(world->rank())];
    dist::ConsistencyChecker checker(mine, "dp", kWorld);
    reports[static_cast<size_t>(world->rank())] =
        checker.check(1, {Tensor::from_data({2}, {1.0f, float(world->rank())})});
  });
  for (const dist::ConsistencyReport& report : reports) {
    CHECK(report.group_of_one);
    CHECK(report.consistent);  // one rank always agrees with itself: hashes alone miss it
    CHECK(report.summary().find("the group has one rank") != std::string::npos);
  }
}

TEST_CASE("name_scale matches the usual factors and nothing else", "[dist]") {
  CHECK(dist::name_scale(4.0, 4) == "x sp (4)");
  CHECK(dist::name_scale(0.25, 4) == "x 1/sp (0.25)");
  CHECK(dist::name_scale(2.0, 4) == "x sqrt(sp) (2)");
  CHECK(dist::name_scale(0.5, 4) == "x 1/sqrt(sp) (0.5)");
  CHECK(dist::name_scale(2.0, 4, 2) == "x dp (2)");  // the plainer of two that match
  CHECK(dist::name_scale(0.5, 4, 2) == "x 1/dp (0.5)");
  CHECK(dist::name_scale(8.0, 4, 2) == "x sp*dp (8)");
  CHECK(dist::name_scale(std::sqrt(8.0), 4, 2) == "x sqrt(sp*dp) (2.83)");
  CHECK(dist::name_scale(1 / std::sqrt(8.0), 4, 2) == "x 1/sqrt(sp*dp) (0.354)");
  CHECK(dist::name_scale(1.0004, 4) == "");
  CHECK(dist::name_scale(3.0, 4) == "");
  CHECK(dist::name_scale(std::nan(""), 4) == "");
  CHECK(dist::name_scale(-4.0, 4) == "");
  CHECK_THROWS_WITH(dist::name_scale(2.0, 0), Catch::Contains("sp 0"));
}
