// The threads process group with every rank's tensors on cuda:0: the reduction runs
// as kernels on the device's one stream, and must still give every rank the bits of
// the sequential CPU loop. Skipped without a GPU.
#include <catch2/catch.hpp>

#include "core/device.h"
#include "tests/dist/all_to_all_cases.h"
#include "tests/dist/collective_cases.h"

using namespace seqpar;
using dist::ReduceOp;

#define SKIP_WITHOUT_CUDA()                                  \
  do {                                                       \
    if (cuda_device_count() == 0) {                          \
      WARN("no CUDA device: skipped");                       \
      return;                                                \
    }                                                        \
  } while (0)

TEST_CASE("local all_reduce on one GPU equals the CPU rank-order loop, bit for bit",
          "[dist][cuda]") {
  SKIP_WITHOUT_CUDA();
  for (int world_size : {1, 2, 3, 4, 8}) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
      test::check_all_reduce(world_size, op, Device::cuda(0));
    }
  }
}

TEST_CASE("local all_gather and broadcast on one GPU", "[dist][cuda]") {
  SKIP_WITHOUT_CUDA();
  for (int world_size : {1, 2, 5, 8}) {
    test::check_all_gather(world_size, Device::cuda(0));
    test::check_broadcast(world_size, world_size - 1, Device::cuda(0));
  }
}

TEST_CASE("local all_to_all on one GPU equals the model of its permutation", "[dist][cuda]") {
  SKIP_WITHOUT_CUDA();
  for (int world_size : {1, 2, 4, 8}) {
    test::check_all_to_all(world_size, {static_cast<int64_t>(world_size) * 3, 5}, Device::cuda(0));
  }
}

TEST_CASE("local mesh sub-groups on one GPU", "[dist][cuda]") {
  SKIP_WITHOUT_CUDA();
  for (int sp : {1, 2, 4}) {
    for (int dp : {1, 2}) test::check_mesh_groups(sp, dp, Device::cuda(0));
  }
}

// Large tensors and no host synchronization between steps: each rank overwrites its
// tensor right after the collective returns, while the reduction kernels may still
// be queued. Only the stream order keeps that correct.
TEST_CASE("local GPU collectives back to back keep stream order", "[dist][cuda]") {
  SKIP_WITHOUT_CUDA();
  const int world_size = 4;
  const int64_t count = 1 << 20;
  std::vector<std::vector<float>> results(world_size);
  dist::run_local_world(world_size, [&](std::shared_ptr<dist::ProcessGroup> world) {
    const float own = static_cast<float>(world->rank() + 1);
    Tensor values = Tensor::full({count}, own, Device::cuda(0));
    for (int step = 0; step < 20; ++step) {
      world->all_reduce(values, ReduceOp::Sum);  // 1 + 2 + 3 + 4 = 10
      values.fill_(own);                         // queued right behind the copy-out
    }
    world->all_reduce(values, ReduceOp::Sum);  // 10 again, unless a fill got lost
    results[static_cast<size_t>(world->rank())] = values.to_vector();
  });
  for (const auto& result : results) {
    CHECK(result == std::vector<float>(static_cast<size_t>(count), 10.0f));
  }
}
