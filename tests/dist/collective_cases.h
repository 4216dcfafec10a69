// The collective checks of the threads group, written once for any device: the
// [cpu] tests run them on the CPU, the [cuda] tests on cuda:0 (all ranks sharing it).
// Every check compares every rank's result, bit for bit, with a sequential loop in
// rank order on the CPU.
#pragma once

#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "dist/local_process_group.h"
#include "dist/mesh.h"
#include "tests/dist/dist_test_util.h"

namespace seqpar::test {

inline void check_all_reduce(int world_size, dist::ReduceOp op, Device device) {
  const auto inputs = rank_inputs(world_size, {7, 13}, 100 + static_cast<uint64_t>(world_size));
  const std::vector<float> expected = sequential_reduce(inputs, all_ranks(world_size), op);
  std::vector<std::vector<float>> results(static_cast<size_t>(world_size));
  dist::run_local_world(world_size, [&](std::shared_ptr<dist::ProcessGroup> world) {
    Tensor mine = inputs[static_cast<size_t>(world->rank())].to(device);
    world->all_reduce(mine, op);
    results[static_cast<size_t>(world->rank())] = mine.to_vector();
  });
  for (int rank = 0; rank < world_size; ++rank) {
    INFO("world " << world_size << ", op " << dist::reduce_op_name(op) << ", rank " << rank);
    CHECK(same_bits(results[static_cast<size_t>(rank)], expected));
  }
}

inline void check_all_gather(int world_size, Device device) {
  const auto inputs = rank_inputs(world_size, {3, 5}, 200);
  std::vector<float> expected;
  for (const Tensor& input : inputs) {
    const auto values = input.to_vector();
    expected.insert(expected.end(), values.begin(), values.end());
  }
  std::vector<std::vector<float>> results(static_cast<size_t>(world_size));
  dist::run_local_world(world_size, [&](std::shared_ptr<dist::ProcessGroup> world) {
    const Tensor mine = inputs[static_cast<size_t>(world->rank())].to(device);
    Tensor gathered = Tensor::full({3 * world_size, 5}, -1.0f, device);
    world->all_gather(gathered, mine);
    results[static_cast<size_t>(world->rank())] = gathered.to_vector();
  });
  for (int rank = 0; rank < world_size; ++rank) {
    INFO("world " << world_size << ", rank " << rank);
    CHECK(same_bits(results[static_cast<size_t>(rank)], expected));
  }
}

inline void check_broadcast(int world_size, int root, Device device) {
  const auto inputs = rank_inputs(world_size, {4, 6}, 300);
  const std::vector<float> expected = inputs[static_cast<size_t>(root)].to_vector();
  std::vector<std::vector<float>> results(static_cast<size_t>(world_size));
  dist::run_local_world(world_size, [&](std::shared_ptr<dist::ProcessGroup> world) {
    Tensor mine = inputs[static_cast<size_t>(world->rank())].to(device);
    world->broadcast(mine, root);
    results[static_cast<size_t>(world->rank())] = mine.to_vector();
  });
  for (int rank = 0; rank < world_size; ++rank) {
    INFO("world " << world_size << ", root " << root << ", rank " << rank);
    CHECK(same_bits(results[static_cast<size_t>(rank)], expected));
  }
}

// Each rank reduces the same input over its sp, dp and sp x dp groups, one after the
// other; each result must equal the sequential loop over that group's ranks.
inline void check_mesh_groups(int sp, int dp, Device device) {
  const int world_size = sp * dp;
  const dist::Mesh mesh(world_size, sp, dp);
  const auto inputs = rank_inputs(world_size, {5, 3}, 400);
  struct Seen {
    std::vector<float> sp, dp, sp_dp;
    std::string sp_name, dp_name;
    dist::MeshCoordinates at;
  };
  std::vector<Seen> seen(static_cast<size_t>(world_size));
  dist::run_local_world(world_size, [&](std::shared_ptr<dist::ProcessGroup> world) {
    const dist::MeshGroups groups = dist::build_mesh_groups(mesh, *world);
    Seen& mine = seen[static_cast<size_t>(world->rank())];
    const Tensor input = inputs[static_cast<size_t>(world->rank())].to(device);
    Tensor over_sp = input.clone(), over_dp = input.clone(), over_all = input.clone();
    groups.sp_group->all_reduce(over_sp, dist::ReduceOp::Sum);
    groups.dp_group->all_reduce(over_dp, dist::ReduceOp::Avg);
    groups.sp_dp_group->all_reduce(over_all, dist::ReduceOp::Sum);
    mine = {over_sp.to_vector(), over_dp.to_vector(), over_all.to_vector(),
            groups.sp_group->name(), groups.dp_group->name(), groups.coordinates};
  });
  for (int rank = 0; rank < world_size; ++rank) {
    INFO("sp " << sp << ", dp " << dp << ", rank " << rank);
    const Seen& mine = seen[static_cast<size_t>(rank)];
    CHECK(same_bits(mine.sp, sequential_reduce(inputs, mesh.sp_group_of(rank), dist::ReduceOp::Sum)));
    CHECK(same_bits(mine.dp, sequential_reduce(inputs, mesh.dp_group_of(rank), dist::ReduceOp::Avg)));
    CHECK(same_bits(mine.sp_dp, sequential_reduce(inputs, all_ranks(world_size), dist::ReduceOp::Sum)));
    CHECK(mine.sp_name == dist::sp_group_name(mesh.sp_group_of(rank)));
    CHECK(mine.dp_name == dist::dp_group_name(mesh.dp_group_of(rank)));
    CHECK(mine.at.sp_rank == rank % sp);
    CHECK(mine.at.dp_rank == rank / sp);
  }
}

}  // namespace seqpar::test
