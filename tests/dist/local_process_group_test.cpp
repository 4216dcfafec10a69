// The threads process group on the CPU: every collective, world sizes 1 to 8,
// sub-groups, and the bit-for-bit agreement with a sequential rank-order loop.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>

#include "core/error.h"
#include "dist/mesh.h"
#include "tests/dist/collective_cases.h"

using namespace seqpar;
using dist::ReduceOp;

TEST_CASE("local all_reduce Sum, Avg and Max over 1 to 8 ranks equal a rank-order loop, bit for bit",
          "[dist][cpu]") {
  for (int world_size = 1; world_size <= 8; ++world_size) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
      test::check_all_reduce(world_size, op, Device::cpu());
    }
  }
}

TEST_CASE("local all_gather puts rank r's input in slice r", "[dist][cpu]") {
  for (int world_size = 1; world_size <= 8; ++world_size) {
    test::check_all_gather(world_size, Device::cpu());
  }
}

TEST_CASE("local broadcast from a non-zero root", "[dist][cpu]") {
  for (int world_size = 2; world_size <= 8; ++world_size) {
    test::check_broadcast(world_size, world_size - 1, Device::cpu());
    test::check_broadcast(world_size, 1, Device::cpu());
  }
}

TEST_CASE("local barrier lets nobody through before everybody arrived", "[dist][cpu]") {
  for (int world_size = 1; world_size <= 8; ++world_size) {
    std::atomic<int> arrived{0};
    std::vector<int> seen(static_cast<size_t>(world_size));
    dist::run_local_world(world_size, [&](std::shared_ptr<dist::ProcessGroup> world) {
      ++arrived;
      world->barrier();
      seen[static_cast<size_t>(world->rank())] = arrived.load();
    });
    for (int count : seen) CHECK(count == world_size);
  }
}

TEST_CASE("local all_reduce into a strided view changes only the view", "[dist][cpu]") {
  std::vector<std::vector<float>> results(3);
  dist::run_local_world(3, [&](std::shared_ptr<dist::ProcessGroup> world) {
    Tensor full = Tensor::full({2, 4}, static_cast<float>(world->rank() + 1));
    Tensor columns = full.narrow(1, 1, 2);  // not contiguous
    world->all_reduce(columns, ReduceOp::Sum);
    results[static_cast<size_t>(world->rank())] = full.to_vector();
  });
  for (int rank = 0; rank < 3; ++rank) {
    const float own = static_cast<float>(rank + 1);
    CHECK(results[static_cast<size_t>(rank)] == std::vector<float>{own, 6, 6, own, own, 6, 6, own});
  }
}

TEST_CASE("local collectives repeated many times, alternating groups, stay exact", "[dist][cpu]") {
  const int world_size = 4;
  const auto inputs = test::rank_inputs(world_size, {16}, 500);
  const auto world_sum = test::sequential_reduce(inputs, test::all_ranks(world_size), ReduceOp::Sum);
  std::vector<int> mismatches(world_size, 0);
  dist::run_local_world(world_size, [&](std::shared_ptr<dist::ProcessGroup> world) {
    // Every rank joins both calls, in the same order, and keeps the pair it is in.
    auto first_pair = world->new_group({0, 1}, "pair[0-1]");
    auto second_pair = world->new_group({2, 3}, "pair[2-3]");
    auto pair = first_pair ? first_pair : second_pair;
    for (int step = 0; step < 100; ++step) {
      Tensor values = inputs[static_cast<size_t>(world->rank())].clone();
      world->all_reduce(values);
      if (!test::same_bits(values.to_vector(), world_sum)) ++mismatches[static_cast<size_t>(world->rank())];
      pair->barrier();
    }
  });
  CHECK(mismatches == std::vector<int>(world_size, 0));
}

TEST_CASE("local new_group: members get their new rank, the others nullptr", "[dist][cpu]") {
  struct Seen {
    bool member = false;
    int rank = -1, size = -1;
    std::vector<int> global_ranks;
    std::string name, default_name;
  };
  std::vector<Seen> seen(4);
  dist::run_local_world(4, [&](std::shared_ptr<dist::ProcessGroup> world) {
    Seen& mine = seen[static_cast<size_t>(world->rank())];
    auto odd = world->new_group({3, 1}, "odd");  // listed out of order on purpose
    auto unnamed = world->new_group({0, 2}, "");
    mine.member = odd != nullptr;
    if (odd) {
      mine = {true, odd->rank(), odd->size(), odd->global_ranks(), odd->name(), ""};
      auto nested = odd->new_group({1}, "");  // rank 1 of odd is world rank 3
      if (nested) mine.default_name = nested->name();
    } else {
      mine.default_name = unnamed->name();
    }
  });
  CHECK_FALSE(seen[0].member);
  CHECK(seen[1].member);
  CHECK(seen[1].rank == 0);
  CHECK(seen[3].rank == 1);
  CHECK(seen[3].size == 2);
  CHECK(seen[3].global_ranks == std::vector<int>{1, 3});
  CHECK(seen[1].name == "odd");
  CHECK(seen[0].default_name == "group[0,2]");
  CHECK(seen[3].default_name == "group[3]");
}

TEST_CASE("local sub-groups from a mesh reduce within their own ranks", "[dist][cpu]") {
  for (int sp : {1, 2, 4}) {
    for (int dp : {1, 2}) test::check_mesh_groups(sp, dp, Device::cpu());
  }
}

TEST_CASE("local split: every group in one collective, each rank in its own", "[dist][cpu]") {
  std::vector<std::vector<int>> global_ranks(5);
  std::vector<std::string> names(5);
  std::vector<float> sums(5);
  dist::run_local_world(5, [&](std::shared_ptr<dist::ProcessGroup> world) {
    const size_t me = static_cast<size_t>(world->rank());
    // Rank 4 is in no group; the lists are out of order on purpose.
    auto group = world->split({{2, 0}, {1, 3}}, {"even", "odd"});
    if (!group) return;
    global_ranks[me] = group->global_ranks();
    names[me] = group->name();
    Tensor value = Tensor::full({1}, float(world->rank()));
    group->all_reduce(value);
    sums[me] = value.to_vector()[0];
  });
  CHECK(global_ranks[0] == std::vector<int>{0, 2});
  CHECK(global_ranks[3] == std::vector<int>{1, 3});
  CHECK(names[2] == "even");
  CHECK(names[1] == "odd");
  CHECK(sums[0] == 2);
  CHECK(sums[3] == 4);
  CHECK(global_ranks[4].empty());
  CHECK_THROWS_WITH(dist::run_local_world(2, [](std::shared_ptr<dist::ProcessGroup> world) {
                      world->split({{0, 1}, {1}}, {"a", "b"});
                    }),
                    Catch::Contains("rank 1 is in two groups"));
  CHECK_THROWS_WITH(dist::run_local_world(2, [](std::shared_ptr<dist::ProcessGroup> world) {
                      world->split({{world->rank()}}, {"mine"});
                    }),
                    Catch::Contains("other groups"));
}

TEST_CASE("local mesh of 1024 ranks is built in a few collectives", "[dist][cpu]") {
  const auto start = std::chrono::steady_clock::now();
  std::atomic<int> one_rank_dp_groups{0};  // Catch2's CHECK is not for many threads
  dist::run_local_world(1024, [&](std::shared_ptr<dist::ProcessGroup> world) {
    const dist::Mesh mesh(world->size(), 1024, 1);  // 1024 one-rank dp groups
    const dist::MeshGroups groups = dist::build_mesh_groups(mesh, *world);
    if (groups.dp_group->size() == 1 && groups.sp_group->size() == 1024) ++one_rank_dp_groups;
  });
  CHECK(one_rank_dp_groups == 1024);
  // One collective per group took tens of seconds here. (ThreadSanitizer runs the 1024
  // threads one at a time, far slower: there the groups alone are checked.)
#ifndef __SANITIZE_THREAD__
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(20));
#else
  (void)start;
#endif
}
