// The threads group's all-to-all: the permutation of dist/all_to_all.h, bit for bit, on
// any world size; its own inverse; strided and in-place tensors; and arguments it must
// refuse, each with a message that names what was wrong.
#include <catch2/catch.hpp>

#include "core/error.h"
#include "tests/dist/all_to_all_cases.h"

using namespace seqpar;
using Catch::Matchers::Contains;

TEST_CASE("local all_to_all equals the model of its permutation and is its own inverse",
          "[dist][cpu]") {
  for (int world_size : {1, 2, 3, 4, 8}) {
    test::check_all_to_all(world_size, {static_cast<int64_t>(world_size) * 3, 5}, Device::cpu());
    test::check_all_to_all(world_size, {static_cast<int64_t>(world_size) * 2, 3, 4}, Device::cpu());
    test::check_all_to_all(world_size, {static_cast<int64_t>(world_size)}, Device::cpu());
  }
}

TEST_CASE("local all_to_all with no elements moves nothing and still meets", "[dist][cpu]") {
  dist::run_local_world(3, [](std::shared_ptr<dist::ProcessGroup> world) {
    Tensor empty = Tensor::empty({0, 4});
    world->all_to_all(empty, Tensor::empty({0, 4}));
    world->barrier();
  });
}

// A window of a wider tensor as input, a strided view as output, and then the output
// exchanged in place: the same values as contiguous tensors, the rest untouched.
TEST_CASE("local all_to_all on strided views and in place", "[dist][cpu]") {
  const int world_size = 4;
  const auto inputs = test::rank_inputs(world_size, {8, 6}, 77);
  std::vector<std::vector<float>> once(world_size), twice(world_size), outside(world_size);
  dist::run_local_world(world_size, [&](std::shared_ptr<dist::ProcessGroup> world) {
    const size_t rank = static_cast<size_t>(world->rank());
    const Tensor input = inputs[rank].narrow(1, 1, 3);  // columns 1-3: a strided view
    Tensor wide = Tensor::full({8, 6}, 9.0f);
    Tensor output = wide.narrow(1, 2, 3);
    world->all_to_all(output, input);
    once[rank] = output.to_vector();
    world->all_to_all(output, output);  // in place: back to this rank's own columns
    twice[rank] = output.to_vector();
    outside[rank] = wide.narrow(1, 5, 1).to_vector();
  });
  std::vector<Tensor> windows;
  for (const Tensor& input : inputs) windows.push_back(input.narrow(1, 1, 3).contiguous());
  for (int rank = 0; rank < world_size; ++rank) {
    const size_t r = static_cast<size_t>(rank);
    CHECK(test::same_bits(once[r], test::all_to_all_model(windows, rank)));
    CHECK(test::same_bits(twice[r], windows[r].to_vector()));
    CHECK(outside[r] == std::vector<float>(8, 9.0f));
  }
}

TEST_CASE("local all_to_all refuses uneven splits and mismatched tensors, naming them",
          "[dist][cpu]") {
  auto run = [](int world_size, const std::function<void(dist::ProcessGroup&)>& body) {
    dist::run_local_world(world_size, [&](std::shared_ptr<dist::ProcessGroup> world) { body(*world); });
  };
  // 7 rows do not split into 2 equal chunks.
  REQUIRE_THROWS_WITH(run(2, [](dist::ProcessGroup& world) {
                        Tensor output = Tensor::empty({7, 2});
                        world.all_to_all(output, Tensor::zeros({7, 2}));
                      }),
                      Contains("all_to_all on group world") && Contains("first dimension (7)") &&
                          Contains("2 equal chunks") && Contains("uneven splits are not supported"));
  REQUIRE_THROWS_WITH(run(2, [](dist::ProcessGroup& world) {
                        Tensor output = Tensor::empty({4, 3});
                        world.all_to_all(output, Tensor::zeros({4, 2}));
                      }),
                      Contains("all_to_all on group world") && Contains("output [4, 3]") &&
                          Contains("the input's [4, 2]"));
  REQUIRE_THROWS_WITH(run(2, [](dist::ProcessGroup& world) {
                        Tensor output = Tensor::empty({});
                        world.all_to_all(output, Tensor::zeros({}));
                      }),
                      Contains("at least one dimension"));
  // Ranks that disagree: the group names both ranks and both shapes.
  REQUIRE_THROWS_WITH(run(2, [](dist::ProcessGroup& world) {
                        const int64_t rows = world.rank() == 0 ? 4 : 6;
                        Tensor output = Tensor::empty({rows, 2});
                        world.all_to_all(output, Tensor::zeros({rows, 2}));
                      }),
                      Contains("all_to_all on group world") && Contains("rank 1 passed [6, 2]") &&
                          Contains("rank 0 passed [4, 2]"));
}
